"""A fake `gcloud` for the launcher's tests (tests/test_launch.py, tests/test_preflight.py).

Run as a program (FakeGcloud puts a `gcloud` first on PATH that runs this file),
it is gcloud: it accepts only the documented command surface of the commands the
launcher uses (each flag's source is written beside it) and refuses anything
else as gcloud does; it logs its argv as a JSON line, keeps the queued
resource's states in a file, maps gs://BUCKET/... to a local directory for
`gcloud storage cat`, and runs each ssh command for real under bash, with $HOME
a per-worker directory, so the launcher's start script (setsid nohup, the pid
guard) is what starts the fake job (tests/fake_tpu_job.py, installed as the
workers' venv python). Environment variables steer it: FAKE_JOB (how the job
ends), FAKE_JOB_HOLD (run until the test writes a release file),
FAKE_GCLOUD_FAIL(+_TIMES, _MESSAGE) (a step fails), FAKE_SSH_255 (the ssh of
these steps ends with 255 after running), FAKE_GCLOUD_PROVISION (the states a
created queued resource goes through), FAKE_JOB_FAIL (the jobs whose workdir holds this
text fail, every attempt).

Several queued resources can exist at once (experiments.ablation --launch drives one per
run): each keeps its states, its workers' homes and its job starts in a directory of its
own, slices/NAME/ (slice_dir); the harness's own slice, FAKE_NAME, keeps them in the fake
directory itself, where the launcher's tests read them.

Imported, it gives FakeGcloud: one test's fake directory, call log and environment.
"""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
NAME = "bert-test"  # the queued resource the tests launch

# The command surface this fake accepts, as documented on cloud.google.com/sdk/gcloud/reference
# (read 2026-12): each command's positionals and flags (True: takes a value, False: a switch).
# Anything else is refused the way gcloud's argument parser refuses it (exit 2).
# gcloud-wide flags (reference/: "GCLOUD WIDE FLAGS"), accepted by every command.
WIDE = {"--account": True, "--billing-project": True, "--configuration": True,
        "--flags-file": True, "--flatten": True, "--format": True, "--help": False,
        "--impersonate-service-account": True, "--log-http": False, "--project": True,
        "--quiet": False, "-q": False, "--trace-token": True, "--user-output-enabled": False,
        "--verbosity": True}
# reference/compute/tpus/queued-resources/create (GA synopsis).
QR_CREATE = {"--zone": True, "--runtime-version": True, "--accelerator-type": True,
             "--topology": True, "--type": True, "--node-id": True, "--node-count": True,
             "--node-prefix": True, "--async": False, "--boot-disk": True, "--data-disk": True,
             "--description": True, "--guaranteed": False, "--internal-ips": False,
             "--labels": True, "--metadata": True, "--metadata-from-file": True,
             "--network": True, "--range": True, "--reserved": False, "--scopes": True,
             "--service-account": True, "--shielded-secure-boot": False, "--spot": False,
             "--subnetwork": True, "--tags": True, "--valid-after-duration": True,
             "--valid-after-time": True, "--valid-until-duration": True,
             "--valid-until-time": True, "--reservation-host-folder": True,
             "--reservation-host-organization": True, "--reservation-host-project": True}
# reference/alpha/compute/tpus/queued-resources/create: the GA flags plus these (alpha only).
QR_CREATE_ALPHA = dict(QR_CREATE, **{"--autocheckpoint-enabled": False, "--best-effort": False,
                                     "--max-run-duration": True, "--provisioning-model": True,
                                     "--workload-type": True, "--network-config": True,
                                     "--reservation": True})
# reference/compute/tpus/tpu-vm/ssh and .../scp.
SSH = {"--zone": True, "--worker": True, "--command": True, "--ssh-flag": True,
       "--internal-ip": False, "--dry-run": False, "--force-key-file-overwrite": False,
       "--plain": False, "--ssh-key-file": True, "--strict-host-key-checking": True,
       "--output-directory": True, "--ssh-key-expiration": True, "--ssh-key-expire-after": True}
