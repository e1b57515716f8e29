"""Tests for bert_jax.pretrain.trainer: gradient accumulation, faults, refusals, SIGTERM."""

import functools
import json
import logging
import os
import pathlib
import re
import signal
import threading
import time

import flax.linen as nn
from flax.training import train_state
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.pretrain import phases
from bert_jax.pretrain import steps as pretrain_step
from bert_jax.pretrain import trainer as pretrain_lib
from bert_jax.run import checkpoint
from bert_jax.training import optim
from data_pipeline import specs
from experiments.configs import pretrain


def _records(workdir) -> list[dict]:
  path = pathlib.Path(workdir) / "metrics.jsonl"
  return [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []


def _random_batch(rng, batch, length=16, predictions=4, vocab=96):
  """Pipeline-shaped batch whose examples carry very different numbers of predictions."""
  weights = np.zeros((batch, predictions), np.float32)
  for i in range(batch):
    weights[i, :int(rng.integers(0, predictions + 1))] = 1.0
  weights[0] = 1.0  # at least one prediction in the batch
  return {
      "input_ids": rng.integers(5, vocab, size=(batch, length)).astype(np.int32),
      "input_mask": np.ones((batch, length), np.int32),
      "segment_ids": (np.arange(length)[None] >= length // 2).astype(np.int32).repeat(batch, 0),
      "masked_lm_positions": rng.integers(1, length, size=(batch, predictions)).astype(np.int32),
      "masked_lm_ids": rng.integers(5, vocab, size=(batch, predictions)).astype(np.int32),
      "masked_lm_weights": weights,
      "next_sentence_labels": rng.integers(0, 2, size=(batch,)).astype(np.int32),
  }


def _adamw():
  """The tiny AdamW without warmup: the optimizer's own count starts at 0, and a
  zero first learning rate would hide any difference in the update."""
  config = pretrain.get_config("tiny").optimizer
  config.warmup_steps = 0
  return optim.make_optimizer(config, total_steps=10)[0]


def test_gradient_accumulation_matches_the_large_batch():
  """k=4 micro-batches give the k=1 update; fails if a micro-batch's loss were divided by
  its own prediction count (a mean of means) or the summed grads were not the batch's.
  One layer and a jitted init keep it to two compiles of the step: accumulation
  happens around the whole network, so a second layer proves nothing more."""
  bert_config = model_lib.BertConfig.from_size(
      "tiny", vocab_size=96, hidden_size=64, num_attention_heads=2, intermediate_size=128,
      num_hidden_layers=1, max_position_embeddings=32, hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0)
  module = heads.BertForPreTraining(bert_config)
  batch = _random_batch(np.random.default_rng(0), batch=8)
  params = nn.unbox(jax.jit(module.init)(jax.random.key(0, impl="rbg"), batch["input_ids"],
                                         batch["input_mask"], batch["segment_ids"],
                                         batch["masked_lm_positions"])["params"])
  state = train_state.TrainState.create(apply_fn=module.apply, params=params, tx=_adamw())

  # The oracle can fail: micro-batches (examples j, j+4, ... for k=4) hold
  # different numbers of predictions, so a mean of micro-batch means differs.
  counts = [batch["masked_lm_weights"][j::4].sum() for j in range(4)]
  assert len(set(counts)) > 1, counts
  results = {}
  for k in (1, 4):
    step = jax.jit(functools.partial(pretrain_step.train_step, grad_accum_steps=k, skip_nonfinite=False))
    results[k] = step(state, batch, jax.random.key(1))
  (full, full_metrics), (new, metrics) = results[1], results[4]
  assert not np.allclose(full.params["mlm_head"]["output_bias"], params["mlm_head"]["output_bias"])
  # Adam's first step is ~lr * g / (|g| + eps): for gradients near eps, summation-order
  # noise moves it by up to ~1e-6 * lr; atol 1e-6 is 0.1% of a step (lr 1e-3).
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               new.params, full.params)
  np.testing.assert_allclose(metrics["loss"], full_metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(metrics["grad_norm"], full_metrics["grad_norm"], rtol=1e-5)
  np.testing.assert_allclose(metrics["mlm_accuracy"], full_metrics["mlm_accuracy"], rtol=1e-6)


def test_bad_configs_are_refused_before_compiling(pretrain_test_config, tmp_path):
  """Fails if any listed impossible config (batch, accumulation, mesh, length, vocab, eval size,
  attention kernel, generator) trains instead of raising its message, or writes a checkpoint
  directory first."""
  cases = [
      ({"batch_size": 12}, "not divisible by the data-parallel size"),
      ({"grad_accum_steps": 2}, "grad_accum_steps=2"),
      ({"mesh.data": 3}, "needs 3 devices but 8 are available"),
      ({"mesh.data": 1, "mesh.tensor": 8}, "cannot be split 8 ways"),
      ({"data.max_seq_length": 128}, "exceeds the model's max_position_embeddings=64"),
      ({"model.vocab_size": 50}, "smaller than the pipeline's vocabulary"),
      ({"data.eval.num_examples": 4}, "smaller than one eval batch"),
      # A kernel this machine lacks, or a fused kernel under the paper's attention dropout.
      ({"model.attention_impl": "cudnn", "model.attention_probs_dropout_prob": 0.0},
       "attention_impl='cudnn' cannot run here"),
      ({"model.attention_impl": "xla"}, "attention_impl='xla' has no dropout"),
      ({"rng_impl": "philox"}, "config.rng_impl='philox'"),
  ]
  for i, (overrides, message) in enumerate(cases):
    workdir = tmp_path / str(i)
    with pytest.raises(ValueError, match=re.escape(message)):
      pretrain_lib.train_and_evaluate(pretrain_test_config(**overrides), str(workdir))
    assert not (workdir / "checkpoints").exists(), overrides


@pytest.mark.parametrize("overrides,message", [
    ({"batch_size": -8}, "config.batch_size=-8 must be positive"),
    ({"batch_size": 0}, "config.batch_size=0 must be positive"),
    ({"eval_batch_size": 0}, "config.eval_batch_size=0 must be positive"),
])
def test_a_non_positive_batch_is_refused_before_anything_and_the_fix_runs(
    overrides, message, pretrain_test_config, tmp_path, caplog):
  """Fails if a batch size of 0 or below gets past the first check (it once read the corpus,
  crashed dividing by it and left a record that refused the corrected command), leaves
  anything in the workdir, or the corrected command on that workdir does not run."""
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=re.escape(message)):
    pretrain_lib.train_and_evaluate(pretrain_test_config(**overrides), str(workdir))
  assert not workdir.exists() or not any(workdir.iterdir())
  caplog.set_level(logging.WARNING)
  pretrain_lib.train_and_evaluate(pretrain_test_config(total_steps=2), str(workdir))
  assert [r["step"] for r in _records(workdir) if "loss" in r] == [1, 2]
  # The fixture's warmup (5 steps) is longer than this 2-step run: said, not silent.
  assert "warmup_steps=5 is longer than the run (total_steps=2)" in caplog.text


def test_unwritable_workdir_fails_before_training(pretrain_test_config, tmp_path):
  """Fails if a workdir under a regular file is not refused as not writable."""
  (tmp_path / "file").write_text("")
  with pytest.raises(ValueError, match="is not writable"):
    pretrain_lib.train_and_evaluate(pretrain_test_config(), str(tmp_path / "file" / "workdir"))


@pytest.mark.slow
def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(
    pretrain_test_config, tmp_path):
  """Fails if an overflowing run does not stop with a FloatingPointError naming the step and the
  step before as the last good checkpoint, or the saved parameters are not all finite."""
  # A learning rate of 1e38 makes the parameters overflow after one or two updates.
  config = pretrain_test_config(**{"optimizer.learning_rate": 1e38, "total_steps": 8,
                                   "checkpoint.every_steps": 1, "optimizer.warmup_steps": 1})
  with pytest.raises(FloatingPointError, match=r"at step (\d+)") as error:
    pretrain_lib.train_and_evaluate(config, str(tmp_path / "stop"))
  bad_step = int(re.search(r"at step (\d+)", str(error.value)).group(1))
  assert f"last good checkpoint: step {bad_step - 1}" in str(error.value)
  _, params = checkpoint.load_params_from_workdir(str(tmp_path / "stop"))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


@pytest.mark.slow
def test_sigterm_saves_and_returns(pretrain_test_config, tmp_path):
  """SIGTERM after step 3 is logged: the run saves its last step and returns, handler
  restored. Bounded both ways: the run has 2,000 steps, not 100,000 (a run that ignores
  SIGTERM ends there and fails `last < 2000`), and if step 3 is never logged within 300 s the
  thread signals anyway and the test fails on that, instead of training on."""
  workdir = tmp_path / "run"
  total = 2_000
  config = pretrain_test_config(**{"total_steps": total, "checkpoint.every_steps": total})
  done = threading.Event()
  outcome = []

  def preempt():
    deadline = time.monotonic() + 300
    while not any(r.get("step", 0) >= 3 and "loss" in r for r in _records(workdir)):
      if done.is_set():
        outcome.append("the run returned before logging step 3")
        return
      if time.monotonic() > deadline:
        outcome.append("step 3 not logged within 300 s")
        break
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)

  handler_before = signal.getsignal(signal.SIGTERM)
  thread = threading.Thread(target=preempt, daemon=True)
  thread.start()
  try:
    pretrain_lib.train_and_evaluate(config, str(workdir))
  finally:
    done.set()
    thread.join(timeout=60)
  assert not thread.is_alive() and not outcome, outcome
  last = max(r["step"] for r in _records(workdir) if "loss" in r)
  assert 3 <= last < total
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                if p.name.isdigit()) == [last]
  assert signal.getsignal(signal.SIGTERM) == handler_before


