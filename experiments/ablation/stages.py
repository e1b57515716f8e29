"""The masking ablation's stages: plan, prepare, pretrain, check, fine-tune, report.

What `python -m experiments.ablation` runs (experiments/ablation/__main__.py
says the stages and the exit codes): the grid of runs a config plans
(`plan`), each stage as a function that resumes, and `run_ablation`, which
runs a stage and returns the exit code.
"""

import copy
import dataclasses
import json
import re
import shlex
from typing import Any, Callable

from absl import logging
import ml_collections

from bert_jax import errors
from bert_jax import exit_codes
from bert_jax.run import checkpoint
from bert_jax.run import preemption
from bert_jax.run import workdir as workdir_lib
from data_pipeline import specs
from experiments.ablation import grid as ablation_grid
from experiments.ablation import plan as ablation_plan
from experiments.ablation import proof as ablation_proof
from experiments.ablation import report as ablation_report
from experiments.ablation import suite as ablation_suite
from experiments import chinese_data
from experiments.configs import ablation as ablation_configs
from experiments.configs import finetune as finetune_configs
from experiments.configs import pretrain as pretrain_configs
from host import paths

STAGES = ("all", "prepare", "pretrain", "check", "finetune", "report")
PLAN_FILE = "plan.json"
PRETRAIN_DIR = "pretrain"
FINETUNE_DIR = "finetune"
RANDOM_INIT = "random_init"  # finetune/random_init/<task>: the no-pretraining floor
# Step mode: each run's checkpoint at the smallest run's FLOPs, and where it is fine-tuned.
EQUAL_FLOPS_FILE = ablation_report.EQUAL_FLOPS_FILE
EQUAL_FLOPS_SUFFIX = "_equal_flops"  # finetune/<run>/<task>_equal_flops
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
AblationError = ablation_proof.AblationError  # bad settings, or runs that differ in more than masks
PRETRAIN_CONFIG_FILE = "experiments/configs/pretrain.py"  # each run's job: one of its variants


@dataclasses.dataclass
class Run:
  """One pretraining run of the grid and where its outputs go (paths relative to DIR)."""
  name: str  # "<setting>_seed<k>"
  setting: str
  seed: int
  config: ml_collections.ConfigDict  # its complete pretraining config
  pretrain_dir: str
  finetune_dirs: dict[str, str]  # downstream task -> fine-tuning sweep workdir


# --------------------------------------------------------------------------
# The plan: configs of every run.
# --------------------------------------------------------------------------


