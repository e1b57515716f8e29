"""Sentence splitting of running text: `splitter(config.data.sentence_splitter)`.

The corpus readers (corpora.py, parquet_files.py) split raw:, jsonl:, parquet:
and tfds: text into sentences with the function this module gives for a
splitter name; BERT-format files are one sentence per line already and are not
split. Two splitters:

* "blingfire" (the default for new runs): Microsoft's Bling Fire sentence
  breaker, a compiled finite-state machine that knows abbreviations ("Dr.",
  "e.g.", "U.S."), initials ("J. R. Jones"), decimals and times ("5 p.m.").
  On the 267 hard cases of tests/data/sentence_cases.jsonl it splits 94% of the
  cases exactly against the regex's 57% (boundary precision 0.995 against 0.49),
  at ~6x the tokenizer's rate per core
  (experiments/benchmarks/data/sentence_splitting.py; the table:
  experiments/results/README.md#sentence-splitting). Two fixes run on its output, for what it gets wrong and the regex did
  not: a closing quote or bracket it starts a sentence with ("。”") goes back to
  the sentence it closes, and a bare list label ("1.", "b)") or title ("Dr.",
  which it cuts off right after a sentence end) joins the words after it. Its text is realigned onto the input, so a sentence is always a
  piece of the input (Bling Fire drops a few characters, e.g. U+200B).
* "regex": the splitter of runs recorded before data.sentence_splitter existed
  (LEGACY_SPLITTER; bert_jax/run/workdir.py resumes them with it): .!? followed
  by whitespace, or CJK 。！？, closing quotes/brackets kept with the sentence.
  It splits after every abbreviation and initial.

Both are deterministic and return sentences with whitespace collapsed to single
spaces, empty ones dropped. Gold word marks (word_segmentation.WORD_MARK) never
move a boundary: the regex skips them, Bling Fire splits the unmarked text and
the marks are put back.
"""

import functools
import importlib.util
import re
from typing import Callable

from data_pipeline.sources import word_segmentation

LEGACY_SPLITTER = "regex"  # what a workdir recorded without data.sentence_splitter split with
SPLITTERS = ("blingfire", "regex")
SPLIT_CORPORA = ("raw:", "jsonl:", "parquet:", "tfds:")  # corpus specs whose text is split here

# Sentence ends: Latin .!? followed by whitespace, or CJK 。！？ (no space needed in
# CJK text); closing quotes/brackets right after the end mark stay with the
# sentence. A gold word mark before a closing mark or the space is skipped, so a
# marked line splits where its unmarked text does.
_SENTENCE_END = re.compile(r"[.!?](?:\u2063?[\"')\]])*(?=\u2063?\s)|[。！？](?:\u2063?[」』\"')）])*")
# Marks that only ever close: one Bling Fire puts at the start of the next sentence
# belongs to the one before. (ASCII quotes open as often as they close: left alone.)
_CLOSING = "”」』）》〉】〕］｝)]}"
# A list label on its own ("1.", "(b)", "iv."): Bling Fire cuts it off the item it numbers.
_LABEL = re.compile(r"\(?(?:\d{1,3}|[A-Za-z]|[ivxIVX]{2,4})[.)]")
# Titles Bling Fire cuts off on their own right after a sentence end ("It rained. Prof.",
# "Ortega spoke."), though it keeps them mid-sentence: joined to the name after them.
_TITLES = frozenset(["Adm.", "Capt.", "Col.", "Dr.", "Fr.", "Gen.", "Gov.", "Hon.", "Lt.", "Maj.",
                     "Mr.", "Mrs.", "Ms.", "Mt.", "Prof.", "Rep.", "Rev.", "Sen.", "Sgt.", "St."])

Splitter = Callable[[str], list[str]]


def split_sentences(text: str) -> list[str]:
  """Splits running text with the regex (.!? + whitespace, 。！？): the "regex" splitter.

  Whitespace inside a sentence is collapsed to single spaces; empty pieces are
  dropped.
  """
  sentences, start = [], 0
  for match in _SENTENCE_END.finditer(text):
    sentences.append(text[start:match.end()])
    start = match.end()
  sentences.append(text[start:])
  return [s for s in (" ".join(p.split()) for p in sentences) if s]


