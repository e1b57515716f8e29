"""What the ablation's numbers can support: paired differences with bootstrap intervals, in words.

Pure numpy on plain lists (tested on synthetic results, tests/test_ablation_stats.py):
  paired_differences   per setting, (setting - baseline) for each pretraining seed both ran
  bootstrap_interval   the mean and a percentile 95% interval, resampling with a fixed seed
  verdict              "X beats Y", "X is worse than Y" or "cannot separate X from Y at this
                       budget" (the interval contains zero)
  lr_edge_warnings     a chosen learning rate at the edge of its grid: the best may lie outside
"""

from typing import Any

import numpy as np

RESAMPLES = 10_000  # bootstrap resamples: the interval's ends move by < 0.1 SE between seeds
SEED = 0  # the bootstrap's generator seed: the report is a pure function of the results
LEVEL = 0.95  # interval coverage


def bootstrap_interval(values: list[float], *, resamples: int = RESAMPLES, seed: int = SEED,
                       level: float = LEVEL) -> tuple[float, float, float]:
  """(mean, low, high): the mean of `values` and its percentile bootstrap interval.

  With one value the interval is that value alone (nothing to resample); the
  report then says the difference cannot be separated from noise (verdict()).
  """
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError("bootstrap_interval needs at least one value")
  mean = float(x.mean())
  if x.size == 1:
    return mean, mean, mean
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
  tail = (1.0 - level) / 2
  low, high = np.quantile(means, [tail, 1.0 - tail])
  return mean, float(low), float(high)


def unpaired_interval(a: list[float], b: list[float], *, resamples: int = RESAMPLES,
                      seed: int = SEED, level: float = LEVEL) -> tuple[float, float, float]:
  """(mean(a) - mean(b), low, high), resampling a and b independently (no pairing exists)."""
  x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if x.size == 0 or y.size == 0:
    raise ValueError("unpaired_interval needs values on both sides")
  rng = np.random.default_rng(seed)
  diffs = (x[rng.integers(0, x.size, (resamples, x.size))].mean(axis=1)
           - y[rng.integers(0, y.size, (resamples, y.size))].mean(axis=1))
  tail = (1.0 - level) / 2
  low, high = np.quantile(diffs, [tail, 1.0 - tail])
  return float(x.mean() - y.mean()), float(low), float(high)


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
    mean, low, high = bootstrap_interval(diffs)
    rows.append({"setting": setting, "seeds": len(diffs), "mean": mean, "low": low,
                 "high": high, "verdict": verdict(setting, baseline, low, high, len(diffs))})
  return rows


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
           f"parameters, same batches), mean and bootstrap {LEVEL:.0%} interval ({RESAMPLES:,} "
           f"resamples, seed {SEED}). A single seed gives no interval: nothing can be separated.",
           ""]
  sentences = []
  metrics = [("held-out MLM accuracy at 15%", lambda r: r.get("eval_mlm_accuracy"))]
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
              " [95% interval] | reading |", "|---|---|---|---|"]
    lines += [f"| {t['setting']} | {t['seeds']} | {_interval(t)} | {t['verdict']} |"
              for t in table]
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
  for r in rows:
    for task, d in r.get("downstream", {}).items():
      chosen[f"{r['run']} / {task}"] = (d["learning_rate"], d.get("learning_rates", []))
  for task, d in random_init.items():
    chosen[f"random init / {task}"] = (d["learning_rate"], d.get("learning_rates", []))
  warnings = lr_edge_warnings(chosen)
  if warnings:
    lines += ["### Warnings", ""] + [f"- {w}" for w in warnings] + [""]
  if sentences:
    lines += ["### In words", ""] + [f"- {s}" for s in sentences] + [""]
  return "\n".join(lines)
