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
"""

import signal

import jax
from jax.experimental import multihost_utils

PREEMPTED_EXIT_CODE = 143

_preempted = [False]


def was_preempted() -> bool:
  """Whether the latest run in this process stopped on a preemption request (read by
  bert_jax.jobs.run for the exit code, and by the ablation between its runs)."""
  return _preempted[0]


def clear() -> None:
  """Forgets an earlier run's preemption: a new run in the same process starts unstopped."""
  _preempted[0] = False


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

  def _on_sigterm(self, *_):
    self._flag = True

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
    """Puts back the SIGTERM handler that was there before."""
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
