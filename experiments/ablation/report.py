"""The ablation's report, from its workdirs alone: report.md, results.csv, plots/*.png.

Every number comes from files the runs wrote (nothing is re-run):
  steps, held-out metrics   pretrain/<run>/metrics.jsonl (eval/* at 15%, eval_own/* at
                            the run's own final ratio)
  tokens, predictions       pretrain/<run>/batch_log*.jsonl: real (non-padding) tokens
                            and real MLM predictions, summed over every step and process
  model FLOPs               bert_jax.pretrain.cost.step_flops at every step from batch_log's real
                            predictions (encoder per token, MLM head per prediction,
                            pooler/NSP per sequence): FLOPs as executed, not slots
  wall time, MFU            metrics.jsonl's steps/s (training loop only) and mfu (present
                            only where bert_jax.run.metrics_io knows the device's peak)
  downstream                finetune/<run>/<task>/summary.json: median (min-max) over
                            fine-tuning seeds of the main metric on test (a split carved by
                            config.task.test_fraction; else on dev) at the learning rate
                            with the best dev median
  what it can support       experiments/ablation/stats.py: paired differences to the baseline
                            with t intervals and the smallest difference the seeds detect,
                            the random-init floor, lr warnings
"""

import csv
import io
import json
import statistics
from typing import Any

import ml_collections

from bert_jax.run import batch_log
from bert_jax.run import checkpoint
from bert_jax.run import metrics_io
from bert_jax.run import workdir as workdir_lib
from data_pipeline import specs
from data_pipeline.examples import masking_spec
from experiments import figures
from experiments.ablation import stats as ablation_stats
from experiments.ablation import suite as ablation_suite
from host import paths

# Columns that measure the machine, not the run: they differ between two executions of one run.
# Step mode's equal-FLOPs checkpoints and their fine-tuning dirs (experiments.ablation writes it).
EQUAL_FLOPS_FILE = "equal_flops.json"
TIMING_COLUMNS = ("wall_time_s", "achieved_tflops", "mfu")
# An evaluation (or kept checkpoint) whose executed model FLOPs are this close to an
# equal-FLOPs budget, relatively, is read as at the budget: one step either side is a
# hair, and a run a hair above the budget should not fall back a whole evaluation interval.
EQUAL_FLOPS_TOLERANCE = 0.01


def phase_flops(config: Any, bert_config: Any) -> list[tuple[int, float, int]]:
  """[(steps, model FLOPs per step, prediction slots P)] of each phase of a pretraining config."""
  from bert_jax.pretrain import cost  # pylint: disable=g-import-not-at-top  # jax only when FLOPs are asked for
  return [(p["steps"], p["flops_per_step"], p["predictions"])
          for p in cost.run_flops(config, bert_config, _abstract_params(config, bert_config))]


def _abstract_params(config: Any, bert_config: Any) -> Any:
  from bert_jax.pretrain import cost  # pylint: disable=g-import-not-at-top  # jax only when FLOPs are asked for
  return cost.abstract_params(bert_config, nsp_head=config.data.objective in specs.PAIR_OBJECTIVES)


def executed_flops(config: Any, bert_config: Any, logs: dict[str, list[dict]]) -> list[float]:
  """Cumulative model FLOPs after each logged step (index 0: step 0), from real predictions.

  bert_jax.pretrain.cost.executed_flops, with each step's predictions summed over every
  process's batch log.
  """
  from bert_jax.pretrain import cost  # pylint: disable=g-import-not-at-top  # jax only when FLOPs are asked for
  predictions: dict[int, int] = {}
  for rows in logs.values():
    for r in rows:
      predictions[r["step"]] = predictions.get(r["step"], 0) + r["predictions"]
  return cost.executed_flops(config, bert_config, _abstract_params(config, bert_config),
                             predictions)


def cumulative_flops(workdir: str, pretrain_dir: str) -> list[float]:
  """A finished run's executed_flops from its workdir (DIR/`pretrain_dir`): what the
  equal-FLOPs table compares and the ablation's equal-FLOPs fine-tuning picks by."""
  run_dir = paths.join(workdir, pretrain_dir)
  config = ml_collections.ConfigDict(
      json.loads(paths.read_text(paths.join(run_dir, workdir_lib.CONFIG_FILE))))
  return executed_flops(config, checkpoint.read_bert_config(run_dir), batch_log.read(run_dir))


