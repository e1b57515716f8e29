"""Multi-host runs on one machine: 2 processes x 2 CPU devices joined by jax.distributed.

Each process reads its own part of the corpus, so each has its own pipeline
position; a checkpoint must give every process its own back. Tested here on the
real pipeline: a kill -9 of both processes and a restart ends bit-identical to
the uninterrupted run; a SIGTERM to one process stops both at the same saved
step (exit 143) and the same command resumes; a Ctrl-C to one process stops
both at one saved step (exit 130 on both); another process count is refused; a workdir lock
taken over by a later attempt of the job stops both processes at one step,
saving nothing.
"""

import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import time

import jax
import numpy as np
import pytest

import ports

from bert_jax import exit_codes
from bert_jax.run import checkpoint
from bert_jax.run import lock as workdir_lock



def _losses(run) -> dict[int, float]:
  path = pathlib.Path(run) / "metrics.jsonl"
  rows = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


def _start_pair(pretrain_subprocess, config, run, name, env=None):
  """Both processes of a 2-host run (2 CPU devices each) on a fresh coordinator port."""
  port, processes = ports.free_port(), []
  for i in range(2):
    config.distributed.update(enabled=True, coordinator_address=f"localhost:{port}",
                              num_processes=2, process_id=i)
    processes.append(pretrain_subprocess(config, run, devices=2, name=f"{name}_{i}", env=env))
  return processes


def _log(tmp_path, name, i) -> str:
  return (tmp_path / f"{name}_{i}.log").read_text()[-3000:]


# Long enough that a stop requested after step 4 is agreed on well before the end: the
# hosts agree on a step through the coordination service, which on loaded CI cores took
# 8 steps once (of milliseconds each), reaching the last step of a 12-step run.
STEPS = 40


@pytest.fixture(scope="module")
def multihost_config(pretrain_test_config):
  return lambda: pretrain_test_config(total_steps=STEPS, **{"checkpoint.every_steps": 3})


@pytest.fixture(scope="module")
def uninterrupted(multihost_config, pretrain_subprocess, tmp_path_factory):
  """An uninterrupted 2-process run of STEPS steps on the real pipeline."""
  tmp_path = tmp_path_factory.mktemp("multihost_reference")
  processes = _start_pair(pretrain_subprocess, multihost_config(), tmp_path / "run", "ref")
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == 0, _log(tmp_path, "ref", i)
  return tmp_path / "run"


def _assert_same_run(run, reference):
  assert _losses(run) == _losses(reference)
  _, params = checkpoint.load_params_from_workdir(str(run))
  _, expected = checkpoint.load_params_from_workdir(str(reference))
  jax.tree.map(np.testing.assert_array_equal, params, expected)


@pytest.mark.slow
def test_both_processes_killed_then_restarted_end_bit_identical(
    uninterrupted, multihost_config, pretrain_subprocess, tmp_path):
  """Fails if a 2-process run killed after step 3 and restarted ends with other losses or weights
  than the uninterrupted run, its final checkpoint does not hold two distinct process positions, or
  a 1-process resume is not refused (exit 1) saying to resume with 2."""
  run = tmp_path / "run"
  processes = _start_pair(pretrain_subprocess, multihost_config(), run, "killed")
  deadline = time.time() + 600
  while not (run / "checkpoints" / "3").exists():
    for i, p in enumerate(processes):
      assert p.poll() is None, _log(tmp_path, "killed", i)
    assert time.time() < deadline
    time.sleep(0.01)
  for p in processes:  # a slice that loses power: both at once, wherever they are
    p.send_signal(signal.SIGKILL)
  for p in processes:
    p.wait()
  assert not (run / "checkpoints" / str(STEPS)).exists(), "finished before the kill"
  processes = _start_pair(pretrain_subprocess, multihost_config(), run, "resumed")
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == 0, _log(tmp_path, "resumed", i)
  saved = json.loads((run / "checkpoints" / str(STEPS) / "data_state" / "metadata").read_text())
  assert saved["process_count"] == 2
  assert saved["processes"][0] != saved["processes"][1]  # each host has its own position
  _assert_same_run(run, uninterrupted)

  # Resuming with another number of processes is refused, naming what to do.
  config = multihost_config()
  config.total_steps = STEPS + 3
  single = pretrain_subprocess(config, run, name="single")
  assert single.wait(timeout=600) == 1
  assert re.search(r"the checkpoint was written by 2 processes and this run has 1: .* Resume "
                   r"with 2 processes, or start a new workdir",
                   (tmp_path / "single.log").read_text())


