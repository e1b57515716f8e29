"""What bert_jax.launch knows about a slice and its job: gcloud calls, retried reads, judgement.

Two states are read, each with gcloud and each retried with backoff (one failed
read is a hiccup, not news):
  * the queued resource's state (`describe`), None when it does not exist;
  * the job's record in the workdir (`gcloud storage cat WORKDIR/job_state.json`,
    written by the job itself: bert_jax.run.job_state), None when there is none.

Judge turns a stream of both into one verdict. A job's own final word (done,
failed) is taken at once; anything that looks like a lost job (the slice not
ACTIVE, the job preempted, its heartbeat stale, or never started) must hold
for --preemption_window_s and at least two reads before it counts, so one odd
read (a FAILED or SUSPENDED blip, a maintenance event the slice rides out)
never relaunches anything.
"""

import dataclasses
import shlex
import subprocess
import threading
import time

from bert_jax.launch import plan as launch_plan

# Verdicts of Judge.verdict.
RUNNING, STARTING, DONE, FAILED, WAIT = "running", "starting", "done", "failed", "wait"
RESTART, RECREATE = "restart", "recreate"  # the job is gone: start it again here / on a new slice
# gcloud's words for "there is no such thing" (a queued resource, an object).
_MISSING = ("NOT_FOUND", "matched no objects", "No URLs matched")


class LaunchError(Exception):
  """A step of the launch failed; str() is the one line the user sees."""

  def __init__(self, step: str, detail: str):
    super().__init__(f"launch failed at step '{step}': {detail}")
    self.step = step


class LostContact(LaunchError):
  """gcloud could not be reached for a while; the slice and its job are left as they are."""


class StartFailed(LaunchError):
  """The job ended before it wrote its first record (an import error, a refusal of its input):
  the same start would end the same way, so it is reported, never relaunched."""


class NotAuthorized(LostContact):
  """gcloud is not logged in, or the account may not do this: no retry can help, so the
  launcher stops at once (leaving the slice and its job as they are), gcloud's hint kept."""


# What gcloud says when its account cannot act: no credentials, expired ones, no permission.
_UNAUTHORIZED = ("gcloud auth login", "gcloud auth application-default login",
                 "do not currently have an active account", "refreshing your current auth tokens",
                 "Reauthentication failed", "PERMISSION_DENIED", "UNAUTHENTICATED",
                 "does not have permission", "HTTPError 401", "HTTPError 403")


def refuse_unauthorized(step: str, stderr: str) -> None:
  """Raises NotAuthorized when gcloud's `stderr` is an authentication or permission error,
  with all of gcloud's message on one line (its `$ gcloud auth login` hint included)."""
  if not any(marker.lower() in stderr.lower() for marker in _UNAUTHORIZED):
    return
  message = " ".join(line.strip() for line in stderr.splitlines() if line.strip())
  raise NotAuthorized(step, f"gcloud is not authorized (not retried): {message[:800]}")


def tail(text: str, lines: int = 3, chars: int = 500) -> str:
  """The last non-empty lines of a command's output, joined into one line."""
  kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
  return " | ".join(kept)[-chars:] or "(no output)"


_THREAD = threading.local()  # what say() tags this thread's lines with (tag_thread)


def say(message: str) -> None:
  """One line of the launcher's own output: [launch] MESSAGE, or [launch TAG] MESSAGE in a
  thread tagged by tag_thread."""
  tag = getattr(_THREAD, "tag", "")
  print(f"[launch{' ' + tag if tag else ''}] {message}", flush=True)


def tag_thread(tag: str) -> None:
  """Tags every later say() line of this thread with `tag`: a grid of runs
  (experiments.ablation --launch) drives one launch per thread, their lines interleaved."""
  _THREAD.tag = tag


