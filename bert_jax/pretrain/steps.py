"""The pretraining step, built from the config in one place: what the trainer runs and the
preflight compiles.

  check_config  everything about a config judged without data, on a mesh (run once)
  network       the run's BertConfig, once its vocabulary is known
  build         the model, optimizer, shardings and jitted train/eval steps (Programs)
  keys          the run's init and dropout keys
  train_step    one optimizer update (pure); eval_step, the held-out sums (pure)

bert_jax.pretrain.trainer, bert_jax.preflight and the benchmarks all call `build`, so a
keyword of train_step (and any other part of the program) is set here alone:
preflight compiles exactly what the trainer runs (tests/test_pretrain_steps.py lowers
both and compares). TensorFlow-free (the input pipeline lives elsewhere), so the
preflight and accelerator images with only jax/flax/optax run the real step.
"""

import dataclasses
import functools
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax.model import attention
from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.pretrain import losses
from bert_jax.pretrain import phases as phases_lib
from bert_jax.training import optim
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from data_pipeline import specs
from host import fields
from host import paths

TrainState = state_lib.TrainState


# The domain of each top-level pretraining field this module reads, declared once as data
# (host/fields.py) and checked first: everything after divides by these or counts with them.
# A field's domain is a row here; what depends on the mesh, the phases or another field is
# code in check_config.
RULES = {
    "total_steps": fields.greater_than(0),
    "grad_accum_steps": fields.at_least(1),
    "batch_size": fields.greater_than(0),
    "eval_batch_size": fields.greater_than(0),
    "log_every_steps": fields.greater_than(0),
    "eval_every_steps": fields.greater_than(0),
    "checkpoint.every_steps": fields.greater_than(0),
    "checkpoint.keep": fields.at_least(1),
}


