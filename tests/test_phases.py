"""A run as a list of phases (bert_jax/pretrain/phases.py): the paper's two phases as a list,
the refusals, batch-size warmup, the "phases" learning-rate schedule, and the exact resume
of a packed, phase-listed, batch-warmed modern run after kill -9 at several moments."""

import json
import signal

import jax
import numpy as np
import pytest

import kill_points
from bert_jax.pretrain import phases
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.pretrain import trainer as pretrain_trainer
from bert_jax.run import checkpoint
from bert_jax.training import sharding
from experiments.configs import pretrain

phase = pretrain.phase


def _losses(workdir) -> dict[int, float]:
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def test_the_papers_two_phases_as_a_list_are_the_same_run(pretrain_test_config, tmp_path):
  """Fails if config.phase2 and the two-entry list it is shorthand for give other phases
  (steps, data config, batch) or another run: every logged loss and the final parameters
  bit for bit."""
  shorthand = pretrain_test_config(**{
      "total_steps": 6, "phase2.start_fraction": 0.5, "phase2.max_seq_length": 48,
      "checkpoint.every_steps": 6})
  listed = pretrain_test_config(**{"total_steps": 6, "checkpoint.every_steps": 6})
  listed.phases = [phase(0.0), phase(0.5, max_seq_length=48)]
  a, b = phases.of(shorthand), phases.of(listed)
  assert [(p.index, p.start, p.end, p.batch_size, p.data.to_dict()) for p in a] == [
      (p.index, p.start, p.end, p.batch_size, p.data.to_dict()) for p in b]
  assert [(p.start, p.data.max_seq_length) for p in b] == [(0, 32), (3, 48)]
  for config, name in ((shorthand, "shorthand"), (listed, "listed")):
    pretrain_trainer.train_and_evaluate(config, str(tmp_path / name))
  assert _losses(tmp_path / "shorthand") == _losses(tmp_path / "listed")
  _, x = checkpoint.load_params_from_workdir(str(tmp_path / "shorthand"))
  _, y = checkpoint.load_params_from_workdir(str(tmp_path / "listed"))
  jax.tree.map(np.testing.assert_array_equal, x, y)


def _modern(pretrain_test_config, **overrides):
  """The modern tiny encoder on the test corpus, packed documents, MLM only."""
  model = {f"model.{k}": v for k, v in pretrain.get_config("modern").model.items()
           if k not in ("max_position_embeddings", "local_attention", "dtype", "vocab_multiple")}
  return pretrain_test_config(**model, **{
      "model_size": "modernbert-tiny", "model.local_attention": 8,
      "data.objective": "documents", "data.masking.max_predictions_per_seq": 0, **overrides})


@pytest.mark.parametrize("change,message", [
    (lambda c: setattr(c, "phases", [phase(0.0), phase(0.5, max_seq_length=16)]),
     r"config.phases\[1\].max_seq_length=16 is shorter than the previous phase's 32"),
    (lambda c: setattr(c, "phases", [phase(0.0), phase(0.5, rope_theta=1e4)]),
     r"config.phases\[1\] sets a RoPE theta, but config.model.architecture='bert'"),
    (lambda c: setattr(c, "phases", [phase(0.1)]),
     r"config.phases\[0\].start_fraction=0.1: the first phase starts the run"),
    (lambda c: setattr(c, "phases", [phase(0.0), phase(0.6), phase(0.5)]),
     r"config.phases\[2\].start_fraction=0.5: phases must start in increasing order"),
    (lambda c: setattr(c, "phases", [phase(0.0, learning_rate=1e-3)]),
     r"config.phases\[0\] sets a learning-rate segment.*schedule='phases'"),
    (lambda c: (setattr(c, "phases", [phase(0.0)]), c.phase2.update(start_fraction=0.5)),
     r"config.phases and config.phase2 both set"),
    (lambda c: c.batch_warmup.update(tokens=10_000, min_batch_size=4),
     r"config.batch_warmup.tokens=1e\+04 takes 78 steps, the first phase has 20: the batch "
     r"warmup is longer than its phase"),
    (lambda c: c.batch_warmup.update(tokens=100, min_batch_size=3),
     r"config.batch_warmup.min_batch_size=3 must divide the first phase's batch size 8"),
])
def test_impossible_phase_lists_are_refused_in_one_line(pretrain_test_config, change, message):
  """Fails if this impossible phase list or batch warmup is accepted before anything runs,
  or refused without naming the entry, its value and the rule."""
  config = pretrain_test_config()
  change(config)
  with pytest.raises(ValueError, match=message):
    pretrain_steps.check_config(config, sharding.make_mesh(config.mesh, jax.devices()[:1]))


