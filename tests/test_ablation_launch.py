"""Tests of experiments.ablation --launch: the grid's runs as Cloud TPU jobs (launch.py, grid.py).

The grid is the `smoke` variant with 2 pretraining seeds: 2 settings x 2 seeds, its
prepare stage writing only plan.json (no corpus). The launches go to the project's
fake gcloud (tests/fake_gcloud.py: one directory per queued resource; its fake jobs
train nothing, they write their job record and end as FAKE_JOB, FAKE_JOB_FAIL and
FAKE_JOB_HOLD say), so the tests stop after the pretrain stage; that the later stages
leave a given-up run out and name it unfinished is shown on a planned workdir. Two
stores stand for gs:// here: the orchestrator's own files (DIR/grid.json, plan.json,
the lock) go through host.paths to the GCS emulator of tests/conftest.py; the jobs'
records, which the launcher reads with `gcloud storage cat`, lie in the fake's map.
"""

import collections
import json
import pathlib
import subprocess
import sys
import uuid

import pytest

from bert_jax.launch import launcher as launcher_lib
from experiments.ablation import grid as ablation_grid
from experiments.ablation import launch as ablation_launch
from experiments.ablation import plan as ablation_plan
from experiments.ablation import stages
from experiments.configs import ablation as ablation_configs
from fake_gcloud import REPO, FakeGcloud

PREFIX = "abl"
# The launch flags every test gives: fast polls, a one-VM slice (the fake's FAKE_WORKERS=1).
LAUNCH = dict(name=PREFIX, project="proj", zone="us-central2-b", accelerator_type="v4-8",
              spot=False, max_slices=2, one_slice=False, max_attempts=3, max_relaunches=10,
              skip_preflight=True, poll_s=0.05, retry_s=0.01, preemption_window_s=0.0,
              stale_after_s=30.0, start_timeout_s=20.0, create_timeout_s=60.0)
QR = ["gcloud", "compute", "tpus", "queued-resources"]


def smoke_config(seeds=(0, 1)):
  """2 settings (r15, cos40to15) x `seeds`, no corpus to prepare."""
  config = ablation_configs.get_config("smoke")
  config.pretrain_seeds = seeds
  config.prepare_corpus = ""
  return config


class Grid:
  """One test's grid: the fake gcloud, a bucket of the emulator, the orchestrator's flags."""

  def __init__(self, fake: FakeGcloud, bucket: str):
    self.fake, self.bucket = fake, bucket
    self.workdir = f"{bucket}/abl"
    self.env = {**fake.env, "FAKE_WORKERS": "1"}
    self.processes: list[subprocess.Popen] = []  # orchestrators started in the background

  def options(self, **changes) -> ablation_launch.Options:
    return ablation_launch.Options(**{**LAUNCH, "logdir": str(self.fake.logdir), **changes})

  def run(self, monkeypatch, stage="pretrain", config=None, **changes) -> int:
    """The orchestrator in this process, as `--launch --stage=STAGE` runs it."""
    for key, value in self.env.items():
      monkeypatch.setenv(key, value)
    return ablation_launch.run(config or smoke_config(), self.workdir, stage,
                               self.options(**changes))

  def argv(self, *flags: str) -> list[str]:
    """The command line of the same launch (--stage=pretrain, preflight skipped)."""
    return [sys.executable, "-m", "experiments.ablation",
            "--config=experiments/configs/ablation.py:smoke", "--config.pretrain_seeds=(0,1)",
            "--config.prepare_corpus=", f"--workdir={self.workdir}", "--launch",
            f"--name={PREFIX}", "--project=proj", "--zone=us-central2-b",
            "--accelerator_type=v4-8", "--max_slices=2", "--stage=pretrain", "--skip_preflight",
            "--poll_s=0.05", "--retry_s=0.01", "--preemption_window_s=0", "--stale_after_s=30",
            "--start_timeout_s=20", f"--logdir={self.fake.logdir}", *flags]

  def popen(self, *flags: str, **env: str) -> tuple[subprocess.Popen, pathlib.Path]:
    out = self.fake.root / f"orchestrator_{uuid.uuid4().hex[:6]}.out"
    process = subprocess.Popen(self.argv(*flags), cwd=REPO, env={**self.env, **env},
                               stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)
    self.processes.append(process)
    return process, out

  def entries(self) -> dict[str, ablation_grid.Entry]:
    return {e.name: e for e in ablation_grid.read(self.workdir)}

  def record(self, run: str) -> dict | None:
    """Run `run`'s job record where its fake job wrote it."""
    path = (self.fake.root / "gcs" / self.workdir[len("gs://"):] / ablation_plan.PRETRAIN_DIR / run
            / "job_state.json")
    return json.loads(path.read_text()) if path.exists() else None

  def starts(self) -> collections.Counter:
    """Job processes started per run (worker 0's, on every slice)."""
    return collections.Counter(_run_of(start) for name in self.fake.slice_names()
                               for start in self.fake.starts(name) if start["worker"] == 0)

  def most_slices_at_once(self) -> int:
    """The most slices alive at once, from create to delete in the gcloud log."""
    alive, most = set(), 0
    for c in self.fake.commands():
      if c[:4] == QR and c[4] in ("create", "delete"):
        (alive.add if c[4] == "create" else alive.discard)(c[5])
        most = max(most, len(alive))
    return most

  def slice_commands(self, name: str) -> list[str]:
    """create / delete of slice `name`, in order."""
    return [c[4] for c in self.fake.commands()
            if c[:4] == QR and c[4] in ("create", "delete") and c[5] == name]


