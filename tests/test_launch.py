"""Tests for the launchers: bert_jax.launch (Cloud TPU) and experiments/slurm/pretrain.sbatch.

The TPU launcher runs as `python -m bert_jax.launch` against a fake `gcloud`
put first on PATH: it appends its argv as a JSON line to a log, keeps the
queued resource's states in a file (create queues FAKE_GCLOUD_PROVISION,
describe reports and pops them, delete leaves DELETING then nothing) and is
told by environment variables to fail a step (FAKE_GCLOUD_FAIL) or to have
the run preempted (FAKE_GCLOUD_PREEMPT: `exit` = each worker's first run exits
143, `suspend` = the first run loses its ssh (255) as the slice turns
SUSPENDED, `always` = every run exits 143).

The SLURM template runs under bash with a fake `srun` that starts SLURM_NTASKS
local processes with the environment a real srun gives its tasks.
"""

import json
import os
import pathlib
import random
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SBATCH = REPO / "experiments" / "slurm" / "pretrain.sbatch"

FAKE_GCLOUD = r'''
import json, os, sys

args = sys.argv[1:]
state_file = os.path.join(os.environ["FAKE_GCLOUD_DIR"], "states.json")
with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
  f.write(json.dumps(["gcloud"] + args) + "\n")


def kind():
  if args[:3] == ["compute", "tpus", "queued-resources"]:
    return args[3]
  if args[:4] == ["compute", "tpus", "tpu-vm", "scp"]:
    return "upload"
  command = next(a for a in args if a.startswith("--command="))
  return "install" if "pip install" in command else "run"


def states():
  if not os.path.exists(state_file):
    return []
  with open(state_file) as f:
    return json.load(f)


def save(new):
  with open(state_file + ".tmp", "w") as f:
    json.dump(new, f)
  os.replace(state_file + ".tmp", state_file)


def exists():
  return bool(states()) and states()[0] is not None


def not_found():
  print(f"ERROR: (gcloud.compute.tpus.queued-resources.{kind()}) NOT_FOUND: "
        "Requested entity was not found.", file=sys.stderr)
  sys.exit(1)


step = kind()
if step == os.environ.get("FAKE_GCLOUD_FAIL"):
  print("some progress output")
  print(f"ERROR: (gcloud.fake.{step}) {os.environ['FAKE_GCLOUD_FAIL_MESSAGE']}", file=sys.stderr)
  sys.exit(1)
if step == "describe":
  if not exists():
    not_found()
  print(states()[0])
  if len(states()) > 1:
    save(states()[1:])
elif step == "create":
  if exists():
    print("ERROR: ALREADY_EXISTS", file=sys.stderr)
    sys.exit(1)
  save(os.environ.get("FAKE_GCLOUD_PROVISION", "ACTIVE").split(","))
elif step == "delete":
  if not exists():
    not_found()
  save(["DELETING", None])
elif step == "run":
  worker = int(next(a for a in args if a.startswith("--worker=")).split("=")[1])
  mode = os.environ.get("FAKE_GCLOUD_PREEMPT", "")
  print(f"hello from worker {worker}", flush=True)
  print(f"a warning on stderr from worker {worker}", file=sys.stderr, flush=True)
  marker = os.path.join(os.environ["FAKE_GCLOUD_DIR"], f"preempted_{worker}")
  if mode == "always" or (mode in ("exit", "suspend") and not os.path.exists(marker)):
    open(marker, "w").close()
    if mode == "suspend":
      if worker == 0:
        save(["SUSPENDED"])
      print("Connection closed by remote host.", file=sys.stderr)
      sys.exit(255)
    print("SIGTERM: saved step 3, exiting", flush=True)
    sys.exit(143)
  print(f"worker {worker} finished", flush=True)
'''

NAME = "bert-test"
WHERE = ["--project=proj", "--zone=us-central2-b"]
QR = ["gcloud", "compute", "tpus", "queued-resources"]
VM = ["gcloud", "compute", "tpus", "tpu-vm"]
DESCRIBE = QR + ["describe", NAME] + WHERE + ["--format=value(state.state)"]
CREATE = QR + ["create", NAME, f"--node-id={NAME}"] + WHERE + [
    "--accelerator-type=v4-32", "--runtime-version=tpu-ubuntu2204-base"]
INSTALL = VM + ["ssh", NAME, "--worker=all"] + WHERE + [
    "--command=rm -rf bert_jax && mv bert_jax_upload bert_jax && cd bert_jax && "
    "python3 -m pip install --quiet --upgrade pip && python3 -m pip install --quiet -e '.[tpu]'"]
