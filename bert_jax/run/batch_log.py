"""What every pretraining step read, one JSON line per step: workdir/batch_log.jsonl.

  {"step": 17, "batch": "3f9c0a...", "tokens": 3921, "predictions": 598}

`batch` is data_pipeline.examples.pretraining.batch_fingerprint of the batch of update
`step` (1-based, as in metrics.jsonl): a hash of its unmasked ids, segment ids
and NSP labels, taken before masking, so two runs that differ only in their
masks log the same fingerprints and any other difference (pairs, order,
corpus, seed) shows at the first step it touches. `tokens` and `predictions`
are the batch's real (non-padding) tokens and real MLM predictions, so what a
run saw is summed exactly, per step, from the run itself.

Each process logs its own part of the global batch: one process writes
batch_log.jsonl, process i of n writes batch_log.<i>-of-<n>.jsonl.

Resume follows metrics.jsonl's rule: rows after the step a run starts from are
dropped when it starts (their attempt was killed), so every step appears once.
Locally rows are appended and made durable at `flush()` (the trainer flushes
when it saves a checkpoint); on gs://, where nothing can be appended, the rows
are kept in memory and the file is uploaded whole at each flush. A run that lost
its workdir lock (bert_jax.run.lock.lost) adds and flushes nothing more.
"""

from typing import Any

import numpy as np

from bert_jax.run import jsonl
from bert_jax.run import lock as workdir_lock
from host import paths

FILE_NAME = "batch_log.jsonl"


def file_name(process_index: int, process_count: int) -> str:
  """The log file of one process of a run of `process_count` processes."""
  if process_count == 1:
    return FILE_NAME
  return f"batch_log.{process_index}-of-{process_count}.jsonl"


class BatchLog:
  """Appends one row per training step to this process's batch log."""

  def __init__(self, workdir: str, start_step: int, *, process_index: int, process_count: int):
    self._path = paths.join(workdir, file_name(process_index, process_count))
    self._workdir, self._remote = workdir, paths.is_remote(workdir)
    kept = jsonl.resume(self._path, start_step, _is_row)
    self._file = None if self._remote else paths.open_text(self._path, "a")
    # On gs:// the whole file is uploaded at each flush; locally the file holds them.
    self._lines = [jsonl.line(r) for r in kept] if self._remote else []
    # Rows since the last flush, written at the next one (never by a file buffer on its own:
    # a run that lost its workdir lock drops them instead).
    self._pending: list[str] = []

  def add(self, step: int, fingerprint: str, batch: dict[str, np.ndarray]) -> None:
    """Records update `step`'s batch (this process's part of it)."""
    line = jsonl.line({"step": step, "batch": fingerprint,
                       "tokens": int(np.sum(batch["input_mask"])),
                       "predictions": int(np.sum(batch["masked_lm_weights"]))})
    self._pending.append(line)

  def flush(self) -> None:
    """Makes every row added so far durable."""
    if workdir_lock.lost(self._workdir):  # the workdir is another run's now
      self._pending.clear()
      return
    pending, self._pending = "".join(self._pending), []
    if self._file is not None:
      self._file.write(pending)
      self._file.flush()
    else:
      self._lines.append(pending)
      paths.write_atomic(self._path, "".join(self._lines))

  def close(self) -> None:
    """Flushes and closes the file."""
    self.flush()
    if self._file is not None:
      self._file.close()
      self._file = None


class BatchLogError(ValueError):
  """A batch log that cannot be trusted: a malformed line before its last, or a bad row."""


# Fields of a row and their types (bool is an int to json, so it is refused by name).
_ROW_FIELDS = {"step": int, "batch": str, "tokens": int, "predictions": int}


def _is_row(row: dict[str, Any]) -> bool:
  """int step >= 1, str batch, int tokens and int predictions."""
  return not any(not isinstance(row.get(k), t) or isinstance(row.get(k), bool)
                 for k, t in _ROW_FIELDS.items()) and row["step"] >= 1


def parse_strict(text: str, where: str) -> list[dict[str, Any]]:
  """Rows of one log file in file order (bert_jax.run.jsonl.parse_rows: only a torn last
  line is forgiven), as BatchLogError naming `where` and the line otherwise: a log
  with a hole in its middle proves nothing about the steps it no longer shows."""
  try:
    return jsonl.parse_rows(text, where, _is_row)
  except jsonl.MalformedLine as e:
    raise BatchLogError(f"{e}; this run's data cannot be checked") from None


def read(workdir: str) -> dict[str, list[dict[str, Any]]]:
  """Every batch log of a workdir: {file name: rows in step order}; {} when there is none.

  Strict (parse_strict): a malformed line anywhere but a torn last line raises
  BatchLogError.
  """
  logs = {}
  for file in paths.glob(paths.join(workdir, "batch_log*.jsonl")):
    name = paths.path(file).name
    logs[name] = sorted(parse_strict(paths.read_text(file), str(file)), key=lambda r: r["step"])
  return logs