@pytest.mark.slow
def test_phase_two_switches_to_long_sequences_and_continues(pretrain_test_config, tmp_path,
                                                            caplog):
  """Fails if phase 2 does not start at step 2 with length 48 and 8 predictions, the run does not
  log steps 1-4 with finite losses and a learning rate still rising across the switch, or the
  start's cost estimate does not name both phases and the missing CPU peak."""
  caplog.set_level(logging.INFO)
  config = pretrain_test_config(**{
      "total_steps": 4, "phase2.start_fraction": 0.5, "phase2.max_seq_length": 48,
      "phase2.max_predictions_per_seq": 8, "checkpoint.every_steps": 2})
  run_phases = phases.of(config)
  assert [(p.index, p.start, p.end) for p in run_phases] == [(1, 0, 2), (2, 2, 4)]
  data_config = phases.at(run_phases, 2).data
  assert (data_config.max_seq_length, data_config.masking.max_predictions_per_seq) == (48, 8)
  assert phases.at(run_phases, 1).data.max_seq_length == 32
  pretrain_lib.train_and_evaluate(config, str(tmp_path))
  records = [r for r in _records(tmp_path) if "loss" in r]
  assert [r["step"] for r in records] == [1, 2, 3, 4]
  # The learning rate schedule runs on across the switch (warmup 5 steps: still rising).
  rates = [r["learning_rate"] for r in records]
  assert rates == sorted(rates) and rates[2] > rates[1] > 0
  assert all(np.isfinite(r["loss"]) for r in records)
  # The cost estimate at start names each phase (no peak for CPUs: no wall time).
  estimate = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model FLOPs")]
  assert len(estimate) == 1, caplog.text[-2000:]
  assert "phase 1 2 steps x" in estimate[0] and "phase 2 2 steps x" in estimate[0]
  assert "no peak known for 8 x 'cpu'" in estimate[0]