DELETE = QR + ["delete", NAME] + WHERE + ["--force", "--async", "--quiet"]
MAIN = ("--command=cd bert_jax && python3 -m bert_jax.main"
        " --config=experiments/configs/pretrain.py:base --workdir=gs://bucket/run1"
        " --config.distributed.enabled=True --config.total_steps=7"
        " '--config.data.corpus=gs://bucket/text/*.txt'")


def run_command(worker: int) -> list[str]:
  return VM + ["ssh", NAME, f"--worker={worker}"] + WHERE + [
      "--ssh-flag=-oServerAliveInterval=30", "--ssh-flag=-oServerAliveCountMax=4", MAIN]


class FakeGcloud:
  """The fake gcloud's directory, log and environment for one test."""

  def __init__(self, root: pathlib.Path):
    self.root, self.log = root, root / "gcloud_log.jsonl"
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "gcloud"
    script.write_text(f"#!{sys.executable}\n{FAKE_GCLOUD}")
    script.chmod(0o755)
    self.logdir = root / "logs"
    self.upload = f"{self.logdir}/staging/bert_jax_upload"
    self.env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    FAKE_GCLOUD_DIR=str(root), FAKE_GCLOUD_LOG=str(self.log))

  def launch(self, *flags: str, accelerator_type: str = "v4-32", **env: str):
    """Runs `python -m bert_jax.launch` with the standard flags plus `flags`."""
    argv = [sys.executable, "-m", "bert_jax.launch", f"--name={NAME}", "--project=proj",
            "--zone=us-central2-b", f"--accelerator_type={accelerator_type}",
            "--config=experiments/configs/pretrain.py:base", "--workdir=gs://bucket/run1",
            "--poll_s=0", f"--logdir={self.logdir}", "--config.total_steps=7",
            "--config.data.corpus=gs://bucket/text/*.txt", *flags]
    return subprocess.run(argv, cwd=REPO, env={**self.env, **env}, capture_output=True,
                          text=True, timeout=120)

  def commands(self) -> list[list[str]]:
    """The logged commands, each batch of parallel per-worker runs sorted by worker."""
    commands = [json.loads(line) for line in self.log.read_text().splitlines()]
    ordered, batch = [], []
    for command in commands + [None]:
      if command is not None and any(a.startswith("--command=cd bert_jax") for a in command):
        batch.append(command)
        continue
      ordered += sorted(batch, key=lambda c: next(a for a in c if a.startswith("--worker=")))
      batch = []
      if command is not None:
        ordered.append(command)
    return ordered

  def upload_command(self) -> list[str]:
    return VM + ["scp", "--recurse", self.upload, f"{NAME}:", "--worker=all"] + WHERE


@pytest.fixture
def gcloud(tmp_path) -> FakeGcloud:
  return FakeGcloud(tmp_path)


def _error_line(result) -> str:
  return result.stderr.strip().splitlines()[-1]


def test_workers_per_accelerator_type():
  from bert_jax import launch_plan
  expected = {"v2-8": 1, "v2-32": 4, "v3-8": 1, "v3-128": 16, "v4-8": 1, "v4-32": 4,
              "v4-4096": 512, "v5litepod-1": 1, "v5litepod-8": 1, "v5litepod-16": 4,
              "v5e-256": 64, "v5p-8": 1, "v5p-128": 16, "v6e-4": 1, "v6e-8": 1, "v6e-16": 4,
              "v6e-256": 64}
  assert {t: launch_plan.num_workers(t) for t in expected} == expected
  with pytest.raises(ValueError, match="unknown accelerator type 'v9-8'.*--num_workers"):
    launch_plan.num_workers("v9-8")
  with pytest.raises(ValueError, match="--num_workers"):
    launch_plan.num_workers("tpu-32")


def test_run_on_v4_32_creates_installs_runs_every_worker_and_deletes(gcloud):
  result = gcloud.launch(FAKE_GCLOUD_PROVISION="WAITING_FOR_RESOURCES,ACTIVE")
  assert result.returncode == 0, result.stderr
  assert gcloud.commands() == (
      [DESCRIBE, CREATE, DESCRIBE, DESCRIBE, gcloud.upload_command(), INSTALL]
      + [run_command(w) for w in range(4)] + [DELETE])
  # What was uploaded is an installable tree, without the local build litter.
  upload = pathlib.Path(gcloud.upload)
  assert (upload / "setup.cfg").read_text() == (REPO / "setup.cfg").read_text()
  assert (upload / "bert_jax" / "launch.py").is_file()
  assert not list(upload.rglob("__pycache__")) and not (upload / "tests").exists()
  for w in range(4):
    log = (gcloud.logdir / f"worker_{w}.log").read_text().splitlines()
    # stdout and stderr of the worker, prefixed, in the log and on the terminal.
    for line in (f"[worker {w}] hello from worker {w}",
                 f"[worker {w}] a warning on stderr from worker {w}",
                 f"[worker {w}] worker {w} finished"):
      assert line in log
      assert line in result.stdout.splitlines()
    others = [f"from worker {other}" for other in range(4) if other != w]
    assert not any(other in line for line in log for other in others)