def duration(seconds: float) -> str:
  """'2h05m', '4m07s', '12s', '0.4s'."""
  if seconds < 10:
    return f"{seconds:.1f}s"
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
  if seconds >= 60:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds}s"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
  """A GitHub-flavoured markdown table."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def collect(workdir: str, plan: dict[str, Any], unfinished: tuple[str, ...] = ()
            ) -> list[dict[str, Any]]:
  """One dict per planned run that has started: every number of the report.

  Runs named in `unfinished` get "finished": False and stay out of every comparison.
  """
  rows = []
  # Step mode's equal-FLOPs checkpoints, written by the ablation's finetune stage.
  equal_path = paths.join(workdir, EQUAL_FLOPS_FILE)
  equal_flops = json.loads(paths.read_text(equal_path)) if paths.exists(equal_path) else {}
  for run in plan["runs"]:
    run_dir = paths.join(workdir, run["pretrain"])
    if not paths.exists(paths.join(run_dir, workdir_lib.CONFIG_FILE)):
      continue  # not started
    config = ml_collections.ConfigDict(
        json.loads(paths.read_text(paths.join(run_dir, workdir_lib.CONFIG_FILE))))
    bert_config = checkpoint.read_bert_config(run_dir)
    spec = masking_spec.MaskingSpec.from_record(config.data.masking.to_dict())
    metrics = metrics_io.read_metrics(paths.join(run_dir, metrics_io.METRICS_FILE)) \
        if paths.exists(paths.join(run_dir, metrics_io.METRICS_FILE)) else []
    train_rows = [r for r in metrics if "steps_per_s" in r]
    evals = [r for r in metrics if "eval/mlm_accuracy" in r]
    steps = max([r["step"] for r in train_rows], default=0)
    phases = phase_flops(config, bert_config)
    try:
      logs = batch_log.read(run_dir)
    except batch_log.BatchLogError:
      if run["name"] not in unfinished:
        raise  # the proof has read a finished run's logs already: this is a bug
      logs = {}  # an unfinished run's broken log: shown without counts, compared with nothing
    cumulative = executed_flops(config, bert_config, logs)
    wall, previous = 0.0, 0
    for r in train_rows:
      wall += (r["step"] - previous) / max(r["steps_per_s"], 1e-9)
      previous = r["step"]
    flops = cumulative[min(steps, len(cumulative) - 1)]
    row = {"run": run["name"], "setting": run["setting"], "seed": run["seed"],
           "finished": run["name"] not in unfinished,
           **spec.columns(), "mean_ratio": round(spec.mean_ratio(config.total_steps), 4),
           "prediction_slots": "/".join(str(p) for _, _, p in phases),
           "steps": steps, "total_steps": config.total_steps,
           "tokens": sum(r["tokens"] for rows_ in logs.values() for r in rows_),
           "predictions": sum(r["predictions"] for rows_ in logs.values() for r in rows_),
           "model_flops": float(f"{flops:.6g}"),
           "wall_time_s": round(wall, 1),
           "achieved_tflops": round(flops / wall / 1e12, 4) if wall else "",
           "mfu": (round(statistics.mean(r["mfu"] for r in train_rows if "mfu" in r), 4)
                   if any("mfu" in r for r in train_rows) else "")}
    last = evals[-1] if evals else {}
    for key in ("eval/mlm_loss", "eval/mlm_accuracy", "eval/nsp_accuracy",
                "eval_own/mlm_loss", "eval_own/mlm_accuracy"):
      row[key.replace("/", "_")] = round(last[key], 6) if key in last else ""
    row["curve"] = [(r["step"], cumulative[min(r["step"], len(cumulative) - 1)],
                     r["eval/mlm_accuracy"]) for r in evals]
    row["downstream"] = {}
    for task, task_dir in run["finetune"].items():
      d = _downstream(workdir, task_dir, plan["tasks"][task]["learning_rates"])
      if d is not None:
        _add_downstream(row, task, d)
    average = ablation_suite.average(row["downstream"], plan["suite"]) \
        if plan.get("suite") else None
    if average is not None:  # every member of the downstream suite has its figures
      _add_downstream(row, ablation_suite.SUITE_AVERAGE, average)
    matched = equal_flops.get(run["name"])
    if matched:  # step mode: the same sweep from the checkpoint at the smallest run's FLOPs
      row["equal_flops"] = {
          "step": matched["step"], "flops": matched["flops"], "budget": matched["budget"],
          "downstream": {t: d for t, d in (
              (t, _downstream(workdir, task_dir, plan["tasks"][t]["learning_rates"]))
              for t, task_dir in matched["finetune"].items()) if d is not None}}
    rows.append(row)
  # Reading order: by where a setting sits on the ratio axis, then by name and seed.
  return sorted(rows, key=lambda r: (r["mean_ratio"], r["setting"], r["seed"]))


def _add_downstream(row: dict[str, Any], task: str, d: dict[str, Any]) -> None:
  """A run's figures of one downstream task (or the suite's average) into its row."""
  row["downstream"][task] = d
  row[f"{task}_median"] = round(statistics.median(d["values"]), 6)
  row[f"{task}_min"] = round(min(d["values"]), 6)
  row[f"{task}_max"] = round(max(d["values"]), 6)
  row[f"{task}_lr"] = "" if d["learning_rate"] is None else d["learning_rate"]


def _downstream(workdir: str, task_dir: str, learning_rates: list[float]
                ) -> dict[str, Any] | None:
  """{"metric", "values" (per fine-tuning seed), "learning_rate", "learning_rates"} of
  one sweep's summary.json; None when it has not run."""
  summary_path = paths.join(workdir, task_dir, "summary.json")
  if not paths.exists(summary_path):
    return None
  summary = json.loads(paths.read_text(summary_path))
  # The learning rate was picked on dev (main_metric); the figure is test's at it when the
  # task carved one (reported_metric; summaries from before it report dev).
  main = summary.get("reported_metric", summary["main_metric"])
  return {"metric": main, "values": [r[main] for r in summary["per_seed"].values()],
          "learning_rate": summary["learning_rate"], "learning_rates": learning_rates}


