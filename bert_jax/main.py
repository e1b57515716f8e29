r"""Entry point: `python -m bert_jax.main --config=experiments/configs/pretrain.py:tiny --workdir=DIR`.

config.family picks the trainer: "pretrain" (bert_jax.train) or "finetune"
(bert_jax.finetune.trainer, e.g. --config=experiments/configs/finetune.py:sst2).
All logic lives there; this file only parses the two flags.
Single config fields are overridden by flag, e.g. `--config.total_steps=1000`.

Exit codes, for schedulers and bert_jax.launch:
  0    the run finished (re-running the command does nothing more)
  143  preempted (SIGTERM): the step was saved; re-run the same command to resume
  1    failed: a config or workdir refused (nothing was written), a storage
       error (one line names the path and the cause), or any other error
"""

import logging as std_logging
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bert_jax import checkpoint
from bert_jax import preemption
from bert_jax import train
from bert_jax import workdir
from bert_jax.finetune import trainer as finetune_trainer

TRAINERS = {"pretrain": train.train_and_evaluate, "finetune": finetune_trainer.finetune}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics "
                               "(re-running with the same workdir resumes).")
flags.mark_flags_as_required(["config", "workdir"])


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


def run(config, workdir_path: str) -> int:
  """Runs the job and returns the process exit code (see the module docstring)."""
  if config.family not in TRAINERS:
    raise app.UsageError(f"config.family={config.family!r}: expected one of {sorted(TRAINERS)}")
  try:
    TRAINERS[config.family](config, workdir_path)
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


def main(argv):
  """Runs the job described by --config in --workdir."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  configure_logging()
  sys.exit(run(_CONFIG.value, _WORKDIR.value))


if __name__ == "__main__":
  app.run(main)
