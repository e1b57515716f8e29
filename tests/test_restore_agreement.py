"""Restoring a workdir's checkpoint: failures retried before they are believed, and (on
several processes) one decision for all.

What would make these fail: a restore that treats its first exception as damage
(a transient storage error moves a good newest step aside), or processes that
each decide alone (the one that cannot read its shards of the newest step
falls back while the others resume: a hang at the next collective, or two
different models).

Run as a script, this file is one process of the 2-process test (see _runner).
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

import ports

from bert_jax.run import checkpoint


def _manager(workdir):
  return checkpoint.make_manager(str(workdir), ml_collections.ConfigDict(
      {"keep": 5, "keep_period": 0, "async_save": False}))


def _saved(tmp_path, steps=(1, 2)):
  """A workdir with a tiny state saved at `steps` (value = step), and its abstract state."""
  manager = _manager(tmp_path / "run")
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for step in steps:
    checkpoint.save(manager, step, {"w": jax.device_put(np.full([4], step, np.float32), sharding)},
                    {"position": step})
  manager.wait_until_finished()
  manager.close()
  return {"w": jax.ShapeDtypeStruct((4,), np.float32, sharding=sharding)}


def _failing(monkeypatch, causes_of_step_2):
  """checkpoint.restore raising the given errors, one per call, for step 2 (then restoring)."""
  real, pending, calls = checkpoint.restore, list(causes_of_step_2), []

  def restore(manager, abstract_state, step=None):
    calls.append(step)
    if step == 2 and pending:
      raise pending.pop(0)
    return real(manager, abstract_state, step)
  monkeypatch.setattr(checkpoint, "restore", restore)
  monkeypatch.setattr(checkpoint, "RESTORE_BACKOFF_S", 0.0)
  return calls


def test_a_transient_error_is_retried_and_the_step_is_not_moved(tmp_path, monkeypatch):
  """Fails if one 503 on the newest step is not retried into restoring it, or moves the step
  aside."""
  abstract = _saved(tmp_path)
  calls = _failing(monkeypatch, [OSError("HTTP status code: 503: backend unavailable")])
  step, state, data_state = checkpoint.restore_latest(_manager(tmp_path / "run"), abstract)
  assert (step, data_state) == (2, {"position": 2}) and float(state["w"][0]) == 2.0
  assert calls == [2, 2]  # failed once, restored on the retry
  assert not (tmp_path / "run" / checkpoint.CORRUPT_DIR).exists()
  assert (tmp_path / "run" / "checkpoints" / "2").exists()


def test_the_same_failure_every_attempt_moves_the_step_aside(tmp_path, monkeypatch):
  """Fails if the same read error on all three attempts does not move the newest step aside and
  restore the one before."""
  abstract = _saved(tmp_path)
  damage = [ValueError('Error reading "w": byte range [0, 64) is not valid')] * 3
  calls = _failing(monkeypatch, damage)
  step, _, _ = checkpoint.restore_latest(_manager(tmp_path / "run"), abstract)
  assert step == 1 and calls == [2, 2, 2, 1]
  assert [p.name.split(".")[0] for p in (tmp_path / "run" / checkpoint.CORRUPT_DIR).iterdir()
          ] == ["2"]


def test_one_damaged_file_read_through_different_arrays_is_the_same_failure(tmp_path,
                                                                            monkeypatch):
  """tensorstore reads an OCDBT file's arrays in parallel, so which array (and byte range)
  its error names, and the size of the value it read, varies between attempts on the same
  truncated file (seen on real truncated checkpoints: "of size 360409" once, "of size 3"
  twice); that is still one damaged file, moved aside. Fails if any of the three counts as
  a different cause (the step would then be kept and the run stopped)."""
  abstract = _saved(tmp_path)
  site = 'in OCDBT database at local file "/run/checkpoints/2/state/"'
  damage = [ValueError(f'OUT_OF_RANGE: Error reading "{name}/0.0" {site}: Requested byte range '
                       f'[{a}, {b}) is not valid for value of size {size}')
            for name, a, b, size in [("w", 432784, 447937, 230706), ("v", 410063, 432784, 3),
                                     ("w", 432784, 447937, 3)]]
  calls = _failing(monkeypatch, damage)
  step, _, _ = checkpoint.restore_latest(_manager(tmp_path / "run"), abstract)
  assert step == 1 and calls == [2, 2, 2, 1]
  assert (tmp_path / "run" / checkpoint.CORRUPT_DIR).exists()


@pytest.mark.parametrize("errors", [
    [ValueError("byte range [0, 64) is not valid"), OSError("Connection reset"),
     ValueError("byte range [64, 128) is not valid")],  # a different cause each time
    [OSError("UNAVAILABLE: HTTP status code: 503")] * 3])  # the storage never answered
def test_a_step_unreadable_but_not_judged_damaged_stops_the_run_and_is_kept(
    tmp_path, monkeypatch, errors):
  """Fails if three different errors, or three storage timeouts, on the newest step do not stop the
  restore with the message saying nothing was moved and to run again, or the step is moved aside."""
  abstract = _saved(tmp_path)
  _failing(monkeypatch, errors)
  with pytest.raises(checkpoint.CheckpointError,
                     match=r"checkpoint step 2 in \S+ could not be read \(.*\) but was not "
                           r"judged damaged .* nothing was moved, and step 1 restores\. Run the "
                           r"same command again"):
    checkpoint.restore_latest(_manager(tmp_path / "run"), abstract)
  assert not (tmp_path / "run" / checkpoint.CORRUPT_DIR).exists()
  assert (tmp_path / "run" / "checkpoints" / "2").exists()



@pytest.mark.slow
def test_only_process_1_cannot_restore_the_newest_step_both_resume_from_the_same_one(tmp_path):
  """Fails if, when only process 1 of 2 cannot read the newest step, the processes hang or do not
  both resume from step 1 with their own shards and positions, the logs do not say which process
  failed, or the step is not moved aside once."""
  port = ports.free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
  logs = [open(tmp_path / f"process_{i}.log", "w") for i in range(2)]
  processes = [subprocess.Popen([sys.executable, __file__, str(port), str(i), str(tmp_path)],
                                stdout=logs[i], stderr=subprocess.STDOUT, env=env)
               for i in range(2)]
  try:
    for i, p in enumerate(processes):
      # A split decision hangs (one process waits in a collective the other never joins).
      assert p.wait(timeout=240) == 0, (tmp_path / f"process_{i}.log").read_text()[-3000:]
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
  results = [json.loads((tmp_path / f"result_{i}.json").read_text()) for i in range(2)]
  # Process 1 failed on its own shards (process 0 restored step 2 fine), and both resumed
  # from step 1: each with its own half of step 1's array and its own pipeline position.
  log_0 = (tmp_path / "process_0.log").read_text()
  log_1 = (tmp_path / "process_1.log").read_text()
  assert "restore attempt 3 of 3 failed" in log_1 and "restore attempt" not in log_0
  assert "process(es) [1] could not restore it" in log_0
  assert [r["step"] for r in results] == [1, 1]
  assert [r["w"] for r in results] == [[1.0, 1.0, 1.0, 1.0]] * 2
  assert [r["data_state"] for r in results] == [{"position": 0}, {"position": 1}]
  # Judged damaged (the same file on every attempt): moved aside once, by process 0.
  assert [p.split(".")[0] for p in os.listdir(tmp_path / "run" / checkpoint.CORRUPT_DIR)] == ["2"]


def _runner(port: int, process_id: int, tmp_path: pathlib.Path) -> None:
  """One of 2 processes x 2 CPU devices: saves steps 1 and 2 of an array sharded over all 4
  devices, then restores, with process 1 unable to read step 2."""
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  run = tmp_path / "run"
  manager = _manager(run)
  for step in (1, 2):
    array = jax.make_array_from_callback(
        (8,), sharding, lambda index, step=step: np.full([8], step, np.float32)[index])
    checkpoint.save(manager, step, {"w": array}, {"position": process_id})
  manager.wait_until_finished()
  manager.close()
  if process_id == 1:
    # Only this process fails to read step 2, the same way on every attempt (as a truncated
    # shard would). Injected: on disk, truncating ocdbt.process_1/ changed nothing (the
    # merged step is read from its shared files), and damaging those fails both processes.
    # Raised after orbax's restore has run its barriers, as a late read error would be.
    real = checkpoint.restore

    def restore(manager, abstract_state, step=None):
      restored = real(manager, abstract_state, step)
      if step == 2:
        raise ValueError('Error reading "w" in OCDBT database: byte range [0, 64) of '
                         '"ocdbt.process_1/d/x" is not valid')
      return restored
    checkpoint.restore = restore
  checkpoint.RESTORE_BACKOFF_S = 0.1
  step, state, data_state = checkpoint.restore_latest(
      _manager(run), {"w": jax.ShapeDtypeStruct((8,), np.float32, sharding=sharding)})
  mine = [float(v) for shard in state["w"].addressable_shards for v in np.asarray(shard.data)]
  (tmp_path / f"result_{process_id}.json").write_text(
      json.dumps({"step": step, "w": mine, "data_state": data_state}))
  multihost_utils.sync_global_devices("done")


if __name__ == "__main__":
  _runner(int(sys.argv[1]), int(sys.argv[2]), pathlib.Path(sys.argv[3]))


def _abandoned_read(filename: str):
  """A suspended coroutine, compiled as if it lived in `filename`, that raises when it is
  finalised: what orbax's array reads of a step that failed to restore leave behind."""
  source = ("class _Pending:\n"
            "  def __await__(self):\n"
            "    yield\n"
            "async def _read_array_index_and_device_put():\n"
            "  try:\n"
            "    await _Pending()\n"
            "  except GeneratorExit:\n"
            "    raise Exception('Encountered error while reading array index')\n")
  scope = {}
  exec(compile(source, filename, "exec"), scope)  # pylint: disable=exec-used
  read = scope["_read_array_index_and_device_put"]()
  read.send(None)  # suspended at its await, as the abandoned reads are
  return read


def test_after_a_failed_restore_orbax_abandoned_reads_are_not_printed(monkeypatch, capsys):
  """Fails if, once a restore has failed, an abandoned orbax read's finalisation still prints
  its 'Exception ignored' traceback (60 lines an array), if any other unraisable exception
  is hidden, or if BERT_JAX_VERBOSE=1 hides them."""
  orbax_file = os.path.join(os.sep, "venv", "site-packages", "orbax", "checkpoint", "s.py")
  monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
  monkeypatch.setenv("BERT_JAX_VERBOSE", "1")
  checkpoint._drop_abandoned_reads()
  read = _abandoned_read(orbax_file)
  del read
  assert "Exception ignored in: <coroutine object _read_array_index" in capsys.readouterr().err
  monkeypatch.delenv("BERT_JAX_VERBOSE")
  checkpoint._drop_abandoned_reads()
  checkpoint._drop_abandoned_reads()  # a second failure: one filter, not two
  for _ in range(3):
    read = _abandoned_read(orbax_file)
    del read
  assert capsys.readouterr().err == ""
  ours = _abandoned_read(os.path.join(os.sep, "work", "bert_jax", "x.py"))
  del ours
  assert "Exception ignored in: <coroutine object" in capsys.readouterr().err
