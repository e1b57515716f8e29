"""Optimizers for pretraining: optax AdamW / LAMB, warmup + polynomial decay, decay masks.

The update is built from optax pieces in the order google-research/bert uses:
clip the global gradient norm, scale by Adam (or LAMB), add decoupled weight
decay on matrices and embeddings only, then multiply by the learning rate.
"""

from typing import Any, NamedTuple

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import optax

# Substrings of a parameter path that mark it as exempt from weight decay
# (google-research/bert: ["LayerNorm", "layer_norm", "bias"]); "bias" also
# matches the MLM head's "output_bias".
NO_DECAY_SUBSTRINGS = ("layer_norm", "bias")


def learning_rate_schedule(opt_config: ml_collections.ConfigDict,
                           total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to the peak, then polynomial decay to the end value at total_steps.

  With `decay_from_step0` the decay runs over all of total_steps and warmup
  merely overrides its start, as google-research/bert's optimization.py does
  (so the rate just after warmup is peak * (1 - warmup / total)).
  """
  peak = opt_config.learning_rate
  warmup = optax.linear_schedule(0.0, peak, opt_config.warmup_steps)
  if opt_config.decay_from_step0:
    decay = optax.polynomial_schedule(
        init_value=peak, end_value=opt_config.end_learning_rate,
        power=opt_config.decay_power, transition_steps=total_steps)
    return lambda step: jnp.where(step < opt_config.warmup_steps, warmup(step), decay(step))
  decay = optax.polynomial_schedule(
      init_value=peak, end_value=opt_config.end_learning_rate,
      power=opt_config.decay_power,
      transition_steps=max(total_steps - opt_config.warmup_steps, 1))
  return optax.join_schedules([warmup, decay], [opt_config.warmup_steps])


def weight_decay_mask(params: Any) -> Any:
  """Pytree of bools: True where weight decay applies (not LayerNorm, not biases)."""
  def decays(path, _):
    name = "/".join(str(getattr(k, "key", k)) for k in path).lower()
    return not any(s in name for s in NO_DECAY_SUBSTRINGS)
  return jax.tree_util.tree_map_with_path(decays, params)


class ScaleByAdamNoBiasCorrectionState(NamedTuple):
  """First and second moments, as in optax.ScaleByAdamState minus the count."""
  mu: Any
  nu: Any


def scale_by_adam_no_bias_correction(b1: float, b2: float, eps: float
                                     ) -> optax.GradientTransformation:
  """Adam's direction m / (sqrt(v) + eps) without bias correction.

  google-research/bert's AdamWeightDecayOptimizer skips the bias correction
  ("the bias correction is not needed for BERT"); reproducing its runs needs
  the same early-step magnitudes, which optax.scale_by_adam does not offer.
  """
  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p, dtype=jnp.float32)
    return ScaleByAdamNoBiasCorrectionState(mu=jax.tree.map(zeros, params),
                                            nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, ScaleByAdamNoBiasCorrectionState(mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


NAMES = ("adamw", "lamb")


def check_config(opt_config: ml_collections.ConfigDict) -> None:
  """Refuses optimizer settings that cannot train, naming the field.

  Nothing that would silently stop learning gets through: a negative peak
  learning rate (0 is allowed, with a warning: it evaluates a checkpoint),
  betas outside [0, 1), a non-positive eps, negative decay.
  grad_clip_norm 0 means no clipping (optax's clip at 0 would zero every update).
  """
  c = opt_config
  problems = []
  if c.name not in NAMES:
    problems.append(f"name={c.name!r}: expected one of {NAMES}")
  if not c.learning_rate >= 0:
    problems.append(f"learning_rate={c.learning_rate} must be >= 0")
  elif c.learning_rate == 0:  # legitimate (evaluate a checkpoint through a trainer), but say so
    logging.warning("config.optimizer.learning_rate=0: the parameters will not change")
  if not 0 <= c.end_learning_rate <= c.learning_rate:
    problems.append(f"end_learning_rate={c.end_learning_rate} must be in [0, learning_rate]")
  if c.warmup_steps < 0:
    problems.append(f"warmup_steps={c.warmup_steps} must be >= 0")
  if not c.decay_power > 0:
    problems.append(f"decay_power={c.decay_power} must be positive")
  for name in ("b1", "b2"):
    if not 0 <= c[name] < 1:
      problems.append(f"{name}={c[name]} must be in [0, 1)")
  if not c.eps > 0:
    problems.append(f"eps={c.eps} must be positive")
  if c.weight_decay < 0:
    problems.append(f"weight_decay={c.weight_decay} must be >= 0")
  if c.grad_clip_norm is not None and c.grad_clip_norm < 0:
    problems.append(f"grad_clip_norm={c.grad_clip_norm} must be >= 0 (0: no clipping)")
  if c.name == "lamb" and not c.bias_correction:
    problems.append("bias_correction=False is only defined for adamw")
  if problems:
    raise ValueError("config.optimizer." + "; config.optimizer.".join(problems))


def make_optimizer(opt_config: ml_collections.ConfigDict,
                   total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns (optimizer, learning-rate schedule) for `config.optimizer` (checked first)."""
  check_config(opt_config)
  schedule = learning_rate_schedule(opt_config, total_steps)
  # 0 (or None) is "no clipping": optax.clip_by_global_norm(0) would zero every update.
  clip = (optax.clip_by_global_norm(opt_config.grad_clip_norm) if opt_config.grad_clip_norm
          else optax.identity())
  if opt_config.name == "adamw":
    if opt_config.bias_correction:
      adam = optax.scale_by_adam(opt_config.b1, opt_config.b2, opt_config.eps)
    else:
      adam = scale_by_adam_no_bias_correction(opt_config.b1, opt_config.b2, opt_config.eps)
    tx = optax.chain(
        clip, adam,
        optax.add_decayed_weights(opt_config.weight_decay, mask=weight_decay_mask),
        optax.scale_by_learning_rate(schedule))
  else:  # lamb (check_config refused anything else)
    tx = optax.chain(clip, optax.lamb(schedule, opt_config.b1, opt_config.b2, opt_config.eps,
                                      weight_decay=opt_config.weight_decay,
                                      mask=weight_decay_mask))
  return tx, schedule
