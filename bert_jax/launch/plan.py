"""What bert_jax.launch runs: the gcloud command lines for one Cloud TPU slice, as argv lists.

Pure functions, nothing runs here, so `--dry_run` and the tests see exactly the
commands a real launch would run. A slice is one TPU VM queued resource whose
single node has the same name:

  create    gcloud [alpha] compute tpus queued-resources create NAME --node-id=NAME ...
  describe  gcloud compute tpus queued-resources describe NAME ... --format=value(state.state)
  upload    gcloud compute tpus tpu-vm scp --recurse STAGING/bert_jax_upload NAME: --worker=all
              (the project's sdist, bert_jax.launch.artifact)
  install   gcloud compute tpus tpu-vm ssh NAME --worker=all --command='... tar -xzf the sdist into
              ~/bert_jax ... python3.11 -m venv ~/bert_jax_venv ... pip install .[tpu] ...
              print(jax.__version__, jax.devices())'
  start     gcloud compute tpus tpu-vm ssh NAME --worker=all --command='... setsid nohup
              ~/bert_jax_venv/bin/python -c RUN_AND_RECORD bert_jax.main ... >> ~/bert_jax_job.log ... &'
  job state gcloud storage cat WORKDIR/job_state.json       (written by the job: bert_jax.run.job_state)
  exited    gcloud compute tpus tpu-vm ssh NAME --worker=0 --command='... cat ~/bert_jax_job.exit ...'
              (while no record is written: a job that died before its first heartbeat)
  logs      gcloud compute tpus tpu-vm ssh NAME --worker=i --command='tail -n 200 -F ~/bert_jax_job.log'
  delete    gcloud compute tpus queued-resources delete NAME ... --force --async --quiet

The job outlives the ssh that started it (its own session, its log on the
worker), so the launcher only starts, watches and restarts it.
"""

import dataclasses
import shlex

from bert_jax import accelerators
from bert_jax import exit_codes
from bert_jax.launch import artifact

# Queued-resource states (TPU API QueuedResourceState.State).
ACTIVE = "ACTIVE"
PROVISIONING_STATES = ("CREATING", "ACCEPTED", "PROVISIONING", "WAITING_FOR_RESOURCES")
FAILED_STATES = ("FAILED",)
# Spot/preemptible capacity taken back: the slice must be deleted and created again.
PREEMPTED_STATES = ("SUSPENDING", "SUSPENDED", "PREEMPTED")

# Name of the source tree on the workers (under the login user's home directory: the sdist
# unpacked, the job's working directory), and of the directory the sdist is uploaded in.
REMOTE_DIR = "bert_jax"
UPLOAD_DIR = "bert_jax_upload"
# On each worker (under the login user's home): the Python >= 3.11 environment the job runs
# from, the job's log, "PID ATTEMPT" of the job this worker started last, and "EXIT_CODE
# ATTEMPT" of the last job that ended.
VENV_DIR = "bert_jax_venv"
JOB_LOG = "bert_jax_job.log"
JOB_PID = "bert_jax_job.pid"
JOB_EXIT = "bert_jax_job.exit"
# Ubuntu 22.04 (every TPU VM image) ships Python 3.10; the code needs jax >= 0.7, so >= 3.11.
PYTHON = "python3.11"
# Printed by the start script: the launcher adopts a job already running on the slice.
ALREADY_RUNNING = "bert_jax job already running:"
# Printed by the exit check (exited_script) before a worker's "EXIT_CODE ATTEMPT".
EXITED = "bert_jax job exited:"
# How many of a worker's last log lines the exit check prints.
EXIT_LOG_LINES = 12


def _generation(accelerator_type: str) -> "tuple[accelerators.Generation, int]":
  parsed = accelerators.parse(accelerator_type)
  if parsed is None:
    raise ValueError(
        f"unknown accelerator type {accelerator_type!r} (known generations: "
        f"{', '.join(accelerators.GENERATIONS)}): pass --num_workers (and --runtime_version) "
        "explicitly")
  return parsed


def num_workers(accelerator_type: str) -> int:
  """Number of TPU VMs (hosts, `--worker` indices) of a slice, e.g. v4-32 -> 4.

  Raises:
    ValueError: for a type the table does not know or a count it cannot split.
  """
  generation, count = _generation(accelerator_type)  # the table: bert_jax.accelerators
  if count <= generation.single_host_max:
    return 1
  if count % generation.count_unit:
    raise ValueError(f"accelerator type {accelerator_type!r}: {count} is not a multiple of "
                     f"{generation.count_unit}; pass --num_workers explicitly")
  return count // generation.count_unit


