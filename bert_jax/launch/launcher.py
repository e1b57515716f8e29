"""The launcher's driver: one slice and its detached job, brought up, watched, relaunched, deleted.

`Launcher` runs the steps of `python -m bert_jax.launch --action=run`
(bert_jax/launch/__main__.py says them in order) through gcloud, every command
from bert_jax.launch.plan; `plan` lists them for --dry_run. `preflight` runs
`python -m bert_jax.preflight` in a child process before any gcloud call and
remembers a pass (bert_jax.preflight.cache): the launcher itself never imports JAX, so
it starts in a second and runs where only the launcher's light dependencies are.
"""

import os
import subprocess
import sys
import time

from bert_jax.launch import artifact as launch_artifact
from bert_jax.launch import attach as launch_attach
from bert_jax.launch import plan as launch_plan
from bert_jax.launch import state as launch_state
from bert_jax.launch.state import LaunchError, say
from bert_jax.preflight import cache as preflight_cache


# The watch's defaults: bert_jax.launch's flags and experiments.ablation --launch's (which
# drives one Launcher per run) both take them from here.
MAX_RELAUNCHES = 10  # restarts after the job was lost (preemption, maintenance)
POLL_S = 30.0  # seconds between looks at the slice and the job
RETRY_S = 5.0  # first backoff of a failed state read (doubling, 5 tries)
PREEMPTION_WINDOW_S = 180.0  # how long a lost-looking job must stay so before a relaunch
STALE_AFTER_S = 600.0  # a 'running' record with an older heartbeat is a job that is gone
START_TIMEOUT_S = 1800.0  # how long a started job may take to write its 'running' record
CREATE_TIMEOUT_S = 4 * 3600.0  # give up if the slice is not ACTIVE after this long


