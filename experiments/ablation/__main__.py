r"""The masking ablation as one command: plan, pretrain, check, fine-tune, report.

  python -m experiments.ablation --config=experiments/configs/ablation.py:zh_tiny --workdir=DIR
  ... --dry_run          the runs, their FLOPs and expected times (nothing is written)
  ... --print_commands   one `python -m bert_jax.main` command per run, to run them in parallel
  python -m experiments.ablation --workdir=DIR --stage=report    (from DIR alone)
  python -m experiments.ablation --workdir=DIR --plan_seeds      seeds for 80% power, from
                                                                  DIR's report (power.py)

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

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import errors
from experiments.ablation import plan as ablation_plan
from experiments.ablation import power as ablation_power
from experiments.ablation import stages
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
  config, workdir = fv.config, fv.workdir
  if fv.plan_seeds:
    print(ablation_power.plan_seeds(workdir))
    return 0
  if fv.print_commands or fv.dry_run:
    if config is None:
      raise errors.UsageError("--print_commands and --dry_run need --config")
    runs = stages.plan(config, workdir)
    if (fv.print_commands and config.budget.mode == "flops"
        and not ablation_plan.recorded(config, paths.join(workdir, stages.PLAN_FILE))):
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
  return stages.run_ablation(config, workdir, fv.stage)


def _parse_flags(argv: list[str]) -> list[str]:
  """bert_jax.main's flag parsing: a flag that does not parse (a misspelled
  --config.field, a config whose data package is missing) is one line, exit 1."""
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # jax/tf only when running
  return jobs.parse_flags(argv)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=_parse_flags)
