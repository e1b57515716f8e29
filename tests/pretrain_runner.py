"""Subprocess entry for the trainer's end-to-end tests (kill -9, meshes, multi-process).

usage: python tests/pretrain_runner.py CONFIG_JSON WORKDIR [--synthetic] [--kill_at=PHASE:STEP]
  [--kill_marker=PATH]
(TEST_LOCK_HEARTBEAT_S in the environment: the workdir lock's heartbeat, for lock tests)

Runs bert_jax.main.run (the entry point minus flag parsing) on a config
serialised with ConfigDict.to_json(). --synthetic replaces the input pipeline with a
deterministic random stream whose global batch is the same however many
processes share it (process i gets rows [i*b, (i+1)*b)): the real pipeline
gives each process different documents, so 2 processes could not be compared
with 1 process on it. --kill_at makes the run kill itself (SIGKILL) at that
moment, after recording where (tests/kill_points.py): beside the workdir, or in
--kill_marker's file (a gs:// workdir's).
"""

import json
import os
import pathlib
import sys

import ml_collections
import numpy as np


def _synthetic_batch(data_config, rows: int, seed) -> dict:
  """A random batch with the pipeline's features; seeds fix it for every process."""
  rng = np.random.default_rng(seed)
  length = data_config.max_seq_length
  predictions = data_config.masking.max_predictions_per_seq
  ids = rng.integers(5, 90, size=(rows, length)).astype(np.int32)
  positions = np.sort(np.stack([rng.choice(np.arange(1, length), predictions, replace=False)
                                for _ in range(rows)]), axis=1).astype(np.int32)
  weights = (rng.random((rows, predictions)) < 0.8).astype(np.float32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids),
          "segment_ids": (np.arange(length)[None] >= length // 2).astype(np.int32).repeat(rows, 0),
          "masked_lm_positions": positions,
          "masked_lm_ids": rng.integers(5, 90, size=(rows, predictions)).astype(np.int32),
          "masked_lm_weights": weights,
          "next_sentence_labels": rng.integers(0, 2, size=(rows,)).astype(np.int32)}


class SyntheticInput:
  """Stand-in for PretrainingInput: a global random stream, sliced per process."""

  def __init__(self, data_config, *, batch_size, process_index=0, process_count=1, split="train",
               first_step=0, schedule_steps=0, tokenizer=None, corpus=None):
    del split, first_step, schedule_steps, tokenizer, corpus  # no masking, no real text
    self.config, self.batch_size = data_config, batch_size
    self.process_index, self.process_count = process_index, process_count
    self.position = 0
    self.last_fingerprint = ""

  def __iter__(self):
    return self

  def __next__(self):
    full = _synthetic_batch(self.config, self.batch_size * self.process_count,
                            (self.config.seed, self.position))
    self.position += 1
    lo = self.process_index * self.batch_size
    batch = {k: v[lo:lo + self.batch_size] for k, v in full.items()}
    from data_pipeline.examples import pretraining  # pylint: disable=g-import-not-at-top  # after sys.path
    self.last_fingerprint = pretraining.batch_fingerprint(
        batch["input_ids"], batch["segment_ids"], batch["next_sentence_labels"])
    return batch

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = state["position"]

  def close(self):
    pass  # nothing runs in the background


def synthetic_eval_batches(data_config, *, batch_size, process_index=0, process_count=1,
                           own_masking=False, tokenizer=None, corpus=None):
  """Two fixed global eval batches, sliced per process."""
  del own_masking, tokenizer, corpus  # the synthetic masks are what they are
  lo = process_index * batch_size
  return [{k: v[lo:lo + batch_size] for k, v in
           _synthetic_batch(data_config, batch_size * process_count, (999, i)).items()}
          for i in range(2)]


def main(argv):
  config = ml_collections.ConfigDict(json.loads(pathlib.Path(argv[1]).read_text()))
  if "--synthetic" in argv:
    from data_pipeline.examples import pretraining
    pretraining.PretrainingInput = SyntheticInput
    pretraining.make_eval_batches = synthetic_eval_batches
  options = dict(arg[2:].split("=", 1) for arg in argv[3:] if "=" in arg)
  if "kill_at" in options:
    import kill_points  # beside this file (sys.path[0])
    kill_points.install(options["kill_at"], argv[2], options.get("kill_marker"))
  from bert_jax import jobs
  if os.environ.get("TEST_LOCK_HEARTBEAT_S"):  # the lock tests' heartbeat, in seconds
    from bert_jax.run import lock
    lock.HEARTBEAT_S = float(os.environ["TEST_LOCK_HEARTBEAT_S"])
  jobs.configure_logging()
  # The entry point's own run(): exit codes (0 done, 143 preempted, 1 refused or a
  # storage error) are what schedulers and the tests see.
  sys.exit(jobs.run(config, argv[2]))


if __name__ == "__main__":
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
  main(sys.argv)
