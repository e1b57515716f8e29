r"""`python -m experiments.evaluate`: a suite of fine-tuning tasks from one checkpoint, one table.

  python -m experiments.evaluate --suite=glue --init_checkpoint=CKPT --workdir=DIR \
      --glue_dir=/data/glue_data
  ... --dry_run          members, examples, steps, FLOPs and expected time (nothing written)
  ... --print_commands   one `python -m bert_jax.main` per member, to run them in parallel
  python -m experiments.evaluate --workdir=DIR --stage=report   (from DIR alone)

--suite: a variant of experiments/configs/suites.py (glue, squad, paper, zh) or a config
file of your own (`my_suites.py:arg`); `--suite.protocol.X=...` and `--suite.members...`
set single fields. --seeds, --learning_rates, --epochs, --batch_size,
--max_train_examples, --max_dev_examples and --restarts override the protocol for every
member (SQuAD's 2 epochs included).

Stages (--stage=all runs them in order; every one resumes): plan (check everything,
write DIR/suite.json), finetune (each unfinished member, cheapest first), report
(table.md, results.csv, times.md, plots/, glue_submission.zip). Re-running the same
command after kill -9 at any moment skips the finished members and runs, and resumes
the running one from its last checkpoint.

Exit codes as bert_jax.main's (bert_jax.jobs): 0 done, 143 preempted after saving
(re-run to resume), 130 Ctrl-C after saving, 75 DIR or a member's workdir locked by a
live run, 1 refused (one line on stderr; --verbose adds the traceback).
"""

import os
import re
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import errors
from bert_jax import exit_codes
from experiments.configs import suites

STAGES = ("all", "plan", "finetune", "report")
SUITES_FILE = os.path.abspath(suites.__file__)  # the suites of this package, by name


def _define_flags() -> None:
  # Only when run as a program: modules that import this package define flags of their own.
  config_flags.DEFINE_config_file("suite", None, "glue | squad | paper | zh, or FILE.py:ARG.")
  flags.DEFINE_string("workdir", None, "The suite's directory (local or gs://); re-running "
                      "resumes.")
  flags.DEFINE_string("init_checkpoint", "", "The checkpoint every member fine-tunes from "
                      "(anything bert_jax.convert reads).")
  flags.DEFINE_string("glue_dir", "", "The GLUE download (CoLA/, SST-2/, ...) or tfds:DIR.")
  flags.DEFINE_string("squad_dir", "", "Holds train-v1.1.json, dev-v1.1.json, train-v2.0.json, "
                      "dev-v2.0.json.")
  flags.DEFINE_list("seeds", None, "Fine-tuning seeds of every member (the protocol: 0-4).")
  flags.DEFINE_list("learning_rates", None, "Learning rates swept by every member.")
  flags.DEFINE_integer("epochs", None, "Epochs of every member (SQuAD's included).")
  flags.DEFINE_integer("batch_size", None, "Train batch of every member.")
  flags.DEFINE_integer("max_train_examples", None, "A fixed subset of every train set.")
  flags.DEFINE_integer("max_dev_examples", None, "A fixed subset of every dev set.")
  flags.DEFINE_string("restarts", None, "Members reported as their best (rate, seed) on dev: "
                      "none, small, all, or names.")
  flags.DEFINE_list("members", [], "Run only these members (the report shows every one run).")
  flags.DEFINE_enum("stage", "all", STAGES, "What to run (each stage resumes).")
  flags.DEFINE_bool("print_commands", False, "Print one bert_jax.main command per member.")
  flags.DEFINE_bool("dry_run", False, "List members, examples, steps, FLOPs and times.")
  flags.DEFINE_float("mfu", 0.4, "--dry_run: the model FLOPs utilisation assumed.")
  flags.DEFINE_float("peak_tflops", 0.0, "--dry_run: peak TFLOP/s per device, if not known.")
  flags.DEFINE_bool("verbose", False, "Show the traceback of a refusal.")
  flags.mark_flags_as_required(["workdir"])


def _named_suites(argv: list[str]) -> list[str]:
  """--suite=glue -> --suite=<experiments/configs/suites.py>:glue (a file path stays)."""
  out = list(argv)
  for i, arg in enumerate(out):
    name = arg[len("--suite="):] if arg.startswith("--suite=") else (
        out[i + 1] if arg == "--suite" and i + 1 < len(out) else None)
    if name and re.fullmatch(r"[A-Za-z0-9_]+", name):
      if arg == "--suite":
        out[i + 1] = f"{SUITES_FILE}:{name}"
      else:
        out[i] = f"--suite={SUITES_FILE}:{name}"
  return out


