"""Tests of bert_jax/model/attention.py: every implementation that runs on CPU against the
paper's einsum path, the padding forms the kernels take, the choice `auto` makes on
each device, and the refusals.

cuDNN needs an NVIDIA GPU: here its padding form (kv_lengths) and its refusal are
tested. The TPU splash kernel runs on CPU in Pallas's interpreter, forward and
backward, alone, under an 8-device mesh, and inside the model.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import attention
from bert_jax.model.encoder import BertConfig
from bert_jax.model.heads import BertForPreTraining
from bert_jax.training import sharding
from experiments.configs import optim_and_mesh


def _qkv(batch=2, length=128, heads=2, head_size=16, seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.standard_normal((batch, length, heads, head_size)), jnp.float32)
             for _ in range(3))
  lengths = np.array([length, length - 37, 5, 1][:batch])
  mask = (np.arange(length)[None] < lengths[:, None])[:, None, None, :]
  return q, k, v, jnp.asarray(mask)


def _loss_and_grads(fn, q, k, v, mask):
  # A loss that weighs every output element differently, so a transposed or
  # shuffled output cannot pass.
  weights = jnp.asarray(np.random.default_rng(1).standard_normal(q.shape), jnp.float32)
  loss = lambda q, k, v: (fn(q, k, v, mask) * weights).sum()
  return jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)


# ----------------------------------------------------------------------------- padding forms

def test_padding_forms():
  """Fails if a key mask's lengths (an all-padding row kept at 1, int32 for cuDNN) or its segment
  ids differ from the hand-written ones."""
  mask = jnp.asarray(np.array([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]], bool))[:, None, None]
  np.testing.assert_array_equal(attention.kv_lengths(mask), [4, 2, 1])  # an empty row keeps 1
  assert attention.kv_lengths(mask).dtype == jnp.int32  # cuDNN checks the dtype
  np.testing.assert_array_equal(attention.kv_segment_ids(mask),
                                [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])


def test_segment_ids_are_exact_for_a_mask_with_holes():
  """Segment ids express any key mask; lengths only a prefix (what BERT inputs are)."""
  q, k, v, _ = _qkv(batch=1)
  holes = jnp.asarray(np.array([1, 1, 0, 1, 0, 0, 1, 1] * 16, bool))[None, None, None]
  got = attention.splash_attention(q, k, v, holes)
  np.testing.assert_allclose(got, attention.einsum_attention(q, k, v, holes), atol=2e-6)


# ----------------------------------------------------------------------------- equivalence

@pytest.mark.parametrize("impl", ["xla", "splash"])
def test_kernels_match_einsum_forward_and_backward(impl):
  """Fails if the kernel's weighted loss or any of its q/k/v gradients differs from the einsum
  path's on padded inputs."""
  q, k, v, mask = _qkv(batch=4)
  want_loss, want_grads = _loss_and_grads(attention.einsum_attention, q, k, v, mask)
  loss, grads = _loss_and_grads(attention.KERNELS[impl], q, k, v, mask)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  for got, want in zip(grads, want_grads):
    np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()))


def test_splash_under_a_mesh_matches_einsum():
  """On 8 devices (data 2, fsdp 2, tensor 2) splash runs per shard in shard_map."""
  config = optim_and_mesh_config()
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  q, k, v, mask = _qkv(batch=4)
  with sharding.activate(mesh, config.logical_axis_rules):
    got = jax.jit(attention.splash_attention)(q, k, v, mask)
    text = jax.jit(attention.splash_attention).lower(q, k, v, mask).as_text()
  assert "shard_map" in text or "sdy.manual_computation" in text
  np.testing.assert_allclose(got, attention.einsum_attention(q, k, v, mask), atol=2e-6)


def optim_and_mesh_config():
  import ml_collections  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict()
  optim_and_mesh.add_sharding(config)
  return config


@functools.partial(jax.jit, static_argnames=("cfg", "deterministic"))
def _pretraining_loss(cfg, params, batch, *, deterministic):
  out = BertForPreTraining(cfg).apply(
      {"params": params}, batch["ids"], batch["mask"], batch["seg"], batch["pos"],
      deterministic=deterministic, rngs={"dropout": jax.random.key(3)})
  return out["mlm_logits"].sum() * 1e-2 + out["nsp_logits"].sum()


