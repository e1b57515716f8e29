"""Tests for the Cloud TPU launcher, bert_jax.launch (the SLURM template's are in test_slurm.py).

The TPU launcher runs as `python -m bert_jax.launch` against a fake `gcloud`
put first on PATH: tests/fake_gcloud.py (the command surface it accepts, how it
fails on request, the harness FakeGcloud) and tests/fake_tpu_job.py (the job a
fake worker runs). Environment variables steer them: FAKE_JOB (how the job
ends), FAKE_JOB_HOLD (run until the test writes a release file),
FAKE_GCLOUD_FAIL(+_TIMES, _MESSAGE) (a step fails), FAKE_SSH_255 (the ssh of
these steps ends with 255 after running).
"""

import json
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from bert_jax.launch import plan as launch_plan
from bert_jax.preflight import cache as preflight_cache
from fake_gcloud import NAME, REPO, FakeGcloud

JOB_ID = f"tpu:proj/us-central2-b/{NAME}"
WHERE = ["--project=proj", "--zone=us-central2-b"]
QR = ["gcloud", "compute", "tpus", "queued-resources"]
VM = ["gcloud", "compute", "tpus", "tpu-vm"]
KEEPALIVE = ["--ssh-flag=-oServerAliveInterval=30", "--ssh-flag=-oServerAliveCountMax=4"]
DESCRIBE = QR + ["describe", NAME] + WHERE + ["--format=value(state.state)"]
CREATE = QR + ["create", NAME, f"--node-id={NAME}"] + WHERE + [
    "--accelerator-type=v4-32", "--runtime-version=tpu-ubuntu2204-base"]
DELETE = QR + ["delete", NAME] + WHERE + ["--force", "--async", "--quiet"]
CAT = ["gcloud", "storage", "cat", "gs://bucket/run1/job_state.json"]
# Re-runs judge the slice over a window that is short but real: a loss counts only after it
# lasted 1 s and two reads (at --poll_s=0.05); the other tests' launches use 0.
RERUN_WINDOW = "--preemption_window_s=1"
# The install and start scripts, written out (not taken from launch_plan).
GUARD = ('if [ -f $HOME/bert_jax_job.pid ] && kill -0 "$(cut -d\' \' -f1 $HOME/bert_jax_job.pid)"'
         ' 2>/dev/null; then echo "bert_jax job already running: $(cat $HOME/bert_jax_job.pid)";'
         ' exit 0; fi; ')
PY = "$HOME/bert_jax_venv/bin/python"
INSTALL = VM + ["ssh", NAME, "--worker=all"] + WHERE + [
    "--command=cd $HOME; " + GUARD + "set -e; rm -rf bert_jax && mkdir bert_jax && "
    "tar -xzf bert_jax_upload/bert_jax.tar.gz -C bert_jax --strip-components=1 && "
    "rm -rf bert_jax_upload && cd bert_jax && if ! python3.11 -c 'import ensurepip' >/dev/null 2>&1; then "
    "sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq && "
    "sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "
    "python3.11 python3.11-venv; fi && if ! $HOME/bert_jax_venv/bin/python -c "
    "'import sys; assert sys.version_info >= (3, 11)' >/dev/null 2>&1; then "
    "python3.11 -m venv --clear $HOME/bert_jax_venv; fi && "
    f"{PY} -m pip install --quiet --upgrade pip && {PY} -m pip install --quiet '.[tpu]' && "
    f"{PY} -c 'import socket, sys, jax; print(socket.gethostname(), \"python\", "
    "sys.version.split()[0], \"jax\", jax.__version__, jax.devices())'"]
# The job's start: `python -c RUN_AND_RECORD MODULE ARGS` (what RUN_AND_RECORD does is
# tests/test_artifact.py's).
MAIN_ARGS = (f"-c {shlex.quote(launch_plan.run_and_record_line())} bert_jax.main "
             "--config=experiments/configs/pretrain.py:base"
             " --workdir=gs://bucket/run1 --config.distributed.enabled=True"
             " --config.slice=v4-32"  # the slice's tested layout (bert_jax/run/layouts.py)
             " --config.total_steps=7 '--config.data.corpus=gs://bucket/text/*.txt'")


