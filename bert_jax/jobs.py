"""Running one job: the trainer a config names, its exit code, and quiet logging.

bert_jax.main parses flags and calls run(); anything else that starts jobs (the
ablation, test runners) calls the same run() and configure_logging(), which
define no flags.

Exit codes, for schedulers and bert_jax.launch:
  0    the run finished (re-running the command does nothing more)
  143  preempted (SIGTERM): the step was saved; re-run the same command to resume
  75   workdir locked by another live run; retry later (workdir.LockHeld, one
       line on stderr; nothing was written; the SLURM template requeues on it)
  1    failed: a config or workdir refused (nothing was written), a storage
       error (one line names the path and the cause); any other error raises
"""

import logging as std_logging
import sys

from absl import logging

from bert_jax import checkpoint
from bert_jax import job_state
from bert_jax import preemption
from bert_jax import pretrain as pretrain_lib
from bert_jax import workdir
from bert_jax.finetune import trainer as finetune_trainer

LOCK_HELD_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h): the workdir is another live run's
TRAINERS = {"pretrain": pretrain_lib.train_and_evaluate, "finetune": finetune_trainer.finetune}


def _quiet_orbax(record: std_logging.LogRecord) -> bool:
  """absl handler filter: orbax's INFO lines (a dozen per save) are dropped, and its
  errors keep their one-line message but not the tracebacks of its background
  threads (the cause is reported once, at the end, by run())."""
  if "/orbax/" not in record.pathname:
    return True
  if record.levelno < std_logging.WARNING:
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
def run(config, workdir_path: str) -> int:
  """Runs the job and returns the process exit code (see the module docstring)."""
  if config.family not in TRAINERS:
    raise ValueError(f"config.family={config.family!r}: expected one of {sorted(TRAINERS)}")
  preemption.clear()  # the exit code describes this run, not an earlier one in this process
  try:
    TRAINERS[config.family](config, workdir_path)
  except workdir.LockHeld as e:  # not wrong input: the workdir is busy, so "retry later"
    logging.error("%s", e)
    return LOCK_HELD_EXIT_CODE
  except (workdir.WorkdirError, checkpoint.CheckpointError) as e:
    logging.error("%s", e)  # refusals are complete sentences; a traceback would bury them
    return 1
  except Exception as e:  # pylint: disable=broad-except  # re-raised unless it is storage
    cause = checkpoint.describe_storage_error(e)
    if cause is None:
      raise
    logging.error("storage error: %s", cause)
    return 1
  return preemption.PREEMPTED_EXIT_CODE if preemption.was_preempted() else 0


def configure_logging() -> None:
  """INFO to the terminal, orbax quieted (see _quiet_orbax)."""
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
