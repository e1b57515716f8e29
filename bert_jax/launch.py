r"""Runs bert_jax.main on a Cloud TPU VM slice: create, install, run on every worker, delete.

  python -m bert_jax.launch --name=bert-base --project=my-project --zone=us-central2-b \
    --accelerator_type=v4-32 --config=experiments/configs/pretrain.py:base \
    --workdir=gs://my-bucket/bert-base --config.total_steps=100000

`--action=run` (the default):
  1. create the slice as a queued resource (reused if it is already ACTIVE) and
     wait until it is ACTIVE (FAILED/SUSPENDED or --create_timeout_s: an error);
  2. upload this source tree to every worker and `pip install -e '.[tpu]'` there;
  3. start `python3 -m bert_jax.main --config=... --workdir=gs://...
     --config.distributed.enabled=True <every --config.X flag given here>` on
     every worker at once (one ssh each), printing each worker's lines prefixed
     `[worker i]` and appending them to LOGDIR/worker_i.log;
  4. if a worker exits 143 (stopped by SIGTERM after saving) or the slice is
     SUSPENDED/PREEMPTED, delete it, create it again, reinstall and run the same
     command, which resumes from the workdir; at most --max_relaunches times;
  5. delete the slice at the end, success or failure (not with --keep).
`--action=status` prints the queued resource's state, `--action=delete` deletes
it, `--dry_run` prints the gcloud commands of the action and runs nothing.
A failure stops with one line naming the step and the tail of gcloud's stderr.
The command sequences are built in bert_jax/launch_plan.py.
"""

import collections
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags

from bert_jax import launch_plan

_ACTION = flags.DEFINE_enum("action", "run", ["run", "status", "delete"],
                            "What to do with the slice.")
_NAME = flags.DEFINE_string("name", None, "Queued resource and TPU node name.")
_PROJECT = flags.DEFINE_string("project", None, "Google Cloud project.")
_ZONE = flags.DEFINE_string("zone", None, "Zone of the slice, e.g. us-central2-b.")
_ACCELERATOR_TYPE = flags.DEFINE_string("accelerator_type", None,
                                        "e.g. v4-32, v5litepod-16, v6e-64.")
_RUNTIME_VERSION = flags.DEFINE_string("runtime_version", "",
                                       "TPU VM image; '' -> the generation's default.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 0,
                                    "VMs in the slice; 0 -> from the accelerator type.")
_SPOT = flags.DEFINE_bool("spot", False, "Ask for spot capacity (cheaper, preemptible).")
_CONFIG = flags.DEFINE_string("config", None, "bert_jax.main's --config, e.g. "
                              "experiments/configs/pretrain.py:base (a path in this source tree).")
_WORKDIR = flags.DEFINE_string("workdir", None, "bert_jax.main's --workdir: a gs:// directory "
                               "(every worker and every relaunch must see it).")
_MAX_RELAUNCHES = flags.DEFINE_integer("max_relaunches", 10,
                                       "Recreate-and-resume rounds after preemptions.")
_KEEP = flags.DEFINE_bool("keep", False, "Leave the slice running at the end.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the gcloud commands; run nothing.")
_LOGDIR = flags.DEFINE_string("logdir", "", "Local directory for worker_i.log and the upload "
                              "staging; '' -> $TMPDIR/bert_jax_launch/NAME.")
_SOURCE_DIR = flags.DEFINE_string("source_dir", "", "Source tree to install; '' -> this checkout.")
_POLL_S = flags.DEFINE_float("poll_s", 30.0, "Seconds between queued-resource state checks.")
_CREATE_TIMEOUT_S = flags.DEFINE_float("create_timeout_s", 4 * 3600.0,
                                       "Give up if the slice is not ACTIVE after this long.")


class LaunchError(Exception):
  """A step of the launch failed; str() is the one line the user sees."""

  def __init__(self, step: str, detail: str):
    super().__init__(f"launch failed at step '{step}': {detail}")
    self.step = step


