"""The pretraining step and eval step: pure functions, jitted once by the trainer.

TensorFlow-free (the input pipeline lives elsewhere), so benchmarks and
accelerator images that have only jax/flax/optax run the real step. Both steps
reduce the same objective, bert_jax.pretrain.losses.pretraining_sums.
"""

from typing import Any

import jax

from bert_jax.pretrain import losses
from bert_jax.training import state as state_lib

TrainState = state_lib.TrainState


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
                         deterministic=False, rngs={"dropout": micro_rng})
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
                 batch["segment_ids"], batch["masked_lm_positions"], deterministic=True)
  return losses.pretraining_sums(out, batch)
