"""A fine-tuning sweep: every (learning rate, seed) run of a config, and its summary.

`finetune(config, workdir)` judges the whole config and every run's workdir, prepares
the task once (bert_jax.finetune.prepare), runs each (learning rate, seed) with
bert_jax.finetune.trainer.finetune_run (each in its own workdir when there are several)
and writes summary.json: per learning rate the median, min, max and standard deviation
over seeds of every dev metric, and the learning rate with the best median main
metric. With config.task.test_fraction a labelled test split is carved out of train
and scored beside dev (test/*): the learning rate is still picked on dev and the
summary reports test at it (summarize).
"""

import copy
import statistics
from typing import Any

from absl import logging
import jax
import ml_collections

from bert_jax import errors
from bert_jax.finetune import prepare as prepare_lib
from bert_jax.finetune import steps
from bert_jax.finetune import trainer
from bert_jax.finetune.kinds import registry
from bert_jax.finetune.readers import splits
from bert_jax.run import workdir as workdir_lib
from bert_jax.training import optim
from bert_jax.training import state as state_lib
from host import paths

SUMMARY_FILE = "summary.json"


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Every (learning rate, seed) run of `config`; returns and writes the summary.

  The summary's top-level "dev/..." entries are the medians over seeds of the
  final dev metrics at the best learning rate; "per_seed" holds that learning
  rate's runs, "spread" their min/max/std, "by_learning_rate" all of them; "speed"
  each run's train padding and the programs the sweep compiled.
  """
  learning_rates = list(config.learning_rates) or [config.optimizer.learning_rate]
  seeds = list(config.seeds)
  runs = _runs(config, workdir, learning_rates, seeds)
  steps.use_compilation_cache()  # before any compile: a later sweep loads what this one compiles
  with errors.judging_input():  # every ValueError here is a refusal of the input
    if not seeds:
      raise ValueError("config.seeds is empty: give at least one seed")
    workdir_lib.check_family(workdir, config)  # not another job's workdir (reads only)
    mesh, _ = state_lib.setup_mesh(config)
    prepare_lib.check_config(config, mesh)  # before any data is read
    for lr in learning_rates:  # every run's optimizer values, before anything is written
      run_optimizer = copy.deepcopy(config.optimizer)
      with run_optimizer.unlocked():
        run_optimizer.learning_rate = lr
      optim.check_config(run_optimizer)
    for _, _, run_config, run_dir in runs:  # a busy workdir, a contradicting record: no data yet
      workdir_lib.check_before_data(run_dir, run_config, None,
                                    vocab_file=config.vocab_file or None,
                                    spm_model_file=config.spm_model_file or None,
                                    lock_dir=workdir)
    prepared = prepare_lib.prepare(config)  # every input read and checked before anything is written
  lock = workdir_lib.lock(workdir)  # one sweep per workdir; its runs share the lock
  by_lr, speed = {}, {}
  try:
    for lr, seed, run_config, run_dir in runs:
      run = trainer.finetune_run(run_config, run_dir, prepared, locked=True)
      if run["preempted"]:  # SIGTERM: the run saved; the same command resumes the sweep
        return {"preempted": True}
      by_lr.setdefault(f"{lr:g}", {})[seed] = run["final"]
      speed[f"lr{lr:g}_seed{seed}"] = run["padding"]
      speed["compiled"] = run["compiled"]  # the sweep's so far: the last run's is the total
  finally:
    if lock is not None:
      lock.release()
  summary = summarize(by_lr, registry.get_kind(config.task.kind).main_metric(config.task))
  summary["speed"] = speed
  if jax.process_index() == 0:
    trainer.write_json(paths.join(workdir, SUMMARY_FILE), summary)
  main, reported = summary["main_metric"], summary["reported_metric"]
  logging.info("%s: %s median %.4f over seeds %s (lr %s picked on %s)", config.task.name,
               reported, summary[reported], seeds, summary["learning_rate"], main)
  return summary


def _runs(config: ml_collections.ConfigDict, workdir: str, learning_rates: list[float],
          seeds: list[int]) -> list[tuple[float, int, ml_collections.ConfigDict, str]]:
  """(learning rate, seed, its config, its workdir) of every run of a sweep, in run order:
  each in its own lr<rate>_seed<seed>/ when there are several, else `workdir` itself."""
  several = len(learning_rates) * len(seeds) > 1
  runs = []
  for lr in learning_rates:
    for seed in seeds:
      run_config = copy.deepcopy(config)
      with run_config.unlocked():
        run_config.optimizer.learning_rate = lr
        run_config.seed = seed
      runs.append((lr, seed, run_config,
                   paths.join(workdir, f"lr{lr:g}_seed{seed}") if several else workdir))
  return runs


def summarize(by_lr: dict[str, dict[Any, dict[str, float]]], main_metric: str) -> dict[str, Any]:
  """The sweep's summary from {learning rate: {seed: final metrics}}.

  The learning rate is the one with the best median main dev metric
  ("main_metric"). "reported_metric" is the figure to report: with a carved test
  split (config.task.test_fraction) the same metric on test at that learning
  rate -- picked on dev, reported on test, so the pick does not inflate it --
  else the dev metric itself. Top-level "dev/..." and "test/..." entries are
  medians over seeds at the chosen rate, "per_seed" its runs, "spread" their
  min/max/std; "by_learning_rate" has every rate's medians and every (seed) run's
  metrics, dev and test.
  """
  first = next(iter(next(iter(by_lr.values())).values()))
  main = trainer.main_key(first, main_metric)
  test_main = f"{splits.TEST_SPLIT}/{main_metric}"
  reported = test_main if test_main in first else main
  best_lr = max(by_lr, key=lambda lr: statistics.median(r[main] for r in by_lr[lr].values()))
  runs = by_lr[best_lr]
  keys = [k for k in first if k.startswith(("dev", splits.TEST_SPLIT + "/"))]
  summary = {k: statistics.median(r[k] for r in runs.values()) for k in keys}
  summary.update(
      learning_rate=float(best_lr), main_metric=main, reported_metric=reported, per_seed=runs,
      spread={k: {"min": min(r[k] for r in runs.values()), "max": max(r[k] for r in runs.values()),
                  "std": statistics.pstdev([r[k] for r in runs.values()])} for k in keys},
      by_learning_rate={
          lr: {**{"median_" + k: statistics.median(r[k] for r in rs.values())
                  for k in dict.fromkeys((main, reported))},
               "per_seed": rs}
          for lr, rs in by_lr.items()})
  return summary