class Gcloud:
  """Runs gcloud; reads are retried with exponential backoff from `retry_s`."""

  def __init__(self, retry_s: float, tries: int = 5):
    self.retry_s, self.tries = retry_s, tries

  def run(self, argv: list[str], step: str, check: bool = True,
          echo: bool = True) -> subprocess.CompletedProcess:
    """Runs one command; with `check`, a non-zero exit is a LaunchError naming `step`; an
    authentication or permission error is NotAuthorized whether or not `check`."""
    if echo:
      say("$ " + shlex.join(argv))
    try:
      result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
      raise LaunchError(step, f"{argv[0]} not found on PATH (install the Google Cloud CLI)") from e
    if result.returncode:
      refuse_unauthorized(step, result.stderr)
    if check and result.returncode:
      raise LaunchError(step, f"gcloud exited {result.returncode}: "
                        f"{tail(result.stderr or result.stdout)}")
    return result

  def read(self, argv: list[str], step: str) -> "str | None":
    """stdout of a read-only command, None if gcloud says the thing does not exist.

    Raises:
      LostContact: after `tries` failures in a row (with backoff in between).
      NotAuthorized: at the first authentication or permission error (Gcloud.run).
    """
    for attempt in range(self.tries):
      result = self.run(argv, step, check=False, echo=False)
      if not result.returncode:
        return result.stdout
      if any(marker in result.stderr for marker in _MISSING):
        return None
      if attempt + 1 < self.tries:
        delay = self.retry_s * 2 ** attempt
        say(f"{step}: gcloud exited {result.returncode} ({tail(result.stderr, 1)}); "
            f"retrying in {delay:.0f}s")
        time.sleep(delay)
    raise LostContact(step, f"gcloud failed {self.tries} times in a row: "
                      f"{tail(result.stderr or result.stdout)}")


@dataclasses.dataclass(frozen=True)
class Observation:
  """One look at the slice and the job."""
  slice_state: "str | None"
  job: "dict | None"  # the workdir's job_state.json record
  time: float


class Reader:
  """Reads the two states of one launch."""

  def __init__(self, gcloud: Gcloud, tpu: launch_plan.Slice, workdir: str):
    self.gcloud, self.tpu, self.workdir = gcloud, tpu, workdir

  def slice_state(self, step: str = "describe") -> "str | None":
    """The queued resource's state, or None when it does not exist."""
    out = self.gcloud.read(launch_plan.describe_command(self.tpu), step)
    return None if out is None else out.strip()

  def job(self, step: str = "job state") -> "dict | None":
    """The workdir's job record (another launch's counts as none), or None."""
    from bert_jax.run import job_state  # pylint: disable=g-import-not-at-top  # pulls in paths/etils
    if not self.workdir:
      return None
    out = self.gcloud.read(launch_plan.job_state_command(self.workdir), step)
    record = job_state.parse(out) if out else None
    if record is not None and record.get("job_id") != self.tpu.job_id:
      return None  # written by a launch of another slice name: not ours to judge
    return record

  def observe(self) -> Observation:
    """Both states, now."""
    return Observation(self.slice_state(), self.job(), time.time())


def describe_job(job: "dict | None", now: float) -> str:
  """A short phrase for a record, e.g. 'running (attempt 3 on host-0, heartbeat 12s ago)'."""
  if job is None:
    return "no job record"
  age = now - float(job.get("time", 0))
  detail = f"attempt {job.get('attempt')} on {job.get('host')}, "
  if job["state"] == "running":
    return f"running ({detail}heartbeat {age:.0f}s ago)"
  return f"{job['state']} ({detail}exit code {job.get('exit_code')}, {age:.0f}s ago)"


class Judge:
  """Decides, over a window of observations, what became of the attempt being watched."""

  def __init__(self, window_s: float, stale_after_s: float, start_timeout_s: float,
               min_reads: int = 2):
    self.window_s, self.stale_after_s = window_s, stale_after_s
    self.start_timeout_s, self.min_reads = start_timeout_s, min_reads
    self.attempt: "int | None" = None
    self.started = 0.0
    self._suspect_since: "float | None" = None
    self._suspect_reads = 0

  def watch(self, attempt: int, started: float) -> None:
    """From now on, judge `attempt`, started (or adopted) at `started`."""
    self.attempt, self.started = attempt, started
    self._suspect_since, self._suspect_reads = None, 0

  def verdict(self, obs: Observation) -> str:
    """RUNNING/STARTING (all well), DONE/FAILED (the job's final word), WAIT (something
    looks wrong, not yet for long enough), RESTART or RECREATE (the job is gone)."""
    job = obs.job if obs.job is not None and obs.job.get("attempt") == self.attempt else None
    if job is not None and job["state"] == "done":
      return DONE
    if job is not None and job["state"] == "failed":
      return FAILED
    active = obs.slice_state == launch_plan.ACTIVE
    fresh = (job is not None and job["state"] == "running"
             and obs.time - float(job.get("time", 0)) < self.stale_after_s)
    starting = job is None and obs.time - self.started < self.start_timeout_s
    if active and (fresh or starting):
      self._suspect_since, self._suspect_reads = None, 0
      return RUNNING if fresh else STARTING
    if self._suspect_since is None:
      self._suspect_since = obs.time
    self._suspect_reads += 1
    if self._suspect_reads < self.min_reads or obs.time - self._suspect_since < self.window_s:
      return WAIT
    return RESTART if active else RECREATE
