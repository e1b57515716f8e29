"""Running one job: the trainer a config names, its exit code, refusals and quiet logging.

bert_jax.main parses flags (parse_flags) and calls run(); anything else that
starts jobs (the ablation, test runners) calls the same run(), refuse(),
parse_flags() and configure_logging(), which define no flags.

Exit codes, for schedulers and bert_jax.launch (their values: bert_jax.exit_codes):
  0    the run finished (re-running the command does nothing more)
  143  preempted (SIGTERM): the step was saved; re-run the same command to resume
  130  interrupted (Ctrl-C): the step was saved the same way (a second Ctrl-C
       aborts at once, without waiting for that save; the newest complete step
       resumes). On several processes a Ctrl-C to any one stops them all at one
       saved step, and all exit 130.
  75   workdir locked by another live run; retry later (workdir.LockHeld, one
       line on stderr; nothing was written; the SLURM template requeues on it)
  1    failed: the user's input refused (errors.UsageError: a config, flag, data
       file, checkpoint or workdir; nothing was written) or a storage error,
       each as one line on stderr ("error: ..."; BERT_JAX_VERBOSE=1 or
       bert_jax.main --verbose adds the traceback); any other error raises
"""

import logging as std_logging
import os
import sys
import time
import traceback

from absl import flags
from absl import logging

from bert_jax import errors
from bert_jax import exit_codes
from bert_jax.run import checkpoint
from bert_jax.run import job_state
from bert_jax.run import layouts
from bert_jax.run import preemption
from bert_jax.run import workdir


# The trainers are imported when a job runs, not with this module: they bring TensorFlow
# (the input pipelines and tokenizers), two thirds of a process's start-up (6-12 s), which
# `--help` and a refused flag or config must not wait for.
def _pretrain(config, workdir_path: str):
  from bert_jax.pretrain import trainer  # pylint: disable=g-import-not-at-top
  return trainer.train_and_evaluate(config, workdir_path)


def _finetune(config, workdir_path: str):
  from bert_jax.finetune import sweep as finetune_sweep  # pylint: disable=g-import-not-at-top
  return finetune_sweep.finetune(config, workdir_path)


TRAINERS = {"pretrain": _pretrain, "finetune": _finetune}


def _quiet_orbax(record: std_logging.LogRecord) -> bool:
  """absl logger filter: orbax's lines are dropped, its warnings and errors too unless
  verbose(). A failed save or restore reaches the run as an exception, which run()
  reports once (a full disk: one "storage error" line) or the restore code names by
  step; orbax's own lines before it say the same at length (4 long ones for a full
  disk), and its INFO lines are a dozen per save. With verbose() its warnings and
  errors are kept, without the tracebacks of its background threads."""
  if "/orbax/" not in record.pathname:
    return True
  if record.levelno < std_logging.WARNING or not verbose():
    return False
  record.exc_info, record.exc_text = None, None
  return True


def _drop_unretrieved_storage_errors(record: std_logging.LogRecord) -> bool:
  """asyncio logger filter: after a failed async save, every pending write's task is
  garbage-collected with the same storage error ("Task exception was never
  retrieved"), once per array; run() has reported it once already."""
  exc = record.exc_info[1] if record.exc_info else None
  if exc is None and isinstance(getattr(record, "args", None), dict):
    exc = record.args.get("exception")
  return not ("never retrieved" in str(record.msg) and exc is not None
              and checkpoint.describe_storage_error(exc) is not None)


