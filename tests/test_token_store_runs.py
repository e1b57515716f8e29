"""The tokenized-corpus store in whole runs: a preparation killed with kill -9 and re-run,
a gs:// store on the GCS emulator, two jax.distributed processes preparing disjoint shares,
a workdir started before the store resuming on it, the launcher's line about a store on
each host's disk. (tests/test_token_store.py holds the store's batches, keys and refusals;
these use its corpus fixture and helpers.)
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import ports

from data_pipeline.store import prepare_corpus
from data_pipeline.store import token_store
from host import paths
from test_token_store import REPO
from test_token_store import SHARD_BYTES
from test_token_store import _assert_same
from test_token_store import _config
from test_token_store import _data
from test_token_store import _everything
from test_token_store import _prepare_command
from test_token_store import _tree
from test_token_store import files  # pylint: disable=unused-import  # a fixture


def _prepare_killed_at(files, root, spec: str, marker: pathlib.Path) -> int:
  """The offline command with one worker (its shards written in order in its own process),
  made to kill itself at `spec` (tests/kill_points.py); its exit code."""
  args, env = _prepare_command(files, root, 1)
  code = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import kill_points; "
          "kill_points.install_preparation(sys.argv.pop(1), sys.argv.pop(1)); "
          "runpy.run_module('data_pipeline.store.prepare_corpus', run_name='__main__')")
  tests = str(pathlib.Path(__file__).parent)
  return subprocess.run([sys.executable, "-c", code, tests, spec, str(marker), *args[3:]],
                        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                        timeout=600, check=False).returncode


@pytest.mark.slow
def test_a_preparation_killed_mid_shard_and_after_one_then_rerun_ends_byte_identical(
    files, tmp_path):
  """The offline command killed with kill -9 at two chosen moments (tests/kill_points.py):
  unit 2's shard whole in its temporary file, not renamed; then, resumed, right after unit
  6's shard is renamed; then run to the end. Fails if a kill misses its moment (SIGKILL
  exit, the shards and temporaries on disk then, a manifest written), if the store's bytes
  differ from an uninterrupted preparation's by 2 worker processes, if a temporary file
  is left at the end (the dead writer's included), or if the command does not print the
  store's path, size and tokens/s."""
  args, env = _prepare_command(files, tmp_path / "reference", 2)
  reference = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=600, check=False)
  assert reference.returncode == 0, reference.stderr[-3000:]
  assert re.search(r"tokens/s .*2 workers", reference.stdout), reference.stdout
  assert re.search(r"store: \S+: [\d,]+ tokens, [\d.]+ MiB in \d+ shards", reference.stdout)
  assert len(list((tmp_path / "reference").rglob("*.tok"))) > 8  # both kills mid-preparation
  killed = tmp_path / "killed"
  name = lambda unit: os.path.basename(token_store.shard_name(unit))
  for spec, units_on_disk in (("shard_temp:2", range(2)), ("shard:6", range(7))):
    marker = tmp_path / f"{spec.replace(':', '_')}.kill.json"
    assert _prepare_killed_at(files, killed, spec, marker) == -signal.SIGKILL, spec
    evidence = json.loads(marker.read_text())
    assert evidence["phase"] == spec.split(":")[0]
    on_disk = evidence["files"]
    assert [f for f in on_disk if not f.startswith(".")] == [name(u) for u in units_on_disk]
    temporaries = [f for f in on_disk if f.startswith(".")]
    if spec.startswith("shard_temp"):
      assert len(temporaries) == 1 and temporaries[0].startswith(f".{name(2)}.tmp-"), on_disk
      left = temporaries
    else:  # the dead writer's, which a run removes once the store is complete
      assert temporaries == left, on_disk
    assert not list(killed.rglob(token_store.MANIFEST)), spec
  args, env = _prepare_command(files, killed, 1)
  rerun = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                         check=False)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _tree(killed) == _tree(tmp_path / "reference")


def test_a_gs_store_on_the_emulator(gcs_emulator, files):
  """A store in a bucket: fails if its batches differ from the in-memory path's, if a later
  start tokenizes again, if a truncated remote shard is read without a refusal naming it, or
  if the line the launcher prints does not say whether the store is made."""
  bucket = gcs_emulator.bucket("tokenized")
  config = _config(files[0], files[2], f"{bucket}/stores")
  # What the launcher prints before it creates a slice: not made yet, then made.
  assert "not prepared yet" in token_store.describe_for_slice(config.data, 1)
  _assert_same(_everything(_data(config)),
               _everything(_data(_config(files[0], files[2], "none"))))
  assert re.search(r"prepared \([\d,]+ tokens, [\d.]+ MiB in \d+ shards\)",
                   token_store.describe_for_slice(config.data, 1))
  store = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                       num_workers=1)
  assert store.prepared["units"] == 0 and store.directory.startswith(f"{bucket}/stores/")
  shard = paths.join(store.directory, token_store.shard_name(2))
  paths.write_atomic(shard, paths.read_bytes(shard)[:200])
  with pytest.raises(token_store.ShardError, match=re.escape(shard)):
    store.select("train", 0, 1, 0, config.data.heldout_modulus)



