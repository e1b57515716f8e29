"""Tests for bert_jax.training.optim: decay mask, schedules, google-research Adam, AdamW, LAMB.

Every optimizer is checked against a NumPy transcription of its published update rule
(_numpy_reference), with a decay mask written by hand: never against optax's own chain.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
import optax
import pytest

from bert_jax.model.encoder import BertConfig
from bert_jax.model.heads import BertForPreTraining
from bert_jax.training import optim
from bert_jax.training import schedules
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
  """Fails if the weight-decay mask leaves out an embedding table or a kernel, or includes a
  LayerNorm parameter or a bias."""
  mask = optim.weight_decay_mask(_params())
  assert mask["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert mask["bert"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert mask["mlm_head"]["transform"]["kernel"]
  assert not mask["bert"]["embeddings"]["layer_norm"]["scale"]
  assert not mask["bert"]["encoder"]["layer_0"]["output_layer_norm"]["bias"]
  assert not mask["bert"]["encoder"]["layer_0"]["attention"]["query"]["bias"]
  assert not mask["mlm_head"]["output_bias"]


def test_schedule_warmup_then_linear_decay():
  """Fails if the schedule is not 0 at step 0, linear to the peak at the end of warmup, and linear
  down to the end rate at the last step."""
  schedule = schedules.learning_rate_schedule(
      _opt_config(learning_rate=1.0, warmup_steps=10, end_learning_rate=0.0), total_steps=110)
  np.testing.assert_allclose([schedule(s) for s in (0, 5, 10, 60, 110)],
                             [0.0, 0.5, 1.0, 0.5, 0.0], atol=1e-6)


def test_schedule_polynomial_power_and_google_variant():
  """Fails if decay power 2 is not 0.25 halfway, or google-research's variant (decay counted from
  step 0, under the warmup) gives other rates at steps 5, 10 and 50."""
  schedule = schedules.learning_rate_schedule(
      _opt_config(learning_rate=1.0, warmup_steps=0, decay_power=2.0), total_steps=100)
  np.testing.assert_allclose(schedule(50), 0.25, atol=1e-6)
  google = schedules.learning_rate_schedule(
      _opt_config(learning_rate=1.0, warmup_steps=10, decay_from_step0=True), total_steps=100)
  np.testing.assert_allclose([google(5), google(10), google(50)], [0.5, 0.9, 0.5], atol=1e-6)


# Which leaves of _params() decay, written out by hand (not derived from optim's rule):
# google-research/bert decays every matrix and embedding table and no LayerNorm
# parameter or bias.
_DECAYED = {"bert/embeddings/word_embeddings/embedding",
            "bert/encoder/layer_0/attention/query/kernel", "mlm_head/transform/kernel"}


def _decays_by_hand(params):
  return jax.tree_util.tree_map_with_path(
      lambda path, _: "/".join(k.key for k in path) in _DECAYED, params)


@pytest.mark.parametrize("architecture", ["bert", "modernbert"])
def test_weight_decay_mask_on_the_real_parameter_tree(architecture):
  """On BertForPreTraining's own tree (BERT's with ALBERT's projection; the modern encoder's
  with its norms named norm / attention_norm / mlp_norm / final_norm and an untied decoder),
  exactly the kernels, embedding tables and decoder matrix decay. Fails if a norm's scale, a
  bias or output_bias decays, or a matrix does not."""
  if architecture == "bert":
    cfg = BertConfig(vocab_size=11, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=16, max_position_embeddings=8, embedding_size=4)
  else:
    cfg = BertConfig.from_size("modernbert-tiny", vocab_size=11, hidden_size=8,
                               num_attention_heads=2, intermediate_size=16,
                               tie_word_embeddings=False)
  ids = jax.ShapeDtypeStruct((1, 4), np.int32)
  shapes = jax.eval_shape(lambda i: BertForPreTraining(cfg, nsp_head=architecture == "bert").init(
      jax.random.key(0), i, i, i, i[:, :2]), ids)["params"]
  mask = optim.weight_decay_mask(nn.unbox(shapes))
  flat = {"/".join(k.key for k in path): v
          for path, v in jax.tree_util.tree_leaves_with_path(mask)}
  leaf = lambda name: name.rsplit("/", 1)[1]
  matrices = ("kernel", "embedding", "decoder")
  assert {n for n, d in flat.items() if d} == {n for n in flat if leaf(n) in matrices}
  if architecture == "bert":
    assert {leaf(n) for n in flat} == {"kernel", "embedding", "bias", "scale", "output_bias"}
    assert "bert/embeddings/projection/kernel" in flat and "nsp_head/kernel" in flat
  else:
    assert {leaf(n) for n in flat} == {"kernel", "embedding", "scale", "output_bias", "decoder"}
    assert {n.split("/")[-2] for n in flat if leaf(n) == "scale"} == {
        "norm", "attention_norm", "mlp_norm", "final_norm", "layer_norm"}


def _lr_by_hand(step, peak, warmup, total, google):
  """Linear warmup, then linear decay to 0 (over total - warmup steps, or from step 0 in
  google-research/bert's optimization.py, where warmup only overrides the start)."""
  if step < warmup:
    return peak * step / warmup
  if google:
    return peak * (1 - step / total)
  return peak * (1 - (step - warmup) / (total - warmup))


def _numpy_reference(params, grads_seq, lr_fn, *, name, bias_correction, weight_decay, clip,
                     decays, b1=0.9, b2=0.999, eps=1e-6):
  """The update rules transcribed in NumPy float64, leaf by leaf:

  clip: g *= clip / max(|g|_global, clip) (tf.clip_by_global_norm; clip 0 = none);
  Adam: m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2, and with bias correction (Kingma & Ba)
    m /= 1 - b1^t, v /= 1 - b2^t; r = m / (sqrt(v) + eps);
  decoupled decay (Loshchilov & Hutter; google-research's AdamWeightDecayOptimizer, which
    skips the bias correction): u = r + wd p where `decays`;
  LAMB (You et al. 2019, Algorithm 2, per parameter array): u *= |p| / |u| (1 if either is 0);
  step: p -= lr(t - 1) u.
  """
  f64 = lambda tree: jax.tree.map(lambda x: np.asarray(x, np.float64), tree)
  params = f64(params)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  for step, grads in enumerate(grads_seq):
    grads = f64(grads)
    if clip:
      norm = np.sqrt(sum(np.sum(g * g) for g in jax.tree.leaves(grads)))
      grads = jax.tree.map(lambda g: g * clip / max(norm, clip), grads)
    t = step + 1
    m = jax.tree.map(lambda m_, g: b1 * m_ + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, v, grads)
    def update(p, m_, v_, d):
      if bias_correction:
        m_, v_ = m_ / (1 - b1 ** t), v_ / (1 - b2 ** t)
      u = m_ / (np.sqrt(v_) + eps)
      if d:
        u = u + weight_decay * p
      if name == "lamb":
        p_norm, u_norm = np.linalg.norm(p), np.linalg.norm(u)
        u = u * (p_norm / u_norm if p_norm > 0 and u_norm > 0 else 1.0)
      return p - lr_fn(step) * u
    params = jax.tree.map(update, params, m, v, decays)
  return params


def _six_steps(tx, params, seed: int):
  """(the gradients, the params after) of six updates of `tx` on random gradients whose
  scale jumps between steps (global norms from ~0.04 to ~8)."""
  rng = np.random.default_rng(seed)
  grads_seq = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * s, jnp.float32),
                            params) for s in (0.01, 2.0, 0.1, 1.0, 0.05, 0.5)]
  state, ours = tx.init(params), params
  for grads in grads_seq:
    updates, state = tx.update(grads, state, ours)
    ours = optax.apply_updates(ours, updates)
  return grads_seq, ours