SCP = {"--zone": True, "--worker": True, "--recurse": False, "--compress": False,
       "--dry-run": False, "--force-key-file-overwrite": False, "--internal-ip": False,
       "--plain": False, "--scp-flag": True, "--ssh-key-file": True,
       "--strict-host-key-checking": True, "--ssh-key-expiration": True,
       "--ssh-key-expire-after": True}
COMMANDS = {  # (command words): (positionals min, max, flags, required flags)
    ("compute", "tpus", "queued-resources", "create"): (1, 1, QR_CREATE, ("--runtime-version",)),
    ("alpha", "compute", "tpus", "queued-resources", "create"):
        (1, 1, QR_CREATE_ALPHA, ("--runtime-version",)),
    # .../queued-resources/describe, delete, list.
    ("compute", "tpus", "queued-resources", "describe"): (1, 1, {"--zone": True}, ()),
    ("compute", "tpus", "queued-resources", "delete"):
        (1, 1, {"--zone": True, "--async": False, "--force": False}, ()),
    ("compute", "tpus", "queued-resources", "list"):
        (0, 0, {"--zone": True, "--filter": True, "--limit": True, "--page-size": True,
                "--sort-by": True, "--uri": False}, ()),
    ("compute", "tpus", "tpu-vm", "ssh"): (1, 1, SSH, ()),
    ("compute", "tpus", "tpu-vm", "scp"): (2, 99, SCP, ()),
    # reference/storage/cat.
    ("storage", "cat"): (1, 99, {"--additional-headers": True, "--display-url": False,
                                 "-d": False, "--range": True, "-r": True,
                                 "--decryption-keys": True}, ()),
}
# What the TPU API accepts as an accelerator type (cloud.google.com/tpu/docs: v5e is
# "v5litepod-N"); the API, not gcloud's parser, refuses other names, so this error is
# the API's (status INVALID_ARGUMENT; its wording here is ours).
ACCELERATOR = re.compile(r"(v2|v3|v4|v5litepod|v5p|v6e)-\d+")


def _root() -> str:
  """The test's fake directory: queued-resource states, workers' homes, the fake GCS."""
  return os.environ["FAKE_GCLOUD_DIR"]


def fail(command, message, code=1):
  """Exits as gcloud does on an error: `ERROR: (gcloud.COMMAND) MESSAGE` on stderr."""
  print(f"ERROR: (gcloud.{'.'.join(command)}) {message}", file=sys.stderr)
  sys.exit(code)


def parse(args):
  """(command words, positionals, {flag: [values]}) or a gcloud-style refusal."""
  words = []
  rest = list(args)
  while rest and not rest[0].startswith("-") and tuple(words + [rest[0]]) in {
      c[:len(words) + 1] for c in COMMANDS}:
    words.append(rest.pop(0))
  command = tuple(words)
  if command not in COMMANDS:
    fail(command or ("",), f"Invalid choice: '{rest[0] if rest else ''}'.", 2)
  low, high, known, required = COMMANDS[command]
  allowed = dict(WIDE, **known)
  positionals, given, unknown = [], {}, []
  while rest:
    arg = rest.pop(0)
    if not arg.startswith("-"):
      positionals.append(arg)
      continue
    name, eq, value = arg.partition("=")
    if name not in allowed:
      unknown.append(arg)
      continue
    if allowed[name] and not eq:
      if not rest:
        fail(command, f"argument {name}: expected one argument", 2)
      value = rest.pop(0)
    elif not allowed[name] and eq:
      unknown.append(arg)
      continue
    given.setdefault(name, []).append(value)
  if unknown:
    fail(command, "unrecognized arguments: " + " ".join(unknown), 2)
  if not low <= len(positionals) <= high:
    fail(command, f"expected {low} to {high} positional arguments, got {positionals}", 2)
  for name in required:
    if name not in given:
      fail(command, f"argument {name}: Must be specified.", 2)
  return command, positionals, given


def slice_dir(name: str) -> str:
  """Where queued resource `name` keeps its states, workers' homes and job starts: the fake
  directory for the harness's slice (FAKE_NAME), slices/NAME under it for any other."""
  if name == os.environ.get("FAKE_NAME", NAME):
    return _root()
  return os.path.join(_root(), "slices", name)


