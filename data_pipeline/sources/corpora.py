"""Text sources for pretraining: documents as lists of sentences.

Every source yields *documents*, each a ``list[str]`` of sentences, in a
deterministic order:

* BERT format (a glob of files): one sentence per line, a blank line between
  documents -- the input format of google-research/bert's
  create_pretraining_data.py.
* ``raw:<glob>``: one document per line, split into sentences by the
  ``sentence_splitter`` (sentences.py: "blingfire" for new runs, "regex" before).
* ``jsonl:<glob>``: one JSON object per line; its ``text_field`` is one document
  (blank lines inside it separate paragraphs; every paragraph is sentence-split).
* ``parquet:<glob>``: every row's ``text_field`` column is one document, split
  like a JSONL document's text (parquet_files.py: record batches, bounded memory;
  null texts skipped and counted as ``null_texts``).
* ``tfds:<name>``: a TensorFlow Datasets dataset with a text feature (e.g.
  ``wikipedia/20230601.en``) read from a local ``data_dir``; every example is a
  document, split like a JSONL document.
* ``embedded``: the default corpus, real English prose that is already on every
  machine where this package is installed -- the docstrings of the installed
  Python packages (plus the Python HTML documentation where present), harvested
  once into a BERT-format file in a cache directory (embedded.py).
  Its harvest keeps the regex splitter whatever the run's: the file is cached, and
  a harvest on a new machine must give the bytes an old cache holds.

Multi-host: with P processes each reads a disjoint part -- whole files
round-robin when there are at least P files, otherwise documents round-robin by
their index in the (deterministic) stream.

Held-out evaluation text: a document belongs to the evaluation split when the
MD5 of its text is 0 modulo ``heldout_modulus``; training never sees those
documents, whatever the process count.

Files ending in ``.gz``, ``.bz2`` or ``.xz`` are decompressed as they are read.

Bad input never crashes an epoch; it is skipped and counted in
:class:`CorpusStats` (logged once a pass is complete):
* a line that is not valid UTF-8 is skipped (``undecodable_lines``) and counted
  per file (one warning names each file with such lines); a file where more
  than ``max_undecodable_fraction`` of the lines are undecodable is refused by
  name (ValueError): it is binary or compressed, not text;
* a line longer than ``max_line_bytes`` is skipped without being held in memory
  (``overlong_lines``) -- such lines are minified code or binary, not prose -- and
  each file with such lines is named in a warning (warn_overlong, the store's too);
  lines end at "\n", "\r\n" or a lone "\r" (text_lines.py);
* empty files and empty documents are skipped (``empty_files``,
  ``empty_documents``), but a 0-byte Parquet file is refused: it is no Parquet file;
* a document longer than ``max_sentences_per_document`` is cut into several
  documents (``split_documents``), so memory per document stays bounded;
* one-sentence documents are passed on and counted (``single_sentence_documents``):
  for NSP/SOP they serve only as a source of random B segments (see
  pretraining.py);
* a corpus that yields no document at all is a ValueError naming the glob.
"""

import bz2
import contextlib
import dataclasses
import gzip
import hashlib
import json
import logging
import lzma
import os
from typing import Iterator

from data_pipeline.sources import embedded
from data_pipeline.sources import parquet_files
from data_pipeline.sources import sentences
from data_pipeline.sources import text_lines
from data_pipeline.sources import word_segmentation
from host import paths

# Today's regex splitter, where callers have always found it (sentences.py has them all).
split_sentences = sentences.split_sentences



@dataclasses.dataclass
class CorpusStats:
  """Counters of what a pass over a corpus read and skipped (all bad input is counted)."""
  files: int = 0
  lines: int = 0
  documents: int = 0
  sentences: int = 0
  undecodable_lines: int = 0
  overlong_lines: int = 0
  empty_files: int = 0
  empty_documents: int = 0
  split_documents: int = 0
  single_sentence_documents: int = 0
  heldout_documents: int = 0
  rows: int = 0  # Parquet rows read (parquet_files.py; their text is not in `lines`)
  null_texts: int = 0  # Parquet rows whose text is null, skipped
  # With data.masking.word_segmentation (tokenized_corpus.py): sentences whose words set
  # the word starts, sentences without words and sentences whose words did not line up
  # with their pieces (the last two keep the "##" rule).
  segmented_sentences: int = 0
  unsegmented_sentences: int = 0
  misaligned_sentences: int = 0

  def log(self, source: str) -> None:
    """Logs the counters, as a warning when anything was skipped."""
    skipped = (self.undecodable_lines or self.overlong_lines or self.empty_files
               or self.split_documents)
    (logging.warning if skipped else logging.info)(
        "corpus %s: %s", source, dataclasses.asdict(self))


