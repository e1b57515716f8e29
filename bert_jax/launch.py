r"""Runs bert_jax.main on a Cloud TPU VM slice, detached: create, install, start, watch, delete.

  python -m bert_jax.launch --name=bert-base --project=my-project --zone=us-central2-b \
    --accelerator_type=v4-32 --spot --config=experiments/configs/pretrain.py:base \
    --workdir=gs://my-bucket/bert-base --config.total_steps=100000

`--action=run` (the default):
  0. before any gcloud call, check the configuration compiles and fits the
     slice (bert_jax.preflight, unless --skip_preflight): a config that cannot
     run is refused before anything is read, created or paid for. A pass is
     remembered in LOGDIR/preflight_passed/ under a key of the config, its
     overrides, the accelerator type, the source tree and the jax/libtpu
     versions, so re-running the same command to attach does not compile again;
  1. look at the workdir's job record (WORKDIR/job_state.json, written by the
     job: bert_jax.job_state) and the queued resource: if this launch's job is
     running there (the slice ACTIVE, the record 'running' with a heartbeat
     younger than --stale_after_s), ATTACH to it (steps 5-6) and start nothing;
     if the record says 'done', only delete the slice;
  2. otherwise create the slice as a queued resource (reused if ACTIVE;
     `v5e-N` is sent as `v5litepod-N`; --autocheckpoint uses gcloud's alpha
     track for --autocheckpoint-enabled);
  3. upload this source tree to every worker and install it into a Python 3.11
     virtual environment (~/bert_jax_venv; Ubuntu 22.04's python3.11 package),
     printing each worker's Python, JAX version and devices;
  4. start `bert_jax.main --config=... --workdir=gs://... --config.distributed.enabled=True
     <every --config.X flag given here>` on every worker under `setsid nohup`, its
     output in ~/bert_jax_job.log there, with BERT_JAX_JOB_ID (tpu:PROJECT/ZONE/NAME,
     the same for every relaunch) and BERT_JAX_JOB_ATTEMPT (the start's Unix time,
     growing) in its environment. A worker whose previous job still runs keeps it
     (the launcher adopts it): one job at a time;
  5. watch: every --poll_s read the queued resource's state and the job record
     (each read retried with backoff), streaming worker 0's log meanwhile. A job
     that looks lost (slice not ACTIVE, record 'preempted', heartbeat stale, or no
     record after --start_timeout_s) is judged lost only when that lasts
     --preemption_window_s (and two reads): then restart it on the same slice if
     that is ACTIVE, else delete and re-create the slice, reinstall and start
     again; at most --max_relaunches times. Each start resumes from the workdir;
  6. delete the slice when the record says 'done' (not with --keep).
The launcher only starts, watches and restarts: losing contact (ssh exit 255, a
sleeping laptop, gcloud failing, the launcher killed or stopped with Ctrl-C)
never deletes anything. It exits saying how to re-attach: run the same command.
A failed job (record 'failed') stops the launcher with the log's last lines and
leaves the slice for inspection (`--action=logs`, then `--action=delete`).

`--action=status` prints the queued resource's state and the job record,
`--action=logs --worker=N` prints and follows worker N's job log,
`--action=delete` deletes the slice, `--dry_run` prints the gcloud commands of
the action and runs nothing. A failure stops with one line naming the step and
the tail of gcloud's stderr. Pieces: the commands in bert_jax/launch_plan.py,
state reads and the judgement in bert_jax/launch_state.py, starting and
watching in bert_jax/launch_attach.py, the preflight in bert_jax/preflight.py.
"""

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from bert_jax import launch_attach
from bert_jax import launch_plan
from bert_jax import launch_state
from bert_jax.launch_state import LaunchError, LostContact, say

_ACTION = flags.DEFINE_enum("action", "run", ["run", "status", "logs", "delete"],
                            "What to do with the slice.")
_NAME = flags.DEFINE_string("name", None, "Queued resource and TPU node name.")
_PROJECT = flags.DEFINE_string("project", None, "Google Cloud project.")
_ZONE = flags.DEFINE_string("zone", None, "Zone of the slice, e.g. us-central2-b.")
_ACCELERATOR_TYPE = flags.DEFINE_string("accelerator_type", None,
                                        "e.g. v4-32, v5litepod-16 (v5e-16 is accepted), v6e-64.")
_RUNTIME_VERSION = flags.DEFINE_string("runtime_version", "",
                                       "TPU VM image; '' -> the generation's default.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 0,
                                    "VMs in the slice; 0 -> from the accelerator type.")
