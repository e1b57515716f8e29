"""The job's state in its workdir (WORKDIR/job_state.json), for a launcher that is not attached.

A job started by bert_jax.launch runs detached on the TPU VMs; the launcher
learns how it is doing from this one small file, which process 0 writes
through host.paths (so gs:// and local workdirs alike):

  {"state": "running" | "done" | "preempted" | "failed",
   "host": ..., "pid": ..., "time": <unix seconds of this write>,
   "started": <unix seconds>, "exit_code": null | int,
   "job_id": $BERT_JAX_JOB_ID, "attempt": $BERT_JAX_JOB_ATTEMPT}

'running' is written when the job has joined its cluster and rewritten every
HEARTBEAT_S (the `time` field is the heartbeat: a record that stops changing
while it says 'running' belongs to a job whose host is gone); the final state
follows the exit code of bert_jax.jobs.run (0 done, 143 preempted, anything
else, or an exception, failed).

Only jobs that a launcher identifies (BERT_JAX_JOB_ID in the environment) write
the file: a run started by hand, a test or the ablation leaves its workdir as
it always did, and a refusal of such a run still writes nothing. A job that lost
its workdir lock (bert_jax.run.lock.lost) writes no more heartbeats and no final
state: the record is the new holder's.
"""

import functools
import json
import os
import socket
import threading
import time
from typing import Callable

from absl import logging

from bert_jax import exit_codes
from bert_jax.run import lock as workdir_lock
from host import paths

STATE_FILE = exit_codes.STATE_FILE
RUNNING, DONE, PREEMPTED, FAILED = "running", "done", "preempted", "failed"
# How often process 0 rewrites 'running'; readers call a record stale after several of these.
HEARTBEAT_S = 60.0
# Set by bert_jax.launch in each worker's job command (the workdir lock reads them too):
# the launch's identity, stable across relaunches, and a number that grows with each start.
JOB_ID_ENV, ATTEMPT_ENV = "BERT_JAX_JOB_ID", "BERT_JAX_JOB_ATTEMPT"


def identity() -> "tuple[str | None, int | None]":
  """(job id, attempt) from the environment the launcher gave this job; (None, None) if none."""
  job_id = os.environ.get(JOB_ID_ENV) or None
  attempt = os.environ.get(ATTEMPT_ENV)
  return job_id, int(attempt) if attempt and attempt.lstrip("-").isdigit() else None


def state_for_exit_code(code: "int | None") -> str:
  """The final state a job's exit code means (None: it raised)."""
  if code == exit_codes.DONE:
    return DONE
  if code == exit_codes.PREEMPTED:
    return PREEMPTED
  return FAILED


def parse(text: str) -> "dict | None":
  """A record from the file's text; None when it is not one (empty, half-copied, another file)."""
  try:
    record = json.loads(text)
  except ValueError:
    return None
  if not isinstance(record, dict) or record.get("state") not in (RUNNING, DONE, PREEMPTED, FAILED):
    return None
  return record


def read(workdir: str) -> "dict | None":
  """The workdir's record, or None when there is none."""
  path = paths.join(workdir, STATE_FILE)
  if not paths.exists(path):
    return None
  return parse(paths.read_text(path))


def is_live_elsewhere(record: "dict | None", attempt: "int | None", stale_after_s: float) -> bool:
  """Whether `record` is another attempt's 'running' with a recent heartbeat."""
  return (record is not None and record.get("state") == RUNNING
          and record.get("attempt") != attempt
          and time.time() - float(record.get("time", 0)) < stale_after_s)


# Set once this process has joined its jax.distributed cluster (bert_jax.training.state, when
# jax.distributed.initialize has returned); until then the heartbeat does not ask JAX which
# process this is. jax.distributed.is_initialized() is no such signal: it turns True when the
# client exists, before client.connect(), and a backend the heartbeat thread started in that
# gap used the unconnected client, so the coordination service aborted the process ("wrong
# service incarnation: requested 0"; CI, 2026-12-03, a 2-process job with a job id).
_JOINED = threading.Event()


def cluster_joined() -> None:
  """Tells the job's record that jax.distributed.initialize has returned in this process."""
  _JOINED.set()


