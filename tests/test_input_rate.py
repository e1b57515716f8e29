"""The input rate a slice needs (experiments/benchmarks/data/pipeline.py): the arithmetic only.

Nothing is timed here; the measured side is the benchmark's run, in
experiments/results/README.md#input-rate.
"""

import functools

import pytest

from bert_jax import errors
from bert_jax.pretrain import cost
from experiments.benchmarks.data import pipeline
from experiments.configs import pretrain


@functools.cache
def _base_model():
  """BERT-Base's (BertConfig, abstract params), traced once for the module."""
  return cost.abstract_model(pretrain.get_config("base"), pipeline.BERT_UNCASED_VOCAB_SIZE)


def _demand(slice_name: str, mfu: float = 0.4, **overrides) -> list[dict]:
  config = pretrain.get_config("base")
  for key, value in overrides.items():
    setattr(config, key, value)
  return pipeline.slice_demand(config, slice_name, mfu, model=_base_model())


def _phase1(slice_name: str, mfu: float = 0.4, **overrides) -> dict:
  return _demand(slice_name, mfu, **overrides)[0]


def test_bert_base_on_a_v4_32_at_40_percent_mfu_needs_about_6k_sequences_per_host():
  """An independent estimate, from the BERT-Base shapes alone: 12 layers of 4 H^2 + 8 H^2
  weights (85M), 6 FLOPs per weight and token, 12 L H T for attention scores, 6 E V per
  masked slot (20 of 128); 16 v4 chips of 275 TFLOP/s on 4 hosts. Fails if the FLOPs
  (bert_jax.pretrain.cost), the chip count, the peak or the hosts of the slice are wrong."""
  h, layers, t, vocab, slots = 768, 12, 128, 30522, 20
  per_sequence = (6 * layers * 12 * h * h * t + 12 * layers * h * t * t
                  + 6 * slots * h * vocab)
  expected = 0.4 * 275e12 * 16 / per_sequence / 4
  d = _phase1("v4-32")
  assert (d["devices"], d["hosts"], d["host_batch"], d["seq_len"]) == (16, 4, 64, 128)
  assert d["needed_per_host"] == pytest.approx(expected, rel=0.03)
  assert 5_500 < d["needed_per_host"] < 7_000  # the "about 6k"


def test_the_need_per_host_follows_chips_per_host_peak_and_mfu():
  """v4-8 is one host of the same 4 chips as each v4-32 host: the same need per host, but
  the whole global batch on it; a v5e chip has 197/275 of a v4's peak; v6e-8 is 8 chips on
  one host; the need is linear in the MFU."""
  v4_32 = _phase1("v4-32")["needed_per_host"]
  v4_8 = _phase1("v4-8")
  assert (v4_8["hosts"], v4_8["host_batch"]) == (1, 256)
  assert v4_8["needed_per_host"] == pytest.approx(v4_32)
  assert _phase1("v5litepod-16")["needed_per_host"] == pytest.approx(v4_32 * 197 / 275)
  assert _phase1("v6e-8")["needed_per_host"] == pytest.approx(v4_32 * 2 * 918 / 275)
  assert _phase1("v4-32", mfu=0.2)["needed_per_host"] == pytest.approx(v4_32 / 2)


def test_phase_2_needs_fewer_longer_sequences():
  """At 512 tokens each sequence costs more than 4x the FLOPs of one at 128 (attention
  grows with T^2, masked slots 77 vs 20), so the need drops by more than 4x."""
  p1, p2 = _demand("v4-32")
  assert (p1["seq_len"], p2["seq_len"], p2["predictions"]) == (128, 512, 77)
  assert p2["flops_per_sequence"] > 4 * p1["flops_per_sequence"]
  assert p2["needed_per_host"] < p1["needed_per_host"] / 4


def test_a_batch_that_does_not_split_over_the_hosts_is_refused():
  """Fails if a batch of 258 on v4-32 is accepted instead of refused as not splitting over its 4
  hosts."""
  with pytest.raises(errors.UsageError, match="does not split over the 4 hosts of v4-32"):
    _phase1("v4-32", batch_size=258)


def test_a_gpu_set_needs_its_hosts_named():
  """Fails if a 16xH100 set is shaped without --hosts, or with hosts=2 gives another device kind,
  device count or host count."""
  with pytest.raises(errors.UsageError, match="pass --hosts"):
    pipeline.slice_shape("16xH100")
  assert pipeline.slice_shape("16xH100", hosts=2) == ("NVIDIA H100 80GB HBM3", 16, 2)
