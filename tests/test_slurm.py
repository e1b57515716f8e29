"""Tests for GPU clusters: experiments/slurm/pretrain.sbatch and config.require_accelerator.

The SLURM template runs under bash with a fake `srun` that starts SLURM_NTASKS
local processes with the environment a real srun gives its tasks (or, told by
FAKE_SRUN_EXIT / FAKE_SRUN_ON_TERM, only exits as they would), and a fake
`scontrol` that logs its argv. Both log JSON lines the tests read back.
"""

import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import time

import pytest

import ports

from bert_jax import exit_codes

REPO = pathlib.Path(__file__).resolve().parent.parent
SBATCH = REPO / "experiments" / "slurm" / "pretrain.sbatch"

FAKE_SRUN = r'''
import json, os, signal, subprocess, sys, time

args = sys.argv[1:]
while args and args[0].startswith("-"):  # srun's own options (all --opt=value here)
  args = args[1:]
n = int(os.environ["SLURM_NTASKS"])
record = {"argv": sys.argv[1:], "job_id": os.environ["SLURM_JOB_ID"]}
if "FAKE_SRUN_EXIT" in os.environ:
  codes = [int(os.environ["FAKE_SRUN_EXIT"])] * n
elif "FAKE_SRUN_ON_TERM" in os.environ:
  # Tasks that run until SIGTERM, save for a moment, then exit with the given status.
  terminated = []
  signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
  open(os.environ["FAKE_SRUN_LOG"] + ".started", "w").close()
  while not terminated:
    time.sleep(0.02)
  time.sleep(0.5)
  codes = [int(os.environ["FAKE_SRUN_ON_TERM"])] * n
else:
  tasks = []
  for i in range(n):
    # What srun sets for task i of a one-node step.
    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NODEID="0",
               SLURM_STEP_ID="0", SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
               SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS=str(n),
               SLURM_STEP_TASKS_PER_NODE=str(n))
    tasks.append(subprocess.Popen(args, env=env))
  signal.signal(signal.SIGTERM, lambda *_: [t.send_signal(signal.SIGTERM) for t in tasks])
  codes = [t.wait() for t in tasks]
record["codes"] = codes
with open(os.environ["FAKE_SRUN_LOG"], "a") as f:
  f.write(json.dumps(record) + "\n")
sys.exit(max(codes))  # srun exits with the highest task exit code
'''

FAKE_SCONTROL = r'''
import json, os, sys
with open(os.environ["FAKE_SCONTROL_LOG"], "a") as f:
  f.write(json.dumps(sys.argv[1:]) + "\n")
'''

# What the template appends to every srun command line.
APPENDED = ["--config.distributed.enabled=True", "--config.require_accelerator=True"]


def _slurm_env(tmp_path: pathlib.Path, job_id: int, **extra: str) -> dict:
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
    (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
    (bin_dir / name).chmod(0o755)
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  # What sbatch gives the batch script of a 1-node, 2-task allocation with the template's
  # --cpus-per-task=8; `python` is this venv's. A lock refusal is requeued without waiting.
  env.update(PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), env["PATH"]]),
             SLURM_JOB_ID=str(job_id), SLURM_NTASKS="2", SLURM_NNODES="1",
             SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost", SLURM_SUBMIT_DIR=str(REPO),
             SLURM_JOB_NAME="bert_jax", SLURM_CPUS_PER_TASK="8", BERT_JAX_LOCK_WAIT_S="0",
             FAKE_SRUN_LOG=str(tmp_path / "srun.jsonl"),
             FAKE_SCONTROL_LOG=str(tmp_path / "scontrol.jsonl"))
  env.update(extra)
  return env


def _jsonl(path: pathlib.Path) -> list:
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _sbatch(env: dict, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", str(SBATCH), *args], env=env, capture_output=True, text=True,
                        timeout=60)


def test_the_templates_exit_codes_are_the_jobs():
  """Fails if the template's PREEMPTED / LOCK_HELD differ from bert_jax/exit_codes.py (a
  renumbered code would no longer be requeued), or if a code line of the template spells a
  status as a bare number instead of by those names."""
  text = SBATCH.read_text()
  names = dict(re.findall(r"^(PREEMPTED|LOCK_HELD)=(\d+)$", text, re.M))
  assert names == {"PREEMPTED": str(exit_codes.PREEMPTED),
                   "LOCK_HELD": str(exit_codes.LOCK_HELD)}
  code = [l for l in text.splitlines() if not l.lstrip().startswith("#")
          and not re.match(r"(PREEMPTED|LOCK_HELD)=", l)]
  assert [l for l in code if re.search(r"status == \d", l)] == []
  assert "bert_jax/exit_codes.py" in text