class Tracker:
  """Writes one job's record: 'running' plus heartbeats, then its final state."""

  def __init__(self, workdir: str, distributed: bool, job_id: str, attempt: "int | None"):
    self.workdir, self.distributed = workdir, distributed
    self.job_id, self.attempt = job_id, attempt
    self.started = time.time()
    self._stop = threading.Event()
    self._thread: "threading.Thread | None" = None

  def _process_zero(self) -> "bool | None":
    """Whether this is process 0; None while a distributed job has not joined its cluster."""
    if not self.distributed:
      return True
    if not _JOINED.is_set():
      return None  # asking now could start JAX's backend before the cluster is joined
    import jax  # pylint: disable=g-import-not-at-top  # only multi-process jobs get here
    return jax.process_index() == 0

  def _write(self, state: str, exit_code: "int | None" = None) -> None:
    record = {"state": state, "host": socket.gethostname(), "pid": os.getpid(),
              "time": time.time(), "started": self.started, "exit_code": exit_code,
              "job_id": self.job_id, "attempt": self.attempt}
    paths.write_atomic(paths.join(self.workdir, STATE_FILE), json.dumps(record) + "\n")

  def _heartbeat(self) -> None:
    written = False
    while not self._stop.is_set():
      if workdir_lock.lost(self.workdir):
        return  # another attempt writes this workdir, and its record, now
      try:
        zero = self._process_zero()
        if zero is False:
          return  # another process writes the record
        if zero:
          self._write(RUNNING)
          written = True
      except Exception as e:  # pylint: disable=broad-except  # a storage hiccup must not stop training
        logging.warning("could not write %s: %s", STATE_FILE, e)
      # Until the cluster is joined, look again soon: the launcher waits for this line.
      self._stop.wait(HEARTBEAT_S if written else min(1.0, HEARTBEAT_S))

  def start(self) -> None:
    """Writes 'running' (once this process is known to be process 0) and keeps it fresh."""
    self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                    name="bert_jax-job-state")
    self._thread.start()

  def finish(self, exit_code: "int | None") -> None:
    """Stops the heartbeat and writes the final state (never raises)."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if workdir_lock.lost(self.workdir):
      logging.warning("%s: this run lost the workdir lock; the record is the new holder's",
                      STATE_FILE)
      return
    try:
      zero = self._process_zero()
      if zero is False:
        return
      # zero is None: the job ended before joining its cluster (a refused config, say), so no
      # process knows it is process 0; each writes, and they all say the same.
      current = read(self.workdir)
      if is_live_elsewhere(current, self.attempt, 5 * HEARTBEAT_S):
        # A second start refused by the lock must not mark the live attempt's job failed.
        logging.warning("%s: attempt %s is running; not overwriting its state", STATE_FILE,
                        current.get("attempt"))
        return
      self._write(state_for_exit_code(exit_code), exit_code)
    except Exception as e:  # pylint: disable=broad-except  # the exit code still tells the caller
      logging.warning("could not write %s: %s", STATE_FILE, e)


def track(workdir: str, distributed: bool, body: Callable[[], int]) -> int:
  """Runs `body` (-> exit code) with its state recorded in `workdir` for the launcher: the
  whole job of any command a launcher starts (bert_jax.jobs.run, experiments.evaluate).

  Does nothing more than call it unless the launcher set BERT_JAX_JOB_ID.
  """
  job_id, attempt = identity()
  if job_id is None:
    return body()
  tracker = Tracker(workdir, distributed, job_id, attempt)
  tracker.start()
  code = None
  try:
    code = body()
    return code
  finally:
    tracker.finish(code)


def tracked(run: Callable[..., int]) -> Callable[..., int]:
  """Decorates bert_jax.jobs.run(config, workdir, **options) -> exit code: records the job's
  state (track). Keyword options pass through unchanged."""

  @functools.wraps(run)
  def wrapper(config, workdir_path: str, **options) -> int:
    return track(workdir_path, bool(config.distributed.enabled),
                 lambda: run(config, workdir_path, **options))

  return wrapper