def start_command(attempt: str = "ATTEMPT") -> list[str]:
  return VM + ["ssh", NAME, "--worker=all"] + WHERE + KEEPALIVE + [
      "--command=" + GUARD + "cd $HOME/bert_jax || exit 1; "
      f'echo "=== attempt {attempt} $(date -u +%FT%TZ)" >> $HOME/bert_jax_job.log; '
      f"env BERT_JAX_JOB_ID={JOB_ID} BERT_JAX_JOB_ATTEMPT={attempt} setsid nohup {PY} "
      f"{MAIN_ARGS} >> $HOME/bert_jax_job.log 2>&1 < /dev/null & "
      f'echo "$! {attempt}" > $HOME/bert_jax_job.pid; '
      'echo "bert_jax job started: $(cat $HOME/bert_jax_job.pid)"']


def _attempts_as_placeholder(command: list[str]) -> list[str]:
  """The attempt number is the start's Unix time: the one part a test cannot write out."""
  return [re.sub(r"(attempt |ATTEMPT=|\$! )\d+", r"\1ATTEMPT", a) for a in command]


@pytest.fixture
def gcloud(tmp_path, installed_artifact) -> FakeGcloud:
  fake = FakeGcloud(tmp_path, installed_artifact)
  yield fake
  (tmp_path / "release").write_text("")  # no fake job outlives its test


def _error_line(result) -> str:
  return result.stderr.strip().splitlines()[-1]


def _collapse_watch(commands: list[list[str]]) -> list[list[str]]:
  """Repeated looks at the slice and the job (how many depends on timing) counted once."""
  out = []
  for c in commands:
    if out[-2:] == [DESCRIBE, CAT] and c == DESCRIBE:
      out.pop()
      out.pop()
    out.append(c)
  return out


def test_workers_per_accelerator_type_and_the_v5e_alias():
  """Fails if num_workers gives another host count for a known accelerator type, v5e-N is not
  canonicalized as v5litepod-N, or an unknown type is accepted instead of pointing to
  --num_workers."""
  from bert_jax import accelerators
  from bert_jax.launch import plan as launch_plan
  expected = {"v2-8": 1, "v2-32": 4, "v3-8": 1, "v3-128": 16, "v4-8": 1, "v4-32": 4,
              "v4-4096": 512, "v5litepod-1": 1, "v5litepod-8": 1, "v5litepod-16": 4,
              "v5e-256": 64, "v5p-8": 1, "v5p-128": 16, "v6e-4": 1, "v6e-8": 1, "v6e-16": 4,
              "v6e-256": 64}
  assert {t: launch_plan.num_workers(t) for t in expected} == expected
  assert [accelerators.canonical(t) for t in ("v5e-16", "v5litepod-8", "v4-32")] == [
      "v5litepod-16", "v5litepod-8", "v4-32"]
  with pytest.raises(ValueError, match="unknown accelerator type 'v9-8'.*--num_workers"):
    launch_plan.num_workers("v9-8")
  with pytest.raises(ValueError, match="--num_workers"):
    launch_plan.num_workers("tpu-32")


def test_the_fake_refuses_what_gcloud_refuses(gcloud):
  """Fails if the fake accepted an unknown flag or a v5e-N accelerator type (issue 22)."""
  def run(*argv):
    return subprocess.run(["gcloud", *argv], env=gcloud.env, capture_output=True, text=True)
  result = run(*QR[1:], "create", NAME, "--node-id=x", "--zone=z", "--accelerator-type=v4-8",
               "--runtime-version=r", "--foo")
  assert (result.returncode, result.stderr.strip()) == (
      2, "ERROR: (gcloud.compute.tpus.queued-resources.create) unrecognized arguments: --foo")
  # --autocheckpoint-enabled is an alpha flag: refused on the GA track, accepted on alpha.
  create = ["create", NAME, "--node-id=x", "--zone=z", "--runtime-version=r"]
  result = run(*QR[1:], *create, "--accelerator-type=v4-8", "--autocheckpoint-enabled")
  assert result.returncode == 2 and "unrecognized arguments: --autocheckpoint-enabled" in (
      result.stderr)
  result = run(*QR[1:], *create, "--accelerator-type=v5e-16")
  assert result.returncode == 1 and "INVALID_ARGUMENT: accelerator type 'v5e-16'" in result.stderr
  result = run("alpha", *QR[1:], *create, "--accelerator-type=v5litepod-16",
               "--autocheckpoint-enabled")
  assert result.returncode == 0, result.stderr
  result = run(*VM[1:], "ssh", NAME, "--zone=z", "--workers=all")
  assert result.returncode == 2 and "unrecognized arguments: --workers=all" in result.stderr


