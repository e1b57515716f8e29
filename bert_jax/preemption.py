"""Stopping a run cleanly when its machines are going away (SIGTERM, TPU/GPU preemption).

Both trainers ask `StopRequest.reached(step)` after every step; when it says
yes they save that step and return. On one process the request is a SIGTERM
handler's flag. On several processes (a pod slice) it is JAX's preemption sync
point: the coordination service hears the SIGTERM that reaches any host and
agrees on one step at which every host stops, without a blocking collective on
the steps before it (so hosts keep running ahead of their devices).

A run stopped this way ends the process with PREEMPTED_EXIT_CODE (143, the
shell's code for "terminated by SIGTERM"), distinct from 0 (finished) and 1
(failed), so a scheduler or bert_jax.launch knows to relaunch the same command,
which resumes from the saved step.

Ctrl-C (SIGINT) on a single-process run is a stop request too: the first one
saves the step and ends the process with INTERRUPTED_EXIT_CODE (130, the
shell's code for SIGINT) and the same "saved step N; the same command resumes"
line; a second one aborts at once, without saving (the last saved step stays).
"""

import os
import signal
import sys

import jax
from jax.experimental import multihost_utils

PREEMPTED_EXIT_CODE = 143
INTERRUPTED_EXIT_CODE = 130

_preempted = [False]
_interrupted = [False]  # the stop request was a Ctrl-C (SIGINT), not a preemption


def was_preempted() -> bool:
  """Whether the latest run in this process stopped on a preemption request (read by
  bert_jax.jobs.run for the exit code, and by the ablation between its runs)."""
  return _preempted[0]


def clear() -> None:
  """Forgets an earlier run's preemption: a new run in the same process starts unstopped."""
  _preempted[0] = False
  _interrupted[0] = False


def stopped_exit_code() -> int:
  """The exit code of a run that stopped on request: 130 after Ctrl-C, else 143."""
  return INTERRUPTED_EXIT_CODE if _interrupted[0] else PREEMPTED_EXIT_CODE


def stop_reason() -> str:
  """What stopped the run, for its last line ("preempted (SIGTERM)" or "interrupted (Ctrl-C)")."""
  return "interrupted (Ctrl-C)" if _interrupted[0] else "preempted (SIGTERM)"


class StopRequest:
  """Whether the run must stop at a step; create at the start of a loop, close() at its end."""

  def __init__(self):
    # JAX's preemption service installs its own SIGTERM listener when
    # jax.distributed is initialized; a Python handler would replace it.
    self._synced = jax.distributed.is_initialized() and jax.process_count() > 1
    clear()
    self._flag = False
    self._previous = self._previous_int = None
    if not self._synced:
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
      self._previous_int = signal.signal(signal.SIGINT, self._on_sigint)

  def _on_sigterm(self, *_):
    self._flag = True

  def _on_sigint(self, *_):
    if self._flag and _interrupted[0]:
      # The second Ctrl-C: the user will not wait for the save. Nothing is cleaned up
      # (a half-written step is never committed; the lock's dead pid frees it).
      print("interrupted again: aborting without saving", file=sys.stderr, flush=True)
      os._exit(INTERRUPTED_EXIT_CODE)
    _interrupted[0] = True
    self._flag = True
    print("interrupted (Ctrl-C): saving the current step; press Ctrl-C again to abort "
          "without saving", file=sys.stderr, flush=True)

  def reached(self, step: int) -> bool:
    """True at the step to stop at (the same step on every process); call after every step."""
    if self._synced:
      stop = multihost_utils.reached_preemption_sync_point(step)
    else:
      stop = self._flag
    if stop:
      _preempted[0] = True
    return stop

  def close(self) -> None:
    """Puts back the SIGTERM and SIGINT handlers that were there before."""
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
    if self._previous_int is not None:
      signal.signal(signal.SIGINT, self._previous_int)
      self._previous_int = None