def test_dry_run_prints_the_real_sequence_and_runs_nothing(gcloud):
  dry = gcloud.launch("--dry_run")
  assert dry.returncode == 0, dry.stderr
  assert not gcloud.log.exists()
  printed = [shlex.split(line) for line in dry.stdout.splitlines()]
  real = gcloud.launch()
  assert real.returncode == 0, real.stderr
  assert printed == gcloud.commands()
  assert len(printed) == 10 and printed[0] == DESCRIBE and printed[-1] == DELETE


def test_failed_create_names_the_step_and_gcloud_error(gcloud):
  result = gcloud.launch(FAKE_GCLOUD_FAIL="create",
                         FAKE_GCLOUD_FAIL_MESSAGE="RESOURCE_EXHAUSTED: Quota TPUV4_POD exceeded.")
  assert result.returncode == 1
  assert _error_line(result) == (
      "error: launch failed at step 'create': gcloud exited 1: "
      "ERROR: (gcloud.fake.create) RESOURCE_EXHAUSTED: Quota TPUV4_POD exceeded.")
  # Nothing was created, so nothing is uploaded, run or deleted.
  assert gcloud.commands() == [DESCRIBE, CREATE]


def test_failed_install_names_the_step_and_deletes_the_slice(gcloud):
  result = gcloud.launch(FAKE_GCLOUD_FAIL="install",
                         FAKE_GCLOUD_FAIL_MESSAGE="No matching distribution found for libtpu")
  assert result.returncode == 1
  assert _error_line(result) == (
      "error: launch failed at step 'install': gcloud exited 1: "
      "ERROR: (gcloud.fake.install) No matching distribution found for libtpu")
  assert gcloud.commands() == [DESCRIBE, CREATE, DESCRIBE, gcloud.upload_command(), INSTALL, DELETE]


def test_failing_worker_stops_without_relaunch(gcloud):
  result = gcloud.launch(FAKE_GCLOUD_FAIL="run", FAKE_GCLOUD_FAIL_MESSAGE="ValueError: boom")
  assert result.returncode == 1
  line = _error_line(result)
  assert line.startswith("error: launch failed at step 'run': worker 0 exited 1 "
                         "(exit codes [1, 1, 1, 1], slice ACTIVE)"), line
  assert line.endswith("ValueError: boom"), line
  kinds = [c[4] for c in gcloud.commands()]
  assert kinds.count("create") == 1 and gcloud.commands()[-1] == DELETE


def test_worker_exit_143_relaunches_the_identical_command(gcloud):
  result = gcloud.launch(FAKE_GCLOUD_PREEMPT="exit")
  assert result.returncode == 0, result.stderr
  runs = [run_command(w) for w in range(4)]
  relaunch = [DESCRIBE, DELETE, DESCRIBE, DESCRIBE, CREATE, DESCRIBE]
  assert gcloud.commands() == (
      [DESCRIBE, CREATE, DESCRIBE, gcloud.upload_command(), INSTALL] + runs + [DESCRIBE]
      + relaunch + [gcloud.upload_command(), INSTALL] + runs + [DELETE])
  assert "relaunch 1 of at most 10" in result.stdout
  log = (gcloud.logdir / "worker_2.log").read_text()
  assert log.index("[worker 2] SIGTERM: saved step 3, exiting") < log.index(
      "[worker 2] worker 2 finished")


def test_suspended_slice_relaunches(gcloud):
  result = gcloud.launch(FAKE_GCLOUD_PREEMPT="suspend")
  assert result.returncode == 0, result.stderr
  assert "preempted (exit codes [255, 255, 255, 255], slice SUSPENDED)" in result.stdout
  kinds = [c[4] for c in gcloud.commands()]
  assert kinds.count("create") == 2 and kinds.count("ssh") == 2 * (1 + 4)
  assert gcloud.commands()[-1] == DELETE


def test_relaunches_are_bounded(gcloud):
  result = gcloud.launch("--max_relaunches=1", FAKE_GCLOUD_PREEMPT="always")
  assert result.returncode == 1
  assert _error_line(result).startswith(
      "error: launch failed at step 'run': preempted again after 1 relaunches")
  kinds = [c[4] for c in gcloud.commands()]
  assert kinds.count("create") == 2 and gcloud.commands()[-1] == DELETE