def test_dry_run_prints_the_written_out_sequence_and_runs_nothing(gcloud):
  """The expected list is written out here; the real run (jobs done at once) issues it too."""
  upload = VM + ["scp", "--recurse", gcloud.upload, f"{NAME}:", "--worker=all"] + WHERE
  expected = [CAT, DESCRIBE, CREATE, DESCRIBE, upload, INSTALL,
              start_command(), DESCRIBE, CAT, DELETE]
  dry = gcloud.launch("--dry_run")
  assert dry.returncode == 0, dry.stderr
  assert not gcloud.log.exists()
  printed = [_attempts_as_placeholder(shlex.split(line)) for line in dry.stdout.splitlines()]
  assert printed == expected
  real = gcloud.launch("--nofollow_logs")
  assert real.returncode == 0, real.stderr
  assert _collapse_watch([_attempts_as_placeholder(c) for c in gcloud.commands()]) == expected
  # What was uploaded is the sdist alone, unpacked on every worker as the job's tree.
  upload = pathlib.Path(gcloud.upload)
  assert sorted(p.name for p in upload.iterdir()) == ["bert_jax.tar.gz"]
  for worker in range(4):
    tree = gcloud.root / f"worker_{worker}" / "bert_jax"
    assert (tree / "PKG-INFO").is_file() and (tree / "setup.cfg").is_file()
    assert (tree / "host" / "paths.py").read_text() == (REPO / "host" / "paths.py").read_text()
    assert not list(tree.rglob("__pycache__"))
  # Each worker printed its Python, JAX and devices during the install.
  assert "[launch] install: worker-3 python 3.11.0 jax 0.7.2 [TpuDevice(id=3)]" in real.stdout


def test_one_job_per_worker_with_the_lock_identity_in_its_environment(gcloud):
  """Fails if a launch does not start one job on each of the 4 workers with BERT_JAX_JOB_ID and a
  current BERT_JAX_JOB_ATTEMPT, the record is not done/0 for that attempt, or the job's output goes
  to the launcher's stdout rather than the worker's log."""
  result = gcloud.launch("--nofollow_logs")
  assert result.returncode == 0, result.stderr
  starts = gcloud.starts()
  assert sorted(s["worker"] for s in starts) == [0, 1, 2, 3]
  # BERT_JAX_JOB_ID / BERT_JAX_JOB_ATTEMPT reach the job (the workdir lock reads them).
  assert {s["job_id"] for s in starts} == {JOB_ID}
  (attempt,) = {s["attempt"] for s in starts}
  assert abs(attempt - time.time()) < 120
  record = json.loads(gcloud.record.read_text())
  assert (record["state"], record["exit_code"], record["attempt"]) == ("done", 0, attempt)
  # The job's output is in its log on the worker, not in the ssh that started it.
  log = (gcloud.root / "worker_2" / "bert_jax_job.log").read_text()
  assert f"=== attempt {attempt}" in log and "worker 2 finished" in log
  assert "worker 2 finished" not in result.stdout


