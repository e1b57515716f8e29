"""What both training loops do around the step: check it, log it, save it, stop.

bert_jax.pretrain.trainer and bert_jax.finetune.trainer differ in their data, step and
evaluation; the bookkeeping between steps is the same and lives here once:

  - `StepMetrics`: the step's device metrics, fetched one step late so the host
    never waits for the step it just dispatched; a non-finite loss or gradient
    stops the run before anything is logged, evaluated or saved from it.
  - `due`: whether a step is logged, saved, or the last one of a preempted run;
    it also stops the run (WorkdirError) once this process lost its workdir
    lock to another run (bert_jax.run.lock), within one heartbeat; on several
    processes every one of them stops, at the agreed step the loss asks for.
  - `save`: logs flushed first, then the checkpoint, so a saved step always has
    its rows and a resumed run never writes them twice.
  - `open_manager`: the checkpoint manager, closed after its pending save
    whatever fails; `Loop`: the metrics writer, the stop request,
    progress and `StepMetrics` from the start step on, and `Loop.after_step`,
    which checks and logs each step and says what else is due.
"""

import contextlib
import dataclasses
from typing import Any, Callable, Iterable

from absl import logging
import jax
import numpy as np

from bert_jax import errors
from bert_jax.run import checkpoint
from bert_jax.run import lock as workdir_lock
from bert_jax.run import metrics_io
from bert_jax.run import preemption


class StepMetrics:
  """Per-step device metrics ("loss", "grad_norm", "finite", ...) since the last log."""

  def __init__(self, last_good: Callable[[], str], skip_nonfinite: bool):
    """`last_good()` names the last good checkpoint for the error; skip_nonfinite: the
    step kept the old state (train_state.apply_update), so the run goes on."""
    self._last_good = last_good
    self._skip_nonfinite = skip_nonfinite
    self._pending: tuple[int, Any] | None = None
    self._history: list[dict[str, float]] = []

  def add(self, step: int, device_metrics: dict[str, Any]) -> None:
    """Records step `step`'s metrics and checks the previous step's."""
    self.settle()
    self._pending = (step, device_metrics)

  def settle(self) -> None:
    """Checks every recorded step now: before logging, evaluating or saving."""
    if self._pending is None:
      return
    at, device_metrics = self._pending
    self._pending = None
    m = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
    if not m["finite"] and not self._skip_nonfinite:
      raise errors.NonFiniteLoss(
          f"non-finite loss ({m['loss']}) or gradient norm ({m['grad_norm']}) at step {at}; "
          f"stopped without saving, last good checkpoint: {self._last_good()} "
          "(config.skip_nonfinite_steps=True skips such steps)")
    self._history.append(m)

  def means(self) -> dict[str, float]:
    """Each metric's mean since the last call, and how many steps were skipped."""
    self.settle()
    if not self._history:
      return {}
    means = {k: float(np.mean([h[k] for h in self._history])) for k in self._history[-1]}
    means["skipped_steps"] = sum(1.0 - h["finite"] for h in self._history)
    self._history.clear()
    return means


@dataclasses.dataclass(frozen=True)
class Due:
  log: bool   # write a metrics.jsonl row
  save: bool  # checkpoint this step
  stop: bool  # preempted: this step is saved and the run ends


def due(step: int, total_steps: int, *, log_every: int, save_every: int, stop: bool,
        also_save: bool = False) -> Due:
  """What happens after step `step` (1-based count of steps done); the last step
  is always logged and saved, a preempted step is saved.

  Raises:
    WorkdirError: this process's workdir lock was taken by another run (noticed by
      the lock's heartbeat): nothing more is logged or saved. On several processes
      not here: process 0 alone cannot stop (the others would wait in the next
      step's collective); its loss asks for a stop at a step all of them agree
      on, and `save` raises on every process there (bert_jax.run.lock).
  """
  workdir_lock.check_held()  # a flag, no I/O: cheap after every step
  last = step == total_steps
  return Due(log=step % log_every == 0 or last,
             save=step % save_every == 0 or last or stop or also_save,
             stop=stop)