# (optimizer, bias correction, global-norm clip, weight decay, google-research schedule)
_CASES = {
    "adamw": ("adamw", True, 1.0, 0.1, False),
    "adamw_google_research": ("adamw", False, 1.0, 0.01, True),
    "adamw_no_clip": ("adamw", True, 0.0, 0.1, False),  # 0 = no clipping, not "clip to 0"
    "adamw_no_decay": ("adamw", True, 1.0, 0.0, False),
    "lamb": ("lamb", True, 1.0, 0.1, False),
    "lamb_no_clip_no_decay": ("lamb", True, 0.0, 0.0, False),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_optimizer_matches_a_numpy_transcription_of_its_update_rule(case):
  """Six steps of make_optimizer against _numpy_reference (float64), with the decay mask
  written by hand. Fails on a wrong moment, bias correction, eps placement, clipping,
  decay coupling or mask, trust ratio or schedule (the last asserts show the mask, the
  bias correction and the clip each move the result past the tolerance)."""
  name, bias_correction, clip, wd, google = _CASES[case]
  peak, warmup, total = 0.05, 2, 8
  config = _opt_config(name=name, learning_rate=peak, warmup_steps=warmup, weight_decay=wd,
                       bias_correction=bias_correction, grad_clip_norm=clip,
                       decay_from_step0=google)
  tx, _ = optim.make_optimizer(config, total_steps=total)
  params = _params()
  # Global norms from ~0.04 to ~8: clipping at 1 is active on some steps and not others.
  grads_seq, ours = _six_steps(tx, params, seed=1)

  lr = lambda step: _lr_by_hand(step, peak, warmup, total, google)
  def reference(**changes):
    kw = dict(name=name, bias_correction=bias_correction, weight_decay=wd, clip=clip,
              decays=_decays_by_hand(params))
    return _numpy_reference(params, grads_seq, lr, **{**kw, **changes})
  close = lambda a, b: all(np.allclose(x, y, rtol=2e-5, atol=1e-6)
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6),
               ours, reference())
  # The tolerance is tight enough to see each ingredient.
  if wd:
    assert not close(ours, reference(decays=jax.tree.map(lambda _: True, params)))
  if name == "adamw":
    assert not close(ours, reference(bias_correction=not bias_correction))
  assert not close(ours, reference(clip=0.5 if clip else 1.0))