def states(name: str) -> list:
  """The queued resource's states to come (the first is the current one); [] if none."""
  path = os.path.join(slice_dir(name), "states.json")
  return json.load(open(path)) if os.path.exists(path) else []


def save(name: str, new: list) -> None:
  """Replaces the states to come."""
  path = os.path.join(slice_dir(name), "states.json")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(new, f)
  os.replace(path + ".tmp", path)


def exists(name: str) -> bool:
  """Whether the queued resource exists."""
  return bool(states(name)) and states(name)[0] is not None


def names() -> list[str]:
  """The queued resources that exist, the harness's own first."""
  others = os.path.join(_root(), "slices")
  candidates = [os.environ.get("FAKE_NAME", NAME)] + (
      sorted(os.listdir(others)) if os.path.isdir(others) else [])
  return [n for n in candidates if exists(n)]


def kind(command, given):
  """The launcher step a command is (FAKE_GCLOUD_FAIL and FAKE_SSH_255 name these)."""
  if command[-1] != "ssh":
    return {"scp": "upload", "cat": "job_state"}.get(command[-1], command[-1])
  script = given["--command"][0]
  return ("install" if "pip install" in script else "start" if "setsid nohup" in script
          else "logs")


def maybe_fail(step):
  """Fails as FAKE_GCLOUD_FAIL(_TIMES, _MESSAGE) ask when `step` is one of the failing steps."""
  failing = os.environ.get("FAKE_GCLOUD_FAIL", "").split(",")
  if step not in failing:
    return
  counter = os.path.join(_root(), f"failures_{step}")
  done = int(open(counter).read()) if os.path.exists(counter) else 0
  if done >= int(os.environ.get("FAKE_GCLOUD_FAIL_TIMES", "1000000")):
    return
  open(counter, "w").write(str(done + 1))
  print("some progress output")
  print(f"ERROR: (gcloud.fake.{step}) {os.environ['FAKE_GCLOUD_FAIL_MESSAGE']}", file=sys.stderr)
  sys.exit(1)


def install(home: str, worker: int) -> int:
  """A worker's install: the uploaded sdist unpacked into ~/bert_jax as the real install
  does; apt, venv and pip stand in by a venv whose python is the installed artifact's
  (tests/installed_artifact.py, FAKE_WORKER_PYTHON: see FakeGcloud)."""
  if os.path.exists(os.path.join(home, "bert_jax_job.pid")):
    pid = open(os.path.join(home, "bert_jax_job.pid")).read().split()[0]
    if subprocess.run(["kill", "-0", pid], capture_output=True).returncode == 0:
      return 0  # a live job keeps its tree (the real script's guard)
  upload = os.path.join(home, "bert_jax_upload", "bert_jax.tar.gz")
  if not os.path.isfile(upload):
    print(f"tar: {upload}: Cannot open: No such file or directory", file=sys.stderr)
    return 2
  tree = os.path.join(home, "bert_jax")
  shutil.rmtree(tree, ignore_errors=True)
  os.makedirs(tree)
  subprocess.run(["tar", "-xzf", upload, "-C", tree, "--strip-components=1"], check=True)
  shutil.rmtree(os.path.dirname(upload))
  bin_dir = os.path.join(home, "bert_jax_venv", "bin")
  os.makedirs(bin_dir, exist_ok=True)
  shutil.copy(os.environ["FAKE_WORKER_PYTHON"], os.path.join(bin_dir, "python"))
  print(f"worker-{worker} python 3.11.0 jax 0.7.2 [TpuDevice(id={worker})]")
  return 0