def random_init_downstream(workdir: str, plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """{task: {"values", "learning_rate", "learning_rates", "metric"}} of the random-init sweeps run."""
  out = {}
  for task, task_dir in plan.get("random_init", {}).items():  # plans before the row have none
    d = _downstream(workdir, task_dir, plan["tasks"][task]["learning_rates"])
    if d is not None:
      out[task] = d
  average = ablation_suite.average(out, plan["suite"]) if plan.get("suite") else None
  if average is not None:
    out[ablation_suite.SUITE_AVERAGE] = average
  return out


def nearest_at_budget(points: list[tuple[int, float]], budget: float) -> int | None:
  """Index of the (step, cumulative FLOPs) point nearest `budget` in FLOPs, when within
  EQUAL_FLOPS_TOLERANCE of it (ties: the earlier step); None when none is."""
  near = [i for i, (_, flops) in enumerate(points)
          if abs(flops - budget) <= EQUAL_FLOPS_TOLERANCE * budget]
  return min(near, key=lambda i: (abs(points[i][1] - budget), points[i][0]), default=None)


def read_at_flops(curve: list[tuple[int, float, float]], budget: float) -> dict[str, Any]:
  """A run's held-out MLM accuracy at `budget` model FLOPs, from its (step, cumulative
  FLOPs as executed, accuracy) evaluations.

  {"step", "flops", "accuracy", "interpolated"}: the evaluation nearest the budget when
  within EQUAL_FLOPS_TOLERANCE of it; else the accuracy linear in FLOPs between the
  evaluations just below and just above it, at the budget itself ("step" "a-b",
  "interpolated" True); else (the budget before the first evaluation) "step" and
  "accuracy" "-", "flops" 0.
  """
  nearest = nearest_at_budget([(c[0], c[1]) for c in curve], budget)
  if nearest is not None:
    step, flops, accuracy = curve[nearest]
    return {"step": step, "flops": flops, "accuracy": accuracy, "interpolated": False}
  below = [c for c in curve if c[1] < budget]
  above = [c for c in curve if c[1] > budget]
  if not below or not above:
    return {"step": "-", "flops": 0.0, "accuracy": "-", "interpolated": False}
  (s0, f0, a0), (s1, f1, a1) = below[-1], above[0]
  return {"step": f"{s0}-{s1}", "flops": budget,
          "accuracy": a0 + (a1 - a0) * (budget - f0) / (f1 - f0), "interpolated": True}


def matched_tables(rows: list[dict[str, Any]]) -> list[str]:
  """report.md lines: held-out MLM accuracy of finished runs at equal steps and at equal FLOPs.

  Equal steps: the last evaluation at or before the largest step every finished run
  evaluated at. Equal FLOPs: the smallest total model FLOPs among the finished runs
  of the same pretraining seed (differences are paired by seed; the ablation's
  equal-FLOPs fine-tuning uses the same budget); each run read there by read_at_flops
  (its evaluation within 1% of the budget, else interpolated between the two around
  it, and the row says so).
  """
  done = [r for r in rows if r["finished"] and r["curve"]]
  if not done:
    return []
  steps = min(r["curve"][-1][0] for r in done)
  budgets: dict[int, float] = {}
  for r in done:
    budgets[r["seed"]] = min(budgets.get(r["seed"], r["curve"][-1][1]), r["curve"][-1][1])
  lines = [f"## At equal steps ({steps:,}) and at equal model FLOPs ({_budgets(budgets)})", "",
           "| setting | seed | step | MLM acc (15%) at equal steps | step | PFLOP | MLM acc (15%) "
           "at equal FLOPs |", "|---|---|---|---|---|---|---|"]
  interpolated = False
  for r in done:
    at_steps = [c for c in r["curve"] if c[0] <= steps]
    a = at_steps[-1] if at_steps else ("-", 0.0, "-")
    b = read_at_flops(r["curve"], budgets[r["seed"]])
    interpolated |= b["interpolated"]
    step = f"interpolated {b['step']}" if b["interpolated"] else b["step"]
    lines.append(f"| {r['setting']} | {r['seed']} | {a[0]} | {_fmt(a[2])} | {step} | "
                 f"{b['flops'] / 1e15:.4g} | {_fmt(b['accuracy'])} |")
  lines += ["", f"At equal FLOPs each run is read at its evaluation nearest the budget when its "
            f"model FLOPs, as executed (its batch log), are within "
            f"{EQUAL_FLOPS_TOLERANCE:.0%} of it"
            + ('; otherwise ("interpolated a-b", not a measurement) linearly in model FLOPs '
               "between its evaluations at steps a and b, just below and just above the budget, "
               "at the budget itself." if interpolated else ".")]
  return lines + [""]


def _budgets(budgets: dict[int, float]) -> str:
  """'4e-06 PFLOP, the smallest finished run's of each pretraining seed' (or one per seed)."""
  values = sorted(set(budgets.values()))
  if len(values) == 1:
    return f"{values[0] / 1e15:.4g} PFLOP, the smallest finished run's of each pretraining seed"
  return ("the smallest finished run's of each pretraining seed: " + ", ".join(
      f"seed {seed} {b / 1e15:.4g} PFLOP" for seed, b in sorted(budgets.items())))


def equal_flops_downstream(rows: list[dict[str, Any]], tasks: list[str]) -> list[str]:
  """report.md lines: step mode's downstream at equal model FLOPs, each finished run
  fine-tuned from its checkpoint at the smallest FLOPs of its seed's runs
  (DIR/equal_flops.json)."""
  done = [r for r in rows if r["finished"] and r.get("equal_flops")]
  if not done or not tasks:
    return []
  budgets = {r["seed"]: r["equal_flops"]["budget"] for r in done}
  lines = [f"## Downstream at equal model FLOPs ({_budgets(budgets)})", "",
           "Each run fine-tuned with the same sweep from its kept checkpoint (one per "
           f"evaluation point) nearest the budget within {EQUAL_FLOPS_TOLERANCE:.0%}, else the "
           "last one below it (the PFLOP column says where); the equal-steps figures are in "
           "the Runs table.", "",
           "| setting | seed | step | PFLOP | " + " | ".join(
               f"{t} {_metric(rows, t)} median (min-max)" for t in tasks) + " |",
           "|---|---|---|---|" + "---|" * len(tasks)]
  for r in done:
    e = r["equal_flops"]
    cells = [_range(e["downstream"][t]["values"]) if t in e["downstream"] else "not run"
             for t in tasks]
    lines.append(f"| {r['setting']} | {r['seed']} | {e['step']} | {e['flops'] / 1e15:.4g} | "
                 + " | ".join(cells) + " |")
  return lines + [""]


def equal_flops_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """Step mode: the finished rows as read at equal FLOPs (held-out MLM accuracy at the
  equal-FLOPs evaluation, downstream from that checkpoint), for ablation_stats; [] unless
  every one has its equal-FLOPs sweep."""
  if not rows or not all(r.get("equal_flops") for r in rows):
    return []
  out = []
  for r in rows:
    e = r["equal_flops"]
    at = [c for c in r["curve"] if c[0] == e["step"]]
    out.append({**r, "eval_mlm_accuracy": at[-1][2] if at else None,
                "downstream": e["downstream"]})
  return out


def results_csv(rows: list[dict[str, Any]], tasks: list[str]) -> str:
  """results.csv: one line per run (curves and per-seed values stay in the workdirs)."""
  columns = ["run", "setting", "seed", "ratio", "schedule", "mean_ratio", "mix", "unit",
             "uncorrupted_fraction",
             "prediction_slots", "steps", "total_steps", "tokens", "predictions", "model_flops",
             "wall_time_s", "achieved_tflops", "mfu", "eval_mlm_loss", "eval_mlm_accuracy",
             "eval_nsp_accuracy", "eval_own_mlm_loss", "eval_own_mlm_accuracy"]
  for task in tasks:
    columns += [f"{task}_median", f"{task}_min", f"{task}_max", f"{task}_lr"]
  out = io.StringIO()
  writer = csv.DictWriter(out, columns, extrasaction="ignore", lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({c: row.get(c, "") for c in columns})
  return out.getvalue()


def _fmt(value: Any, digits: int = 4) -> str:
  return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def report_markdown(plan: dict[str, Any], rows: list[dict[str, Any]], tasks: list[str],
                    plots: list[str], random_init: dict[str, dict[str, Any]] | None = None,
                    given_up: tuple[str, ...] = ()) -> str:
  """report.md: the per-run table, the per-setting summary, the plots and what the numbers are.

  `given_up`: runs named unfinished that never wrote a config (a launched job that failed at
  every start): named unfinished, not "not started yet".
  """
  header = ["run", "ratio", "schedule", "mix", "unit", "P", "steps", "tokens", "predictions",
            "model PFLOP", "wall", "TFLOP/s", "MFU", "held-out MLM loss (15%)",
            "held-out MLM acc (15%)", "MLM acc (own ratio)"]
  header += [f"{task} {_metric(rows, task)} median (min-max)" for task in tasks]
  table = []
  for r in rows:
    cells = [r["run"], r["ratio"], r["schedule"], r["mix"], r["unit"], r["prediction_slots"],
             f"{r['steps']}/{r['total_steps']}", f"{r['tokens']:,}", f"{r['predictions']:,}",
             f"{r['model_flops'] / 1e15:.4g}", duration(r["wall_time_s"]),
             _fmt(r["achieved_tflops"], 3), _fmt(r["mfu"], 3), _fmt(r["eval_mlm_loss"]),
             _fmt(r["eval_mlm_accuracy"]), _fmt(r["eval_own_mlm_accuracy"])]
    for task in tasks:
      cells.append(f"{r[f'{task}_median']:.4f} ({r[f'{task}_min']:.4f}-{r[f'{task}_max']:.4f})"
                   if f"{task}_median" in r else "not run")
    table.append(cells)
  seen = {row["run"] for row in rows}
  missing = [r["name"] for r in plan["runs"] if r["name"] not in seen and r["name"] not in given_up]
  unfinished = [r["run"] for r in rows if not r["finished"]] + [
      r["name"] for r in plan["runs"] if r["name"] in given_up and r["name"] not in seen]
  lines = [f"# Masking ablation: {plan['variant']}", "",
           f"{len(plan['settings'])} masking settings x pretraining seeds "
           f"{plan['pretrain_seeds']}; downstream: "
           + (", ".join(f"{t} ({c['name']}, lr {c['learning_rates']} x seeds {c['seeds']})"
                        for t, c in plan["tasks"].items()) or "none") + ".",
           "Finished runs of one seed start from the same parameters and were proven to have "
           "read identical unmasked batches at every step 1..N, every process's batch log "
           "complete (experiments/ablation/proof.py), with configs that differ only in "
           "data.masking (and, under a FLOP budget, in their step counts).", "",
           "## Runs", "", markdown_table(header, table), ""]
  if missing:
    lines += [f"Not started yet: {', '.join(missing)}.", ""]
  if unfinished:
    lines += [f"Unfinished (left out of every comparison below): "
              f"{', '.join(unfinished)}.", ""]
  finished = [r for r in rows if r["finished"]]
  lines += matched_tables(rows)
  lines += equal_flops_downstream(rows, tasks)
  lines += [ablation_stats.comparison_markdown(finished, tasks, plan.get("baseline", "r15"),
                                               random_init or {})]
  at_equal_flops = equal_flops_rows(finished)
  if at_equal_flops:  # step mode: the same statements for the runs read at equal FLOPs
    lines += [ablation_stats.comparison_markdown(
        at_equal_flops, tasks, plan.get("baseline", "r15"), random_init or {}).replace(
            "## What the data can support", "## What the data can support at equal model "
            "FLOPs (step mode: each run's checkpoint at the smallest FLOPs of its seed's runs)", 1)]
  by_setting = _by_setting([r for r in rows if r["finished"]], tasks)
  if any(len(s["runs"]) > 1 for s in by_setting.values()):
    lines += ["## Per setting (pooled over pretraining seeds)", "",
              markdown_table(["setting", "runs", "held-out MLM acc (15%) median"]
                             + [f"{t} median (min-max)" for t in tasks],
                             [[name, len(s["runs"]), _fmt(s["mlm"])]
                              + [_range(s["tasks"].get(t)) for t in tasks]
                              for name, s in by_setting.items()]), ""]
  lines += ["## Plots", ""] + [f"![{p}](plots/{p}.png)" for p in plots] + [""]
  lines += ["## What the numbers are", "",
            "- uncorrupted_fraction (results.csv): the expected share of predictions whose input "
            "token is left unchanged (keep_prob, plus the uncorrupted predictions of "
            "predict_ratio); masking_spec.MaskingSpec.uncorrupted_fraction.",
            "- held-out MLM at 15%: the fixed held-out set (BERT masking at 15%, the same masks "
            "for every run), at the last step; own ratio: the same pairs masked with the run's "
            "own knobs at the ratio it ends training at.",
            "- tokens / predictions: real (non-padding) tokens and real MLM predictions the run "
            "trained on, summed from its per-step batch log.",
            "- model FLOPs: bert_jax.pretrain.cost.step_flops summed over the steps, with each step's "
            "real predictions from batch_log (encoder per token, MLM head and tied decoder per "
            "prediction, pooler/NSP per sequence); P is the static slot count the step was "
            "shaped for. TFLOP/s is FLOPs over the training loop's wall time; MFU only where "
            "the device's peak is known.",
            "- downstream: " + downstream_note(rows, tasks), ""]
  return "\n".join(lines)


def downstream_note(rows: list[dict[str, Any]], tasks: list[str]) -> str:
  """How the downstream figures were chosen: on test at the dev-picked learning rate
  where every task carved a test split (config.task.test_fraction), else on dev."""
  metrics = {_metric(rows, task) for task in tasks}
  common = ("median and min-max over fine-tuning seeds of each task's main metric; "
            "schedules sit at their mean ratio on the ratio axis. ")
  if metrics and all(m.startswith("test/") for m in metrics):
    return (common + "Learning rate picked on dev, reported on test: the rate with the "
            "best dev median over seeds, the figures on a labelled test split at it (carved "
            "out of train by text hash, bert_jax/finetune/readers/splits.carve_test), so the choice "
            "does not inflate them. The edge-of-grid warnings are about the dev pick.")
  return (common + "The learning rate is chosen on the same dev split it is reported on "
          "(no held-out test split: config.task.test_fraction=0), so these numbers are "
          "optimistic by the choice.")


def _metric(rows: list[dict[str, Any]], task: str) -> str:
  for r in rows:
    if task in r["downstream"]:
      return r["downstream"][task]["metric"]
  return "metric"


def _range(values: list[float] | None) -> str:
  if not values:
    return "not run"
  return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def _by_setting(rows: list[dict[str, Any]], tasks: list[str]) -> dict[str, dict[str, Any]]:
  """Per setting: its runs, median held-out accuracy, pooled fine-tuning values per task."""
  out: dict[str, dict[str, Any]] = {}
  for r in rows:
    s = out.setdefault(r["setting"], {"runs": [], "accs": [], "tasks": {}, "row": r})
    s["runs"].append(r["run"])
    if r["eval_mlm_accuracy"] != "":
      s["accs"].append(r["eval_mlm_accuracy"])
    for t in tasks:
      if t in r["downstream"]:
        s["tasks"].setdefault(t, []).extend(r["downstream"][t]["values"])
  for s in out.values():
    s["mlm"] = statistics.median(s["accs"]) if s["accs"] else ""
  return out


def write_plots(workdir: str, rows: list[dict[str, Any]], tasks: list[str],
                random_init: dict[str, dict[str, Any]] | None = None) -> list[str]:
  """plots/*.png (matplotlib, Agg); returns the names written."""
  import matplotlib  # pylint: disable=g-import-not-at-top  # only the report draws
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  settings = list(dict.fromkeys(r["setting"] for r in rows))
  colors = {s: plt.get_cmap("tab10")(i % 10) for i, s in enumerate(settings)}
  styles = ["-", "--", ":", "-."]
  by_setting = _by_setting([r for r in rows if r["finished"]], tasks)

  def curves(ax, x_index, xlabel):
    for r in rows:
      if r["curve"]:
        xs = [c[x_index] for c in r["curve"]]
        ax.plot(xs, [c[2] for c in r["curve"]], styles[r["seed"] % len(styles)],
                color=colors[r["setting"]], marker=".", label=r["run"])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out MLM accuracy (15% masks)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)

  def downstream(ax, task):
    for name, s in by_setting.items():
      values = s["tasks"].get(task)
      if not values:
        continue
      x, median = s["row"]["mean_ratio"], statistics.median(values)
      schedule = s["row"]["schedule"] != "constant"
      ax.errorbar([x], [median], yerr=[[median - min(values)], [max(values) - median]],
                  fmt="s" if schedule else "o", color=colors[name], capsize=4, label=name)
      # Per-seed points: one per pretraining run (its median over fine-tuning seeds).
      per_run = [statistics.median(r["downstream"][task]["values"]) for r in rows
                 if r["setting"] == name and task in r["downstream"]]
      ax.plot([x] * len(per_run), per_run, "x", color=colors[name], alpha=0.6)
    if random_init and task in random_init:
      ax.axhline(statistics.median(random_init[task]["values"]), color="grey", linestyle="--",
                 label="random init (median)")
    ax.set_xlabel("masking ratio (schedules: mean over training)")
    ax.set_ylabel(f"{task}: {_metric(rows, task)} median (min-max)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)

  written = []

  def save(fig, name):
    figures.write_png(fig, paths.join(workdir, "plots", f"{name}.png"), dpi=120)
    written.append(name)

  for name, index, label in (("mlm_accuracy_vs_step", 0, "training step"),
                             ("mlm_accuracy_vs_flops", 1, "model FLOPs")):
    fig, ax = plt.subplots(figsize=(6, 4))
    curves(ax, index, label)
    save(fig, name)
  fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(5 * max(len(tasks), 1), 4),
                           squeeze=False)
  for ax, task in zip(axes[0], tasks):
    downstream(ax, task)
  save(fig, "downstream_vs_ratio")
  # The paper figure: compute-matched pretraining quality next to downstream quality.
  panels = 1 + min(len(tasks), 2)
  fig, axes = plt.subplots(1, panels, figsize=(5 * panels, 4), squeeze=False)
  curves(axes[0][0], 1, "model FLOPs")
  axes[0][0].set_title("(a) held-out MLM accuracy vs compute")
  for i, task in enumerate(tasks[:2], 1):
    downstream(axes[0][i], task)
    axes[0][i].set_title(f"({chr(ord('a') + i)}) {task} vs masking ratio")
  save(fig, "figure")
  return written


def write_report(workdir: str, plan: dict[str, Any], unfinished: tuple[str, ...] = ()
                 ) -> list[str]:
  """Writes report.md, results.csv and plots/ from the workdirs; returns the files written.

  `unfinished`: runs the identical-data proof set aside (reported, never compared).
  """
  rows = collect(workdir, plan, unfinished)
  # A downstream suite's members are tasks; their average is one more column.
  tasks = list(plan["tasks"]) + ([ablation_suite.SUITE_AVERAGE] if plan.get("suite") else [])
  random_init = random_init_downstream(workdir, plan)
  plots = write_plots(workdir, rows, tasks, random_init)
  paths.write_atomic(paths.join(workdir, "results.csv"), results_csv(rows, tasks))
  paths.write_atomic(paths.join(workdir, "report.md"),
                     report_markdown(plan, rows, tasks, plots, random_init, tuple(unfinished)))
  return ["report.md", "results.csv"] + [f"plots/{p}.png" for p in plots]

