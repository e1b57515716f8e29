"""Ratio schedules of data_pipeline/examples/masking.py (linear, cosine from `ratio` to `final_ratio`):
the ratio at every step, the predictions sized for the largest ratio, refusals naming the
field, and a per-example ratio masking as a constant spec at that ratio. The synthetic data
and the config helper are tests/test_masking.py's.
"""

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from data_pipeline.examples import masking
from data_pipeline.examples import masking_spec
from test_masking import DATA, LENGTH, MASK, SPECIALS, VOCAB, _config


def test_schedule_ratio_at_every_step():
  """Fails if linear, cosine or constant schedules give another ratio at any step than the formulas
  (clamped past the end), max_ratio or end_ratio is wrong, or total_steps 0 is accepted."""
  linear = masking_spec.bert_masking(ratio=0.4, schedule="linear", final_ratio=0.1)
  cosine = masking_spec.bert_masking(ratio=0.4, schedule="cosine", final_ratio=0.1)
  constant = masking_spec.bert_masking(ratio=0.3)
  assert [linear.ratio_at(s, 10) for s in (0, 10, 15)] == [0.4, 0.1, 0.1]
  assert [cosine.ratio_at(s, 10) for s in (0, 10, 15)] == [0.4, 0.1, 0.1]
  for step in range(11):
    progress = step / 10
    assert linear.ratio_at(step, 10) == pytest.approx(0.4 - 0.3 * progress, abs=1e-15)
    assert cosine.ratio_at(step, 10) == pytest.approx(
        0.1 + 0.15 * (1 + math.cos(math.pi * progress)), abs=1e-15)
    assert constant.ratio_at(step, 10) == 0.3
  # Halfway both are at the mean; a quarter in, cosine has moved less than linear.
  assert linear.ratio_at(5, 10) == pytest.approx(0.25) == cosine.ratio_at(5, 10)
  assert cosine.ratio_at(2, 8) > linear.ratio_at(2, 8)
  rising = masking_spec.bert_masking(ratio=0.15, schedule="linear", final_ratio=0.6)
  assert rising.ratio_at(100, 200) == pytest.approx(0.375)
  assert (rising.max_ratio, rising.end_ratio) == (0.6, 0.6)
  assert (linear.max_ratio, linear.end_ratio) == (0.4, 0.1)
  with pytest.raises(ValueError, match="total_steps"):
    linear.ratio_at(3, 0)


def test_schedule_sizes_predictions_for_its_largest_ratio():
  """Fails if a rising schedule sizes max_predictions for its first ratio rather than its largest,
  or an explicit cap too small for the largest is accepted."""
  rising = masking_spec.bert_masking(ratio=0.15, schedule="cosine", final_ratio=0.6)
  assert rising.max_predictions(128) == 77  # ceil(0.6 * 128), not 20
  assert masking_spec.bert_masking(ratio=0.6).max_predictions(128) == 77
  with pytest.raises(ValueError, match="max_predictions_per_seq=20 is too small"):
    masking_spec.bert_masking(ratio=0.15, schedule="linear", final_ratio=0.6,
                        max_predictions_per_seq=20).max_predictions(128)


@pytest.mark.parametrize("overrides,field", [
    (dict(schedule="step"), "schedule"),
    (dict(final_ratio=0.3), "final_ratio"),  # a final ratio without a schedule means nothing
    (dict(schedule="linear", final_ratio=0.0), "final_ratio"),
    (dict(schedule="cosine", final_ratio=1.0), "final_ratio"),
])
def test_invalid_schedule_names_the_field(overrides, field):
  """Fails if an unknown schedule, a final ratio without a schedule, or a final ratio of 0 or 1 is
  accepted, or refused without naming the field."""
  with pytest.raises(ValueError, match=field):
    masking_spec.MaskingSpec.from_config(_config(**overrides), 128)


def test_per_example_ratio_masks_as_a_constant_spec_at_that_ratio():
  """mask_tokens(ratio=r) under a schedule == mask_tokens of a constant spec at r."""
  subset = tuple(a[:40] for a in DATA)
  for kwargs in (dict(), dict(whole_word=True), dict(strategy="bernoulli"), dict(span=True)):
    scheduled = masking_spec.bert_masking(ratio=0.5, schedule="linear", final_ratio=0.1, **kwargs)
    p = scheduled.max_predictions(LENGTH)
    for ratio in (0.1, 0.37, 0.5):
      constant = dataclasses.replace(scheduled.at_ratio(ratio), max_predictions_per_seq=p)
      for n in (0, 13, 39):
        row = tuple(a[n] for a in subset)
        args = dict(mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, max_predictions=p)
        got = masking.mask_tokens(*row, masking.example_seed(5, 0, n), scheduled,
                                  ratio=tf.constant(ratio, tf.float64), **args)
        want = masking.mask_tokens(*row, masking.example_seed(5, 0, n), constant, **args)
        # The counts themselves are checked once, for the constant spec
        # (test_fixed_strategy_predicts_exactly_round_ratio_per_sequence).
        for key in want:
          np.testing.assert_array_equal(got[key].numpy(), want[key].numpy(), err_msg=key)


def test_piecewise_schedule_holds_each_ratio_from_its_start():
  """Fails if "piecewise" (mmBERT's 30% -> 15% -> 5% by phase) gives at any step another
  ratio than the piece in force, sizes its slots for other than its largest ratio, reports
  another end ratio or mean, or accepts pieces out of order, out of (0, 1), or without the
  schedule."""
  spec = masking_spec.bert_masking(ratio=0.3, schedule="piecewise",
                                   piecewise="0.767:0.15,0.967:0.05")
  ratios = [spec.ratio_at(s, 1000) for s in range(1000)]
  assert ratios[:767] == [0.3] * 767 and ratios[767:967] == [0.15] * 200
  assert ratios[967:] == [0.05] * 33
  assert (spec.max_ratio, spec.end_ratio) == (0.3, 0.05)
  assert spec.max_predictions(128) == math.ceil(0.3 * 128)
  assert spec.mean_ratio(1000) == pytest.approx((767 * 0.3 + 200 * 0.15 + 33 * 0.05) / 1000)
  assert spec.columns()["schedule"] == "piecewise 0.30->0.15@0.767->0.05@0.967"
  for bad, message in (("0.9:0.1,0.5:0.2", "starts must increase"), ("0.5:1.5", "in \\(0, 1\\)"),
                       ("0.5", "want START:RATIO"), ("", "needs masking.piecewise")):
    with pytest.raises(ValueError, match=message):
      masking_spec.bert_masking(ratio=0.3, schedule="piecewise", piecewise=bad)
  with pytest.raises(ValueError, match="used only by masking.schedule 'piecewise'"):
    masking_spec.bert_masking(ratio=0.3, piecewise="0.5:0.1")
