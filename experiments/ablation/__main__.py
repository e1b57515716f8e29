r"""The masking ablation as one command: plan, pretrain, check, fine-tune, report.

  python -m experiments.ablation --config=experiments/configs/ablation.py:zh_tiny --workdir=DIR
  ... --dry_run          the runs, their FLOPs and expected times (nothing is written)
  ... --print_commands   one `python -m bert_jax.main` command per run, to run them in parallel
  python -m experiments.ablation --workdir=DIR --stage=report    (from DIR alone)
  python -m experiments.ablation --workdir=DIR --plan_seeds      seeds for 80% power, from
                                                                  DIR's report (power.py)
  ... --workdir=gs://... --launch --name=PREFIX --project=P --zone=Z --accelerator_type=v4-32
      [--spot] [--max_slices=N | --one_slice] [--max_attempts=K]
                         each pretraining run as its own Cloud TPU job (launch.py), then
                         fine-tuning and the report here; the same command attaches
  python -m experiments.ablation --workdir=gs://... --status      the launched grid's table

Stages (--stage=all runs them in order; every one resumes):
  prepare   the corpus (config.prepare_corpus) and DIR/plan.json, the list of runs
  pretrain  each run in DIR/pretrain/<setting>_seed<k>/ through bert_jax.pretrain.trainer, one
            after another: a finished run is skipped, an unfinished one resumes
            from its checkpoint (kill -9 at any moment loses at most the steps
            since the last checkpoint)
  check     runs of one pretraining seed must have the same config outside
            data.masking and must have read identical unmasked batches, step by
            step (their batch_log.jsonl); otherwise nothing is reported and the
            error names the two runs and the first step (or field) that differs
  finetune  every downstream task from every run's final checkpoint, in
            DIR/finetune/<run>/<task>/ (bert_jax.finetune.trainer: summary.json
            with median and spread over seeds at the best learning rate); in
            step mode also from each run's checkpoint at the smallest model FLOPs
            of its seed's runs (DIR/equal_flops.json;
            DIR/finetune/<run>/<task>_equal_flops/)
  report    DIR/report.md, DIR/results.csv and DIR/plots/*.png (experiments/ablation/report.py)

Exit codes as bert_jax.main: 0 done, 143 preempted (SIGTERM; re-run to resume),
1 refused, in one line on stderr (a flag that does not parse, a workdir of another run,
runs that differ in more than masks), 75 a run's workdir locked by another live run.
"""

import dataclasses
import sys
import tempfile

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import errors
from bert_jax.launch import launcher as launcher_lib
from experiments.ablation import launch as ablation_launch
from experiments.ablation import plan as ablation_plan
from experiments.ablation import power as ablation_power
from experiments.ablation import stages
from experiments.ablation import suite as ablation_suite
from host import paths


def _define_flags() -> None:
  # Only when run as a program: tests and other tools import this module, and two
  # modules defining a global --config in one process clash.
  config_flags.DEFINE_config_file(
      "config", None, "experiments/configs/ablation.py:VARIANT (not needed for --stage=report).")
  flags.DEFINE_string("workdir", None, "The ablation's directory (local or gs://).")
  flags.DEFINE_enum("stage", "all", stages.STAGES, "What to run (each stage resumes).")
  flags.DEFINE_bool("print_commands", False,
                    "Print one bert_jax.main command per run instead of running.")
  flags.DEFINE_bool("dry_run", False, "List the runs, FLOPs and expected times.")
  flags.DEFINE_bool("plan_seeds", False, "From the report in --workdir (a pilot), the "
                    "pretraining seeds each comparison needs for 80% power.")
  flags.DEFINE_bool("launch", False, "Pretrain each run as its own Cloud TPU job "
                    "(bert_jax.launch; experiments/ablation/launch.py), fine-tune and report here.")
  flags.DEFINE_bool("status", False, "Print the launched grid's table (DIR/grid.json and "
                    "each job's record).")
  flags.DEFINE_string("name", None, "--launch: slices are NAME-<run's grid index>, or NAME "
                      "with --one_slice.")
  flags.DEFINE_string("project", None, "--launch: Google Cloud project.")
  flags.DEFINE_string("zone", None, "--launch: zone of the slices, e.g. us-central2-b.")
  flags.DEFINE_string("accelerator_type", None, "--launch: each slice's, e.g. v4-32.")
  flags.DEFINE_bool("spot", False, "--launch: spot capacity (cheaper, preemptible).")
  flags.DEFINE_integer("max_slices", 1, "--launch: slices at once, one run on each.")
  flags.DEFINE_bool("one_slice", False, "--launch: one slice, NAME, running the runs in turn.")
  flags.DEFINE_integer("max_attempts", 3, "--launch: attempts of a failing run before it is "
                       "given up on (named unfinished in the report).")
  flags.DEFINE_integer("max_relaunches", launcher_lib.MAX_RELAUNCHES, "--launch: restarts of "
                       "a lost job within one attempt (bert_jax.launch's --max_relaunches).")
  flags.DEFINE_bool("skip_preflight", False, "--launch: create slices without compiling each "
                    "distinct shape for them first (nor reading the tokenized store's status).")
  flags.DEFINE_string("logdir", "", "--launch: local directory for preflight passes and each "
                      "slice's upload staging; '' -> $TMPDIR/bert_jax_launch/NAME.")
  # Each slice's watch, as bert_jax.launch's flags of the same names (bert_jax/launch/launcher.py).
  flags.DEFINE_float("poll_s", launcher_lib.POLL_S, "--launch: seconds between looks.")
  flags.DEFINE_float("retry_s", launcher_lib.RETRY_S, "--launch, --status: first backoff of a "
                     "failed gcloud read.")
  flags.DEFINE_float("preemption_window_s", launcher_lib.PREEMPTION_WINDOW_S,
                     "--launch: how long a lost-looking job must stay so before a relaunch.")
  flags.DEFINE_float("stale_after_s", launcher_lib.STALE_AFTER_S, "--launch: a heartbeat older "
                     "than this is a job that is gone.")
  flags.DEFINE_float("start_timeout_s", launcher_lib.START_TIMEOUT_S, "--launch: how long a "
                     "started job may take to write its 'running' record.")
  flags.DEFINE_float("create_timeout_s", launcher_lib.CREATE_TIMEOUT_S, "--launch: give up if a "
                     "slice is not ACTIVE after this long.")
  flags.mark_flags_as_required(["workdir"])


