"""A tokenized store's units of work, and one unit tokenized into its shard's arrays.

A unit is an input file, or, for a plain-text file larger than data.shard_bytes, a
byte range of it: the k-th of n = ceil(size / shard_bytes) ranges starts at the first
document boundary at or after k x shard_bytes -- just after the first blank line for
BERT format, the next line start for raw: and jsonl: (a line is a document there; lines
end where text_lines says, at "\n", "\r\n" or a lone "\r") --
and ends where the next begins. Every document is so read whole by exactly one unit,
and the units one after the other read the file exactly as one pass does (the same
lines, the same documents, the same counts; corpora._lines reads a range).
Compressed files (.gz/.bz2/.xz) are one unit each; a Parquet file larger than
data.shard_bytes is cut into runs of whole row groups (parquet_files reads those
exactly as a whole-file pass does). The plan is a function of the file
sizes only, and each unit finds its own boundaries: two units sharing one compute it
alike, wherever and whenever they run.

tfds corpora: the in-memory path reads process p's even split of data.tfds_split
(tfds.even_splits(split, P)[p]); here that split is cut again into k even splits, k
from the split's size, so the units of a process, in order, are its part in order
(tests/test_token_store.py checks it against the in-memory path).

What a shard holds is token_store's module docstring.
"""

import dataclasses
import hashlib
import math
import os
from typing import Iterator

import numpy as np

from data_pipeline.sources import corpora
from data_pipeline.sources import parquet_files
from data_pipeline.sources import sentences
from data_pipeline.sources import text_lines
from data_pipeline.store import tokenized_corpus
from host import paths


