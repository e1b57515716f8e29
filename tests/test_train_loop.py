"""bert_jax/training/loop.py: the bookkeeping both trainers share between steps."""

import contextlib
import json
import os
import signal
import types

import numpy as np
import pytest

from bert_jax.run import preemption
from bert_jax.training import loop as train_loop


def _m(loss, finite=True, grad_norm=1.0):
  return {"loss": np.float32(loss), "grad_norm": np.float32(grad_norm),
          "finite": np.float32(finite)}


def test_metrics_are_checked_one_step_late_and_averaged():
  """Fails if StepMetrics' means over two steps differ from the listed ones (no skipped step), or
  are not cleared once read."""
  metrics = train_loop.StepMetrics(lambda: "step 0 in /w", skip_nonfinite=False)
  metrics.add(1, _m(2.0))
  metrics.add(2, _m(4.0))
  assert metrics.means() == {"loss": 3.0, "grad_norm": 1.0, "finite": 1.0, "skipped_steps": 0.0}
  assert metrics.means() == {}  # cleared


def test_a_non_finite_step_stops_the_run_naming_the_step_and_the_last_good_checkpoint():
  """Fails if a non-finite step, checked when the next step is added, does not raise a
  FloatingPointError naming it and the last good checkpoint."""
  metrics = train_loop.StepMetrics(lambda: "step 10 in /w/checkpoints", skip_nonfinite=False)
  metrics.add(11, _m(float("nan"), finite=False))  # pending: not fetched yet
  with pytest.raises(FloatingPointError, match=r"at step 11; .*step 10 in /w/checkpoints"):
    metrics.add(12, _m(1.0))  # the next step checks it


def test_skipped_non_finite_steps_are_counted():
  """Fails if, with skip_nonfinite, a non-finite step raises or is not counted in skipped_steps (1)
  and the finite mean (0.5)."""
  metrics = train_loop.StepMetrics(lambda: "", skip_nonfinite=True)
  metrics.add(1, _m(float("nan"), finite=False))
  metrics.add(2, _m(1.0))
  means = metrics.means()
  assert means["skipped_steps"] == 1.0 and means["finite"] == 0.5


@pytest.mark.parametrize("step,stop,also,expect", [
    (5, False, False, (True, False, False)),
    (10, False, False, (True, True, False)),
    (7, False, False, (False, False, False)),
    (7, True, False, (False, True, True)),
    (7, False, True, (False, True, False)),
    (23, False, False, (True, True, False)),  # the last step
])
def test_due(step, stop, also, expect):
  """Fails if `due` decides logging, saving or stopping otherwise than listed for this step, stop
  request and extra save (the last step logs and saves)."""
  d = train_loop.due(step, 23, log_every=5, save_every=10, stop=stop, also_save=also)
  assert (d.log, d.save, d.stop) == expect


def test_save_flushes_the_logs_before_the_checkpoint(monkeypatch):
  """Fails if save does not flush every log, in order, before it saves the checkpoint with its data
  state."""
  calls = []
  monkeypatch.setattr(train_loop.checkpoint, "save",
                      lambda manager, step, state, data, force: calls.append(("save", step, data)))
  logs = [types.SimpleNamespace(flush=lambda i=i: calls.append(("flush", i))) for i in range(2)]
  state = types.SimpleNamespace(params=1, opt_state=2, step=3)
  train_loop.save(None, 7, state, {"input": "x"}, logs)
  assert calls == [("flush", 0), ("flush", 1), ("save", 7, {"input": "x"})]


def test_open_manager_closes_the_manager_after_its_pending_save(monkeypatch):
  """Whatever fails inside the run, a pending save finishes before the manager closes
  (and both before what was registered earlier, the lock). Another order, or a missing
  callback, fails the list."""
  calls = []
  manager = types.SimpleNamespace(close=lambda: calls.append("close"),
                                  wait_until_finished=lambda: calls.append("wait"))
  monkeypatch.setattr(train_loop.checkpoint, "make_manager", lambda workdir, cfg: manager)
  with pytest.raises(RuntimeError):
    with contextlib.ExitStack() as cleanup:
      cleanup.callback(lambda: calls.append("release"))
      assert train_loop.open_manager(cleanup, "/w", None) is manager
      raise RuntimeError("the run failed")
  assert calls == ["wait", "close", "release"]


def test_loop_logs_due_steps_checks_them_first_and_stops_on_sigterm(tmp_path):
  """after_step writes a row at log_every (means since the last row, the learning
  rate, the rates), says when to save, refuses a non-finite step before its row is
  written, and turns a SIGTERM into due.stop at the next step."""
  manager = types.SimpleNamespace(wait_until_finished=lambda: None, latest_step=lambda: 2,
                                  directory="/w/checkpoints")
  rates = []
  with contextlib.ExitStack() as cleanup:
    loop = train_loop.Loop(cleanup, str(tmp_path), manager, start_step=0, total_steps=9,
                           log_every=2, save_every=4, skip_nonfinite=False)
    for step, loss in ((1, 2.0), (2, 4.0), (3, 1.0)):
      due = loop.after_step(step, _m(loss), tokens=10, learning_rate=lambda s=step: 0.1 * s,
                            flops=lambda: rates.append("flops") or 1e9, peak=1e12)
      assert (due.log, due.save, due.stop) == (step == 2, False, False)
    due = loop.after_step(4, _m(3.0), tokens=10, learning_rate=lambda: 0.4)
    assert (due.log, due.save, due.stop) == (True, True, False)
    loop.after_step(5, _m(float("nan"), finite=False), tokens=10, learning_rate=lambda: 0.5)
    with pytest.raises(FloatingPointError, match=r"at step 5; .*step 2 in /w/checkpoints"):
      loop.after_step(6, _m(1.0), tokens=10, learning_rate=lambda: 0.6)  # logged: checked
    os.kill(os.getpid(), signal.SIGTERM)  # heard by the loop's stop request
    due = loop.after_step(7, _m(1.0), tokens=10, learning_rate=lambda: 0.7)
    assert (due.log, due.save, due.stop) == (False, True, True)
  preemption.clear()  # the SIGTERM above is this test's, not the next run's
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [2, 4]  # nothing from the non-finite step 5
  assert rows[0]["loss"] == 3.0 and rows[0]["learning_rate"] == pytest.approx(0.2)
  assert rows[1]["loss"] == 2.0 and rows[1]["learning_rate"] == 0.4  # steps 3 and 4
  assert "mfu" in rows[0] and "mfu" not in rows[1] and rates == ["flops"]