def _fill_workdir(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Replaces the {workdir} placeholder in every string field (corpus paths) with `workdir`."""
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      _fill_workdir(value, workdir)
    elif isinstance(value, str) and ablation_configs.WORKDIR in value:
      config[key] = value.replace(ablation_configs.WORKDIR, workdir)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Refuses, before anything is written, settings that are not masking fields or not valid."""
  if config.family != "ablation":
    raise AblationError(f"config.family={config.family!r}: experiments.ablation runs "
                        "experiments/configs/ablation.py configs")
  if not config.settings or not config.pretrain_seeds:
    raise AblationError("config.settings and config.pretrain_seeds must not be empty")
  fields = set(config.pretrain.data.masking.keys())
  for name, setting in config.settings.items():
    if not _NAME.match(name):
      raise AblationError(f"setting name {name!r}: use letters, digits, '_', '-', '.' "
                          "(it names a workdir)")
    unknown = sorted(set(setting.keys()) - fields)
    if unknown:
      raise AblationError(f"config.settings.{name} sets {unknown}, which are not fields of "
                          "pretrain.data.masking: a setting may change the masks and nothing else")
  if config.budget.mode not in ablation_plan.MODES:
    raise AblationError(f"config.budget.mode={config.budget.mode!r}: expected one of "
                        f"{ablation_plan.MODES}")
  if (config.budget.mode == "steps" and config.budget.get("finetune_at_equal_flops", True)
      and config.downstream):
    _check_eval_checkpoints(config.pretrain)
  if config.budget.mode == "flops" and config.pretrain.phase2.start_fraction < 1.0:
    # ablation_plan's per-step estimate is of one sequence length.
    raise AblationError(
        f"config.budget.mode='flops' with config.pretrain.phase2.start_fraction="
        f"{config.pretrain.phase2.start_fraction}: the FLOP plan matches single-phase runs; "
        "set start_fraction=1.0 (one length throughout) or budget.mode='steps'")
  if config.report.baseline not in config.settings:
    raise AblationError(f"config.report.baseline={config.report.baseline!r} is not a setting "
                        f"({sorted(config.settings)}): differences are taken to it")
  for task, task_config in config.downstream.items():
    if task_config.family != "finetune" or task_config.init_checkpoint:
      raise AblationError(f"config.downstream.{task} must be a finetune.py config without "
                          "init_checkpoint (each run's checkpoint is filled in)")


def _check_eval_checkpoints(pretrain: ml_collections.ConfigDict) -> None:
  """Refuses, before hours of pretraining, checkpoints that would not all survive at the
  evaluation points: step mode fine-tunes the one at the smallest run's FLOPs."""
  every, ckpt = pretrain.eval_every_steps, pretrain.checkpoint
  saves = -(-pretrain.total_steps // ckpt.every_steps) + 1  # every_steps multiples, the end
  kept = ((ckpt.keep_period and every % ckpt.keep_period == 0) or ckpt.keep >= saves)
  if every % ckpt.every_steps or not kept:
    raise AblationError(
        f"pretrain.checkpoint (every_steps={ckpt.every_steps}, keep={ckpt.keep}, "
        f"keep_period={ckpt.keep_period}) does not keep a checkpoint at every evaluation "
        f"point (eval_every_steps={every}), which the equal-FLOPs fine-tuning of step mode "
        "starts from: set checkpoint.every_steps and keep_period to eval_every_steps, or "
        "config.budget.finetune_at_equal_flops=False")


def pretrain_config(config: ml_collections.ConfigDict, setting: str, seed: int,
                    workdir: str) -> ml_collections.ConfigDict:
  """The complete pretraining config of (setting, seed): the base with only masks and seeds set."""
  run = copy.deepcopy(config.pretrain)
  _fill_workdir(run, workdir)
  with run.unlocked():
    for key, value in config.settings[setting].items():
      run.data.masking[key] = value
    run.seed = seed  # initial parameters and dropout
    run.data.seed = seed  # pairs, their order and the masks' random draws
  try:
    specs.check_data_config(run.data)
  except ValueError as e:
    raise AblationError(f"config.settings.{setting}: {e}") from None
  return run


def budget_steps(config: ml_collections.ConfigDict, workdir: str,
                 measure: bool = False) -> dict[str, dict[str, Any]]:
  """FLOP mode: {setting: steps, FLOPs per step, FLOPs} spending config.budget.flops; else {}.

  `measure`: on the predictions each setting's input stream makes (its corpus must
  exist: the prepare stage); else on the full-sequence estimate (ablation_plan).
  """
  if config.budget.mode != "flops":
    return {}
  runs = {s: pretrain_config(config, s, 0, workdir) for s in config.settings}
  try:
    if measure:
      return ablation_plan.matched_steps_measured(runs, config.report.baseline,
                                                  config.budget.flops,
                                                  config.budget.measure_batches)
    return ablation_plan.matched_steps(runs, config.report.baseline, config.budget.flops)
  except ValueError as e:
    raise AblationError(str(e)) from None


def plan(config: ml_collections.ConfigDict, workdir: str,
         matched: dict[str, dict[str, Any]] | None = None) -> list[Run]:
  """Every run of the grid, seed-major (all settings of seed 0 first).

  FLOP mode's steps: `matched` when given, else the measured plan recorded in the
  workdir's plan.json, else the estimate (before the prepare stage, --dry_run).
  """
  check_config(config)
  if matched is None:
    matched = (ablation_plan.recorded(config, paths.join(workdir, PLAN_FILE))
               or budget_steps(config, workdir))
  runs = []
  for seed in config.pretrain_seeds:
    for setting in config.settings:
      name = f"{setting}_seed{seed}"
      run_config = pretrain_config(config, setting, int(seed), workdir)
      if setting in matched:  # FLOP mode: its own step count, the schedule stretched to it
        run_config = ablation_plan.stretch(run_config, matched[setting]["steps"])
      runs.append(Run(name=name, setting=setting, seed=int(seed), config=run_config,
                      pretrain_dir=f"{PRETRAIN_DIR}/{name}",
                      finetune_dirs={task: f"{FINETUNE_DIR}/{name}/{task}"
                                     for task in config.downstream}))
  return runs


def finetune_config(config: ml_collections.ConfigDict, task: str, run: Run | None,
                    workdir: str, step: int | None = None) -> ml_collections.ConfigDict:
  """Downstream `task`'s config fine-tuning from `run`'s final checkpoint (None: random init;
  `step`: its checkpoint at that step, the equal-FLOPs one).

  Random init has the pretraining model's size and vocabulary and the same sweep,
  so it is the floor every pretrained setting must beat.
  """
  task_config = copy.deepcopy(config.downstream[task])
  _fill_workdir(task_config, workdir)
  with task_config.unlocked():
    if run is None:
      task_config.init_checkpoint = ""
      task_config.model_size = config.pretrain.model_size
      task_config.vocab_file = task_config.vocab_file or config.pretrain.data.vocab_file
    elif step is None:
      task_config.init_checkpoint = paths.join(workdir, run.pretrain_dir)
    else:
      task_config.init_checkpoint = paths.join(workdir, run.pretrain_dir,
                                               checkpoint.CHECKPOINT_DIR, str(step))
  return task_config


def equal_flops_checkpoints(config: ml_collections.ConfigDict, runs: list[Run],
                            workdir: str) -> dict[str, dict[str, Any]]:
  """Step mode: every finished run's checkpoint at the smallest model FLOPs of its seed's runs.

  Returns and writes DIR/equal_flops.json, {run: {"step", "flops", "budget",
  "finetune": {task: workdir}}} (ablation_plan.equal_flops_checkpoints); where
  the step is the run's last, "finetune" is its usual sweep. {} in FLOP mode,
  where every run's final checkpoint already spends the budget, and when
  config.budget.finetune_at_equal_flops is off.
  """
  if (config.budget.mode != "steps" or not config.budget.get("finetune_at_equal_flops", True)
      or not config.downstream or len(runs) < 2):
    return {}
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top  # jax only here
  cumulative = {r.name: ablation_report.cumulative_flops(workdir, r.pretrain_dir) for r in runs}
  kept = {r.name: list(ocp.utils.checkpoint_steps(
      paths.path(paths.join(workdir, r.pretrain_dir, checkpoint.CHECKPOINT_DIR)))) for r in runs}
  try:
    matched = ablation_plan.equal_flops_checkpoints(cumulative, kept,
                                                    {r.name: r.seed for r in runs})
  except ValueError as e:
    raise AblationError(str(e)) from None
  for r in runs:
    m = matched[r.name]
    m["finetune"] = (dict(r.finetune_dirs) if m["step"] == r.config.total_steps else
                     {t: d + EQUAL_FLOPS_SUFFIX for t, d in r.finetune_dirs.items()})
  paths.write_atomic(paths.join(workdir, EQUAL_FLOPS_FILE), json.dumps(matched, indent=2) + "\n")
  return matched


def random_init_dirs(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Downstream task -> the random-init sweep's workdir ({} when config.random_init is off)."""
  return ({task: f"{FINETUNE_DIR}/{RANDOM_INIT}/{task}" for task in config.downstream}
          if config.random_init else {})


def write_plan(config: ml_collections.ConfigDict, workdir: str, runs: list[Run],
               matched: dict[str, dict[str, Any]]) -> None:
  """DIR/plan.json: what the report needs besides the workdirs (rewritten for the current
  grid), and FLOP mode's `matched` steps, which later stages plan with."""
  content = {
      "variant": config.variant,
      "settings": {name: s.to_dict() for name, s in config.settings.items()},
      "pretrain_seeds": list(config.pretrain_seeds),
      "tasks": {task: {"name": c.task.name, "learning_rates": list(c.learning_rates),
                       "seeds": list(c.seeds)} for task, c in config.downstream.items()},
      "runs": [{"name": r.name, "setting": r.setting, "seed": r.seed,
                "pretrain": r.pretrain_dir, "finetune": r.finetune_dirs} for r in runs],
      "report": config.report.to_dict(),
      "baseline": config.report.baseline,
      "random_init": random_init_dirs(config),
      "suite": ablation_suite.plan_entry(config),  # None: no downstream suite
      "budget": {"mode": config.budget.mode, "flops_config": config.budget.flops,
                 "pretrain": ablation_plan.fingerprint(config), "settings": matched},
  }
  paths.write_atomic(paths.join(workdir, PLAN_FILE), json.dumps(content, indent=2) + "\n")


def read_plan(workdir: str) -> dict[str, Any]:
  """DIR/plan.json (written by the prepare stage)."""
  path = paths.join(workdir, PLAN_FILE)
  if not paths.exists(path):
    raise AblationError(f"{path} is missing: run the prepare stage (or the whole ablation) first")
  return json.loads(paths.read_text(path))


# --------------------------------------------------------------------------
# Stages.
# --------------------------------------------------------------------------


def prepare(config: ml_collections.ConfigDict, workdir: str, runs: list[Run]) -> list[Run]:
  """Writes the corpus (when the config makes one) and plan.json; returns the runs.

  FLOP mode plans here, on the corpus now written: each setting's steps from the
  predictions its own stream makes (budget_steps(measure=True)); the runs returned
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
    matched = ablation_plan.recorded(config, paths.join(workdir, PLAN_FILE))
    if not matched:
      matched = budget_steps(config, workdir, measure=True)
      logging.info("FLOP plan on measured predictions: %s", ", ".join(
          f"{name} {m['steps']} steps ({m['predictions_per_step']:.1f} predictions a step)"
          for name, m in matched.items()))
    runs = plan(config, workdir, matched)
  write_plan(config, workdir, runs, matched)
  return runs


def pretraining_done(run: Run, workdir: str) -> bool:
  """Whether the run reached total_steps and evaluated there (its last act)."""
  return ablation_proof.finished(paths.join(workdir, run.pretrain_dir), run.config.total_steps)


def pretrain(runs: list[Run], workdir: str) -> bool:
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


def finetune(config: ml_collections.ConfigDict, runs: list[Run], workdir: str) -> bool:
  """Fine-tunes every downstream task from random init and every run; False on SIGTERM."""
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  for task, task_dir in random_init_dirs(config).items():
    target = paths.join(workdir, task_dir)
    if not paths.exists(paths.join(target, trainer.SUMMARY_FILE)):
      logging.info("random init: fine-tuning %s", task)
      if trainer.finetune(finetune_config(config, task, None, workdir), target).get("preempted"):
        return False
  for run in runs:
    if not pretraining_done(run, workdir):
      raise AblationError(f"run {run.name} has not finished pretraining; run the pretrain "
                          "stage first")
    for task, task_dir in run.finetune_dirs.items():
      target = paths.join(workdir, task_dir)
      if paths.exists(paths.join(target, trainer.SUMMARY_FILE)):
        continue
      logging.info("%s: fine-tuning %s", run.name, task)
      summary = trainer.finetune(finetune_config(config, task, run, workdir), target)
      if summary.get("preempted"):
        return False
  # Step mode: the same sweep again from each run's checkpoint at the smallest run's FLOPs
  # (every run has finished pretraining here, so the budget is known).
  matched = equal_flops_checkpoints(config, runs, workdir)
  for run in runs:
    if run.name not in matched:
      continue
    for task, task_dir in matched[run.name]["finetune"].items():
      target = paths.join(workdir, task_dir)
      if paths.exists(paths.join(target, trainer.SUMMARY_FILE)):
        continue  # done, or the final checkpoint's own sweep
      logging.info("%s: fine-tuning %s at step %d (equal FLOPs)", run.name, task,
                   matched[run.name]["step"])
      summary = trainer.finetune(
          finetune_config(config, task, run, workdir, matched[run.name]["step"]), target)
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


def pretrain_job(run: Run) -> tuple[str, list[str]]:
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


def commands(config: ml_collections.ConfigDict, workdir: str, runs: list[Run],
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
      task_config = finetune_config(config, task, run, workdir)
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
                 launch: Callable[[list[Run]], None] | None = None) -> int:
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
      runs = plan(config, workdir)
    if stage in ("all", "prepare"):
      runs = prepare(config, workdir, runs)
    if stage in ("all", "pretrain"):
      if launch is not None:
        launch(runs)
      elif not pretrain(runs, workdir):
        return exit_codes.PREEMPTED
    if stage == "prepare":
      return 0
    written_plan = read_plan(workdir)
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