def heldout_hash(document: list[str]) -> int:
  """The stable 64-bit value (MD5 of the text) that puts a document in the held-out split."""
  text = "\n".join(document).replace(word_segmentation.WORD_MARK, "")  # marks are not text
  return int.from_bytes(hashlib.md5(text.encode("utf-8")).digest()[:8], "little")


def is_heldout(document: list[str], modulus: int) -> bool:
  """Whether a document belongs to the held-out evaluation split (stable MD5 of its text)."""
  return heldout_hash(document) % modulus == 0


def document_pieces(document: list[str], max_sentences: int, stats: CorpusStats) -> list:
  """The documents a source document gives: none when empty, else pieces of at most
  `max_sentences` sentences (both counted in `stats`)."""
  if not document:
    stats.empty_documents += 1
    return []
  pieces = [document[s:s + max_sentences] for s in range(0, len(document), max_sentences)]
  stats.split_documents += len(pieces) - 1
  return pieces


def _lines(path: str, max_line_bytes: int, stats: CorpusStats,
           byte_range: tuple[int, int] | None = None) -> Iterator[str]:
  """Decoded lines of a file; undecodable and over-long lines are skipped and counted.

  Lines end at "\n", "\r\n" or a lone "\r" (text_lines.raw_lines, which keeps memory
  bounded by ``max_line_bytes`` however long a line is). Compressed files
  (_DECOMPRESSORS) are read decompressed. ``byte_range`` (start, end), both at line
  starts (token_store's shards of a large plain file): only the lines that start in
  it, read exactly as a whole-file pass reads them.
  """
  opener = None if byte_range else _DECOMPRESSORS.get(os.path.splitext(path)[1].lower())
  start, end = byte_range or (0, None)
  with paths.open_binary(path) as raw_file, (
      opener(raw_file) if opener else contextlib.nullcontext(raw_file)) as f:
    if start:
      f.seek(start)
    position = start  # counted, not f.tell(): one system call per line would cost more
    try:
      for raw, size in text_lines.raw_lines(f, max_line_bytes):
        if end is not None and position >= end:
          return
        position += size
        stats.lines += 1
        if raw is None:
          stats.overlong_lines += 1
          continue
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError:
          stats.undecodable_lines += 1
          continue
        yield line
    except (OSError, EOFError, lzma.LZMAError) as e:  # a truncated or corrupt archive
      raise ValueError(f"{path}: cannot decompress ({e}); re-create the file or remove "
                       "it from the corpus glob") from e


def is_compressed(path: str) -> bool:
  """Whether a corpus file is read decompressed (it can then only be read whole)."""
  return os.path.splitext(path)[1].lower() in _DECOMPRESSORS


# Suffix -> opener of a binary file object: read transparently, like plain text.
_DECOMPRESSORS = {".gz": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
                  ".bz2": lambda f: bz2.BZ2File(f, mode="rb"),
                  ".xz": lambda f: lzma.LZMAFile(f, mode="rb")}


def check_decodable(path: str, lines: int, undecodable: int, max_fraction: float) -> None:
  """Refuses a file whose share of undecodable lines is over `max_fraction`; warns (naming
  the file) when it has any."""
  if not undecodable:
    return
  if undecodable > max_fraction * lines:
    what = ("a binary or compressed file (.gz/.bz2/.xz are read)? Remove it from the corpus "
            "glob")
    if path.lower().endswith(".parquet"):  # read as text for want of the prefix
      what = (f"a Parquet file read as text: name it --config.data.corpus='parquet:{path}' "
              "(or the glob, prefixed)")
    raise ValueError(
        f"corpus file {path}: {undecodable} of its {lines} lines ({undecodable / lines:.0%}) "
        f"are not UTF-8 text (more than config.data.max_undecodable_fraction="
        f"{max_fraction:g}): {what}")
  logging.warning("corpus file %s: skipped %d of its %d lines (not UTF-8)", path, undecodable,
                  lines)


