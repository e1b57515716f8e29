"""Tests of bert_jax/pretrain/losses.py against cross-entropy and accuracy computed by hand in NumPy."""

import numpy as np
import pytest

from bert_jax.pretrain import losses


def _np_log_softmax(x):
  x = np.asarray(x, np.float64)
  shifted = x - x.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@pytest.fixture
def mlm_case():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 4, 11)).astype(np.float32) * 3
  ids = rng.integers(0, 11, size=(3, 4)).astype(np.int32)
  # Last predictions of rows 1 and 2 are padding (weight 0), as the pipeline pads them.
  weights = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], np.float32)
  return logits, ids, weights


def test_masked_lm_loss_matches_numpy(mlm_case):
  """Fails if the masked-LM loss differs from NumPy's weighted cross-entropy, or the prediction
  count is not the 7 weighted slots."""
  logits, ids, weights = mlm_case
  logp = _np_log_softmax(logits)
  xent = -np.take_along_axis(logp, ids[..., None], -1)[..., 0]
  expected = (xent * weights).sum() / weights.sum()
  loss, num = losses.masked_lm_loss(logits, ids, weights)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  assert float(num) == 7.0


def test_padding_predictions_do_not_count(mlm_case):
  """Fails if huge wrong logits or other ids at weight-0 slots change the masked-LM loss or
  accuracy."""
  logits, ids, weights = mlm_case
  garbage = logits.copy()
  garbage[weights == 0] = 1e3 * np.sign(garbage[weights == 0])  # huge, wrong logits
  ids2 = ids.copy()
  ids2[weights == 0] = 0
  a, _ = losses.masked_lm_loss(logits, ids, weights)
  b, _ = losses.masked_lm_loss(garbage, ids2, weights)
  np.testing.assert_allclose(a, b, rtol=1e-6)
  np.testing.assert_allclose(losses.masked_lm_accuracy(logits, ids, weights),
                             losses.masked_lm_accuracy(garbage, ids2, weights))


def test_all_padding_batch_gives_zero_not_nan(mlm_case):
  """Fails if a batch whose weights are all 0 gives a loss or count other than 0 (NaN included)."""
  logits, ids, _ = mlm_case
  loss, num = losses.masked_lm_loss(logits, ids, np.zeros(ids.shape, np.float32))
  assert float(loss) == 0.0 and float(num) == 0.0


def test_masked_lm_accuracy_matches_numpy(mlm_case):
  """Fails if masked-LM accuracy differs from NumPy's weighted argmax accuracy."""
  logits, ids, weights = mlm_case
  ids = ids.copy()
  ids[0, :2] = logits[0, :2].argmax(-1)  # make some predictions right
  correct = (logits.argmax(-1) == ids).astype(np.float64)
  expected = (correct * weights).sum() / weights.sum()
  np.testing.assert_allclose(losses.masked_lm_accuracy(logits, ids, weights), expected, rtol=1e-6)


def test_nsp_loss_and_accuracy_match_numpy():
  """Fails if the NSP loss differs from NumPy's mean cross-entropy, or its accuracy (ties to the
  first class) is not 0.5."""
  logits = np.array([[2.0, -1.0], [0.5, 0.7], [-3.0, 1.0], [0.0, 0.0]], np.float32)
  labels = np.array([0, 0, 1, 1], np.int32)
  logp = _np_log_softmax(logits)
  expected = -logp[np.arange(4), labels].mean()
  np.testing.assert_allclose(losses.nsp_loss(logits, labels), expected, rtol=1e-6)
  # argmax: 0, 1, 1, 0 (ties go to the first class) -> right on examples 0 and 2.
  np.testing.assert_allclose(losses.nsp_accuracy(logits, labels), 0.5)


def test_pretraining_loss_sums_mlm_and_nsp(mlm_case):
  """Fails if the pretraining loss is not MLM + NSP on [B, 1] labels, its metrics differ in value or
  keys, or without NSP logits it is not MLM alone with no NSP metric."""
  logits, ids, weights = mlm_case
  nsp_logits = np.array([[1.0, 0.0], [0.0, 2.0], [0.3, 0.1]], np.float32)
  labels = np.array([[0], [1], [1]], np.int32)  # google-research's [B,1] layout
  batch = {"masked_lm_ids": ids, "masked_lm_weights": weights, "next_sentence_labels": labels}
  logp = _np_log_softmax(logits)
  mlm = (-np.take_along_axis(logp, ids[..., None], -1)[..., 0] * weights).sum() / weights.sum()
  nsp = -_np_log_softmax(nsp_logits)[np.arange(3), labels[:, 0]].mean()
  loss, metrics = losses.pretraining_loss({"mlm_logits": logits, "nsp_logits": nsp_logits}, batch)
  np.testing.assert_allclose(loss, mlm + nsp, rtol=1e-5)
  np.testing.assert_allclose(metrics["nsp_loss"], nsp, rtol=1e-5)
  np.testing.assert_allclose(metrics["nsp_accuracy"], 2 / 3, rtol=1e-6)
  assert set(metrics) == {"loss", "mlm_loss", "mlm_accuracy", "num_predictions",
                          "nsp_loss", "nsp_accuracy"}
  # Without an NSP head (objective "none") the loss is MLM alone.
  loss_mlm, metrics = losses.pretraining_loss({"mlm_logits": logits}, batch)
  np.testing.assert_allclose(loss_mlm, mlm, rtol=1e-5)
  assert "nsp_loss" not in metrics


def test_means_are_the_sums_over_their_own_counts(mlm_case):
  """Each mean form is its sum form divided by the right count.

  The case's 12 prediction slots hold 7 real predictions over 3 examples, so a
  mean divided by slots (12), by examples (3) or by predictions where examples
  belong (7 for NSP) would fail here.
  """
  logits, ids, weights = mlm_case
  nsp_logits = np.array([[1.0, 0.0], [0.0, 2.0], [0.3, 0.1]], np.float32)
  labels = np.array([0, 1, 1], np.int32)
  mlm = losses.masked_lm_sums(logits, ids, weights)
  nsp = losses.nsp_sums(nsp_logits, labels)
  assert float(mlm["predictions"]) == 7.0 and float(nsp["examples"]) == 3.0
  loss, _ = losses.masked_lm_loss(logits, ids, weights)
  np.testing.assert_allclose(loss, mlm["mlm_loss"] / 7, rtol=1e-6)
  np.testing.assert_allclose(losses.masked_lm_accuracy(logits, ids, weights),
                             mlm["mlm_correct"] / 7, rtol=1e-6)
  np.testing.assert_allclose(losses.nsp_loss(nsp_logits, labels), nsp["nsp_loss"] / 3,
                             rtol=1e-6)
  np.testing.assert_allclose(losses.nsp_accuracy(nsp_logits, labels), nsp["nsp_correct"] / 3,
                             rtol=1e-6)
  metrics = losses.pretraining_metrics({**mlm, **nsp})
  np.testing.assert_allclose(metrics["mlm_loss"], mlm["mlm_loss"] / 7, rtol=1e-6)
  np.testing.assert_allclose(metrics["nsp_loss"], nsp["nsp_loss"] / 3, rtol=1e-6)
  # The objective divides by the counts it is given (the whole batch's), not its own.
  np.testing.assert_allclose(losses.pretraining_objective({**mlm, **nsp}, 14.0, 6.0),
                             mlm["mlm_loss"] / 14 + nsp["nsp_loss"] / 6, rtol=1e-6)