def _tail(text: str, lines: int = 3, chars: int = 500) -> str:
  """The last non-empty lines of a command's output, joined into one line."""
  kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
  return " | ".join(kept)[-chars:] or "(no output)"


def _say(message: str) -> None:
  print(f"[launch] {message}", flush=True)


class Launcher:
  """Drives one slice through gcloud; every command comes from launch_plan."""

  def __init__(self, tpu: launch_plan.Slice, *, logdir: str, source_dir: str, poll_s: float,
               create_timeout_s: float):
    self.tpu, self.logdir, self.source_dir = tpu, logdir, source_dir
    self.poll_s, self.create_timeout_s = poll_s, create_timeout_s
    self.exists = False  # whether this launcher saw or made the queued resource

  # --- gcloud ---

  def _gcloud(self, argv: list[str], step: str, check: bool = True) -> subprocess.CompletedProcess:
    _say("$ " + shlex.join(argv))
    try:
      result = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError as e:
      raise LaunchError(step, f"{argv[0]} not found on PATH (install the Google Cloud CLI)") from e
    if check and result.returncode:
      raise LaunchError(step, f"gcloud exited {result.returncode}: "
                        f"{_tail(result.stderr or result.stdout)}")
    return result

  def state(self, step: str = "describe") -> "str | None":
    """The queued resource's state, or None when it does not exist."""
    result = self._gcloud(launch_plan.describe_command(self.tpu), step, check=False)
    if result.returncode:
      if "NOT_FOUND" in result.stderr:
        return None
      raise LaunchError(step, f"gcloud exited {result.returncode}: {_tail(result.stderr)}")
    return result.stdout.strip()

  def _wait(self, done, step: str, what: str) -> str:
    """Polls the state until done(state) is true; FAILED or SUSPENDED on the way is an error."""
    deadline = time.monotonic() + self.create_timeout_s
    while True:
      state = self.state(step)
      if done(state):
        return state
      if state is None or state in launch_plan.FAILED_STATES + launch_plan.PREEMPTED_STATES:
        raise LaunchError(step, f"queued resource {self.tpu.name} is "
                          f"{state or 'gone'} while waiting for it to be {what}")
      if time.monotonic() > deadline:
        raise LaunchError(step, f"queued resource {self.tpu.name} is still {state} after "
                          f"{self.create_timeout_s:.0f}s (--create_timeout_s)")
      _say(f"{self.tpu.name} is {state}; waiting for {what}")
      time.sleep(self.poll_s)

  def create(self) -> None:
    """Queues the slice and waits until it is ACTIVE."""
    self._gcloud(launch_plan.create_command(self.tpu), "create")
    self.exists = True
    self._wait(lambda s: s == launch_plan.ACTIVE, "create", launch_plan.ACTIVE)

  def delete(self, wait: bool, step: str = "delete") -> bool:
    """Deletes the slice (and waits until it is gone); False if there was none."""
    result = self._gcloud(launch_plan.delete_command(self.tpu), step, check=False)
    if result.returncode and "NOT_FOUND" in result.stderr:
      self.exists = False
      return False
    if result.returncode:
      raise LaunchError(step, f"gcloud exited {result.returncode}: {_tail(result.stderr)}")
    if wait:  # the name is taken until the deletion completes
      deadline = time.monotonic() + self.create_timeout_s
      while (state := self.state(step)) is not None:
        if time.monotonic() > deadline:
          raise LaunchError(step, f"{self.tpu.name} is still {state} after "
                            f"{self.create_timeout_s:.0f}s")
        time.sleep(self.poll_s)
    self.exists = False
    return True

  def ensure_active(self, fresh: bool) -> None:
    """Makes the slice ACTIVE: reuses a live one unless `fresh`, replaces a broken one."""
    state = self.state()
    if state is not None:
      self.exists = True
    if state == launch_plan.ACTIVE and not fresh:
      _say(f"{self.tpu.name} is already ACTIVE; reusing it")
      return
    if state in launch_plan.PROVISIONING_STATES and not fresh:
      self._wait(lambda s: s == launch_plan.ACTIVE, "create", launch_plan.ACTIVE)
      return
    if state is not None:
      _say(f"{self.tpu.name} is {state}; deleting it to create it again")
      self.delete(wait=True, step="create")
    self.create()

  # --- install ---

  def stage(self) -> str:
    """Copies what `pip install` needs to LOGDIR/staging/bert_jax_upload; returns LOGDIR/staging."""
    staging = os.path.join(self.logdir, "staging")
    upload = os.path.join(staging, launch_plan.UPLOAD_DIR)
    if not os.path.isfile(os.path.join(self.source_dir, "setup.cfg")):
      raise LaunchError("upload", f"{self.source_dir!r} is not a bert_jax source tree "
                        "(no setup.cfg)")
    shutil.rmtree(upload, ignore_errors=True)
    os.makedirs(upload)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for entry in launch_plan.SOURCE_ENTRIES:
      source = os.path.join(self.source_dir, entry)
      if os.path.isdir(source):
        shutil.copytree(source, os.path.join(upload, entry), ignore=ignore)
      elif os.path.isfile(source):
        shutil.copy2(source, upload)
    return staging

  def install(self) -> None:
    """Uploads the source tree to every worker and installs it there."""
    self._gcloud(launch_plan.upload_command(self.tpu, self.stage()), "upload")
    self._gcloud(launch_plan.install_command(self.tpu), "install")

  # --- run ---

  def run_workers(self, args: list[str], attempt: int) -> tuple[list[int], dict[int, str]]:
    """Runs bert_jax.main on every worker at once; returns exit codes and each output's tail."""
    lock = threading.Lock()
    tails = {w: collections.deque(maxlen=3) for w in range(self.tpu.num_workers)}
    processes, threads, logs = [], [], []

    def pump(worker, process, log):
      for line in process.stdout:
        text = f"[worker {worker}] {line.rstrip()}"
        with lock:
          print(text, flush=True)
          log.write(text + "\n")
          log.flush()
        tails[worker].append(line.strip())

    try:
      for worker in range(self.tpu.num_workers):
        argv = launch_plan.run_command(self.tpu, worker, args)
        _say("$ " + shlex.join(argv))
        log = open(os.path.join(self.logdir, f"worker_{worker}.log"), "a", encoding="utf-8")
        logs.append(log)
        log.write(f"=== attempt {attempt}: {shlex.join(argv)}\n")
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", bufsize=1)
        processes.append(process)
        threads.append(threading.Thread(target=pump, args=(worker, process, log), daemon=True))
        threads[-1].start()
      codes = [process.wait() for process in processes]
      for thread in threads:
        thread.join()
    finally:
      for process in processes:  # only on an exception (Ctrl-C): leave no ssh behind
        if process.poll() is None:
          process.terminate()
      for log in logs:
        log.close()
    return codes, {w: " | ".join(t) for w, t in tails.items()}

  def run(self, args: list[str], max_relaunches: int, keep: bool) -> None:
    """Create, install, run on all workers, relaunch after preemptions, delete unless `keep`."""
    os.makedirs(self.logdir, exist_ok=True)
    _say(f"{self.tpu.name}: {self.tpu.accelerator_type}, {self.tpu.num_workers} workers; "
         f"logs in {self.logdir}")
    succeeded = False
    try:
      for attempt in range(max_relaunches + 1):
        self.ensure_active(fresh=attempt > 0)
        self.install()
        codes, tails = self.run_workers(args, attempt)
        if all(code == 0 for code in codes):
          _say(f"all {len(codes)} workers finished")
          succeeded = True
          return
        failed = [w for w, code in enumerate(codes) if code != 0]
        state = self.state("run")
        if (launch_plan.PREEMPTED_EXIT_CODE not in codes
            and state not in launch_plan.PREEMPTED_STATES):
          w = failed[0]
          raise LaunchError("run", f"worker {w} exited {codes[w]} (exit codes {codes}, slice "
                            f"{state or 'gone'}); its last lines: {tails[w] or '(none)'}")
        if attempt == max_relaunches:
          raise LaunchError("run", f"preempted again after {max_relaunches} relaunches "
                            "(--max_relaunches); the workdir holds the last checkpoint")
        _say(f"preempted (exit codes {codes}, slice {state or 'gone'}): "
             f"relaunch {attempt + 1} of at most {max_relaunches}")
    finally:
      if keep:
        _say(f"--keep: {self.tpu.name} is left running; delete it with --action=delete")
      elif self.exists:
        try:
          self.delete(wait=False)
        except LaunchError as e:
          if succeeded:
            raise
          _say(f"also: {e} (the slice may still exist)")


