"""What runs on a launched worker, and the launcher's judgement, without gcloud: the start
script that never starts a second job, the install's Python environment, the job's record
(bert_jax.run.job_state) and the Judge that needs a lasting loss. The gcloud sequences are
tests/test_launch.py's.
"""

import json
import os
import shlex
import shutil
import signal
import subprocess
import time

import pytest


def test_the_start_script_never_starts_a_second_job(tmp_path):
  """Run on a "worker" twice while the first job lives: the second run adopts it."""
  from bert_jax.launch import plan as launch_plan
  (tmp_path / "bert_jax").mkdir()
  (tmp_path / "bert_jax_venv" / "bin").mkdir(parents=True)
  job = tmp_path / "bert_jax_venv" / "bin" / "python"
  job.write_text("#!/bin/sh\necho \"job $BERT_JAX_JOB_ID $BERT_JAX_JOB_ATTEMPT\"\nsleep 30\n")
  job.chmod(0o755)
  env = dict(os.environ, HOME=str(tmp_path))
  first = subprocess.run(["bash", "-c", launch_plan.start_script("tpu:p/z/n", 11, ["--x"])],
                         env=env, capture_output=True, text=True, timeout=30)
  second = subprocess.run(["bash", "-c", launch_plan.start_script("tpu:p/z/n", 12, ["--x"])],
                          env=env, capture_output=True, text=True, timeout=30)
  pid = int((tmp_path / "bert_jax_job.pid").read_text().split()[0])
  try:
    assert first.stdout.startswith("bert_jax job started: ") and first.stdout.endswith(" 11\n")
    assert second.stdout == f"bert_jax job already running: {pid} 11\n"
    # The job is in a session of its own: what ends the ssh's session does not reach it.
    assert os.getsid(pid) == pid != os.getsid(0)
    time.sleep(0.3)
    assert "job tpu:p/z/n 11" in (tmp_path / "bert_jax_job.log").read_text()
  finally:
    os.kill(pid, signal.SIGKILL)


