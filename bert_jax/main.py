r"""Entry point: `python -m bert_jax.main --config=experiments/configs/pretrain.py:tiny --workdir=DIR`.

config.family picks the trainer: "pretrain" (bert_jax.pretrain.trainer) or "finetune"
(bert_jax.finetune.trainer, e.g. --config=experiments/configs/finetune.py:sst2).
All logic lives there and in bert_jax.jobs (which also documents the exit
codes: 0 finished, 143 preempted after saving, 1 refused or a storage error);
this file only parses the flags. Single config fields are overridden by
flag, e.g. `--config.total_steps=1000`.

A flag that does not parse (an unknown variant, a config file that is not
there, a mistyped field such as `--config.data.masking.ratoi`) is refused like
any other input: one line on stderr, exit 1 (bert_jax.jobs.refuse). `--verbose`
(or BERT_JAX_VERBOSE=1) adds the traceback to every refusal.
"""

import os
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from bert_jax import errors
from bert_jax import jobs
from bert_jax.run import layouts

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints and metrics "
                               "(re-running with the same workdir resumes).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show the traceback of a refusal "
                             f"(the environment variable {errors.VERBOSE_ENV}=1 does too).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  """Runs the job described by --config in --workdir."""
  if _VERBOSE.value:
    os.environ[errors.VERBOSE_ENV] = "1"
  if len(argv) > 1:
    sys.exit(jobs.refuse(errors.UsageError(f"unexpected arguments: {argv[1:]} "
                                           "(every setting is a --config.* flag)")))
  try:
    config = _CONFIG.value
    getattr(config, "family", None)  # a config file that did not load fails on first use
  except (OSError, ValueError) as e:
    last = [l.strip() for l in str(e).splitlines() if l.strip()][-1]
    sys.exit(jobs.refuse(e, f"flag --config: cannot load the config file: {last}"))
  jobs.configure_logging()
  sys.exit(jobs.run(config, _WORKDIR.value, explicit=layouts.explicit_fields(sys.argv)))


if __name__ == "__main__":
  app.run(main, flags_parser=jobs.parse_flags)
