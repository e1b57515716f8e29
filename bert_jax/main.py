r"""Entry point: `python -m bert_jax.main --config=experiments/configs/pretrain.py:tiny --workdir=DIR`.

config.family picks the trainer: "pretrain" (bert_jax.pretrain) or "finetune"
(bert_jax.finetune.trainer, e.g. --config=experiments/configs/finetune.py:sst2).
All logic lives there and in bert_jax.jobs (which also documents the exit
codes: 0 finished, 143 preempted after saving, 1 refused or a storage error);
this file only parses the two flags. Single config fields are overridden by
flag, e.g. `--config.total_steps=1000`.
"""

import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import jobs

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics "
                               "(re-running with the same workdir resumes).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  """Runs the job described by --config in --workdir."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  jobs.configure_logging()
  sys.exit(jobs.run(_CONFIG.value, _WORKDIR.value))


if __name__ == "__main__":
  app.run(main)
