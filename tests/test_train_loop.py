"""bert_jax/train_loop.py: the bookkeeping both trainers share between steps."""

import types

import numpy as np
import pytest

from bert_jax import train_loop


def _m(loss, finite=True, grad_norm=1.0):
  return {"loss": np.float32(loss), "grad_norm": np.float32(grad_norm),
          "finite": np.float32(finite)}


def test_metrics_are_checked_one_step_late_and_averaged():
  metrics = train_loop.StepMetrics(lambda: "step 0 in /w", skip_nonfinite=False)
  metrics.add(1, _m(2.0))
  metrics.add(2, _m(4.0))
  assert metrics.means() == {"loss": 3.0, "grad_norm": 1.0, "finite": 1.0, "skipped_steps": 0.0}
  assert metrics.means() == {}  # cleared


def test_a_non_finite_step_stops_the_run_naming_the_step_and_the_last_good_checkpoint():
  metrics = train_loop.StepMetrics(lambda: "step 10 in /w/checkpoints", skip_nonfinite=False)
  metrics.add(11, _m(float("nan"), finite=False))  # pending: not fetched yet
  with pytest.raises(FloatingPointError, match=r"at step 11; .*step 10 in /w/checkpoints"):
    metrics.add(12, _m(1.0))  # the next step checks it


def test_skipped_non_finite_steps_are_counted():
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
  d = train_loop.due(step, 23, log_every=5, save_every=10, stop=stop, also_save=also)
  assert (d.log, d.save, d.stop) == expect


def test_save_flushes_the_logs_before_the_checkpoint(monkeypatch):
  calls = []
  monkeypatch.setattr(train_loop.checkpoint, "save",
                      lambda manager, step, state, data, force: calls.append(("save", step, data)))
  logs = [types.SimpleNamespace(flush=lambda i=i: calls.append(("flush", i))) for i in range(2)]
  state = types.SimpleNamespace(params=1, opt_state=2, step=3)
  train_loop.save(None, 7, state, {"input": "x"}, logs)
  assert calls == [("flush", 0), ("flush", 1), ("save", 7, {"input": "x"})]