def test_a_suite_runs_as_one_job_on_a_one_host_slice(gcloud):
  """--job=evaluate (the paper's tables on a slice): fails if the job started is not
  `python -m experiments.evaluate --workdir=WORKDIR` with the flags after `--`, if it is not
  watched to its record and the slice deleted like a training job's, if the training job's
  preflight or store check runs for it, or if a multi-host slice or a --config is accepted."""
  base = [sys.executable, "-m", "bert_jax.launch", f"--name={NAME}", "--project=proj",
          "--zone=us-central2-b", "--workdir=gs://bucket/run1", "--job=evaluate",
          "--poll_s=0.05", "--retry_s=0.01", "--preemption_window_s=0", "--stale_after_s=30",
          "--start_timeout_s=20", f"--logdir={gcloud.logdir}", "--nofollow_logs"]
  suite = ["--suite=glue", "--init_checkpoint=gs://bucket/bert-base/checkpoints",
           "--glue_dir=gs://bucket/glue_data"]

  def launch(*flags):  # the fake's slice is one VM, as a v4-8 is
    return subprocess.run(base + list(flags), cwd=REPO, env={**gcloud.env, "FAKE_WORKERS": "1"},
                          capture_output=True, text=True, timeout=120)

  pod = launch("--accelerator_type=v4-32", "--", *suite)
  assert pod.returncode == 1 and _error_line(pod) == (
      "error: --job=evaluate runs on one host; v4-32 has 4 workers: use a one-host slice of "
      "the generation (e.g. v4-8), reading the same gs:// checkpoint"), pod.stderr
  config = launch("--accelerator_type=v4-8", "--config=experiments/configs/pretrain.py:base",
                  "--", *suite)
  assert config.returncode == 1 and "not --config" in _error_line(config), config.stderr
  assert not gcloud.log.exists()  # both refused before any gcloud call
  done = launch("--accelerator_type=v4-8", "--", *suite)
  assert done.returncode == 0, done.stderr
  (start,) = gcloud.starts()
  assert start["module"] == "experiments.evaluate"
  assert start["argv"] == ["--workdir=gs://bucket/run1", *suite]
  record = json.loads(gcloud.record.read_text())
  assert (record["state"], record["attempt"]) == ("done", start["attempt"])
  assert gcloud.commands()[-1] == DELETE
  assert "preflight" not in done.stdout + done.stderr
  assert "tokenized store" not in done.stdout + done.stderr


def test_v5e_is_sent_as_v5litepod_and_autocheckpoint_uses_the_alpha_track(gcloud):
  """Fails if --autocheckpoint on v5e-16 does not send one create on the alpha track with
  v5litepod-16, the v5e runtime and --autocheckpoint-enabled."""
  result = gcloud.launch("--nofollow_logs", "--autocheckpoint", accelerator_type="v5e-16")
  assert result.returncode == 0, result.stderr
  (create,) = [c for c in gcloud.commands() if "create" in c]
  assert create == ["gcloud", "alpha"] + QR[1:] + [
      "create", NAME, f"--node-id={NAME}"] + WHERE + [
      "--accelerator-type=v5litepod-16", "--runtime-version=v2-alpha-tpuv5-lite",
      "--autocheckpoint-enabled"]


def test_failed_create_names_the_step_and_gcloud_error(gcloud):
  """Fails if a create that gcloud refuses does not exit 1 with a last line naming step 'create' and
  gcloud's message, or anything is called after the create."""
  result = gcloud.launch(FAKE_GCLOUD_FAIL="create",
                         FAKE_GCLOUD_FAIL_MESSAGE="RESOURCE_EXHAUSTED: Quota TPUV4_POD exceeded.")
  assert result.returncode == 1
  assert _error_line(result) == (
      "error: launch failed at step 'create': gcloud exited 1: "
      "ERROR: (gcloud.fake.create) RESOURCE_EXHAUSTED: Quota TPUV4_POD exceeded.")
  assert gcloud.commands() == [CAT, DESCRIBE, CREATE]


def test_one_failed_install_is_retried(gcloud):
  """A PyPI hiccup during an install: the second try goes through, nothing is deleted early."""
  result = gcloud.launch("--nofollow_logs", FAKE_GCLOUD_FAIL="install", FAKE_GCLOUD_FAIL_TIMES="1",
                         FAKE_GCLOUD_FAIL_MESSAGE="Read timed out. (read timeout=15)")
  assert result.returncode == 0, result.stderr
  assert gcloud.steps().count("install") == 2 and gcloud.steps().count("delete") == 1
  assert gcloud.steps().index("delete") == len(gcloud.steps()) - 1


def test_an_install_that_keeps_failing_stops_and_leaves_the_slice(gcloud):
  """Fails if an install that always fails is not tried exactly 3 times, does not end with a last
  line naming step 'install' and gcloud's error, or deletes the slice."""
  result = gcloud.launch(FAKE_GCLOUD_FAIL="install",
                         FAKE_GCLOUD_FAIL_MESSAGE="No matching distribution found for libtpu")
  assert result.returncode == 1
  assert _error_line(result) == (
      "error: launch failed at step 'install': gcloud exited 1: "
      "ERROR: (gcloud.fake.install) No matching distribution found for libtpu")
  assert gcloud.steps().count("install") == 3 and "delete" not in gcloud.steps()


