"""Training metrics out: TensorBoard events, metrics.jsonl, the terminal progress line, MFU.

MFU divides model FLOPs per second by the devices' peak (bert_jax.accelerators.PEAK_TFLOPS).
The model FLOPs of a step are defined once, in bert_jax.pretrain.cost.step_flops (each
head charged where it runs, the real predictions counted); this module only times and
writes.
"""

import os
import shutil
import tempfile
import time
from typing import Any

import jax
import numpy as np

from bert_jax import accelerators
from bert_jax.run import jsonl
from bert_jax.run import lock as workdir_lock
from host import paths

METRICS_FILE = "metrics.jsonl"
EMBEDDING_TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def count_params(params: Any) -> tuple[int, int]:
  """(all parameters, parameters outside the embedding tables)."""
  total = dense = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    n = int(np.prod(leaf.shape))
    total += n
    if not any(name in jax.tree_util.keystr(path) for name in EMBEDDING_TABLES):
      dense += n
  return total, dense


def peak_flops(peak_tflops_per_device: float) -> float | None:
  """Peak FLOP/s of all devices: the config's number, else the table, else None (no MFU)."""
  tflops = (peak_tflops_per_device
            or accelerators.PEAK_TFLOPS.get(jax.devices()[0].device_kind))
  return tflops * 1e12 * jax.device_count() if tflops else None


