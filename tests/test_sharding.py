"""Tests for bert_jax.training.sharding and the trainer on several meshes and processes.

The 8 CPU devices come from tests/conftest.py (XLA_FLAGS set before jax is imported).
"""

import functools
import json
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

import ports

from bert_jax.convert import layout as convert_layout
from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.pretrain import losses
from bert_jax.pretrain import steps as pretrain_step
from bert_jax.pretrain import trainer as pretrain_lib
from bert_jax.run import checkpoint
from bert_jax.training import optim
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from experiments.benchmarks.pretrain import sharding as bench
from experiments.configs import pretrain

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# The four meshes of the pod-readiness figures (experiments/benchmarks/pretrain/sharding.py).
FOUR_MESHES = ((1, 8, 1), (1, 4, 2), (2, 2, 2), (8, 1, 1))
# BERT-tiny at a batch whose [B, T] (and B*T) no parameter dimension of tiny equals, so
# an activation cannot be mistaken for a parameter in the compiled program.
_TINY_STEP = dict(size="tiny", batch=32, seq_len=48, predictions=6, vocab_size=30522)


def _losses(workdir) -> dict[int, float]:
  records = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_mesh_shape_takes_the_rest_and_refuses_mismatches():
  """Fails if a -1 axis does not take the remaining devices, or a mesh needing other than the device
  count, not dividing it, with two -1 axes or with a 0 axis is accepted or refused with another
  message."""
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
  assert sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="needs 4 devices but 8 are available"):
    sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="do not divide the 8 available devices"):
    sharding.mesh_shape({"data": -1, "fsdp": 3, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="config.mesh.tensor=0"):
    sharding.mesh_shape({"data": -1, "fsdp": 1, "tensor": 0}, 8)


def test_parameters_follow_the_logical_rules():
  """Fails if a parameter's partition spec differs from the listed one under the logical rules,
  tiny's parameters do not divide a 2x2x2 mesh, or splitting 2 heads 8 ways is not refused naming
  the axis."""
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  rules = pretrain.get_config("tiny").logical_axis_rules
  module = heads.BertForPreTraining(model_lib.BertConfig.from_size("tiny", vocab_size=96))
  ids = jnp.zeros((1, 8), jnp.int32)
  boxed = jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, ids, ids[:, :2]))
  shardings = sharding.logical_shardings(boxed["params"], mesh, rules)
  layer = shardings["bert"]["encoder"]["layer_0"]
  assert layer["attention"]["query"]["kernel"].spec == P("fsdp", "tensor", None)
  assert layer["attention"]["output"]["kernel"].spec == P("tensor", None, "fsdp")
  assert layer["intermediate"]["kernel"].spec == P("fsdp", "tensor")
  assert layer["output_layer_norm"]["scale"].spec == P("fsdp")
  assert shardings["bert"]["embeddings"]["word_embeddings"]["embedding"].spec == P("tensor", "fsdp")
  sharding.check_divisible(nn.unbox(boxed["params"]), shardings)
  # 96 words split 8 ways is fine; 2 heads are not.
  wide = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
  with pytest.raises(ValueError, match=r"cannot be split 8 ways over mesh axes \('tensor',\)"):
    sharding.check_divisible(nn.unbox(boxed["params"]),
                             sharding.logical_shardings(boxed["params"], wide, rules))


def test_global_batch_is_split_over_data_and_fsdp():
  """Fails if the global batch changes the values, is not sharded over (data, fsdp), or a device
  holds other than its 4 rows."""
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  local = {"input_ids": np.arange(16 * 3, dtype=np.int32).reshape(16, 3)}
  batch = sharding.global_batch(local, mesh)
  np.testing.assert_array_equal(batch["input_ids"], local["input_ids"])
  assert batch["input_ids"].sharding.spec == P(("data", "fsdp"))
  assert {s.data.shape for s in batch["input_ids"].addressable_shards} == {(4, 3)}