def plan(action: str, tpu: launch_plan.Slice, logdir: str, args: list[str],
         keep: bool) -> list[list[str]]:
  """The commands `action` runs on a slice that does not exist yet (for --dry_run)."""
  if action == "status":
    return [launch_plan.describe_command(tpu)]
  if action == "delete":
    return [launch_plan.delete_command(tpu)]
  return launch_plan.run_plan(tpu, os.path.join(logdir, "staging"), args, keep)


def parse_flags(argv: list[str]) -> list[str]:
  """absl parsing that passes every --config.X=V (and whatever follows `--`) on to bert_jax.main."""
  passthrough = [a for a in argv[1:] if a.startswith("--config.")]
  try:
    rest = flags.FLAGS([a for a in argv if not a.startswith("--config.")])
  except flags.Error as e:
    sys.exit(f"error: {e}\nPass --help for the flags.")
  return rest[:1] + passthrough + rest[1:]


def main(argv: list[str]) -> None:
  """Performs --action on the slice named by the flags."""
  extra = argv[1:]
  if stray := [a for a in extra if not a.startswith("--")]:
    sys.exit(f"error: unexpected arguments {stray}: give bert_jax.main's flags as --config.X=VALUE")
  missing = [f"--{f.name}" for f in (_NAME, _PROJECT, _ZONE) if not f.value]
  if _ACTION.value == "run":
    missing += [f"--{f.name}" for f in (_ACCELERATOR_TYPE, _CONFIG, _WORKDIR) if not f.value]
  if missing:
    sys.exit(f"error: --action={_ACTION.value} needs {', '.join(missing)}")
  if _ACTION.value == "run" and not _WORKDIR.value.startswith("gs://"):
    sys.exit(f"error: --workdir={_WORKDIR.value} must be a gs:// directory: every worker "
             "writes to it and a relaunched slice resumes from it")
  accelerator_type = _ACCELERATOR_TYPE.value or ""
  try:
    tpu = launch_plan.Slice(
        name=_NAME.value, project=_PROJECT.value, zone=_ZONE.value,
        accelerator_type=accelerator_type, spot=_SPOT.value,
        runtime_version=_RUNTIME_VERSION.value or (
            launch_plan.default_runtime_version(accelerator_type) if accelerator_type else ""),
        num_workers=_NUM_WORKERS.value or (
            launch_plan.num_workers(accelerator_type) if accelerator_type else 0))
  except ValueError as e:
    sys.exit(f"error: {e}")
  source_dir = _SOURCE_DIR.value or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  launcher = Launcher(tpu, source_dir=source_dir, poll_s=_POLL_S.value,
                      create_timeout_s=_CREATE_TIMEOUT_S.value,
                      logdir=_LOGDIR.value or os.path.join(tempfile.gettempdir(),
                                                           "bert_jax_launch", tpu.name))
  args = launch_plan.main_args(_CONFIG.value, _WORKDIR.value, extra)
  if _DRY_RUN.value:
    for command in plan(_ACTION.value, tpu, launcher.logdir, args, _KEEP.value):
      print(shlex.join(command))
    return
  try:
    if _ACTION.value == "status":
      print(f"{tpu.name}: {launcher.state() or 'not found'}")
    elif _ACTION.value == "delete":
      print(f"{tpu.name}: {'deleting' if launcher.delete(wait=False) else 'not found'}")
    else:
      launcher.run(args, _MAX_RELAUNCHES.value, _KEEP.value)
  except LaunchError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
