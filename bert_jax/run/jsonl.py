"""JSON-lines step logs (metrics.jsonl, batch_log*.jsonl): the one reading of their rows.

Both logs are appended one line per row and flushed now and then, so a kill
mid-write can leave the last line cut short: a prefix of a row with no newline
after it. That torn last line is dropped (the writers drop it again when a run
resumes). Anything else that is not a row, a complete line anywhere in the
file, is damage no kill makes: it is an error naming the file and line, never
skipped, because a log with a hole in its middle would be rewritten on resume
without the hole showing.

A resumed run cuts its log back once, with `resume` (both writers call it), and
appends rows written with `line`, the one serialization that cut compares with.
"""

import json
from typing import Any, Callable

from absl import logging

from bert_jax import errors
from host import paths


class MalformedLine(errors.UsageError):
  """A complete line of a JSON-lines log that is not a row: the file is damaged. A
  refusal (one line from bert_jax.jobs, exit 1), not a bug: the workdir's checkpoints
  are intact, and the person who damaged the log is the one who can repair it."""


def parse_rows(text: str, where: str, is_row: Callable[[Any], bool] | None = None
               ) -> list[dict[str, Any]]:
  """The rows of a JSON-lines log in file order; only a torn last line is forgiven.

  Args:
    text: the file's contents.
    where: the file, for the error (MalformedLine "<where>:<line>: ...").
    is_row: a row's check beyond being a JSON object (batch_log checks its
      fields); a parsed line it refuses is malformed like a line of bad JSON.
  """
  lines = text.split("\n")
  torn_allowed = not text.endswith("\n")  # the last piece has no newline after it
  if lines and lines[-1] == "":
    lines.pop()
  rows = []
  for number, line in enumerate(lines, 1):
    try:
      row = json.loads(line)
      if not isinstance(row, dict) or (is_row is not None and not is_row(row)):
        raise ValueError("not a row")
    except ValueError:
      if number == len(lines) and torn_allowed:
        continue
      raise MalformedLine(f"{where}:{number}: malformed line {line[:80]!r} (only a torn "
                          "last line, from a kill mid-write, is allowed); restore or delete "
                          "that line (the checkpoints are untouched) and re-run") from None
    rows.append(row)
  return rows


def line(row: dict[str, Any]) -> str:
  """One row as the logs hold it: its JSON and a newline (what `resume` compares with)."""
  return json.dumps(row) + "\n"


def resume(path: str, start_step: int, is_row: Callable[[Any], bool], *,
           rewrite: bool = True) -> list[dict[str, Any]]:
  """The rows of the log at `path` up to `start_step`, the file cut back to hold just them.

  A run resuming from `start_step`'s checkpoint runs the steps after it again:
  rows an earlier attempt wrote for them (it was killed before its next
  checkpoint) are dropped so every step appears once, with a torn last line.
  A malformed line before the last raises MalformedLine (parse_rows) before
  anything is written. The file is rewritten (paths.write_atomic) only when
  that changes it, and only when `rewrite`: where several processes read one
  log, one writes it. A missing file is no rows.

  Args:
    path: the log file.
    start_step: the step the run starts from (0 for a fresh run).
    is_row: parse_rows's row check; a row needs an int "step".
    rewrite: whether this process may write the file.
  """
  text = paths.read_text(path) if paths.exists(path) else ""
  rows = parse_rows(text, str(path), is_row)
  kept = [r for r in rows if r["step"] <= start_step]
  kept_text = "".join(line(r) for r in kept)
  if rewrite and kept_text != text:  # later rows, or a line torn by a kill mid-write
    logging.info("%s: dropped %d rows after step %d (written by an attempt that did not "
                 "reach its next checkpoint)", path, len(rows) - len(kept), start_step)
    paths.write_atomic(path, kept_text)
  return kept