def _run_of(start: dict) -> str:
  """The run a fake job's start was of: the last part of its --workdir."""
  return next(a for a in start["argv"] if a.startswith("--workdir=")).rsplit("/", 1)[-1]


@pytest.fixture
def grid(tmp_path, gcs_emulator, installed_artifact):
  harness = Grid(FakeGcloud(tmp_path, installed_artifact), gcs_emulator.bucket(f"abl-{uuid.uuid4().hex[:8]}"))
  yield harness
  for process in harness.processes:  # a failed test leaves no orchestrator behind
    if process.poll() is None:
      process.kill()
      process.wait()
  (tmp_path / "release").write_text("")  # no fake job outlives its test


# --- the grid's state, the shapes, the hand-off to the later stages (no launch) ---


def test_a_grid_keeps_its_runs_and_refuses_a_launched_run_changed(tmp_path):
  """Fails if a re-planned run moves to another slice index, a grown grid does not append,
  or a run that is running or done may become another job (its workdir holds the first)."""
  workdir = str(tmp_path)

  def entry(name, args):
    return ablation_grid.Entry(name=name, setting="s", seed=0, index=0, workdir=f"w/{name}",
                               args=args)

  grid = ablation_grid.Grid(workdir)
  grid.merge([entry("a", ["--x=1"]), entry("b", ["--x=1"])])
  grid.update("a", state=ablation_grid.DONE)
  again = ablation_grid.Grid(workdir)
  merged = again.merge([entry("c", ["--x=1"]), entry("a", ["--x=1"]), entry("b", ["--x=2"])])
  assert [(e.name, e.index, e.state, e.args) for e in merged] == [
      ("c", 2, "queued", ["--x=1"]), ("a", 0, "done", ["--x=1"]), ("b", 1, "queued", ["--x=2"])]
  with pytest.raises(ablation_grid.GridError, match=r"run a was launched as another job "
                     r"\(now --x=3, launched with --x=1; it is done\)"):
    again.merge([entry("a", ["--x=3"])])
  assert ablation_grid.given_up(workdir) == []
  again.update("b", state=ablation_grid.FAILED)
  assert ablation_grid.given_up(workdir) == ["b"]
  assert ablation_grid.given_up(str(tmp_path / "none")) == []


