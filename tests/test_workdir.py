"""Tests for bert_jax.run.workdir: the one-writer lock and the record every run is checked against."""

import json
import os
import socket
import subprocess
import sys
import time

import ml_collections
import pytest

from bert_jax.model import encoder as model_lib
from bert_jax.run import lock as workdir_lock
from bert_jax.run import workdir


def _config(**overrides):
  config = ml_collections.ConfigDict({
      "variant": "tiny", "model_size": "tiny", "total_steps": 10, "log_every_steps": 1,
      "data": {"masking": {"ratio": 0.15}, "vocab_file": "", "prefetch_batches": 2},
      "checkpoint": {"every_steps": 5}, "mesh": {"data": -1}})
  config.update_from_flattened_dict(overrides)
  return config


def _commit(run, step):
  """A committed checkpoint of `step` as orbax leaves one: a step directory with files."""
  (run / "checkpoints" / str(step)).mkdir(parents=True)
  (run / "checkpoints" / str(step) / "_CHECKPOINT_METADATA").write_text("{}")


def _open(path, config=None, vocab=None, **kw):
  bert_config = model_lib.BertConfig.from_size("tiny", vocab_size=96)
  return workdir.open_workdir(str(path), config or _config(), bert_config,
                              vocab_file=str(vocab) if vocab else None, **kw)


def test_unwritable_workdir_is_refused(tmp_path):
  """Fails if check_writable accepts a workdir under a regular file."""
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")
  with pytest.raises(ValueError, match="not writable"):
    workdir.check_writable(str(blocker / "workdir"))


def test_record_is_written_once_and_changes_are_refused_by_name(tmp_path):
  """Fails if the record or vocab copy is not written at creation, allowed changes (steps, cadence,
  mesh, a moved vocab) are refused or missing from the history, or a changed ratio, model size or
  vocab order is accepted, refused without both values and init_checkpoint, or changes a file."""
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\na\nb\n")
  run = tmp_path / "run"
  _open(run, vocab=vocab).release()
  _commit(run, 5)  # completed work: the record speaks for it
  record = json.loads((run / "record.json").read_text())
  assert record["config"]["data.masking.ratio"] == 0.15
  assert (run / "vocab.txt").read_text() == vocab.read_text()

  # Allowed on resume: more steps, other cadence, another mesh, the same vocab elsewhere;
  # each change is kept in the record's history (the created config stays as it was).
  moved = tmp_path / "moved_vocab.txt"
  moved.write_text(vocab.read_text())
  _open(run, _config(**{"total_steps": 20, "log_every_steps": 7, "mesh.data": 2,
                        "data.vocab_file": str(moved)}), vocab=moved).release()
  resumed = json.loads((run / "record.json").read_text())
  assert resumed["history"][0]["fields"] == {"total_steps": [10, 20], "log_every_steps": [1, 7],
                                             "mesh.data": [-1, 2]}
  assert resumed["config"] == record["config"]
  before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

  # A different ratio, model size, or a vocab with the same size in another order: refused,
  # naming the field and both values, and nothing on disk changes.
  swapped = tmp_path / "swapped.txt"
  swapped.write_text("[PAD]\n[UNK]\nb\na\n")
  cases = [(_config(**{"data.masking.ratio": 0.4}), vocab,
            "config.data.masking.ratio=0.15; this run has 0.4"),
           (_config(model_size="base"), vocab, "config.model_size='tiny'; this run has 'base'"),
           (_config(), swapped, "vocabulary (SHA-256)")]
  for config, vocab_file, message in cases:
    with pytest.raises(workdir.WorkdirError, match="created as 'tiny' with ") as error:
      _open(run, config, vocab=vocab_file)
    assert message in str(error.value)
    assert "--config.init_checkpoint=" in str(error.value)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
  assert not (run / ".lock").exists()


def test_a_workdir_made_before_records_is_checked_against_its_config_json(tmp_path):
  """Fails if a workdir with only config.json accepts another masking ratio (or writes a record
  then), or the same config does not add the record."""
  run = tmp_path / "old"
  _commit(run, 3)
  (run / "config.json").write_text(_config().to_json())
  with pytest.raises(workdir.WorkdirError, match="data.masking.ratio=0.15"):
    _open(run, _config(**{"data.masking.ratio": 0.5}))
  assert not (run / "record.json").exists()
  _open(run).release()
  assert (run / "record.json").exists()


def test_a_record_without_completed_work_never_blocks_the_corrected_command(tmp_path):
  """Fails if a workdir whose start failed before its first checkpoint (a record, no step
  directory) refuses a run with another config instead of taking its record, or if one
  committed checkpoint no longer makes the record binding."""
  run = tmp_path / "run"
  _open(run, _config(**{"data.masking.ratio": 0.4})).release()  # a start that then failed
  cut = run / "checkpoints" / "5.orbax-checkpoint-tmp-1"  # a save cut short
  cut.mkdir(parents=True)
  (cut / "_CHECKPOINT_METADATA").write_text("{}")
  workdir.check_before_data(str(run), _config(), None)  # the fix is not refused early...
  _open(run).release()  # ...nor at the open, and its record replaces the failed one's
  assert json.loads((run / "record.json").read_text())["config"]["data.masking.ratio"] == 0.15
  _commit(run, 5)
  with pytest.raises(workdir.WorkdirError, match="data.masking.ratio=0.15; this run has 0.4"):
    _open(run, _config(**{"data.masking.ratio": 0.4}))


def test_second_writer_is_refused_with_the_holders_host_and_pid(tmp_path):
  """Fails if a second writer opens a held workdir, is refused without the holder's host and pid, or
  cannot open it once released."""
  holder = _open(tmp_path / "run")
  try:
    with pytest.raises(workdir.LockHeld, match=rf"held by host {socket.gethostname()} "
                                                   rf"pid {os.getpid()}"):
      _open(tmp_path / "run")
  finally:
    holder.release()
  _open(tmp_path / "run").release()  # free again once released


def test_a_dead_or_silent_holder_does_not_block_forever(tmp_path):
  """Fails if a lock of a dead process on this host, or a stale one from another host, blocks
  opening, or another host's fresh lock does not."""
  run = tmp_path / "run"
  run.mkdir()
  # A holder on this host whose process is gone (kill -9): taken over at once.
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  (run / ".lock").write_text(json.dumps({"host": socket.gethostname(),
                                         "pid": int(dead.stdout), "token": "x",
                                         "heartbeat": time.time()}))
  _open(run).release()
  # A holder on another host: alive while its heartbeat is fresh, free once it is stale.
  other = {"host": "another-host", "pid": 1, "token": "y"}
  (run / ".lock").write_text(json.dumps({**other, "heartbeat": time.time()}))
  with pytest.raises(workdir.LockHeld, match="held by host another-host pid 1"):
    _open(run)
  (run / ".lock").write_text(json.dumps({**other, "heartbeat":
                                         time.time() - workdir_lock.STALE_AFTER_S - 1}))
  _open(run).release()