def parse_flags(argv: list[str]) -> list[str]:
  """absl's parsing, every failure one line (exit 1): a flag, a suite file, a suite field."""
  if "--verbose" in argv:
    os.environ[errors.VERBOSE_ENV] = "1"
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # JAX only once parsing runs
  try:
    parsed = flags.FLAGS(_named_suites(argv))
    getattr(flags.FLAGS.suite, "family", None)  # a suite file that did not load fails on use
    return parsed
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError,
          SyntaxError) as e:  # the user's flags and suite file, not a bug of ours
    text = [l.strip() for l in str(e).splitlines() if l.strip()]
    cause = re.sub(r"^\w+(Error|Exception): ", "", text[-1]) if text else repr(e)
    head = re.match(r"(flag --\S+): ", text[0]) if text else None
    sys.exit(jobs.refuse(e, f"{head.group(1)}: {cause}" if head and head.group(1) not in cause
                         else cause))


def _numbers(name: str, values: list[str] | None, kind: type) -> tuple | None:
  if values is None:
    return None
  try:
    return tuple(kind(v) for v in values)
  except ValueError:
    raise errors.UsageError(f"flag --{name}={','.join(values)}: expected a comma-separated "
                            f"list of {kind.__name__}s") from None


def _run(fv) -> int:
  """The command (module docstring); returns its exit code."""
  # pylint: disable=g-import-not-at-top  # JAX and TensorFlow only when something runs
  from bert_jax.run import workdir as workdir_lib
  from experiments.evaluate import estimate
  from experiments.evaluate import execute
  from experiments.evaluate import plan
  suite, workdir = fv.suite, fv.workdir
  if suite is None:
    if fv.stage != "report" or fv.dry_run or fv.print_commands:
      raise errors.UsageError("--suite is required (glue, squad, paper, zh or FILE.py:ARG); "
                              "only --stage=report works from --workdir alone")
    with errors.judging_input():  # a suite whose metrics its summaries lack, a bad file
      execute.report(workdir)
    return 0
  overrides = plan.Flags(
      init_checkpoint=fv.init_checkpoint, glue_dir=fv.glue_dir, squad_dir=fv.squad_dir,
      seeds=_numbers("seeds", fv.seeds, int),
      learning_rates=_numbers("learning_rates", fv.learning_rates, float),
      epochs=fv.epochs, batch_size=fv.batch_size, max_train_examples=fv.max_train_examples,
      max_dev_examples=fv.max_dev_examples, restarts=fv.restarts, only=tuple(fv.members))
  planned = plan.members(suite, overrides, workdir)
  if fv.print_commands or fv.dry_run:
    if fv.print_commands:
      own = [a for a in sys.argv[1:] if not a.startswith(("--workdir", "--print_commands",
                                                         "--dry_run", "--stage"))]
      print("\n".join(estimate.commands(planned, workdir, own)))
    if fv.dry_run:
      print(estimate.dry_run(planned, workdir, plan.read_record(workdir), suite.name,
                             mfu=fv.mfu, peak_tflops=fv.peak_tflops))
    return 0
  content, changed = plan.make_record(workdir, suite, planned)  # checks and counts; no write
  lock = workdir_lib.lock(workdir)  # one suite per DIR; LockHeld -> 75 below
  try:
    if changed:
      plan.write_record(workdir, content)
    if fv.stage in ("all", "finetune"):
      code = execute.run_members(plan.ordered(planned, content), workdir, content)
      if code:
        return code
    if fv.stage in ("all", "report"):
      with errors.judging_input():
        for path in execute.report(workdir):
          print(path)
  finally:
    if lock is not None:
      lock.release()
  return 0


def _command(fv) -> int:
  """_run with its refusals as exit codes (one line each): the whole job."""
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top
  from bert_jax.run import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  try:
    return _run(fv)
  except workdir_lib.LockHeld as e:
    jobs.refuse(e)
    return exit_codes.LOCK_HELD
  except errors.UsageError as e:
    return jobs.refuse(e)


def main(argv):
  """Runs the suite (or prints its commands / dry run); exits with the code of _run. Started
  by bert_jax.launch (--job=evaluate), its state goes to DIR/job_state.json as a training
  job's does, so the launcher watches, relaunches and deletes the slice the same way."""
  if len(argv) > 1:
    sys.exit(_refuse(errors.UsageError(f"unexpected arguments: {argv[1:]}")))
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top
  from bert_jax.run import job_state  # pylint: disable=g-import-not-at-top
  jobs.configure_logging()
  if flags.FLAGS.verbose:
    os.environ[errors.VERBOSE_ENV] = "1"
  fv = flags.FLAGS
  if fv.dry_run or fv.print_commands:  # prints only: no job for a launcher to watch
    sys.exit(_command(fv))
  sys.exit(job_state.track(fv.workdir, False, lambda: _command(fv)))


def _refuse(error: BaseException) -> int:
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top
  return jobs.refuse(error)


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=parse_flags)