def main(args: list[str]) -> None:
  """Logs `args` as a JSON line and does what gcloud would with them (see the module docstring)."""
  with open(os.environ["FAKE_GCLOUD_LOG"], "a") as f:
    f.write(json.dumps(["gcloud"] + args) + "\n")
  command, positionals, given = parse(args)
  step = kind(command, given)
  maybe_fail(step)
  verb = command[-1]
  name = positionals[0] if verb in ("create", "describe", "delete", "ssh") else ""
  if verb == "create":
    if not ACCELERATOR.fullmatch(given["--accelerator-type"][0]):
      fail(command, "INVALID_ARGUMENT: accelerator type "
           f"{given['--accelerator-type'][0]!r} is not known in this zone.")
    if exists(name):
      fail(command, "ALREADY_EXISTS: the queued resource already exists.")
    save(name, os.environ.get("FAKE_GCLOUD_PROVISION", "ACTIVE").split(","))
  elif verb == "describe":
    if not exists(name):
      fail(command, "NOT_FOUND: Requested entity was not found.")
    print(states(name)[0])
    if len(states(name)) > 1:
      save(name, states(name)[1:])
  elif verb == "delete":
    if not exists(name):
      fail(command, "NOT_FOUND: Requested entity was not found.")
    save(name, ["DELETING", None])
  elif verb == "list":
    print("\n".join(["NAME"] + names()))
  elif verb == "cat":
    url = positionals[0]
    local = os.path.join(_root(), "gcs", url[len("gs://"):])
    if not os.path.exists(local):
      fail(command, f"The following URLs matched no objects or files:\n-{url}")
    sys.stdout.write(open(local).read())
  elif verb == "scp":  # SOURCE NAME: --worker=all: the source copied into every worker's home
    if not os.path.isdir(positionals[0]):
      fail(command, f"{positionals[0]}: No such file or directory")
    target = positionals[-1].rstrip(":")
    for w in range(int(os.environ.get("FAKE_WORKERS", "4"))):
      home = os.path.join(slice_dir(target), f"worker_{w}")
      shutil.copytree(positionals[0], os.path.join(home, os.path.basename(positionals[0])),
                      dirs_exist_ok=True)
  else:  # ssh: each worker is a directory (its $HOME) where the command runs for real
    if states(name)[:1] != ["ACTIVE"]:
      print("ssh: connect to host: Connection timed out", file=sys.stderr)
      sys.exit(255)
    count = int(os.environ.get("FAKE_WORKERS", "4"))
    worker = given.get("--worker", ["0"])[0]
    codes = []
    for w in (range(count) if worker == "all" else [int(worker)]):
      home = os.path.join(slice_dir(name), f"worker_{w}")
      os.makedirs(home, exist_ok=True)
      env = dict(os.environ, HOME=home, FAKE_WORKER=str(w), FAKE_SLICE_DIR=slice_dir(name))
      if step == "install":
        codes.append(install(home, w))
        continue
      # Bounded, so that a `tail -F` (or anything) never outlives the test.
      codes.append(subprocess.run(["timeout", "60", "bash", "-c", given["--command"][0]],
                                  env=env).returncode)
    if step in os.environ.get("FAKE_SSH_255", "").split(","):
      print("Connection to 10.0.0.2 closed by remote host.", file=sys.stderr)
      sys.exit(255)
    sys.exit(max(codes))


