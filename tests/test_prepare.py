"""Tests of data_pipeline/prepare.py: a pretraining run's data as one prepared object.

- PretrainingData reads each corpus split once, in prepare(), and its inputs and
  eval sets (both phases) give exactly what a PretrainingInput / make_eval_batches
  built on their own give: the trainer's batches did not change by going
  through it.
- train_input(phase, state) resumes a phase at a checkpoint's position and starts
  phase 2 at its own position 0; bert_jax.pretrain.phases says which phase a step is in.
- bert_jax.main refuses a config typo before any corpus work: with a fresh,
  empty $BERT_JAX_CACHE (where the embedded corpus would be harvested and its
  vocabulary trained), the cache stays empty.
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.pretrain import phases
from data_pipeline import prepare
from data_pipeline.examples import pretraining
from data_pipeline.store import tokenized_corpus

REPO = pathlib.Path(__file__).resolve().parents[1]


def _assert_same(batches, others):
  assert len(batches) == len(others)
  for x, y in zip(batches, others):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.fixture(name="reads")
def _count_reads(monkeypatch):
  """The (split, process_index, process_count) of every corpus read, in order."""
  reads = []
  read = tokenized_corpus.read_tokenized_corpus

  def counting(data_config, tokenizer, **kwargs):
    reads.append((kwargs["split"], kwargs["process_index"], kwargs["process_count"]))
    return read(data_config, tokenizer, **kwargs)

  monkeypatch.setattr(tokenized_corpus, "read_tokenized_corpus", counting)
  return reads


def test_reads_once_and_gives_the_pipelines_batches(pretrain_test_config, reads):
  """Fails if an input or eval set reads the corpus again, or if the object's batches
  (either phase, either eval kind) differ from the pipeline's own."""
  config = pretrain_test_config(total_steps=10, **{"phase2.start_fraction": 0.5,
                                                   "phase2.max_seq_length": 48,
                                                   "phase2.max_predictions_per_seq": 7,
                                                   "data.eval.own_masking": True,
                                                   # the in-memory path, whose reads are
                                                   # counted (the store's: test_token_store)
                                                   "data.tokenized_dir": "none"})
  run_phases = phases.of(config)
  data = prepare.PretrainingData.prepare(
      run_phases, 0, 1, batch_size=config.batch_size, eval_batch_size=config.eval_batch_size,
      total_steps=config.total_steps)
  assert reads == [("train", 0, 1), ("eval", 0, 1)]  # phase 2 reads the same documents
  assert data.vocab_size == 96 and data.vocab_file == config.data.vocab_file
  assert data.fingerprint["files"] == 1
  assert (data.max_predictions(1), data.max_predictions(2)) == (5, 7)
  assert [phases.at(run_phases, s).index for s in (0, 4, 5, 9)] == [1, 1, 2, 2]

  got = {phase: [next(source) for _ in range(2)] for phase, source in
         ((1, data.train_input(1)), (2, data.train_input(2)))}
  kinds = {1: ("eval", "eval_own"), 2: ("eval",)}
  evals = {(phase, kind): data.eval_batches(kind, phase)
           for phase in (1, 2) for kind in kinds[phase]}
  assert data.eval_batches("eval", 2) is evals[2, "eval"]  # built once
  assert reads == [("train", 0, 1), ("eval", 0, 1)]

  for phase, first in ((1, 0), (2, 5)):
    phase_config = phases.at(run_phases, first).data
    alone = pretraining.PretrainingInput(phase_config, batch_size=8, first_step=first,
                                         schedule_steps=10)
    _assert_same(got[phase], [next(alone) for _ in range(2)])
    alone.close()
    assert got[phase][0]["input_ids"].shape[1] == phase_config.max_seq_length
    for kind in kinds[phase]:
      _assert_same(evals[phase, kind], pretraining.make_eval_batches(
          phase_config, batch_size=8, own_masking=kind == "eval_own"))
  with pytest.raises(ValueError, match="eval kind"):
    data.eval_batches("heldout")


