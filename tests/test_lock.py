"""The workdir lock under contention (bert_jax.run.lock), on a local disk and on GCS.

What would make these fail: a takeover that is read -> delete -> create (two
contenders that both judged the old lock stale each delete the other's fresh
lock and both hold it), an unconditional heartbeat (a holder whose lock was
taken writes over the new holder's), a holder that only logs its loss (the
loop's `due` and the save would go on), or a relaunch of the same job that waits
out the stale window. The racing contenders are separate processes
(tests/lock_process.py), as hosts are: no shared memory, pid or fcntl guard; the
release's DELETE precondition is checked against tests/gcs_double.py, since the
emulator ignores it.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

import gcs_double
from bert_jax import exit_codes
from bert_jax import jobs
from bert_jax.run import checkpoint
from bert_jax.run import lock as workdir_lock
from bert_jax.training import loop as train_loop
from experiments.configs import pretrain
from host import paths

HERE = pathlib.Path(__file__).resolve().parent

def _stale_lock(workdir: str) -> None:
  """A lock whose holder vanished long ago (another host: no pid to check)."""
  paths.write_atomic(paths.join(workdir, workdir_lock.LOCK_FILE), json.dumps(
      {"host": "vanished-host", "pid": 1, "token": "old", "heartbeat": time.time() - 3600}))


class _Processes:
  """Processes running tests/lock_process.py on one workdir (each its own pid and guards)."""

  def __init__(self, workdir: str, count: int, env: dict | None = None):
    self.processes = [subprocess.Popen(
        [sys.executable, str(HERE / "lock_process.py"), workdir], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, cwd=HERE.parent, env={**os.environ, **(env or {})})
        for _ in range(count)]
    for p in self.processes:
      assert p.stdout.readline().strip() == "ready"

  def send(self, i: int, **command) -> None:
    self.processes[i].stdin.write(json.dumps(command) + "\n")
    self.processes[i].stdin.flush()

  def answer(self, i: int) -> dict:
    line = self.processes[i].stdout.readline()
    assert line, f"lock process {i} ended (exit {self.processes[i].wait()})"
    return json.loads(line)

  def ask(self, i: int, **command) -> dict:
    self.send(i, **command)
    return self.answer(i)

  def close(self) -> None:
    for p in self.processes:
      p.stdin.close()
    for p in self.processes:
      p.wait(timeout=60)


def _race(workdir: str, rounds: int, env: dict | None = None) -> int:
  """`rounds` times: two processes at once for a stale lock; exactly one must win.
  Returns in how many rounds the loser had judged the lock stale too and lost the
  conditional overwrite (the race the compare-and-swap exists for)."""
  paths.makedirs(workdir)
  lock_path = paths.join(workdir, workdir_lock.LOCK_FILE)
  contenders = _Processes(workdir, 2, env)
  raced = 0
  try:
    for round_ in range(rounds):
      _stale_lock(workdir)
      at = time.time() + 0.05  # both leave their wait at this instant
      for i in range(2):
        contenders.send(i, op="acquire", name="lock", job={}, at=at)
      answers = [contenders.answer(i) for i in range(2)]
      won = [i for i, a in enumerate(answers) if a["won"]]
      assert len(won) == 1, (round_, answers)
      winner, loser = answers[won[0]], answers[1 - won[0]]
      on_disk = json.loads(paths.read_text(lock_path))
      # The winner's content, not the loser's: its token and its own pid.
      assert (on_disk["token"], on_disk["pid"]) == (winner["token"], winner["pid"]), round_
      assert f"held by host {socket.gethostname()} pid {winner['pid']} " in loser["refusal"]
      raced += loser["cas_lost"] > 0
      contenders.ask(won[0], op="release", name="lock")
      assert not paths.exists(lock_path)
  finally:
    contenders.close()
  return raced


@pytest.mark.slow  # two processes for 50 rounds
def test_two_processes_racing_for_a_stale_lock_exactly_one_wins_local(tmp_path):
  """Fails if two processes (own pids, own fcntl guards) could both take one stale lock."""
  raced = _race(str(tmp_path / "run"), rounds=50)
  print(f"local: the loser lost the compare-and-swap itself in {raced} of 50 rounds")


@pytest.mark.slow  # two processes for 50 rounds
def test_two_processes_racing_for_a_stale_lock_exactly_one_wins_on_gcs(gcs_emulator):
  """The same race through the GCS JSON API (generations, ifGenerationMatch)."""
  raced = _race(f"{gcs_emulator.bucket('lock-race')}/run", rounds=50, env=gcs_emulator.env)
  print(f"gcs: the loser lost the compare-and-swap itself in {raced} of 50 rounds")


def test_release_deletes_only_its_own_version_on_a_store_that_checks_it():
  """fake-gcs-server ignores ifGenerationMatch on DELETE, so against it a release that
  deleted whatever lock is there would pass; tests/gcs_double.py enforces the precondition
  as GCS does. Fails if a holder whose lock was taken over deletes the new holder's lock when
  it releases, or if remove_if deletes a version other than the one it names."""
  with gcs_double.serve() as store:
    env = {"STORAGE_EMULATOR_HOST": store.url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token"}
    process = _Processes("gs://bucket/run", 1, env)
    try:
      assert process.ask(0, op="acquire", name="old", job={"id": "j", "attempt": 0}, at=0)["won"]
      new = process.ask(0, op="acquire", name="new", job={"id": "j", "attempt": 1}, at=0)
      assert new["won"] and new["cas_lost"] == 0  # took over the old attempt's version
      process.ask(0, op="release", name="old")  # its heartbeat never saw the takeover
      assert ("DELETE", "run/.lock", 412) in store.log  # refused by the precondition
      assert json.loads(store.objects[("bucket", "run/.lock")][0])["token"] == new["token"]
      process.ask(0, op="release", name="new")
      assert ("bucket", "run/.lock") not in store.objects
      assert store.log[-1] == ("DELETE", "run/.lock", 204)

      def call(fn, *args):
        return process.ask(0, op="paths", fn=fn, args=list(args))["result"]
      first = call("create_if_absent", "gs://bucket/f", "one")
      assert call("create_if_absent", "gs://bucket/f", "two") is None
      second = call("replace_if", "gs://bucket/f", "three", first)
      assert second not in (None, first)
      assert call("replace_if", "gs://bucket/f", "four", first) is None
      assert call("remove_if", "gs://bucket/f", first) is False  # another version
      assert call("read_versioned", "gs://bucket/f") == ["three", second]
      assert call("remove_if", "gs://bucket/f", second) is True
      assert call("read_versioned", "gs://bucket/f") is None
    finally:
      process.close()
  assert not [entry for entry in store.log if entry[2] == 501], store.log  # all calls known


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_holder_whose_lock_was_taken_stops_within_one_heartbeat(where, tmp_path, request):
  """Fails if a holder whose lock a relaunch took keeps passing `due` beyond one heartbeat, stops
  with another message, still saves, or writes over or deletes the new holder's lock."""
  workdir = (str(tmp_path / "run") if where == "local"
             else f"{request.getfixturevalue('gcs_emulator').bucket('lock-lost')}/run")
  # 1 s, not less: the bound below allows one heartbeat for the write that finds the lock
  # lost, and on the emulator under a loaded CI machine that write alone took 0.2 s.
  holder = workdir_lock.Lock(workdir, heartbeat_s=1.0, job={"id": "j", "attempt": 0})
  holder.acquire()
  try:
    time.sleep(2.5 * holder.heartbeat_s)  # heartbeats while it holds the lock: nothing to report
    workdir_lock.check_held(verify=True)
    train_loop.due(1, 10, log_every=1, save_every=5, stop=False)
    # A relaunch of the same job takes the lock over at once, without waiting for staleness.
    thief = workdir_lock.Lock(workdir, heartbeat_s=3600, job={"id": "j", "attempt": 1})
    thief.acquire()
    taken = time.time()
    while time.time() - taken < 5:
      try:
        train_loop.due(2, 10, log_every=1, save_every=5, stop=False)
      except workdir_lock.WorkdirError as e:
        stopped, message = time.time() - taken, str(e)
        break
      time.sleep(0.01)
    else:
      pytest.fail("the holder kept training after its lock was taken")
    assert stopped < 2 * holder.heartbeat_s, stopped  # within one heartbeat (+ its write)
    assert message == (f"lost the workdir lock {holder.path} to host {socket.gethostname()} "
                       f"pid {os.getpid()} (job j attempt 1); stopped without saving "
                       "(another run writes this workdir now)")
    assert "\n" not in message
    # The save refuses too, and the old holder never writes over the new one's lock.
    with pytest.raises(workdir_lock.WorkdirError, match="lost the workdir lock"):
      checkpoint.save(None, 3, {}, {})
    time.sleep(2.5 * holder.heartbeat_s)   # the holder's next heartbeats, had it any
    assert json.loads(paths.read_text(thief.path))["token"] == thief.token
    holder.release()
    assert json.loads(paths.read_text(thief.path))["token"] == thief.token  # not deleted
    thief.release()
  finally:
    holder.release()
  workdir_lock.check_held()  # released locks are no longer asked


