"""What the ablation's numbers can support: paired differences with t intervals, in words.

Pure numpy and scipy on plain lists (tested on synthetic results,
tests/test_ablation_stats.py and tests/test_ablation_power.py):
  paired_differences     per setting, (setting - baseline) for each pretraining seed both ran
  t_interval             the mean of the paired differences and its Student t 95% interval:
                         the report's decision rule for them
  bootstrap_interval     the mean and a percentile 95% interval, resampling with a fixed seed
                         (the unpaired random-init floor)
  verdict                "X beats Y", "X is worse than Y" or "cannot separate X from Y at this
                         budget" (the interval contains zero)
  detectable_difference  the smallest true difference n seeds separate with 80% power under
                         that rule; seeds_needed its inverse (experiments/ablation/power.py
                         plans a study with them)
  lr_edge_warnings       a chosen learning rate at the edge of its grid: the best may lie outside
"""

import math
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as scipy_stats

RESAMPLES = 10_000  # bootstrap resamples: the interval's ends move by < 0.1 SE between seeds
SEED = 0  # the bootstrap's generator seed: the report is a pure function of the results
LEVEL = 0.95  # interval coverage
MLM_LABEL = "held-out MLM accuracy at 15%"  # the report's first compared metric
POWER = 0.8  # the chance a planned study separates a true difference (the usual convention)
# A power within this of the target counts as reaching it: detectable_difference's root is
# exact only to the solver's tolerance, and seeds_needed must invert it exactly.
POWER_TOLERANCE = 1e-9