class _CountingInput:
  """A pipeline stand-in: batch i holds i; state and fingerprint say how many were read."""

  def __init__(self):
    self.read, self.closed, self.last_fingerprint = 0, False, ""

  def __next__(self):
    batch = {"input_ids": np.full((8, 2), self.read, np.int32)}
    self.read += 1
    self.last_fingerprint = f"fp{self.read - 1}"
    return batch

  def get_state(self):
    return {"read": self.read}

  def close(self):
    self.closed = True


def test_device_prefetch_reads_ahead_but_reports_the_batch_given_out():
  """Fails if prefetching reads more than one batch ahead, reports the state or fingerprint of the
  batch read ahead rather than of the one given out, skips or repeats a batch, places it off (data,
  fsdp), or close does not close the source."""
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  source = _CountingInput()
  data = sharding.DevicePrefetch(source, mesh)
  assert (data.get_state(), data.last_fingerprint, source.read) == ({"read": 0}, "", 0)
  local, placed = next(data)
  assert source.read == 1 and data.get_state() == {"read": 1} and data.last_fingerprint == "fp0"
  assert placed["input_ids"].sharding.spec == P(("data", "fsdp"))
  np.testing.assert_array_equal(placed["input_ids"], local["input_ids"])
  data.fetch_next()  # what the trainer does right after dispatching a step
  data.fetch_next()  # idempotent: one batch ahead at most
  # Batch 1 is read and placed, but a checkpoint now must still resume at batch 1.
  assert source.read == 2 and data.get_state() == {"read": 1} and data.last_fingerprint == "fp0"
  local, placed = next(data)
  assert int(local["input_ids"][0, 0]) == 1 and int(placed["input_ids"][0, 0]) == 1
  assert source.read == 2 and data.get_state() == {"read": 2} and data.last_fingerprint == "fp1"
  assert int(next(data)[1]["input_ids"][0, 0]) == 2  # no batch skipped or repeated
  data.close()
  assert source.closed

@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_meshes_follow_the_single_device_run(mesh, pretrain_reference_run, pretrain_test_config,
                                              tmp_path):
  """Fails if a 20-step run on this mesh records other steps, or its losses or final weights differ
  from the single-device run's beyond float tolerance."""
  data, fsdp, tensor = mesh
  config = pretrain_test_config(**{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor})
  pretrain_lib.train_and_evaluate(config, str(tmp_path))
  reference, ours = _losses(pretrain_reference_run), _losses(tmp_path)
  assert sorted(ours) == list(range(1, 21))
  np.testing.assert_allclose([ours[s] for s in sorted(ours)],
                             [reference[s] for s in sorted(ours)], rtol=1e-5)
  _, ref_params = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  _, params = checkpoint.load_params_from_workdir(str(tmp_path))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               params, ref_params)


@pytest.mark.slow
def test_two_processes_match_one_process(pretrain_test_config, pretrain_subprocess, tmp_path):
  """2 processes x 2 devices (jax.distributed on localhost) vs 1 process x 4 devices."""
  config = pretrain_test_config(**{"total_steps": 6, "checkpoint.every_steps": 3})
  single = pretrain_subprocess(config, tmp_path / "single", devices=4, synthetic=True)
  assert single.wait(timeout=600) == 0, (tmp_path / "single.log").read_text()[-3000:]

  port = ports.free_port()
  processes = []
  for i in range(2):
    config.distributed.update(enabled=True, coordinator_address=f"localhost:{port}",
                              num_processes=2, process_id=i)
    processes.append(pretrain_subprocess(config, tmp_path / "multi", devices=2, synthetic=True,
                                         name=f"multi_{i}"))
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == 0, (tmp_path / f"multi_{i}.log").read_text()[-3000:]

  np.testing.assert_allclose(list(_losses(tmp_path / "multi").values()),
                             list(_losses(tmp_path / "single").values()), rtol=1e-5)
  _, single_params = checkpoint.load_params_from_workdir(str(tmp_path / "single"))
  _, multi_params = checkpoint.load_params_from_workdir(str(tmp_path / "multi"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               multi_params, single_params)


# ----------------------------------------------------------------------------- compiled step

def test_model_under_a_mesh_computes_what_it_computes_without():
  """sharding.activate makes the constraints real (flax's DenseGeneral failed under a mesh).

  Fails if no constraint is lowered under the mesh (count 0) or the constrained program
  computes other outputs. The init is jitted (eagerly it compiles each random op on its
  own) and draws with rbg (threefry's hash doubles its compile): any params will do."""
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  rules = pretrain.get_config("tiny").logical_axis_rules
  config = model_lib.BertConfig.from_size("tiny", vocab_size=96, scan_layers=True)
  module = heads.BertForPreTraining(config)
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 96, (8, 16)).astype(np.int32)
  args = (ids, np.ones_like(ids), (np.arange(16) >= 8).astype(np.int32)[None].repeat(8, 0),
          rng.integers(0, 16, (8, 3)).astype(np.int32))
  params = nn.unbox(jax.jit(module.init)(jax.random.key(0, impl="rbg"), *args)["params"])
  want = jax.jit(module.apply)({"params": params}, *args)
  with sharding.activate(mesh, rules):
    apply = jax.jit(module.apply)
    assert bench.count_constraints(apply.lower({"params": params}, *args).as_text()) > 0
    got = apply({"params": params}, *args)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