def test_a_later_attempt_of_the_same_job_takes_over_at_once_other_jobs_are_refused(tmp_path):
  """Fails if another job, the same or an earlier attempt, or no job takes a live lock, a later
  attempt of the same job cannot take it at once, or the old attempt's heartbeat does not then stop
  it naming the new holder."""
  workdir = str(tmp_path / "run")
  first = workdir_lock.Lock(workdir, heartbeat_s=3600, job={"id": "job-7", "attempt": 2})
  first.acquire()
  try:
    # Alive by every other rule (this host, this pid, a fresh heartbeat): another job, the
    # same attempt, an earlier attempt, or no job at all wait.
    for job in ({"id": "job-8", "attempt": 3}, {"id": "job-7", "attempt": 2},
                {"id": "job-7", "attempt": 1}, None):
      with pytest.raises(workdir_lock.LockHeld,
                         match=r"held by host \S+ pid \d+ \(heartbeat \d+s ago, job job-7 "
                               r"attempt 2\)\. .*at once for a later attempt of the same job"):
        workdir_lock.Lock(workdir, job=job or {}).acquire()
    relaunched = workdir_lock.Lock(workdir, heartbeat_s=3600, job={"id": "job-7", "attempt": 3})
    relaunched.acquire()
    assert json.loads(paths.read_text(relaunched.path))["job"] == {"id": "job-7", "attempt": 3}
    with pytest.raises(workdir_lock.WorkdirError, match=r"to host \S+ pid \d+ \(job job-7 "
                                                        r"attempt 3\); stopped without saving"):
      first.refresh()  # the old attempt's next heartbeat finds it lost
    relaunched.release()
  finally:
    first.release()


