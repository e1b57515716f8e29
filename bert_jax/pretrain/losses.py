"""Pretraining losses and metrics as pure functions of logits and batch features.

Kept apart from the network (bert_jax/model/encoder.py, bert_jax/model/heads.py) so objectives can
change without touching modules. Everything is computed in float32. Feature names
follow google-research/bert: masked_lm_ids, masked_lm_weights (1.0 real prediction,
0.0 padding), next_sentence_labels.

Each objective is written once, as sums that add up over micro-batches and eval
batches (masked_lm_sums, nsp_sums; pretraining_sums holds both). Every mean is
derived from those sums by one division (_mean): pretraining_objective (the loss
the trainer optimises), pretraining_metrics, and the per-objective means
(masked_lm_loss, nsp_loss, ...) for heads used on their own and for tests.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax


def _mean(total: jax.Array, count: jax.Array) -> jax.Array:
  """total / count, and 0 for an empty count (an all-padding batch).

  Counts are whole numbers of predictions or examples (masked_lm_weights are 1.0
  or 0.0), so a floor of 1 changes nothing but 0/0; max() rather than a where()
  keeps both branches finite, so gradients stay finite too.
  """
  return total / jnp.maximum(count, 1.0)


def masked_lm_sums(logits: jax.Array, ids: jax.Array, weights: jax.Array
                   ) -> dict[str, jax.Array]:
  """The MLM objective of one batch as sums, which add up across batches.

  Args:
    logits: [B,P,V] MLM logits at the masked positions.
    ids: [B,P] int target token ids (masked_lm_ids).
    weights: [B,P] masked_lm_weights; padding predictions have weight 0.

  Returns:
    mlm_loss     sum over real predictions of the cross-entropy
    mlm_correct  number of real predictions whose argmax is the target
    predictions  number of real predictions (sum of weights)
  """
  logits = logits.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, ids)
  correct = (jnp.argmax(logits, axis=-1) == ids).astype(jnp.float32)
  return {"mlm_loss": (xent * weights).sum(), "mlm_correct": (correct * weights).sum(),
          "predictions": weights.sum()}


def nsp_sums(logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
  """The NSP/SOP objective of one batch as sums: nsp_loss, nsp_correct, examples.

  Args:
    logits: [B,2] NSP/SOP logits.
    labels: [B] or google-research's [B,1] int next_sentence_labels
      (0 = IsNext / in order, 1 = random / swapped).
  """
  logits = logits.astype(jnp.float32)
  labels = labels.reshape(-1)
  return {"nsp_loss": optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum(),
          "nsp_correct": (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32).sum(),
          "examples": jnp.asarray(labels.shape[0], jnp.float32)}


def masked_lm_loss(logits: jax.Array, ids: jax.Array, weights: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
  """Weighted mean cross-entropy of the masked predictions (masked_lm_sums' args).

  Returns:
    (loss scalar, number of predictions = sum of weights).
  """
  sums = masked_lm_sums(logits, ids, weights)
  return _mean(sums["mlm_loss"], sums["predictions"]), sums["predictions"]


def masked_lm_accuracy(logits: jax.Array, ids: jax.Array, weights: jax.Array) -> jax.Array:
  """Weighted fraction of masked predictions whose argmax is the target id."""
  sums = masked_lm_sums(logits, ids, weights)
  return _mean(sums["mlm_correct"], sums["predictions"])


def nsp_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean cross-entropy of the 2-way next-sentence (or sentence-order) prediction."""
  sums = nsp_sums(logits, labels)
  return _mean(sums["nsp_loss"], sums["examples"])


def nsp_accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Fraction of examples whose NSP/SOP argmax equals the label."""
  sums = nsp_sums(logits, labels)
  return _mean(sums["nsp_correct"], sums["examples"])


def pretraining_sums(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
                     ) -> dict[str, jax.Array]:
  """The pretraining objective of one (micro-)batch as sums, which add up across batches.

  Training (one global batch in micro-batches) and evaluation (many batches)
  both reduce these, so the objective is written once: masked_lm_sums' keys and,
  when the model predicts NSP/SOP (outputs has "nsp_logits"), nsp_sums' keys.
  """
  sums = masked_lm_sums(outputs["mlm_logits"], batch["masked_lm_ids"],
                        batch["masked_lm_weights"])
  if "nsp_logits" in outputs:
    sums.update(nsp_sums(outputs["nsp_logits"], batch["next_sentence_labels"]))
  return sums


def pretraining_objective(sums: Mapping[str, jax.Array], predictions: jax.Array,
                          examples: jax.Array) -> jax.Array:
  """BERT's loss from sums: MLM cross-entropy averaged over `predictions` plus NSP/SOP
  cross-entropy averaged over `examples` (the whole batch's counts, so the objectives
  of micro-batches add up to the full batch's exactly)."""
  loss = _mean(sums["mlm_loss"], predictions)
  if "nsp_loss" in sums:
    loss = loss + _mean(sums["nsp_loss"], examples)
  return loss


def pretraining_metrics(sums: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Means from sums: mlm_loss, mlm_accuracy (per prediction), nsp_loss, nsp_accuracy."""
  metrics = {"mlm_loss": _mean(sums["mlm_loss"], sums["predictions"]),
             "mlm_accuracy": _mean(sums["mlm_correct"], sums["predictions"])}
  if "nsp_loss" in sums:
    metrics["nsp_loss"] = _mean(sums["nsp_loss"], sums["examples"])
    metrics["nsp_accuracy"] = _mean(sums["nsp_correct"], sums["examples"])
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
