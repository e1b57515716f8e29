"""The masking ablation's stages: prepare, pretrain, check, fine-tune, report.

What `python -m experiments.ablation` runs (experiments/ablation/__main__.py
says the stages and the exit codes): each stage as a function that resumes, on
the grid of runs the plan makes (experiments.ablation.plan.grid_runs), and
`run_ablation`, which runs a stage and returns the exit code.
"""

import json
import shlex
from typing import Any, Callable

from absl import logging
import ml_collections

from bert_jax import errors
from bert_jax import exit_codes
from bert_jax.run import preemption
from bert_jax.run import workdir as workdir_lib
from experiments.ablation import grid as ablation_grid
from experiments.ablation import plan as ablation_plan
from experiments.ablation import proof as ablation_proof
from experiments.ablation import report as ablation_report
from experiments import chinese_data
from experiments.configs import finetune as finetune_configs
from experiments.configs import pretrain as pretrain_configs
from host import paths

STAGES = ("all", "prepare", "pretrain", "check", "finetune", "report")
# Step mode: each run's checkpoint at the smallest run's FLOPs, and where it is fine-tuned.
AblationError = ablation_proof.AblationError  # bad settings, or runs that differ in more than masks
PRETRAIN_CONFIG_FILE = "experiments/configs/pretrain.py"  # each run's job: one of its variants


# --------------------------------------------------------------------------
# Stages.
# --------------------------------------------------------------------------


def prepare(config: ml_collections.ConfigDict, workdir: str,
            runs: list[ablation_plan.Run]) -> list[ablation_plan.Run]:
  """Writes the corpus (when the config makes one) and plan.json; returns the runs.

  FLOP mode plans here, on the corpus now written: each setting's steps from the
  predictions its own stream makes (ablation_plan.budget_steps(measure=True)); the runs returned
  and recorded are re-planned on them. A plan already recorded for this grid is kept,
  so a re-run (after a kill) trains the very steps its workdirs were made for.
  """
  paths.makedirs(workdir)
  if config.prepare_corpus == "zh_sentiment":
    counts = chinese_data.write_corpus(paths.join(workdir, "corpus.txt"))
    if counts:
      logging.info("corpus: %s", counts)
  elif config.prepare_corpus:
    raise AblationError(f"config.prepare_corpus={config.prepare_corpus!r}: expected "
                        "'zh_sentiment' or ''")
  matched = {}
  if config.budget.mode == "flops":
    matched = ablation_plan.recorded(config, paths.join(workdir, ablation_plan.PLAN_FILE))
    if not matched:
      matched = ablation_plan.budget_steps(config, workdir, measure=True)
      logging.info("FLOP plan on measured predictions: %s", ", ".join(
          f"{name} {m['steps']} steps ({m['predictions_per_step']:.1f} predictions a step)"
          for name, m in matched.items()))
    runs = ablation_plan.grid_runs(config, workdir, matched)
  ablation_plan.write_plan(config, workdir, runs, matched)
  return runs


def pretraining_done(run: ablation_plan.Run, workdir: str) -> bool:
  """Whether the run reached total_steps and evaluated there (its last act)."""
  return ablation_proof.finished(paths.join(workdir, run.pretrain_dir), run.config.total_steps)


def pretrain(runs: list[ablation_plan.Run], workdir: str) -> bool:
  """Trains every unfinished run in turn; False when SIGTERM stopped one (it saved)."""
  from bert_jax.pretrain import trainer as pretrain_lib  # pylint: disable=g-import-not-at-top  # jax/tf only when training
  for i, run in enumerate(runs, 1):
    if pretraining_done(run, workdir):
      logging.info("run %d/%d %s: done", i, len(runs), run.name)
      continue
    logging.info("run %d/%d %s: pretraining %s", i, len(runs), run.name,
                 json.dumps(run.config.data.masking.to_dict()))
    pretrain_lib.train_and_evaluate(run.config, paths.join(workdir, run.pretrain_dir))
    if preemption.was_preempted():
      return False
  return True


