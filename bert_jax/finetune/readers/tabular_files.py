"""Reader of CSV, TSV and JSONL classification/regression files, by column.

`read_examples` reads any such file by naming its text, label (and, for test
files, index) columns; the suffix (.tsv/.txt, .csv, .jsonl/.json) sets the
format. Every example remembers where it came from ("file:line"), so a bad
label, a short row or a byte that is not UTF-8 is reported at its place in
the file. Files are read through host.paths (local or gs://).
"""

import csv
import json
import logging
import os
from typing import Iterator, Sequence

from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import text_files
from host import paths

Column = str | int   # a header / JSON key name, or a 0-based index in a headerless file


def _csv_records(path: str, lines: Iterator[str]) -> Iterator[tuple[int, list[str]]]:
  """(first line, fields) of every CSV record; a quoted field may span lines."""
  reader = csv.reader(lines)
  start = 1
  try:
    for fields in reader:
      yield start, fields
      start = reader.line_num + 1
  except csv.Error as e:
    raise ValueError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None


def _rows(path: str, file_format: str, header: bool):
  """Yields (line number, row) with row a dict (named columns) or list (headerless)."""
  lines = text_files.text_lines(path)
  if file_format == "jsonl":
    for n, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
      yield n, row
    return
  if file_format == "tsv":
    # GLUE TSVs contain unbalanced quote characters, so no quoting at all:
    # a field is exactly the text between tabs.
    numbered = ((n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(lines, 1))
  else:
    numbered = _csv_records(path, lines)
  names = None
  for n, fields in numbered:
    if not any(fields):
      continue
    if header and names is None:
      names = fields
      continue
    if names is None:
      yield n, fields
    else:
      # Short rows keep their missing columns absent, so lookups fail by name.
      yield n, dict(zip(names, fields))


_FORMATS = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def _format_of(path: str) -> str:
  suffix = paths.path(path).suffix
  if suffix.lower() not in _FORMATS:
    raise ValueError(f"{path}: cannot tell the format from the suffix {suffix!r} "
                     "(use .tsv, .csv or .jsonl)")
  return _FORMATS[suffix.lower()]


def read_examples(path, *, text_a: Column, text_b: Column | None = None,
                  label: Column | None = "label", labels: Sequence[str] | None = None,
                  regression: bool = False, header: bool = True,
                  skip_malformed: bool = False,
                  index: Column | None = None) -> list[records.Example]:
  """Reads a TSV, CSV or JSONL classification/regression file.

  Args:
    path: the file (local or gs://); the suffix (.tsv/.txt, .csv, .jsonl/.json)
      sets the format.
    text_a, text_b, label: column names (header row / JSON keys) or 0-based
      indices (headerless TSV/CSV). label=None reads an unlabelled (test) file.
    labels: the allowed class names; a row with another label is an error
      naming the file and line. None accepts any (read train first, then pass
      its label set when reading dev; see glue.load_task).
    regression: labels are floats.
    header: TSV/CSV only, whether the first non-empty row names the columns.
    skip_malformed: rows lacking a needed column are skipped and counted in a
      log line instead of raising.
    index: the column of a row's id (GLUE test files: "index", QQP "id"),
      kept as Example.index for leaderboard files; None keeps none.

  Returns:
    Examples in file order (none for an empty file: glue.load_split refuses
    that); classification labels as strings (JSON 0 -> "0").
  """
  path = os.fspath(path)
  file_format = _format_of(path)
  allowed = None if labels is None else {str(x) for x in labels}
  examples, skipped = [], []
  columns = (("text_a", text_a), ("text_b", text_b), ("label", label), ("index", index))
  named = None  # the columns of the first named row: what a wrong column name is told
  for n, row in _rows(path, file_format, header or file_format == "jsonl"):
    if named is None and isinstance(row, dict):
      named = list(row)
    values = {}
    missing = None
    for role, column in columns:
      if column is None:
        values[role] = None
        continue
      try:
        values[role] = row[column]
      except (KeyError, IndexError, TypeError):
        missing = column
        break
    if missing is not None:
      if skip_malformed:
        skipped.append(n)
        continue
      width = len(row)
      known = f"; the file's columns: {', '.join(map(repr, named))}" if named else ""
      raise ValueError(f"{path}:{n}: row has no column {missing!r} ({width} fields); "
                       f"a missing field or a wrong column name{known}")
    for role, column in (("text_a", text_a), ("text_b", text_b)):
      if values[role] is not None and not isinstance(values[role], str):
        raise ValueError(f"{path}:{n}: column {column!r} is not text: {values[role]!r}")
    value = values["label"]
    if value is not None:
      if regression:
        try:
          value = float(value)
        except (TypeError, ValueError):
          raise ValueError(f"{path}:{n}: regression label {value!r} is not a number") from None
      else:
        value = str(value)
        if allowed is not None and value not in allowed:
          raise ValueError(f"{path}:{n}: label {value!r} is not one of {sorted(allowed)}")
    row_index = None if values["index"] is None else str(values["index"])
    examples.append(records.Example(f"{path}:{n}", values["text_a"], values["text_b"], value,
                                    row_index))
  if skipped:
    logging.warning("%s: skipped %d malformed rows (lines %s%s)", path, len(skipped),
                    ", ".join(map(str, skipped[:5])), ", ..." if len(skipped) > 5 else "")
  return examples