def how_to(tpu: launch_plan.Slice) -> str:
  """What to do after the launcher stopped: re-run to attach, and the logs and delete actions."""
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
    # What this run did, for `aftermath`: a job started or attached to, a slice made or removed.
    self.job_known = self.created = self.deleted = False

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
    self.created = True
    self._wait_active("create")

  def delete(self, wait: bool, step: str = "delete") -> bool:
    """Deletes the slice (and waits until it is gone); False if there was none."""
    result = self.gcloud.run(launch_plan.delete_command(self.tpu), step, check=False)
    if result.returncode and "NOT_FOUND" in result.stderr:
      return False
    if result.returncode:
      raise LaunchError(step, f"gcloud exited {result.returncode}: "
                        f"{launch_state.tail(result.stderr)}")
    self.deleted = True
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
    """Builds the project's sdist into LOGDIR/staging/bert_jax_upload (launch.artifact);
    returns LOGDIR/staging."""
    staging = os.path.join(self.logdir, "staging")
    try:
      built = launch_artifact.build(self.source_dir, os.path.join(staging, launch_plan.UPLOAD_DIR))
    except launch_artifact.BuildError as e:
      raise LaunchError("upload", str(e)) from e
    say(f"upload: {os.path.basename(built)} ({', '.join(launch_artifact.top_level(built))})")
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
    self.last_attempt, self.job_known = attempt, True
    self.judge.watch(attempt, time.time())
    return attempt

  def _failure_tail(self) -> str:
    result = self.gcloud.run(launch_plan.logs_command(self.tpu, 0, lines=5, follow=False),
                             "logs", check=False, echo=False)
    return launch_state.tail(result.stdout) if not result.returncode else "(log unreachable)"

  def _adopt(self, job: dict, state: "str | None") -> None:
    """Watches the attempt a 'running' record names, whatever the slice read says.

    One read decides nothing here either: the first look goes to the judge like
    every later one, so a slice that reads FAILED or SUSPENDING once, or a stale
    heartbeat, is deleted, re-created or restarted only once it has lasted
    --preemption_window_s (and two reads), exactly as in the watch. A re-run
    after a laptop slept therefore attaches to a job whose heartbeat is fresh.
    """
    now = time.time()
    fresh = now - float(job.get("time", 0)) < self.judge.stale_after_s
    doubt = [f"the slice reads {state or 'gone'}"] if state != launch_plan.ACTIVE else []
    doubt += [] if fresh else ["its heartbeat is stale"]
    self.last_attempt = int(job["attempt"])
    self.job_known = True
    self.judge.watch(self.last_attempt, now)
    self.judge.verdict(launch_state.Observation(state, job, now))  # the window starts here
    if not doubt:
      say(f"attaching to the running job ({launch_state.describe_job(job, now)})")
      return
    say(f"attaching to the job ({launch_state.describe_job(job, now)}); "
        f"{' and '.join(doubt)}: nothing is deleted or restarted unless that lasts "
        f"{self.judge.window_s:g}s (--preemption_window_s) and {self.judge.min_reads} reads")

  def aftermath(self) -> str:
    """What this launcher run leaves behind when it stops early (gcloud unreachable or not
    authorized, Ctrl-C), for its last line; it never deletes anything then."""
    if self.job_known:
      return "nothing was deleted and the job keeps running: " + how_to(self.tpu)
    deleted = (f"; it deleted the broken slice {self.tpu.name} to create it again"
               if self.deleted else "")
    if self.created:
      return (f"this launch created the slice {self.tpu.name} and started no job on it{deleted}; "
              "the slice is left as it is and is billed while it exists: re-run the same "
              "command to install and start the job, or `--action=delete` deletes it")
    return (f"this launch created nothing and started no job{deleted or ' (nothing was deleted)'}"
            "; re-run the same command to go on")

  def _after_start_failure(self, keep: bool) -> str:
    """Deletes the slice of a job that died at its start (unless `keep`); says what was done."""
    if keep:
      return f"the slice {self.tpu.name} is left running (--keep): " + how_to(self.tpu)
    try:
      deleted = self.delete(wait=False, step="start")
    except LaunchError as e:
      return f"deleting the slice failed ({e}): delete it with --action=delete"
    return (f"the slice {self.tpu.name} is being deleted" if deleted
            else f"the slice {self.tpu.name} is gone")

  def finish(self, keep: bool) -> None:
    """The job is done: deletes the slice unless `keep`."""
    if keep:
      say(f"--keep: {self.tpu.name} is left running; delete it with --action=delete")
    elif self.delete(wait=False):
      say(f"{self.tpu.name} is being deleted")

  def run(self, args: list[str], max_relaunches: int, keep: bool, preflight=None,
          replace: bool = False) -> None:
    """Attaches to this launch's live job, or brings the slice up and starts it; then watches,
    relaunches a lost job, and deletes the slice when the workdir says done.

    A 'running' record of this launch's job is adopted whatever the first look at
    the slice says (_adopt): from there on the judge decides, the first look
    included, so nothing is deleted or restarted on one read. Without one (no
    record, or the job's own final word: preempted, failed) there is no job to
    keep: a slice that is FAILED or SUSPENDED is replaced, a live one reused.

    `preflight` (the config fits the slice, or LaunchError) runs first, before any
    gcloud call: deciding whether a job is live takes gcloud reads, and a config
    that cannot fit must be refused before any of them (it would be refused
    anyway before a create). A re-run that attaches finds its pass remembered
    (see _preflight), so attaching is not held up by a compile.

    `replace`: the caller knows no job of its own is live on the slice (a grid's new
    attempt after a failed one, or the next run on a shared slice), so a process still
    running there -- the failed attempt exiting or hung, the previous run's -- is ended
    before the start instead of adopted (a record saying running is still attached to).
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
    if job is not None and job["state"] == "running":
      self._adopt(job, state)
    else:
      self.ensure_active(state)
      self.install()
      self.start(args, replace=replace)
    follower = launch_attach.LogFollower(self.tpu, self.logdir) if self.follow_logs else None
    relaunches = 0
    try:
      while True:
        try:
          verdict, obs = launch_attach.watch(self.reader, self.judge, self.poll_s, follower)
        except launch_state.StartFailed as e:
          raise launch_state.StartFailed("start", f"{str(e).split(': ', 1)[1]}; "
                                         + self._after_start_failure(keep)) from e
        if verdict == launch_state.DONE:
          say("the job is done")
          self.finish(keep)
          return
        if verdict == launch_state.FAILED:
          raise LaunchError("run", f"the job failed (exit code {obs.job.get('exit_code')} on "
                            f"{obs.job.get('host')}); worker 0's last lines: "
                            f"{self._failure_tail()}; the slice is left for inspection: "
                            + how_to(self.tpu).split("; ", 1)[1])
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


# The source tree this launcher runs from (the directory holding bert_jax/).
SOURCE_ROOT = preflight_cache.SOURCE_ROOT


def run_preflight(config: str, overrides: list[str], accelerator_type: str) -> str:
  """`python -m bert_jax.preflight` for the slice, in a child process; its summary when it fits.

  A child, not an import: the preflight pulls in JAX, libtpu and TensorFlow (the
  trainer's checks), which the launcher never needs otherwise. The child runs
  this source tree's bert_jax (first on its path) in this working directory (the
  config's path is relative to it), with this environment.

  Raises:
    LaunchError: the preflight's refusal (its last line: the phase, the GiB needed
      and available, the cheapest fix), or how the child ended when it said nothing.
  """
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [SOURCE_ROOT] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]))
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.preflight", f"--config={config}",
       f"--topology={accelerator_type}", "--no_cache", *overrides],
      capture_output=True, text=True, env=env, check=False)
  if result.returncode:
    for line in result.stdout.splitlines():  # the summary, when the phases were compiled
      say(f"preflight: {line}")
    lines = result.stderr.strip().splitlines()
    last = lines[-1] if lines else f"exited {result.returncode} without a word"
    raise LaunchError("preflight", last.removeprefix("preflight: "))
  return result.stdout.strip()


def store_status(config: str, overrides: list[str], num_workers: int) -> str:
  """One line on the tokenized store the run will read (data_pipeline.store.token_store, in a
  child process like the preflight: it reads the config, not JAX): prepared, not yet,
  or out of sight from here. Never a refusal: a run without a store makes one."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [SOURCE_ROOT] + [p for p in [os.environ.get("PYTHONPATH", "")] if p]))
  result = subprocess.run(
      [sys.executable, "-m", "data_pipeline.store.token_store", f"--config={config}",
       f"--process_count={num_workers}", *[o for o in overrides if o.startswith("--config.")]],
      capture_output=True, text=True, env=env, check=False)
  lines = (result.stdout if not result.returncode else result.stderr).strip().splitlines()
  return lines[-1] if lines else f"tokenized store: not checked (exit {result.returncode})"


def preflight(config: str, overrides: list[str], accelerator_type: str,
              source_dir: str) -> None:
  """bert_jax.preflight: compile the train step for the slice before paying for it.

  A pass is remembered in the preflight's own cache (bert_jax.preflight.cache: keyed by
  config, flags, slice, source tree, versions and compiler flags, in
  preflight_cache.default_dir()) and not compiled
  again, whether `python -m bert_jax.preflight` or a launch passed it: re-running the
  launch command to attach to a live job (after a laptop slept, say) must not wait
  minutes for a compile it already passed. A refusal is never remembered.
  """
  directory = preflight_cache.default_dir()
  digest = preflight_cache.key(config, overrides, accelerator_type, source_dir)
  if preflight_cache.lookup(directory, digest) is not None:
    say("preflight: " + preflight_cache.remembered(config, accelerator_type, directory, digest))
    return
  say(f"preflight: compiling {config} for {accelerator_type} (--skip_preflight skips this)")
  report = run_preflight(config, overrides, accelerator_type)
  for line in report.splitlines():
    say(f"preflight: {line}")
  preflight_cache.remember(directory, digest, report)
