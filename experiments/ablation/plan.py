"""The ablation's plan: the step count each setting gets under a model-FLOP budget, the plan
recorded in plan.json, and --dry_run's table of the runs, their FLOPs and times.

config.budget.mode "steps" keeps every run at pretrain.total_steps (the default).
"flops" gives each setting the largest step count whose model FLOPs
stay within config.budget.flops (0: what the baseline setting spends in
pretrain.total_steps), so every run spends the budget to within one of its own
steps, and stretches the warm-up with it (the learning-rate schedule keeps its
shape over the run's own steps).

Two per-step figures, both bert_jax.pretrain.cost.step_flops:

- measured (what the prepare stage plans with, once the corpus exists): the mean MLM
  predictions per step counted on the setting's own input stream (the trainer's
  PretrainingInput, its masking schedule over the run's steps), so short sequences,
  which make fewer predictions, are charged as they run. The steps and the stream
  depend on each other (a schedule runs over the run's steps), so the plan is
  repeated on its own steps until they no longer change; the stream counted is the
  run's own (seed 0's; on one host, its very batches) up to config.budget
  .measure_batches steps, a sample of the run's schedule beyond.
- estimated (--dry_run, --print_commands, and a plan made before the corpus exists):
  the predictions a full sequence is expected to make at the setting's mean ratio
  over its schedule (min(P, round(mean ratio x (max_seq_length - 3))): [CLS] and two
  [SEP] are never masked), an upper bound where sequences are shorter.

The report counts the FLOPs each run executed from its batch_log.
"""

import copy
import dataclasses
import hashlib
import json
import re
from typing import Any

from absl import logging
import ml_collections
import numpy as np

from bert_jax import accelerators
from bert_jax.run import checkpoint
from data_pipeline import specs
from experiments.ablation import suite as ablation_suite
from experiments.ablation.proof import AblationError  # pylint: disable=g-importing-member
from experiments.configs import ablation as ablation_configs
from host import paths

MODES = ("steps", "flops")
_SPECIAL_TOKENS = 3  # [CLS] A [SEP] B [SEP]: never predicted


def vocab_size(data_config: ml_collections.ConfigDict, model_config) -> int:
  """The model's vocabulary size without building a tokenizer: the configured size, else
  the vocab file's lines, else the embedded vocabulary's target size."""
  if model_config.vocab_size:
    return int(model_config.vocab_size)
  if data_config.vocab_file:
    return sum(1 for line in paths.read_text(data_config.vocab_file).splitlines() if line)
  return int(data_config.embedded_vocab_size)


def expected_predictions(run: ml_collections.ConfigDict) -> float:
  """Predictions per sequence a run is expected to make (MaskingSpec.expected_predictions)."""
  return specs.masking_spec(run.data).expected_predictions(
      run.data.max_seq_length, run.total_steps, _SPECIAL_TOKENS)


def _step_flops(run: ml_collections.ConfigDict):
  """predictions per step -> model FLOPs of one step of `run` (bert_jax.pretrain.cost.step_flops on
  its abstract model, built once)."""
  from bert_jax.pretrain import cost  # pylint: disable=g-import-not-at-top  # jax only when planning FLOPs
  bert_config, params = cost.abstract_model(run, vocab_size(run.data, run.model))
  return lambda predictions: cost.step_flops(bert_config, params, sequences=run.batch_size,
                                             seq_len=run.data.max_seq_length,
                                             predictions=predictions)


def step_flops_estimate(run: ml_collections.ConfigDict) -> float:
  """Model FLOPs of one step of `run` before it has run (bert_jax.pretrain.cost.step_flops)."""
  return _step_flops(run)(run.batch_size * expected_predictions(run))


