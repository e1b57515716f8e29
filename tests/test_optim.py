"""Tests for bert_jax.optim: decay mask, schedules, google-research Adam, AdamW, LAMB."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import optim
from experiments.configs import pretrain


def _params(seed=0):
  """A small tree with the names of the real parameter tree (see the contracts)."""
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
  return {
      "bert": {
          "embeddings": {"word_embeddings": {"embedding": f(11, 4)},
                         "layer_norm": {"scale": f(4), "bias": f(4)}},
          "encoder": {"layer_0": {"attention": {"query": {"kernel": f(4, 2, 2), "bias": f(2, 2)}},
                                  "output_layer_norm": {"scale": f(4), "bias": f(4)}}},
      },
      "mlm_head": {"transform": {"kernel": f(4, 4), "bias": f(4)}, "output_bias": f(11)},
  }


def _opt_config(**overrides):
  config = pretrain.get_config("tiny").optimizer
  config.update(overrides)
  return config


def test_weight_decay_mask_spares_layer_norm_and_biases():
  mask = optim.weight_decay_mask(_params())
  assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert mask["bert"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert mask["mlm_head"]["transform"]["kernel"]
  assert not mask["bert"]["embeddings"]["layer_norm"]["scale"]
  assert not mask["bert"]["encoder"]["layer_0"]["output_layer_norm"]["bias"]
  assert not mask["bert"]["encoder"]["layer_0"]["attention"]["query"]["bias"]
  assert not mask["mlm_head"]["output_bias"]


def test_schedule_warmup_then_linear_decay():
  schedule = optim.learning_rate_schedule(
      _opt_config(learning_rate=1.0, warmup_steps=10, end_learning_rate=0.0), total_steps=110)
  np.testing.assert_allclose([schedule(s) for s in (0, 5, 10, 60, 110)],
                             [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)


def test_schedule_polynomial_power_and_google_variant():
  schedule = optim.learning_rate_schedule(
      _opt_config(learning_rate=1.0, warmup_steps=0, decay_power=2.0), total_steps=100)
  np.testing.assert_allclose(schedule(50), 0.25, atol=1e-6)
  google = optim.learning_rate_schedule(
      _opt_config(learning_rate=1.0, warmup_steps=10, decay_from_step0=True), total_steps=100)
  np.testing.assert_allclose([google(5), google(10), google(50)], [0.5, 0.9, 0.5], atol=1e-6)


def _google_bert_reference(params, grads_seq, lr_fn, wd, b1=0.9, b2=0.999, eps=1e-6, clip=1.0):
  """NumPy transcription of google-research/bert optimization.py (AdamWeightDecayOptimizer)."""
  params = jax.tree.map(lambda p: np.asarray(p, np.float64), params)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  decay = optim.weight_decay_mask(params)
  for step, grads in enumerate(grads_seq):
    grads = jax.tree.map(lambda g: np.asarray(g, np.float64), grads)
    norm = np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * clip / max(norm, clip), grads)  # tf.clip_by_global_norm
    lr = lr_fn(step)
    m = jax.tree.map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
    def update(p, m_, v_, d):
      u = m_ / (np.sqrt(v_) + eps)
      if d:
        u = u + wd * p
      return p - lr * u
    params = jax.tree.map(update, params, m, v, decay)
  return params


def test_no_bias_correction_matches_google_research_update_rule():
  config = _opt_config(learning_rate=0.1, warmup_steps=2, weight_decay=0.01,
                       bias_correction=False, decay_from_step0=True)
  tx, schedule = optim.make_optimizer(config, total_steps=6)
  params = _params()
  rng = np.random.default_rng(1)
  # Gradients large enough that clipping is active on some steps.
  grads_seq = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * s, jnp.float32), params)
               for s in (0.01, 2.0, 0.1, 1.0, 0.05)]
  state = tx.init(params)
  ours = params
  for grads in grads_seq:
    updates, state = tx.update(grads, state, ours)
    ours = optax.apply_updates(ours, updates)
  expected = _google_bert_reference(params, grads_seq, lambda s: float(schedule(s)), wd=0.01)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6), ours, expected)
  # And it really differs from bias-corrected Adam (whose first step is ~sign(g), ~3x larger).
  no_bc = optim.scale_by_adam_no_bias_correction(0.9, 0.999, 1e-6)
  bc = optax.scale_by_adam(0.9, 0.999, 1e-6)
  first, _ = no_bc.update(grads_seq[1], no_bc.init(params))
  first_bc, _ = bc.update(grads_seq[1], bc.init(params))
  ratio = jax.tree.leaves(first_bc)[0] / jax.tree.leaves(first)[0]
  np.testing.assert_allclose(ratio, np.sqrt(1 - 0.999) / (1 - 0.9), rtol=1e-3)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_matches_optax_reference_chain(name):
  config = _opt_config(name=name, learning_rate=0.01, warmup_steps=3, weight_decay=0.1)
  tx, schedule = optim.make_optimizer(config, total_steps=10)
  if name == "adamw":
    core = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.1,
                       mask=optim.weight_decay_mask)
  else:
    core = optax.lamb(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.1,
                      mask=optim.weight_decay_mask)
  reference = optax.chain(optax.clip_by_global_norm(1.0), core)
  params = ref_params = _params()
  state, ref_state = tx.init(params), reference.init(params)
  rng = np.random.default_rng(2)
  for _ in range(5):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    ref_updates, ref_state = reference.update(grads, ref_state, ref_params)
    ref_params = optax.apply_updates(ref_params, ref_updates)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), params, ref_params)


def test_unknown_optimizer_is_refused():
  with pytest.raises(ValueError, match="config.optimizer.name"):
    optim.make_optimizer(_opt_config(name="sgd"), total_steps=10)


def test_clip_norm_zero_means_no_clipping():
  """optax.clip_by_global_norm(0) zeroes every update; 0 here means "do not clip"."""
  config = _opt_config(learning_rate=0.01, warmup_steps=0, grad_clip_norm=0.0, weight_decay=0.0)
  tx, _ = optim.make_optimizer(config, total_steps=10)
  unclipped = optax.adamw(0.01, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0)
  params = _params()
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 100.0, jnp.float32), params)  # norm >> 1
  updates, _ = tx.update(grads, tx.init(params), params)
  expected, _ = unclipped.update(grads, unclipped.init(params), params)
  assert all(float(jnp.abs(u).max()) > 0 for u in jax.tree.leaves(updates))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, expected)


@pytest.mark.parametrize("field,value,message", [
    ("learning_rate", -1e-4, "learning_rate=-0.0001 must be >= 0"),
    ("b1", 1.0, "b1=1.0 must be in [0, 1)"),
    ("b2", -0.1, "b2=-0.1 must be in [0, 1)"),
    ("eps", 0.0, "eps=0.0 must be positive"),
    ("weight_decay", -0.01, "weight_decay=-0.01 must be >= 0"),
    ("grad_clip_norm", -1.0, "grad_clip_norm=-1.0 must be >= 0 (0: no clipping)"),
    ("warmup_steps", -5, "warmup_steps=-5 must be >= 0"),
])
def test_impossible_optimizer_values_are_refused_by_name(field, value, message):
  with pytest.raises(ValueError, match=re.escape(f"config.optimizer.{message}")):
    optim.make_optimizer(_opt_config(**{field: value}), total_steps=10)