def test_one_transient_describe_failure_is_retried(gcloud):
  """Fails if one failed state read ended (or deleted) anything."""
  result = gcloud.launch("--nofollow_logs", FAKE_GCLOUD_FAIL="describe",
                         FAKE_GCLOUD_FAIL_TIMES="1",
                         FAKE_GCLOUD_FAIL_MESSAGE="UNAVAILABLE: The service is currently unavailable.")
  assert result.returncode == 0, result.stderr
  assert "describe: gcloud exited 1 (ERROR: (gcloud.fake.describe) UNAVAILABLE" in result.stdout
  assert gcloud.commands()[:3] == [CAT, DESCRIBE, DESCRIBE]
  assert gcloud.steps().count("create") == 1 and gcloud.commands()[-1] == DELETE


def test_state_reads_that_keep_failing_exit_without_deleting(gcloud):
  """Fails if reads that keep failing deleted or created anything, or if the last line claims
  a job that this launch never started ("the job (if started) keeps running")."""
  (gcloud.root / "states.json").write_text('["ACTIVE"]')
  result = gcloud.launch("--nofollow_logs", FAKE_GCLOUD_FAIL="describe",
                         FAKE_GCLOUD_FAIL_MESSAGE="UNAVAILABLE: The service is currently "
                                                  "unavailable.")
  assert result.returncode == 1
  line = _error_line(result)
  assert "gcloud failed 5 times in a row" in line, line
  assert line.endswith("This launch created nothing and started no job (nothing was deleted); "
                       "re-run the same command to go on"), line
  assert "keeps running" not in line
  assert gcloud.steps().count("describe") == 5
  assert "delete" not in gcloud.steps() and "create" not in gcloud.steps()


def test_a_failed_job_stops_with_its_last_lines_and_leaves_the_slice(gcloud):
  """Fails if a job that exits 1 is started again, the slice is deleted, or the last line does not
  name step 'run', the exit code, the job's last output (ValueError: boom) and --action=delete."""
  result = gcloud.launch("--nofollow_logs", FAKE_JOB="fail")
  assert result.returncode == 1
  line = _error_line(result)
  assert line.startswith("error: launch failed at step 'run': the job failed (exit code 1 on "), line
  assert "ValueError: boom" in line and "--action=delete" in line, line
  assert gcloud.steps().count("start") == 1 and "delete" not in gcloud.steps()


def test_a_job_that_dies_at_import_is_reported_at_once_and_not_started_again(gcloud):
  """Fails if a job that exits 1 at import (before any record: the upload once lacked host/)
  is taken for one still starting (until --start_timeout_s) or relaunched, if the launcher's
  last line lacks the log's traceback, or if the slice of this one-off job is left alive.

  The start timeout here is 600 s: only the exit check can end the watch in time."""
  started = time.monotonic()
  result = gcloud.launch("--nofollow_logs", "--start_timeout_s=600", "--poll_s=1",
                         FAKE_JOB="import_error")
  elapsed = time.monotonic() - started
  assert result.returncode == 1, result.stderr
  assert elapsed < 120, elapsed
  line = _error_line(result)
  assert line.startswith("error: launch failed at step 'start': the job exited 1 on worker 0 "
                         "before writing its first record in the workdir, so it is not started "
                         "again"), line
  assert "ModuleNotFoundError: No module named 'host'" in line, line
  assert line.endswith(f"the slice {NAME} is being deleted"), line
  assert gcloud.steps().count("start") == 1
  assert gcloud.commands()[-1] == DELETE and gcloud.slice_state(NAME) == "DELETING"
  assert not gcloud.record.exists()
  for worker in range(4):  # the start recorded the exit of this attempt on every worker
    code, attempt = (gcloud.root / f"worker_{worker}" / "bert_jax_job.exit").read_text().split()
    assert code == "1" and abs(int(attempt) - time.time()) < 120