def measured_predictions(run: ml_collections.ConfigDict, max_batches: int) -> float:
  """Mean MLM predictions per step of `run`, counted on its own input stream.

  The trainer's input (data_pipeline.prepare.PretrainingData's, one host holding
  the whole global batch, read from the tokenized store the runs then share), its
  masking schedule over min(total_steps, max_batches) steps: for a run of at most
  `max_batches` steps the very batches it will train on.
  """
  from data_pipeline import prepare  # pylint: disable=g-import-not-at-top  # TF only when measuring
  steps = min(run.total_steps, max_batches)
  source = prepare.PretrainingData.prepare(
      prepare.one_phase(run.data, steps), batch_size=run.batch_size,
      eval_batch_size=run.eval_batch_size, total_steps=steps).train_input()
  try:
    total = sum(float(np.sum(next(source)["masked_lm_weights"])) for _ in range(steps))
  finally:
    source.close()
  return total / steps


def step_flops_measured(run: ml_collections.ConfigDict, max_batches: int) -> tuple[float, float]:
  """(model FLOPs of one step of `run`, predictions per step) on its measured predictions."""
  predictions = measured_predictions(run, max_batches)
  return _step_flops(run)(predictions), predictions


def _matched(per: dict[str, float], budget: float) -> dict[str, dict[str, Any]]:
  out = {}
  for name, flops in per.items():
    # Floor, with a hair of slack so that the baseline's own budget (its per-step FLOPs x
    # its steps) gives back its steps despite float rounding.
    steps = int(budget / flops * (1 + 1e-12))
    if steps < 1:
      raise ValueError(f"config.budget.flops={budget:.3g} is less than one step of setting "
                       f"{name} ({flops:.3g} FLOPs)")
    out[name] = {"steps": steps, "flops_per_step": flops, "flops": steps * flops,
                 "budget": budget}
  return out


def _budget(per: dict[str, float], runs: dict[str, ml_collections.ConfigDict], baseline: str,
            budget: float) -> float:
  if budget:
    return budget
  if baseline not in runs:
    raise ValueError(f"config.budget.flops=0 takes the baseline {baseline!r}'s FLOPs, but "
                     f"it is not a setting ({sorted(runs)}); set config.report.baseline or "
                     "config.budget.flops")
  return per[baseline] * runs[baseline].total_steps


def matched_steps(runs: dict[str, ml_collections.ConfigDict], baseline: str,
                  budget: float, per_step=step_flops_estimate) -> dict[str, dict[str, Any]]:
  """{setting: {"steps", "flops_per_step", "flops"}} spending `budget` (0: baseline's run).

  Each setting's steps = floor(budget / its per-step FLOPs), so
  budget - flops < flops_per_step: the budget is spent within one step.
  """
  per = {name: float(per_step(run)) for name, run in runs.items()}
  return _matched(per, _budget(per, runs, baseline, budget))


def matched_steps_measured(runs: dict[str, ml_collections.ConfigDict], baseline: str,
                           budget: float, max_batches: int,
                           max_rounds: int = 4) -> dict[str, dict[str, Any]]:
  """matched_steps on each setting's measured predictions (module docstring).

  Each setting is measured on its run stretched to the steps it is planned (first the
  estimate's plan, which with a zero budget keeps the baseline at its own steps), and
  re-planned until no step count changes (at most `max_rounds`: counts still moving
  after that are left as the last round gave them, and the log says so). With a zero
  budget the baseline's measured run is the budget. Entries gain
  "predictions_per_step" and "measured": True.
  """
  planned = {name: m["steps"] for name, m in matched_steps(runs, baseline, budget).items()}
  measured: dict[tuple[str, int], tuple[float, float]] = {}  # (setting, steps) -> figures
  for _ in range(max_rounds):
    for name, run in runs.items():
      if (name, planned[name]) not in measured:
        measured[name, planned[name]] = step_flops_measured(
            run if planned[name] == run.total_steps else stretch(run, planned[name]),
            max_batches)
    per = {name: measured[name, planned[name]][0] for name in runs}
    out = _matched(per, _budget(per, runs, baseline, budget))
    for name in out:
      out[name].update(predictions_per_step=measured[name, planned[name]][1], measured=True)
    steps = {name: out[name]["steps"] for name in out}
    if steps == planned:  # every setting measured at the very steps it is given
      return out
    planned = steps
  logging.warning("FLOP plan: step counts still moving after %d rounds: %s", max_rounds, planned)
  return out


