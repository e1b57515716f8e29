"""Compute matching for the ablation: the step count each setting gets under a model-FLOP budget.

config.budget.mode "steps" keeps every run at pretrain.total_steps (the default).
"flops" gives each setting the largest step count whose estimated model FLOPs
stay within config.budget.flops (0: what the baseline setting spends in
pretrain.total_steps), so every run spends the budget to within one of its own
steps, and stretches the warm-up with it (the learning-rate schedule keeps its
shape over the run's own steps).

The per-step estimate is bert_jax.cost.step_flops with the predictions a full
sequence is expected to make at the setting's mean ratio over its schedule
(min(P, round(mean ratio x (max_seq_length - 3))): [CLS] and two [SEP] are never
masked); the report then counts the FLOPs actually executed from batch_log.
"""

import copy
from typing import Any

import ml_collections
import numpy as np

from data_pipeline import specs
from host import paths

MODES = ("steps", "flops")
_SPECIAL_TOKENS = 3  # [CLS] A [SEP] B [SEP]: never predicted


def vocab_size(data_config: ml_collections.ConfigDict, model_config) -> int:
  """The model's vocabulary size without building a tokenizer: the configured size, else
  the vocab file's lines, else the embedded vocabulary's target size."""
  if model_config.vocab_size:
    return int(model_config.vocab_size)
  if data_config.vocab_file:
    return sum(1 for line in paths.read_text(data_config.vocab_file).splitlines() if line)
  return int(data_config.embedded_vocab_size)


def expected_predictions(run: ml_collections.ConfigDict) -> float:
  """Predictions per sequence a run is expected to make, averaged over its schedule."""
  spec = specs.masking_spec(run.data)
  ratios = [spec.ratio_at(s, run.total_steps) for s in range(0, run.total_steps,
                                                              max(1, run.total_steps // 1000))]
  maskable = run.data.max_seq_length - _SPECIAL_TOKENS
  slots = spec.max_predictions(run.data.max_seq_length)
  return float(min(slots, max(1, round(float(np.mean(ratios)) * maskable))))


def step_flops_estimate(run: ml_collections.ConfigDict) -> float:
  """Model FLOPs of one step of `run` before it has run (bert_jax.cost.step_flops)."""
  from bert_jax import cost  # pylint: disable=g-import-not-at-top  # jax only when planning FLOPs
  bert_config, params = cost.abstract_model(run, vocab_size(run.data, run.model))
  return cost.step_flops(bert_config, params, sequences=run.batch_size,
                         seq_len=run.data.max_seq_length,
                         predictions=run.batch_size * expected_predictions(run))


def matched_steps(runs: dict[str, ml_collections.ConfigDict], baseline: str,
                  budget: float, per_step=step_flops_estimate) -> dict[str, dict[str, Any]]:
  """{setting: {"steps", "flops_per_step", "flops"}} spending `budget` (0: baseline's run).

  Each setting's steps = floor(budget / its per-step FLOPs), so
  budget - flops < flops_per_step: the budget is spent within one step.
  """
  per = {name: float(per_step(run)) for name, run in runs.items()}
  if not budget:
    if baseline not in runs:
      raise ValueError(f"config.budget.flops=0 takes the baseline {baseline!r}'s FLOPs, but "
                       f"it is not a setting ({sorted(runs)}); set config.report.baseline or "
                       "config.budget.flops")
    budget = per[baseline] * runs[baseline].total_steps
  out = {}
  for name, flops in per.items():
    steps = int(budget // flops)
    if steps < 1:
      raise ValueError(f"config.budget.flops={budget:.3g} is less than one step of setting "
                       f"{name} ({flops:.3g} FLOPs)")
    out[name] = {"steps": steps, "flops_per_step": flops, "flops": steps * flops,
                 "budget": budget}
  return out


def stretch(run: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
  """`run` trained for `steps`, its warm-up scaled by the same factor (at least 1 step)."""
  out = copy.deepcopy(run)
  factor = steps / run.total_steps
  with out.unlocked():
    out.total_steps = steps
    if run.optimizer.warmup_steps:
      out.optimizer.warmup_steps = max(1, round(run.optimizer.warmup_steps * factor))
  return out



def equal_flops_checkpoints(cumulative: dict[str, list[float]], kept: dict[str, list[int]],
                            seeds: dict[str, int]) -> dict[str, dict[str, Any]]:
  """Step mode's equal-FLOPs point: {run: {"step", "flops", "budget"}}.

  `cumulative[run][s]`: the run's model FLOPs after step s (index 0: step 0), as
  executed (ablation_report.cumulative_flops); `kept[run]`: the steps it holds a
  checkpoint of; `seeds[run]`: its pretraining seed. The budget is the smallest
  run's total among the runs of its seed (as in the report's equal-FLOPs table):
  differences are paired by seed, and one budget over all seeds would push the
  baseline of a seed that happened to draw a few more predictions off its own
  final checkpoint. Each run's step is its last kept checkpoint whose FLOPs do not
  exceed the budget (relative 1e-9 for float sums), so the smallest run's is its
  final step. The ablation keeps a checkpoint at every evaluation point
  (checkpoint.every_steps = keep_period = eval_every_steps), so the fine-tuned
  checkpoint is the evaluation the equal-FLOPs MLM table reads.
  """
  budgets: dict[int, float] = {}
  for name, flops in cumulative.items():
    budgets[seeds[name]] = min(budgets.get(seeds[name], flops[-1]), flops[-1])
  out = {}
  for name, flops in cumulative.items():
    budget = budgets[seeds[name]]
    fits = [s for s in kept[name] if s < len(flops) and flops[s] <= budget * (1 + 1e-9)]
    if not fits:
      raise ValueError(
          f"run {name} keeps no checkpoint within the equal-FLOPs budget {budget:.4g} "
          f"(kept steps {sorted(kept[name])}): keep one at every evaluation point "
          "(pretrain.checkpoint.every_steps and keep_period = eval_every_steps)")
    step = max(fits)
    out[name] = {"step": step, "flops": flops[step], "budget": budget}
  return out