def default_runtime_version(accelerator_type: str) -> str:
  """The TPU VM image this generation's JAX guides use."""
  return _generation(accelerator_type)[0].runtime_version


@dataclasses.dataclass(frozen=True)
class Slice:
  """One TPU VM slice provisioned as a queued resource (node id = name)."""
  name: str
  project: str
  zone: str
  accelerator_type: str
  runtime_version: str
  num_workers: int
  spot: bool = False
  autocheckpoint: bool = False

  @property
  def where(self) -> list[str]:
    return [f"--project={self.project}", f"--zone={self.zone}"]

  @property
  def job_id(self) -> str:
    """The launch's identity, the same for every relaunch (BERT_JAX_JOB_ID on the workers)."""
    return f"tpu:{self.project}/{self.zone}/{self.name}"


_QR = ["gcloud", "compute", "tpus", "queued-resources"]
_VM = ["gcloud", "compute", "tpus", "tpu-vm"]
# A worker that vanishes (preempted VM, dropped network) makes ssh fail within
# about two minutes instead of hanging on a dead TCP connection for hours.
_KEEPALIVE = ["--ssh-flag=-oServerAliveInterval=30", "--ssh-flag=-oServerAliveCountMax=4"]


def create_command(s: Slice) -> list[str]:
  """Queues the slice's creation (returns once the request is accepted).

  --autocheckpoint-enabled exists only on gcloud's alpha track (`gcloud alpha compute
  tpus queued-resources create`); with it the TPU service signals the VMs before a
  maintenance event, bert_jax.main's SIGTERM handler saves, and the job exits 143 like
  after a preemption. Without it (the default: alpha commands may change without
  notice) a maintenance event stops the job at its last periodic checkpoint.
  """
  qr = (["gcloud", "alpha"] + _QR[1:]) if s.autocheckpoint else _QR
  return (qr + ["create", s.name, f"--node-id={s.name}"] + s.where
          + [f"--accelerator-type={s.accelerator_type}", f"--runtime-version={s.runtime_version}"]
          + (["--spot"] if s.spot else [])
          + (["--autocheckpoint-enabled"] if s.autocheckpoint else []))


def describe_command(s: Slice) -> list[str]:
  """Prints the queued resource's state (ACTIVE, WAITING_FOR_RESOURCES, SUSPENDED, ...)."""
  return _QR + ["describe", s.name] + s.where + ["--format=value(state.state)"]


def delete_command(s: Slice) -> list[str]:
  """Deletes the queued resource and its node; --async returns before it is gone."""
  return _QR + ["delete", s.name] + s.where + ["--force", "--async", "--quiet"]


def upload_command(s: Slice, staging_dir: str) -> list[str]:
  """Copies the staged sdist (STAGING/bert_jax_upload/bert_jax.tar.gz) to every worker's home."""
  return (_VM + ["scp", "--recurse", f"{staging_dir.rstrip('/')}/{UPLOAD_DIR}", f"{s.name}:",
                 "--worker=all"] + s.where)


def python_env_script() -> str:
  """Shell lines that make ~/bert_jax_venv, a Python >= 3.11 virtual environment."""
  # python3.11 and python3.11-venv are Ubuntu 22.04 (jammy) packages of its own
  # universe/updates archive, which GCE mirrors in every region: no third-party
  # download (uv would fetch a Python build from GitHub), signed like the rest of
  # the image. A fresh VM runs unattended-upgrades for its first minutes, holding
  # the dpkg lock, hence the lock timeout instead of failing at once.
  apt = "sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600"
  venv = f"$HOME/{VENV_DIR}"
  return (f"if ! {PYTHON} -c 'import ensurepip' >/dev/null 2>&1; then "
          f"{apt} update -qq && {apt} install -y -qq {PYTHON} {PYTHON}-venv; fi && "
          # A venv left by an older install (another Python) is rebuilt, not reused.
          f"if ! {venv}/bin/python -c 'import sys; assert sys.version_info >= (3, 11)' "
          f">/dev/null 2>&1; then {PYTHON} -m venv --clear {venv}; fi")


