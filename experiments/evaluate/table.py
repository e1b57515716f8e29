"""table.md and results.csv: per task our figures and the paper's beside them, with sources.

table.md holds nothing that changes when the same results are rendered again (no
time, no host): a suite killed and resumed renders the table an uninterrupted one
does. Wall times are in results.csv (TIMING_COLUMNS) and times.md.
"""

import csv
import io
from typing import Any

from experiments.configs import suites
from experiments.evaluate import collect

TABLE_FILE = "table.md"
RESULTS_FILE = "results.csv"
TIMES_FILE = "times.md"
TIMING_COLUMNS = ("wall_time_s", "attempts")
MODELS = {"base": "BERT-Base", "large": "BERT-Large"}
_METRIC_NAMES = {"matthews_corr": "MCC", "f1": "F1", "accuracy": "accuracy",
                 "pearson": "Pearson", "spearman": "Spearman", "exact_match": "EM"}
_TASK_NAMES = {**suites.GLUE_DIRS, "squad_v1": "SQuAD v1.1", "squad_v2": "SQuAD v2.0"}
_AVERAGES = {
    "glue_score": ("GLUE score (9 tasks)", "the leaderboard's: per task the mean of its "
                   "metrics (MRPC, QQP: F1 and accuracy; STS-B: Pearson and Spearman; MNLI: "
                   "matched and mismatched), then the mean of the tasks"),
    "glue_score_no_wnli": ("GLUE score without WNLI (8 tasks)", "the same, WNLI left out"),
    "table1": ("Table 1's average", "one figure per task as Table 1 reports it (MRPC, QQP: "
               "F1; STS-B: Spearman; MNLI-m and MNLI-mm as two), WNLI left out"),
}


def metric_name(key: str) -> str:
  """"dev/f1" -> "F1"; "dev_matched/accuracy" -> "accuracy (matched)"."""
  split, _, metric = key.partition("/")
  name = _METRIC_NAMES.get(metric, metric)
  return f"{name} ({split[4:]})" if split.startswith("dev_") else name


def task_name(row: dict[str, Any]) -> str:
  name = _TASK_NAMES.get(row["task"], row["task"])
  return name if row["name"] == row["task"] else f"{row['name']} ({name})"


def figure_text(figure: dict[str, Any]) -> str:
  """"88.9 test (Table 1, BERT_BASE)": the value, its split and its source."""
  return f"{figure['value']:.1f} {figure['split']} ({figure['table']}, {figure['row']})"


def paper_cell(figures: list[dict[str, Any]], metric: str, model: str) -> str:
  cells = [figure_text(f) for f in figures if f["metric"] == metric and f["model"] == model]
  return "; ".join(cells) or "—"


def _ours(row: dict[str, Any], metric: str) -> str:
  v = row["values"][metric]
  if row["rule"] == "best":
    return f"{v['value']:.1f} (best of {len(row['seeds'])}; seeds {v['min']:.1f}–{v['max']:.1f})"
  return f"{v['value']:.1f} ({v['min']:.1f}–{v['max']:.1f})"


def _protocol(rows: list[dict[str, Any]]) -> str:
  """The protocol the rows ran, said once where members agree, per member where not."""
  def said(show):
    values = {r["name"]: show(r) for r in rows}
    common = max(set(values.values()), key=list(values.values()).count)
    others = ", ".join(f"{n}: {v}" for n, v in values.items() if v != common)
    return common + (f" ({others})" if others else "")
  subset = lambda n, what: f"all {what} examples" if not n else f"at most {n:,} {what} examples"
  parts = ["batch " + said(lambda r: str(r["batch_size"])),
           said(lambda r: f"{r['epochs']} epoch" + ("s" if r["epochs"] != 1 else "")),
           "learning rates {" + said(lambda r: ", ".join(r["learning_rates"])) + "}",
           "seeds " + said(lambda r: ", ".join(r["seeds"])),
           said(lambda r: subset(r["max_train_examples"], "training")),
           said(lambda r: subset(r["max_dev_examples"], "dev"))]
  best = [r["name"] for r in rows if r["rule"] == "best"]
  parts.append("restarts rule (best on dev) for " + ", ".join(best) if best
               else "every member by the median over seeds")
  return "; ".join(parts)


