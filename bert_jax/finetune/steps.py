"""The fine-tuning steps and what a sweep's runs share to run them: compiled once per shape.

train_step and eval_step are the pure step functions. build() makes, once per
sweep (cached in Prepared.programs by everything but the rate and the seed),
the optimizer, the state's shardings and the jitted steps; with_learning_rate
puts a run's rate into its optimizer state; predict() runs eval_step over
length-bucketed batches (buckets.eval_batches) and puts every output back at
its row.
"""

import copy
import dataclasses
import functools
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax.finetune.features import buckets as buckets_lib
from bert_jax.finetune.features import packed as packed_lib
from bert_jax.finetune.kinds import task_kind
from bert_jax.run import workdir as workdir_lib
from bert_jax.training import optim
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from host import paths

TrainState = state_lib.TrainState
# Under $BERT_JAX_CACHE (else ~/.cache/bert_jax), as data_pipeline/sources/embedded.py keeps
# the embedded corpus.
COMPILATION_CACHE = "jax_compilation_cache"


def use_compilation_cache() -> str | None:
  """Keeps compiled programs on disk, so another process's sweep compiles nothing it has.

  A sweep from each of an ablation's checkpoints runs the same programs (the
  weights are arguments): with JAX's persistent compilation cache the second
  and later processes load them instead of compiling (minutes on CPU). The
  directory is jax_compilation_cache_dir if set (JAX_COMPILATION_CACHE_DIR),
  else $BERT_JAX_CACHE/jax_compilation_cache, else
  ~/.cache/bert_jax/jax_compilation_cache; JAX_ENABLE_COMPILATION_CACHE=false
  turns it off. Only programs that took jax_persistent_cache_min_compile_time_secs
  (1 s) to compile are kept. Must run before this process's first compile: JAX
  decides once whether a process uses the cache. Returns the directory (None: off).
  """
  if not jax.config.jax_enable_compilation_cache:
    return None
  if not jax.config.jax_compilation_cache_dir:
    root = os.environ.get("BERT_JAX_CACHE") or os.path.expanduser("~/.cache/bert_jax")
    jax.config.update("jax_compilation_cache_dir", paths.join(root, COMPILATION_CACHE))
  return jax.config.jax_compilation_cache_dir


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *, task: Any,
               grad_accum_steps: int, skip_nonfinite: bool,
               fixed_weight: float | None = None) -> tuple[TrainState, dict]:
  """One update on the global batch: the task loss summed over the batch, divided by the
  batch's weight (its rows or labelled tokens), or by `fixed_weight` when given."""
  step_rng = jax.random.fold_in(rng, state.step)
  # The normaliser is the whole batch's weight, so micro-batch losses add up exactly.
  total_weight = (jnp.maximum(task.loss_weight(batch), 1.0) if fixed_weight is None
                  else jnp.float32(fixed_weight))

  def loss_fn(params, micro, micro_rng):
    out = state.apply_fn({"params": params}, *(micro[k] for k in task_kind.INPUTS),
                         deterministic=False, rngs={"dropout": micro_rng}, **packing(micro))
    loss_sum, weight = task.loss(out, micro)
    return loss_sum / total_weight, {"loss_sum": loss_sum, "weight": weight}

  (loss, sums), grads = state_lib.accumulated_grads(loss_fn, state.params, batch, step_rng,
                                                    grad_accum_steps)
  new_state, grad_norm, finite = state_lib.apply_update(state, grads, loss, skip_nonfinite)
  return new_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite}


def eval_step(params: Any, batch: dict[str, jax.Array], *, apply_fn: Any, task: Any) -> dict:
  """The task's kept outputs on one dev batch (deterministic)."""
  out = apply_fn({"params": params}, *(batch[k] for k in task_kind.INPUTS), deterministic=True,
                 **packing(batch))
  return task.outputs(out)


