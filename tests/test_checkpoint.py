"""Tests for bert_jax.run.checkpoint: retention policy, import hook, kill -9 exact resume."""

import json
import pathlib
import re
import resource
import shutil
import signal
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.model import heads
from bert_jax.run import checkpoint
import kill_points  # tests/kill_points.py (pytest puts tests/ on sys.path)


def step_losses(workdir) -> dict[int, float]:
  """Training loss per step from metrics.jsonl (a resumed run's later record wins)."""
  losses = {}
  for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines():
    record = json.loads(line)
    if "loss" in record:
      losses[record["step"]] = record["loss"]
  return losses


def test_keeps_last_n_plus_every_kth(tmp_path):
  """Fails if the retention policy keeps other steps than the last 2 plus every 4th, or a
  kept step does not restore its params and pipeline position."""
  config = ml_collections.ConfigDict(dict(keep=2, keep_period=4, async_save=True))
  manager = checkpoint.make_manager(str(tmp_path), config)
  for step in range(1, 10):
    state = {"params": {"w": jnp.full((3,), float(step))}, "opt_state": {},
             "step": jnp.asarray(step)}
    checkpoint.save(manager, step, state, {"position": step})
  manager.wait_until_finished()
  assert sorted(manager.all_steps()) == [4, 8, 9]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), state)
  restored, data_state = checkpoint.restore(manager, abstract, step=8)
  np.testing.assert_array_equal(restored["params"]["w"], np.full((3,), 8.0))
  assert data_state == {"position": 8}
  manager.close()


@pytest.mark.slow  # its fixture is an end-to-end training run
def test_load_params_from_workdir(pretrain_reference_run):
  """Fails if the import hook returns params of other shapes than BertForPreTraining's, reads
  another step than the latest (or the one a step directory names), or accepts a
  directory without bert_config.json."""
  bert_config, params = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  assert (bert_config.hidden_size, bert_config.num_hidden_layers, bert_config.vocab_size) == (
      64, 2, 96)
  module = heads.BertForPreTraining(bert_config)
  ids = jnp.zeros((1, 8), jnp.int32)
  expected = jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, ids, ids[:, :2]))
  expected = jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(expected["params"]))
  got = jax.tree.map(lambda x: (x.shape, x.dtype), params)
  assert got == expected
  # A step directory names that step; the workdir means the latest.
  step_dir = pretrain_reference_run / "checkpoints" / "10"
  _, params_10 = checkpoint.load_params_from_workdir(str(step_dir))
  assert not np.array_equal(params_10["mlm_head"]["output_bias"], params["mlm_head"]["output_bias"])
  with pytest.raises(ValueError, match="bert_config.json"):
    checkpoint.load_params_from_workdir(str(pretrain_reference_run.parent))


# The moments a kill -9 is made to land on (tests/kill_points.py: the run kills itself
# there, after recording where), each followed by the complete checkpoints it leaves
# (one every 5 steps): each resumes from an earlier one and redoes the steps after it.
KILL_MOMENTS = {
    "step:8": [5],            # update 8 dispatched, its results not yet fetched
    "save:10": [5],           # checkpoint 10 written in orbax's temporary directory, uncommitted
    "metrics:12": [5, 10],    # half of step 12's row in metrics.jsonl
    "batch_log:15": [5, 10],  # step 15's save flushes rows 11-15: cut in row 15
}


def _complete_steps(workdir) -> list[int]:
  """The committed checkpoints: orbax renames a step's temporary directory to its number."""
  return sorted(int(p.name) for p in (pathlib.Path(workdir) / "checkpoints").iterdir()
                if p.name.isdigit())


def _torn_tail(path: pathlib.Path) -> tuple[list[dict], str]:
  """(the complete rows of a JSON-lines log, the unterminated piece after them)."""
  text = path.read_text()
  head, _, tail = text.rpartition("\n")
  return [json.loads(l) for l in head.splitlines()], tail


