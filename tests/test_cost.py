"""Tests for bert_jax.pretrain.cost: device sets, and the model FLOPs of a step (cost.step_flops,
the one definition the trainer's MFU, the benchmarks, --dry_run and the ablation use)
against an independent count: the matmuls of the traced forward + backward pass
(jax.make_jaxpr of jax.grad).

Model FLOPs are a convention (PaLM's: 2 per multiply-add, backward = 2 x forward), and
differ from the traced matmuls in named ways only, so the tests assert exact identities:

  step_flops = matmuls + 6 x (biases, LayerNorm parameters, output bias: parameters that
               are not matmul weights, charged where they run) - 6 E x (padded
               vocabulary rows) per prediction (computed, but not model FLOPs).

A wrong factor, a missing attention or decoder term, an embedding table counted as a
matmul, a head charged in the wrong place, or a sequence length where the number of
predictions belongs breaks an identity.
"""

import math

import flax.linen as nn
import jax
from jax.extend import core as jax_core
import numpy as np
import pytest

from bert_jax.model.encoder import BertConfig
from bert_jax.model.heads import BertForPreTraining
from bert_jax.pretrain import cost
from bert_jax.run import metrics_io
from experiments.configs import pretrain


def test_device_sets_count_jax_devices():
  """Fails if a device set resolves to another device kind or JAX device count than listed (v4
  megacore chips, v3 TensorCores), or an unknown one is accepted."""
  assert cost.device_set("v4-32") == ("TPU v4", 16)  # 32 TensorCores = 16 megacore chips
  assert cost.device_set("v3-32") == ("TPU v3", 32)  # each v3 TensorCore is a device
  assert cost.device_set("v5litepod-16") == ("TPU v5 lite", 16)
  assert cost.device_set("8xH200") == ("NVIDIA H200", 8)
  assert cost.device_set("H100") == ("NVIDIA H100 80GB HBM3", 1)
  with pytest.raises(ValueError, match="unknown device set 'v9-8'"):
    cost.device_set("v9-8")