_SPOT = flags.DEFINE_bool("spot", False, "Ask for spot capacity (cheaper, preemptible).")
_AUTOCHECKPOINT = flags.DEFINE_bool(
    "autocheckpoint", False, "Create with --autocheckpoint-enabled (gcloud alpha track): the "
    "job is signalled to save before a maintenance event.")
_CONFIG = flags.DEFINE_string("config", None, "bert_jax.main's --config, e.g. "
                              "experiments/configs/pretrain.py:base (a path in this source tree).")
_WORKDIR = flags.DEFINE_string("workdir", None, "bert_jax.main's --workdir: a gs:// directory "
                               "(every worker and every relaunch must see it).")
_MAX_RELAUNCHES = flags.DEFINE_integer("max_relaunches", 10,
                                       "Restarts after the job was lost (preemption, maintenance).")
_KEEP = flags.DEFINE_bool("keep", False, "Leave the slice running when the job is done.")
_SKIP_PREFLIGHT = flags.DEFINE_bool("skip_preflight", False, "Create the slice without first "
                                    "compiling the train step for it (bert_jax.preflight).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the gcloud commands; run nothing.")
_LOGDIR = flags.DEFINE_string("logdir", "", "Local directory for worker_0.log and the upload "
                              "staging; '' -> $TMPDIR/bert_jax_launch/NAME.")
_SOURCE_DIR = flags.DEFINE_string("source_dir", "", "Source tree to install; '' -> this checkout.")
_WORKER = flags.DEFINE_integer("worker", 0, "--action=logs: whose log.")
_FOLLOW = flags.DEFINE_bool("follow", True, "--action=logs: keep printing new lines.")
_FOLLOW_LOGS = flags.DEFINE_bool("follow_logs", True, "While watching, stream worker 0's log.")
_POLL_S = flags.DEFINE_float("poll_s", 30.0, "Seconds between looks at the slice and the job.")
_RETRY_S = flags.DEFINE_float("retry_s", 5.0, "First backoff of a failed state read (doubling, "
                              "5 tries; then the launcher exits, leaving the job be).")
_PREEMPTION_WINDOW_S = flags.DEFINE_float(
    "preemption_window_s", 180.0, "How long a lost-looking job must stay so before a relaunch.")
_STALE_AFTER_S = flags.DEFINE_float(
    "stale_after_s", 600.0, "A 'running' record whose heartbeat is older is a job that is gone "
    "(the job rewrites it every minute).")
_START_TIMEOUT_S = flags.DEFINE_float(
    "start_timeout_s", 1800.0, "How long a started job may take to write its 'running' record.")
_CREATE_TIMEOUT_S = flags.DEFINE_float("create_timeout_s", 4 * 3600.0,
                                       "Give up if the slice is not ACTIVE after this long.")


def _how_to(tpu: launch_plan.Slice) -> str:
  where = f"--name={tpu.name} --project={tpu.project} --zone={tpu.zone}"
  return (f"re-run the same command to attach; `python -m bert_jax.launch {where} "
          "--action=logs` shows the log, `--action=delete` deletes the slice")


