"""The one-writer lock of a workdir: taken by compare-and-swap, kept by a heartbeat, lost loudly.

workdir/.lock holds its holder's host, pid, a random token, the time of its last
heartbeat and the job it belongs to. Every change to it is conditional on the
version its writer last saw (host.paths' read_versioned / create_if_absent /
replace_if / remove_if: GCS generations with ifGenerationMatch, or a content
compare under an fcntl guard on a local disk), so of any number of processes
and hosts racing for it exactly one holds it:

  * taking a free workdir creates the file only if absent (ifGenerationMatch=0);
  * taking over a lock whose holder is gone overwrites exactly the version that
    was judged stale (ifGenerationMatch=<that generation>): of two contenders
    that both judged it stale, the second one's write fails and it looks again
    (one conditional overwrite rather than a delete and a create: there is no
    moment without a lock, and nothing to undo when the second step loses);
  * the heartbeat (every HEARTBEAT_S) overwrites only the version it wrote
    itself; when that fails the lock was taken over: the holder records who has
    it, and `check_held` -- asked by the training loop after every step and by
    every checkpoint save -- raises WorkdirError, so the run stops within one
    heartbeat without saving again; from then on `lost(workdir)` tells the
    run's writers (metrics.jsonl, the batch log) to write nothing more there;
  * release deletes only its own version.

On several processes only process 0 holds the lock, and a raise in process 0
alone would leave the others waiting in the next step's collective. So there
the loss is told to every process at a step they all reach: the holder sends
itself the preemption notice (SIGTERM, which JAX's preemption service turns
into one agreed stop step for every process: bert_jax.run.preemption), and at
that step's save -- or an earlier regular one -- `check_held(everywhere=True)`
gathers process 0's finding and every process raises WorkdirError before
anything is saved.

A holder is known gone, and its lock taken over at once, when
  * it belongs to the same job (BERT_JAX_JOB_ID, set by bert_jax.launch, or
    SLURM_JOB_ID) with a lower attempt (BERT_JAX_JOB_ATTEMPT, or
    SLURM_RESTART_COUNT): the launcher and SLURM relaunch a job only after its
    previous attempt ended;
  * it ran on this host and its pid is gone (a kill -9, then the same command);
otherwise once its heartbeat is older than STALE_AFTER_S (a preempted VM never
comes back). Any other holder is alive: the run is refused with LockHeld (exit
code 75, "retry later", in bert_jax.jobs).
"""

import json
import os
import signal
import socket
import sys
import threading
import time
import uuid

from absl import logging

from bert_jax import errors
from host import paths

LOCK_FILE = ".lock"
HEARTBEAT_S = 30.0  # how often the holder refreshes the lock
STALE_AFTER_S = 600.0  # a lock not refreshed for this long is free (its holder is gone)


class WorkdirError(errors.UsageError):
  """A workdir that must not be written by this run (another run's, or locked); a refusal
  that bert_jax.jobs prints as one line."""


class LockHeld(WorkdirError):
  """The workdir's lock belongs to a live run: retry later (exit code 75)."""


_HELD: set["Lock"] = set()  # the locks this process holds; check_held asks each
# Why this process writes nothing more into a workdir: lock path -> the loss, for locks it
# held and lost; and, on a process of a multi-process run, process 0's loss once told.
_LOST: dict[str, str] = {}
_RUN_LOST: list = [None]


def job_identity() -> dict | None:
  """{"id", "attempt"} of the job this process belongs to, from the launcher's or
  SLURM's environment; None outside a job."""
  for id_var, attempt_var in (("BERT_JAX_JOB_ID", "BERT_JAX_JOB_ATTEMPT"),
                              ("SLURM_JOB_ID", "SLURM_RESTART_COUNT")):
    if os.environ.get(id_var):
      return {"id": os.environ[id_var], "attempt": int(os.environ.get(attempt_var) or 0)}
  return None


