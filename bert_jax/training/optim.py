"""Optimizers: optax AdamW / LAMB / StableAdamW, their decay masks; schedules.py the rates.

The update is built from optax pieces in the order google-research/bert uses:
clip the global gradient norm, scale by Adam (or LAMB), add decoupled weight
decay on matrices and embeddings only, then multiply by the learning rate.

StableAdamW (Wortsman et al. 2023, as optimi and ModernBERT define it) is AdamW whose
step on each tensor is divided by max(1, RMS(g^2 / max(v, eps^2))), v the bias-corrected
second moment including this step's gradient: a tensor whose gradient jumps past what v
has seen gets a smaller step (the decay with it, as optimi's lr is divided), instead of
a global gradient-norm clip. tests/test_optim.py checks it against a NumPy transcription
of optimi's update.
"""

from typing import Any, NamedTuple, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax.training import schedules
from host import fields

# Substrings of a parameter path that mark it as exempt from weight decay
# (google-research/bert: ["LayerNorm", "layer_norm", "bias"]); "bias" also
# matches the MLM head's "output_bias", "norm" the modern encoder's norms (norm,
# attention_norm, mlp_norm, final_norm: ModernBERT decays neither norms nor biases).
NO_DECAY_SUBSTRINGS = ("norm", "bias")


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


class StableAdamState(NamedTuple):
  """optax.scale_by_adam's state (moments and count)."""
  adam: optax.ScaleByAdamState


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float,
                         mask: Any) -> optax.GradientTransformation:
  """StableAdamW's direction (module docstring): Adam's m / (sqrt(v) + eps) plus the decay,
  per tensor divided by max(1, RMS(g^2 / max(v, eps^2)))."""
  adam = optax.scale_by_adam(b1, b2, eps)
  decay = optax.add_decayed_weights(weight_decay, mask=mask)

  def init_fn(params):
    return StableAdamState(adam=adam.init(params))

  def update_fn(updates, state, params=None):
    grads = updates
    direction, adam_state = adam.update(grads, state.adam, params)
    nu_hat = optax.tree.bias_correction(adam_state.nu, b2, adam_state.count)
    direction, _ = decay.update(direction, decay.init(params), params)

    def clipped(u, g, v):
      ratio = jnp.square(g.astype(jnp.float32)) / jnp.maximum(v, eps * eps)
      return u / jnp.maximum(1.0, jnp.sqrt(jnp.mean(ratio)))
    return jax.tree.map(clipped, direction, grads, nu_hat), StableAdamState(adam=adam_state)

  return optax.GradientTransformation(init_fn, update_fn)


NAMES = ("adamw", "lamb", "stableadamw")

# The domain of each config.optimizer field, declared once as data (host/fields.py): a new
# field adds a row here, and its refusal reads like every other's. In the order the
# refusal lists them; what depends on another field's meaning (not just its value) is
# code in check_config, right after.
RULES = {
    "name": fields.known(NAMES),
    "learning_rate": fields.at_least(0),  # 0 is allowed, with a warning (check_config)
    "end_learning_rate": fields.in_range(0, "learning_rate"),
    "warmup_steps": fields.at_least(0),
    "decay_power": fields.greater_than(0),
    "b1": fields.in_range(0, 1, "[)"),
    "b2": fields.in_range(0, 1, "[)"),
    "eps": fields.greater_than(0),
    "weight_decay": fields.at_least(0),
    # 0 or None: no clipping (optax's clip at 0 would zero every update).
    "grad_clip_norm": fields.optional(fields.at_least(0, says="must be >= 0 (0: no clipping)")),
    "schedule": fields.known(schedules.SCHEDULES),
}
# The fields only schedule "wsd" reads.
WSD_RULES = {
    "decay_shape": fields.known(schedules.DECAY_SHAPES),
    "decay_steps": fields.at_least(0),
}


def check_config(opt_config: ml_collections.ConfigDict) -> None:
  """Refuses optimizer settings that cannot train, naming every wrong field in one line.

  Nothing that would silently stop learning gets through (RULES): a negative peak
  learning rate (0 is allowed, with a warning: it evaluates a checkpoint), betas outside
  [0, 1), a non-positive eps, negative decay; then the options one optimizer or schedule
  alone defines.
  """
  c = opt_config
  problems = fields.problems(c, RULES)
  if c.name != "adamw" and not c.bias_correction:
    problems.append(f"bias_correction=False is only defined for adamw, not {c.name}")
  if c.fully_decoupled_weight_decay and c.name == "lamb":
    problems.append("fully_decoupled_weight_decay is defined for adamw and stableadamw")
  if c.schedule == "wsd":
    problems += fields.problems(c, WSD_RULES)
    if c.decay_from_step0:
      problems.append("decay_from_step0 is the polynomial schedule's (google-research/bert)")
  if c.learning_rate == 0:  # legitimate (evaluate a checkpoint through a trainer), but say so
    logging.warning("config.optimizer.learning_rate=0: the parameters will not change")
  if problems:
    raise ValueError("config.optimizer." + "; config.optimizer.".join(problems))


def make_optimizer(opt_config: ml_collections.ConfigDict, total_steps: int,
                   segments: Sequence[tuple[int, float, str]] | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """Returns (optimizer, learning-rate schedule) for `config.optimizer` (checked first);
  schedule "phases" takes the run's `segments` (bert_jax.pretrain.phases.lr_segments)."""
  check_config(opt_config)
  if opt_config.schedule == "phases" and not segments:
    raise ValueError("config.optimizer.schedule='phases' needs config.phases (a pretraining "
                     "run's list of phases)")
  if opt_config.schedule == "wsd" and (opt_config.warmup_steps + opt_config.decay_steps
                                       > total_steps):
    raise ValueError(f"config.optimizer.warmup_steps={opt_config.warmup_steps} + decay_steps="
                     f"{opt_config.decay_steps} exceed the run's {total_steps} steps")
  schedule = schedules.learning_rate_schedule(opt_config, total_steps, segments)
  # 0 (or None) is "no clipping": optax.clip_by_global_norm(0) would zero every update.
  clip = (optax.clip_by_global_norm(opt_config.grad_clip_norm) if opt_config.grad_clip_norm
          else optax.identity())
  weight_decay = opt_config.weight_decay
  if opt_config.fully_decoupled_weight_decay:
    # Decay by weight_decay x lr / peak per step (optimi's decouple_lr, composer's
    # DecoupledAdamW, ModernBERT): the same as decay weight_decay / peak times the lr.
    weight_decay = weight_decay / opt_config.learning_rate if opt_config.learning_rate else 0.0
  if opt_config.name == "lamb":  # (check_config refused anything unknown)
    return optax.chain(clip, optax.lamb(schedule, opt_config.b1, opt_config.b2, opt_config.eps,
                                        weight_decay=weight_decay,
                                        mask=weight_decay_mask)), schedule
  # One flat chain (no nested chain): its state is what every checkpoint holds.
  if opt_config.name == "stableadamw":
    direction = [scale_by_stable_adam(opt_config.b1, opt_config.b2, opt_config.eps,
                                      weight_decay, weight_decay_mask)]
  else:
    if opt_config.bias_correction:
      adam = optax.scale_by_adam(opt_config.b1, opt_config.b2, opt_config.eps)
    else:
      adam = scale_by_adam_no_bias_correction(opt_config.b1, opt_config.b2, opt_config.eps)
    direction = [adam, optax.add_decayed_weights(weight_decay, mask=weight_decay_mask)]
  return optax.chain(clip, *direction, optax.scale_by_learning_rate(schedule)), schedule
