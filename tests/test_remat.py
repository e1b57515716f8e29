"""Remat policies (config.model.remat_policy): the same numbers as no rematerialisation,
and each policy really keeps a different set of residuals for the backward pass."""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import config as model_config
from bert_jax.model import encoder as model_lib
from bert_jax.model.encoder import BertConfig
from bert_jax.model.heads import BertForPreTraining
from experiments.benchmarks.pretrain import accelerator

CFG = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=48, max_position_embeddings=24)  # paper dropout: 0.1, 0.1


def _case():
  rng = np.random.default_rng(0)
  mask = np.ones((2, 12), np.int32)
  mask[1, 7:] = 0
  batch = (rng.integers(1, 97, (2, 12)).astype(np.int32), mask,
           (np.arange(12) >= 5).astype(np.int32)[None].repeat(2, 0),
           np.array([[1, 4, 9], [0, 2, 6]], np.int32))
  shapes = nn.unbox(jax.eval_shape(lambda: BertForPreTraining(CFG).init(
      jax.random.key(0), *batch))["params"])
  params = jax.tree.map(lambda s: jnp.asarray(0.05 * rng.standard_normal(s.shape), s.dtype),
                        shapes)
  return params, batch


def _loss(params, batch, cfg):
  # Dropout on (training): remat must replay the very masks of the forward pass. The rbg
  # generator's masks must be replayed just as threefry's; its program compiles in about
  # half the time on CPU (threefry's hash is unrolled into every dropout).
  out = BertForPreTraining(cfg).apply({"params": params}, *batch, deterministic=False,
                                      rngs={"dropout": jax.random.key(5, impl="rbg")})
  return out["mlm_logits"].sum() * 1e-2 + out["nsp_logits"].sum()


def _activation_residuals(params, batch, cfg) -> list[tuple[int, str]]:
  """(bytes, description) of what the backward pass keeps, parameters and constants aside."""
  return accelerator.saved_activations(functools.partial(_loss, cfg=cfg), params, batch)


@pytest.fixture(scope="module")
def no_remat_gradient():
  """The case, the jitted gradient, and its loss and gradients without remat: compiled once
  for every policy below (each policy then compiles only its own program)."""
  params, batch = _case()
  grad = jax.jit(jax.value_and_grad(_loss), static_argnums=2)
  return params, batch, grad, grad(params, batch, CFG)


# Each policy compiles the model's gradient: the quick loop keeps the project's own named
# policy, CI runs the other three.
@pytest.mark.parametrize("policy", [
    p if p == "save_qkv_out_proj" else pytest.param(p, marks=pytest.mark.slow)
    for p in model_lib.REMAT_POLICIES if p != "none"])
def test_policies_give_the_same_loss_and_gradients(policy, no_remat_gradient):
  """Fails if a policy changes the numbers (e.g. a replay with other dropout masks), or if
  remat is not on at all: the traced program must hold one remat per layer."""
  params, batch, grad, (want_loss, want) = no_remat_gradient
  jaxpr = lambda cfg: str(jax.make_jaxpr(_loss, static_argnums=2)(params, batch, cfg))
  assert jaxpr(CFG.replace(remat_policy=policy)).count("remat2[") == CFG.num_hidden_layers
  assert "remat2[" not in jaxpr(CFG)
  loss, got = grad(params, batch, CFG.replace(remat_policy=policy))
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  # Within 1e-5 of the largest gradient: remat changes fusion (rounding), not maths; a
  # replay with other dropout masks would be off by O(1) of it.
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(want))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * scale), got, want)


def test_scanned_layers_take_the_policy_too():
  """Fails if save_qkv_out_proj under scanned layers changes the loss, does not keep less than no
  remat and more than full, or keeps other than q, k, v and the attention output beyond full."""
  params, batch = _case()
  stacked = dict(params, bert=model_lib.stack_layers(params["bert"], CFG.num_hidden_layers))
  scanned = CFG.replace(scan_layers=True)
  want = jax.jit(_loss, static_argnums=2)(stacked, batch, scanned)
  got = jax.jit(_loss, static_argnums=2)(stacked, batch,
                                         scanned.replace(remat_policy="save_qkv_out_proj"))
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # Under scan the residuals are the loop's stacked [L, ...] outputs, unnamed: compare sizes.
  nbytes = {p: sum(b for b, _ in _activation_residuals(stacked, batch,
                                                        scanned.replace(remat_policy=p)))
            for p in ("none", "save_qkv_out_proj", "full")}
  assert nbytes["none"] > nbytes["save_qkv_out_proj"] > nbytes["full"], nbytes
  # What the named policy adds to "full": q, k, v [L,B,T,N,D] and the output [L,B,T,H].
  c = CFG
  added = 4 * c.num_hidden_layers * 2 * 12 * c.hidden_size * 4  # float32 bytes
  assert nbytes["save_qkv_out_proj"] - nbytes["full"] == added, nbytes


def test_policies_keep_different_residuals():
  """Fails if the policies' kept residual bytes are not strictly ordered none > dots_saveable >
  dots_with_no_batch_dims_saveable > save_qkv_out_proj > full, the named policy keeps other than the
  four projections per layer, or full keeps a named one."""
  params, batch = _case()
  kept = {p: _activation_residuals(params, batch, CFG.replace(remat_policy=p))
          for p in model_lib.REMAT_POLICIES}
  nbytes = {p: sum(b for b, _ in rows) for p, rows in kept.items()}
  # Less is kept as the policy saves less: everything > every matmul > the dense
  # projections only > the four named projections > nothing but the layer inputs.
  order = ["none", "dots_saveable", "dots_with_no_batch_dims_saveable", "save_qkv_out_proj",
           "full"]
  assert [nbytes[p] for p in order] == sorted(nbytes.values(), reverse=True), nbytes
  assert len(set(nbytes.values())) == len(order), nbytes
  # The named policy keeps exactly q, k, v and the attention output of every layer.
  named = sorted(re.search(r"named '(\w+)'", d).group(1)
                 for _, d in kept["save_qkv_out_proj"] if "named" in d)
  assert named == sorted(model_config.PROJECTION_NAMES * CFG.num_hidden_layers)
  assert not any("named" in d for _, d in kept["full"])


def test_older_remat_switch_reads_as_full():
  """Fails if remat=True does not read as the "full" policy (or its absence as "none"), remat=True
  with another policy is not refused as a contradiction, or an unknown policy is accepted."""
  assert CFG.replace(remat=True).effective_remat_policy == "full"
  assert CFG.effective_remat_policy == "none"
  assert CFG.replace(remat=True, remat_policy="full").effective_remat_policy == "full"
  with pytest.raises(ValueError, match="remat=True .* contradicts remat_policy='dots_saveable'"):
    CFG.replace(remat=True, remat_policy="dots_saveable")
  with pytest.raises(ValueError, match="remat_policy must be one of"):
    CFG.replace(remat_policy="everything")
