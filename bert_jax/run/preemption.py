"""Stopping a run cleanly when its machines are going away (SIGTERM, TPU/GPU preemption).

Both trainers ask `StopRequest.reached(step)` after every step; when it says
yes they save that step and return. On one process the request is a SIGTERM
handler's flag. On several processes (a pod slice) it is JAX's preemption sync
point: the coordination service hears the SIGTERM that reaches any host and
agrees on one step at which every host stops, without a blocking collective on
the steps before it (so hosts keep running ahead of their devices).

A run stopped this way ends the process with exit_codes.PREEMPTED (143, the
shell's code for "terminated by SIGTERM"), distinct from 0 (finished) and 1
(failed), so a scheduler or bert_jax.launch knows to relaunch the same command,
which resumes from the saved step.

Ctrl-C (SIGINT) is a stop request too: the first one saves the step and ends
the process with exit_codes.INTERRUPTED (130, the shell's code for SIGINT) and
the same "saved step N; the same command resumes" line. A second one aborts at
once, without waiting for that save (os._exit: orbax commits a step only when
it is complete, so the newest complete step stays and the same command resumes
from it); it is heard until the run is over (jobs.run calls release()), also
while the trainer waits for the save after its loop. On several processes a
Ctrl-C that reaches one of them is passed to JAX's preemption service as the
SIGTERM it listens for, so every process stops at the same step and saves it,
and all of them exit 130.
"""

import os
import signal

import jax
from jax.experimental import multihost_utils
import numpy as np

from bert_jax import exit_codes

_preempted = [False]
_interrupted = [False]  # the stop request was a Ctrl-C (SIGINT), not a preemption
# The SIGINT handler a Ctrl-C stop replaced: put back by release(), not by
# StopRequest.close(), so that a second Ctrl-C still aborts during the final save.
_kept_sigint: list = [None]


def was_preempted() -> bool:
  """Whether the latest run in this process stopped on a preemption request (read by
  bert_jax.jobs.run for the exit code, and by the ablation between its runs)."""
  return _preempted[0]


def clear() -> None:
  """Forgets an earlier run's preemption: a new run in the same process starts unstopped."""
  release()
  _preempted[0] = False
  _interrupted[0] = False


def release() -> None:
  """Puts back the SIGINT handler a Ctrl-C stop kept listening (see the module docstring);
  bert_jax.jobs.run calls it when the run is over."""
  if _kept_sigint[0] is not None:
    signal.signal(signal.SIGINT, _kept_sigint[0])
    _kept_sigint[0] = None


def stopped_exit_code() -> int:
  """The exit code of a run that stopped on request: 130 after Ctrl-C, else 143."""
  return exit_codes.INTERRUPTED if _interrupted[0] else exit_codes.PREEMPTED


def stop_reason() -> str:
  """What stopped the run, for its last line ("preempted (SIGTERM)" or "interrupted (Ctrl-C)")."""
  return "interrupted (Ctrl-C)" if _interrupted[0] else "preempted (SIGTERM)"


def _say(line: str) -> None:
  """One line on stderr from a signal handler: written to the file descriptor, since the
  handler may run while the main thread is inside a write to sys.stderr (a reentrant
  write to a buffered stream raises)."""
  os.write(2, (line + "\n").encode())


class StopRequest:
  """Whether the run must stop at a step; create at the start of a loop, close() at its end."""

  def __init__(self):
    # JAX's preemption service installs its own SIGTERM listener when
    # jax.distributed is initialized; a Python handler would replace it.
    self._synced = jax.distributed.is_initialized() and jax.process_count() > 1
    clear()
    self._flag = False
    self._previous = None
    if not self._synced:
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    self._previous_int = signal.signal(signal.SIGINT, self._on_sigint)

  def _on_sigterm(self, *_):
    self._flag = True

  def _on_sigint(self, *_):
    if _interrupted[0]:
      # The second Ctrl-C: the user will not wait for the save. Nothing is cleaned up
      # (a half-written step is never committed; the lock's dead pid frees it).
      _say("interrupted again: aborted without waiting for the save; the same command "
           "resumes from the newest complete checkpoint")
      os._exit(exit_codes.INTERRUPTED)
    _interrupted[0] = True
    if self._synced:
      # The other processes hear of it as of a preemption notice: JAX's notifier in
      # this process takes the SIGTERM and the service agrees on the step to stop at.
      os.kill(os.getpid(), signal.SIGTERM)
    else:
      self._flag = True
    _say("interrupted (Ctrl-C): saving the current step; press Ctrl-C again to abort "
         "without saving")

  def reached(self, step: int) -> bool:
    """True at the step to stop at (the same step on every process); call after every step."""
    if self._synced:
      stop = multihost_utils.reached_preemption_sync_point(step)
      if stop:  # every process at this step: all exit 130 if a Ctrl-C reached any of them
        _interrupted[0] = bool(np.any(multihost_utils.process_allgather(
            np.int32(_interrupted[0]))))
    else:
      stop = self._flag
    if stop:
      _preempted[0] = True
    return stop

  def close(self) -> None:
    """Puts back the SIGTERM and SIGINT handlers that were there before; after a Ctrl-C
    stop the SIGINT one only at release(), once the run (and its save) is over."""
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
    if self._previous_int is not None:
      if _interrupted[0]:
        _kept_sigint[0] = self._previous_int
      else:
        signal.signal(signal.SIGINT, self._previous_int)
      self._previous_int = None