@pytest.mark.parametrize("srun_exit, restarts, max_requeues, script_exit, requeued", [
    (0, "0", "", 0, False), (1, "0", "", 1, False),
    (143, "0", "", 0, True), (143, "20", "", 143, False),
    # The workdir locked by another live run (exit_codes.LOCK_HELD, 75): requeued, and counted.
    (75, "0", "", 0, True), (75, "19", "", 0, True), (75, "20", "", 75, False),
    (75, "2", "2", 75, False), (143, "1", "2", 0, True)])
def test_sbatch_requeues_a_saved_preemption_and_a_held_lock(tmp_path, srun_exit, restarts,
                                                            max_requeues, script_exit, requeued):
  """Fails if 143 or 75 is not requeued, if anything else is, or if the requeues
  (SLURM_RESTART_COUNT) are not bounded by BERT_JAX_MAX_REQUEUES for both."""
  extra = {"BERT_JAX_MAX_REQUEUES": max_requeues} if max_requeues else {}
  env = _slurm_env(tmp_path, 4242, FAKE_SRUN_EXIT=str(srun_exit), SLURM_RESTART_COUNT=restarts,
                   **extra)
  result = _sbatch(env, "--config=c.py", "--workdir=/w", "--config.x=1")
  assert result.returncode == script_exit, result.stderr
  (srun,) = _jsonl(tmp_path / "srun.jsonl")
  assert srun["argv"] == ["--kill-on-bad-exit=1", "--cpus-per-task=8", "python", "-m",
                          "bert_jax.main", "--config=c.py", "--workdir=/w", "--config.x=1",
                          *APPENDED]
  assert _jsonl(tmp_path / "scontrol.jsonl") == ([["requeue", "4242"]] if requeued else [])
  if srun_exit == 75 and requeued:
    assert "locked by another live run (75); requeueing job 4242 in 0 s" in result.stderr


def test_srun_gets_the_jobs_cpus_per_task(tmp_path):
  """srun of Slurm 22.05-23.02 does not inherit --cpus-per-task: the template must pass the
  allocation's SLURM_CPUS_PER_TASK itself (fails if the flag is missing or not that value),
  and passes nothing when the job was submitted without one."""
  _sbatch(_slurm_env(tmp_path, 1, FAKE_SRUN_EXIT="0", SLURM_CPUS_PER_TASK="12"),
          "--config=c.py", "--workdir=/w")
  (srun,) = _jsonl(tmp_path / "srun.jsonl")
  assert srun["argv"][:3] == ["--kill-on-bad-exit=1", "--cpus-per-task=12", "python"]
  (tmp_path / "srun.jsonl").unlink()
  env = _slurm_env(tmp_path, 1, FAKE_SRUN_EXIT="0")
  del env["SLURM_CPUS_PER_TASK"]
  _sbatch(env, "--config=c.py", "--workdir=/w")
  (srun,) = _jsonl(tmp_path / "srun.jsonl")
  assert srun["argv"][:2] == ["--kill-on-bad-exit=1", "python"]


def test_require_accelerator_is_on_unless_the_arguments_turn_it_off(tmp_path):
  """The template appends --config.require_accelerator=True only when the arguments do not
  set it: appended after theirs it would override a user's False (the last flag wins)."""
  env = _slurm_env(tmp_path, 2, FAKE_SRUN_EXIT="0")
  _sbatch(env, "--config=c.py", "--workdir=/w", "--config.require_accelerator=False")
  (srun,) = _jsonl(tmp_path / "srun.jsonl")
  assert srun["argv"][-2:] == ["--config.require_accelerator=False",
                               "--config.distributed.enabled=True"]
  assert not any(a == "--config.require_accelerator=True" for a in srun["argv"])


