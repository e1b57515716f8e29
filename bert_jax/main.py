r"""Entry point: `python -m bert_jax.main --config=experiments/configs/pretrain.py:tiny --workdir=DIR`.

config.family picks the trainer: "pretrain" (bert_jax.train) or "finetune"
(bert_jax.finetune.trainer, e.g. --config=experiments/configs/finetune.py:sst2).
All logic lives there; this file only parses the two flags.
Single config fields are overridden by flag, e.g. `--config.total_steps=1000`.
"""

import logging as std_logging

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bert_jax import train
from bert_jax.finetune import trainer as finetune_trainer

TRAINERS = {"pretrain": train.train_and_evaluate, "finetune": finetune_trainer.finetune}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics "
                               "(re-running with the same workdir resumes).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  """Runs the job described by --config in --workdir."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  # orbax logs a dozen INFO lines per save; keep the terminal for progress and evaluation.
  logging.get_absl_handler().addFilter(
      lambda record: record.levelno >= std_logging.WARNING or "/orbax/" not in record.pathname)
  config = _CONFIG.value
  if config.family not in TRAINERS:
    raise app.UsageError(f"config.family={config.family!r}: expected one of {sorted(TRAINERS)}")
  TRAINERS[config.family](config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