def bootstrap_interval(values: list[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                       level: float = LEVEL) -> tuple[float, float, float]:
  """(mean, low, high): the mean of `values` and its percentile bootstrap interval.

  With one value the interval is that value alone (nothing to resample); the
  report then says the difference cannot be separated from noise (verdict()).
  """
  x, mean = _values("bootstrap_interval", values)
  if x.size == 1:
    return mean, mean, mean
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
  return (mean,) + _percentiles(means, level)


def _values(caller: str, values: list[float]) -> tuple[np.ndarray, float]:
  """(values as float64, their mean); at least one is needed."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError(f"{caller} needs at least one value")
  return x, float(x.mean())


def _percentiles(samples: np.ndarray, level: float) -> tuple[float, float]:
  """The central `level` interval of bootstrap samples: (low, high)."""
  tail = (1.0 - level) / 2
  low, high = np.quantile(samples, [tail, 1.0 - tail])
  return float(low), float(high)


def unpaired_interval(a: list[float], b: list[float], *, resamples: int = RESAMPLES,
                      seed: int = SEED, level: float = LEVEL) -> tuple[float, float, float]:
  """(mean(a) - mean(b), low, high), resampling a and b independently (no pairing exists)."""
  x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if x.size == 0 or y.size == 0:
    raise ValueError("unpaired_interval needs values on both sides")
  rng = np.random.default_rng(seed)
  diffs = (x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
           - y[rng.integers(0, y.size, (resamples, y.size))].mean(axis=1))
  return (float(x.mean() - y.mean()),) + _percentiles(diffs, level)


def t_interval(values: list[float], *, level: float = LEVEL) -> tuple[float, float, float]:
  """(mean, low, high): the mean of paired differences and its Student t interval.

  The report's rule for paired comparisons (and so what detectable_difference plans
  for): a setting is separated from the baseline when this interval excludes zero,
  the two-sided paired t test at 1 - level. Why t and not the bootstrap: with the 2 to
  5 seeds an ablation affords, a percentile bootstrap interval is far too narrow (with
  3 seeds a resample draws the smallest difference three times 1 time in 27, more than
  2.5%, so the interval's low end is that difference itself: it "separates" whenever
  the three differences share a sign, 25% of the time when nothing differs), and a
  plan of its power would promise seeds that detect noise. The t interval holds its
  coverage at any n for normal differences, and its power has a closed form
  (noncentral t). With one value the interval is that value alone: one seed separates
  nothing (excludes_zero).
  """
  x, mean = _values("t_interval", values)
  if x.size == 1:
    return mean, mean, mean
  half = float(scipy_stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1)
               / math.sqrt(x.size))
  return mean, mean - half, mean + half


def power_at(d: float, sd: float, n: int, *, alpha: float = 1 - LEVEL) -> float:
  """The chance that n paired seeds separate a true mean difference d under t_interval's rule.

  The paired differences are taken as normal with standard deviation sd; the rule is the
  two-sided t test at alpha, so the power is the noncentral t's mass beyond the critical
  values (both sides: the report counts a separation either way).
  """
  if n < 2:
    return 0.0  # one seed never separates
  if sd == 0:
    return 1.0 if d != 0 else 0.0  # no spread: any true difference is the observed one
  df = n - 1
  critical = scipy_stats.t.ppf(1 - alpha / 2, df)
  shift = abs(d) * math.sqrt(n) / sd
  # The wrong-way tail shrinks from alpha / 2 at d = 0; scipy's nct returns NaN for it far
  # out (df = 1), where it is below 1e-15: count it as 0 there.
  wrong_way = float(np.nan_to_num(scipy_stats.nct.cdf(-critical, df, shift), nan=0.0))
  return float(scipy_stats.nct.sf(critical, df, shift)) + min(max(wrong_way, 0.0), alpha / 2)


def detectable_difference(sd: float, n: int, alpha: float = 1 - LEVEL, power: float = POWER
                          ) -> float:
  """The smallest true mean paired difference n seeds separate with probability `power`.

  `sd`: the standard deviation of the paired differences (setting minus baseline, per
  pretraining seed); the rule is t_interval's (two-sided paired t test at alpha). A
  difference below it goes unseen more often than 1 - power.
  """
  if n < 2:
    raise ValueError(f"detectable_difference needs n >= 2 paired seeds, got {n}")
  if sd < 0:
    raise ValueError(f"sd must be >= 0, got {sd}")
  if sd == 0:
    return 0.0
  # Solve in units of sd (power depends on d / sd alone), then scale back.
  high = 1.0
  while power_at(high, 1.0, n, alpha=alpha) < power:
    high *= 2
  effect = optimize.brentq(lambda e: power_at(e, 1.0, n, alpha=alpha) - power, 0.0, high,
                           xtol=1e-12, rtol=1e-12)
  return float(effect * sd)


def seeds_needed(d: float, sd: float, *, alpha: float = 1 - LEVEL, power: float = POWER
                 ) -> int:
  """The smallest number of paired seeds (>= 2) that separates a true difference d with
  probability `power` under t_interval's rule; detectable_difference's inverse."""
  if d == 0:
    raise ValueError("seeds_needed: a difference of 0 is never detected; give d != 0")
  if sd < 0:
    raise ValueError(f"sd must be >= 0, got {sd}")

  def enough(n: int) -> bool:
    return power_at(d, sd, n, alpha=alpha) >= power - POWER_TOLERANCE

  if sd == 0:
    return 2
  # Start at the normal approximation (the t test needs a few seeds more), then step.
  z = scipy_stats.norm.ppf(1 - alpha / 2) + scipy_stats.norm.ppf(power)
  n = max(2, math.floor((z * sd / abs(d)) ** 2))
  while n > 2 and enough(n - 1):
    n -= 1
  while not enough(n):
    n += 1
  return n


def paired_differences(values: dict[str, dict[int, float]], baseline: str
                       ) -> dict[str, list[float]]:
  """{setting: [value(setting, seed) - value(baseline, seed) for each seed both have]}.

  `values` maps setting -> {pretraining seed: value}. Pairing by seed removes the
  seed's own luck (same initial parameters, same batches), so small differences
  can be seen with few seeds.
  """
  if baseline not in values:
    return {}
  base = values[baseline]
  return {setting: [by_seed[s] - base[s] for s in sorted(by_seed) if s in base]
          for setting, by_seed in values.items() if setting != baseline}


def excludes_zero(low: float, high: float, samples: int) -> bool:
  """Whether an interval separates a difference from zero (one sample never does)."""
  return samples > 1 and (low > 0 or high < 0)


def verdict(setting: str, other: str, low: float, high: float, samples: int) -> str:
  """One sentence on (setting - other) for a higher-is-better metric."""
  if not excludes_zero(low, high, samples):
    return f"cannot separate {setting} from {other} at this budget"
  return f"{setting} beats {other}" if low > 0 else f"{setting} is worse than {other}"


def difference_rows(values: dict[str, dict[int, float]], baseline: str
                    ) -> list[dict[str, Any]]:
  """Per setting: seeds paired, mean difference to `baseline`, its interval and the verdict."""
  rows = []
  for setting, diffs in paired_differences(values, baseline).items():
    if not diffs:
      rows.append({"setting": setting, "seeds": 0, "verdict":
                   f"no seed shared with {baseline}: nothing to compare"})
      continue
    mean, low, high = t_interval(diffs)
    row = {"setting": setting, "seeds": len(diffs), "mean": mean, "low": low, "high": high,
           "verdict": verdict(setting, baseline, low, high, len(diffs))}
    if len(diffs) > 1:
      row["sd"] = float(np.std(diffs, ddof=1))
      row["detectable"] = detectable_difference(row["sd"], len(diffs))
    if not excludes_zero(low, high, len(diffs)):  # "cannot separate", with its size
      row["verdict"] += "; " + unseen(row)
    rows.append(row)
  return rows


def unseen(row: dict[str, Any]) -> str:
  """What a comparison's seeds could not have seen: 'a difference below 0.012 would go
  unseen with 3 seeds' (detectable_difference at POWER; the row from difference_rows)."""
  n = row["seeds"]
  if n < 2:
    return "one seed gives no spread, so no difference of any size can be detected"
  if row["detectable"] == 0:
    return f"all {n} seeds gave a difference of exactly 0: no spread to size one by"
  return f"a difference below {row['detectable']:.3g} would go unseen with {n} seeds"