def test_preflight_runs_once_per_distinct_shape(monkeypatch, tmp_path):
  """Fails if seeds, or masks that leave the prediction slots as they are, get a preflight
  of their own, or a ratio that changes the slots shares one; or if a run's flags lack the
  shared tokenized store."""
  config = smoke_config()
  with config.unlocked():  # r15's ratio, every prediction [MASK]: r15's shape
    config.settings.r15_mask = ablation_configs.masking_setting(0.15, mix=(1.0, 0.0, 0.0))
  runs = ablation_plan.grid_runs(config, "gs://b/abl")
  ablation_launch.share_store(runs, "gs://b/abl")
  compiled = []
  monkeypatch.setattr(launcher_lib, "preflight",
                      lambda config, flags, accelerator, source:
                      compiled.append((config, flags, accelerator)))
  monkeypatch.setattr(launcher_lib, "store_status", lambda *a: "tokenized store: not yet")
  options = ablation_launch.Options(**{**LAUNCH, "logdir": str(tmp_path),
                                       "accelerator_type": "v5e-16"})
  ablation_launch.preflight(runs, options)
  assert len(runs) == 6 and len(compiled) == 2
  assert {c[2] for c in compiled} == {"v5litepod-16"}
  assert all("--config.data.tokenized_dir=gs://b/abl/tokenized" in c[1] for c in compiled)
  keys = {r.name: ablation_launch.shape_key(r) for r in runs}
  assert keys["r15_seed0"] == keys["r15_seed1"] == keys["r15_mask_seed0"] != keys[
      "cos40to15_seed0"]


def test_the_later_stages_leave_a_given_up_run_out_and_name_it_unfinished(monkeypatch,
                                                                            tmp_path):
  """A grid whose run r15_seed1 failed for good. Fails if fine-tuning is asked to start from
  it (it would refuse the whole stage: that run never finished) or if the report is not
  told it is unfinished, from the workdir alone (--stage=report without --config too)."""
  workdir, config = str(tmp_path), smoke_config()
  stages.prepare(config, workdir, ablation_plan.grid_runs(config, workdir))
  grid = ablation_grid.Grid(workdir)
  grid.merge([ablation_grid.Entry(name=r.name, setting=r.setting, seed=r.seed, index=0,
                                  workdir=r.pretrain_dir, args=[])
              for r in ablation_plan.grid_runs(config, workdir)])
  grid.update("r15_seed1", state=ablation_grid.FAILED, attempt=3, error="boom")
  reported, finetuned = [], []
  monkeypatch.setattr(stages.ablation_report, "write_report",
                      lambda workdir, plan, unfinished: reported.append(unfinished) or [])
  monkeypatch.setattr(stages, "finetune", lambda config, runs, workdir: finetuned.append(
      [r.name for r in runs]) or True)
  assert stages.run_ablation(None, workdir, "report") == 0
  assert stages.run_ablation(config, workdir, "finetune") == 0
  assert reported == [("r15_seed1",)]
  assert finetuned == [["cos40to15_seed0", "r15_seed0", "cos40to15_seed1"]]


def test_launch_refusals_are_one_line(tmp_path):
  """Fails if a launch that cannot run gets as far as a gcloud call or a write."""
  options = ablation_launch.Options(**{**LAUNCH, "logdir": str(tmp_path)})
  for workdir, changes, message in (
      (str(tmp_path), {}, "--launch needs a gs:// --workdir"),
      ("gs://b/abl", {"name": ""}, "--launch needs --name"),
      ("gs://b/abl", {"name": "Abl_1"}, "--name='Abl_1': a slice name starts with"),
      ("gs://b/abl", {"one_slice": True}, "--one_slice runs the runs in turn on one slice"),
      ("gs://b/abl", {"accelerator_type": "v9-8"}, "--accelerator_type: unknown accelerator")):
    with pytest.raises(ablation_grid.GridError, match=message.replace("(", r"\(")):
      ablation_launch.run(smoke_config(), workdir, "pretrain",
                          ablation_launch.Options(**{**options.__dict__, **changes}))
  assert not list(tmp_path.iterdir())


# --- launched, against the fake gcloud ---