def warn_overlong(path: str, overlong: int, max_line_bytes: int) -> None:
  """Warns, naming the file, that `overlong` of its lines (a Parquet file's: texts) were
  skipped for being over max_line_bytes. Every path says it: the in-memory reader
  after each file, the tokenized store at every start from its per-file counts."""
  if not overlong:
    return
  what = "text" if path.lower().endswith(".parquet") else "line"
  logging.warning("corpus file %s: skipped %d %s%s longer than config.data.max_line_bytes=%d "
                  "bytes (minified code or binary data, not prose?); raise it to read them",
                  path, overlong, what, "s" if overlong > 1 else "", max_line_bytes)


def _bert_format_documents(path, max_line_bytes, stats, byte_range=None) -> Iterator[list[str]]:
  """Documents of one BERT-format file (blank line between documents)."""
  document = []
  for line in _lines(path, max_line_bytes, stats, byte_range):
    line = line.strip()
    if line:
      document.append(line)
    elif document:
      yield document
      document = []
    else:
      stats.empty_documents += 1  # consecutive blank lines: an empty document
  if document:
    yield document


def _raw_documents(path, max_line_bytes, stats, byte_range=None,
                   split=split_sentences) -> Iterator[list[str]]:
  """Documents of a raw text file: each line one document."""
  for line in _lines(path, max_line_bytes, stats, byte_range):
    yield split(line)


def _jsonl_documents(path, max_line_bytes, stats, text_field, byte_range=None,
                     split=split_sentences) -> Iterator[list[str]]:
  """Documents of a JSONL file: field ``text_field`` of every object."""
  for number, line in enumerate(_lines(path, max_line_bytes, stats, byte_range), 1):
    if not line.strip():
      continue
    try:
      text = json.loads(line)[text_field]
    except (ValueError, KeyError, TypeError) as e:
      raise ValueError(f"{path}:{_line_number(path, number, byte_range)}: not a JSON object "
                       f"with a string field {text_field!r} ({e!r})") from e
    if not isinstance(text, str):
      raise ValueError(f"{path}:{_line_number(path, number, byte_range)}: field "
                       f"{text_field!r} is not a string")
    try:  # JSON may escape a lone surrogate (\ud800), which no UTF-8 text can hold
      text.encode("utf-8")
    except UnicodeEncodeError as e:
      raise ValueError(f"{path}:{_line_number(path, number, byte_range)}: field "
                       f"{text_field!r} holds {e.object[e.start:e.end]!r}, a lone surrogate "
                       "escape that is no character: fix or remove the line") from None
    yield sentences.paragraph_sentences(text, split)


def _line_number(path: str, number: int, byte_range: tuple[int, int] | None) -> int:
  """The file's own number of a range's `number`-th line (counted only for a refusal)."""
  if not byte_range or not byte_range[0]:
    return number
  with paths.open_binary(path) as f:
    return number + text_lines.count_lines(f.read(byte_range[0]))


def file_documents(kind: str, path: str, *, max_line_bytes: int, stats: CorpusStats,
                   text_field: str = "text",
                   byte_range: tuple[int, int] | None = None,
                   sentence_splitter: str = sentences.LEGACY_SPLITTER,
                   row_groups: range | None = None) -> Iterator[list[str]]:
  """Raw documents of one corpus file of a kind of _source_pattern ("bert", "raw", "jsonl",
  "parquet"), or of the lines starting in its `byte_range` (token_store's shards; a Parquet
  file is read whole or by `row_groups`, parquet_files.row_group_count of them). Running
  text is split by `sentence_splitter` (sentences.SPLITTERS; BERT format is not split)."""
  if kind == "bert":
    return _bert_format_documents(path, max_line_bytes, stats, byte_range)
  split = sentences.splitter(sentence_splitter)
  if kind == "parquet":
    if byte_range:
      raise ValueError(f"{path}: a Parquet file is read by row groups, not a byte range")
    return parquet_files.parquet_documents(path, max_line_bytes, stats, text_field, split,
                                           row_groups)
  if kind == "raw":
    return _raw_documents(path, max_line_bytes, stats, byte_range, split)
  return _jsonl_documents(path, max_line_bytes, stats, text_field, byte_range, split)