class MetricWriter:
  """Writes scalars to TensorBoard (tf.summary) and workdir/metrics.jsonl from process 0.

  One rule for resumed runs: the rows of steps after the step a run starts
  from are dropped when it starts (the attempt that wrote them was killed and
  its later work is lost), so every step appears once and in order, and a
  script plotting metrics.jsonl never double-counts. `recorded(step)` tells
  the trainer what a step already has (a resumed run does not evaluate a step
  twice).

  On object storage (gs://) nothing can be appended: both files are kept
  locally (the JSON lines in memory, the event file in a temporary directory)
  and uploaded whole at most every `sync_every_s` seconds, at every `flush()`
  (the trainers flush when they save a checkpoint) and on close. A run killed
  with kill -9 loses at most the rows since the last upload; on resume they are
  written again.
  A run that lost its workdir lock (bert_jax.run.lock.lost) writes nothing more:
  the files are the new holder's now, and an upload of the whole file would
  replace that run's rows with this one's.
  """

  def __init__(self, workdir: str, start_step: int = 0, *, sync_every_s: float = 60.0):
    self._path, self._workdir = paths.join(workdir, METRICS_FILE), workdir
    self._enabled = jax.process_index() == 0
    # Every process knows what is recorded, so all make the same decisions (a
    # skipped evaluation is skipped everywhere); only process 0 writes.
    kept = jsonl.resume(self._path, start_step, _is_row, rewrite=self._enabled)
    self._recorded: dict[int, dict[str, float]] = {}
    for r in kept:
      self._recorded.setdefault(r["step"], {}).update(r)
    if not self._enabled:
      return
    # pylint: disable=g-import-not-at-top  # TF only on the writing host
    from host.tf_cpu import tf  # kept off the accelerators
    from tensorflow.core.framework import summary_pb2
    self._tf = tf
    self._remote = paths.is_remote(workdir)
    self._tensorboard = paths.join(workdir, "tensorboard")
    self._events = tempfile.mkdtemp(prefix="bert_jax_tb_") if self._remote else self._tensorboard
    self._summary = tf.summary.create_file_writer(self._events)
    # tf.summary.scalar lives in the tensorboard package, which is not a
    # dependency; tf.summary.write with the scalars plugin metadata writes the
    # same event records (what tensorboard's scalar op does).
    self._scalar_metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)
    self._lines = [jsonl.line(r) for r in kept]  # uploaded whole on gs://
    self._jsonl = None if self._remote else paths.open_text(self._path, "a")
    self._sync_every_s, self._last_sync = sync_every_s, time.monotonic()

  def recorded(self, step: int) -> dict[str, float]:
    """The metrics metrics.jsonl already holds for `step` (name -> value)."""
    return self._recorded.get(step, {})

  def write(self, step: int, scalars: dict[str, float]) -> None:
    """Records `scalars` at `step` in both sinks."""
    if not self._enabled or workdir_lock.lost(self._workdir):
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    with self._summary.as_default():
      for k, v in scalars.items():
        self._tf.summary.write(k, self._tf.constant(v, self._tf.float32), step=step,
                               metadata=self._scalar_metadata)
    line = jsonl.line({"step": step, **scalars})
    self._recorded.setdefault(step, {}).update(scalars)
    if self._remote:
      self._lines.append(line)
      if time.monotonic() - self._last_sync > self._sync_every_s:
        self.flush()
    else:
      self._jsonl.write(line)
      self._jsonl.flush()

  def flush(self) -> None:
    """Makes everything written so far durable in the workdir."""
    if not self._enabled or workdir_lock.lost(self._workdir):
      return
    self._summary.flush()
    if self._remote:
      paths.write_atomic(self._path, "".join(self._lines))
      for name in os.listdir(self._events):
        paths.copy_file(os.path.join(self._events, name), paths.join(self._tensorboard, name))
      self._last_sync = time.monotonic()

  def close(self) -> None:
    """Flushes both sinks and closes them."""
    if self._enabled:
      self.flush()
      self._summary.close()
      if self._jsonl is not None:
        self._jsonl.close()
      if self._remote:
        shutil.rmtree(self._events, ignore_errors=True)


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl (bert_jax.run.jsonl.parse_rows: a torn last line, from a
  kill mid-write, is skipped; a malformed line before it is jsonl.MalformedLine)."""
  return jsonl.parse_rows(paths.read_text(path), str(path), _is_row)


def _is_row(row: dict[str, Any]) -> bool:
  """A metrics row has an int step (MetricWriter keeps rows by it on resume)."""
  return isinstance(row.get("step"), int) and not isinstance(row["step"], bool)


class Progress:
  """Throughput, ETA and MFU between two log points."""

  def __init__(self, total_steps: int, start_step: int):
    self._total = total_steps
    self._last_step, self._last_time = start_step, time.perf_counter()

  def measure(self, step: int, tokens_per_step: int, flops_per_step_: float,
              peak: float | None) -> dict[str, float]:
    """Rates since the previous call (call right after syncing on `step`'s results)."""
    now = time.perf_counter()
    steps_per_s = (step - self._last_step) / max(now - self._last_time, 1e-9)
    self._last_step, self._last_time = step, now
    rates = {"steps_per_s": steps_per_s, "tokens_per_s": steps_per_s * tokens_per_step,
             "eta_s": (self._total - step) / max(steps_per_s, 1e-9)}
    if peak:
      rates["mfu"] = steps_per_s * flops_per_step_ / peak
    return rates


def progress_line(step: int, total: int, scalars: dict[str, float]) -> str:
  """One terminal line: step, loss, accuracy, steps/s, tokens/s, ETA, MFU."""
  eta = scalars["eta_s"]
  accuracy = f" mlm_acc {scalars['mlm_accuracy']:.3f}" if "mlm_accuracy" in scalars else ""
  line = (f"step {step}/{total} loss {scalars['loss']:.4f}{accuracy} "
          f"lr {scalars['learning_rate']:.2e} | {scalars['steps_per_s']:.2f} steps/s "
          f"{scalars['tokens_per_s']:.0f} tok/s ETA {int(eta) // 3600}h{int(eta) % 3600 // 60:02d}m"
          f"{int(eta) % 60:02d}s")
  if "mfu" in scalars:
    # What it counts: bert_jax.pretrain.cost.step_flops with the step's real MLM predictions.
    line += f" MFU {100 * scalars['mfu']:.1f}% (model FLOPs of real predictions)"
  return line