@pytest.mark.slow  # lowers BERT-tiny's whole train step (30,522 words) twice on 8 devices
def test_activation_constraints_reach_the_step_also_when_accumulating():
  """Under sharding.activate the model's and the accumulation loop's constraints are lowered."""
  counts = {}
  for steps in (1, 2):
    lowered, _ = bench.lower_train_step(
        bench.bench_config((2, 2, 2), grad_accum_steps=steps, **_TINY_STEP))
    counts[steps] = bench.count_constraints(lowered.as_text())
  assert counts[1] > 0
  # The micro-batch's leaves (7 features) are pinned to the batch layout inside the loop.
  assert counts[2] >= counts[1] + 7


@pytest.fixture(scope="module")
def compiled_meshes():
  """The sharding benchmark's figures for the real train step on the four meshes.

  A subprocess: XLA logs "involuntary full rematerialization" only where
  TF_CPP_MIN_LOG_LEVEL lets warnings through (conftest silences them here), and only
  when it really compiles (no persistent-cache hit).
  """
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env.update(TF_CPP_MIN_LOG_LEVEL="1", JAX_PLATFORMS="cpu")
  flags = [f"--{k}={v}" for k, v in _TINY_STEP.items()]
  meshes = ";".join(",".join(map(str, m)) for m in FOUR_MESHES)
  result = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.pretrain.sharding", *flags, f"--mesh={meshes}"],
      cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
  return {tuple(row["mesh"]): row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", FOUR_MESHES)
def test_train_step_compiles_with_a_batch_split_activation_layout(mesh, compiled_meshes):
  """Fails if tiny's compiled train step on this mesh lowers no sharding constraint, all-reduces a
  whole-batch activation, or falls back to a full rematerialisation."""
  row = compiled_meshes[mesh]
  assert row["constraints"] > 0
  # No device sums whole-batch [B, T, H] activations, and GSPMD never falls back to
  # replicating a tensor (the embedding lookup did, where data and fsdp split the batch).
  assert row["batch_activation_all_reduces"] == 0, row
  assert row["full_rematerializations"] == 0, row


def test_benchmark_parses_meshes_and_collectives():
  """Fails if mesh flags parse into other triples (a malformed one accepted), or a hand-written
  HLO's collective bytes or batch-activation all-reduces are counted otherwise."""
  assert bench.parse_meshes(["1,8,1", "1,4,2;2,2,2", "8,1,1,1,2,4"]) == [
      (1, 8, 1), (1, 4, 2), (2, 2, 2), (8, 1, 1), (1, 2, 4)]
  with pytest.raises(ValueError, match="triples"):
    bench.parse_meshes(["1,8"])
  hlo = """
  %p.1 = bf16[64,128,1024]{2,1,0} parameter(0)
  %ar = bf16[64,128,1024]{2,1,0} all-reduce(%p.1), replica_groups={}, to_apply=%add
  %q = f32[8,256]{1,0} parameter(1)
  %ag = f32[64,256]{1,0} all-gather(%q), dimensions={0}
  %rs = f32[8,256]{1,0} reduce-scatter(%ag), dimensions={0}, to_apply=%add
  %t = (f32[8,128]{1,0}, f32[8,128]{1,0}) all-reduce(%q, %q), to_apply=%add
  """
  stats = bench.collective_stats(hlo, batch=64, seq_len=128, hidden=256)
  assert stats["bytes"] == {"all-reduce": 64 * 128 * 1024 * 2 + 2 * 8 * 256 * 4,
                            "all-gather": 64 * 256 * 4, "reduce-scatter": 64 * 256 * 4,
                            "all-to-all": 0, "collective-permute": 0}
  assert stats["batch_all_reduces"] == [[(64, 128, 1024)]]


# ----------------------------------------------------------------------------- padded vocabulary

@pytest.mark.slow  # two compiled train steps, 3 steps each, plus a gradient: a short run
def test_padded_vocabulary_gives_the_unpadded_losses():
  """vocab_multiple pads the word table and the MLM logits; the losses do not move."""
  config = model_lib.BertConfig.from_size("tiny", vocab_size=1000)
  padded = config.replace(vocab_multiple=128)
  assert padded.padded_vocab_size == 1024
  rng = np.random.default_rng(0)
  b, t, p = 8, 32, 5
  batch = {
      "input_ids": rng.integers(0, 1000, (b, t)).astype(np.int32),
      "input_mask": np.ones((b, t), np.int32),
      "segment_ids": (np.arange(t)[None] >= t // 2).astype(np.int32).repeat(b, 0),
      "masked_lm_positions": rng.integers(0, t, (b, p)).astype(np.int32),
      "masked_lm_ids": rng.integers(0, 1000, (b, p)).astype(np.int32),
      "masked_lm_weights": (rng.random((b, p)) < 0.8).astype(np.float32),
      "next_sentence_labels": rng.integers(0, 2, (b,)).astype(np.int32),
  }
  model = heads.BertForPreTraining(config)
  params = jax.tree.map(np.asarray, nn.unbox(model.init(
      jax.random.key(0), batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])["params"]))
  padded_params, _ = convert_layout.pad_vocab(params, config, 128)
  # Whatever the padding rows hold (here: large values) must not matter.
  padded_params["bert"]["embeddings"]["word_embeddings"]["embedding"][1000:] = 3.0
  padded_params["mlm_head"]["output_bias"][1000:] = 50.0
  tx, _ = optim.make_optimizer(pretrain.get_config("tiny").optimizer, 100)
  step = jax.jit(functools.partial(pretrain_step.train_step, grad_accum_steps=1, skip_nonfinite=False))

  def run(bert_config, params):
    module = heads.BertForPreTraining(bert_config)
    state = state_lib.TrainState.create(apply_fn=module.apply, params=params, tx=tx)
    metrics = []
    for _ in range(3):
      state, m = step(state, batch, jax.random.PRNGKey(1))
      metrics.append(jax.device_get(m))
    logits = module.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                          batch["segment_ids"], batch["masked_lm_positions"])["mlm_logits"]
    return metrics, np.asarray(logits)

  metrics, logits = run(config, params)
  padded_metrics, padded_logits = run(padded, padded_params)
  # Equal up to float32 rounding of a matmul of another width (bit-equal here at step 1).
  for ours, want in zip(padded_metrics, metrics):
    for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss"):
      np.testing.assert_allclose(ours[key], want[key], rtol=1e-6, err_msg=key)
  np.testing.assert_allclose(padded_logits[..., :1000], logits, rtol=1e-6, atol=1e-6)
  assert (padded_logits[..., 1000:] == np.finfo(np.float32).min).all()

  # The padding rows get no gradient (only weight decay moves them).
  def mlm_loss(params):
    out = heads.BertForPreTraining(padded).apply(
        {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
        batch["masked_lm_positions"])
    return losses.masked_lm_loss(out["mlm_logits"], batch["masked_lm_ids"],
                                 batch["masked_lm_weights"])[0]
  grads = jax.grad(mlm_loss)(padded_params)
  assert not np.asarray(grads["bert"]["embeddings"]["word_embeddings"]["embedding"])[1000:].any()
  assert not np.asarray(grads["mlm_head"]["output_bias"])[1000:].any()