def _matmul_flops(jaxpr) -> int:
  """2 x output size x contracted size, summed over every dot_general (sub-jaxprs too; a
  scan's body as many times as the scan runs it: scanned layers)."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (contracting, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contracting)
    times = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(sub, jax_core.ClosedJaxpr):
          total += times * _matmul_flops(sub.jaxpr)
        elif isinstance(sub, jax_core.Jaxpr):
          total += times * _matmul_flops(sub)
  return total


def _traced(cfg: BertConfig, batch: int, seq_len: int, predictions: int, nsp_head: bool = True):
  """(loss(params, ids, positions), abstract params, (ids, positions) shapes)."""
  # Dropout and remat off: neither changes the model's matmuls, but remat would replay some.
  cfg = cfg.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                    attention_impl="einsum", remat_policy="none", remat=False)
  model = BertForPreTraining(cfg, nsp_head=nsp_head)
  args = (jax.ShapeDtypeStruct((batch, seq_len), np.int32),
          jax.ShapeDtypeStruct((batch, predictions), np.int32))
  params = nn.unbox(jax.eval_shape(
      lambda i, p: model.init(jax.random.key(0), i, i, i, p), *args)["params"])

  def loss(params, ids, positions):
    out = model.apply({"params": params}, ids, (ids > 0).astype(np.int32), ids, positions)
    return sum(logits.sum() for logits in out.values())
  return loss, params, args


def _conventions(cfg: BertConfig, params, batch: int, seq_len: int, predictions: int) -> int:
  """What the model FLOPs count beyond the traced matmuls (module docstring)."""
  extra = -6 * cfg.embed_size * (cfg.padded_vocab_size - cfg.vocab_size) * batch * predictions
  # A sliding layer's einsum computes every [T, T] score and masks the keys beyond its
  # window: the model FLOPs count the window's keys only (QK^T and PV, 4 per key and
  # feature forward, x3).
  window = min(seq_len, cfg.local_attention + 1)
  sliding = sum(not cfg.is_global(i) for i in range(cfg.num_hidden_layers))
  extra -= 12 * cfg.hidden_size * seq_len * (seq_len - window) * sliding * batch
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name, n = jax.tree_util.keystr(path), math.prod(leaf.shape)
    if any(table in name for table in metrics_io.EMBEDDING_TABLES):
      continue  # lookups, in neither count
    is_matmul = name.endswith(("['kernel']", "['mlm_head']['decoder']"))  # untied decoder too
    runs_on = (1 if name.startswith(("['bert']['pooler']", "['nsp_head']")) else
               predictions if name.startswith("['mlm_head']") else seq_len)  # rows per sequence
    extra += 6 * n * batch * (runs_on if not is_matmul else 0)
  return extra


@pytest.mark.parametrize("tie", [True, False])
def test_modern_model_flops_count_the_window_and_the_decoder_once(tie):
  """Fails if the modern encoder's step_flops is not its traced matmuls plus the conventions
  with sliding layers charged their window's keys, or an untied decoder is counted twice
  (as a head parameter and as the tied table's E V)."""
  cfg = BertConfig.from_size("modernbert-tiny", vocab_size=300, local_attention=16,
                             tie_word_embeddings=tie)
  batch, seq_len, predictions = 2, 48, 9
  loss, params, args = _traced(cfg, batch, seq_len, predictions, nsp_head=False)
  step = _matmul_flops(jax.make_jaxpr(jax.grad(loss))(params, *args).jaxpr)
  executed = cost.step_flops(cfg, params, sequences=batch, seq_len=seq_len,
                             predictions=batch * predictions)
  assert executed == step + _conventions(cfg, params, batch, seq_len, predictions)
  assert cost.step_flops(cfg.replace(global_attn_every_n_layers=1), params, sequences=batch,
                         seq_len=seq_len, predictions=batch * predictions) > executed


@pytest.mark.parametrize("fields,batch,seq_len,predictions", [
    (dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
          vocab_size=1000), 2, 64, 10),
    # ALBERT-style factorised embedding (E != H, a projection), odd sizes, padded vocab.
    (dict(hidden_size=96, num_hidden_layers=3, num_attention_heads=4, intermediate_size=200,
          vocab_size=501, embedding_size=32, vocab_multiple=8), 3, 40, 7),
])
def test_model_flops_are_the_traced_matmuls_plus_their_conventions(fields, batch, seq_len,
                                                                   predictions):
  """Fails if the traced step is not 3x the forward's matmuls, step_flops differs from the traced
  matmuls plus the named conventions, or (no factorised embedding) XLA's count of the compiled step
  is below them or over 1.05x."""
  cfg = BertConfig(**fields, max_position_embeddings=64)
  loss, params, args = _traced(cfg, batch, seq_len, predictions)
  forward = _matmul_flops(jax.make_jaxpr(loss)(params, *args).jaxpr)
  step = _matmul_flops(jax.make_jaxpr(jax.grad(loss))(params, *args).jaxpr)
  assert step == 3 * forward  # backward = 2 x forward: the "6" of 6N
  executed = cost.step_flops(cfg, params, sequences=batch, seq_len=seq_len,
                             predictions=batch * predictions)
  assert executed == step + _conventions(cfg, params, batch, seq_len, predictions)
  if "embedding_size" not in fields:
    # XLA's own count of the compiled step: the traced matmuls plus the elementwise work
    # (GELU, softmax, LayerNorm: ~3% at H=128), never less.
    analysis = jax.jit(jax.grad(loss)).lower(params, *args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    assert step <= analysis["flops"] <= 1.05 * step, analysis["flops"] / step


def test_bert_base_paper_run_flops():
  """The paper run's two phases, each per-step figure against BERT-Base's traced matmuls
  (one sequence traced, nothing compiled: every matmul is linear in the batch); the
  conventions are under 1% of the total at that size."""
  config = pretrain.get_config("base")
  bert_config, params = cost.abstract_model(config, vocab_size=30522)
  flops = cost.run_flops(config, bert_config, params)
  assert [(f["phase"], f["steps"], f["seq_len"], f["predictions"]) for f in flops] == [
      (1, 900_000, 128, 20), (2, 100_000, 512, 77)]
  for f in flops:
    loss, one, args = _traced(bert_config, 1, f["seq_len"], f["predictions"])
    step = _matmul_flops(jax.make_jaxpr(jax.grad(loss))(one, *args).jaxpr)
    assert jax.tree.map(np.shape, one) == jax.tree.map(np.shape, params)
    conventions = _conventions(bert_config, params, 256, f["seq_len"], f["predictions"])
    assert f["flops_per_step"] == 256 * step + conventions
    assert 0 < conventions < 0.01 * 256 * step, conventions / (256 * step)
  total = sum(f["flops"] for f in flops)
  # 16 v4 chips at 40% of 275 TFLOP/s.
  assert cost.hours(total, "TPU v4", 16, 0.4) == pytest.approx(total / (0.4 * 275e12 * 16) / 3600)
  assert "no peak known" in cost.describe(flops, "cpu", 8, 0.4)


def test_executed_flops_are_step_flops_summed_across_the_phase_change():
  """cost.executed_flops (the ablation report's FLOPs as executed) is step_flops of each
  step at its phase's sequence length with that step's real predictions, accumulated.

  A step charged at the wrong phase's length (phase 2 starts at step 3 of 4: step 4 runs
  at 32 tokens, not 16), a missing step's predictions not taken as 0, or a second FLOP
  formula that drifted from step_flops would break the equalities.
  """
  config = pretrain.get_config("base")
  config.total_steps, config.batch_size = 4, 2
  config.phase2.start_fraction = 0.75
  config.data.max_seq_length, config.phase2.max_seq_length = 16, 32
  config.model.update(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=32)
  bert_config, params = cost.abstract_model(config, vocab_size=100)
  predictions = {1: 5, 2: 6, 4: 3}  # step 3 made none
  out = cost.executed_flops(config, bert_config, params, predictions)
  expected = [0.0]
  for step, seq_len in ((1, 16), (2, 16), (3, 16), (4, 32)):
    expected.append(expected[-1] + cost.step_flops(
        bert_config, params, sequences=2, seq_len=seq_len, predictions=predictions.get(step, 0)))
  assert out == pytest.approx(expected, rel=1e-12)
  assert out[4] - out[3] > 2 * (out[3] - out[2])  # the long phase costs more per step