def test_the_job_comes_from_the_launcher_or_slurm(monkeypatch):
  """Fails if the job identity is not None without variables, SLURM's job id with its restart count
  (0 before any requeue), or the launcher's id and attempt when both are set."""
  for var in ("BERT_JAX_JOB_ID", "BERT_JAX_JOB_ATTEMPT", "SLURM_JOB_ID", "SLURM_RESTART_COUNT"):
    monkeypatch.delenv(var, raising=False)
  assert workdir_lock.job_identity() is None
  monkeypatch.setenv("SLURM_JOB_ID", "4242")
  assert workdir_lock.job_identity() == {"id": "4242", "attempt": 0}  # never requeued yet
  monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
  assert workdir_lock.job_identity() == {"id": "4242", "attempt": 2}
  monkeypatch.setenv("BERT_JAX_JOB_ID", "bert-base")  # the launcher's wins
  monkeypatch.setenv("BERT_JAX_JOB_ATTEMPT", "5")
  assert workdir_lock.job_identity() == {"id": "bert-base", "attempt": 5}


def test_a_lock_held_by_a_live_run_exits_75(monkeypatch, tmp_path):
  """75 (EX_TEMPFAIL) says "retry later" to SLURM and the launcher; any other refusal is 1."""
  def busy(*_):
    raise workdir_lock.LockHeld("workdir is in use: ... held by host h pid 1")
  monkeypatch.setitem(jobs.TRAINERS, "pretrain", busy)
  assert jobs.run(pretrain.get_config("tiny"), str(tmp_path)) == exit_codes.LOCK_HELD == 75
  def refused(*_):
    raise workdir_lock.WorkdirError("workdir was created with ...")
  monkeypatch.setitem(jobs.TRAINERS, "pretrain", refused)
  assert jobs.run(pretrain.get_config("tiny"), str(tmp_path)) == 1


def test_conditional_writes_refuse_a_stale_generation(tmp_path, gcs_emulator):
  """Fails if, locally or on the emulated bucket, a create over an existing file, a replace naming
  an old generation, or (locally) a remove naming one succeeds, or a current one fails."""
  for where in (str(tmp_path / "f"), f"{gcs_emulator.bucket('cas')}/f"):
    generation = paths.create_if_absent(where, "one")
    assert generation is not None and paths.create_if_absent(where, "two") is None
    assert paths.read_versioned(where) == (b"one", generation)
    newer = paths.replace_if(where, "three", generation)
    assert newer is not None and newer != generation
    assert paths.replace_if(where, "four", generation) is None  # the old version is gone
    assert paths.read_versioned(where) == (b"three", newer)
    if not paths.is_remote(where):  # the emulator ignores ifGenerationMatch on DELETE (the
      assert not paths.remove_if(where, generation)  # double's test above checks it on gs://)
    assert paths.remove_if(where, newer)
    assert paths.read_versioned(where) is None