class Launcher:
  """Drives one slice and its detached job through gcloud; every command comes from launch_plan."""

  def __init__(self, tpu: launch_plan.Slice, *, workdir: str, logdir: str, source_dir: str,
               poll_s: float, retry_s: float, create_timeout_s: float,
               judge: launch_state.Judge, follow_logs: bool = True):
    self.tpu, self.workdir, self.logdir, self.source_dir = tpu, workdir, logdir, source_dir
    self.poll_s, self.create_timeout_s, self.judge = poll_s, create_timeout_s, judge
    self.follow_logs = follow_logs
    self.gcloud = launch_state.Gcloud(retry_s)
    self.reader = launch_state.Reader(self.gcloud, tpu, workdir)
    self.last_attempt = 0

  # --- the slice ---

  def _wait_active(self, step: str) -> None:
    """Polls until ACTIVE; a FAILED/SUSPENDED state or the deadline on the way is an error."""
    deadline = time.monotonic() + self.create_timeout_s
    while (state := self.reader.slice_state(step)) != launch_plan.ACTIVE:
      if state is None or state in launch_plan.FAILED_STATES + launch_plan.PREEMPTED_STATES:
        raise LaunchError(step, f"queued resource {self.tpu.name} is {state or 'gone'} while "
                          f"waiting for it to be {launch_plan.ACTIVE}")
      if time.monotonic() > deadline:
        raise LaunchError(step, f"queued resource {self.tpu.name} is still {state} after "
                          f"{self.create_timeout_s:.0f}s (--create_timeout_s)")
      say(f"{self.tpu.name} is {state}; waiting for {launch_plan.ACTIVE}")
      time.sleep(self.poll_s)

  def create(self) -> None:
    """Queues the slice and waits until it is ACTIVE."""
    self.gcloud.run(launch_plan.create_command(self.tpu), "create")
    self._wait_active("create")

  def delete(self, wait: bool, step: str = "delete") -> bool:
    """Deletes the slice (and waits until it is gone); False if there was none."""
    result = self.gcloud.run(launch_plan.delete_command(self.tpu), step, check=False)
    if result.returncode and "NOT_FOUND" in result.stderr:
      return False
    if result.returncode:
      raise LaunchError(step, f"gcloud exited {result.returncode}: "
                        f"{launch_state.tail(result.stderr)}")
    if wait:  # the name is taken until the deletion completes
      deadline = time.monotonic() + self.create_timeout_s
      while (state := self.reader.slice_state(step)) is not None:
        if time.monotonic() > deadline:
          raise LaunchError(step, f"{self.tpu.name} is still {state} after "
                            f"{self.create_timeout_s:.0f}s")
        time.sleep(self.poll_s)
    return True

  def ensure_active(self, state: "str | None") -> None:
    """Makes the slice ACTIVE from `state`: reuses or awaits a live one, replaces a broken one."""
    if state == launch_plan.ACTIVE:
      say(f"{self.tpu.name} is already ACTIVE; reusing it")
      return
    if state in launch_plan.PROVISIONING_STATES:
      self._wait_active("create")
      return
    if state is not None:
      say(f"{self.tpu.name} is {state}; deleting it to create it again")
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

  def install(self, tries: int = 3) -> None:
    """Uploads the source tree to every worker and installs it there (retried: a PyPI or
    apt hiccup, or a lost ssh, is not the end of the launch)."""
    staging = self.stage()
    for attempt in range(tries):
      try:
        self.gcloud.run(launch_plan.upload_command(self.tpu, staging), "upload")
        result = self.gcloud.run(launch_plan.install_command(self.tpu), "install")
        for line in result.stdout.splitlines():  # each worker's Python, JAX and devices
          if line.strip():
            say(f"install: {line.strip()}")
        return
      except LaunchError as e:
        if attempt + 1 == tries:
          raise
        say(f"{e}; trying again ({attempt + 2} of {tries})")
        time.sleep(self.gcloud.retry_s * 2 ** attempt)

  # --- the job ---

  def start(self, args: list[str], replace: bool = False) -> int:
    """Starts a new attempt (or adopts a running one unless `replace`); the judge watches it."""
    # The start's Unix time: it grows across relaunches and across launcher runs alike.
    attempt = max(int(time.time()), self.last_attempt + 1)
    attempt = launch_attach.start(self.gcloud, self.tpu, attempt, args, replace)
    self.last_attempt = attempt
    self.judge.watch(attempt, time.time())
    return attempt

  def _failure_tail(self) -> str:
    result = self.gcloud.run(launch_plan.logs_command(self.tpu, 0, lines=5, follow=False),
                             "logs", check=False, echo=False)
    return launch_state.tail(result.stdout) if not result.returncode else "(log unreachable)"

  def finish(self, keep: bool) -> None:
    """The job is done: deletes the slice unless `keep`."""
    if keep:
      say(f"--keep: {self.tpu.name} is left running; delete it with --action=delete")
    elif self.delete(wait=False):
      say(f"{self.tpu.name} is being deleted")

  def run(self, args: list[str], max_relaunches: int, keep: bool, preflight=None) -> None:
    """Attaches to this launch's live job, or brings the slice up and starts it; then watches,
    relaunches a lost job, and deletes the slice when the workdir says done.

    `preflight` (the config fits the slice, or LaunchError) runs first, before any
    gcloud call: deciding whether a job is live takes gcloud reads, and a config
    that cannot fit must be refused before any of them (it would be refused
    anyway before a create). A re-run that attaches finds its pass remembered
    (see _preflight), so attaching is not held up by a compile.
    """
    os.makedirs(self.logdir, exist_ok=True)
    say(f"{self.tpu.name}: {self.tpu.accelerator_type}, {self.tpu.num_workers} workers; "
        f"job {self.tpu.job_id}; local log copy in {self.logdir}")
    if preflight is not None:
      preflight()
    job, state = self.reader.job(), self.reader.slice_state()
    if job is not None and job["state"] == "done":
      say(f"the workdir says the job is done ({launch_state.describe_job(job, time.time())})")
      if state is not None:
        self.finish(keep)
      return
    live = (state == launch_plan.ACTIVE and job is not None and job["state"] == "running"
            and time.time() - float(job.get("time", 0)) < self.judge.stale_after_s)
    if live:
      say(f"attaching to the running job ({launch_state.describe_job(job, time.time())})")
      self.last_attempt = int(job["attempt"])
      self.judge.watch(self.last_attempt, time.time())
    else:
      self.ensure_active(state)
      self.install()
      self.start(args)
    follower = launch_attach.LogFollower(self.tpu, self.logdir) if self.follow_logs else None
    relaunches = 0
    try:
      while True:
        verdict, obs = launch_attach.watch(self.reader, self.judge, self.poll_s, follower)
        if verdict == launch_state.DONE:
          say("the job is done")
          self.finish(keep)
          return
        if verdict == launch_state.FAILED:
          raise LaunchError("run", f"the job failed (exit code {obs.job.get('exit_code')} on "
                            f"{obs.job.get('host')}); worker 0's last lines: "
                            f"{self._failure_tail()}; the slice is left for inspection: "
                            + _how_to(self.tpu).split("; ", 1)[1])
        if relaunches == max_relaunches:
          raise LaunchError("run", f"the job was lost again after {max_relaunches} relaunches "
                            "(--max_relaunches); the workdir holds the last checkpoint")
        relaunches += 1
        here = verdict == launch_state.RESTART
        say(f"the job is gone (slice {obs.slice_state or 'gone'}, "
            f"{launch_state.describe_job(obs.job, obs.time)}): relaunch {relaunches} of at most "
            f"{max_relaunches}, {'on the same slice' if here else 'on a new slice'}")
        if here:
          try:
            self.start(args, replace=True)
            continue
          except LaunchError as e:  # the tree or environment went with a maintenance reboot
            say(f"{e}; reinstalling")
        else:
          self.ensure_active(obs.slice_state)
        self.install()
        self.start(args, replace=True)
    finally:
      if follower is not None:
        follower.close()