def test_no_bias_correction_first_step_is_not_sign_of_the_gradient():
  """google-research's Adam (no bias correction) takes a first step (1-b1)/sqrt(1-b2) ~ 3.16
  times bias-corrected Adam's (~sign(g)), i.e. bias-corrected / uncorrected ~ 0.32; fails if
  the two transforms were the same."""
  params = _params()
  grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.3, jnp.float32), params)
  no_bc = optim.scale_by_adam_no_bias_correction(0.9, 0.999, 1e-6)
  bc = optax.scale_by_adam(0.9, 0.999, 1e-6)
  first, _ = no_bc.update(grads, no_bc.init(params))
  first_bc, _ = bc.update(grads, bc.init(params))
  ratio = jax.tree.leaves(first_bc)[0] / jax.tree.leaves(first)[0]
  np.testing.assert_allclose(ratio, np.sqrt(1 - 0.999) / (1 - 0.9), rtol=1e-3)


def test_unknown_optimizer_is_refused():
  """Fails if an unknown optimizer name ("sgd") is accepted, or refused without naming
  config.optimizer.name."""
  with pytest.raises(ValueError, match="config.optimizer.name"):
    optim.make_optimizer(_opt_config(name="sgd"), total_steps=10)


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
  """Fails if this impossible optimizer value is accepted, or refused without the field, its value
  and the allowed range."""
  with pytest.raises(ValueError, match=re.escape(f"config.optimizer.{message}")):
    optim.make_optimizer(_opt_config(**{field: value}), total_steps=10)


def _optimi_stableadamw(params, grads_seq, lr_fn, *, weight_decay, decays, b1, b2, eps,
                        max_lr=None):
  """optimi's StableAdamW (optimi/stableadamw.py, foreach=False, kahan_sum=False) transcribed
  in NumPy float64, tensor by tensor, in its own terms: debiased betas
  b_hat(t) = (b^t - b) / (b^t - 1) for both moments, exp_avg_sq updated first, then
    rms = sqrt(mean(g^2 / max(exp_avg_sq, eps^2))), lr_t = lr / max(1, rms),
    p *= 1 - lr_t wd             (or 1 - lr_t / max_lr wd: decouple_lr, "fully decoupled"),
    exp_avg = lerp(exp_avg, g, 1 - b1_hat), p -= lr_t exp_avg / (sqrt(exp_avg_sq) + eps)."""
  f64 = lambda tree: jax.tree.map(lambda x: np.asarray(x, np.float64), tree)
  params = f64(params)
  m = jax.tree.map(np.zeros_like, params)
  v = jax.tree.map(np.zeros_like, params)
  debias = lambda beta, t: (beta ** t - beta) / (beta ** t - 1)
  for step, grads in enumerate(grads_seq):
    grads, t = f64(grads), step + 1
    b1_hat, b2_hat = debias(b1, t), debias(b2, t)

    def update(p, m_, v_, g, d):
      v_ = b2_hat * v_ + (1 - b2_hat) * g * g
      rms = np.sqrt(np.mean(g * g / np.maximum(v_, eps * eps)))
      lr = lr_fn(step) / max(1.0, rms)
      if d and weight_decay:
        p = p * (1 - (lr / max_lr if max_lr else lr) * weight_decay)
      m_ = m_ + (g - m_) * (1 - b1_hat)
      return p - lr * m_ / (np.sqrt(v_) + eps), m_, v_
    out = jax.tree.map(update, params, m, v, grads, decays)
    is_triple = lambda x: isinstance(x, tuple)
    params, m, v = (jax.tree.map(lambda o, i=i: o[i], out, is_leaf=is_triple) for i in range(3))
  return params