def save(manager: Any, step: int, state: Any, data_state: dict[str, Any],
         logs: Iterable[Any]) -> None:
  """Flushes `logs` (objects with flush()), then checkpoints `state` and `data_state`.

  Raises:
    WorkdirError: before anything is flushed, on every process, when the workdir lock
      was taken by another run (read now; on several processes process 0's finding is
      gathered, so all of them stop at this step).
  """
  try:
    workdir_lock.check_held(verify=True, everywhere=True)  # every process saves at this step
  except workdir_lock.WorkdirError as e:
    raise workdir_lock.WorkdirError(f"step {step}: {e}") from None
  for log in logs:
    log.flush()  # first: a step that is saved always has its rows
  checkpoint.save(manager, step, {"params": state.params, "opt_state": state.opt_state,
                                  "step": state.step}, data_state, force=True)


def last_good(manager: Any) -> Callable[[], str]:
  """For StepMetrics: the newest complete checkpoint of `manager`, once the pending
  save has finished (it may be the one being written)."""
  def describe() -> str:
    manager.wait_until_finished()
    return f"step {manager.latest_step()} in {manager.directory}"
  return describe


def preempted(step: int) -> None:
  """The last line of a run stopped on request (SIGTERM, or Ctrl-C: preemption.stop_reason)."""
  logging.warning("%s: saved step %d; the same command resumes", preemption.stop_reason(), step)


def open_manager(cleanup: contextlib.ExitStack, workdir: str, checkpoint_config: Any) -> Any:
  """The run's checkpoint manager (it creates workdir/checkpoints: open it only once the
  config can no longer be refused), closed by `cleanup` whatever fails later, and only
  after a pending async save has finished (or failed loudly)."""
  manager = checkpoint.make_manager(workdir, checkpoint_config)
  cleanup.callback(manager.close)
  cleanup.callback(manager.wait_until_finished)  # runs first: the pending save finishes
  return manager


class Loop:
  """A training loop's bookkeeping from its start step, each piece closed by `cleanup`:
  `writer` (metrics.jsonl + TensorBoard), `stop_request` (SIGTERM, preemption,
  Ctrl-C), `progress` (steps/s, ETA, MFU) and `step_metrics` (one step late)."""

  def __init__(self, cleanup: contextlib.ExitStack, workdir: str, manager: Any, *,
               start_step: int, total_steps: int, log_every: int, save_every: int,
               skip_nonfinite: bool):
    self.total_steps, self._log_every, self._save_every = total_steps, log_every, save_every
    self.writer = metrics_io.MetricWriter(workdir, start_step=start_step)
    cleanup.callback(self.writer.close)
    self.stop_request = preemption.StopRequest()
    cleanup.callback(self.stop_request.close)
    self.progress = metrics_io.Progress(total_steps, start_step)
    self.step_metrics = StepMetrics(last_good(manager), skip_nonfinite)

  def after_step(self, step: int, device_metrics: dict[str, Any], *, tokens: int,
                 learning_rate: Callable[[], float],
                 flops: Callable[[], float] | None = None, peak: float | None = None) -> Due:
    """Records step `step` (1-based count of steps done) and logs it when due.

    A logged or saved step is checked first (StepMetrics.settle): nothing is
    logged or saved from a state that went non-finite. The row holds the metric
    means since the last row, `learning_rate()`, and progress.measure's rates
    (`tokens` of the global batch; MFU from `flops()` when `peak` is known).
    The caller saves (due.save) and stops (due.stop).
    """
    self.step_metrics.add(step, device_metrics)
    what = due(step, self.total_steps, log_every=self._log_every,
               save_every=self._save_every, stop=self.stop_request.reached(step))
    if what.log or what.save:
      self.step_metrics.settle()
    if what.log:
      scalars = self.step_metrics.means()
      scalars["learning_rate"] = learning_rate()
      scalars.update(self.progress.measure(step, tokens, flops() if flops else 0.0, peak))
      self.writer.write(step, scalars)
      logging.info("%s", metrics_io.progress_line(step, self.total_steps, scalars))
    return what
