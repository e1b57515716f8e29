"""A second process's fine-tuning sweep loads its programs from the persistent compilation cache.

steps.use_compilation_cache (called by finetune_sweep.finetune before anything
compiles) points JAX's persistent cache at $BERT_JAX_CACHE/jax_compilation_cache
unless JAX_COMPILATION_CACHE_DIR names one. A sweep from the second of an
ablation's checkpoints then runs the first one's programs without compiling.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.finetune import steps

# Runs a one-run toy sweep and prints the persistent cache's hits and misses.
DRIVER = r"""
import json, sys
import jax
from bert_jax.finetune import sweep as finetune_sweep
from experiments.configs import finetune as finetune_configs
counts = {"hits": 0, "misses": 0}
def listen(event, **_):
  if event == "/jax/compilation_cache/cache_hits":
    counts["hits"] += 1
  elif event == "/jax/compilation_cache/cache_misses":
    counts["misses"] += 1
jax.monitoring.register_event_listener(listen)
config = finetune_configs.get_config("custom")
config.update_from_flattened_dict(json.loads(sys.argv[1]))
summary = finetune_sweep.finetune(config, sys.argv[2])
print("COUNTS " + json.dumps({**counts, "dir": jax.config.jax_compilation_cache_dir,
                              "train_programs": summary["speed"]["compiled"]["train"]}))
"""


def _toy_task(root: pathlib.Path, vocab: pathlib.Path) -> dict:
  """Train and dev TSVs of a few dozen short sentences from the vocabulary's words."""
  words = [w for w in vocab.read_text().split() if w.isalpha()]
  rng = np.random.default_rng(0)
  for name, n in (("train", 32), ("dev", 16)):
    rows = ["sentence\tlabel"] + [
        " ".join(rng.choice(words, size=int(rng.integers(3, 12)))) + f"\t{['neg', 'pos'][i % 2]}"
        for i in range(n)]
    (root / f"{name}.tsv").write_text("\n".join(rows) + "\n")
  return {"task.train_file": str(root / "train.tsv"), "task.dev_file": str(root / "dev.tsv"),
          "task.labels": "neg,pos", "task.positive_label": "pos", "vocab_file": str(vocab),
          "model_size": "tiny", "max_seq_length": 16, "bucket_multiple": 8, "batch_size": 8,
          "eval_batch_size": 8, "num_epochs": 1, "seeds": [0],
          "checkpoint.every_steps": 1000}


@pytest.mark.slow
def test_a_second_process_sweep_compiles_nothing(pretrain_test_config, tmp_path):
  """Fails if the second process compiles (misses the cache) any program the first one ran,
  e.g. if a run's learning rate or seed were baked into a program, or if the cache were
  turned on after the first compile (JAX then ignores it for the whole process)."""
  config = _toy_task(tmp_path, pathlib.Path(pretrain_test_config().data.vocab_file))
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  # Our default location, not JAX's variable: what a user without settings gets.
  env.update(BERT_JAX_CACHE=str(tmp_path / "cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  counts = []
  for attempt in range(2):
    out = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(config),
                          str(tmp_path / f"sweep{attempt}")], env=env, capture_output=True,
                         text=True, timeout=1200, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    counts.append(json.loads(out.stdout.split("COUNTS ")[-1]))
  first, second = counts
  assert first["dir"] == str(tmp_path / "cache" / steps.COMPILATION_CACHE)
  assert first["misses"] > 0 and first["train_programs"] >= 1
  assert second["misses"] == 0, counts
  assert second["hits"] >= first["misses"], counts


def test_jax_settings_win_over_the_default():
  """Fails if use_compilation_cache replaced a directory JAX was already given (the test
  session's, from tests/conftest.py) or ignored JAX_ENABLE_COMPILATION_CACHE=false."""
  given = jax.config.jax_compilation_cache_dir
  assert given and steps.use_compilation_cache() == given
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    assert steps.use_compilation_cache() is None
  finally:
    jax.config.update("jax_enable_compilation_cache", True)