def blingfire_sentences(text: str) -> list[str]:
  """Splits running text with Bling Fire (see the module docstring): the "blingfire" splitter."""
  text = " ".join(text.split())  # Bling Fire's output separates sentences by "\n"
  if not text:
    return []
  marked = word_segmentation.WORD_MARK in text
  plain = text.replace(word_segmentation.WORD_MARK, "") if marked else text
  pieces = _realigned(plain, _blingfire().text_to_sentences(plain).split("\n"))
  pieces = _heads_joined(_closers_moved_back(pieces))
  # The pieces of the unmarked text cut the marked one: a mark goes with the word after it.
  return _aligned_by_characters(text, pieces) if marked else pieces


@functools.cache
def _blingfire():
  """The blingfire module (imported on first use: its native library loads at import)."""
  import blingfire  # pylint: disable=g-import-not-at-top
  return blingfire


def _realigned(text: str, pieces: list[str]) -> list[str]:
  """`text` cut where `pieces` end, as pieces of `text` itself.

  Bling Fire keeps the text as given except for a few characters it drops, so the
  common case is checked piece by piece at C speed; otherwise each piece's
  characters are found in order in `text`, skipping what was dropped.
  """
  out, position = [], 0
  for piece in pieces:
    if text.startswith(piece, position):
      out.append(piece)
      position += len(piece)
      position += text.startswith(" ", position)
      continue
    return _aligned_by_characters(text, pieces)
  return out if position == len(text) else _aligned_by_characters(text, pieces)


def _aligned_by_characters(text: str, pieces: list[str]) -> list[str]:
  """`text` cut after the last character of each piece, found in order in `text`, which
  may hold characters the pieces lack (what Bling Fire dropped; gold word marks)."""
  cuts, position = [0], 0
  for piece in pieces:
    for char in piece:
      if not char.isspace():
        found = text.find(char, position)
        position = found + 1 if found >= 0 else position
    cuts.append(position)
  cuts[-1] = len(text)
  return [s for s in (text[a:b].strip() for a, b in zip(cuts, cuts[1:])) if s]


def _closers_moved_back(pieces: list[str]) -> list[str]:
  """Leading closing marks of a sentence appended to the sentence before it."""
  out = []
  for piece in pieces:
    rest = piece.lstrip(_CLOSING)
    if out and rest != piece:
      out[-1] += piece[:len(piece) - len(rest)]
      piece = rest.lstrip()
    if piece:
      out.append(piece)
  return out


def _heads_joined(pieces: list[str]) -> list[str]:
  """A sentence that is only a list label or titles joined to the sentence after it."""
  out, head = [], ""
  for piece in pieces:
    if _LABEL.fullmatch(piece) or all(word in _TITLES for word in piece.split()):
      head += piece + " "
      continue
    out.append(head + piece)
    head = ""
  if head:
    out.append(head.strip())
  return out


def splitter(name: str) -> Splitter:
  """The split function of a data.sentence_splitter name (ValueError for another name)."""
  if name == "regex":
    return split_sentences
  if name == "blingfire":
    return blingfire_sentences
  raise ValueError(f"data.sentence_splitter must be one of {SPLITTERS}, got {name!r}")


def check_available(name: str) -> None:
  """Refuses (ValueError naming the field and what to do) a splitter that cannot run here."""
  splitter(name)
  if name != "blingfire":
    return
  if importlib.util.find_spec("blingfire") is None:
    raise ValueError("data.sentence_splitter='blingfire' needs the blingfire package, which is "
                     "not installed: pip install blingfire, or set data.sentence_splitter='regex'")
  try:
    _blingfire()
  except OSError as e:  # its native library is built for x86-64 only
    raise ValueError(f"data.sentence_splitter='blingfire': its native library does not load on "
                     f"this machine ({e}); prepare the corpus on an x86-64 host, or set "
                     "data.sentence_splitter='regex'") from None


def paragraph_sentences(text: str, split: Splitter = split_sentences) -> list[str]:
  """Sentences of a text whose paragraphs are separated by blank lines.

  Lines inside a paragraph are joined (docstrings and wrapped prose break lines
  mid-sentence).
  """
  sentences = []
  for paragraph in re.split(r"\n\s*\n", text):
    sentences.extend(split(paragraph))
  return sentences
