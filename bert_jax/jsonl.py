"""JSON-lines step logs (metrics.jsonl, batch_log*.jsonl): the one reading of their rows.

Both logs are appended one line per row and flushed now and then, so a kill
mid-write can leave the last line cut short: a prefix of a row with no newline
after it. That torn last line is dropped (the writers drop it again when a run
resumes). Anything else that is not a row, a complete line anywhere in the
file, is damage no kill makes: it is an error naming the file and line, never
skipped, because a log with a hole in its middle would be rewritten on resume
without the hole showing.
"""

import json
from typing import Any, Callable

from bert_jax import errors


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