@pytest.mark.parametrize("fully_decoupled", [False, True])
def test_stableadamw_matches_optimis_update(fully_decoupled):
  """Six steps of make_optimizer("stableadamw") against _optimi_stableadamw (float64), under
  a WSD schedule. Fails on a wrong moment or debiasing, eps placement, the update clipping
  (per tensor, on the decay too), the decay's coupling or its mask; the last asserts show the
  clipping bites on these gradients (jumps of 200x) and the decay is seen."""
  peak, b1, b2, eps, wd = 0.05, 0.9, 0.98, 1e-6, 0.1
  config = _opt_config(name="stableadamw", learning_rate=peak, warmup_steps=2, b2=b2, eps=eps,
                       weight_decay=wd, grad_clip_norm=0.0, schedule="wsd", decay_steps=3,
                       decay_shape="1-sqrt", fully_decoupled_weight_decay=fully_decoupled)
  tx, schedule = optim.make_optimizer(config, total_steps=6)
  params = _params()
  grads_seq, ours = _six_steps(tx, params, seed=2)

  def reference(**changes):
    kw = dict(weight_decay=wd, decays=_decays_by_hand(params), b1=b1, b2=b2, eps=eps,
              max_lr=peak if fully_decoupled else None)
    return _optimi_stableadamw(params, grads_seq, lambda s: float(schedule(s)),
                               **{**kw, **changes})
  close = lambda a, b: all(np.allclose(x, y, rtol=2e-5, atol=1e-6)
                           for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6),
               ours, reference())
  assert not close(ours, reference(eps=1e3))  # rms ~ 0: no clipping at all
  assert not close(ours, reference(weight_decay=0.0))
  assert not close(ours, reference(max_lr=None if fully_decoupled else peak / 2))


@pytest.mark.parametrize("shape", ["linear", "1-sqrt", "cosine"])
def test_wsd_is_transformers_get_wsd_schedule(shape):
  """Fails if config.optimizer.schedule "wsd" differs, at any step of a run (warmup, stable,
  decay, after the end), from transformers' get_wsd_schedule with the same warmup, decay
  length, decay type and minimum ratio."""
  import torch  # test-only: the reference schedule is a torch LambdaLR
  import transformers
  peak, end, warmup, decay, total = 2e-3, 2e-4, 7, 11, 40
  config = _opt_config(learning_rate=peak, warmup_steps=warmup, schedule="wsd",
                       decay_steps=decay, decay_shape=shape, end_learning_rate=end)
  _, ours = optim.make_optimizer(config, total_steps=total)
  opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak)
  reference = transformers.get_wsd_schedule(
      opt, num_warmup_steps=warmup, num_decay_steps=decay, num_training_steps=total,
      decay_type=shape, min_lr_ratio=end / peak)
  expected = []
  for _ in range(total + 3):
    expected.append(opt.param_groups[0]["lr"])
    opt.step()
    reference.step()
  np.testing.assert_allclose([float(ours(s)) for s in range(total + 3)], expected,
                             rtol=1e-6, atol=1e-12)
  assert float(ours(total - decay - 1)) == pytest.approx(peak)  # the stable part is held


@pytest.mark.parametrize("changes,message", [
    (dict(schedule="cosine"), "schedule='cosine': expected one of"),
    (dict(schedule="wsd", decay_shape="exp"), "decay_shape='exp': expected one of"),
    (dict(schedule="wsd", decay_steps=8), "warmup_steps=3 + decay_steps=8 exceed the run's 10"),
    (dict(name="lamb", fully_decoupled_weight_decay=True), "fully_decoupled_weight_decay"),
    (dict(name="stableadamw", bias_correction=False), "bias_correction=False is only defined"),
])
def test_impossible_schedules_and_optimizer_pairs_are_refused(changes, message):
  """Fails if this schedule or optimizer setting, which cannot mean what it says, is accepted
  or refused without naming it."""
  with pytest.raises(ValueError, match=re.escape(message)):
    optim.make_optimizer(_opt_config(warmup_steps=3, **changes), total_steps=10)
