"""Seeds planned for power: `python -m experiments.ablation --plan_seeds --workdir=DIR`.

A pilot is a reported ablation's workdir: DIR/results.csv and DIR/plan.json (a small
first run of the grid, reported with --stage=report, is one; so is a committed
experiments/results/ablation_*/). Per comparison the report makes (each setting minus
the baseline, paired by pretraining seed, for held-out MLM accuracy at 15% and for each
downstream task's median over fine-tuning seeds) it prints the spread of the paired
differences, the smallest difference the pilot's seeds could detect, and a table of
differences D against the seeds needed to detect them 80% of the time. The rule planned
for is the report's own (stats.t_interval excludes zero), so a planned study's report
separates a true difference of D in about 80% of studies (tests/test_ablation_power.py
simulates it). Imports: experiments.ablation.stats, the path layer, bert_jax.errors.
"""

import csv
import io
import json
import math
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from bert_jax import errors
from experiments.ablation import stats as ablation_stats
from host import paths

RESULTS_FILE = "results.csv"  # report.write_report's per-run table
PLAN_FILE = "plan.json"  # the prepare stage's plan: baseline and tasks
# The pilot's sd is an estimate from few seeds: its upper confidence bound at this level is
# printed beside it, since seeds needed grow with sd squared and a low sd under-plans.
SD_BOUND = 0.8
SMALLEST_D = 0.2  # the table runs down to this fraction of the sd (about 200 seeds)


def read_pilot(workdir: str) -> tuple[list[dict[str, Any]], list[str], str]:
  """(finished rows of DIR/results.csv, downstream tasks, baseline) of a reported ablation.

  A row is finished when it reached its total_steps: the identical-data proof's rule
  (proof.finished), the only runs the report compares. Refuses (one line) when the
  report's files are missing or no run finished.
  """
  results, plan_path = paths.join(workdir, RESULTS_FILE), paths.join(workdir, PLAN_FILE)
  for path in (results, plan_path):
    if not paths.exists(path):
      raise errors.UsageError(f"{path} is missing: --plan_seeds plans from a pilot's report; "
                              f"run the ablation (or --stage=report) in {workdir} first")
  try:  # the pilot's files are input: damaged ones are named in one line
    plan = json.loads(paths.read_text(plan_path))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise errors.UsageError(f"{plan_path} is not the JSON the ablation writes ({e}): "
                            f"re-run --stage=prepare (or the ablation) in {workdir}") from None
  try:
    rows = [r for r in csv.DictReader(io.StringIO(paths.read_text(results)))
            if r.get("steps") and r["steps"] == r.get("total_steps")]
  except (UnicodeDecodeError, csv.Error) as e:
    raise errors.UsageError(f"{results} is not the CSV the report writes ({e}): re-run "
                            f"--stage=report in {workdir}") from None
  tasks = list(plan.get("tasks", {}))
  numbers = [("seed", int), ("eval_mlm_accuracy", float)] + [(f"{t}_median", float)
                                                             for t in tasks]
  for r in rows:  # what comparisons() reads: a seed, and numbers where a metric is given
    for column, kind in numbers:
      value = r.get(column)
      if column != "seed" and value in ("", None):
        continue
      try:
        kind(value)
      except (TypeError, ValueError):
        raise errors.UsageError(
            f"{results}: run {r.get('setting', '?')}_seed{r.get('seed', '?')} has "
            f"{column}={value!r}, not a number (or no such column); re-run --stage=report "
            f"in {workdir}") from None
  if not rows:
    raise errors.UsageError(f"{results} has no finished run (steps = total_steps): nothing to "
                            "plan from; let the pilot's runs finish and re-run --stage=report")
  return rows, tasks, plan.get("baseline", "r15")