def _detectable(row: dict[str, Any]) -> str:
  return f"{row['detectable']:.3g}" if "detectable" in row else "-"


def random_init_rows(values: dict[str, list[float]], random_init: list[float]
                     ) -> tuple[list[dict[str, Any]], str]:
  """Each setting against the random-init floor, and the summary sentence.

  `values` maps setting -> its downstream values (one per pretraining seed). The
  summary is "no setting beats random init" unless some setting's interval lies
  wholly above it.
  """
  rows = []
  for setting, vals in values.items():
    if not vals or not random_init:
      continue
    mean, low, high = unpaired_interval(vals, random_init)
    rows.append({"setting": setting, "seeds": len(vals), "mean": mean, "low": low, "high": high,
                 "verdict": verdict(setting, "random init", low, high,
                                    min(len(vals), len(random_init)))})
  winners = [r["setting"] for r in rows if r["verdict"].endswith("beats random init")]
  summary = (f"{', '.join(winners)} beat{'s' if len(winners) == 1 else ''} random init"
             if winners else "no setting beats random init")
  return rows, summary


def lr_edge_warnings(chosen: dict[str, tuple[float, list[float]]]) -> list[str]:
  """Warnings for runs whose chosen learning rate sits at the edge of its sweep.

  `chosen` maps a label (run / task) to (chosen lr, the grid). A one-point grid
  is no sweep at all and is said so.
  """
  out = []
  for label, (lr, grid) in chosen.items():
    grid = sorted(float(g) for g in grid)
    if len(grid) < 2:
      out.append(f"{label}: one learning rate ({lr:g}), nothing was swept")
    elif float(lr) in (grid[0], grid[-1]):
      side = "largest" if float(lr) == grid[-1] else "smallest"
      out.append(f"{label}: the chosen learning rate {lr:g} is the {side} of the grid "
                 f"{[f'{g:g}' for g in grid]}; the best may lie outside it")
  return out


def _interval(row: dict[str, Any]) -> str:
  if "mean" not in row:
    return "-"
  return f"{row['mean']:+.4f} [{row['low']:+.4f}, {row['high']:+.4f}]"