@pytest.mark.slow
def test_a_2x2_grid_runs_to_its_end_on_at_most_2_slices(grid, monkeypatch, capsys):
  """Fails if a run starts more or less than once, more than 2 slices are up at once (or
  never 2), a slice is left undeleted, the preflight comes after a gcloud call or compiles
  one seed's shape twice, the runs read different tokenized stores, --status misses a run,
  or a re-run of the finished grid calls gcloud at all."""
  compiled = []
  monkeypatch.setattr(launcher_lib, "preflight", lambda config, flags, *a: compiled.append(
      (len(grid.fake.commands()), flags)))
  monkeypatch.setattr(launcher_lib, "store_status", lambda *a: "tokenized store: not yet")
  assert grid.run(monkeypatch, skip_preflight=False) == 0
  out = capsys.readouterr().out
  runs = ["cos40to15_seed0", "r15_seed0", "cos40to15_seed1", "r15_seed1"]
  assert [c[0] for c in compiled] == [0, 0], compiled  # 2 shapes, before any gcloud call
  assert grid.starts() == {r: 1 for r in runs}, out
  assert grid.most_slices_at_once() == 2
  entries = grid.entries()
  assert [(n, e.state, e.attempt, e.slice["name"]) for n, e in entries.items()] == [
      (r, "done", 1, f"{PREFIX}-{i}") for i, r in enumerate(runs)]
  for i in range(4):
    assert grid.slice_commands(f"{PREFIX}-{i}") == ["create", "delete"]
  stores = {a for e in entries.values() for a in e.args if "tokenized_dir" in a}
  assert stores == {f"--config.data.tokenized_dir={grid.workdir}/tokenized"}
  assert "[launch r15_seed1] attempt 1 of at most 3 on abl-3" in out
  assert "grid: 4 run(s) done" in out
  table = ablation_launch.status(grid.workdir, retry_s=0.01).splitlines()
  assert table[0] == "| run | setting | seed | state | slice | attempt | job |"
  assert table[5].startswith("| r15_seed1 | r15 | 1 | done | abl-3 | 1 | done (attempt "), table
  assert table[-1] == "0 queued, 0 running, 4 done, 0 failed"
  before = len(grid.fake.commands())
  assert grid.run(monkeypatch) == 0  # the same launch again: every run is done
  assert len(grid.fake.commands()) == before


@pytest.mark.slow
def test_one_slice_runs_the_runs_in_turn_and_is_deleted_at_the_end(grid, monkeypatch):
  """--one_slice. Fails if the slice is created more than once or deleted before the last
  run, a run starts twice or on another slice, or two runs' jobs overlap."""
  assert grid.run(monkeypatch, one_slice=True, max_slices=1) == 0
  runs = ["cos40to15_seed0", "r15_seed0", "cos40to15_seed1", "r15_seed1"]
  assert grid.fake.slice_names() == [PREFIX]
  assert grid.slice_commands(PREFIX) == ["create", "delete"]
  assert grid.starts() == {r: 1 for r in runs}
  assert [(n, e.state, e.slice["name"]) for n, e in grid.entries().items()] == [
      (r, "done", PREFIX) for r in runs]
  # In turn: each job started after the one before it had written its final record.
  records = [grid.record(r) for r in runs]
  started = {_run_of(s): s["time"] for s in grid.fake.starts(PREFIX)}
  assert all(r["state"] == "done" for r in records)
  assert all(started[later] > record["time"] for record, later in zip(records, runs[1:]))


@pytest.mark.slow
def test_a_job_that_fails_for_good_is_retried_to_the_bound_then_given_up(grid, monkeypatch,
                                                                        capsys):
  """r15_seed1's job fails at every start. Fails if it is started other than --max_attempts
  times, its slice is kept, the grid does not end (or stops the other runs), or the grid
  and --status do not name it failed with its error."""
  monkeypatch.setenv("FAKE_JOB_FAIL", "r15_seed1")
  assert grid.run(monkeypatch, max_attempts=2) == 0
  out = capsys.readouterr().out
  assert grid.starts() == {"cos40to15_seed0": 1, "r15_seed0": 1, "cos40to15_seed1": 1,
                           "r15_seed1": 2}, out
  failed = grid.entries()["r15_seed1"]
  assert (failed.state, failed.attempt) == ("failed", 2)
  assert failed.error.startswith("launch failed at step 'run': the job failed (exit code 1")
  assert "ValueError: boom" in failed.error
  assert grid.slice_commands(f"{PREFIX}-3") == ["create", "delete"]  # reused, then deleted
  assert "grid: 3 run(s) done; given up on (unfinished): r15_seed1" in out
  assert ablation_grid.given_up(grid.workdir) == ["r15_seed1"]
  table = ablation_launch.status(grid.workdir, retry_s=0.01)
  assert "| r15_seed1 | r15 | 1 | failed | abl-3 | 2 | failed (attempt " in table, table
  assert table.splitlines()[-1].startswith(
      "r15_seed1 failed after 2 attempt(s): launch failed at step 'run': the job failed")
  # A re-run gives it no further attempt unless --max_attempts grows.
  before = len(grid.fake.commands())
  assert grid.run(monkeypatch, max_attempts=2) == 0
  assert len(grid.fake.commands()) == before