def stretch(run: ml_collections.ConfigDict, steps: int) -> ml_collections.ConfigDict:
  """`run` trained for `steps`, its warm-up (and a WSD schedule's decay) scaled by the same
  factor (at least 1 step)."""
  out = copy.deepcopy(run)
  factor = steps / run.total_steps
  with out.unlocked():
    out.total_steps = steps
    if run.optimizer.warmup_steps:
      out.optimizer.warmup_steps = max(1, round(run.optimizer.warmup_steps * factor))
    if run.optimizer.get("schedule") == "wsd" and run.optimizer.decay_steps:
      out.optimizer.decay_steps = max(1, round(run.optimizer.decay_steps * factor))
  return out



def match_equal_flops(cumulative: dict[str, list[float]], kept: dict[str, list[int]],
                            seeds: dict[str, int]) -> dict[str, dict[str, Any]]:
  """Step mode's equal-FLOPs point: {run: {"step", "flops", "budget"}}.

  `cumulative[run][s]`: the run's model FLOPs after step s (index 0: step 0), as
  executed (ablation_report.cumulative_flops); `kept[run]`: the steps it holds a
  checkpoint of; `seeds[run]`: its pretraining seed. The budget is the smallest
  run's total among the runs of its seed (as in the report's equal-FLOPs table):
  differences are paired by seed, and one budget over all seeds would push the
  baseline of a seed that happened to draw a few more predictions off its own
  final checkpoint. Each run's step is its kept checkpoint nearest the budget when
  within report.EQUAL_FLOPS_TOLERANCE (1%) of it, so a run a hair above the budget
  keeps its final one, else its last kept checkpoint below it (relative 1e-9 for
  float sums); the smallest run's is its final step. The ablation keeps a checkpoint
  at every evaluation point (checkpoint.every_steps = keep_period = eval_every_steps),
  so the fine-tuned checkpoint is an evaluation the equal-FLOPs MLM table reads.
  """
  # The report's reading rule, imported here: the report imports nothing of the plan's.
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  budgets: dict[int, float] = {}
  for name, flops in cumulative.items():
    budgets[seeds[name]] = min(budgets.get(seeds[name], flops[-1]), flops[-1])
  out = {}
  for name, flops in cumulative.items():
    budget = budgets[seeds[name]]
    held = sorted(s for s in kept[name] if s < len(flops))
    nearest = ablation_report.nearest_at_budget([(s, flops[s]) for s in held], budget)
    fits = [held[nearest]] if nearest is not None else [
        s for s in held if flops[s] <= budget * (1 + 1e-9)]
    if not fits:
      raise ValueError(
          f"run {name} keeps no checkpoint within the equal-FLOPs budget {budget:.4g} "
          f"(kept steps {sorted(kept[name])}): keep one at every evaluation point "
          "(pretrain.checkpoint.every_steps and keep_period = eval_every_steps)")
    step = max(fits)
    out[name] = {"step": step, "flops": flops[step], "budget": budget}
  return out


def fingerprint(config: ml_collections.ConfigDict) -> str:
  """What a FLOP plan was measured on: the base pretraining config and the count's length."""
  text = json.dumps([config.pretrain.to_dict(), config.budget.measure_batches], sort_keys=True,
                    default=str)
  return hashlib.md5(text.encode()).hexdigest()


def recorded(config: ml_collections.ConfigDict, path: str) -> dict[str, dict[str, Any]]:
  """The measured FLOP plan the prepare stage recorded in plan.json (`path`) for this very
  grid; {} when there is none (no plan yet, step mode, or a plan of other settings,
  budget or base pretraining config)."""
  if config.budget.mode != "flops" or not paths.exists(path):
    return {}
  written = json.loads(paths.read_text(path))
  budget = written.get("budget", {})  # plans before FLOP budgets have none
  settings = budget.get("settings", {})
  same = (budget.get("flops_config") == config.budget.flops
          and budget.get("pretrain") == fingerprint(config)
          and written.get("settings") == {n: s.to_dict() for n, s in config.settings.items()}
          and all(m.get("measured") for m in settings.values()))
  return settings if same and set(settings) == set(config.settings) else {}


