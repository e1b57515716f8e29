"""Training metrics out: TensorBoard events, metrics.jsonl, the terminal progress line, MFU.

Model FLOPs (what MFU counts; the PaLM-paper convention, forward + backward = 3x forward):
  per token   6 * N_dense + 12 * L * H * T
  per MLM prediction   6 * E * V   (the tied decoder runs on masked positions only)
where N_dense = parameters excluding the word/position/type embedding tables
(they are lookups, not matmuls, except as the decoder counted separately),
L layers, H hidden size, T sequence length (12 L H T is the QK^T and AV
matmuls, forward 4 L H T), E embedding size, V vocabulary. Padding tokens are
counted as tokens: the hardware computes them.
"""

import json
import os
import time
from typing import Any

import jax
import numpy as np

# Dense bf16 peak TFLOP/s per device, by jax Device.device_kind (for MFU).
PEAK_TFLOPS = {
    "TPU v3": 123.0, "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5p": 459.0,
    "TPU v6 lite": 918.0, "NVIDIA A100-SXM4-40GB": 312.0, "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H200": 989.0,
}
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


def flops_per_step(bert_config: Any, params: Any, batch_size: int, seq_len: int,
                   predictions: int) -> float:
  """Model FLOPs of one training step (formula in the module docstring)."""
  _, dense = count_params(params)
  c = bert_config
  e = c.embedding_size or c.hidden_size
  per_token = 6 * dense + 12 * c.num_hidden_layers * c.hidden_size * seq_len
  return float(batch_size * (seq_len * per_token + predictions * 6 * e * c.vocab_size))


def peak_flops(peak_tflops_per_device: float) -> float | None:
  """Peak FLOP/s of all devices: the config's number, else the table, else None (no MFU)."""
  tflops = peak_tflops_per_device or PEAK_TFLOPS.get(jax.devices()[0].device_kind)
  return tflops * 1e12 * jax.device_count() if tflops else None


class MetricWriter:
  """Writes scalars to TensorBoard (tf.summary) and workdir/metrics.jsonl from process 0."""

  def __init__(self, workdir: str):
    self._enabled = jax.process_index() == 0
    if not self._enabled:
      return
    # pylint: disable=g-import-not-at-top  # TF only on the writing host
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2
    self._tf = tf
    self._summary = tf.summary.create_file_writer(os.path.join(workdir, "tensorboard"))
    # tf.summary.scalar lives in the tensorboard package, which is not a
    # dependency; tf.summary.write with the scalars plugin metadata writes the
    # same event records (what tensorboard's scalar op does).
    self._scalar_metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR)
    self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a", encoding="utf-8")

  def write(self, step: int, scalars: dict[str, float]) -> None:
    """Records `scalars` at `step` in both sinks."""
    if not self._enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    with self._summary.as_default():
      for k, v in scalars.items():
        self._tf.summary.write(k, self._tf.constant(v, self._tf.float32), step=step,
                               metadata=self._scalar_metadata)
    self._jsonl.write(json.dumps({"step": step, **scalars}) + "\n")
    self._jsonl.flush()

  def close(self) -> None:
    """Flushes both sinks."""
    if self._enabled:
      self._summary.flush()
      self._jsonl.close()


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
    line += f" MFU {100 * scalars['mfu']:.1f}%"
  return line