def test_train_input_resumes_its_phase_only(pretrain_test_config):
  """Fails if a checkpoint's position is not where the next batches come from, or if a
  phase-1 position is applied to phase 2's stream."""
  config = pretrain_test_config(total_steps=10, **{"phase2.start_fraction": 0.5})
  data = prepare.PretrainingData.prepare(
      phases.of(config), 0, 1, batch_size=8, eval_batch_size=8, total_steps=10)
  source = data.train_input(1)
  next(source)
  state = {"phase": 1, "input": source.get_state()}
  expected = [next(source) for _ in range(2)]
  source.close()
  resumed = data.train_input(1, state)
  _assert_same([next(resumed) for _ in range(2)], expected)
  resumed.close()
  phase2 = data.train_input(2, state)  # a phase-1 state: phase 2 starts at its position 0
  assert phase2.get_state()["index"] == 0
  phase2.close()


def test_a_run_without_phase_2(pretrain_test_config):
  """Fails if a run whose phase 2 never starts is given one."""
  config = pretrain_test_config()  # tiny: start_fraction 1.0
  run_phases = phases.of(config)
  assert [(p.index, p.start, p.end) for p in run_phases] == [(1, 0, 20)]
  assert phases.at(run_phases, 19).index == 1
  data = prepare.PretrainingData.prepare(run_phases, batch_size=8, eval_batch_size=8,
                                         total_steps=20)
  assert sorted(data.phases) == [1]


@pytest.mark.slow
def test_a_config_typo_is_refused_before_any_corpus_work(tmp_path):
  """bert_jax.main on the default (embedded-corpus) job with a negative learning rate and
  a fresh, empty $BERT_JAX_CACHE: refused (exit 1, the field named) with the cache
  still empty -- nothing harvested, no vocabulary trained (today's harvest + vocab
  training take minutes). Fails if any corpus or vocabulary work comes before the
  config's own checks.

  Time: the refusal itself (from the start of bert_jax.main's main(), after its
  imports and the pretraining trainer's) must take under 5 s. The interpreter's imports
  (JAX, TensorFlow) are timed apart and only bounded loosely: every command pays them,
  whatever the cache holds, and on the shared 2-core CI machine they alone took 5-34 s
  (the refusal after them: 0.07 s, measured 2026-12-01 at a load average of 16).
  """
  cache = tmp_path / "cache"
  cache.mkdir()
  script = (
      "import sys, time\n"
      "start = time.perf_counter()\n"
      "from absl import app\n"
      "from bert_jax import jobs, main\n"
      # bert_jax.jobs imports a trainer when its job runs: imported here, it is timed
      # with the other imports, not as part of the refusal.
      "from bert_jax.pretrain import trainer\n"
      "imported = time.perf_counter()\n"
      "try:\n"
      "  app.run(main.main, flags_parser=jobs.parse_flags)\n"
      "finally:\n"
      "  sys.stderr.write(f'\\nTIMES {imported - start:.3f} {time.perf_counter() - imported:.3f}\\n')\n")
  args = ["--config=experiments/configs/pretrain.py:tiny", f"--workdir={tmp_path / 'work'}",
          "--config.optimizer.learning_rate=-1"]
  run = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, capture_output=True,
                       text=True, timeout=300, check=False,
                       env={**os.environ, "BERT_JAX_CACHE": str(cache), "JAX_PLATFORMS": "cpu",
                            "PYTHONPATH": str(REPO)})
  assert run.returncode == 1, run.stderr[-3000:]
  assert "error: config.optimizer.learning_rate=-1.0 must be >= 0" in run.stderr
  assert list(cache.iterdir()) == []  # the real proof: no harvest, no vocabulary
  assert not (tmp_path / "work").exists()
  imports, refusal = (float(t) for t in run.stderr.rsplit("TIMES ", 1)[1].split())
  assert refusal < 5.0, f"refused {refusal:.1f} s after the imports ({imports:.1f} s)"