def main(argv):
  """Parses the flags and runs the ablation (or prints its commands / dry run); a refusal
  is one line (bert_jax.jobs.refuse), as bert_jax.main's."""
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # jax/tf only when running
  jobs.configure_logging()  # the trainers' terminal: progress and evaluation, orbax quiet
  try:
    sys.exit(_run(argv, flags.FLAGS))
  except errors.UsageError as e:  # stages.AblationError is one
    sys.exit(jobs.refuse(e))


def _run(argv, fv) -> int:
  """The command (module docstring); returns its exit code."""
  if len(argv) > 1:
    raise errors.UsageError(f"unexpected arguments: {argv[1:]} (every setting is a "
                            "--config.* flag)")
  # A suite named as the downstream stage becomes its members, once, for every stage below.
  config, workdir = ablation_suite.expand(fv.config), fv.workdir
  if fv.plan_seeds:
    print(ablation_power.plan_seeds(workdir))
    return 0
  if fv.status:
    print(ablation_launch.status(workdir, fv.retry_s))
    return 0
  if fv.print_commands or fv.dry_run:
    if config is None:
      raise errors.UsageError("--print_commands and --dry_run need --config")
    runs = ablation_plan.grid_runs(config, workdir)
    if (fv.print_commands and config.budget.mode == "flops"
        and not ablation_plan.recorded(config, paths.join(workdir, ablation_plan.PLAN_FILE))):
      # The printed runs carry their step counts, which FLOP mode measures at prepare.
      raise errors.UsageError(
          "--print_commands in FLOP mode (config.budget.mode='flops') needs the plan the "
          f"prepare stage measures: run it first (--stage=prepare --workdir={workdir}), then "
          "--print_commands with the same flags and --workdir")
    if fv.print_commands:
      # The --config flags exactly as given, so the printed stages plan the same grid.
      args = sys.argv[1:]
      own = [a if "=" in a else f"{a}={args[i + 1]}" for i, a in enumerate(args)
             if a.split("=")[0] == "--config" or a.startswith("--config.")]
      print("\n".join(stages.commands(config, workdir, runs, own)))
    if fv.dry_run:
      print(ablation_plan.dry_run(config, runs))
    return 0
  if fv.launch:
    return ablation_launch.run(config, workdir, fv.stage, _launch_options(fv))
  return stages.run_ablation(config, workdir, fv.stage)


def _launch_options(fv) -> ablation_launch.Options:
  """The --launch flags as launch.Options."""
  fields = [f.name for f in dataclasses.fields(ablation_launch.Options)]
  options = ablation_launch.Options(**{f: fv[f].value for f in fields})
  return dataclasses.replace(options, logdir=options.logdir or paths.join(
      tempfile.gettempdir(), "bert_jax_launch", options.name or "ablation"))


def _parse_flags(argv: list[str]) -> list[str]:
  """bert_jax.main's flag parsing: a flag that does not parse (a misspelled
  --config.field, a config whose data package is missing) is one line, exit 1."""
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # jax/tf only when running
  return jobs.parse_flags(argv)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=_parse_flags)
