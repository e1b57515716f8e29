"""Pretraining losses and metrics as pure functions of logits and batch features.

Kept apart from the network (bert_jax/model.py, bert_jax/heads.py) so objectives can
change without touching modules. Everything is computed in float32. Feature names
follow google-research/bert: masked_lm_ids, masked_lm_weights (1.0 real prediction,
0.0 padding), next_sentence_labels.

The objective the trainer optimises and evaluates is pretraining_sums (additive
over micro-batches and eval batches) turned into a loss by pretraining_objective
and into metrics by pretraining_metrics; the per-objective functions above it
(masked_lm_loss, nsp_loss, ...) are the same cross-entropies as means, for heads
used on their own and for tests.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax


def _weighted_mean(values: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(sum(w * v) / sum(w), sum(w)); 0 when every weight is 0 (an all-padding batch)."""
  weights = weights.astype(jnp.float32)
  total = weights.sum()
  # max() rather than a where(): no 0/0 in either branch, so gradients stay finite.
  return (values * weights).sum() / jnp.maximum(total, 1e-8), total


def masked_lm_loss(logits: jax.Array, ids: jax.Array, weights: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """Weighted mean cross-entropy of the masked predictions.

  Args:
    logits: [B,P,V] MLM logits at the masked positions.
    ids: [B,P] int target token ids (masked_lm_ids).
    weights: [B,P] masked_lm_weights; padding predictions have weight 0.

  Returns:
    (loss scalar, number of predictions = sum of weights).
  """
  xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), ids)
  return _weighted_mean(xent, weights)


def masked_lm_accuracy(logits: jax.Array, ids: jax.Array, weights: jax.Array) -> jax.Array:
  """Weighted fraction of masked predictions whose argmax is the target id."""
  correct = (jnp.argmax(logits, axis=-1) == ids).astype(jnp.float32)
  return _weighted_mean(correct, weights)[0]


def nsp_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean cross-entropy of the 2-way next-sentence (or sentence-order) prediction.

  Args:
    logits: [B,2] NSP/SOP logits.
    labels: [B] int next_sentence_labels (0 = IsNext / in order, 1 = random / swapped).
  """
  return optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels).mean()


def nsp_accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Fraction of examples whose NSP/SOP argmax equals the label."""
  return (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32).mean()


def pretraining_sums(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
                     ) -> dict[str, jax.Array]:
  """The pretraining objective of one (micro-)batch as sums, which add up across batches.

  Training (one global batch in micro-batches) and evaluation (many batches)
  both reduce these, so the objective is written once:
    mlm_loss     sum over real predictions of the MLM cross-entropy
    mlm_correct  number of real predictions whose argmax is the target
    predictions  number of real predictions (sum of masked_lm_weights)
  and, when the model predicts NSP/SOP (outputs has "nsp_logits"):
    nsp_loss, nsp_correct, examples   the same over the batch's examples.
  """
  logits = outputs["mlm_logits"].astype(jnp.float32)
  ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"].astype(jnp.float32)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
  correct = (jnp.argmax(logits, axis=-1) == ids).astype(jnp.float32)
  sums = {"mlm_loss": (xent * weights).sum(), "mlm_correct": (correct * weights).sum(),
          "predictions": weights.sum()}
  if "nsp_logits" in outputs:
    nsp_logits = outputs["nsp_logits"].astype(jnp.float32)
    labels = batch["next_sentence_labels"].reshape(-1)  # [B] or google-research's [B,1]
    sums["nsp_loss"] = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels).sum()
    sums["nsp_correct"] = (jnp.argmax(nsp_logits, axis=-1) == labels).astype(jnp.float32).sum()
    sums["examples"] = jnp.asarray(labels.shape[0], jnp.float32)
  return sums


def pretraining_objective(sums: Mapping[str, jax.Array], predictions: jax.Array,
                          examples: jax.Array) -> jax.Array:
  """BERT's loss from sums: MLM cross-entropy averaged over `predictions` plus NSP/SOP
  cross-entropy averaged over `examples` (the whole batch's counts, so the objectives
  of micro-batches add up to the full batch's exactly)."""
  loss = sums["mlm_loss"] / jnp.maximum(predictions, 1.0)
  if "nsp_loss" in sums:
    loss = loss + sums["nsp_loss"] / jnp.maximum(examples, 1.0)
  return loss


def pretraining_metrics(sums: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Means from sums: mlm_loss, mlm_accuracy (per prediction), nsp_loss, nsp_accuracy."""
  predictions = jnp.maximum(sums["predictions"], 1.0)
  metrics = {"mlm_loss": sums["mlm_loss"] / predictions,
             "mlm_accuracy": sums["mlm_correct"] / predictions}
  if "nsp_loss" in sums:
    examples = jnp.maximum(sums["examples"], 1.0)
    metrics["nsp_loss"] = sums["nsp_loss"] / examples
    metrics["nsp_accuracy"] = sums["nsp_correct"] / examples
  return metrics


def pretraining_loss(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
                     ) -> tuple[jax.Array, dict]:
  """BERT's pretraining loss of one batch, normalised by its own counts: (loss, metrics).

  The same sums as the trainers reduce (pretraining_sums); for a whole batch
  this is MLM cross-entropy per prediction plus NSP cross-entropy per example.
  """
  sums = pretraining_sums(outputs, batch)
  loss = pretraining_objective(sums, sums["predictions"], sums.get("examples", 1.0))
  return loss, {**pretraining_metrics(sums), "num_predictions": sums["predictions"],
                "loss": loss}