def _assert_killed_there(workdir: pathlib.Path, phase: str, step: int, evidence: dict) -> None:
  """The killed workdir shows the moment `evidence` (the run's marker) says it died at."""
  if phase == "step":
    # Update `step` was in flight: the rows before it are written, its own is not.
    assert sorted(step_losses(workdir)) == list(range(1, step))
  elif phase == "save":
    # orbax 0.12's temporary directory of a step: "<step>.orbax-checkpoint-tmp".
    tmp = workdir / "checkpoints" / evidence["tmp_dir"]
    assert tmp.name.startswith(f"{step}.orbax-checkpoint-tmp") and tmp.is_dir(), evidence
    assert not evidence["final_exists"] and not (workdir / "checkpoints" / str(step)).exists()
    # Both items were written into it: only the commit (the rename) was missing.
    assert {f.split("/")[0] for f in evidence["files"]} >= {"state", "data_state"}, evidence
  else:
    rows, torn = _torn_tail(workdir / ("metrics.jsonl" if phase == "metrics"
                                       else "batch_log.jsonl"))
    assert torn == evidence["torn"] and torn.startswith(f'{{"step": {step}, '), evidence
    with pytest.raises(json.JSONDecodeError):
      json.loads(torn)
    assert [r["step"] for r in rows if phase == "batch_log" or "loss" in r] == list(
        range(1, step))


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", KILL_MOMENTS)
def test_kill9_then_resume_is_bit_identical(kill_at, pretrain_reference_run, pretrain_test_config,
                                            pretrain_subprocess, tmp_path):
  """kill -9 mid-step, mid-save, mid-metrics-write or mid-batch-log-write, then the same
  command: fails if the run does not die at that moment (its SIGKILL exit and marker,
  the checkpoints and torn line it leaves), or if the resumed run differs from the
  uninterrupted one in final params, per-step losses, each step's one metrics row or
  its batch log, or leaves orbax's temporary directory behind."""
  workdir = tmp_path / "run"
  process = pretrain_subprocess(pretrain_test_config(), workdir, kill_at=kill_at)
  code = process.wait(timeout=300)
  assert code == -signal.SIGKILL, (f"exit {code}: not killed at {kill_at}\n"
                                   + (tmp_path / "run.log").read_text()[-3000:])
  phase, step = kill_points.parse(kill_at)
  evidence = json.loads(kill_points.marker(workdir).read_text())
  assert (evidence["phase"], evidence["step"]) == (phase, step)
  assert _complete_steps(workdir) == KILL_MOMENTS[kill_at]
  _assert_killed_there(workdir, phase, step, evidence)

  process = pretrain_subprocess(pretrain_test_config(), workdir)
  assert process.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
  _, reference = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  _, resumed = checkpoint.load_params_from_workdir(str(workdir))
  jax.tree.map(np.testing.assert_array_equal, resumed, reference)
  assert step_losses(workdir) == step_losses(pretrain_reference_run)
  # The killed attempt's rows after the resumed step were dropped: each step once, in order.
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == list(range(1, 21))
  # The same batches, each step once; the killed save's temporary directory is gone.
  assert ((workdir / "batch_log.jsonl").read_text()
          == (pretrain_reference_run / "batch_log.jsonl").read_text())
  assert [p.name for p in (workdir / "checkpoints").iterdir() if not p.name.isdigit()] == []


@pytest.mark.slow
def test_init_checkpoint_then_resume_takes_precedence(pretrain_reference_run, pretrain_test_config,
                                                      tmp_path):
  """Order of starts: the workdir's checkpoint, else config.init_checkpoint, else scratch.

  The init checkpoint is another run's workdir, read through bert_jax.convert
  (which calls load_params_from_workdir); HF and TF checkpoints take the same path.
  """
  from bert_jax.pretrain import trainer as pretrain_lib
  config = pretrain_test_config(**{"init_checkpoint": str(pretrain_reference_run),
                                   "total_steps": 1, "checkpoint.every_steps": 1})
  pretrain_lib.train_and_evaluate(config, str(tmp_path))
  # Step 1 trains at learning rate 0 (warmup starts there): the parameters are the
  # init checkpoint's, exactly, heads included.
  _, expected = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  _, params = checkpoint.load_params_from_workdir(str(tmp_path))
  jax.tree.map(np.testing.assert_array_equal, params, expected)
  # A second start resumes from the workdir (nothing left to train) although
  # init_checkpoint is still set: no training step is logged again.
  pretrain_lib.train_and_evaluate(config, str(tmp_path))
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if "loss" in r] == [1]


def _full_disk():
  """In the child: writes past 32 KiB fail with EFBIG, as on a full disk (not a signal).

  It runs between fork and exec, so it only makes two system calls: no imports,
  no locks another thread of the parent might have held.
  """
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 10, 32 << 10))


@pytest.mark.slow
def test_full_disk_fails_at_the_save_and_keeps_earlier_checkpoints(
    pretrain_reference_run, pretrain_test_config, pretrain_subprocess, tmp_path):
  """A save that cannot be written stops the run; the checkpoints before it stay loadable."""
  workdir = tmp_path / "run"
  shutil.copytree(pretrain_reference_run, workdir)  # complete checkpoints up to step 20
  config = pretrain_test_config(total_steps=30)
  process = pretrain_subprocess(config, workdir, preexec_fn=_full_disk, stdout=subprocess.PIPE)
  log = process.communicate(timeout=300)[0].decode()
  (tmp_path / "run.log").write_text(log)  # where the other runs' logs are, for a reader
  assert process.returncode == 1, "the run did not notice that its save failed\n" + log[-3000:]
  # It ends with one line naming the file and the cause, not a flood of tracebacks.
  # (bert_jax.jobs.refuse prints it on stderr as "error: storage error: <path>: <cause>".)
  last = [l for l in log.splitlines() if l.startswith(("ERROR", "E0", "Traceback", "error:"))][-1]
  assert re.match(rf"error: storage error: {re.escape(str(workdir))}/checkpoints/25\S*: "
                  r"File too large$", last), last
  assert log.count("Traceback") == 0 and "Event loop is closed" not in log
  # Nothing from orbax before it (its 4 long ERROR lines of the failed background save
  # show only with BERT_JAX_VERBOSE=1 / --verbose): the one line is all a user reads.
  assert [l for l in log.splitlines() if l.startswith(("ERROR", "E0", "E1"))] == [], log
  assert [l for l in log.splitlines() if "orbax" in l or "[process=" in l] == [last], log
  _, reference = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  _, kept = checkpoint.load_params_from_workdir(str(workdir))  # latest complete: step 20
  jax.tree.map(np.testing.assert_array_equal, kept, reference)
  # With space again, the same command resumes from step 20 and finishes.
  process = pretrain_subprocess(config, workdir)
  assert process.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
  assert max(step_losses(workdir)) == 30