def test_a_preempted_job_restarts_on_the_same_active_slice(gcloud):
  """Exit 143 with the slice ACTIVE (a maintenance event): start again, same identity."""
  result = gcloud.launch("--nofollow_logs", FAKE_JOB="preempt_first")
  assert result.returncode == 0, result.stderr
  steps = gcloud.steps()
  assert (steps.count("create"), steps.count("install"), steps.count("start")) == (1, 1, 2)
  assert "relaunch 1 of at most 10, on the same slice" in result.stdout
  first, second = [[s for s in gcloud.starts() if s["worker"] == 0][i] for i in (0, 1)]
  assert first["job_id"] == second["job_id"] == JOB_ID and second["attempt"] > first["attempt"]
  assert steps[-1] == "delete"


def test_a_suspended_slice_is_recreated(gcloud):
  """Fails if a slice SUSPENDED under its job is not deleted, then created, installed and started
  again (2 of each), the output does not say "on a new slice", or the slice is not deleted last."""
  result = gcloud.launch("--nofollow_logs", FAKE_JOB="suspend_first")
  assert result.returncode == 0, result.stderr
  steps = gcloud.steps()
  assert (steps.count("create"), steps.count("install"), steps.count("start")) == (2, 2, 2)
  assert "on a new slice" in result.stdout
  # The broken slice is deleted (and awaited) before it is created again.
  assert steps.index("delete") < len(steps) - 1 - steps[::-1].index("create")
  assert steps[-1] == "delete"


def test_one_failed_state_read_is_not_a_preemption(gcloud):
  """One FAILED read of the queued resource, then ACTIVE again: nothing is relaunched."""
  result = gcloud.launch("--nofollow_logs", FAKE_JOB="blip")
  assert result.returncode == 0, result.stderr
  assert "slice FAILED; job running" in result.stdout and "(watching whether this lasts)" in (
      result.stdout)
  steps = gcloud.steps()
  assert (steps.count("create"), steps.count("start")) == (1, 1)
  assert "relaunch" not in result.stdout


def test_relaunches_are_bounded(gcloud):
  """Fails if, with --max_relaunches=1, a job preempted every time is started other than twice, the
  launch does not exit 1 saying it was lost again after 1 relaunches, or the slice is deleted."""
  result = gcloud.launch("--nofollow_logs", "--max_relaunches=1", FAKE_JOB="preempt_always")
  assert result.returncode == 1
  assert _error_line(result).startswith(
      "error: launch failed at step 'run': the job was lost again after 1 relaunches")
  assert gcloud.steps().count("start") == 2 and "delete" not in gcloud.steps()


def test_ssh_255_while_the_slice_is_active_deletes_nothing_and_rerun_attaches(gcloud):
  """Every ssh ends with 255 (the laptop's network drops) while the slice stays ACTIVE.

  Fails if the launcher deleted the slice, stopped watching on its own, started a
  second job, or a re-run started anything instead of attaching.
  """
  # Held until released (600 s at most, not the fake's 60): a Ctrl-C that does not reach
  # the launcher (SIGINT inherited ignored: tests/conftest.py restores it) then fails as a
  # timeout below, not as an exit 0 after the job ended on its own.
  env = {"FAKE_SSH_255": "start,logs", "FAKE_JOB_HOLD": "1", "FAKE_JOB_HOLD_S": "600"}
  launcher = gcloud.popen(**env)
  gcloud.wait_for(gcloud.running, "'running' record")
  time.sleep(0.5)  # several more polls with ssh failing
  assert launcher.poll() is None, gcloud.output()
  assert "delete" not in gcloud.steps()
  assert "lost the ssh while starting attempt" in gcloud.output()
  launcher.send_signal(signal.SIGINT)  # the user stops watching
  # The bound only guards against a hang: the exit takes seconds once SIGINT is delivered
  # (the slow exits seen before were SIGINT ignored, the job ending on its own).
  assert launcher.wait(timeout=180) == 1, gcloud.output()[-3000:]
  assert "nothing was deleted and the job keeps running: re-run the same command to attach" in (
      gcloud.output())
  assert "delete" not in gcloud.steps()
  before = len(gcloud.commands())
  again = gcloud.popen(RERUN_WINDOW, **env)
  gcloud.wait_for(lambda: "attaching to the running job" in gcloud.output(), "attach")
  (gcloud.root / "release").write_text("")
  assert again.wait(timeout=60) == 0, gcloud.output()
  later = gcloud.steps()[before:]
  assert "start" not in later and "install" not in later and "create" not in later, later
  assert later[-1] == "delete" and gcloud.steps().count("delete") == 1
  assert len(gcloud.starts()) == 4  # one job per worker, ever
  assert json.loads(gcloud.record.read_text())["state"] == "done"