def test_active_slice_is_reused_and_kept(gcloud):
  (gcloud.root / "states.json").write_text('["ACTIVE"]')
  result = gcloud.launch("--keep", "--num_workers=2", accelerator_type="v5litepod-16")
  assert result.returncode == 0, result.stderr
  commands = gcloud.commands()
  assert [c[4] for c in commands] == ["describe", "scp", "ssh", "ssh", "ssh"]
  assert [c[6] for c in commands[3:]] == ["--worker=0", "--worker=1"]


def test_status_and_delete_actions(gcloud):
  result = gcloud.launch("--action=status")
  assert (result.returncode, result.stdout.splitlines()[-1]) == (0, f"{NAME}: not found")
  (gcloud.root / "states.json").write_text('["WAITING_FOR_RESOURCES"]')
  result = gcloud.launch("--action=status")
  assert result.stdout.splitlines()[-1] == f"{NAME}: WAITING_FOR_RESOURCES"
  result = gcloud.launch("--action=delete")
  assert (result.returncode, result.stdout.splitlines()[-1]) == (0, f"{NAME}: deleting")
  assert gcloud.commands() == [DESCRIBE, DESCRIBE, DELETE]


def test_flag_errors_are_one_clear_line(gcloud):
  result = gcloud.launch(accelerator_type="v9-32")
  assert result.returncode == 1 and "unknown accelerator type 'v9-32'" in _error_line(result)
  assert "--num_workers" in _error_line(result)
  result = gcloud.launch("--workdir=/tmp/local")
  assert result.returncode == 1 and "must be a gs:// directory" in _error_line(result)
  assert not gcloud.log.exists()


# --- SLURM ---

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


def _slurm_env(tmp_path: pathlib.Path, job_id: int, **extra: str) -> dict:
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
    (bin_dir / name).write_text(f"#!{sys.executable}\n{body}")
    (bin_dir / name).chmod(0o755)
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  # What sbatch gives the batch script of a 1-node, 2-task allocation; `python` is this venv's.
  env.update(PATH=os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), env["PATH"]]),
             SLURM_JOB_ID=str(job_id), SLURM_NTASKS="2", SLURM_NNODES="1",
             SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="localhost", SLURM_SUBMIT_DIR=str(REPO),
             SLURM_JOB_NAME="bert_jax", FAKE_SRUN_LOG=str(tmp_path / "srun.jsonl"),
             FAKE_SCONTROL_LOG=str(tmp_path / "scontrol.jsonl"), **extra)
  return env


def _jsonl(path: pathlib.Path) -> list:
  return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("srun_exit, restarts, script_exit, requeued", [
    (0, "0", 0, False), (1, "0", 1, False), (143, "0", 0, True), (143, "20", 143, False)])
def test_sbatch_requeues_only_after_a_saved_preemption(tmp_path, srun_exit, restarts, script_exit,
                                                       requeued):
  env = _slurm_env(tmp_path, 4242, FAKE_SRUN_EXIT=str(srun_exit), SLURM_RESTART_COUNT=restarts)
  result = subprocess.run(["bash", str(SBATCH), "--config=c.py", "--workdir=/w", "--config.x=1"],
                          env=env, capture_output=True, text=True, timeout=60)
  assert result.returncode == script_exit, result.stderr
  (srun,) = _jsonl(tmp_path / "srun.jsonl")
  assert srun["argv"] == ["--kill-on-bad-exit=1", "python", "-m", "bert_jax.main", "--config=c.py",
                          "--workdir=/w", "--config.x=1", "--config.distributed.enabled=True"]
  assert _jsonl(tmp_path / "scontrol.jsonl") == ([["requeue", "4242"]] if requeued else [])


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


def _free_slurm_job_id() -> tuple[int, int]:
  """A job id whose JAX coordinator port (61440 + id % 4096, slurm_cluster.py) is free here.

  That port is fixed by the job id, not picked by the OS, so the test picks the
  id: one whose port nothing on this machine is bound to at the moment.
  """
  start = random.randrange(4096)
  for k in range(4096):
    job_id = 900_000 + (start + k) % 4096
    port = 61440 + job_id % 4096
    with socket.socket() as s:
      try:
        s.bind(("localhost", port))
      except OSError:
        continue
    return job_id, port
  raise RuntimeError("no free port in 61440-65535")


@pytest.mark.slow
def test_sbatch_runs_a_two_process_pretraining(tmp_path, pretrain_test_config):
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
    result = subprocess.run(["bash", str(SBATCH), f"--config={config_file}", f"--workdir={workdir}",
                             "--config.total_steps=4", "--config.checkpoint.every_steps=2"],
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
