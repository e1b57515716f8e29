"""Tests for bert_jax.cost: device sets, and the paper run's FLOPs from its parameter count."""

import pytest

from bert_jax import cost
from experiments.configs import pretrain


def test_device_sets_count_jax_devices():
  assert cost.device_set("v4-32") == ("TPU v4", 16)  # 32 TensorCores = 16 megacore chips
  assert cost.device_set("v3-32") == ("TPU v3", 32)  # each v3 TensorCore is a device
  assert cost.device_set("v5litepod-16") == ("TPU v5 lite", 16)
  assert cost.device_set("8xH200") == ("NVIDIA H200", 8)
  assert cost.device_set("H100") == ("NVIDIA H100 80GB HBM3", 1)
  with pytest.raises(ValueError, match="unknown device set 'v9-8'"):
    cost.device_set("v9-8")


def test_bert_base_paper_run_flops_follow_its_parameter_count():
  config = pretrain.get_config("base")
  bert_config, params = cost.abstract_model(config, vocab_size=30522)
  flops = cost.run_flops(config, bert_config, params)
  # BERT-Base with its pretraining heads has 110,106,428 parameters (tests/test_model.py
  # checks that count against transformers); 23,835,648 of them are the embedding tables.
  dense = 110_106_428 - (30522 + 512 + 2) * 768
  # Each head where it runs: pooler + NSP per sequence, the MLM transform, its LayerNorm
  # and output bias per prediction slot (a per-token charge would overcount them).
  per_sequence = (768 * 768 + 768) + (768 * 2 + 2)
  per_prediction = (768 * 768 + 768) + 2 * 768 + 30522
  per_token = dense - per_sequence - per_prediction
  per_step = lambda t, p: 256 * (t * (6 * per_token + 12 * 12 * 768 * t) + 6 * per_sequence
                                 + p * (6 * per_prediction + 6 * 768 * 30522))
  assert [(f["phase"], f["steps"], f["seq_len"], f["predictions"]) for f in flops] == [
      (1, 900_000, 128, 20), (2, 100_000, 512, 77)]
  assert flops[0]["flops_per_step"] == per_step(128, 20)
  assert flops[1]["flops_per_step"] == per_step(512, 77)
  total = sum(f["flops"] for f in flops)
  # 16 v4 chips at 40% of 275 TFLOP/s.
  assert cost.hours(total, "TPU v4", 16, 0.4) == pytest.approx(total / (0.4 * 275e12 * 16) / 3600)
  assert "no peak known" in cost.describe(flops, "cpu", 8, 0.4)