def test_a_launcher_killed_mid_run_is_re_run_and_attaches(gcloud):
  """kill -9 while the job runs; the re-run attaches and no second job starts."""
  launcher = gcloud.popen(FAKE_JOB_HOLD="1")
  gcloud.wait_for(gcloud.running, "'running' record")
  launcher.kill()
  launcher.wait(timeout=30)
  assert "delete" not in gcloud.steps()
  before = len(gcloud.commands())
  again = gcloud.popen(RERUN_WINDOW, FAKE_JOB_HOLD="1")
  gcloud.wait_for(lambda: "attaching to the running job" in gcloud.output(), "attach")
  # Worker 0's log is streamed to the terminal and the local copy while watching (awaited
  # before the job ends: a job released at once could end before the first look at it).
  # Awaited on the re-run's own output: the local copy also holds the killed launcher's lines.
  local_copy = pathlib.Path(gcloud.logdir / "worker_0.log")
  gcloud.wait_for(lambda: "[worker 0] hello from worker 0" in gcloud.output(),
                  "worker 0's log streamed by the re-run")
  (gcloud.root / "release").write_text("")
  assert again.wait(timeout=60) == 0, gcloud.output()
  later = gcloud.steps()[before:]
  assert "start" not in later and "install" not in later, later
  assert len(gcloud.starts()) == 4 and later[-1] == "delete"
  assert "[worker 0] hello from worker 0" in local_copy.read_text()  # in the local copy too


def test_a_done_workdir_only_deletes(gcloud):
  """Fails if a launch whose workdir already records this job done does anything but read the record
  and the slice state and delete the slice."""
  gcloud.record.parent.mkdir(parents=True)
  gcloud.record.write_text(json.dumps({"state": "done", "job_id": JOB_ID, "attempt": 5,
                                       "time": time.time(), "host": "h", "exit_code": 0}))
  (gcloud.root / "states.json").write_text('["ACTIVE"]')
  result = gcloud.launch("--nofollow_logs", RERUN_WINDOW)
  assert result.returncode == 0, result.stderr
  assert gcloud.commands() == [CAT, DESCRIBE, DELETE]


def test_a_passed_preflight_is_remembered_and_a_refusal_is_not(tmp_path, monkeypatch):
  """Fails if the launcher compiles again a preflight that passed with the same config, flags,
  slice and source (a re-run to attach would wait minutes), reuses a pass for other flags,
  or remembers a refusal."""
  from bert_jax.launch import launcher
  from bert_jax.launch.state import LaunchError
  compiled = []

  def run_preflight(config, overrides, accelerator_type):
    compiled.append(overrides)
    if "--config.batch_size=9999" in overrides:
      raise LaunchError("preflight", "phase 1 needs 99 GiB")
    return "preflight base on v4-32: fits"

  monkeypatch.setattr(launcher, "run_preflight", run_preflight)
  monkeypatch.setenv("BERT_JAX_PREFLIGHT_CACHE", str(tmp_path / "cache"))
  config = "experiments/configs/pretrain.py:base"
  monkeypatch.chdir(REPO)
  for overrides in (["--config.total_steps=7"], ["--config.total_steps=7"], []):
    launcher.preflight(config, overrides, "v4-32", str(REPO))
  assert compiled == [["--config.total_steps=7"], []]
  for _ in range(2):
    with pytest.raises(LaunchError, match="phase 1 needs 99 GiB"):
      launcher.preflight(config, ["--config.batch_size=9999"], "v4-32", str(REPO))
  assert len(compiled) == 4
  key = preflight_cache.key(config, [], "v4-32", str(REPO))
  assert (tmp_path / "cache" / f"{key}.txt").read_text() == (
      "preflight base on v4-32: fits\n")
  assert key != preflight_cache.key(config, [], "v4-8", str(REPO))