def plan_units(data_config, kind: str, files: list[str], process_count: int) -> list[dict]:
  """The units of a corpus, in corpus order: {"index", "file", "nominal": [k, n]} (file
  corpora, with "row_groups": [first, end) for Parquet; an empty file has none) or
  {"index", "part": [p, j, k]} (tfds)."""
  if data_config.corpus.startswith("tfds:"):
    per_process = _tfds_units_per_process(data_config, process_count)
    parts = [[p, j, per_process] for p in range(process_count) for j in range(per_process)]
    return [{"index": i, "part": part} for i, part in enumerate(parts)]
  units = []
  for number, path in enumerate(files):
    size = paths.size(path)
    if not size:
      continue
    n = math.ceil(size / data_config.shard_bytes)
    if kind == "parquet":
      groups = parquet_files.row_group_count(path, data_config.text_field)
      n = max(1, min(n, groups))
      units += [{"index": len(units) + k, "file": number, "nominal": [k, n],
                 "row_groups": [k * groups // n, (k + 1) * groups // n]} for k in range(n)]
      continue
    if corpora.is_compressed(path):
      n = 1
    units += [{"index": len(units) + k, "file": number, "nominal": [k, n]} for k in range(n)]
  return units


def unit_bytes(unit: dict, data_config, files: list[str]) -> int:
  """About how many bytes of text a unit reads (the progress bar's measure)."""
  if "part" not in unit:
    size = paths.size(files[unit["file"]])
    k, n = unit["nominal"]
    if n == 1:
      return size
    if "row_groups" in unit:
      return size // n
    return min(size, (k + 1) * data_config.shard_bytes) - k * data_config.shard_bytes
  return data_config.shard_bytes


# ------------------------------------------------------------------ byte ranges


def _boundary(path: str, kind: str, offset: int, size: int, max_line_bytes: int) -> int:
  """The first document boundary at or after `offset` (see the module docstring)."""
  if offset <= 0 or offset >= size:
    return max(0, min(offset, size))
  with paths.open_binary(path) as f:
    position = text_lines.line_start(f, offset)
    if kind != "bert":
      return position
    f.seek(position)
    for raw, length in text_lines.raw_lines(f, max_line_bytes):  # as corpora._lines reads
      position += length
      if raw is None:
        continue  # an over-long line: skipped, not blank
      try:
        if not raw.decode("utf-8").strip():
          return position  # just after a blank line: a document boundary
      except UnicodeDecodeError:
        pass  # skipped by the reader: not blank
  return size


def byte_range(unit: dict, kind: str, path: str, data_config) -> tuple[int, int] | None:
  """The [start, end) a unit of a file reads (None: the whole file)."""
  k, n = unit["nominal"]
  if n == 1 or "row_groups" in unit:
    return None
  size, step = paths.size(path), data_config.shard_bytes
  start = _boundary(path, kind, k * step, size, data_config.max_line_bytes)
  end = size if k == n - 1 else _boundary(path, kind, (k + 1) * step, size,
                                          data_config.max_line_bytes)
  return start, max(start, end)


# ------------------------------------------------------------------------ tfds


def _tfds_builder(data_config):
  from host import tf_cpu  # pylint: disable=g-import-not-at-top,unused-import  # before tfds
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds, tfds.builder(data_config.corpus[5:], data_dir=data_config.tfds_data_dir or None)


def _tfds_units_per_process(data_config, process_count: int) -> int:
  _, builder = _tfds_builder(data_config)
  try:
    num_bytes = builder.info.splits[data_config.tfds_split].num_bytes
  except (KeyError, ValueError, TypeError):  # a split spec its info cannot size
    return 1
  return max(1, math.ceil(num_bytes / data_config.shard_bytes / process_count))


def tfds_source_key(data_config, process_count: int) -> dict:
  """What a tfds corpus is, by content: its dataset_info.json's SHA-256 and its files'
  names and sizes; the split read and the process count its units are cut for."""
  _, builder = _tfds_builder(data_config)
  directory = os.fspath(builder.data_dir)
  names = sorted(os.path.basename(p) for p in paths.glob(paths.join(directory, "*")))
  info = paths.read_bytes(paths.join(directory, "dataset_info.json"))
  return {"kind": "tfds", "name": builder.info.full_name, "split": data_config.tfds_split,
          "process_count": process_count, "info_sha256": hashlib.sha256(info).hexdigest(),
          "files": [[n, paths.size(paths.join(directory, n))] for n in names]}


# ------------------------------------------------------------------ tokenizing


def unit_documents(data_config, unit: dict, kind: str, files: list[str],
                   stats: corpora.CorpusStats, process_count: int
                   ) -> tuple[Iterator[list[str]], tuple[int, int] | None]:
  """(the raw documents a unit reads, in corpus order; the byte range it reads)."""
  if "part" in unit:
    tfds, _ = _tfds_builder(data_config)
    p, j, k = unit["part"]
    part = tfds.even_splits(tfds.even_splits(data_config.tfds_split, n=process_count)[p],
                            n=k)[j]
    # pylint: disable-next=protected-access  # corpora's reader of one tfds split
    return corpora._tfds_documents(data_config.corpus[5:], data_config.tfds_data_dir, part,
                                   data_config.text_field, 0, 1,
                                   sentences.splitter(data_config.sentence_splitter)), None
  path = files[unit["file"]]
  span = byte_range(unit, kind, path, data_config)
  groups = range(*unit["row_groups"]) if "row_groups" in unit else None
  return corpora.file_documents(kind, path, max_line_bytes=data_config.max_line_bytes,
                                stats=stats, text_field=data_config.text_field,
                                byte_range=span, sentence_splitter=data_config.sentence_splitter,
                                row_groups=groups), span


def tokenize_unit(data_config, tokenizer, unit: dict, kind: str, files: list[str],
                  process_count: int) -> tuple[dict[str, np.ndarray], dict]:
  """A unit's shard arrays (token_store) and what its preparation counted."""
  stats = corpora.CorpusStats(files=int(unit.get("nominal", [0])[0] == 0))
  sources, hashes, read = [], [], [0]
  documents, span = unit_documents(data_config, unit, kind, files, stats, process_count)

  def pieces():
    for index, document in enumerate(documents):
      read[0] = index + 1
      for piece in corpora.document_pieces(document, data_config.max_sentences_per_document,
                                           stats):
        sources.append(index)
        hashes.append(corpora.heldout_hash(piece))
        stats.documents += 1
        stats.sentences += len(piece)
        stats.single_sentence_documents += len(piece) == 1
        yield piece

  ids, lengths, counts, segmented = tokenized_corpus.tokenize_sentences(
      pieces(), tokenizer, segmentation=data_config.masking.word_segmentation, stats=stats,
      parallel=False)  # a worker per core: the parallelism is over processes
  document_of = np.repeat(np.arange(len(counts)), counts)
  nonempty = lengths > 0
  arrays = {
      "ids": ids,
      "sentence_lengths": lengths[nonempty].astype(np.int32),
      "piece_sentences": np.bincount(document_of[nonempty], minlength=len(counts)
                                     ).astype(np.int32),
      "piece_segmented": (np.bincount(document_of, weights=segmented, minlength=len(counts))
                          if segmented is not None else np.zeros(len(counts))).astype(np.int32),
      "piece_hash": np.asarray(hashes, np.uint64),
      "piece_source": np.asarray(sources, np.int64),
  }
  info = {"range": list(span) if span else None, "source_documents": read[0],
          "pieces": len(counts), "sentences": int(nonempty.sum()), "tokens": len(ids),
          "ids_dtype": ids.dtype.str,
          "stats": dataclasses.asdict(stats)}
  return arrays, info