def _stop_one_host_and_resume(uninterrupted, multihost_config, pretrain_subprocess, tmp_path,
                              name, host, signum, exit_code, saved_pattern, resume=True):
  """Starts the 2-process run, sends `signum` to process `host` alone after step 4, and
  checks both exit `exit_code` at the same saved step (`saved_pattern` in each log), then
  (with `resume`) that the same command resumes to the uninterrupted run's results, bit
  for bit."""
  run = tmp_path / "run"
  processes = _start_pair(pretrain_subprocess, multihost_config(), run, name)
  deadline = time.time() + 600
  while max(_losses(run), default=0) < 4:
    for i, p in enumerate(processes):
      assert p.poll() is None, _log(tmp_path, name, i)
    assert time.time() < deadline
    time.sleep(0.01)
  processes[host].send_signal(signum)  # the signal reaches one host only
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == exit_code, _log(tmp_path, name, i)
  # Both stopped at the same step (the preemption sync point), and it was saved.
  stopped = [re.search(saved_pattern, (tmp_path / f"{name}_{i}.log").read_text())
             for i in range(2)]
  assert all(stopped) and stopped[0].group(1) == stopped[1].group(1)
  step = int(stopped[0].group(1))
  assert 4 <= step < STEPS and (run / "checkpoints" / str(step)).exists()
  if not resume:
    return
  processes = _start_pair(pretrain_subprocess, multihost_config(), run, "relaunched")
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == 0, _log(tmp_path, "relaunched", i)
  _assert_same_run(run, uninterrupted)


@pytest.mark.slow
def test_sigterm_to_one_process_stops_both_at_one_saved_step_and_resumes(
    uninterrupted, multihost_config, pretrain_subprocess, tmp_path):
  """Fails if a preemption notice (SIGTERM) to process 1 alone does not stop both processes
  at the same saved step with exit 143, or if the relaunch does not end bit-identical."""
  _stop_one_host_and_resume(uninterrupted, multihost_config, pretrain_subprocess, tmp_path,
                            "preempted", 1, signal.SIGTERM, exit_codes.PREEMPTED,
                            r"preempted \(SIGTERM\): saved step (\d+);")


@pytest.mark.slow
def test_ctrl_c_to_one_process_stops_both_at_one_saved_step_and_resumes(
    uninterrupted, multihost_config, pretrain_subprocess, tmp_path):
  """Fails if a SIGINT to process 0 alone (a Ctrl-C in the terminal of one host) does not
  stop both processes at the same saved step with exit 130 (process 1 would hang in its
  next collective, or exit 143). The resume from that step's checkpoint is the SIGTERM
  test's: a stop saves the same checkpoint whichever signal asked for it."""
  _stop_one_host_and_resume(uninterrupted, multihost_config, pretrain_subprocess, tmp_path,
                            "interrupted", 0, signal.SIGINT, exit_codes.INTERRUPTED,
                            r"interrupted \(Ctrl-C\): saved step (\d+);", resume=False)


def _files(root: pathlib.Path) -> dict[str, str]:
  """Every file under `root` -> the SHA-256 of its content."""
  return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(root.rglob("*")) if p.is_file()}


def _untouchable(run: pathlib.Path) -> dict:
  """What a run that lost its lock must not change: the checkpoints, the job record, the
  lock, and the batch logs (flushed only at saves)."""
  return {"checkpoints": _files(run / "checkpoints"),
          "record": (run / "job_state.json").read_text(),
          "lock": (run / ".lock").read_text(),
          "batch logs": {p.name: p.read_text() for p in run.glob("batch_log*.jsonl")}}


