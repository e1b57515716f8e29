r"""What a pretraining run costs, before it starts: model FLOPs, and time on given devices.

  python -m bert_jax.pretrain.cost --config=experiments/configs/pretrain.py:base \
      --on=v4-32,v5litepod-8,8xH200 --mfu=0.4

prints, per phase and in total, the model FLOPs of the configured run
(step_flops: 6 N + 12 L H T per token, the MLM head and 6 E V per prediction
slot, pooler and NSP per sequence) and the wall time and device-hours it takes on each device set at
the stated MFU (model FLOPs utilisation: achieved / peak). The trainer logs the
same estimate for the devices it runs on. Multiply device-hours by your price
per chip (TPU) or GPU hour for the cost.

Device sets: a Cloud TPU accelerator type (v2-8, v3-32, v4-32, v5p-64,
v5litepod-16, v6e-8, ...) or N x a GPU ("8xH200", "H100"). A TPU v2/v3 type
counts TensorCores and each core is one JAX device; v4/v5p types count
TensorCores too but a chip (two cores, one "megacore" device) is the device;
v5e (v5litepod) and v6e types count chips.
"""

import re
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import accelerators
from bert_jax.pretrain import phases as phases_lib
from bert_jax.run import metrics_io
from data_pipeline import specs


def device_set(name: str) -> tuple[str, int]:
  """(device kind, number of JAX devices) of "v4-32", "v5litepod-16", "8xH200", "H100"..."""
  if tpu := accelerators.parse(name):
    return tpu[0].device_kind, accelerators.devices(*tpu)
  gpu = re.fullmatch(r"(?:(\d+)x)?(%s)" % "|".join(accelerators.GPUS), name)
  if gpu:
    return accelerators.GPUS[gpu.group(2)], int(gpu.group(1) or 1)
  raise ValueError(f"unknown device set {name!r}: expected a TPU type such as v4-32 or "
                   f"v5litepod-16, or NxGPU with GPU one of {sorted(accelerators.GPUS)}")


# Parameter groups by where they run: per sequence (pooler, NSP/SOP head), per MLM
# prediction (the head's transform, LayerNorm and output bias; the tied decoder E x V
# is added separately), per token (everything else that is not an embedding table).
_PER_SEQUENCE = ("['pooler']", "['nsp_head']")
_PER_PREDICTION = ("['mlm_head']",)


def flop_weights(bert_config: Any, params: Any, seq_len: int) -> dict[str, float]:
  """Model FLOPs (forward + backward = 3x forward, 2 per multiply-add) of one unit of each work.

  {"token": 6 N_token + 12 H K, "prediction": 6 N_head + 6 E V, "sequence":
  6 N_seq}: N_token the encoder's parameters outside the embedding tables, N_head
  the MLM head's (transform, LayerNorm, output bias; an untied decoder's matrix in place
  of E V), K the keys attended over the layers (L T, less in sliding layers), N_seq the pooler's and the
  NSP head's. The MLM head runs on gathered prediction slots and the pooler and
  NSP head on [CLS] only, so charging them per token (the common 6N-per-token rule)
  overcounts; here each is charged where it runs.
  """
  groups = {"token": 0, "prediction": 0, "sequence": 0}
  untied = False  # the modern encoder's own decoder matrix, a leaf of the MLM head
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    key = jax.tree_util.keystr(path)
    if any(name in key for name in metrics_io.EMBEDDING_TABLES):
      continue  # lookups, not matmuls (the tied decoder is counted below)
    group = ("sequence" if any(g in key for g in _PER_SEQUENCE) else
             "prediction" if any(g in key for g in _PER_PREDICTION) else "token")
    groups[group] += int(np.prod(leaf.shape))
    untied |= "['mlm_head']['decoder']" in key
  c = bert_config
  e = c.embedding_size or c.hidden_size
  return {"token": float(6 * groups["token"] + 12 * c.hidden_size * _attended_keys(c, seq_len)),
          "prediction": float(6 * groups["prediction"] + (0 if untied else 6 * e * c.vocab_size)),
          "sequence": float(6 * groups["sequence"])}


def _attended_keys(bert_config: Any, seq_len: int) -> int:
  """Keys each query attends to, summed over the layers: seq_len in a global layer, the
  window (local_attention + 1 keys, itself included) in a sliding one. The useful work: a
  masked kernel (einsum, xla) computes the whole [T, T] and drops the rest."""
  window = min(seq_len, bert_config.local_attention + 1)
  return sum(seq_len if bert_config.is_global(i) else window
             for i in range(bert_config.num_hidden_layers))


def step_flops(bert_config: Any, params: Any, *, sequences: int, seq_len: int,
               predictions: float) -> float:
  """Model FLOPs of one step of `sequences` x `seq_len` tokens making `predictions` MLM predictions.

  The one definition used by the trainer's MFU, --dry_run, bert_jax.pretrain.cost's table
  and the ablation report. Padding tokens count (the hardware computes them);
  `predictions` are the real predictions (batch_log's count), or for an estimate
  before training the static slots (sequences x P, an upper bound).
  """
  return _step_flops(flop_weights(bert_config, params, seq_len), sequences, seq_len,
                     predictions)


def _step_flops(weights: dict[str, float], sequences: int, seq_len: int,
                predictions: float) -> float:
  """step_flops from flop_weights already computed for `seq_len` (a walk of the params)."""
  return (sequences * (seq_len * weights["token"] + weights["sequence"])
          + float(predictions) * weights["prediction"])