@pytest.mark.parametrize("variant", pretrain.VARIANTS)
def test_every_variant_builds_a_consistent_run(variant):
  """Fails if a config variant's sequence length exceeds its model's positions, its prediction count
  is 0 or over the length, its optimizer does not build, its batch sizes are not multiples of 8, or
  base/large/albert lose their paper values."""
  config = pretrain.get_config(variant)
  overrides = dict(config.model.to_dict(), vocab_size=30522)  # the vocab size is the pipeline's
  bert_config = model_lib.BertConfig.from_size(config.model_size, **overrides)
  for phase in phases.of(config):
    data_config = phase.data
    assert data_config.max_seq_length <= bert_config.max_position_embeddings
    assert 0 < specs.max_predictions(data_config) <= data_config.max_seq_length
  pretrain_step.optimizer(config)
  assert config.batch_size % 8 == 0 and config.eval_batch_size % 8 == 0
  if variant in ("base", "large"):  # the paper's two phases
    one, two = phases.of(config)
    assert (one.start, two.start, two.end) == (0, 900_000, 1_000_000)
    assert specs.max_predictions(one.data) == 20 and specs.max_predictions(two.data) == 77
  if variant == "albert":
    assert (bert_config.embedding_size, bert_config.share_layers) == (128, True)


def test_bfloat16_step_keeps_float32_state_and_skips_nonfinite_updates():
  """bf16 compute, fp32 params/moments; with skip_nonfinite a NaN step changes nothing but step.

  Fails if a bf16 cast reached the params or Adam moments, or a NaN loss still moved a
  parameter or moment. One layer: the casts are per layer type, a second adds no case."""
  bert_config = model_lib.BertConfig.from_size(
      "tiny", vocab_size=96, hidden_size=64, num_attention_heads=2, intermediate_size=128,
      num_hidden_layers=1, max_position_embeddings=32, dtype="bfloat16")
  module = heads.BertForPreTraining(bert_config)
  batch = _random_batch(np.random.default_rng(0), batch=4)
  # rbg keys: threefry's hash, unrolled into every parameter draw and dropout mask, doubles
  # the compile time on CPU; which generator draws them does not matter here.
  params = nn.unbox(jax.jit(module.init)(jax.random.key(0, impl="rbg"), batch["input_ids"],
                                         batch["input_mask"], batch["segment_ids"],
                                         batch["masked_lm_positions"])["params"])
  state = train_state.TrainState.create(apply_fn=module.apply, params=params, tx=_adamw())
  step = jax.jit(functools.partial(pretrain_step.train_step, grad_accum_steps=2, skip_nonfinite=True))
  same = lambda a, b: bool(jnp.array_equal(a, b, equal_nan=True))
  dropout = jax.random.key(1, impl="rbg")

  new, metrics = step(state, batch, dropout)
  assert metrics["finite"] and metrics["loss"].dtype == jnp.float32
  assert {x.dtype for x in jax.tree.leaves((new.params, new.opt_state))
          if jnp.issubdtype(x.dtype, jnp.floating)} == {jnp.dtype(jnp.float32)}
  assert not all(jax.tree.leaves(jax.tree.map(same, new.params, state.params)))

  poisoned = jax.tree.map(lambda x: x, state.params)
  poisoned["nsp_head"]["bias"] = jnp.array([jnp.nan, 0.0])  # the loss becomes NaN
  bad = state.replace(params=poisoned)
  new, metrics = step(bad, batch, dropout)
  assert not metrics["finite"] and int(new.step) == 1
  assert all(jax.tree.leaves(jax.tree.map(same, new.params, bad.params)))
  assert all(jax.tree.leaves(jax.tree.map(same, new.opt_state, bad.opt_state)))
