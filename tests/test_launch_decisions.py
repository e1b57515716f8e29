"""What a launch decides from what it reads (bert_jax.launch): a re-run is judged over
--preemption_window_s like the watch, gcloud's refusals stop it at once, --dry_run says what
it skips. The harness is tests/test_launch.py's (the fake gcloud of tests/fake_gcloud.py).
"""

import json
import time

import pytest

from test_launch import JOB_ID, RERUN_WINDOW, _error_line
from test_launch import gcloud  # pylint: disable=unused-import  # a fixture


# --- a re-run decides over --preemption_window_s, as the watch does, never on one read ---


def _record(gcloud, state="running", attempt=5, age_s=0.0):
  """Writes this launch's job record as the job would (a heartbeat `age_s` old)."""
  gcloud.record.parent.mkdir(parents=True, exist_ok=True)
  gcloud.record.write_text(json.dumps({
      "state": state, "job_id": JOB_ID, "attempt": attempt, "time": time.time() - age_s,
      "host": "worker-0", "exit_code": None if state == "running" else 0}))


def test_one_failed_read_on_a_re_run_with_a_fresh_heartbeat_deletes_nothing(gcloud):
  """The laptop slept, the user re-runs the command to attach, and the first describe says
  FAILED once (then ACTIVE) while the job's heartbeat is fresh.

  Fails if the re-run deleted or created the slice or started a job instead of
  attaching: before the decision went through the judge, that one read made it say
  "deleting it to create it again" and delete a slice whose job was running."""
  _record(gcloud)
  (gcloud.root / "states.json").write_text('["FAILED", "ACTIVE"]')
  launcher = gcloud.popen("--nofollow_logs", RERUN_WINDOW)
  try:
    gcloud.wait_for(lambda: "attaching" in gcloud.output() or "deleting" in gcloud.output()
                    or launcher.poll() is not None, "a decision")
    time.sleep(1.5)  # past the window: the judge has seen ACTIVE again meanwhile
    _record(gcloud, "done")
    assert launcher.wait(timeout=60) == 0, gcloud.output()
  finally:
    if launcher.poll() is None:
      launcher.kill()
      launcher.wait()
  output, steps = gcloud.output(), gcloud.steps()
  assert "deleting it to create it again" not in output, output
  assert "attaching to the job (running (attempt 5 on worker-0" in output, output
  assert "the slice reads FAILED" in output and "relaunch" not in output, output
  assert not {"create", "install", "start"} & set(steps), steps
  assert steps.count("delete") == 1 and steps[-1] == "delete"  # only the done job's slice
  assert not gcloud.starts()


def test_a_failed_slice_that_lasts_on_a_re_run_is_recreated_after_the_window(gcloud):
  """The same re-run, but the slice stays FAILED. Fails if it was deleted before the window
  passed (the run would take under 1 s), or was not deleted and re-created at all."""
  _record(gcloud)
  (gcloud.root / "states.json").write_text('["FAILED"]')
  started = time.monotonic()
  result = gcloud.launch("--nofollow_logs", RERUN_WINDOW)
  assert result.returncode == 0, result.stdout + result.stderr
  assert time.monotonic() - started > 1.0
  steps = gcloud.steps()
  assert (steps.count("create"), steps.count("install"), steps.count("start")) == (1, 1, 1)
  assert steps.index("delete") < steps.index("create") and steps[-1] == "delete", steps
  out = result.stdout
  assert out.index("(watching whether this lasts)") < out.index("relaunch 1 of at most 10, on a "
                                                               "new slice"), out


def test_a_re_run_finding_a_stale_heartbeat_restarts_on_the_slice_after_the_window(gcloud):
  """An ACTIVE slice whose job's record says 'running' with a heartbeat older than
  --stale_after_s (the job hung or its VM went away). Fails if it was restarted before the
  window passed, or the slice was deleted or re-created."""
  _record(gcloud, age_s=60)  # --stale_after_s=30
  (gcloud.root / "states.json").write_text('["ACTIVE"]')
  started = time.monotonic()
  result = gcloud.launch("--nofollow_logs", RERUN_WINDOW)
  assert result.returncode == 0, result.stdout + result.stderr
  assert time.monotonic() - started > 1.0
  steps = gcloud.steps()
  assert "create" not in steps and steps.count("delete") == 1 and steps[-1] == "delete", steps
  assert "its heartbeat is stale" in result.stdout
  assert "relaunch 1 of at most 10, on the same slice" in result.stdout


# gcloud's own words when no account is logged in (gcloud 4xx, `gcloud storage cat`).
NOT_LOGGED_IN = ("You do not currently have an active account selected.\nPlease run:\n\n"
                 "  $ gcloud auth login\n\nto obtain new credentials.\n\nIf you have already "
                 "logged in with a different account, run:\n\n  $ gcloud config set account "
                 "ACCOUNT\n\nto select an already authenticated account to use.")


@pytest.mark.parametrize("step,message", [
    ("job_state", NOT_LOGGED_IN),
    ("describe", "PERMISSION_DENIED: Permission 'tpu.queuedResources.get' denied on "
                 "'projects/proj/locations/us-central2-b/queuedResources/bert-test'")])
def test_a_gcloud_that_is_not_authorized_stops_at_once_in_one_line(gcloud, step, message):
  """Fails if an authentication or permission error is retried as if it were transient (the
  5 tries took 75 s at the default --retry_s), loses gcloud's hint, is more than one line,
  or says a job "keeps running" when this launch created nothing."""
  result = gcloud.launch("--nofollow_logs", FAKE_GCLOUD_FAIL=step,
                         FAKE_GCLOUD_FAIL_MESSAGE=message)
  assert result.returncode == 1
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  line = _error_line(result)
  read = {"job_state": "job state", "describe": "describe"}[step]
  assert line.startswith(f"error: launch failed at step '{read}': gcloud is not authorized "
                         "(not retried): ERROR: (gcloud.fake."), line
  assert " ".join(message.split()) in line, line  # gcloud's hint, whole, on the one line
  assert line.endswith("This launch created nothing and started no job (nothing was deleted); "
                       "re-run the same command to go on"), line
  assert gcloud.steps().count({"job_state": "cat"}.get(step, step)) == 1  # no retry
  assert "create" not in gcloud.steps() and "delete" not in gcloud.steps()


def test_dry_run_says_it_skips_the_preflight(gcloud):
  """Fails if --dry_run without --skip_preflight skips the preflight silently, or puts that
  note among the commands on stdout (which must stay the commands alone)."""
  result = gcloud.launch("--dry_run", "--noskip_preflight")
  assert result.returncode == 0, result.stderr
  assert result.stderr.strip() == (
      "[launch] --dry_run prints the gcloud commands only; it also skips the preflight that a "
      "real launch runs first: `python -m bert_jax.preflight "
      "--config=experiments/configs/pretrain.py:base --topology=v4-32` (with the same "
      "--config.X flags) checks the fit")
  assert all(line.startswith("gcloud ") for line in result.stdout.splitlines())
  assert not gcloud.log.exists()