def comparisons(rows: list[dict[str, Any]], tasks: list[str], baseline: str
                ) -> list[dict[str, Any]]:
  """Per metric the report compares and per setting: seeds paired with `baseline`, the mean
  and sd of the paired differences and the smallest difference those seeds detect.

  `rows`: results.csv's finished rows (strings, as csv reads them). Refuses (one line)
  when no comparison has 2 seeds: one paired difference has no spread to plan from.
  """
  metrics = [(ablation_stats.MLM_LABEL, "eval_mlm_accuracy")]
  metrics += [(f"{task} (downstream)", f"{task}_median") for task in tasks]
  out = []
  for label, column in metrics:
    values: dict[str, dict[int, float]] = {}
    for r in rows:
      if r.get(column) not in (None, ""):
        values.setdefault(r["setting"], {})[int(r["seed"])] = float(r[column])
    for setting, diffs in ablation_stats.paired_differences(values, baseline).items():
      c = {"metric": label, "setting": setting, "seeds": len(diffs)}
      if len(diffs) > 1:
        c.update(mean=float(np.mean(diffs)), sd=float(np.std(diffs, ddof=1)))
        c["detectable"] = ablation_stats.detectable_difference(c["sd"], len(diffs))
      out.append(c)
  most = max((c["seeds"] for c in out), default=0)
  if most < 2:
    raise errors.UsageError(
        f"no setting has 2 pretraining seeds paired with the baseline {baseline} (the most is "
        f"{most}): one paired difference has no spread to plan from; run the pilot with two "
        "seeds or more (config.pretrain_seeds) and report it")
  return out


def differences(sd: float, largest: float) -> list[float]:
  """The D column: round numbers (1, 2, 5 x 10^k) from `largest` down to SMALLEST_D x sd."""
  low = SMALLEST_D * sd
  if not 0 < low < largest:
    return [largest] if largest > 0 else []
  out = []
  for k in range(math.floor(math.log10(low)), math.floor(math.log10(largest)) + 1):
    out += [m * 10.0 ** k for m in (1, 2, 5) if low <= m * 10.0 ** k <= largest]
  return sorted({float(f"{d:.6g}") for d in out}, reverse=True)


def power_table(sd: float, ds: list[float], *, alpha: float = 1 - ablation_stats.LEVEL,
                power: float = ablation_stats.POWER) -> list[tuple[float, int]]:
  """[(D, seeds needed to separate a true paired difference of D with `power`)]."""
  return [(d, ablation_stats.seeds_needed(d, sd, alpha=alpha, power=power)) for d in ds]


def sd_upper_bound(sd: float, n: int, level: float = SD_BOUND) -> float:
  """The one-sided `level` upper confidence bound of a normal sd estimated from n values."""
  return sd * math.sqrt((n - 1) / scipy_stats.chi2.ppf(1 - level, n - 1))


def plan_seeds(workdir: str) -> str:
  """--plan_seeds' text: per comparison, the pilot's spread, what its seeds detect, and a
  table of D against seeds needed (refusals as read_pilot's and comparisons')."""
  rows, tasks, baseline = read_pilot(workdir)
  found = comparisons(rows, tasks, baseline)
  lines = [f"Seeds planned for {ablation_stats.POWER:.0%} power from the pilot in {workdir} "
           f"(baseline {baseline}).",
           f"Rule: the report's; a setting is separated from {baseline} when the Student t "
           f"{ablation_stats.LEVEL:.0%} interval of its paired differences (one per pretraining "
           "seed) excludes 0. The differences are taken as normal with the pilot's sd; a few "
           f"seeds know that sd only roughly, so its {SD_BOUND:.0%} upper bound is shown too "
           "(seeds needed grow with its square: plan with the bound to be safe).", ""]
  for c in found:
    lines.append(f"## {c['metric']}: {c['setting']} minus {baseline}")
    if "sd" not in c:
      lines += [f"{c['seeds']} seed paired: no spread to plan from.", ""]
      continue
    n, sd = c["seeds"], c["sd"]
    lines.append(f"{n} seeds paired: mean {c['mean']:+.4g}, sd of the paired differences "
                 f"{sd:.3g} ({SD_BOUND:.0%} upper bound {sd_upper_bound(sd, n):.3g}); the "
                 f"smallest difference {n} seeds detect: {c['detectable']:.3g}.")
    if sd == 0:
      lines += ["The paired differences do not vary: 2 seeds separate any difference.", ""]
      continue
    lines += ["", "| D | seeds needed | at the sd's upper bound |", "|---|---|---|"]
    bound = sd_upper_bound(sd, n)
    lines += [f"| {d:.3g} | {k} | {ablation_stats.seeds_needed(d, bound)} |"
              for d, k in power_table(sd, differences(sd, c["detectable"]))]
    lines.append("")
  return "\n".join(lines)