def dry_run(config: ml_collections.ConfigDict, runs: list) -> str:
  """The runs with model FLOPs and expected times here and on the config's target devices.

  FLOPs are bert_jax.pretrain.cost.step_flops at the predictions a full sequence is expected
  to make (expected_predictions), beside the upper bound with every
  prediction slot P used. Both are estimates: the prepare stage plans FLOP mode on
  the predictions each stream makes (shorter sequences make fewer), and the report
  counts the predictions the runs made. Nothing here builds a
  tokenizer or reads the corpus: the vocabulary size is the vocab file's or the
  configured one.
  """
  # jax and the report only when the table is asked for.
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  kind, count = jax.devices()[0].device_kind, jax.device_count()
  here_tflops = accelerators.PEAK_TFLOPS.get(kind)
  if here_tflops:
    here_rate, here = here_tflops * 1e12 * count * config.report.mfu, \
        f"{count} x {kind} at MFU {config.report.mfu:.0%}"
  else:
    here_rate = config.report.fallback_gflops * 1e9
    here = f"{count} x {kind} at {config.report.fallback_gflops:g} model GFLOP/s " \
           "(config.report.fallback_gflops)"
  targets = []
  for target in config.report.targets:
    target_kind, n = target.rsplit(":", 1)
    targets.append((f"{n} x {target_kind}",
                    accelerators.PEAK_TFLOPS[target_kind] * 1e12 * int(n) * config.report.mfu))
  header = ["run", "steps", "predictions / seq (expected, of P)", "GFLOP/step",
            "GFLOP/step (all P slots)", "total PFLOP", f"here ({here})"] + \
      [f"{name} at MFU {config.report.mfu:.0%}" for name, _ in targets]
  rows, total = [], 0.0
  for run in runs:
    flops_at, slots = _step_flops(run.config), specs.max_predictions(run.config.data)
    per_step = flops_at(run.config.batch_size * expected_predictions(run.config))
    upper = flops_at(run.config.batch_size * slots)
    flops = per_step * run.config.total_steps
    total += flops
    rows.append([run.name, f"{run.config.total_steps:,}",
                 f"{expected_predictions(run.config):g} of {slots}",
                 f"{per_step / 1e9:.1f}", f"{upper / 1e9:.1f}", f"{flops / 1e15:.3f}",
                 ablation_report.duration(flops / here_rate)]
                + [ablation_report.duration(flops / rate) for _, rate in targets])
  rows.append(["all", "", "", "", "", f"{total / 1e15:.3f}",
               ablation_report.duration(total / here_rate)]
              + [ablation_report.duration(total / rate) for _, rate in targets])
  tasks = sum(len(c.learning_rates or [0]) * len(c.seeds) for c in config.downstream.values())
  return (ablation_report.markdown_table(header, rows)
          + f"\n\n{len(runs)} pretraining runs; then {tasks} fine-tuning runs per pretraining run "
          + ("and for random init " if config.random_init else "")
          + f"({(len(runs) + int(config.random_init)) * tasks} in all), not counted above.")