def test_a_job_that_dies_at_its_start_is_given_up_at_once(grid, monkeypatch, capsys):
  """r15_seed1's job dies before its first record at every start (an import error). Fails if
  it is started more than once although --max_attempts allows 3, its slice is kept, or the
  other runs do not run to their end."""
  monkeypatch.setenv("FAKE_JOB_IMPORT_ERROR", "r15_seed1")
  assert grid.run(monkeypatch, max_attempts=3) == 0
  out = capsys.readouterr().out
  assert grid.starts() == {"cos40to15_seed0": 1, "r15_seed0": 1, "cos40to15_seed1": 1,
                           "r15_seed1": 1}, out
  failed = grid.entries()["r15_seed1"]
  assert (failed.state, failed.attempt) == ("failed", 1)
  assert failed.error.startswith("launch failed at step 'start': the job exited 1 on worker 0 "
                                 "before writing its first record"), failed.error
  assert "No module named 'host'" in failed.error
  assert grid.slice_commands(f"{PREFIX}-3") == ["create", "delete"]
  assert "grid: 3 run(s) done; given up on (unfinished): r15_seed1" in out


@pytest.mark.slow
def test_kill_9_mid_grid_then_the_same_command_attaches(grid):
  """The orchestrator is killed while 2 jobs run, one has finished and one is queued; the
  same command is run again. Fails if a second orchestrator could run meanwhile, if the
  re-run starts a running or finished run again, or does not finish the grid."""
  hold = {"FAKE_JOB_HOLD": "1", "FAKE_JOB_HOLD_S": "300"}  # held until released
  first, out = grid.popen(**hold)
  runs = ["cos40to15_seed0", "r15_seed0", "cos40to15_seed1", "r15_seed1"]

  def running(run):
    return (grid.record(run) or {}).get("state") == "running"

  grid.fake.wait_for(lambda: running(runs[0]) and running(runs[1]), "2 running jobs", 120)
  second = subprocess.run(grid.argv(), cwd=REPO, env=grid.env, capture_output=True, text=True,
                          timeout=120)
  assert second.returncode == 75, second.stderr[-2000:]
  assert "workdir is in use" in second.stderr.strip().splitlines()[-1]
  (grid.fake.root / f"release-{runs[0]}").write_text("")  # the first run finishes
  grid.fake.wait_for(lambda: grid.entries()[runs[0]].state == "done" and running(runs[2]),
                     "the first run done and the third running", 60)
  first.kill()  # kill -9
  first.wait(timeout=30)
  assert [grid.entries()[r].state for r in runs] == ["done", "running", "running", "queued"]
  again, out = grid.popen(**hold)
  grid.fake.wait_for(lambda: out.read_text().count("attaching to the running job") == 2,
                     "the re-run attaching to both running jobs", 120)
  (grid.fake.root / "release").write_text("")
  assert again.wait(timeout=120) == 0, out.read_text()[-3000:]
  assert grid.starts() == {r: 1 for r in runs}, out.read_text()[-3000:]
  assert [grid.entries()[r].state for r in runs] == ["done"] * 4
  assert grid.most_slices_at_once() == 2
  assert all(grid.slice_commands(f"{PREFIX}-{i}") == ["create", "delete"] for i in range(4))
  status = subprocess.run([sys.executable, "-m", "experiments.ablation",
                           f"--workdir={grid.workdir}", "--status", "--retry_s=0.01"],
                          cwd=REPO, env=grid.env, capture_output=True, text=True, timeout=120)
  assert status.returncode == 0, status.stderr[-2000:]
  assert status.stdout.splitlines()[0] == "| run | setting | seed | state | slice | attempt | job |"
  assert f"| {runs[0]} | cos40to15 | 0 | done | abl-0 | 1 | done (attempt " in status.stdout
