"""The text a vocabulary is learnt from: lines of text files, or any corpus a run reads.

`TrainingText(source)` takes either of:

* a glob of text files (comma-separated globs, or a list of them): every
  non-empty line is a line of training text, lines that are not UTF-8 skipped
  and counted -- what vocab training has always read;
* a corpus spec as `config.data.corpus` takes it ("raw:<glob>", "jsonl:<glob>",
  "parquet:<glob>", "tfds:<name>", "embedded"): every sentence of every document
  is a line. The documents come from corpora.read_documents, the reader
  pretraining uses, so a vocabulary sees the text a run will (all of it: the
  held-out split is text of the corpus too).

A bare glob keeps its old meaning: its lines as they are, not the BERT-format
documents corpora would make of the same files (the same words, but stripped
lines could give SentencePiece other sentences than a vocabulary had before).
Only a bare glob of .parquet files is refused, naming the prefix: its bytes
were never text lines.

The source is checked when a TrainingText is made, before anything is learnt
or written: a glob that matches nothing, a Parquet file without the text column
(every file's footer is read), a first document the reader refuses (a JSONL
line without the field, an unknown tfds dataset) raise ValueError naming it.
"""

import itertools
from typing import Iterator, Sequence

from absl import logging

from data_pipeline.sources import corpora
from data_pipeline.sources import parquet_files
from data_pipeline.sources import sentences
from host import paths


def is_corpus_spec(source: str | Sequence[str]) -> bool:
  """Whether `source` is a corpus spec read by corpora (not a glob of text lines)."""
  return isinstance(source, str) and (
      source == "embedded" or source.startswith(sentences.SPLIT_CORPORA))


class TrainingText:
  """Lines of training text from a glob of text files or a corpus spec (module doc)."""

  def __init__(self, source: str | Sequence[str], *, text_field: str = "text",
               tfds_data_dir: str = "", tfds_split: str = "train",
               sentence_splitter: str = "blingfire", max_line_bytes: int = 1 << 20):
    """Checks `source` now (ValueError naming it); the options are data config's fields of
    the same names, used by corpus specs only ("blingfire": a new run's splitter)."""
    self.source = source
    self._corpus_options = dict(
        text_field=text_field, tfds_data_dir=tfds_data_dir, tfds_split=tfds_split,
        sentence_splitter=sentence_splitter, max_line_bytes=max_line_bytes)
    if not is_corpus_spec(source):
      self._files = _files(source)
      parquet = [f for f in self._files if f.lower().endswith(".parquet")]
      if parquet:  # its bytes as text lines would teach a vocabulary of binary junk
        raise ValueError(f"{parquet[0]} is a Parquet file, read as text lines for want of the "
                         f"prefix: name it parquet:{parquet[0]} (or the glob, prefixed)")
      return
    if not source.startswith("tfds:"):
      kind, files = corpora.corpus_files(source)
      if kind == "parquet":  # a column missing from a later file would fail mid-learning
        for path in files:
          if paths.size(path):  # the reader skips empty files
            parquet_files.row_group_count(path, text_field)
    first = self.lines(max_lines=1)  # the reader's own checks of what it opens first
    next(first, None)
    first.close()

  def lines(self, max_lines: int | None = None) -> Iterator[str]:
    """The non-empty lines (a corpus's sentences), at most `max_lines` of them."""
    if is_corpus_spec(self.source):
      return _corpus_sentences(self.source, max_lines, self._corpus_options)
    return _utf8_lines(self._files, max_lines)


def _files(input_files: str | Sequence[str]) -> list[str]:
  """Expands a glob / comma-separated globs / list of globs into sorted files."""
  patterns = input_files.split(",") if isinstance(input_files, str) else list(input_files)
  files = []
  for pattern in patterns:
    matched = paths.glob(str(pattern))
    if not matched:
      raise ValueError(f"input file pattern {str(pattern)!r} matches no file: give a glob of "
                       "text files or a corpus spec (raw:, jsonl:, parquet:, tfds:, embedded)")
    files.extend(matched)
  return files


def _utf8_lines(files: Sequence[str], max_lines: int | None) -> Iterator[str]:
  """Non-empty decoded lines of `files`; undecodable lines are skipped and counted."""
  emitted = skipped = 0
  for path in files:
    with paths.open_binary(path) as f:
      for number, raw in enumerate(f, start=1):
        try:
          line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
          skipped += 1
          logging.warning("%s:%d is not UTF-8; skipped", path, number)
          continue
        if not line.strip():
          continue
        yield line
        emitted += 1
        if max_lines is not None and emitted >= max_lines:
          break
    if max_lines is not None and emitted >= max_lines:
      break
  logging.info("read %d lines from %d file(s); skipped %d non-UTF-8 line(s)",
               emitted, len(files), skipped)


def _corpus_sentences(corpus: str, max_lines: int | None, options: dict) -> Iterator[str]:
  """Non-empty sentences of every document of a corpus spec (corpora.read_documents)."""
  stats = corpora.CorpusStats()
  documents = corpora.read_documents(corpus, split="all", stats=stats, **options)
  found = (s for document in documents for s in document if s.strip())
  yield from itertools.islice(found, max_lines)
  documents.close()  # stopped at max_lines: the reader's open file is closed now
  stats.log(corpus)