def render_table(record: dict[str, Any], rows: list[dict[str, Any]],
                 averages: dict[str, dict[str, Any]], init_checkpoint: str,
                 zip_note: str) -> str:
  """table.md (see the module docstring)."""
  lines = [f"# Suite `{record['suite']}` from `{init_checkpoint}`", "",
           "Ours: dev-set figures in percent, the median over seeds at the learning rate "
           "whose median main dev metric is best (min–max over those seeds in brackets); "
           "a member under the restarts rule reports its best (rate, seed) on dev instead, "
           "as the paper did for unstable small sets (selected and reported on the same dev "
           "set, so optimistic). Beside ours, the paper's figures with their source and "
           "split: Table 1's GLUE figures are GLUE test-server figures, a different split "
           "and a different quantity from our dev medians; compare ours with the dev "
           "figures (Tables 2, 3, 5, 6, 7), and read a test figure as a landmark only.", "",
           f"Protocol: {_protocol(rows)}.", "",
           "| task | metric | ours (dev) | lr | seeds | train / dev examples | steps/run "
           "| BERT-Base (paper) | BERT-Large (paper) |",
           "|---|---|---|---|---|---|---|---|---|"]
  for row in rows:
    dev = sum(row["counts"]["dev"].values())
    for i, metric in enumerate(row["metrics"]):
      first = i == 0
      ours = _ours(row, metric) if row["done"] else "not finished"
      cells = [task_name(row) if first else "", metric_name(metric), ours,
               row.get("learning_rate", "—") if first else "",
               str(len(row["seeds"])) if first else "",
               f"{row['counts']['train']:,} / {dev:,}" if first else "",
               str(row.get("steps") or "—") if first else "",
               paper_cell(row["paper"], metric, "base"),
               paper_cell(row["paper"], metric, "large")]
      lines.append("| " + " | ".join(cells) + " |")
  if any(r["task"] in collect.GLUE for r in rows):
    lines += ["", "| average | how | ours (dev) | BERT-Base (paper) | BERT-Large (paper) |",
              "|---|---|---|---|---|"]
    for key, (name, how) in _AVERAGES.items():
      a = averages[key]
      ours = (f"{a['value']:.1f}" if a["value"] is not None else
              f"— (needs {', '.join(a['missing'])}; {a['have']} of 9 GLUE tasks done)")
      figures = record.get("paper_averages", {}).get(key, [])
      lines.append(f"| {name} | {how} | {ours} | {paper_cell(figures, key, 'base')} | "
                   f"{paper_cell(figures, key, 'large')} |")
  lines += ["", zip_note, "",
            f"Sources: the paper figures are {suites.BERT_PAPER} (table and row as printed "
            f"beside each); the GLUE score's rule is {suites.GLUE_PAPER}. Wall times: "
            f"{TIMES_FILE} and {RESULTS_FILE}.", ""]
  return "\n".join(lines)


def render_csv(rows: list[dict[str, Any]], averages: dict[str, dict[str, Any]],
               times: dict[str, Any]) -> str:
  """results.csv: one row per (member, metric), then the averages."""
  columns = ["member", "task", "metric", "done", "rule", "learning_rate", "value", "min", "max",
             "std", "seeds", "best_seed", "train_examples", "dev_examples", "steps_per_run",
             "paper_base", "paper_large", *TIMING_COLUMNS]
  out = io.StringIO()
  writer = csv.DictWriter(out, columns, lineterminator="\n")
  writer.writeheader()
  for row in rows:
    t = times.get(row["name"], {})
    for metric in row["metrics"]:
      v = row.get("values", {}).get(metric, {})
      writer.writerow({
          "member": row["name"], "task": row["task"], "metric": metric, "done": row["done"],
          "rule": row["rule"], "learning_rate": row.get("learning_rate", ""),
          **{k: f"{v[k]:.4f}" if k in v else "" for k in ("value", "min", "max", "std")},
          "seeds": " ".join(row["seeds"]), "best_seed": row.get("best_seed", ""),
          "train_examples": row["counts"]["train"],
          "dev_examples": sum(row["counts"]["dev"].values()),
          "steps_per_run": row.get("steps") or "",
          "paper_base": paper_cell(row["paper"], metric, "base"),
          "paper_large": paper_cell(row["paper"], metric, "large"),
          "wall_time_s": f"{t['seconds']:.0f}" if t else "", "attempts": t.get("attempts", "")})
  for key, a in averages.items():
    if a["value"] is not None:
      writer.writerow({"member": "average", "task": "glue", "metric": key, "done": True,
                       "value": f"{a['value']:.4f}"})
  return out.getvalue()


def render_times(rows: list[dict[str, Any]], times: dict[str, Any]) -> str:
  """times.md: each member's wall time over all its attempts, on the devices it ran on."""
  lines = ["# Wall time per member", "",
           "Each member's time is summed over the attempts that ran it (a killed attempt "
           "counts up to its last heartbeat, at most 5 s before the kill); it includes "
           "reading and featurising the data and compiling.", "",
           "| member | wall time | attempts | runs | steps/run | devices |", "|---|---|---|---|---|---|"]
  total = 0.0
  for row in rows:
    t = times.get(row["name"])
    if not t:
      continue
    total += t["seconds"]
    runs = len(row["learning_rates"]) * len(row["seeds"])
    lines.append(f"| {row['name']} | {_duration(t['seconds'])} | {t['attempts']} | {runs} | "
                 f"{row.get('steps') or '—'} | {t.get('devices', '')} |")
  lines += ["", f"Total: {_duration(total)}.", ""]
  return "\n".join(lines)


def _duration(seconds: float) -> str:
  minutes, s = divmod(int(round(seconds)), 60)
  return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{minutes} min {s:02d} s"