def check_config(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
  """Refuses, before any data is read or anything compiles, a config that cannot run on
  `mesh`: every field's domain (RULES), every phase's data and masks, the network
  (whatever the vocabulary turns out to be) against each phase's length and attention
  kernel."""
  fields.check(config, RULES, prefix="config.")
  dp = sharding.data_parallel_size(mesh)
  per_update = dp * config.grad_accum_steps
  phases_lib.check(config)  # the phase list (or phase2) and the batch warmup
  for phase in phases_lib.of(config):
    where = ("config.batch_size" if phase.batch_size == config.batch_size
             else f"phase {phase.index}'s batch size")
    if phase.batch_size <= 0:
      raise ValueError(f"{where}={phase.batch_size} must be positive")
    if phase.batch_size % per_update:
      raise ValueError(
          f"{where}={phase.batch_size} is not divisible by the data-parallel size "
          f"(mesh data*fsdp={dp}) x config.grad_accum_steps={config.grad_accum_steps}")
    if phase.batch_size % jax.process_count():
      raise ValueError(f"{where}={phase.batch_size} does not divide evenly over "
                       f"{jax.process_count()} processes")
  if config.eval_batch_size % jax.process_count():
    raise ValueError(f"config.eval_batch_size must divide evenly over "
                     f"{jax.process_count()} processes")
  if config.eval_batch_size % dp:
    raise ValueError(f"config.eval_batch_size={config.eval_batch_size} is not divisible by "
                     f"the data-parallel size {dp}")
  if config.data.eval.num_examples < config.eval_batch_size:
    raise ValueError(f"config.data.eval.num_examples={config.data.eval.num_examples} is smaller "
                     f"than one eval batch (config.eval_batch_size={config.eval_batch_size})")
  bert_config = network(config, vocab_size=None)
  # Every phase's data, masks and eval set, so phase 2 cannot fail at 90% of the run.
  for phase in phases_lib.of(config):
    where = f"phase {phase.index} (from step {phase.start})"
    length = phase.data.max_seq_length
    if length > bert_config.max_position_embeddings:
      raise ValueError(
          f"max_seq_length={length} in {where} exceeds the model's "
          f"max_position_embeddings={bert_config.max_position_embeddings}")
    attention.check_training(bert_config, length)  # a kernel this device lacks, say
    bert_config.replace(**phase.network)  # a phase's RoPE thetas, validated
    try:
      specs.check_data_config(phase.data)
    except ValueError as e:
      hint = (" (phase 2 takes it from config.phase2.max_predictions_per_seq)"
              if phase.index == 2 and "max_predictions" in str(e) else "")
      raise ValueError(f"{where}: {e}{hint}") from None
  optimizer(config)  # its fields, and a schedule that fits the run
  if config.optimizer.warmup_steps > config.total_steps:
    logging.warning("config.optimizer.warmup_steps=%d is longer than the run (total_steps=%d): "
                    "the learning rate never reaches its peak %g", config.optimizer.warmup_steps,
                    config.total_steps, config.optimizer.learning_rate)
  state_lib.check_rng_impl(config.rng_impl)
  if config.init_checkpoint and not paths.exists(config.init_checkpoint):
    raise ValueError(f"config.init_checkpoint={config.init_checkpoint!r} does not exist")


def network(config: ml_collections.ConfigDict, vocab_size: int | None) -> model_lib.BertConfig:
  """The run's BertConfig: the size-table row plus config.model overrides.

  config.model.vocab_size 0 takes `vocab_size` (the pipeline's vocabulary,
  PretrainingData.vocab_size); an explicit one must be at least that. It stays
  the true vocabulary (what HF/TF exports hold): config.model.vocab_multiple
  pads the word table and MLM logits beyond it. `vocab_size` None: before the
  vocabulary is known (every other field is the run's; its vocab_size is not).
  """
  overrides = config.model.to_dict()
  if vocab_size is None:
    overrides["vocab_size"] = overrides["vocab_size"] or 1
  elif not overrides["vocab_size"]:
    overrides["vocab_size"] = vocab_size
  elif overrides["vocab_size"] < vocab_size:
    raise ValueError(f"config.model.vocab_size={overrides['vocab_size']} is smaller than the "
                     f"pipeline's vocabulary ({vocab_size} entries)")
  return model_lib.BertConfig.from_size(config.model_size, **overrides)


def optimizer(config: ml_collections.ConfigDict, total_steps: int | None = None):
  """(optax optimizer, learning-rate schedule) of the run (of `total_steps` when given: the
  schedule a run of that length had), with its phases' segments for schedule "phases"."""
  total = config.total_steps if total_steps is None else total_steps
  segments = None
  if config.optimizer.schedule == "phases":
    config = config.copy_and_resolve_references()
    config.total_steps = total
    segments = phases_lib.lr_segments(config)
  return optim.make_optimizer(config.optimizer, total, segments)


def phase_network(bert_config: model_lib.BertConfig, phase: phases_lib.Phase
                  ) -> model_lib.BertConfig:
  """The network a phase trains: the run's with the phase's RoPE thetas (same parameters)."""
  return bert_config.replace(**phase.network) if phase.network else bert_config


def keys(config: ml_collections.ConfigDict) -> tuple[jax.Array, jax.Array]:
  """(init key, dropout key in config.rng_impl's generator) of the run's seed."""
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  return init_rng, state_lib.dropout_key(dropout_rng, config.rng_impl)


@dataclasses.dataclass
class Programs:
  """What a pretraining run trains with, made from its config by `build`."""
  model: heads.BertForPreTraining
  tx: optax.GradientTransformation
  lr_schedule: Any
  rules: list[tuple[str, Any]]      # logical axis rules: trace the steps under sharding.activate
  layout: state_lib.StateLayout
  train_step: Any   # jitted train_step: (state, batch, rng) -> (state, metrics), state donated
  eval_step: Any    # jitted eval_step: (params, batch) -> the objective's sums

  def abstract_state(self) -> TrainState:
    """The state's shapes and shardings (nothing allocated), to lower the train step on."""
    return TrainState(step=self.layout.abstract["step"], apply_fn=self.model.apply,
                      params=self.layout.abstract["params"], tx=self.tx,
                      opt_state=self.layout.abstract["opt_state"])


def build(config: ml_collections.ConfigDict, bert_config: model_lib.BertConfig,
          mesh: jax.sharding.Mesh, *, seq_len: int, predictions: int) -> Programs:
  """The model, optimizer, shardings and jitted steps of `config` on `mesh`.

  `seq_len` and `predictions`: the shapes the parameters are first traced at (any
  phase's: the parameters do not depend on them). The steps trace, and so must be
  called or lowered, under sharding.activate(mesh, programs.rules).
  """
  model = heads.BertForPreTraining(bert_config, nsp_head=config.data.objective in specs.PAIR_OBJECTIVES)
  tx, lr_schedule = optimizer(config)
  rules = state_lib.axis_rules(config)

  def init_params(rng):
    ids = jnp.zeros((1, seq_len), jnp.int32)
    return model.init({"params": rng}, ids, ids, ids, jnp.zeros((1, predictions), jnp.int32),
                      deterministic=True)["params"]

  layout = state_lib.make_layout(model, init_params, tx, mesh, rules, jax.random.PRNGKey(0))
  train, evaluate = state_lib.jit_steps(
      layout, functools.partial(train_step, grad_accum_steps=config.grad_accum_steps,
                                skip_nonfinite=config.skip_nonfinite_steps),
      functools.partial(eval_step, apply_fn=model.apply))
  return Programs(model=model, tx=tx, lr_schedule=lr_schedule, rules=rules, layout=layout,
                  train_step=train, eval_step=evaluate)


def abstract_batch(batch: int, seq_len: int, predictions: int,
                   batch_sharding: jax.sharding.NamedSharding, packed: bool = False
                   ) -> dict[str, jax.ShapeDtypeStruct]:
  """The pretraining batch's shapes and dtypes (as data_pipeline.examples.pretraining feeds
  them; `packed`: with objective "documents"'s document and position ids)."""
  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
  extra = {name: spec((batch, seq_len), jnp.int32) for name in PACKING_FEATURES} if packed else {}
  return extra | {
      "input_ids": spec((batch, seq_len), jnp.int32),
      "input_mask": spec((batch, seq_len), jnp.int32),
      "segment_ids": spec((batch, seq_len), jnp.int32),
      "masked_lm_positions": spec((batch, predictions), jnp.int32),
      "masked_lm_ids": spec((batch, predictions), jnp.int32),
      "masked_lm_weights": spec((batch, predictions), jnp.float32),
      "next_sentence_labels": spec((batch,), jnp.int32),
  }


def train_step(state: TrainState, batch: dict[str, jax.Array], rng: jax.Array, *,
               grad_accum_steps: int, skip_nonfinite: bool) -> tuple[TrainState, dict[str, Any]]:
  """One optimizer update on the global `batch`, optionally in micro-batches.

  The loss is MLM cross-entropy averaged over all masked predictions of the
  batch plus NSP/SOP cross-entropy averaged over its examples. Each
  micro-batch's sums are divided by the whole batch's counts, so the summed
  gradients equal the full-batch gradient exactly, whatever the number of
  predictions per micro-batch.
  """
  step_rng = jax.random.fold_in(rng, state.step)
  predictions = batch["masked_lm_weights"].sum()
  examples = batch["input_ids"].shape[0]

  def loss_fn(params, micro, micro_rng):
    out = state.apply_fn({"params": params}, micro["input_ids"], micro["input_mask"],
                         micro["segment_ids"], micro["masked_lm_positions"],
                         deterministic=False, rngs={"dropout": micro_rng}, **packing(micro))
    sums = losses.pretraining_sums(out, micro)
    return losses.pretraining_objective(sums, predictions, examples), sums

  (loss, sums), grads = state_lib.accumulated_grads(loss_fn, state.params, batch, step_rng,
                                                    grad_accum_steps)
  new_state, grad_norm, finite = state_lib.apply_update(state, grads, loss, skip_nonfinite)
  return new_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite,
                     **losses.pretraining_metrics(sums)}


def eval_step(params: Any, batch: dict[str, jax.Array], *, apply_fn: Any) -> dict[str, jax.Array]:
  """The objective's sums on one held-out batch (the caller adds them over batches)."""
  out = apply_fn({"params": params}, batch["input_ids"], batch["input_mask"],
                 batch["segment_ids"], batch["masked_lm_positions"], deterministic=True,
                 **packing(batch))
  return losses.pretraining_sums(out, batch)


# A packed batch's features (objective "documents", data_pipeline.examples.documents) and
# the model's arguments they are.
PACKING_FEATURES = {"position_ids": "positions", "document_ids": "documents"}


def packing(batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """{"positions", "documents"} of a packed batch; {} otherwise."""
  return {arg: batch[name] for name, arg in PACKING_FEATURES.items() if name in batch}
