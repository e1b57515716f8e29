"""The launcher's attach half: start the detached job, follow its log, watch it to an end.

Nothing here ends a job or a slice. Losing the ssh (exit 255) while starting or
following the log only means looking again later: the job's own record in the
workdir and the queued resource's state (bert_jax.launch.state) say what
happened, and the verdict goes back to bert_jax.launch, which relaunches or
deletes.
"""

import os
import re
import signal
import subprocess
import threading
import time

from bert_jax import exit_codes
from bert_jax.launch import plan as launch_plan
from bert_jax.launch import state as launch_state
from bert_jax.launch.state import LaunchError, say

# Seconds between attempts to (re)open the log stream of worker 0 after it ended.
FOLLOW_RETRY_S = 30.0


def start(gcloud: launch_state.Gcloud, tpu: launch_plan.Slice, attempt: int,
          args: list[str], replace: bool = False) -> int:
  """Starts attempt `attempt` of the job on every worker; returns the attempt that runs there.

  A worker whose previous job still runs keeps it and says so: that attempt is
  adopted, never doubled (with `replace`, for a relaunch, it is ended instead). An
  ssh that fails as such (255) may or may not have started the job: the workdir
  will tell, so it is not an error.
  """
  result = gcloud.run(launch_plan.start_command(tpu, attempt, args, replace), "start",
                      check=False)
  running = re.search(re.escape(launch_plan.ALREADY_RUNNING) + r" (\d+) (-?\d+)", result.stdout)
  if running:
    say(f"a job (attempt {running.group(2)}, pid {running.group(1)}) is already running "
        "on the slice: attaching to it instead of starting another")
    return int(running.group(2))
  if result.returncode == exit_codes.SSH_LOST:
    say(f"lost the ssh while starting attempt {attempt} (exit 255; the slice is not touched); "
        "the job's record in the workdir will say whether it started")
    return attempt
  if result.returncode:
    raise LaunchError("start", f"gcloud exited {result.returncode}: "
                      f"{launch_state.tail(result.stderr or result.stdout)}")
  return attempt


def exited(reader: launch_state.Reader, attempt: int) -> None:
  """Asks worker 0 whether attempt `attempt` ended (plan.exited_command), while the workdir
  holds no record of it.

  Worker 0's job writes its final record before it exits: an exit found with no record
  after it (read again now) is a job that never started. A job that saved and exited
  after a SIGTERM (143: preempted, maintenance) is left to the judge, as is an ssh that
  failed (nothing is known then): the next look asks again.

  Raises:
    StartFailed: the job exited before its first record, with its log's last lines.
  """
  result = reader.gcloud.run(launch_plan.exited_command(reader.tpu), "start", check=False,
                             echo=False)
  code, lines = None, []
  for line in result.stdout.splitlines():
    found = re.fullmatch(re.escape(launch_plan.EXITED) + r" (-?\d+) (\S*)", line.strip())
    if found is None:
      lines.append(line)
    elif found.group(2) == str(attempt):
      code = int(found.group(1))
  if code is None or code == exit_codes.PREEMPTED:
    return
  job = reader.job()
  if job is not None and job.get("attempt") == attempt:
    return  # it did start: its record says how it ended
  raise launch_state.StartFailed(
      "start", f"the job exited {code} on worker 0 before writing its first record in the "
      "workdir, so it is not started again (the same start would end the same way); the "
      f"log's last lines: {launch_state.tail(chr(10).join(lines), lines=6, chars=900)}")


class LogFollower:
  """Streams worker 0's job log to the terminal and LOGDIR/worker_0.log while watching."""

  def __init__(self, tpu: launch_plan.Slice, logdir: str):
    self.tpu, self.path = tpu, os.path.join(logdir, "worker_0.log")
    self.process: "subprocess.Popen | None" = None
    self.last_start = -float("inf")

  def _pump(self, process: subprocess.Popen) -> None:
    with open(self.path, "a", encoding="utf-8") as log:
      for line in process.stdout:
        text = f"[worker 0] {line.rstrip()}"
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

  def poll(self) -> None:
    """(Re)opens the stream if it is not open and FOLLOW_RETRY_S passed since the last try."""
    if self.process is not None and self.process.poll() is None:
      return
    if time.monotonic() - self.last_start < FOLLOW_RETRY_S:
      return
    self.last_start = time.monotonic()
    # Its own process group, so that closing it also ends the ssh gcloud started.
    self.process = subprocess.Popen(
        launch_plan.logs_command(self.tpu, 0, lines=20, follow=True), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, errors="replace",
        start_new_session=True)
    threading.Thread(target=self._pump, args=(self.process,), daemon=True).start()

  def close(self) -> None:
    """Ends the stream (the job on the worker is not affected)."""
    if self.process is not None and self.process.poll() is None:
      try:
        os.killpg(self.process.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
      self.process.wait()


def watch(reader: launch_state.Reader, judge: launch_state.Judge, poll_s: float,
          follower: "LogFollower | None") -> tuple[str, launch_state.Observation]:
  """Looks at the slice and the job every `poll_s` until the judge has a final verdict; while
  the job has written no record, each look also asks the workers whether it ended (exited).

  Returns:
    (DONE | FAILED | RESTART | RECREATE, the observation that decided it).
  Raises:
    LostContact: gcloud kept failing (the slice and the job are left as they are).
    StartFailed: the job ended before its first record.
  """
  shown = None
  while True:
    obs = reader.observe()
    verdict = judge.verdict(obs)
    job = obs.job if obs.job is not None and obs.job.get("attempt") == judge.attempt else None
    key = (obs.slice_state, verdict, job and job["state"])
    if key != shown:  # one line per change, not one per poll
      say(f"slice {obs.slice_state or 'gone'}; job "
          f"{launch_state.describe_job(job, obs.time) if job else 'not started yet'}"
          + (" (watching whether this lasts)" if verdict == launch_state.WAIT else ""))
      shown = key
    if verdict in (launch_state.DONE, launch_state.FAILED, launch_state.RESTART,
                   launch_state.RECREATE):
      return verdict, obs
    if verdict == launch_state.STARTING:
      exited(reader, judge.attempt)
    if follower is not None and obs.slice_state == launch_plan.ACTIVE:
      follower.poll()
    time.sleep(poll_s)