def executed_flops(config: ml_collections.ConfigDict, bert_config: Any, params: Any,
                   predictions: dict[int, float]) -> list[float]:
  """Cumulative model FLOPs after each step (index 0: step 0) of a run that has run.

  step_flops of every step 1..max(predictions), `predictions[step]` its real MLM
  predictions over all processes (batch_log's count; 0 when absent) and the
  sequence length of the phase the step belongs to.
  """
  weights, out = {}, [0.0]
  run_phases = phases_lib.of(config)
  for step in range(1, max(predictions, default=0) + 1):
    phase = phases_lib.at(run_phases, step - 1)
    seq_len = phase.data.max_seq_length
    if seq_len not in weights:  # one walk of the params per phase, not per step
      weights[seq_len] = flop_weights(bert_config, params, seq_len)
    out.append(out[-1] + _step_flops(weights[seq_len], phase.batch_size, seq_len,
                                     predictions.get(step, 0)))
  return out


def run_flops(config: ml_collections.ConfigDict, bert_config: Any, abstract_params: Any
              ) -> list[dict[str, Any]]:
  """phases.shapes() with each phase's model FLOPs per step and in all (each at its batch
  size).

  An estimate before training: every prediction slot P counts as a prediction
  (batch_log's real predictions give the executed figure, step_flops).
  """
  out = []
  for p in phases_lib.shapes(config):
    per_step = step_flops(bert_config, abstract_params, sequences=p["batch_size"],
                          seq_len=p["seq_len"], predictions=p["batch_size"] * p["predictions"])
    out.append({**p, "flops_per_step": per_step, "flops": per_step * p["steps"]})
  return out


def hours(total_flops: float, device_kind: str, num_devices: int, mfu: float,
          peak_tflops_per_device: float = 0.0) -> float | None:
  """Wall-clock hours at `mfu` of the devices' peak (None when the peak is unknown)."""
  tflops = peak_tflops_per_device or accelerators.PEAK_TFLOPS.get(device_kind)
  if not tflops:
    return None
  return total_flops / (mfu * tflops * 1e12 * num_devices) / 3600.0


def describe(flops: list[dict[str, Any]], device_kind: str, num_devices: int, mfu: float,
             peak_tflops_per_device: float = 0.0) -> str:
  """One line: the run's FLOPs by phase and its expected time on these devices."""
  total = sum(p["flops"] for p in flops)
  by_phase = ", ".join(f"phase {p['phase']} {p['steps']:,} steps x {p['flops_per_step']:.3g}"
                       for p in flops)
  line = f"model FLOPs {total:.3g} ({by_phase})"
  h = hours(total, device_kind, num_devices, mfu, peak_tflops_per_device)
  if h is None:
    return (line + f"; no peak known for {num_devices} x {device_kind!r} "
            "(--config.peak_tflops_per_device gives one)")
  return line + (f"; at {mfu:.0%} MFU on {num_devices} x {device_kind}: "
                 f"{_duration(h)} ({h * num_devices:,.0f} device-hours)")


def _duration(h: float) -> str:
  if h < 1:
    return f"{h * 60:.0f} min"
  if h < 48:
    return f"{h:.1f} h"
  return f"{h / 24:.1f} days"


def abstract_model(config: ml_collections.ConfigDict, vocab_size: int):
  """(BertConfig, abstract params) of a pretraining config without reading any data."""
  from bert_jax.model import encoder as model_lib  # pylint: disable=g-import-not-at-top
  overrides = dict(config.model.to_dict(), vocab_size=config.model.vocab_size or vocab_size)
  overrides.pop("vocab_multiple", None)
  bert_config = model_lib.BertConfig.from_size(config.model_size, **overrides)
  return bert_config, abstract_params(bert_config, nsp_head=config.data.objective in specs.PAIR_OBJECTIVES)


def abstract_params(bert_config: Any, *, nsp_head: bool) -> Any:
  """The pretraining model's parameter shapes (nothing allocated)."""
  # pylint: disable=g-import-not-at-top  # the model only when FLOPs are asked for
  import flax.linen as nn
  from bert_jax.model import heads
  module = heads.BertForPreTraining(bert_config, nsp_head=nsp_head)
  ids = jax.ShapeDtypeStruct((1, 8), np.int32)
  shapes = jax.eval_shape(lambda i: module.init(jax.random.key(0), i, i, i, i[:, :2]), ids)
  return nn.unbox(shapes["params"])


def main(argv):
  """CLI: the table of the module docstring."""
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  config = flags.FLAGS.config
  bert_config, params = abstract_model(config, flags.FLAGS.vocab_size)
  flops = run_flops(config, bert_config, params)
  total = sum(p["flops"] for p in flops)
  print(f"{config.get('variant', '')}: L={bert_config.num_hidden_layers} "
        f"H={bert_config.hidden_size}, batch {config.batch_size}")
  for p in flops:
    print(f"  phase {p['phase']}: {p['steps']:,} steps at length {p['seq_len']}, batch "
          f"{p['batch_size']} ({p['predictions']} predictions): {p['flops_per_step']:.3g} FLOPs/step, "
          f"{p['flops']:.3g} in all")
  print(f"  total {total:.3g} model FLOPs; at {flags.FLAGS.mfu:.0%} MFU:")
  for name in flags.FLAGS.on:
    kind, n = device_set(name)
    h = hours(total, kind, n, flags.FLAGS.mfu)
    print(f"    {name:>14} ({n} x {kind}, {accelerators.PEAK_TFLOPS[kind]:g} TFLOP/s each): "
          f"{_duration(h)}, {h * n:,.0f} device-hours")


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "Pretraining config file[:variant].")
  flags.DEFINE_list("on", ["v4-32", "v5litepod-8", "8xH200"], "Device sets to estimate for.")
  flags.DEFINE_float("mfu", 0.4, "Assumed model FLOPs utilisation.")
  flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size when the config derives it "
                       "from data (model.vocab_size 0).")
  flags.mark_flags_as_required(["config"])
  app.run(main)