def _unless_running() -> str:
  """Shell: stop here (exit 0, saying so) if the job this worker started last still runs."""
  pid = f"$HOME/{JOB_PID}"
  return (f"if [ -f {pid} ] && kill -0 \"$(cut -d' ' -f1 {pid})\" 2>/dev/null; "
          f"then echo \"{ALREADY_RUNNING} $(cat {pid})\"; exit 0; fi; ")


def install_script() -> str:
  """What every worker runs: the uploaded sdist unpacked into ~/bert_jax, installed from there
  into ~/bert_jax_venv, checked.

  A worker whose job still runs (a launcher that lost track of it) keeps its tree and
  environment untouched; the start that follows adopts that job.
  """
  python = f"$HOME/{VENV_DIR}/bin/python"
  # A fresh tree per upload keeps files deleted locally from lingering on a reused slice.
  return ("cd $HOME; " + _unless_running()
          + f"set -e; rm -rf {REMOTE_DIR} && mkdir {REMOTE_DIR} && "
          f"tar -xzf {UPLOAD_DIR}/{artifact.ARTIFACT} -C {REMOTE_DIR} --strip-components=1 && "
          f"rm -rf {UPLOAD_DIR} && cd {REMOTE_DIR} && "
          + python_env_script() + " && "
          f"{python} -m pip install --quiet --upgrade pip && "
          f"{python} -m pip install --quiet '.[tpu]' && "
          # Every worker says which Python, JAX and devices it has before anything trains: a
          # CPU-only JAX or a missing chip shows here, not hours later.
          f"{python} -c 'import socket, sys, jax; print(socket.gethostname(), \"python\", "
          f"sys.version.split()[0], \"jax\", jax.__version__, jax.devices())'")


def install_command(s: Slice) -> list[str]:
  """Installs the uploaded project (with jax[tpu]) on all workers at once."""
  return _VM + ["ssh", s.name, "--worker=all"] + s.where + [f"--command={install_script()}"]


def main_args(config: str, workdir: str, extra: list[str], accelerator_type: str = ""
              ) -> list[str]:
  """The job's module and argv on every worker, a bert_jax.main run; the same gs:// workdir
  makes a relaunch resume. `accelerator_type` becomes --config.slice (the run's tested
  layout for it, bert_jax.run.layouts) unless `extra` names a slice."""
  named = any(a.startswith("--config.slice=") for a in extra)
  slice_flag = [f"--config.slice={accelerator_type}"] if accelerator_type and not named else []
  return (["bert_jax.main", f"--config={config}", f"--workdir={workdir}",
           "--config.distributed.enabled=True"] + slice_flag + list(extra))


def evaluate_args(workdir: str, extra: list[str]) -> list[str]:
  """The job's module and argv for an experiments.evaluate job (a suite of fine-tuning tasks,
  one table) on a one-host slice: its flags as given (--suite, --init_checkpoint, --glue_dir,
  ...); the same gs:// workdir makes a relaunch resume the suite."""
  return ["experiments.evaluate", f"--workdir={workdir}"] + list(extra)


# `python -c RUN_AND_RECORD MODULE ARGS` runs MODULE as `python -m MODULE ARGS` does (the
# working directory first on sys.path) and, however it ends but killed, leaves "EXIT_CODE
# ATTEMPT" in ~/bert_jax_job.exit: a job that dies before its first heartbeat (an import
# error, a refusal) writes no record in the workdir, and the launcher reads this instead
# (exited_script). The standard library only: it must run when the project cannot import.
RUN_AND_RECORD = f"""\
import os, runpy, sys
def record(code):
  with open(os.path.join(os.path.expanduser("~"), "{JOB_EXIT}"), "w") as f:
    f.write("%s %s\\n" % (code, os.environ.get("BERT_JAX_JOB_ATTEMPT", "")))
sys.argv = sys.argv[1:]
try:
  runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as e:
  record(e.code if isinstance(e.code, int) else int(e.code is not None))
  raise
except BaseException:
  record(1)
  raise
record(0)
"""


def _stop_previous() -> str:
  """Shell: end the job this worker started last if it still runs (TERM, then KILL after 60 s)."""
  pid = f"$HOME/{JOB_PID}"
  return (f"if [ -f {pid} ] && kill -0 \"$(cut -d' ' -f1 {pid})\" 2>/dev/null; then "
          f"p=$(cut -d' ' -f1 {pid}); kill -TERM $p; for i in $(seq 300); do "
          "kill -0 $p 2>/dev/null || break; sleep 0.2; done; kill -KILL $p 2>/dev/null; fi; ")