class FakeGcloud:
  """The fake gcloud's directory, log and environment for one test."""

  def __init__(self, root: pathlib.Path, installed):
    """`installed`: the launch's upload installed outside the checkout (conftest's
    installed_artifact): the workers' jobs run by its interpreter, in the unpacked upload."""
    self.root, self.log = root, root / "gcloud_log.jsonl"
    bin_dir = root / "bin"
    bin_dir.mkdir()
    script = bin_dir / "gcloud"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "fake_gcloud.py"}" "$@"\n')
    script.chmod(0o755)
    # What the fake install puts in each worker's venv as its python: the installed artifact's
    # interpreter. A job's start (`python -c RUN_AND_RECORD MODULE ARGS`, bert_jax.launch.plan)
    # runs the fake job (tests/fake_tpu_job.py, copied out of the checkout) in MODULE's place,
    # or MODULE itself with FAKE_JOB=real.
    modules = root / "fake_modules"
    modules.mkdir()
    shutil.copy(HERE / "fake_tpu_job.py", modules / "fake_tpu_job.py")
    python = root / "worker_python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ] && [ "${FAKE_JOB:-done}" != real ]; then\n'
        '  code=$2; module=$3; shift 3\n'
        f'  FAKE_JOB_MODULE="$module" PYTHONPATH="{modules}" exec "{installed.python}" -c "$code" '
        'fake_tpu_job "$@"\n'
        "fi\n"
        f'exec "{installed.python}" "$@"\n')
    python.chmod(0o755)
    self.logdir = root / "logs"
    self.upload = f"{self.logdir}/staging/bert_jax_upload"
    self.record = root / "gcs" / "bucket" / "run1" / "job_state.json"
    # The launcher's remembered preflight passes: this test's own, never the machine's.
    self.preflight_cache = root / "preflight_cache"
    self.env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                    FAKE_GCLOUD_DIR=str(root), FAKE_GCLOUD_LOG=str(self.log),
                    FAKE_WORKER_PYTHON=str(python), FAKE_NAME=NAME,
                    BERT_JAX_PREFLIGHT_CACHE=str(self.preflight_cache))

  def argv(self, *flags: str, accelerator_type: str = "v4-32") -> list[str]:
    """`python -m bert_jax.launch` with the standard flags (fast polls) plus `flags`."""
    return [sys.executable, "-m", "bert_jax.launch", f"--name={NAME}", "--project=proj",
            "--zone=us-central2-b", f"--accelerator_type={accelerator_type}",
            "--config=experiments/configs/pretrain.py:base", "--workdir=gs://bucket/run1",
            "--poll_s=0.05", "--retry_s=0.01", "--preemption_window_s=0", "--stale_after_s=30",
            "--start_timeout_s=20", "--skip_preflight", f"--logdir={self.logdir}",
            "--config.total_steps=7", "--config.data.corpus=gs://bucket/text/*.txt", *flags]

  def launch(self, *flags: str, accelerator_type: str = "v4-32", timeout: float = 120,
             **env: str):
    """Runs the launcher to its end (`env`: more environment variables)."""
    return subprocess.run(self.argv(*flags, accelerator_type=accelerator_type), cwd=REPO,
                          env={**self.env, **env}, capture_output=True, text=True,
                          timeout=timeout)

  def popen(self, *flags: str, **env: str) -> subprocess.Popen:
    """Starts the launcher in the background (its output in a file: see `output`)."""
    out = open(self.root / f"launcher_{len(list(self.root.glob('launcher_*')))}.out", "w")
    self.out_path = out.name
    return subprocess.Popen(self.argv(*flags), cwd=REPO, env={**self.env, **env}, stdout=out,
                            stderr=subprocess.STDOUT, text=True)

  def output(self) -> str:
    return pathlib.Path(self.out_path).read_text()

  def commands(self) -> list[list[str]]:
    """Every logged command, in order."""
    if not self.log.exists():
      return []
    return [json.loads(line) for line in self.log.read_text().splitlines()]

  def steps(self) -> list[str]:
    """Each command's launcher step: create, describe, upload, install, start, logs, ..."""
    names = []
    for c in self.commands():
      script = next((a for a in c if a.startswith("--command=")), "")
      names.append("install" if "pip install" in script else "start" if "setsid" in script
                   else "logs" if "tail" in script else "cat" if c[1] == "storage" else
                   "upload" if "scp" in c else c[4] if c[1] != "alpha" else c[5])
    return names

  def starts(self, name: str = NAME) -> list[dict]:
    """One line per job process a fake worker of slice `name` started."""
    path = self.slice_dir(name) / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

  def slice_dir(self, name: str) -> pathlib.Path:
    """Slice `name`'s directory (states.json, worker_N homes, starts.jsonl), as slice_dir."""
    return self.root if name == NAME else self.root / "slices" / name

  def slice_names(self) -> list[str]:
    """Every slice ever created, the harness's own first when it was."""
    others = self.root / "slices"
    return ([NAME] if (self.root / "states.json").exists() else []) + (
        sorted(p.name for p in others.iterdir()) if others.is_dir() else [])

  def slice_state(self, name: str) -> "str | None":
    """Slice `name`'s current state (None: never created, or deleted)."""
    path = self.slice_dir(name) / "states.json"
    current = json.loads(path.read_text()) if path.exists() else []
    return current[0] if current else None

  def wait_for(self, predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
      assert time.monotonic() < deadline, f"no {what} within {timeout}s"
      time.sleep(0.05)

  def running(self) -> bool:
    return self.record.exists() and '"running"' in self.record.read_text()


if __name__ == "__main__":
  main(sys.argv[1:])
