"""Reader of CoNLL-format files (one word per line, tags in a column) and the IOB tag schemes.

CoNLL format: one token per line, whitespace-separated columns with the token
first and the tag in a fixed column (the last by default), a blank line
between sentences, "-DOCSTART-" lines between documents. The tag column holds
chunks (NER, chunking) as IOB1 (CoNLL-2003 as released: I- opens a chunk, B-
only splits two adjacent chunks of one type) or IOB2 (every chunk opens with
B-), or plain tags (POS: any string, no chunk structure), which is how the
tagging kind reads any column. Sentences come back as
records.TaggedSentence; featurisation is token_features'.
"""

import os
from typing import Sequence

from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import text_files

# iob1 / iob2: chunk tags, checked; plain: any tag (POS tags, a column of any tag set).
SCHEMES = ("iob1", "iob2", "plain")


def _check_tag(tag: str, where: str) -> tuple[str, str]:
  """("B", "PER") for "B-PER", ("O", "") for "O"; a ValueError otherwise."""
  if tag == "O":
    return "O", ""
  prefix, sep, kind = tag.partition("-")
  if prefix not in ("B", "I") or not sep or not kind:
    raise ValueError(f"{where}: label {tag!r} is not an IOB tag (O, B-TYPE or I-TYPE)")
  return prefix, kind


def read_conll(path, *, scheme: str, label_column: int = -1,
               labels: Sequence[str] | None = None) -> list[records.TaggedSentence]:
  """Reads a CoNLL-format file.

  Args:
    path: the file (local or gs://).
    scheme: "iob1", "iob2" or "plain". IOB tags are checked to be O, B-X or
      I-X, and IOB2 also that an I-X continues an X chunk (read such files
      as "iob1"); "plain" takes any tag.
    label_column: index of the tag column (words are column 0).
    labels: the allowed tags (e.g. label_list(train) when reading dev); any
      other is an error naming the file and line.

  Every token line must have as many columns as the file's first one. A file
  without token lines gives no sentences (the fine-tuning task refuses that).
  """
  if scheme not in SCHEMES:
    raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
  path = os.fspath(path)
  allowed = None if labels is None else set(labels)
  sentences, width, first_line = [], None, None
  tokens, tags, start = [], [], None

  def flush():
    if tokens:
      sentences.append(records.TaggedSentence(list(tokens), list(tags), f"{path}:{start}"))
      tokens.clear()
      tags.clear()

  for n, line in enumerate(text_files.text_lines(path), 1):
    columns = line.split()
    if not columns or columns[0] == "-DOCSTART-":
      flush()
      continue
    where = f"{path}:{n}"
    if width is None:
      if len(columns) < 2:
        raise ValueError(f"{where}: a token line needs a word and a tag, got {line.strip()!r}")
      width, first_line = len(columns), n
    elif len(columns) != width:
      raise ValueError(f"{where}: {len(columns)} columns, but line {first_line} has {width} "
                       "(ragged columns)")
    tag = columns[label_column]
    prefix, kind = _check_tag(tag, where) if scheme != "plain" else ("", "")
    if allowed is not None and tag not in allowed:
      raise ValueError(f"{where}: unknown label {tag!r}; known labels: {sorted(allowed)}")
    if scheme == "iob2" and prefix == "I" and (not tags or tags[-1][2:] != kind):
      raise ValueError(f"{where}: {tag} does not continue a {kind} chunk, which IOB2 requires "
                       "(is the file IOB1?)")
    if not tokens:
      start = n
    tokens.append(columns[0])
    tags.append(tag)
  flush()
  return sentences


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
  """The same chunks in IOB2: an I-X that opens a chunk becomes B-X.

  Training on IOB2 gives the classifier one consistent tag for "first word
  of a chunk"; entity-level scores are unchanged by the conversion.
  """
  out = []
  for i, tag in enumerate(tags):
    if tag.startswith("I-") and (i == 0 or tags[i - 1] == "O" or tags[i - 1][2:] != tag[2:]):
      tag = "B-" + tag[2:]
    out.append(tag)
  return out


def label_list(sentences: Sequence[records.TaggedSentence]) -> list[str]:
  """"O" then B-/I- of every entity type seen, sorted: the label ids.

  Both prefixes of each type are listed even if one never occurs, so a dev
  file may use I-X where train only had B-X; a type absent from train stays
  an unknown label.
  """
  kinds = sorted({t[2:] for s in sentences for t in s.labels if t != "O"})
  return ["O"] + [f"{p}-{k}" for k in kinds for p in ("B", "I")]