def plan(action: str, tpu: launch_plan.Slice, logdir: str, workdir: str, args: list[str],
         keep: bool, worker: int, follow: bool) -> list[list[str]]:
  """The commands `action` runs when no job ran yet, the slice does not exist and comes
  up at once, and the job is done at the first look (for --dry_run)."""
  if action == "status":
    return [launch_plan.describe_command(tpu), launch_plan.job_state_command(workdir)]
  if action == "delete":
    return [launch_plan.delete_command(tpu)]
  if action == "logs":
    return [launch_plan.logs_command(tpu, worker, lines=200, follow=follow)]
  return launch_plan.run_plan(tpu, os.path.join(logdir, "staging"), workdir,
                              int(time.time()), args, keep)


# What the compiled step depends on besides the flags: the code and the compiler.
_PREFLIGHT_SOURCES = ("bert_jax", os.path.join("experiments", "configs"))
_PREFLIGHT_PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax")


def preflight_key(config: str, overrides: list[str], accelerator_type: str,
                  source_dir: str) -> str:
  """A digest of what a preflight's verdict depends on: the config argument and its file,
  the overrides, the accelerator type, every .py of the source tree's bert_jax/ and
  experiments/configs/, and the installed jax, jaxlib, libtpu, flax and optax."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()

  def version(package: str) -> str:
    try:
      return metadata.version(package)
    except metadata.PackageNotFoundError:
      return ""

  digest.update(json.dumps([config, overrides, accelerator_type,
                            [version(p) for p in _PREFLIGHT_PACKAGES]]).encode())
  files = [config.split(":", 1)[0]]
  for top in _PREFLIGHT_SOURCES:
    for root, _, names in sorted(os.walk(os.path.join(source_dir, top))):
      files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
  for path in files:
    if os.path.isfile(path):
      digest.update(os.path.relpath(path, source_dir).encode())
      with open(path, "rb") as f:
        digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()[:16]


def _preflight(config: str, overrides: list[str], accelerator_type: str, logdir: str,
               source_dir: str) -> None:
  """bert_jax.preflight: compile the train step for the slice before paying for it.

  A pass is written to LOGDIR/preflight_passed/KEY.txt (preflight_key) and not
  compiled again: re-running the launch command to attach to a live job (after
  a laptop slept, say) must not wait minutes for a compile it already passed.
  A refusal is never remembered.
  """
  passed = os.path.join(logdir, "preflight_passed",
                        preflight_key(config, overrides, accelerator_type, source_dir) + ".txt")
  if os.path.isfile(passed):
    say(f"preflight: {config} passed for {accelerator_type} before, with this source tree and "
        f"these flags ({passed}); not compiled again")
    return
  from bert_jax import preflight  # pylint: disable=g-import-not-at-top  # pulls in JAX and libtpu
  say(f"preflight: compiling {config} for {accelerator_type} (--skip_preflight skips this)")
  try:
    report = preflight.check_launch(config, overrides, accelerator_type)
  except preflight.PreflightError as e:
    raise LaunchError("preflight", str(e)) from e
  for line in str(report).splitlines():
    say(f"preflight: {line}")
  os.makedirs(os.path.dirname(passed), exist_ok=True)
  with open(passed, "w") as f:
    f.write(str(report) + "\n")


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
  workdir = _WORKDIR.value or ""
  if workdir and not workdir.startswith("gs://"):
    sys.exit(f"error: --workdir={workdir} must be a gs:// directory: every worker "
             "writes to it and a relaunched slice resumes from it")
  # gcloud knows v5e slices as v5litepod-N only; translated before anything reaches it.
  accelerator_type = launch_plan.canonical_accelerator_type(_ACCELERATOR_TYPE.value or "")
  try:
    tpu = launch_plan.Slice(
        name=_NAME.value, project=_PROJECT.value, zone=_ZONE.value,
        accelerator_type=accelerator_type, spot=_SPOT.value, autocheckpoint=_AUTOCHECKPOINT.value,
        runtime_version=_RUNTIME_VERSION.value or (
            launch_plan.default_runtime_version(accelerator_type) if accelerator_type else ""),
        num_workers=_NUM_WORKERS.value or (
            launch_plan.num_workers(accelerator_type) if accelerator_type else 0))
  except ValueError as e:
    sys.exit(f"error: {e}")
  source_dir = _SOURCE_DIR.value or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  judge = launch_state.Judge(window_s=_PREEMPTION_WINDOW_S.value,
                             stale_after_s=_STALE_AFTER_S.value,
                             start_timeout_s=_START_TIMEOUT_S.value)
  launcher = Launcher(tpu, workdir=workdir, source_dir=source_dir, poll_s=_POLL_S.value,
                      retry_s=_RETRY_S.value, create_timeout_s=_CREATE_TIMEOUT_S.value,
                      judge=judge, follow_logs=_FOLLOW_LOGS.value,
                      logdir=_LOGDIR.value or os.path.join(tempfile.gettempdir(),
                                                           "bert_jax_launch", tpu.name))
  args = launch_plan.main_args(_CONFIG.value, workdir, extra)
  if _DRY_RUN.value:
    for command in plan(_ACTION.value, tpu, launcher.logdir, workdir, args, _KEEP.value,
                        _WORKER.value, _FOLLOW.value):
      print(shlex.join(command))
    return
  overrides = [a for a in extra if a.startswith("--config.")]
  preflight = None if _SKIP_PREFLIGHT.value else (
      lambda: _preflight(_CONFIG.value, overrides, accelerator_type, launcher.logdir, source_dir))
  try:
    if _ACTION.value == "status":
      print(f"{tpu.name}: {launcher.reader.slice_state() or 'not found'}")
      if workdir:
        print(f"job: {launch_state.describe_job(launcher.reader.job(), time.time())}")
    elif _ACTION.value == "logs":
      sys.exit(subprocess.call(launch_plan.logs_command(tpu, _WORKER.value, lines=200,
                                                        follow=_FOLLOW.value)))
    elif _ACTION.value == "delete":
      print(f"{tpu.name}: {'deleting' if launcher.delete(wait=False) else 'not found'}")
    else:
      launcher.run(args, _MAX_RELAUNCHES.value, _KEEP.value, preflight)
  except LostContact as e:
    sys.exit(f"error: {e}. Nothing was deleted and the job (if started) keeps running; "
             + _how_to(tpu))
  except LaunchError as e:
    sys.exit(f"error: {e}")
  except KeyboardInterrupt:
    sys.exit(f"\n[launch] stopped watching; nothing was deleted and the job keeps running: "
             + _how_to(tpu))


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