def _model_case(length):
  cfg = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=48, max_position_embeddings=length,
                   attention_probs_dropout_prob=0.0)  # the fast recipe
  rng = np.random.default_rng(0)
  mask = np.ones((2, length), np.int32)
  mask[1, length // 3:] = 0
  batch = {"ids": rng.integers(1, 97, (2, length)).astype(np.int32), "mask": mask,
           "seg": (np.arange(length) >= length // 4).astype(np.int32)[None].repeat(2, 0),
           "pos": np.array([[1, 4, 9], [0, 2, 6]], np.int32)}
  shapes = nn.unbox(jax.eval_shape(lambda: BertForPreTraining(cfg).init(
      jax.random.key(0), batch["ids"], batch["mask"], batch["seg"], batch["pos"]))["params"])
  draw = np.random.default_rng(1)
  params = jax.tree.map(lambda s: jnp.asarray(0.05 * draw.standard_normal(s.shape), s.dtype),
                        shapes)
  return cfg, params, batch


# Splash through the whole model, forward and backward, runs in Pallas's interpreter at
# 128 tokens: CI only (the kernel alone, forward and backward, against einsum stays in
# the quick loop: test_kernels_match_einsum_forward_and_backward).
@pytest.mark.parametrize("impl,length", [
    ("xla", 24), pytest.param("splash", 128, marks=pytest.mark.slow)])
def test_model_trains_the_same_through_each_kernel(impl, length, monkeypatch):
  """Training mode (hidden dropout 0.1 on, attention dropout 0): loss and every gradient
  of the whole pretraining model match the einsum path."""
  if impl == "splash":
    monkeypatch.setattr(attention, "platform", lambda: "tpu")  # the kernel runs interpreted
  cfg, params, batch = _model_case(length)
  grad = jax.jit(jax.value_and_grad(_pretraining_loss.__wrapped__, argnums=1),
                 static_argnums=0, static_argnames="deterministic")
  want_loss, want = grad(cfg.replace(attention_impl="einsum"), params, batch, deterministic=False)
  loss, got = grad(cfg.replace(attention_impl=impl), params, batch, deterministic=False)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(want))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * scale), got, want)
  # auto picks this kernel here (xla on CPU, splash on a "TPU") and computes the same.
  auto_loss = _pretraining_loss(cfg.replace(attention_impl="auto"), params, batch,
                                deterministic=False)
  np.testing.assert_allclose(auto_loss, loss, rtol=1e-6)


def test_auto_keeps_the_paper_path_when_probabilities_are_dropped():
  """Fails if `auto` with attention dropout 0.1 gives another loss than einsum with the same
  dropout, or the same loss as einsum with no attention dropout."""
  cfg, params, batch = _model_case(24)
  paper = cfg.replace(attention_probs_dropout_prob=0.1)
  auto = _pretraining_loss(paper.replace(attention_impl="auto"), params, batch,
                           deterministic=False)
  einsum = _pretraining_loss(paper.replace(attention_impl="einsum"), params, batch,
                             deterministic=False)
  assert float(auto) == float(einsum)  # the same path, the same dropout masks
  without = _pretraining_loss(cfg.replace(attention_impl="einsum"), params, batch,
                              deterministic=False)
  assert abs(float(auto) - float(without)) > 1e-6  # the probabilities really were dropped


# ----------------------------------------------------------------------------- choice and refusals

@pytest.mark.parametrize("device,kind,dtype,length,training,rate,want", [
    ("cpu", "cpu", "float32", 128, True, 0.1, "einsum"),
    ("cpu", "cpu", "float32", 128, True, 0.0, "xla"),
    ("cpu", "cpu", "float32", 128, False, 0.1, "xla"),  # evaluation: nothing is dropped
    ("gpu", "NVIDIA H200", "bfloat16", 128, True, 0.0, "cudnn"),
    ("gpu", "NVIDIA H200", "bfloat16", 512, False, 0.1, "cudnn"),
    ("gpu", "NVIDIA H200", "float32", 128, True, 0.0, "xla"),  # cuDNN flash is 16-bit only
    ("gpu", "NVIDIA H200", "bfloat16", 128, True, 0.1, "einsum"),
    ("gpu", "AMD Instinct MI300X", "bfloat16", 128, True, 0.0, "xla"),
    ("tpu", "TPU v5 lite", "bfloat16", 512, True, 0.0, "splash"),
    ("tpu", "TPU v5 lite", "bfloat16", 64, True, 0.0, "xla"),  # not a multiple of 128
    ("tpu", "TPU v5 lite", "bfloat16", 128, True, 0.1, "einsum"),
])
def test_auto_choice(monkeypatch, device, kind, dtype, length, training, rate, want):
  """Fails if `auto` (or None) resolves to another implementation than the table's for this device,
  dtype, length, mode and dropout rate."""
  monkeypatch.setattr(attention, "platform", lambda: device)
  monkeypatch.setattr(attention, "_device_kind", lambda: kind)
  for impl in ("auto", None):
    assert attention.resolve(impl, dtype=jnp.dtype(dtype), head_size=64, dropout_rate=rate,
                             training=training, seq_len=length) == want