PLAN_FILE = "plan.json"
PRETRAIN_DIR = "pretrain"
FINETUNE_DIR = "finetune"
RANDOM_INIT = "random_init"  # finetune/random_init/<task>: the no-pretraining floor
EQUAL_FLOPS_SUFFIX = "_equal_flops"  # finetune/<run>/<task>_equal_flops
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _report():
  """The report's module (its reading rule: the report imports nothing of the plan's;
  imported late: matplotlib comes with it)."""
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  return ablation_report


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
# The grid: the configs of every run, and where their outputs go.
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
  seeds = [int(s) for s in config.pretrain_seeds]
  if len(set(seeds)) < len(seeds):
    raise AblationError(f"config.pretrain_seeds={tuple(seeds)} repeats a seed: its runs would "
                        "be the same run twice, not independent ones")
  masks = {}  # a setting's whole masking config -> its name
  for name in config.settings:
    masking = copy.deepcopy(config.pretrain.data.masking)
    masking.update(config.settings[name].to_dict())
    key = json.dumps(masking.to_dict(), sort_keys=True)
    if key in masks:
      raise AblationError(f"config.settings.{masks[key]} and config.settings.{name} mask "
                          "alike: their runs would be the same run twice; drop one")
    masks[key] = name
  if config.budget.mode not in MODES:
    raise AblationError(f"config.budget.mode={config.budget.mode!r}: expected one of "
                        f"{MODES}")
  if config.budget.mode == "flops" and (config.pretrain.get("phases")
                                        or config.pretrain.get("batch_warmup", {}).get("tokens")):
    raise AblationError("config.budget.mode='flops' with config.pretrain.phases or a batch "
                        "warmup: the FLOP plan matches single-phase runs; use one phase or "
                        "budget.mode='steps'")
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
      return matched_steps_measured(runs, config.report.baseline,
                                                  config.budget.flops,
                                                  config.budget.measure_batches)
    return matched_steps(runs, config.report.baseline, config.budget.flops)
  except ValueError as e:
    raise AblationError(str(e)) from None


def grid_runs(config: ml_collections.ConfigDict, workdir: str,
         matched: dict[str, dict[str, Any]] | None = None) -> list[Run]:
  """Every run of the grid, seed-major (all settings of seed 0 first).

  FLOP mode's steps: `matched` when given, else the measured plan recorded in the
  workdir's plan.json, else the estimate (before the prepare stage, --dry_run).
  """
  check_config(config)
  if matched is None:
    matched = (recorded(config, paths.join(workdir, PLAN_FILE))
               or budget_steps(config, workdir))
  runs = []
  for seed in config.pretrain_seeds:
    for setting in config.settings:
      name = f"{setting}_seed{seed}"
      run_config = pretrain_config(config, setting, int(seed), workdir)
      if setting in matched:  # FLOP mode: its own step count, the schedule stretched to it
        run_config = stretch(run_config, matched[setting]["steps"])
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
  "finetune": {task: workdir}}} (equal_flops_checkpoints); where
  the step is the run's last, "finetune" is its usual sweep. {} in FLOP mode,
  where every run's final checkpoint already spends the budget, and when
  config.budget.finetune_at_equal_flops is off.
  """
  if (config.budget.mode != "steps" or not config.budget.get("finetune_at_equal_flops", True)
      or not config.downstream or len(runs) < 2):
    return {}
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top  # jax only here
  cumulative = {r.name: _report().cumulative_flops(workdir, r.pretrain_dir) for r in runs}
  kept = {r.name: list(ocp.utils.checkpoint_steps(
      paths.path(paths.join(workdir, r.pretrain_dir, checkpoint.CHECKPOINT_DIR)))) for r in runs}
  try:
    matched = match_equal_flops(cumulative, kept,
                                                    {r.name: r.seed for r in runs})
  except ValueError as e:
    raise AblationError(str(e)) from None
  for r in runs:
    m = matched[r.name]
    m["finetune"] = (dict(r.finetune_dirs) if m["step"] == r.config.total_steps else
                     {t: d + EQUAL_FLOPS_SUFFIX for t, d in r.finetune_dirs.items()})
  paths.write_atomic(paths.join(workdir, _report().EQUAL_FLOPS_FILE), json.dumps(matched, indent=2) + "\n")
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
                 "pretrain": fingerprint(config), "settings": matched},
  }
  paths.write_atomic(paths.join(workdir, PLAN_FILE), json.dumps(content, indent=2) + "\n")


def read_plan(workdir: str) -> dict[str, Any]:
  """DIR/plan.json (written by the prepare stage)."""
  path = paths.join(workdir, PLAN_FILE)
  if not paths.exists(path):
    raise AblationError(f"{path} is missing: run the prepare stage (or the whole ablation) first")
  return json.loads(paths.read_text(path))