@job_state.tracked  # WORKDIR/job_state.json for bert_jax.launch (only when it set BERT_JAX_JOB_ID)
def run(config, workdir_path: str, explicit: tuple[str, ...] | list[str] = ()) -> int:
  """Runs the job and returns the process exit code (see the module docstring).

  `explicit`: the config fields the command line set (bert_jax.run.layouts: a layout
  chosen for the slice never overrides them)."""
  preemption.clear()  # the exit code describes this run, not an earlier one in this process
  try:
    if config.family not in TRAINERS:
      raise errors.UsageError(f"config.family={config.family!r}: expected one of "
                              f"{sorted(TRAINERS)}")
    with errors.judging_input():  # a bad layout table is the config's fault: one line
      recorded = (workdir.previous_config(workdir_path) if workdir.holds_work(workdir_path)
                  else None)  # a record without work binds nothing (workdir.holds_work)
      line = layouts.choose(config, explicit, recorded)
    if line:
      logging.info("%s", line)
    started = time.monotonic()
    TRAINERS[config.family](config, workdir_path)
    if not preemption.was_preempted():
      done(config.family, workdir_path, time.monotonic() - started)
  except workdir.LockHeld as e:  # not wrong input: the workdir is busy, so "retry later"
    refuse(e)
    return exit_codes.LOCK_HELD
  except errors.UsageError as e:  # workdir.WorkdirError and checkpoint.CheckpointError too
    return refuse(e)
  except KeyboardInterrupt:  # Ctrl-C while the loop's stop request was not listening
    print("interrupted (Ctrl-C) outside the training loop: nothing was saved since the last "
          "checkpoint", file=sys.stderr, flush=True)
    return exit_codes.INTERRUPTED
  except Exception as e:  # pylint: disable=broad-except  # re-raised unless it is storage
    cause = checkpoint.describe_storage_error(e)
    if cause is None:
      raise
    return refuse(e, f"storage error: {cause}")
  finally:
    preemption.release()  # a Ctrl-C stop listened for a second Ctrl-C until here
  return preemption.stopped_exit_code() if preemption.was_preempted() else exit_codes.DONE


def done(family: str, workdir_path: str, seconds: float) -> None:
  """The finished job's last line: how long it took and where its results are."""
  minutes, secs = divmod(int(round(seconds)), 60)
  where = (f"checkpoints in {workdir_path}/checkpoints, metrics in {workdir_path}/metrics.jsonl"
           if family == "pretrain" else f"results in {workdir_path}")
  print(f"done in {minutes} min {secs:02d} s: {where}", flush=True)


def verbose() -> bool:
  """Whether refusals show their traceback (BERT_JAX_VERBOSE=1; bert_jax.main --verbose)."""
  return os.environ.get(errors.VERBOSE_ENV, "") not in ("", "0")


def refuse(error: BaseException, message: str | None = None) -> int:
  """Prints a refusal as one line on stderr and returns exit code 1; with verbose(), the
  traceback first. Every refusal of a job (bert_jax.main's flags included) goes through here."""
  sys.stdout.flush()
  sys.stderr.flush()  # after the log lines already written, never inside them
  if verbose():
    traceback.print_exception(error, file=sys.stderr)
  print(f"error: {errors.one_line(message or str(error)) or repr(error)}", file=sys.stderr,
        flush=True)
  return exit_codes.REFUSED


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with every failure refused in one line (exit 1; worded by
  errors.flag_message); returns the arguments left over, as absl's own parser does.
  The flags_parser of every entry point (bert_jax.main, experiments.ablation)."""
  if "--verbose" in argv:  # a refusal of the flags themselves honours it too
    os.environ[errors.VERBOSE_ENV] = "1"
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    sys.exit(refuse(e, errors.flag_message(e, argv)))


def configure_logging() -> None:
  """INFO to the terminal, orbax quiet unless verbose() (see _quiet_orbax)."""
  logging.set_verbosity(logging.INFO)
  # On the logger, not a handler: it holds whether or not absl's handler is installed.
  std_logging.getLogger("absl").addFilter(_quiet_orbax)
  # JAX logs each backend it probes and does not find ("Unable to initialize backend
  # 'tpu'...") at INFO; the device line of train_state.setup_mesh says what was found.
  std_logging.getLogger("jax._src.xla_bridge").setLevel(std_logging.WARNING)
  std_logging.getLogger("asyncio").addFilter(_drop_unretrieved_storage_errors)
  previous_hook = sys.unraisablehook

  def unraisable(info):
    # After a failed async save, tensorstore completes its futures into orbax's
    # already closed event loop, once per pending write; those "Event loop is
    # closed" tracebacks carry nothing the storage error line does not say.
    if isinstance(info.exc_value, RuntimeError) and "Event loop is closed" in str(info.exc_value):
      return
    previous_hook(info)
  sys.unraisablehook = unraisable
