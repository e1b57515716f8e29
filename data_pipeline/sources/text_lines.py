"""Where the lines of a text file end: "\\n", "\\r\\n" or a lone "\\r" (old Mac files).

The one rule of every reader of running text (corpora._lines for BERT-format, raw:
and jsonl: files) and of the tokenized store's byte ranges (corpus_units), so that
a file read in ranges reads exactly as one pass does. A line longer than the
reader's limit is skipped without being held in memory: such lines are minified
code or binary, not prose.

A file without any "\\r" reads exactly as it did when "\\n" was the only line end
(the same lines, bytes and counts: the same tokens, the same stores), and "\\r\\n"
ends a line as before; only a lone "\\r", which used to stay inside its line (a
CR-only file was one line), now ends one.
"""

from typing import IO, Iterator

def _end(data: bytes) -> int:
  """Index of the first "\r" or "\n" in `data`, -1 when there is none."""
  cr, lf = data.find(b"\r"), data.find(b"\n")
  return lf if cr < 0 else cr if lf < 0 else min(cr, lf)


def raw_lines(f: IO[bytes], limit: int) -> Iterator[tuple[bytes | None, int]]:
  """(line, size) of every line from `f`'s position on: the line's bytes without its end,
  None for one over `limit` bytes (read past, never held whole); size: the bytes it took,
  its end included (a byte range reader counts its position with them).

  Memory stays within about `limit` (and 1 MiB): "\n" lines are read one by one; a
  chunk without "\n" (lone-"\r" lines) is walked through with an offset, never cut up
  line by line (which would copy it once per line).
  """
  buf, at = b"", 0  # read and not given out yet: buf[at:]
  cr = lf = None  # where buf's next "\r" / "\n" at or after `at` is (-1: none; None: not
  # looked for since buf changed); each found once, so a chunk is scanned once in all
  readline, most = f.readline, limit + 1
  while True:
    if at == len(buf):
      chunk = readline(most)
      if chunk[-1:] == b"\n" and b"\r" not in chunk:  # a "\n" line: the common case
        yield chunk[:-1], len(chunk)
        continue
      if not chunk:
        return
      buf, at, cr, lf = chunk, 0, None, None
    if cr is None or 0 <= cr < at:
      cr = buf.find(b"\r", at)
    if lf is None or 0 <= lf < at:
      lf = buf.find(b"\n", at)
    end = cr if lf < 0 else lf if cr < 0 else min(cr, lf)
    rest = len(buf) - at
    if end < 0 and rest <= limit:  # the line goes on past what was read
      more = readline(most - rest)
      if not more:
        yield buf[at:], rest  # the last line, without an end
        return
      buf, at, cr, lf = buf[at:] + more, 0, None, None
      continue
    if end < 0:  # over `limit` bytes and no end yet: read past the rest of it
      size = rest
      while True:
        piece = readline(1 << 20)
        end = _end(piece)
        if end >= 0 or not piece:
          break
        size += len(piece)
      if not piece:
        yield None, size
        return
      line, size, buf, at, cr, lf = None, size + end + 1, piece, end + 1, None, None
    else:
      line = buf[at:end] if end - at <= limit else None  # a long one: rest of a read-past
      size, at = end - at + 1, end + 1
    if buf[end] == 13:  # a "\r": the first half of a "\r\n"?
      if at == len(buf):
        buf, at, cr, lf = f.read(1), 0, None, None
      if buf[at:at + 1] == b"\n":
        size, at = size + 1, at + 1
    yield line, size


def line_start(f: IO[bytes], offset: int) -> int:
  """The first line start at or after `offset` in seekable `f` (0, or just after a line's
  end as raw_lines reads it)."""
  if offset == 0:
    return 0
  f.seek(offset - 1)
  position = offset - 1
  while True:
    block = f.read(1 << 16)
    if not block:
      return position
    end = _end(block)
    if end >= 0:
      start = position + end + 1
      if block[end:end + 1] == b"\r":  # a "\r\n" ends after its "\n"
        f.seek(start)
        start += f.read(1) == b"\n"
      return start
    position += len(block)


def count_lines(data: bytes) -> int:
  """How many line ends `data` holds ("\\r\\n" once; for line numbers in refusals)."""
  return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
