"""Learning-rate schedules, built from optax's: BERT's warmup + polynomial decay,
warmup-stable-decay (WSD, the trapezoid of MiniCPM and ModernBERT), and a schedule in
segments, one per phase of the run (ModernBERT's warmup and plateau at 8e-4, a plateau at
3e-4 for the context extension, then a 1-sqrt decay).

WSD is transformers' `get_wsd_schedule` (warmup_type "linear"): a linear warmup from
end_learning_rate (its min_lr_ratio x peak; 0 by default) to the peak over warmup_steps, the
peak held, then over the last decay_steps a decay to end_learning_rate shaped as
  linear   1 - p
  1-sqrt   1 - sqrt(p)         (Hägele et al. 2024; mmBERT's decay)
  cosine   (1 + cos(pi p)) / 2
of the decay's progress p in [0, 1], i.e. lr = end + (peak - end) x shape(p). Checked against
transformers' own schedule in tests/test_optim.py.
"""

from typing import Sequence

import jax.numpy as jnp
import ml_collections
import optax

SCHEDULES = ("polynomial", "wsd", "phases")
DECAY_SHAPES = ("linear", "1-sqrt", "cosine")


def learning_rate_schedule(opt_config: ml_collections.ConfigDict, total_steps: int,
                           segments: Sequence[tuple[int, float, str]] | None = None
                           ) -> optax.Schedule:
  """config.optimizer.schedule's schedule over a run of total_steps; "phases" reads
  `segments` (bert_jax.pretrain.phases.lr_segments)."""
  if opt_config.schedule == "phases":
    return segmented(segments, warmup_steps=opt_config.warmup_steps, total_steps=total_steps,
                     end_value=opt_config.end_learning_rate)
  if opt_config.schedule == "wsd":
    return wsd(opt_config.learning_rate, warmup_steps=opt_config.warmup_steps,
               decay_steps=opt_config.decay_steps, total_steps=total_steps,
               shape=opt_config.decay_shape, end_value=opt_config.end_learning_rate)
  return polynomial(opt_config, total_steps)


def polynomial(opt_config: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
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


def decay_shape(shape: str, peak: float, end_value: float, steps: int) -> optax.Schedule:
  """From peak to end_value over `steps` steps in `shape` (module docstring); end_value after."""
  if shape == "linear":
    return optax.linear_schedule(peak, end_value, steps)
  if shape == "cosine":
    return optax.cosine_decay_schedule(peak, steps, alpha=end_value / peak if peak else 0.0)
  # 1-sqrt: optax's power-0.5 polynomial is (1 - p) ** 0.5; this shape is 1 - p ** 0.5.
  def one_minus_sqrt(step):
    progress = jnp.clip(step / max(steps, 1), 0.0, 1.0)
    return end_value + (peak - end_value) * (1.0 - jnp.sqrt(progress))
  return one_minus_sqrt


def wsd(peak: float, *, warmup_steps: int, decay_steps: int, total_steps: int, shape: str,
        end_value: float = 0.0) -> optax.Schedule:
  """Warmup, stable at `peak`, then decay over the last `decay_steps` of `total_steps`."""
  stable_end = max(total_steps - decay_steps, warmup_steps)
  return optax.join_schedules(
      [optax.linear_schedule(end_value, peak, warmup_steps), optax.constant_schedule(peak),
       decay_shape(shape, peak, end_value, decay_steps)],
      [warmup_steps, stable_end])


def segmented(segments: Sequence[tuple[int, float, str]], *, warmup_steps: int,
              total_steps: int, end_value: float) -> optax.Schedule:
  """One piece per (start step, learning rate, decay) segment, in order: the first warms up
  linearly from 0 to its rate over warmup_steps; each holds its rate, or with a decay shape
  decays from it to end_value over its steps (the first: over those after the warmup)."""
  if not segments or segments[0][0] != 0:
    raise ValueError("schedule 'phases' needs segments starting at step 0 (config.phases)")
  pieces, boundaries = [], []
  ends = [start for start, _, _ in segments[1:]] + [total_steps]
  for i, ((start, rate, decay), end) in enumerate(zip(segments, ends)):
    held = (optax.constant_schedule(rate) if not decay
            else decay_shape(decay, rate, end_value, end - start - (warmup_steps if i == 0 else 0)))
    if i == 0 and warmup_steps:
      pieces += [optax.linear_schedule(0.0, rate, warmup_steps), held]
      boundaries.append(warmup_steps)
    else:
      pieces.append(held)
    if i:
      boundaries.append(start)
  return optax.join_schedules(pieces, boundaries) if boundaries else pieces[0]