def test_batch_warmup_sizes_each_get_the_same_steps_and_the_tokens_asked():
  """Fails if the warmup's sizes are not min, 2 min, ... below the phase's batch, each for the
  same steps, their tokens not the ones asked (to within a step's rounding), or the rest of
  the first phase and the later phases move."""
  config = pretrain.get_config("tiny")  # batch 32, length 64, 1,500 steps
  config.phases = [phase(0.0), phase(0.8, max_seq_length=128)]
  config.batch_warmup.update(tokens=1_000_000, min_batch_size=8)
  run = phases.of(config)
  assert [p.batch_size for p in run] == [8, 16, 24, 32, 32]
  steps = {p.steps for p in run[:3]}
  assert len(steps) == 1 and run[2].end == run[3].start
  assert abs(phases.tokens(run[:3]) - 1_000_000) <= 64 * 48
  assert (run[3].end, run[4].start, run[4].end, run[4].data.max_seq_length) == (
      1200, 1200, 1500, 128)
  assert all(phases.continues(run[i], run[i + 1]) for i in range(3))
  assert not phases.continues(run[3], run[4])


def test_the_phases_schedule_warms_up_holds_drops_and_decays():
  """Fails if schedule "phases" does not warm up to the first phase's rate, hold it, drop to
  the second's at its first step and hold it, then decay 1-sqrt from the third's to the end
  rate over its steps."""
  config = pretrain.get_config("tiny")
  config.total_steps, config.optimizer.warmup_steps = 100, 10
  config.optimizer.update(schedule="phases", learning_rate=8e-4, end_learning_rate=8e-7)
  config.phases = [phase(0.0), phase(0.5, learning_rate=3e-4),
                   phase(0.8, decay="1-sqrt")]
  _, lr = pretrain_steps.optimizer(config)
  at = lambda s: float(lr(s))
  assert at(0) == 0 and at(5) == pytest.approx(4e-4) and at(10) == at(49) == pytest.approx(8e-4)
  assert at(50) == at(79) == pytest.approx(3e-4)
  assert at(80) == pytest.approx(3e-4)
  assert at(85) == pytest.approx(8e-7 + (3e-4 - 8e-7) * (1 - np.sqrt(5 / 20)), rel=1e-5)
  assert at(100) == pytest.approx(8e-7)


def _recipe(pretrain_test_config):
  """Packed, phase-listed, batch-warmed: batch 4 for steps 0-4, then 8; from step 12 longer
  rows, another masking ratio, RoPE theta and learning rate, decaying."""
  config = _modern(pretrain_test_config, **{
      "total_steps": 20, "checkpoint.every_steps": 4, "optimizer.schedule": "phases",
      "optimizer.learning_rate": 3e-3, "batch_warmup.tokens": 512,
      "batch_warmup.min_batch_size": 4})
  config.phases = [phase(0.0, masking_ratio=0.3),
                   phase(0.6, max_seq_length=48, masking_ratio=0.15, rope_theta=1e5,
                         learning_rate=1e-3, decay="1-sqrt")]
  return config