def _tfds_documents(name, data_dir, split, text_field, process_index, process_count,
                    sentence_split=split_sentences) -> Iterator[list[str]]:
  """Documents of a tfds dataset: one per example; process i reads the i-th even sub-split."""
  from host import tf_cpu  # pylint: disable=g-import-not-at-top,unused-import  # first
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder(name, data_dir=data_dir or None)
  # even_splits cuts by example, so it is disjoint for any number of files.
  part = tfds.even_splits(split, n=process_count)[process_index]
  ds = builder.as_dataset(split=part, shuffle_files=False)
  for example in ds.as_numpy_iterator():
    value = example[text_field]
    yield sentences.paragraph_sentences(value.decode("utf-8", errors="replace")
                                        if isinstance(value, bytes) else str(value),
                                        sentence_split)


def _files(pattern: str) -> list[str]:
  """Sorted files of a glob, local or gs:// (sorted: the document order must not depend on
  the file system)."""
  return paths.glob(pattern)


def _source_pattern(corpus: str, embedded_cache_dir: str) -> tuple[str, str]:
  """(kind, glob) of a file corpus spec: kind "bert", "raw", "jsonl" or "parquet"."""
  if corpus == "embedded":
    return "bert", str(embedded.embedded_corpus_path(embedded_cache_dir or None))
  if corpus.startswith(("raw:", "jsonl:", "parquet:")):
    kind, pattern = corpus.split(":", 1)
    return kind, pattern
  return "bert", corpus


def corpus_files(corpus: str, embedded_cache_dir: str = "") -> tuple[str, list[str]]:
  """(kind, sorted files) of a file corpus spec (kinds of _source_pattern); refuses a glob
  that matches no file."""
  kind, pattern = _source_pattern(corpus, embedded_cache_dir)
  files = _files(pattern)
  if not files and paths.is_dir(pattern):  # a glob matches files; a directory is none
    prefix = corpus[:len(corpus) - len(pattern)]  # "raw:", "jsonl:", ... kept in the fix
    raise ValueError(f"config.data.corpus={corpus!r} is a directory; give a glob of its "
                     f"files, e.g. --config.data.corpus='{prefix}{paths.join(pattern, '*')}'")
  if not files:
    raise ValueError(f"corpus glob {pattern!r} (config.data.corpus) matches no file")
  if kind == "parquet":
    # Refused, not skipped like an empty text file: an empty text is text, but no Parquet
    # file has 0 bytes (its footer is mandatory), so this is a download or copy that
    # failed, and the corpus the user meant is not what would be read.
    empty = next((f for f in files if not paths.size(f)), None)
    if empty:
      raise ValueError(f"corpus file {empty} is empty (0 bytes), not a Parquet file: a "
                       "download or copy that failed? Fetch it again, or remove it from the "
                       "parquet: glob (config.data.corpus)")
  return kind, files


def fingerprint(corpus: str, *, embedded_cache_dir: str = "", tfds_data_dir: str = "") -> dict:
  """What a corpus is, cheaply (names and sizes of its files, no reading): a workdir records
  it on creation, so a resumed run refuses a corpus that changed under it."""
  if corpus.startswith("tfds:"):
    return {"corpus": corpus, "tfds_data_dir": tfds_data_dir}
  _, pattern = _source_pattern(corpus, embedded_cache_dir)
  files = _files(pattern)
  listing = [[os.path.basename(f), paths.size(f)] for f in files]
  digest = hashlib.sha256(json.dumps(listing).encode()).hexdigest()[:16]
  return {"files": len(files), "bytes": sum(s for _, s in listing), "listing_sha256": digest}