def packing(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The model's packing arguments of a packed batch (features/packed.py); {} otherwise."""
  return {arg: batch[name] for name, arg in packed_lib.PACKING.items() if name in batch}


@dataclasses.dataclass
class Programs:
  """What every (learning rate, seed) run of a sweep shares, so each shape compiles once."""
  tx: optax.GradientTransformation  # peak rate 1; the run's rate scales it from the state
  schedule: Any                     # of peak 1: a run's rate is learning_rate x schedule(step)
  layout: state_lib.StateLayout
  train_step: Any                   # jitted train_step: one program per bucket length
  eval_step: Any                    # jitted eval_step: one program per (batch, length)
  buckets: tuple[int, ...]          # the lengths batches are padded to
  packed: bool                      # config.padding "packed" (features/packed.py)
  sequence_outputs: tuple[str, ...]  # eval outputs with a length axis (padded back)
  train_lengths: set = dataclasses.field(default_factory=set)  # bucket lengths trained on
  train_rows: set = dataclasses.field(default_factory=set)     # packed row counts trained on
  eval_shapes: set = dataclasses.field(default_factory=set)    # (batch, length) evaluated

  def compiled(self) -> dict[str, int]:
    """Programs compiled so far by the jitted steps (their caches' sizes)."""
    return {"train": self.train_step._cache_size(),  # pylint: disable=protected-access
            "eval": self.eval_step._cache_size()}  # pylint: disable=protected-access


# Config fields that differ between the runs of one sweep without changing any program
# (the last two only order the train rows).
PER_RUN = ("seed", "seeds", "learning_rates", "optimizer.learning_rate",
            "optimizer.end_learning_rate", "optimizer.warmup_steps",
            "group_by_length", "bucket_window_batches")


def build(config: ml_collections.ConfigDict, task: task_kind.Task, cache: dict, mesh,
          rules, total_steps: int) -> Programs:
  """The optimizer, layout and jitted steps for `config`, built by a sweep's first run.

  The learning rate is not compiled in: the optimizer runs at peak 1 and ends in
  optax.inject_hyperparams(optax.scale), whose step size (a leaf of the optimizer
  state, set per run by with_learning_rate) is the run's rate; AdamW's and LAMB's
  updates are linear in the rate, so this is the same update. The seed reaches the
  steps as the dropout key argument and the init key. So the runs of a sweep differ
  only in arrays, and every shape compiles once for the whole sweep.
  """
  rate = config.optimizer.learning_rate
  end_ratio = config.optimizer.end_learning_rate / rate if rate else 0.0
  key = json.dumps({k: v for k, v in workdir_lib.flatten(config).items() if k not in PER_RUN},
                   sort_keys=True, default=str) + f"|{total_steps}|{end_ratio}"
  if key in cache:
    return cache[key]
  opt_config = copy.deepcopy(config.optimizer)
  with opt_config.unlocked():
    opt_config.warmup_steps = int(config.warmup_fraction * total_steps)
    optim.check_config(opt_config)  # the run's own values (e.g. the warning for rate 0)
    opt_config.learning_rate, opt_config.end_learning_rate = 1.0, end_ratio
  base, schedule = optim.make_optimizer(opt_config, total_steps)
  tx = optax.chain(base, optax.inject_hyperparams(optax.scale)(step_size=1.0))
  model = task.model

  def init_params(rng):
    ids = jnp.zeros((1, config.max_seq_length), jnp.int32)
    return model.init({"params": rng}, ids, ids, ids, deterministic=True)["params"]

  layout = state_lib.make_layout(model, init_params, tx, mesh, rules, jax.random.PRNGKey(0))
  evaluate = functools.partial(eval_step, apply_fn=model.apply, task=task)
  train, jitted_eval = state_lib.jit_steps(
      layout, functools.partial(train_step, task=task, grad_accum_steps=config.grad_accum_steps,
                                skip_nonfinite=config.skip_nonfinite_steps,
                                fixed_weight=fixed_loss_weight(config, task)), evaluate)

  def out_shapes(length):
    ids = jax.ShapeDtypeStruct((config.eval_batch_size, length), jnp.int32)
    return jax.eval_shape(evaluate, layout.abstract_params, {k: ids for k in task_kind.INPUTS})

  # Outputs whose shape follows the batch's length are padded back to max_seq_length.
  full, shorter = out_shapes(config.max_seq_length), out_shapes(config.max_seq_length - 1)
  programs = Programs(
      tx=tx, schedule=schedule, layout=layout, train_step=train, eval_step=jitted_eval,
      buckets=buckets_lib.bucket_lengths(config.max_seq_length, config.bucket_multiple,
                                         config.padding),
      packed=config.padding == "packed",
      sequence_outputs=tuple(k for k in full if full[k].shape != shorter[k].shape))
  cache[key] = programs
  return programs


def fixed_loss_weight(config: ml_collections.ConfigDict, task: task_kind.Task) -> float | None:
  """config.loss_normalizer "train_mean": every step's loss is divided by one number, the
  train set's mean weight per batch (batch_size x its labelled tokens per row for a token
  task, batch_size for classification), so each labelled token weighs the same in every
  batch; "batch" (None): by the batch's own weight."""
  if config.loss_normalizer == "batch":
    return None
  features = task.train.features
  total = float(np.asarray(task.loss_weight({k: features[k] for k in task.train_features})))
  return max(total / len(features["input_ids"]) * config.batch_size, 1.0)


def with_learning_rate(state: TrainState, learning_rate: float,
                        layout: state_lib.StateLayout) -> TrainState:
  """`state` with the run's learning rate in the optimizer's final scale (see build)."""
  base, injected = state.opt_state
  rate = jax.device_put(np.asarray(learning_rate, np.float32), layout.replicated)
  return state.replace(opt_state=(base, injected._replace(
      hyperparams={**injected.hyperparams, "step_size": rate})))


def _pad_value(v: np.ndarray):
  """What a padded position of a sequence output holds: PAD_LOGIT, or 0 for integers."""
  return buckets_lib.PAD_LOGIT if np.issubdtype(v.dtype, np.floating) else 0


def _blank_padding(v: np.ndarray, real: np.ndarray) -> np.ndarray:
  """Sequence outputs v [E,T,...] with _pad_value at every position `real` [E,T] is not."""
  return np.where(real.reshape(real.shape + (1,) * (v.ndim - 2)), v, v.dtype.type(_pad_value(v)))


def predict(programs: Programs, params, features: dict[str, np.ndarray], eval_batch_size: int,
             mesh) -> dict[str, np.ndarray]:
  """Outputs for every feature row, in order, from length-bucketed batches
  (buckets.eval_batches): each batch padded with empty rows to its size, its
  outputs put back at their rows, sequence outputs padded back to max_seq_length.

  A sequence output holds PAD_LOGIT (0 for integers) at every padded position of a
  row, whatever the bucket: so no padded position competes for one of SQuAD's n-best
  slots, and the outputs do not depend on the padding (with fixed padding a short
  window's padding logits, computed, took slots a bucket's never could).
  """
  max_len = programs.buckets[-1]
  unit = math.lcm(sharding.data_parallel_size(mesh), jax.process_count())
  per = jax.process_index()
  outputs = {}
  if programs.packed:
    return _predict_packed(programs, params, features, eval_batch_size, mesh)
  for b in buckets_lib.eval_batches(buckets_lib.row_lengths(features), programs.buckets,
                                    eval_batch_size, unit):
    batch = buckets_lib.cut(features, task_kind.INPUTS, b.rows, b.length, max_len)
    per_host = b.size // jax.process_count()
    batch = {k: np.concatenate([v, np.zeros((b.size - len(v),) + v.shape[1:], v.dtype)])
             [per * per_host:(per + 1) * per_host] for k, v in batch.items()}
    programs.eval_shapes.add((b.size, b.length))
    out = jax.device_get(programs.eval_step(params, sharding.global_batch(batch, mesh)))
    real = features["input_mask"][b.rows, :b.length].astype(bool)
    for k, v in out.items():
      v = v[:len(b.rows)]
      if k in programs.sequence_outputs:
        v = _blank_padding(v, real)
        v = np.concatenate([v, np.full((len(v), max_len - b.length) + v.shape[2:],
                                       _pad_value(v), v.dtype)], axis=1)
      if k not in outputs:
        outputs[k] = np.zeros((len(features["input_ids"]),) + v.shape[1:], v.dtype)
      outputs[k][b.rows] = v
  return outputs


def _predict_packed(programs: Programs, params, features: dict[str, np.ndarray],
                    eval_batch_size: int, mesh) -> dict[str, np.ndarray]:
  """predict() for config.padding "packed": batches of eval_batch_size examples in order
  (the last filled with empty ones), each packed into as few rows as hold it (each
  device's examples into rows of its own, each process filling its share: packed.py);
  the model reads every example's outputs back, whose padded positions get PAD_LOGIT (0
  for integers), as predict() gives them."""
  max_len = programs.buckets[-1]
  n = len(features["input_ids"])
  outputs = {}
  for start in range(0, n, eval_batch_size):
    rows = np.arange(start, min(start + eval_batch_size, n))
    examples = packed_lib.padded_examples(
        {k: features[k] for k in task_kind.INPUTS}, rows, eval_batch_size)
    batch = packed_lib.pack(examples, (), np.arange(eval_batch_size), max_len,
                            devices=sharding.data_parallel_size(mesh),
                            process_index=jax.process_index(),
                            process_count=jax.process_count())
    programs.eval_shapes.add((len(batch["input_ids"]) * jax.process_count(), max_len))
    out = jax.device_get(programs.eval_step(params, sharding.global_batch(batch, mesh)))
    real = features["input_mask"][rows].astype(bool)
    for k, v in out.items():
      v = v[:len(rows)]
      if k in programs.sequence_outputs:
        v = _blank_padding(v, real)
      if k not in outputs:
        outputs[k] = np.zeros((n,) + v.shape[1:], v.dtype)
      outputs[k][rows] = v
  return outputs