def test_the_recipe_runs_its_phases(pretrain_test_config):
  """Fails if the test recipe's phases are not the ones the kill test relies on: a warmup
  size to step 4 that the rest of phase 1 reads on from, a boundary at step 12 into longer
  rows with a theta of their own."""
  run = phases.of(_recipe(pretrain_test_config))
  assert [(p.start, p.end, p.batch_size, p.data.max_seq_length) for p in run] == [
      (0, 4, 4, 32), (4, 12, 8, 32), (12, 20, 8, 48)]
  assert phases.continues(run[0], run[1]) and run[2].network["rope_theta"] == 1e5


@pytest.fixture(scope="module")
def recipe_reference(pretrain_test_config, pretrain_subprocess, tmp_path_factory):
  """The recipe's uninterrupted 20-step run."""
  workdir = tmp_path_factory.mktemp("recipe") / "run"
  process = pretrain_subprocess(_recipe(pretrain_test_config), workdir)
  assert process.wait(timeout=600) == 0, (workdir.parent / "run.log").read_text()[-3000:]
  return workdir


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["step:6", "save:8", "step:14"])
def test_kill9_anywhere_in_the_recipe_then_resume_is_bit_identical(
    kill_at, recipe_reference, pretrain_test_config, pretrain_subprocess, tmp_path):
  """kill -9 inside the batch warmup's next phase (resumed from the step-4 checkpoint at the
  size change), mid-save, and in the longer phase (resumed from the step-12 checkpoint at
  the length change): fails if the run does not die there, or the resumed run differs from
  the uninterrupted one in any step's loss, its batch log (the batches it read) or the final
  parameters."""
  workdir = tmp_path / "run"
  process = pretrain_subprocess(_recipe(pretrain_test_config), workdir, kill_at=kill_at)
  assert process.wait(timeout=600) == -signal.SIGKILL, (tmp_path / "run.log").read_text()[-3000:]
  evidence = json.loads(kill_points.marker(workdir).read_text())
  assert (evidence["phase"], evidence["step"]) == kill_points.parse(kill_at)
  process = pretrain_subprocess(_recipe(pretrain_test_config), workdir)
  assert process.wait(timeout=600) == 0, (tmp_path / "run.log").read_text()[-3000:]
  assert _losses(workdir) == _losses(recipe_reference) and len(_losses(workdir)) == 20
  assert ((workdir / "batch_log.jsonl").read_text()
          == (recipe_reference / "batch_log.jsonl").read_text())
  _, resumed = checkpoint.load_params_from_workdir(str(workdir))
  _, reference = checkpoint.load_params_from_workdir(str(recipe_reference))
  jax.tree.map(np.testing.assert_array_equal, resumed, reference)


def test_a_batch_size_change_reads_on_from_the_same_stream(pretrain_test_config):
  """Fails if the phase after a warmup size starts its stream over (its rows would repeat
  the warmup's) instead of reading on: its first batch of 8 must be the rows that a batch
  of 4 would have read next, twice, mask seeds and all."""
  from data_pipeline import prepare  # pylint: disable=g-import-not-at-top
  config = _recipe(pretrain_test_config)
  run = phases.of(config)
  data = prepare.PretrainingData.prepare(run, batch_size=config.batch_size,
                                         eval_batch_size=config.eval_batch_size,
                                         total_steps=config.total_steps)
  small = data.train_input(run[0].index)
  for _ in range(4):  # the warmup phase: steps 0-3 at batch 4
    next(small)
  handover = {"phase": run[0].index, "input": small.get_state()}
  following = [next(small) for _ in range(2)]  # what batch 4 would read next
  small.close()
  big = data.train_input(run[1].index, {"continue": True, "input": handover["input"]})
  batch = next(big)
  big.close()
  assert batch["input_ids"].shape[0] == 8
  for key in ("input_ids", "document_ids", "position_ids", "masked_lm_positions"):
    np.testing.assert_array_equal(batch[key], np.concatenate([b[key] for b in following]),
                                  err_msg=key)