def finetune(config: ml_collections.ConfigDict, runs: list[ablation_plan.Run],
             workdir: str) -> bool:
  """Fine-tunes every downstream task from random init and every run; False on SIGTERM."""
  from bert_jax.finetune import sweep as finetune_sweep  # pylint: disable=g-import-not-at-top
  for task, task_dir in ablation_plan.random_init_dirs(config).items():
    target = paths.join(workdir, task_dir)
    if not paths.exists(paths.join(target, finetune_sweep.SUMMARY_FILE)):
      logging.info("random init: fine-tuning %s", task)
      if finetune_sweep.finetune(ablation_plan.finetune_config(config, task, None, workdir), target).get("preempted"):
        return False
  for run in runs:
    if not pretraining_done(run, workdir):
      raise AblationError(f"run {run.name} has not finished pretraining; run the pretrain "
                          "stage first")
    for task, task_dir in run.finetune_dirs.items():
      target = paths.join(workdir, task_dir)
      if paths.exists(paths.join(target, finetune_sweep.SUMMARY_FILE)):
        continue
      logging.info("%s: fine-tuning %s", run.name, task)
      summary = finetune_sweep.finetune(ablation_plan.finetune_config(config, task, run, workdir), target)
      if summary.get("preempted"):
        return False
  # Step mode: the same sweep again from each run's checkpoint at the smallest run's FLOPs
  # (every run has finished pretraining here, so the budget is known).
  matched = ablation_plan.equal_flops_checkpoints(config, runs, workdir)
  for run in runs:
    if run.name not in matched:
      continue
    for task, task_dir in matched[run.name]["finetune"].items():
      target = paths.join(workdir, task_dir)
      if paths.exists(paths.join(target, finetune_sweep.SUMMARY_FILE)):
        continue  # done, or the final checkpoint's own sweep
      logging.info("%s: fine-tuning %s at step %d (equal FLOPs)", run.name, task,
                   matched[run.name]["step"])
      summary = finetune_sweep.finetune(
          ablation_plan.finetune_config(config, task, run, workdir, matched[run.name]["step"]), target)
      if summary.get("preempted"):
        return False
  return True


# --------------------------------------------------------------------------
# The check: runs of one seed differ only in their masks.
# --------------------------------------------------------------------------


def check_identical_data(workdir: str, runs: list[dict[str, Any]], *,
                         flop_mode: bool = False) -> ablation_proof.Proof:
  """Proves that the finished runs of each seed read identical data (experiments/ablation/proof.py).

  `runs` are plan.json's entries. Raises AblationError naming both runs and the
  first differing field or step, or the run whose logs have a hole; returns
  which runs were compared and which are unfinished (named, never compared).
  """
  return ablation_proof.check(workdir, runs, flop_mode=flop_mode)


# --------------------------------------------------------------------------
# --print_commands and --dry_run.
# --------------------------------------------------------------------------


def _flag_value(value: Any) -> str:
  """A config value as ml_collections' --config.X flag parser reads it back."""
  if isinstance(value, (list, tuple)):
    return "(" + "".join(f"{v!r}," for v in value) + ")"  # a tuple literal
  return value if isinstance(value, str) else repr(value)