def run_and_record_line() -> str:
  """RUN_AND_RECORD as one line of Python (an exec of its text), so that every command the
  launcher prints (--dry_run) stays one line."""
  return f"exec({RUN_AND_RECORD!r})"


def start_script(job_id: str, attempt: int, args: list[str], replace: bool = False) -> str:
  """What every worker runs to start the job, `python -m MODULE ARGS` for `args` = [MODULE,
  *ARGS] (main_args, evaluate_args) through RUN_AND_RECORD, detached (unless its last one
  still runs).

  With `replace` (a relaunch: the launcher judged the previous attempt gone), a
  process of that attempt that still lingers (exiting, or hung on a dead peer)
  is ended first instead of adopted.

  `setsid nohup ... &` puts the job in a session of its own with its output in
  ~/bert_jax_job.log, so the ssh returns at once and nothing that ends the ssh
  (a sleeping laptop, a dropped network, a killed launcher) reaches the job.
  """
  # env, setsid and nohup each exec the next, so $! is the job's own pid (what kill -0 checks).
  job = (shlex.join(["env", f"BERT_JAX_JOB_ID={job_id}", f"BERT_JAX_JOB_ATTEMPT={attempt}",
                     "setsid", "nohup"])
         + f" $HOME/{VENV_DIR}/bin/python " + shlex.join(["-c", run_and_record_line(), *args]))
  pid, log = f"$HOME/{JOB_PID}", f"$HOME/{JOB_LOG}"
  return ((_stop_previous() if replace else _unless_running())
          + f"cd $HOME/{REMOTE_DIR} || exit 1; "
          f"echo \"=== attempt {attempt} $(date -u +%FT%TZ)\" >> {log}; "
          f"{job} >> {log} 2>&1 < /dev/null & echo \"$! {attempt}\" > {pid}; "
          f"echo \"bert_jax job started: $(cat {pid})\"")


def start_command(s: Slice, attempt: int, args: list[str], replace: bool = False) -> list[str]:
  """Starts the job on all workers at once; returns when it is started, not when it ends."""
  return (_VM + ["ssh", s.name, "--worker=all"] + s.where + _KEEPALIVE
          + [f"--command={start_script(s.job_id, attempt, args, replace)}"])


def exited_script() -> str:
  """What a worker runs to say whether its last job ended: EXITED CODE ATTEMPT and the log's
  last lines, or nothing while it runs (or before it ever started)."""
  done, log = f"$HOME/{JOB_EXIT}", f"$HOME/{JOB_LOG}"
  return (f"if [ -f {done} ]; then echo \"{EXITED} $(cat {done})\"; "
          f"tail -n {EXIT_LOG_LINES} {log}; fi")


def exited_command(s: Slice) -> list[str]:
  """Asks worker 0 whether its job ended (exited_script); read while no record is written.

  Worker 0's process writes the workdir's record, and writes it before it exits, so its
  exit without a record is a job that never started; every worker runs the same code, so
  an import error or a refusal ends worker 0's too."""
  return (_VM + ["ssh", s.name, "--worker=0"] + s.where + _KEEPALIVE
          + [f"--command={exited_script()}"])


def logs_command(s: Slice, worker: int, lines: int, follow: bool) -> list[str]:
  """Prints (and with `follow` keeps printing) the end of one worker's job log."""
  tail = f"tail -n {lines}{' -F' if follow else ''} $HOME/{JOB_LOG}"
  return _VM + ["ssh", s.name, f"--worker={worker}"] + s.where + _KEEPALIVE + [f"--command={tail}"]


def job_state_command(workdir: str) -> list[str]:
  """Prints WORKDIR/job_state.json (bert_jax.run.job_state) with the user's gcloud credentials."""
  return ["gcloud", "storage", "cat", f"{workdir.rstrip('/')}/{exit_codes.STATE_FILE}"]


def run_plan(s: Slice, staging_dir: str, workdir: str, attempt: int, args: list[str],
             keep: bool) -> list[list[str]]:
  """The commands of `--action=run` when no job ran in the workdir, the slice does not
  exist yet and comes up at once, and the job finishes before the first look."""
  return ([job_state_command(workdir), describe_command(s), create_command(s),
           describe_command(s), upload_command(s, staging_dir), install_command(s),
           start_command(s, attempt, args), describe_command(s), job_state_command(workdir)]
          + ([] if keep else [delete_command(s)]))
