"""Documents of a Parquet file: the ``parquet:<glob>`` corpora.

Wikipedia and the BookCorpus substitutes are distributed as Parquet (Hugging
Face datasets). Every row's ``config.data.text_field`` column is one document,
split into paragraphs (blank lines) and sentences like a JSONL document's text
(sentences.paragraph_sentences with the run's data.sentence_splitter).

The file is opened through the path layer (host/paths.py: local or gs://) and
pyarrow reads that one column in record batches of _BATCH_ROWS rows, so memory
stays bounded by a batch, not the file. A null text is skipped and counted
(``null_texts``); an empty one is passed on as an empty document (counted as
``empty_documents`` by the reader, as a JSONL document's would be); a text over
``max_line_bytes`` is skipped like an over-long JSONL line (``overlong_lines``),
so the same rows read the same from either format. A file without the column,
with a column that is not text, or that is not Parquet is refused by name
(ValueError: the trainer's one-line refusal), listing the file's columns; a page
that does not decode (a damaged file) is refused naming the file and its row group.

Multi-host shares and the held-out split are corpora.py's, as for every file
corpus. A tokenized store can read a file in pieces: `row_group_count` says how
many row groups it has, `parquet_documents(..., row_groups=range(a, b))` reads
only those, exactly as a whole-file pass reads them.
"""

from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from data_pipeline.sources import sentences
from host import paths

# Rows per record batch: a few MB of Wikipedia articles, the most held at once.
_BATCH_ROWS = 1024


def _open(path: str):
  """(file object, ParquetFile) of `path`; ValueError naming it when it is not Parquet."""
  f = paths.open_binary(path)
  try:
    return f, pq.ParquetFile(f)
  except (pa.ArrowException, OSError) as e:
    f.close()
    raise ValueError(f"corpus file {path}: not a readable Parquet file ({e}); remove it from "
                     "the parquet: glob (config.data.corpus)") from None


def _text_column(path: str, parquet_file, text_field: str) -> None:
  """Refuses a file whose `text_field` column is missing or not a string column."""
  schema = parquet_file.schema_arrow
  if text_field not in schema.names:
    raise ValueError(f"corpus file {path} has no column {text_field!r} (config.data.text_field); "
                     f"its columns: {', '.join(schema.names)}: set "
                     "--config.data.text_field to the one holding the text")
  column_type = schema.field(text_field).type
  if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
          or pa.types.is_string_view(column_type)):
    raise ValueError(f"corpus file {path}: column {text_field!r} (config.data.text_field) is "
                     f"{column_type}, not text; its columns: {', '.join(schema.names)}")


def row_group_count(path: str, text_field: str = "text") -> int:
  """How many row groups `path` has (the units a store can shard it into); refuses the file
  like parquet_documents would."""
  f, parquet_file = _open(path)
  with f:
    _text_column(path, parquet_file, text_field)
    return parquet_file.num_row_groups


def parquet_documents(path: str, max_line_bytes: int, stats, text_field: str = "text",
                      split: sentences.Splitter = sentences.split_sentences,
                      row_groups: range | None = None) -> Iterator[list[str]]:
  """Documents (lists of sentences) of one Parquet file, one per row with a text.

  Args:
    path: the file, local or gs://.
    max_line_bytes: a longer text is skipped and counted (``overlong_lines``).
    stats: the corpora.CorpusStats to count ``rows``, ``null_texts`` and
      ``overlong_lines`` in.
    text_field: the column holding each document's text.
    split: the sentence splitter (sentences.splitter(config.data.sentence_splitter)).
    row_groups: only these row groups (a store's shard), else the whole file.
  """
  f, parquet_file = _open(path)
  with f:
    _text_column(path, parquet_file, text_field)
    groups = row_groups if row_groups is not None else range(parquet_file.num_row_groups)
    for group in groups:  # one at a time, so that a damaged one is named
      for text in _texts(path, parquet_file, group, text_field):
        stats.rows += 1
        if text is None:
          stats.null_texts += 1
        elif len(text) > max_line_bytes // 4 and len(text.encode("utf-8")) > max_line_bytes:
          stats.overlong_lines += 1
        else:
          yield sentences.paragraph_sentences(text, split)


def _texts(path: str, parquet_file, group: int, text_field: str) -> Iterator[str | None]:
  """The texts of one row group, a record batch at a time; a page that does not decode
  (pyarrow: OSError "Corrupt snappy compressed data", ArrowInvalid) is refused naming the
  file and the row group: the file's bytes are the user's, so it is input, not a bug."""
  try:
    # One thread: a store's workers are processes, one core each.
    for batch in parquet_file.iter_batches(batch_size=_BATCH_ROWS, row_groups=[group],
                                           columns=[text_field], use_threads=False):
      yield from batch.column(0).to_pylist()
  except (pa.ArrowException, OSError) as e:
    rows = parquet_file.metadata.row_group(group).num_rows
    # A decoding failure has no errno; one with an errno is the storage's (a disk, a bucket).
    why = "the file is damaged" if getattr(e, "errno", None) is None else "a storage error"
    raise ValueError(
        f"corpus file {path}: row group {group} (of 0-{parquet_file.num_row_groups - 1}; "
        f"{rows} rows) cannot be read ({' '.join(str(e).split())}): {why}; fetch or write it "
        "again, or remove it from the parquet: glob (config.data.corpus)") from None