def _run_pair(pretrain_subprocess, config, run: pathlib.Path, name: str) -> list[str]:
  """A 2-process run (2 CPU devices each, jax.distributed on localhost); both logs."""
  port, processes = ports.free_port(), []
  for i in range(2):
    config.distributed.update(enabled=True, coordinator_address=f"localhost:{port}",
                              num_processes=2, process_id=i)
    processes.append(pretrain_subprocess(config, run, devices=2, name=f"{name}_{i}"))
  logs = [run.parent / f"{name}_{i}.log" for i in range(2)]
  for process, log in zip(processes, logs):
    assert process.wait(timeout=900) == 0, log.read_text()[-3000:]
  return [log.read_text() for log in logs]


def _losses(run) -> dict[int, float]:
  rows = [json.loads(l) for l in (pathlib.Path(run) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.mark.slow
def test_two_processes_prepare_disjoint_shares_then_train_as_without_the_store(
    pretrain_test_config, pretrain_subprocess, files, tmp_path):
  """2 processes on one store: fails if they tokenize overlapping shares (or leave one
  out), or if their run's losses and weights differ from the same 2 processes' with
  data.tokenized_dir="none"."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.run import checkpoint  # pylint: disable=g-import-not-at-top
  runs = {}
  for name, where in (("memory", "none"), ("stored", str(tmp_path / "store"))):
    config = pretrain_test_config(total_steps=12, **{
        "data.corpus": str(files[1]), "data.tokenized_dir": where,
        "data.shard_bytes": SHARD_BYTES, "data.prepare_workers": 1})
    runs[name] = (tmp_path / name, _run_pair(pretrain_subprocess, config, tmp_path / name, name))
  shares = [set(json.loads(m)) for log in runs["stored"][1]
            for m in re.findall(r"tokenized shards (\[[\d, ]*\]) here", log)]
  manifest = json.loads(next((tmp_path / "store").rglob(token_store.MANIFEST)).read_text())
  assert len(shares) == 2 and not shares[0] & shares[1], shares
  assert shares[0] | shares[1] == set(range(len(manifest["units"])))
  assert _losses(runs["stored"][0]) == _losses(runs["memory"][0])
  _, params = checkpoint.load_params_from_workdir(str(runs["stored"][0]))
  _, expected = checkpoint.load_params_from_workdir(str(runs["memory"][0]))
  jax.tree.map(np.testing.assert_array_equal, params, expected)


@pytest.mark.slow
def test_a_workdir_started_without_the_store_resumes_on_it_bit_identically(
    pretrain_reference_run, pretrain_test_config, pretrain_subprocess, tmp_path):
  """A run on the in-memory path (tokenized_dir="none") killed after its step-10 checkpoint,
  resumed with the store: fails if the resume is refused or if its losses and weights
  differ from the uninterrupted run's (which read the store)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.run import checkpoint  # pylint: disable=g-import-not-at-top
  run = tmp_path / "run"
  process = pretrain_subprocess(pretrain_test_config(**{"data.tokenized_dir": "none"}), run,
                                name="memory")
  deadline = time.time() + 600
  while not (run / "checkpoints" / "10" / "commit_success.txt").exists():
    assert process.poll() is None, (tmp_path / "memory.log").read_text()[-3000:]
    assert time.time() < deadline
    time.sleep(0.01)
  process.send_signal(signal.SIGKILL)
  process.wait()
  assert not (run / "checkpoints" / "20").exists(), "finished before the kill"
  resumed = pretrain_subprocess(pretrain_test_config(), run, name="stored")
  assert resumed.wait(timeout=600) == 0, (tmp_path / "stored.log").read_text()[-3000:]
  assert _losses(run) == _losses(pretrain_reference_run)
  _, params = checkpoint.load_params_from_workdir(str(run))
  _, expected = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  jax.tree.map(np.testing.assert_array_equal, params, expected)


def test_the_launcher_says_a_store_on_each_hosts_disk_is_out_of_its_sight(tmp_path):
  """bert_jax.launch asks (a child process, no JAX) before it creates a slice: fails if a
  store on the hosts' own disks (the default) is not named as such, with the gs:// advice."""
  from bert_jax.launch import launcher as launcher_lib  # pylint: disable=g-import-not-at-top
  line = launcher_lib.store_status("experiments/configs/pretrain.py:tiny",
                                   [f"--config.data.vocab_file={tmp_path / 'vocab.txt'}"], 4)
  assert line.startswith("tokenized store: on each host's own disk ($BERT_JAX_CACHE/tokenized)")
  assert "a gs:// data.tokenized_dir is shared" in line