def test_sbatch_outlives_sigterm_to_requeue(tmp_path):
  """Preemption signals the whole job: the script must wait for the saving tasks, then requeue."""
  env = _slurm_env(tmp_path, 4243, FAKE_SRUN_ON_TERM="143")
  job = subprocess.Popen(["bash", str(SBATCH), "--config=c.py", "--workdir=/w"], env=env,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
  started = tmp_path / "srun.jsonl.started"
  deadline = time.monotonic() + 30
  while not started.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
  os.killpg(job.pid, signal.SIGTERM)  # the batch shell and srun alike, as SLURM does
  _, stderr = job.communicate(timeout=30)
  assert job.returncode == 0, stderr
  assert "SIGTERM; waiting for the trainer to save" in stderr
  assert _jsonl(tmp_path / "scontrol.jsonl") == [["requeue", "4243"]]


def test_require_accelerator_refuses_cpu_only_jax_before_writing(tmp_path, pretrain_test_config,
                                                                 capsys):
  """JAX here has only CPU devices: a job that requires an accelerator exits 1 with one line
  naming the platform and the install command, and the workdir is never created (fails if
  the check is missing, comes after the workdir is opened, or raises a traceback)."""
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "workdir"
  code = jobs.run(pretrain_test_config(require_accelerator=True), str(workdir))
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 1, err
  assert err[-1].startswith("error: config.require_accelerator=True but JAX "), err
  assert "found only cpu devices" in err[-1] and "pip install -e '.[gpu]'" in err[-1], err
  assert not any("Traceback" in line for line in err), err
  assert not workdir.exists()


def test_a_run_started_without_require_accelerator_resumes_under_the_template():
  """A workdir made by a CPU run (require_accelerator False, or a record from before the
  field existed) must resume under the SLURM template, which turns it on: fails if the
  workdir's record check counts the field as a change to the run."""
  from bert_jax.run import workdir  # pylint: disable=g-import-not-at-top

  def record(**config):
    return {"config": {"total_steps": 10, "model_size": "base", **config}, "bert_config": {},
            "data": {}, "vocab_sha256": None, "spm_sha256": None}
  resumed = record(require_accelerator=True)
  assert workdir.differences(record(require_accelerator=False), resumed) == []
  assert workdir.differences(record(), resumed) == []
  # ...while a field that changes the run is still refused.
  assert workdir.differences(record(require_accelerator=False),
                             record(require_accelerator=True, model_size="large")) != []


def _free_slurm_job_id() -> tuple[int, int]:
  """A job id whose JAX coordinator port (61440 + id % 4096, slurm_cluster.py) is free here.

  That port is fixed by the job id, not picked by the OS, so the test picks the
  id: one whose port nothing on this machine is bound to at the moment.
  """
  start = random.randrange(4096)
  for k in range(4096):
    job_id = 900_000 + (start + k) % 4096
    port = 61440 + job_id % 4096
    if ports.bindable(port) and ports.claim(port):  # no other test of the run gets it
      return job_id, port
  raise RuntimeError("no free port in 61440-65535")


@pytest.mark.slow
def test_sbatch_runs_a_two_process_pretraining(tmp_path, pretrain_test_config):
  """Fails if the sbatch's 2-task pretraining (config file plus --config flags) does not exit 0 on
  both tasks, jax.distributed does not join both on the job id's port, the last checkpoint is not
  the flag's step 4, or the job asks scontrol for anything."""
  config = pretrain_test_config(**{"total_steps": 20, "checkpoint.every_steps": 10})
  config_file = tmp_path / "tiny_test_config.py"
  config_file.write_text("import json\nimport ml_collections\n\n\ndef get_config():\n"
                         f"  return ml_collections.ConfigDict(json.loads({config.to_json()!r}))\n")
  workdir = tmp_path / "workdir"
  job_id, port = _free_slurm_job_id()
  env = _slurm_env(tmp_path, job_id, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
                   XLA_FLAGS="--xla_force_host_platform_device_count=1")
  with open(tmp_path / "job.out", "w") as out:
    # Both ways of passing fields: the config file, and --config.X flags through the script.
    # This test runs on CPUs, so it turns off the template's require_accelerator.
    result = subprocess.run(["bash", str(SBATCH), f"--config={config_file}", f"--workdir={workdir}",
                             "--config.total_steps=4", "--config.checkpoint.every_steps=2",
                             "--config.require_accelerator=False"],
                            env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600)
  output = (tmp_path / "job.out").read_text()
  (srun,) = _jsonl(tmp_path / "srun.jsonl")
  assert (srun["codes"], result.returncode) == ([0, 0], 0), output[-4000:]
  # jax.distributed found the 2-process cluster in SLURM's environment alone.
  assert output.count("over 2 devices (2 processes)") == 2, output[-4000:]
  # ... on the port it derives from the job id, which the sbatch documents.
  assert output.count(f"Connecting to JAX distributed service on localhost:{port}") == 2, output
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert steps[-1] == 4, steps
  assert _jsonl(tmp_path / "scontrol.jsonl") == []