@pytest.mark.slow  # the preflight child imports JAX, TensorFlow and libtpu: ~20 s of CPU
def test_a_refused_config_makes_no_gcloud_call(gcloud):
  """The real launcher and preflight, on a config the trainer refuses (a global batch of 3 over
  a v4-8's 4 chips), which preflight refuses before compiling anything (seconds).

  Fails if any gcloud call (even a read of the slice's or the job's state) comes before the
  refusal. tests/test_preflight.py checks the same for an oversized batch (a compile)."""
  result = gcloud.launch("--noskip_preflight", "--config=experiments/configs/pretrain.py:tiny",
                         "--config.batch_size=3", accelerator_type="v4-8", timeout=600,
                         JAX_PLATFORMS="cpu")
  assert result.returncode == 1, result.stderr[-2000:]
  assert _error_line(result).startswith(
      "error: launch failed at step 'preflight': the trainer would refuse this config: "
      "config.batch_size=3 is not divisible"), result.stderr[-2000:]
  assert gcloud.commands() == []


def test_a_re_run_does_not_compile_a_remembered_preflight_again(gcloud):
  """With the preflight on and its pass remembered (as after a first launch), the launcher
  prints the remembered pass, compiles nothing and goes on exactly as without preflight.
  Fails if a re-run (to attach, say) would wait for a compile it already passed."""
  overrides = ["--config.total_steps=7", "--config.data.corpus=gs://bucket/text/*.txt"]
  key = preflight_cache.key("experiments/configs/pretrain.py:base", overrides, "v4-32",
                            str(REPO))
  passed = gcloud.preflight_cache / f"{key}.txt"
  passed.parent.mkdir(parents=True)
  passed.write_text("fits\n")
  result = gcloud.launch("--nofollow_logs", "--noskip_preflight", RERUN_WINDOW)
  assert result.returncode == 0, result.stderr
  assert "passed for v4-32 before, with this source tree and these flags" in result.stdout
  assert "not compiled again" in result.stdout and "compiling" not in result.stdout
  assert gcloud.commands()[0] == CAT and gcloud.commands()[-1] == DELETE


def test_status_logs_and_delete_actions(gcloud):
  """Fails if --action=status misreports a missing slice, job record or WAITING_FOR_RESOURCES state,
  --action=delete does not delete and say so, or --action=logs does not print worker 1's log via
  `tail -n 200`."""
  result = gcloud.launch("--action=status")
  assert (result.returncode, result.stdout.splitlines()) == (
      0, [f"{NAME}: not found", "job: no job record"])
  (gcloud.root / "states.json").write_text('["WAITING_FOR_RESOURCES"]')
  result = gcloud.launch("--action=status")
  assert result.stdout.splitlines()[0] == f"{NAME}: WAITING_FOR_RESOURCES"
  result = gcloud.launch("--action=delete")
  assert (result.returncode, result.stdout.splitlines()[-1]) == (0, f"{NAME}: deleting")
  assert gcloud.commands() == [DESCRIBE, CAT, DESCRIBE, CAT, DELETE]
  (gcloud.root / "states.json").write_text('["ACTIVE"]')
  (gcloud.root / "worker_1").mkdir()
  (gcloud.root / "worker_1" / "bert_jax_job.log").write_text("line 1\nline 2\n")
  result = gcloud.launch("--action=logs", "--worker=1", "--nofollow")
  assert (result.returncode, result.stdout) == (0, "line 1\nline 2\n")
  assert gcloud.commands()[-1] == VM + ["ssh", NAME, "--worker=1"] + WHERE + KEEPALIVE + [
      "--command=tail -n 200 $HOME/bert_jax_job.log"]


def test_flag_errors_are_one_clear_line(gcloud):
  """Fails if an unknown accelerator type (with --num_workers suggested) or a non-gs:// workdir does
  not exit 1 with stderr one line saying so (no traceback, no log lines), or any gcloud call is
  made."""
  result = gcloud.launch(accelerator_type="v9-32")
  assert result.returncode == 1 and "unknown accelerator type 'v9-32'" in _error_line(result)
  assert "--num_workers" in _error_line(result)
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  result = gcloud.launch("--workdir=/tmp/local")
  assert result.returncode == 1 and "must be a gs:// directory" in _error_line(result)
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert not gcloud.log.exists()