@pytest.mark.slow  # creating a venv (ensurepip) takes seconds of CPU
def test_the_install_makes_and_uses_a_python_3_11_environment(tmp_path):
  """The environment part of the worker's install, run here; and every python the job uses
  is that environment's (never the image's python3 3.10)."""
  from bert_jax.launch import plan as launch_plan
  script = launch_plan.install_script()
  assert "python3.11 -m venv --clear $HOME/bert_jax_venv" in script
  assert "apt-get -o DPkg::Lock::Timeout=600 install -y -qq python3.11 python3.11-venv" in script
  assert script.index("-m venv") < script.index("pip install --quiet '.[tpu]'")
  assert "$HOME/bert_jax_venv/bin/python -m pip install --quiet '.[tpu]'" in script
  assert "print(socket.gethostname(), \"python\", sys.version.split()[0], \"jax\", " \
      "jax.__version__, jax.devices())" in script
  assert "python3 " not in script and " python3 -m" not in launch_plan.start_script("j", 1, [])
  assert ("setsid nohup $HOME/bert_jax_venv/bin/python -c "
          f"{shlex.quote(launch_plan.run_and_record_line())} bert_jax.main") in (
      launch_plan.start_script("j", 1, launch_plan.main_args("c.py", "gs://b/w", [])))
  python311 = shutil.which("python3.11")
  assert python311, "the dev environment has python3.11"
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  (bin_dir / "python3.11").symlink_to(python311)
  # A sudo that fails: with python3.11 present, apt must not be needed.
  (bin_dir / "sudo").write_text("#!/bin/sh\necho sudo called >&2\nexit 1\n")
  (bin_dir / "sudo").chmod(0o755)
  env = dict(os.environ, HOME=str(tmp_path), PATH=f"{bin_dir}:/usr/bin:/bin")
  env.pop("VIRTUAL_ENV", None)
  result = subprocess.run(["bash", "-c", launch_plan.python_env_script()], env=env,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  version = subprocess.run([str(tmp_path / "bert_jax_venv" / "bin" / "python"), "-c",
                            "import sys; print(sys.version_info[:2] >= (3, 11), sys.prefix)"],
                           capture_output=True, text=True, check=True).stdout.split()
  assert version == ["True", str(tmp_path / "bert_jax_venv")]


# --- the job's record (bert_jax.run.job_state) ---


def test_job_state_records_running_then_the_final_state(tmp_path, monkeypatch):
  """Fails if a tracked job wrote nothing, wrote without a launcher, or a refused second start
  overwrote a live attempt's record."""
  from bert_jax.run import job_state
  from bert_jax import jobs
  assert jobs.run.__wrapped__  # bert_jax.jobs.run is the tracked function
  config = type("C", (), {"distributed": type("D", (), {"enabled": False})()})()
  monkeypatch.setattr(job_state, "HEARTBEAT_S", 0.05)
  seen = []

  def job(code):
    def run(config, workdir):
      time.sleep(0.3)
      seen.append(job_state.read(workdir))
      return code
    return job_state.tracked(run)

  monkeypatch.delenv("BERT_JAX_JOB_ID", raising=False)
  assert job(0)(config, str(tmp_path / "untracked")) == 0
  assert not (tmp_path / "untracked").exists()
  monkeypatch.setenv("BERT_JAX_JOB_ID", "tpu:p/z/n")
  monkeypatch.setenv("BERT_JAX_JOB_ATTEMPT", "7")
  for code, state in ((0, "done"), (143, "preempted"), (1, "failed")):
    assert job(code)(config, str(tmp_path / state)) == code
    running, final = seen[-1], job_state.read(str(tmp_path / state))
    assert (running["state"], running["attempt"], running["job_id"]) == ("running", 7, "tpu:p/z/n")
    assert time.time() - running["time"] < 0.2  # the heartbeat keeps it fresh
    assert (final["state"], final["exit_code"], final["pid"]) == (state, code, os.getpid())
  # Another attempt's live record is not overwritten by a start that failed (the lock refused it).
  live = tmp_path / "live"
  live.mkdir()
  record = {"state": "running", "attempt": 6, "job_id": "tpu:p/z/n", "time": time.time()}
  (live / "job_state.json").write_text(json.dumps(record))
  monkeypatch.setattr(job_state, "HEARTBEAT_S", 60.0)

  def refused(config, workdir):
    return 1
  with monkeypatch.context() as m:
    m.setattr(job_state.Tracker, "start", lambda self: None)
    assert job_state.tracked(refused)(config, str(live)) == 1
  assert json.loads((live / "job_state.json").read_text()) == record


def test_the_judge_needs_a_lasting_loss():
  """Fails if the Judge acts on a loss (SUSPENDED slice, job not started in time) seen once or for
  less than its 10 s window, a recovery does not reset that window, another attempt's record counts
  for the watched one, or a done record is not DONE."""
  from bert_jax.launch import state as launch_state
  judge = launch_state.Judge(window_s=10, stale_after_s=100, start_timeout_s=50)
  judge.watch(3, started=0.0)
  running = {"state": "running", "attempt": 3, "time": 0.0}
  look = lambda state, job, t: judge.verdict(launch_state.Observation(state, job, t))
  assert look("ACTIVE", None, 1) == launch_state.STARTING
  assert look("ACTIVE", running, 2) == launch_state.RUNNING
  assert look("SUSPENDED", running, 3) == launch_state.WAIT  # one read
  assert look("SUSPENDED", running, 9) == launch_state.WAIT  # inside the window
  assert look("ACTIVE", dict(running, time=10), 10) == launch_state.RUNNING  # it recovered
  assert look("SUSPENDED", running, 20) == launch_state.WAIT
  assert look("SUSPENDED", running, 31) == launch_state.RECREATE
  judge.watch(4, started=40.0)
  old = dict(running, state="preempted")  # attempt 3's record says nothing about attempt 4
  assert look("ACTIVE", old, 41) == launch_state.STARTING
  assert look("ACTIVE", None, 91) == launch_state.WAIT  # never started
  assert look("ACTIVE", None, 102) == launch_state.RESTART
  assert look("ACTIVE", {"state": "done", "attempt": 4}, 103) == launch_state.DONE


def test_a_multi_process_record_asks_jax_only_once_the_cluster_is_joined(tmp_path, monkeypatch):
  """Fails if a distributed job's heartbeat asks JAX which process it is before the job has
  joined its cluster, even while jax.distributed.is_initialized() already says True (it does
  as soon as the client exists, before it connects: a backend started in that gap aborted a
  2-process CI run), or does not ask once told the cluster is joined."""
  import threading
  import jax
  from bert_jax.run import job_state
  monkeypatch.setattr(job_state, "_JOINED", threading.Event())
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  asked = []
  monkeypatch.setattr(jax, "process_index", lambda: asked.append(True) or 0)
  tracker = job_state.Tracker(str(tmp_path), distributed=True, job_id="tpu:p/z/n", attempt=1)
  assert tracker._process_zero() is None and not asked
  job_state.cluster_joined()
  assert tracker._process_zero() is True and asked == [True]


def test_joining_the_cluster_tells_the_job_record(monkeypatch, pretrain_test_config):
  """Fails if setup_mesh does not tell the job's record that the cluster is joined once
  jax.distributed.initialize has returned (or tells it before)."""
  import threading
  import jax
  from bert_jax.run import job_state
  from bert_jax.training import state
  monkeypatch.setattr(job_state, "_JOINED", threading.Event())
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  told_before = []
  monkeypatch.setattr(jax.distributed, "initialize",
                      lambda **kwargs: told_before.append(job_state._JOINED.is_set()))
  config = pretrain_test_config()
  config.distributed.update(enabled=True, coordinator_address="localhost:1", num_processes=1,
                            process_id=0)
  state.setup_mesh(config)
  assert told_before == [False] and job_state._JOINED.is_set()