@pytest.mark.slow
def test_a_lock_taken_by_a_later_attempt_stops_both_processes_and_saves_nothing(
    pretrain_test_config, pretrain_subprocess, tmp_path):
  """A 2-process run (attempt 1 of a launcher job) is paused (a stalled slice) while attempt 2
  takes its workdir lock and writes its own checkpoint and record; then it runs on.

  Fails if either process keeps training past the next few steps or hangs (process 1 used
  to wait in the next collective once process 0 alone had stopped), if the two stop at
  different steps, or if the old attempt saves a checkpoint, flushes a batch log or touches
  any file of the new holder's checkpoints, record or lock.
  """
  every = 50  # regular saves; the stop must come from the loss, well before the next one
  config = pretrain_test_config(total_steps=400, **{"checkpoint.every_steps": every})
  run, job = tmp_path / "run", "tpu:p/z/bert-lock"
  env = {"BERT_JAX_JOB_ID": job, "BERT_JAX_JOB_ATTEMPT": "1", "TEST_LOCK_HEARTBEAT_S": "0.5"}
  processes = _start_pair(pretrain_subprocess, config, run, "loser", env=env)
  checkpoints = run / "checkpoints"
  thief = workdir_lock.Lock(str(run), heartbeat_s=3600, job={"id": job, "attempt": 2})
  try:
    deadline = time.time() + 600
    while not (checkpoints / str(every)).exists():
      for i, p in enumerate(processes):
        assert p.poll() is None, _log(tmp_path, "loser", i)
      assert time.time() < deadline
      time.sleep(0.005)
    # Paused between saves (no orbax temporary directory): nothing of the old attempt is
    # in flight while the new one takes over.
    for _ in range(200):
      for p in processes:
        p.send_signal(signal.SIGSTOP)
      if not [d for d in checkpoints.iterdir() if "tmp" in d.name]:
        break
      for p in processes:
        p.send_signal(signal.SIGCONT)
      time.sleep(0.005)
    paused_at = max(_losses(run))
    thief.acquire()  # a later attempt of the same job: taken over at once
    newest = max(int(d.name) for d in checkpoints.iterdir() if d.name.isdigit())
    shutil.copytree(checkpoints / str(newest), checkpoints / str(newest + 1000))
    (run / "job_state.json").write_text(json.dumps(
        {"state": "running", "job_id": job, "attempt": 2, "time": time.time(), "host": "h"}))
    before = _untouchable(run)
    time.sleep(1.0)  # two heartbeats while paused: the holder's next one finds the lock taken
    for p in processes:
      p.send_signal(signal.SIGCONT)
    resumed = time.monotonic()
    codes = [p.wait(timeout=300) for p in processes]
    stopped_s = time.monotonic() - resumed
    after = _untouchable(run)
  finally:
    for p in processes:
      if p.poll() is None:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()
    thief.release()
  logs = [(tmp_path / f"loser_{i}.log").read_text() for i in range(2)]
  assert codes == [1, 1], logs[0][-3000:] + logs[1][-3000:]
  lost_to = (f"lost the workdir lock {run}/.lock to host {socket.gethostname()} pid "
             f"{os.getpid()} (job {job} attempt 2); stopped without saving")
  at = [re.search(r"^error: step (\d+): (.*)$", log, re.M) for log in logs]
  assert all(at), [log[-2000:] for log in logs]
  assert at[0].group(2).startswith(lost_to), at[0].group(0)
  assert at[1].group(2).startswith("process 0 lost the workdir lock to another run"), at[1].group(0)
  step = int(at[0].group(1))
  assert int(at[1].group(1)) == step  # one agreed step
  assert paused_at < step < (paused_at // every + 1) * every, (paused_at, step)
  print(f"paused after step {paused_at}; both stopped at step {step}, "
        f"{stopped_s:.1f} s after resuming (exit included)")
  assert after == before
  assert json.loads(after["lock"])["token"] == thief.token
