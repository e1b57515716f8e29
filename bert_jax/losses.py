"""Pretraining losses and metrics as pure functions of logits and batch features.

Kept apart from the network (bert_jax/model.py, bert_jax/heads.py) so objectives can
change without touching modules. Everything is computed in float32. Feature names
follow google-research/bert: masked_lm_ids, masked_lm_weights (1.0 real prediction,
0.0 padding), next_sentence_labels.
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


def pretraining_loss(outputs: Mapping[str, jax.Array], batch: Mapping[str, jax.Array]
                     ) -> tuple[jax.Array, dict]:
  """BERT's pretraining loss: MLM cross-entropy + NSP cross-entropy (when predicted).

  Args:
    outputs: BertForPreTraining's dict: "mlm_logits" [B,P,V], optional "nsp_logits" [B,2].
    batch: features masked_lm_ids, masked_lm_weights and (with nsp_logits)
      next_sentence_labels.

  Returns:
    (total loss, metrics): loss, mlm_loss, mlm_accuracy, num_predictions and, with an
    NSP head, nsp_loss and nsp_accuracy.
  """
  logits = outputs["mlm_logits"]
  ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
  mlm, num_predictions = masked_lm_loss(logits, ids, weights)
  metrics = {"mlm_loss": mlm, "mlm_accuracy": masked_lm_accuracy(logits, ids, weights),
             "num_predictions": num_predictions}
  loss = mlm
  if "nsp_logits" in outputs:
    labels = batch["next_sentence_labels"].reshape(-1)  # [B] or google-research's [B,1]
    metrics["nsp_loss"] = nsp_loss(outputs["nsp_logits"], labels)
    metrics["nsp_accuracy"] = nsp_accuracy(outputs["nsp_logits"], labels)
    loss = loss + metrics["nsp_loss"]
  metrics["loss"] = loss
  return loss, metrics