def _overrides(config: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> list[str]:
  """--config.X=V flags turning `base` into `config` (fields whose values differ), unquoted."""
  want, have = workdir_lib.flatten(config), workdir_lib.flatten(base)
  flags_ = []
  for key in sorted(want):
    if key not in have:
      raise AblationError(f"config field {key} does not exist in the base config file; "
                          "it cannot be set by flag")
    if want[key] != have[key]:
      flags_.append(f"--config.{key}={_flag_value(want[key])}")
  return flags_


def pretrain_job(run: ablation_plan.Run) -> tuple[str, list[str]]:
  """`run` as one bert_jax.main job: (its --config value, its --config.X=V flags, unquoted).

  The flags are the fields where the run's config differs from its variant of
  experiments/configs/pretrain.py (--print_commands prints them; --launch starts them).
  """
  base = pretrain_configs.get_config(run.config.variant)
  return f"{PRETRAIN_CONFIG_FILE}:{run.config.variant}", _overrides(run.config, base)


def _main_command(config_arg: str, workdir: str, flags_: list[str]) -> str:
  """One `python -m bert_jax.main` command line, quoted for a shell."""
  return " ".join(["python -m bert_jax.main", f"--config={config_arg}",
                   f"--workdir={shlex.quote(workdir)}"] + [shlex.quote(f) for f in flags_])


def commands(config: ml_collections.ConfigDict, workdir: str, runs: list[ablation_plan.Run],
             ablation_flags: list[str]) -> list[str]:
  """Shell commands that do what this ablation does, one per run, in dependency order.

  `ablation_flags`: this ablation's own --config and --config.X flags (as given).
  """
  this = " ".join(["python -m experiments.ablation"] + [shlex.quote(f) for f in ablation_flags]
                  + [f"--workdir={shlex.quote(workdir)}"])
  lines = ["# 1. once: the corpus and plan.json", f"{this} --stage=prepare",
           "# 2. pretraining: independent runs, one per machine if you like"]
  for run in runs:
    config_arg, flags_ = pretrain_job(run)
    lines.append(_main_command(config_arg, paths.join(workdir, run.pretrain_dir), flags_))
  lines.append("# 3. fine-tuning, each after its pretraining run")
  for run in runs:
    for task, task_dir in run.finetune_dirs.items():
      task_config = ablation_plan.finetune_config(config, task, run, workdir)
      base = finetune_configs.get_config(task_config.task.name)
      lines.append(_main_command(f"experiments/configs/finetune.py:{task_config.task.name}",
                                 paths.join(workdir, task_dir), _overrides(task_config, base)))
  lines += ["# 4. the identical-data check and the report, once all are done",
            f"{this} --stage=check", f"python -m experiments.ablation "
            f"--workdir={shlex.quote(workdir)} --stage=report"]
  return lines


# --------------------------------------------------------------------------
# Entry.
# --------------------------------------------------------------------------


def run_ablation(config: ml_collections.ConfigDict | None, workdir: str,
                 stage: str = "all",
                 launch: Callable[[list[ablation_plan.Run]], None] | None = None) -> int:
  """Runs `stage` of the ablation in `workdir`; returns the exit code (module docstring).

  `launch`: the pretrain stage as launched jobs (experiments/ablation/launch.py), in
  place of training here; it returns once every run is done or given up on. Runs the
  launched grid gave up on (DIR/grid.json: failed --max_attempts times) and that have
  not finished since are left out of fine-tuning and named unfinished in the report.
  """
  if stage not in STAGES:
    raise AblationError(f"--stage={stage!r}: expected one of {STAGES}")
  try:
    runs = None
    if stage != "report" or config is not None:
      if config is None:
        raise AblationError(f"--stage={stage} needs --config")
      runs = ablation_plan.grid_runs(config, workdir)
    if stage in ("all", "prepare"):
      runs = prepare(config, workdir, runs)
    if stage in ("all", "pretrain"):
      if launch is not None:
        launch(runs)
      elif not pretrain(runs, workdir):
        return exit_codes.PREEMPTED
    if stage == "prepare":
      return 0
    written_plan = ablation_plan.read_plan(workdir)
    # Plans written before FLOP budgets have no "budget": they ran in step mode.
    proof = check_identical_data(workdir, written_plan["runs"],
                                 flop_mode=written_plan.get("budget", {}).get("mode") == "flops")
    given_up = [name for name in ablation_grid.given_up(workdir) if name not in proof.finished]
    unfinished = tuple(proof.unfinished) + tuple(n for n in given_up if n not in proof.unfinished)
    if unfinished:
      logging.warning("unfinished runs, left out of every comparison: %s", ", ".join(unfinished))
    if stage in ("all", "finetune"):
      if not finetune(config, [r for r in runs if r.name not in given_up], workdir):
        return exit_codes.PREEMPTED
    if stage in ("all", "report"):
      written = ablation_report.write_report(workdir, written_plan, unfinished)
      logging.info("report: %s", ", ".join(written))
  except errors.UsageError as e:  # AblationError, WorkdirError, a trainer's refusal of a run
    from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # jax/tf only when running
    code = jobs.refuse(e)  # one line, as bert_jax.main's
    return exit_codes.LOCK_HELD if isinstance(e, workdir_lib.LockHeld) else code
  return 0