@pytest.mark.parametrize("impl,named", [("cudnn", "NVIDIA GPU"), ("splash", "TPU")])
def test_kernels_this_device_lacks_are_refused(impl, named):
  """Fails if asking for a kernel this CPU cannot run does not raise a ValueError naming the device
  it needs and the auto/xla/einsum alternatives."""
  cfg, params, batch = _model_case(24)
  with pytest.raises(ValueError, match=rf"config.model.attention_impl='{impl}' cannot run "
                     rf"here: .*{named}.*'auto'.*'xla'.*'einsum'"):
    _pretraining_loss(cfg.replace(attention_impl=impl), params, batch, deterministic=True)


def test_cudnn_refuses_float32_on_a_gpu(monkeypatch):
  """Fails if cuDNN on a GPU accepts float32, or refuses bfloat16."""
  monkeypatch.setattr(attention, "platform", lambda: "gpu")
  monkeypatch.setattr(attention, "_device_kind", lambda: "NVIDIA H200")
  with pytest.raises(ValueError, match="bfloat16/float16 and config.model.dtype is float32"):
    attention.check("cudnn", dtype=jnp.float32, head_size=64, dropout_rate=0.0, training=True)
  attention.check("cudnn", dtype=jnp.bfloat16, head_size=64, dropout_rate=0.0, training=True)


@pytest.mark.parametrize("impl", attention.FUSED)
def test_fused_kernels_refuse_attention_dropout_in_training(impl):
  """Fails if a fused kernel trains with attention dropout instead of refusing with the rate and
  einsum named, or (xla) refuses the same config in evaluation."""
  cfg, params, batch = _model_case(24)
  paper = cfg.replace(attention_impl=impl, attention_probs_dropout_prob=0.1)
  with pytest.raises(ValueError, match=rf"attention_impl='{impl}' has no dropout.*"
                     "attention_probs_dropout_prob=0.1.*'einsum'"):
    _pretraining_loss(paper, params, batch, deterministic=False)
  if impl == "xla":  # evaluation drops nothing: the same config evaluates fine
    _pretraining_loss(paper, params, batch, deterministic=True)


def test_config_accepts_every_implementation_and_refuses_others():
  """Fails if BertConfig refuses a listed implementation or None, or accepts "flash"."""
  for impl in attention.IMPLEMENTATIONS + (None,):
    BertConfig(attention_impl=impl)
  with pytest.raises(ValueError, match="attention_impl"):
    BertConfig(attention_impl="flash")


@pytest.mark.slow  # the interpreted splash kernel inside a scanned 128-token model, twice
def test_splash_under_scanned_layers(monkeypatch):
  """With scan_layers the splash kernel is built inside nn.scan's traced layer body; a
  kernel cached from one trace and reused in the next leaked that trace's mask tables
  (UnexpectedTracerError at init, which every TPU run of :large would have hit). The
  scanned model must init and give einsum's loss."""
  monkeypatch.setattr(attention, "platform", lambda: "tpu")  # the kernel runs interpreted
  cfg, _, batch = _model_case(128)
  scanned = cfg.replace(scan_layers=True)
  params = nn.unbox(jax.jit(lambda r: BertForPreTraining(scanned.replace(attention_impl="splash"))
                            .init(r, batch["ids"], batch["mask"], batch["seg"],
                                  batch["pos"]))(jax.random.key(0))["params"])
  splash = _pretraining_loss(scanned.replace(attention_impl="splash"), params, batch,
                             deterministic=True)
  einsum = _pretraining_loss(scanned.replace(attention_impl="einsum"), params, batch,
                             deterministic=True)
  np.testing.assert_allclose(splash, einsum, rtol=1e-5)