def comparison_markdown(rows: list[dict[str, Any]], tasks: list[str], baseline: str,
                        random_init: dict[str, dict[str, Any]]) -> str:
  """report.md's "What the data can support" section from finished runs' rows.

  `rows`: one per finished run with "setting", "seed", "eval_mlm_accuracy" and
  "downstream" {task: {"values": [...] over fine-tuning seeds, "learning_rate",
  "learning_rates"}}; a run's downstream value is the median over its fine-tuning
  seeds. `random_init`: {task: the same dict} of the random-init sweep.
  """
  lines = ["## What the data can support", "",
           f"Differences to the baseline **{baseline}**, paired by pretraining seed (same initial "
           f"parameters, same batches), mean and Student t {LEVEL:.0%} interval (experiments/"
           f"ablation/stats.py says why not the bootstrap). A single seed gives no interval: "
           f"nothing can be separated. \"Detectable\" is the smallest true difference these "
           f"seeds separate {POWER:.0%} of the time, from the spread of the paired differences "
           f"(a smaller one would mostly go unseen; `python -m experiments.ablation "
           f"--plan_seeds --workdir=DIR` sizes the seeds for a given one). Against random "
           f"init (no pairing exists): a bootstrap {LEVEL:.0%} interval ({RESAMPLES:,} "
           f"resamples, seed {SEED}).",
           ""]
  sentences = []
  metrics = [(MLM_LABEL, lambda r: r.get("eval_mlm_accuracy"))]
  metrics += [(f"{task} (downstream)", lambda r, t=task: (
      float(np.median(r["downstream"][t]["values"])) if t in r.get("downstream", {}) else None))
              for task in tasks]
  for label, get in metrics:
    values: dict[str, dict[int, float]] = {}
    for r in rows:
      v = get(r)
      if v not in (None, ""):
        values.setdefault(r["setting"], {})[r["seed"]] = float(v)
    if baseline not in values:
      lines += [f"{label}: the baseline {baseline} has no finished run with this number; "
                "nothing is compared.", ""]
      continue
    table = difference_rows(values, baseline)
    lines += [f"### {label}", "", "| setting | seeds paired | minus " + baseline +
              f" [95% interval] | detectable ({POWER:.0%} power) | reading |",
              "|---|---|---|---|---|"]
    lines += [f"| {t['setting']} | {t['seeds']} | {_interval(t)} | {_detectable(t)} | "
              f"{t['verdict']} |" for t in table]
    lines.append("")
    sentences += [f"{label}: {t['verdict']}." for t in table]
  for task in tasks:
    if task not in random_init:
      lines += [f"{task}: the random-init row has not been fine-tuned yet.", ""]
      continue
    floor = random_init[task]["values"]
    per_setting: dict[str, list[float]] = {}
    for r in rows:
      if task in r.get("downstream", {}):
        per_setting.setdefault(r["setting"], []).append(
            float(np.median(r["downstream"][task]["values"])))
    table, summary = random_init_rows(per_setting, floor)
    lines += [f"### {task} against random init ({np.median(floor):.4f} median over "
              f"{len(floor)} fine-tuning seeds)", "",
              "| setting | pretraining seeds | minus random init [95% interval] | reading |",
              "|---|---|---|---|"]
    lines += [f"| {t['setting']} | {t['seeds']} | {_interval(t)} | {t['verdict']} |"
              for t in table]
    lines += ["", f"**{task}: {summary}.**", ""]
  chosen = {}
  # A rate each sweep chose (a suite's average has none of its own: its members are listed).
  for r in rows:
    for task, d in r.get("downstream", {}).items():
      if d["learning_rate"] is not None:
        chosen[f"{r['run']} / {task}"] = (d["learning_rate"], d.get("learning_rates", []))
  for task, d in random_init.items():
    if d["learning_rate"] is not None:
      chosen[f"random init / {task}"] = (d["learning_rate"], d.get("learning_rates", []))
  warnings = lr_edge_warnings(chosen)
  if warnings:
    lines += ["### Warnings", ""] + [f"- {w}" for w in warnings] + [""]
  if sentences:
    lines += ["### In words", ""] + [f"- {s}" for s in sentences] + [""]
  return "\n".join(lines)
