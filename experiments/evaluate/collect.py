"""From the members' summary.json files to the figures of the table: ours, and the averages.

A member's figure is what its sweep's summary.json says (bert_jax/finetune/trainer.py):
the learning rate whose median main dev metric is best, and at it each metric's
median, min and max over seeds. A member under the restarts rule ("best", the
paper's several restarts for unstable small sets) reports instead its one (rate,
seed) run with the best main dev metric. Figures are in percent (SQuAD's EM and F1
already are).

The GLUE averages, computed two ways, each only when all nine tasks are done:
  glue_score  the leaderboard's (Wang et al. 2019, section 3.4): a task with several
              metrics scores their unweighted mean (MRPC and QQP: F1 and accuracy;
              STS-B: Pearson and Spearman; MNLI: matched and mismatched accuracy,
              one task), then the unweighted mean of the nine tasks; also without WNLI.
  table1      Table 1's "Average" of Devlin et al. 2019: its one figure per task
              (MRPC and QQP F1, STS-B Spearman, CoLA MCC, the rest accuracy) with
              MNLI-m and MNLI-mm as two figures and WNLI left out: nine figures. The
              paper's 79.6 / 82.1 are that mean of its own Table 1 row (the test
              computes it back).
"""

import json
import statistics
from typing import Any

from experiments.configs import finetune as finetune_configs
from host import paths

SUMMARY_FILE = "summary.json"  # bert_jax.finetune.trainer.SUMMARY_FILE (no JAX import here)
RESULT_FILE = "result.json"
PERCENT_KINDS = ("squad",)  # kinds whose metrics are already in percent
GLUE = finetune_configs.GLUE
GLUE_NO_WNLI = tuple(t for t in GLUE if t != "wnli")


def _read_json(path: str) -> dict[str, Any]:
  return json.loads(paths.read_text(path)) if paths.exists(path) else {}


def run_dir(member_dir: str, lr: str, seed: Any, runs: int) -> str:
  """Where one (rate, seed) run of a sweep lives (the member's workdir when it is the only one);
  relative when `member_dir` is (paths.join would anchor it at the cwd)."""
  return member_dir if runs == 1 else f"{member_dir.rstrip('/')}/lr{lr}_seed{seed}"


def planned(entry: dict[str, Any]) -> tuple[list[str], list[str]]:
  """(learning rates as summary.json spells them, seeds as strings) of a recorded member."""
  config = entry["config"]
  return [f"{float(lr):g}" for lr in config["learning_rates"]], [str(s) for s in config["seeds"]]


def finished(summary: dict[str, Any], entry: dict[str, Any]) -> bool:
  """Whether `summary` holds exactly the runs the record plans (a sweep grown since is not)."""
  lrs, seeds = planned(entry)
  by_lr = summary.get("by_learning_rate", {})
  return (sorted(by_lr) == sorted(lrs)
          and all(sorted(map(str, by_lr[lr]["per_seed"])) == sorted(seeds) for lr in lrs))


def member(workdir: str, name: str, entry: dict[str, Any]) -> dict[str, Any]:
  """One member's figures (see the module docstring); "done" False until its sweep ends."""
  spec, config = entry["spec"], entry["config"]
  summary = _read_json(paths.join(workdir, name, SUMMARY_FILE))
  out = {"name": name, "task": entry["task"], "kind": entry["kind"], "rule": entry["rule"],
         "paper": spec["paper"], "counts": entry["counts"],
         "learning_rates": planned(entry)[0], "seeds": planned(entry)[1],
         "epochs": config["num_epochs"], "batch_size": config["batch_size"],
         "max_train_examples": config["task.max_train_examples"],
         "max_dev_examples": config["task.max_dev_examples"],
         "done": bool(summary) and finished(summary, entry)}
  main = summary.get("main_metric", "")
  out["metrics"] = list(spec["metrics"]) or ([main] if main else [])
  out["headline"] = list(spec["headline"]) or out["metrics"][:1]
  if not out["done"]:
    return out
  scale = 1.0 if entry["kind"] in PERCENT_KINDS else 100.0
  by_lr = summary["by_learning_rate"]
  runs = len(out["learning_rates"]) * len(out["seeds"])
  lr = f"{summary['learning_rate']:g}"
  first = next(iter(by_lr[lr]["per_seed"].values()))
  missing = [k for k in out["metrics"] if k not in first]
  if missing:  # before any figure is read: a suite naming a metric its task never reports
    raise ValueError(f"member {name!r}: metrics {missing} are not in its summary.json "
                     f"(it has {sorted(first)}); fix the suite's metrics")
  if entry["rule"] == "best":  # the best (rate, seed) on the main dev metric
    lr, seed = max(((l, s) for l in by_lr for s in by_lr[l]["per_seed"]),
                   key=lambda ls: (by_lr[ls[0]]["per_seed"][ls[1]][main], -float(ls[0])))
    chosen = {k: by_lr[lr]["per_seed"][seed][k] for k in out["metrics"]}
  else:
    seed = max(by_lr[lr]["per_seed"], key=lambda s: (_best_score(
        run_dir(paths.join(workdir, name), lr, s, runs)), -int(s)))
    chosen = {k: summary[k] for k in out["metrics"]}
  seeds = by_lr[lr]["per_seed"]
  out.update(
      learning_rate=lr, best_seed=str(seed), main_metric=main,
      best_run=run_dir(name, lr, seed, runs),
      values={k: {"value": scale * chosen[k],
                  "min": scale * min(r[k] for r in seeds.values()),
                  "max": scale * max(r[k] for r in seeds.values()),
                  "std": scale * statistics.pstdev([r[k] for r in seeds.values()])}
              for k in out["metrics"]},
      per_lr={l: {k: [scale * r[k] for _, r in sorted(v["per_seed"].items(),
                                                       key=lambda kv: int(kv[0]))]
                  for k in out["metrics"]} for l, v in by_lr.items()},
      steps=_read_json(paths.join(workdir, run_dir(name, lr, seed, runs), RESULT_FILE))
      .get("step"))
  return out


def _best_score(run: str) -> float:
  """The run's best dev main metric (best/metrics.json), which its best/ predictions are of."""
  record = _read_json(paths.join(run, "best", "metrics.json"))
  return float(record.get("score", float("-inf")))


def members(workdir: str, record: dict[str, Any]) -> list[dict[str, Any]]:
  """Every recorded member's figures, in the record's (cheap-first) order."""
  return [member(workdir, name, record["members"][name]) for name in record["order"]]


def _value(row: dict[str, Any], metric: str) -> float:
  return row["values"][metric]["value"]


def averages(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """{"glue_score", "glue_score_no_wnli", "table1"}: {"value" (None until all nine GLUE
  tasks are done), "have" (tasks done), "missing"} (see the module docstring)."""
  done = {r["task"]: r for r in rows if r["done"] and r["task"] in GLUE}
  missing = [t for t in GLUE if t not in done]
  out = {}
  for key, tasks in (("glue_score", GLUE), ("glue_score_no_wnli", GLUE_NO_WNLI),
                     ("table1", GLUE_NO_WNLI)):
    value = None
    if not [t for t in tasks if t in missing]:
      if key == "table1":
        value = statistics.fmean(_value(done[t], m) for t in tasks for m in done[t]["headline"])
      else:
        value = statistics.fmean(statistics.fmean(_value(done[t], m) for m in done[t]["metrics"])
                                 for t in tasks)
    out[key] = {"value": value, "have": len(done), "missing": [t for t in tasks if t in missing]}
  return out