def read_documents(corpus: str, *, split: str = "train", process_index: int = 0,
                   process_count: int = 1, heldout_modulus: int = 100,
                   tfds_data_dir: str = "", tfds_split: str = "train",
                   text_field: str = "text", max_line_bytes: int = 1 << 20,
                   max_sentences_per_document: int = 2048,
                   embedded_cache_dir: str = "",
                   max_undecodable_fraction: float = 0.01,
                   sentence_splitter: str = sentences.LEGACY_SPLITTER,
                   stats: CorpusStats | None = None) -> Iterator[list[str]]:
  """Yields the documents (lists of sentences) of this process's part of a corpus.

  Args:
    corpus: "embedded" | a glob of BERT-format files | "raw:<glob>" |
      "jsonl:<glob>" | "parquet:<glob>" | "tfds:<name>".
    split: "train" (held-out documents removed), "eval" (only held-out
      documents) or "all".
    process_index, process_count: this process's disjoint part.
    heldout_modulus: one document in about this many is held out for eval.
    tfds_data_dir, tfds_split, text_field: for tfds / JSONL / Parquet sources.
    max_line_bytes, max_sentences_per_document: memory bounds (see module doc).
    embedded_cache_dir: cache of the embedded corpus ("" -> default).
    max_undecodable_fraction: a file with a larger share of undecodable lines is refused.
    sentence_splitter: how running text is split (sentences.SPLITTERS; the trainer passes
      config.data.sentence_splitter; "regex" splits as before the option existed).
    stats: counters to update (a fresh one is made and logged when None).

  Raises:
    ValueError: on an unknown split, a glob matching no file, a file that is
      mostly undecodable, or a corpus part without a single document.
  """
  if split not in ("train", "eval", "all"):
    raise ValueError(f"split must be 'train', 'eval' or 'all', got {split!r}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  own_stats = stats is None
  stats = stats or CorpusStats()
  count = 0
  for document in _source_documents(
      corpus, process_index, process_count, tfds_data_dir, tfds_split, text_field,
      max_line_bytes, embedded_cache_dir, stats, max_undecodable_fraction, sentence_splitter):
    for piece in document_pieces(document, max_sentences_per_document, stats):
      if split != "all" and is_heldout(piece, heldout_modulus) != (split == "eval"):
        stats.heldout_documents += split == "train"
        continue
      stats.documents += 1
      stats.sentences += len(piece)
      stats.single_sentence_documents += len(piece) == 1
      count += 1
      yield piece
  if own_stats:
    stats.log(corpus)
  if not count:
    hint = (f"about one document in config.data.heldout_modulus={heldout_modulus} is held "
            "out: give more documents or a smaller modulus" if split == "eval" else "")
    raise ValueError(
        f"corpus {corpus!r} (split {split!r}, process {process_index} of "
        f"{process_count}) has no document" + (f"; {hint}" if hint else "")
        + f": {dataclasses.asdict(stats)}")


def _source_documents(corpus, process_index, process_count, tfds_data_dir,
                      tfds_split, text_field, max_line_bytes, embedded_cache_dir,
                      stats, max_undecodable_fraction=0.01,
                      sentence_splitter=sentences.LEGACY_SPLITTER) -> Iterator[list[str]]:
  """Raw documents of a corpus spec, already restricted to this process's part."""
  if corpus.startswith("tfds:"):
    yield from _tfds_documents(corpus[5:], tfds_data_dir, tfds_split, text_field,
                               process_index, process_count,
                               sentences.splitter(sentence_splitter))
    return
  kind, files = corpus_files(corpus, embedded_cache_dir)
  by_file = len(files) >= process_count
  if by_file:
    files = files[process_index::process_count]
  index = 0
  for path in files:
    stats.files += 1
    if paths.size(path) == 0:
      stats.empty_files += 1
      continue
    documents = file_documents(kind, path, max_line_bytes=max_line_bytes, stats=stats,
                               text_field=text_field, sentence_splitter=sentence_splitter)
    lines, undecodable, overlong = stats.lines, stats.undecodable_lines, stats.overlong_lines
    for document in documents:
      if by_file or index % process_count == process_index:
        yield document
      index += 1
    check_decodable(path, stats.lines - lines, stats.undecodable_lines - undecodable,
                    max_undecodable_fraction)
    warn_overlong(path, stats.overlong_lines - overlong, max_line_bytes)


# --------------------------------------------------------------------------