class Lock:
  """The one-writer lock of a workdir (see the module docstring); held by process 0 only.

  `heartbeat_s`, `stale_after_s` and `job` default to HEARTBEAT_S, STALE_AFTER_S
  and job_identity() (tests pass small intervals and explicit jobs; {} for none).
  """

  def __init__(self, workdir: str, *, heartbeat_s: float | None = None,
               stale_after_s: float | None = None, job: dict | None = None):
    self.path = paths.join(workdir, LOCK_FILE)
    self.token = uuid.uuid4().hex
    self.heartbeat_s = HEARTBEAT_S if heartbeat_s is None else heartbeat_s
    self.stale_after_s = STALE_AFTER_S if stale_after_s is None else stale_after_s
    self.job = (job_identity() if job is None else job) or None  # {}: explicitly none
    self._generation: str | None = None  # the version of the file this holder wrote last
    self._lost: str | None = None  # why this holder stopped holding it, once it has
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _content(self) -> bytes:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "token": self.token,
                       "heartbeat": time.time(), "job": self.job}).encode("utf-8")

  def _read(self) -> tuple[dict | None, str] | None:
    """(holder or None when unparsable, generation), or None when there is no lock file."""
    current = paths.read_versioned(self.path)
    if current is None:
      return None
    try:
      holder = json.loads(current[0].decode("utf-8"))
    except ValueError:
      holder = None
    return (holder if isinstance(holder, dict) else None), current[1]

  def acquire(self) -> None:
    """Takes the lock, or raises LockHeld naming the live holder."""
    for _ in range(5):  # each pass ends in a won write, a refusal, or someone else's move
      generation = paths.create_if_absent(self.path, self._content())
      if generation is not None:
        self._hold(generation)
        return
      current = self._read()
      if current is None:
        continue  # released meanwhile: race to create it again
      holder, generation = current
      if holder is not None and holder.get("token") == self.token:
        self._hold(generation)  # our own write, whose reply was lost and retried
        return
      why_free = _stale(holder, self.job, self.stale_after_s)
      if why_free is None:
        raise LockHeld(_in_use(self.path, holder, self.stale_after_s))
      generation = paths.replace_if(self.path, self._content(), generation)
      if generation is not None:
        logging.warning("took over the workdir lock %s: %s", self.path, why_free)
        self._hold(generation)
        return
      # Changed since it was read (another contender, or the holder's heartbeat): look again.
    raise LockHeld(f"could not take the lock {self.path}: other processes keep racing for it")

  def check_free(self) -> None:
    """Raises LockHeld when acquire() would (a live run holds the lock); reads only. A run
    asks before its slow start (reading the corpus), so a busy workdir is refused at once;
    acquire() still decides, later, before anything is written."""
    if not paths.exists(self.path):  # before _read, whose guard file would be a write
      return
    current = self._read()
    if current is None or current[0] is None or current[0].get("token") == self.token:
      return  # free, or unreadable (acquire takes it over), or this holder's own
    if _stale(current[0], self.job, self.stale_after_s) is None:
      raise LockHeld(_in_use(self.path, current[0], self.stale_after_s))

  def _hold(self, generation: str) -> None:
    self._generation = generation
    _LOST.pop(self.path, None)  # this process writes the workdir again
    _RUN_LOST[0] = None
    _HELD.add(self)
    self._thread = threading.Thread(target=self._heartbeat, daemon=True,
                                    name="bert_jax-workdir-lock")
    self._thread.start()

  def _heartbeat(self) -> None:
    while not self._stop.wait(self.heartbeat_s):
      try:
        self.refresh()
      except WorkdirError:
        return  # lost: check_held tells the training loop
      except Exception as e:  # pylint: disable=broad-except  # a flaky write must not kill training
        logging.warning("could not refresh the workdir lock %s: %s", self.path, e)

  def refresh(self) -> None:
    """One heartbeat: overwrites the version this holder wrote last, or finds it lost.

    Raises:
      WorkdirError: the lock was taken over (or deleted) by another run.
    """
    self.check()
    generation = paths.replace_if(self.path, self._content(), self._generation)
    if generation is not None:
      self._generation = generation
      return
    current = self._read()
    if current is not None and current[0] is not None and current[0].get("token") == self.token:
      self._generation = current[1]  # our write landed; only its reply was lost
      return
    self._lose(current[0] if current else None)

  def _lose(self, holder: dict | None) -> None:
    to = (f"host {holder.get('host')} pid {holder.get('pid')}{_job_text(holder)}" if holder
          else "another run (the lock file was deleted)")
    first = self._lost is None
    self._lost = (f"lost the workdir lock {self.path} to {to}; stopped without saving "
                  "(another run writes this workdir now)")
    _LOST[self.path] = self._lost
    logging.error("%s", self._lost)
    if first and _process_count() > 1:
      # The others cannot hear of it from a raise here: ask for the stop every process
      # agrees on (JAX's preemption service listens for SIGTERM); check_held(everywhere=True)
      # at that step's save tells them why, and nothing is saved.
      os.kill(os.getpid(), signal.SIGTERM)
    raise WorkdirError(self._lost)

  def check(self, verify: bool = False) -> None:
    """Raises WorkdirError once this lock was lost; `verify` reads the lock file now
    (before a save) rather than trusting the last heartbeat."""
    if self._lost is not None:
      raise WorkdirError(self._lost)
    if not verify:
      return
    try:
      current = self._read()
    except Exception as e:  # pylint: disable=broad-except  # the heartbeat judges flaky storage
      logging.warning("could not read the workdir lock %s: %s", self.path, e)
      return
    if current is None or current[0] is None or current[0].get("token") != self.token:
      self._lose(current[0] if current else None)

  def release(self) -> None:
    """Stops the heartbeat and deletes the lock if this process still holds it."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
      if self._lost is None:
        paths.remove_if(self.path, self._generation)
    _HELD.discard(self)


def check_held(verify: bool = False, *, everywhere: bool = False) -> None:
  """Raises WorkdirError when a workdir lock this process held was taken by another run.

  Cheap without `verify` (the heartbeat's finding): the training loops ask after
  every step. With `verify` every held lock is read now: checkpoint saves ask.

  On one process that is all. On several, only process 0 holds the lock and a
  raise there alone would hang the others in their next collective, so nothing
  is raised unless `everywhere`: every process calls it at the same step (a
  save), process 0's finding is gathered (one all-gather), and all of them raise
  when it lost the lock. Until then the loss only silences process 0's writers
  (`lost`), and the stop it asked for (see the module docstring) comes soon.
  """
  reason = None
  for held in list(_HELD):
    try:
      held.check(verify)
    except WorkdirError as e:
      reason = reason or str(e)
  if _process_count() == 1:
    if reason is not None:
      raise WorkdirError(reason)
    return
  if not everywhere:
    return
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top  # only here
  import numpy as np  # pylint: disable=g-import-not-at-top
  if not np.any(multihost_utils.process_allgather(np.int32(reason is not None))):
    return
  if reason is None:  # not the holder: told by the gather
    reason = ("process 0 lost the workdir lock to another run (process 0's log names it); "
              "stopped without saving (another run writes this workdir now)")
    _RUN_LOST[0] = reason
  raise WorkdirError(reason)


def lost(workdir: str) -> str | None:
  """Why this process must write nothing more into `workdir` (it lost the workdir's lock, or
  process 0 of its run did), or None. The run's writers ask before every write: the
  workdir is another run's now, and an upload of a whole file (metrics.jsonl, the batch
  log on gs://) would replace what that run wrote."""
  return _LOST.get(paths.join(workdir, LOCK_FILE)) or _RUN_LOST[0]


def _process_count() -> int:
  """Processes of this run: jax.process_count() once jax.distributed is up, else 1 (never
  imports JAX: the lock works without it)."""
  jax = sys.modules.get("jax")
  if jax is None or not jax.distributed.is_initialized():
    return 1
  return jax.process_count()


def _job_text(holder: dict) -> str:
  job = holder.get("job")
  return f" (job {job.get('id')} attempt {job.get('attempt')})" if isinstance(job, dict) else ""


def _in_use(lock_path: str, holder: dict, stale_after_s: float) -> str:
  age = time.time() - float(holder.get("heartbeat", 0))
  job = holder.get("job")
  of_job = f", job {job.get('id')} attempt {job.get('attempt')}" if isinstance(job, dict) else ""
  return (f"workdir is in use: {lock_path} is held by host {holder.get('host')} pid "
          f"{holder.get('pid')} (heartbeat {age:.0f}s ago{of_job}). One run writes a workdir "
          f"at a time; if that process is gone for good, delete {lock_path} (it frees itself "
          f"{stale_after_s:.0f}s after its last heartbeat, at once for a later attempt of the "
          "same job)")


def _stale(holder: dict | None, job: dict | None, stale_after_s: float) -> str | None:
  """Why a lock's holder is gone (so the lock is free), or None while it may be alive."""
  if holder is None:
    return "its content is unreadable"
  held_by = holder.get("job")
  if (job is not None and isinstance(held_by, dict) and held_by.get("id") == job["id"]
      and int(held_by.get("attempt", 0)) < job["attempt"]):
    return (f"job {job['id']} was relaunched as attempt {job['attempt']}; attempt "
            f"{held_by.get('attempt')} (host {holder.get('host')} pid {holder.get('pid')}) ended")
  age = time.time() - float(holder.get("heartbeat", 0))
  if age > stale_after_s:
    return f"no heartbeat for {age:.0f}s (host {holder.get('host')} pid {holder.get('pid')})"
  if holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", -1))):
    return f"its holder, pid {holder.get('pid')} on this host, is gone"
  return None


def _pid_alive(pid: int) -> bool:
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True
