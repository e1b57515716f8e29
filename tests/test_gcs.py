"""gs:// end to end, against a real GCS API on 127.0.0.1 (fake-gcs-server; see conftest).

Everything docs/pods.md promises for a bucket is exercised here: corpus and vocab
read from it, checkpoints, metrics.jsonl, TensorBoard events and the workdir
record written to it, a kill -9 and a bit-identical resume from it, the
one-writer lock on it, and fine-tuning that starts from a checkpoint in it and
writes its own workdir there.
"""

import json
import os
import re
import signal

import jax
import numpy as np
import pytest

from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.run import batch_log
from bert_jax.run import checkpoint
from bert_jax.run import metrics_io
from bert_jax.run import workdir
from host import paths
from test_finetune_trainer import toy_config  # the tiny fine-tuning config of the trainer tests
from test_finetune_trainer import toy_files  # pylint: disable=unused-import  # a fixture


def _losses(run: str) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in metrics_io.read_metrics(paths.join(run, "metrics.jsonl"))
          if "loss" in r}


def test_paths_read_write_list_and_lock_on_the_bucket(gcs_emulator, tmp_path):
  """Fails if, on the emulated bucket, globbing, a bounded readline, exclusive creation (one of two
  wins), copying a tree down, or the workdir lock (refused while held, gone on release) behaves
  otherwise."""
  bucket = gcs_emulator.bucket("paths")
  paths.write_atomic(f"{bucket}/a/one.txt", "1\n2\n")
  paths.write_atomic(f"{bucket}/a/b/two.txt", "x" * 50 + "\n")
  assert paths.glob(f"{bucket}/a/*.txt") == [f"{bucket}/a/one.txt"]
  assert paths.glob(f"{bucket}/a/*/*.txt") == [f"{bucket}/a/b/two.txt"]
  with paths.open_binary(f"{bucket}/a/b/two.txt") as f:
    assert f.readline(10) == b"x" * 10  # bounded reads, as the corpus reader needs
  assert paths.create_exclusive(f"{bucket}/lock", "me")
  assert not paths.create_exclusive(f"{bucket}/lock", "you")  # atomic: one of two wins
  assert paths.read_text(f"{bucket}/lock") == "me"
  paths.copy_tree(f"{bucket}/a", tmp_path / "copy")
  assert sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*.txt")
                ) == ["b/two.txt", "one.txt"]
  held = workdir.lock(f"{bucket}/run")
  with pytest.raises(workdir.WorkdirError, match=rf"{bucket}/run/\.lock is held by host"):
    workdir.lock(f"{bucket}/run")
  held.release()
  assert not paths.exists(f"{bucket}/run/.lock")


def test_a_whole_file_read_while_another_process_replaces_it_is_one_version(gcs_emulator):
  """Fails if read_text of an object that a writer replaces with a longer version meanwhile can
  return a mix (the old size's bytes of the new object: half a JSON document), as a launched
  grid's --status read DIR/grid.json while the orchestrator rewrote it (a CI failure)."""
  import threading  # pylint: disable=g-import-not-at-top
  bucket = gcs_emulator.bucket("replaced")
  target = f"{bucket}/grid.json"
  versions = [json.dumps({"runs": ["x" * n]}) for n in (100, 5000, 300, 20000)]
  paths.write_atomic(target, versions[0])
  stop, bad = threading.Event(), []

  def write():
    i = 0
    while not stop.is_set():
      i += 1
      paths.write_atomic(target, versions[i % len(versions)])

  writer = threading.Thread(target=write, daemon=True)
  writer.start()
  try:
    for _ in range(150):
      text = paths.read_text(target)
      if text not in versions:
        bad.append(len(text))
  finally:
    stop.set()
    writer.join(timeout=30)
  assert not bad, f"{len(bad)} of 150 reads were no whole version (lengths {bad[:5]})"


def test_batch_log_resumed_in_a_bucket_keeps_the_rows_up_to_its_step(gcs_emulator):
  """On gs:// nothing is appended: the log is uploaded whole at each flush, from the
  rows jsonl.resume kept plus the new ones. Fails if a resume in a bucket lost the
  kept rows (the upload would hold only the new ones) or kept the later ones."""
  run = gcs_emulator.bucket("batchlog")
  path = f"{run}/{batch_log.FILE_NAME}"
  row = lambda s: json.dumps({"step": s, "batch": "ab", "tokens": 3, "predictions": 1}) + "\n"
  paths.write_atomic(path, row(1) + row(2) + row(3) + '{"step": 4, "ba')
  log = batch_log.BatchLog(run, 2, process_index=0, process_count=1)
  assert paths.read_text(path) == row(1) + row(2)  # cut back at once, before any new row
  log.add(3, "ab", {"input_mask": np.ones(3), "masked_lm_weights": np.ones(1)})
  log.close()
  assert paths.read_text(path) == row(1) + row(2) + row(3)


@pytest.mark.slow
def test_pretraining_in_a_bucket_killed_and_resumed_is_bit_identical(
    gcs_emulator, pretrain_reference_run, pretrain_test_config, pretrain_subprocess, toy_files,
    tmp_path):
  """Fails if a pretraining run in a bucket, killed as it commits checkpoint 10 and again
  mid-step 13, does not resume from 5 then 10, or its end differs from the reference in
  weights or losses, lacks a run file, TensorBoard events or the gs:// corpus in its
  record, leaves its lock or writes to the working directory, or fine-tuning from it does
  not start from its encoder and write its workdir in the bucket."""
  bucket = gcs_emulator.bucket("bert-run")
  local = pretrain_test_config()
  paths.copy_file(local.data.corpus, f"{bucket}/data/corpus.txt")
  paths.copy_file(local.data.vocab_file, f"{bucket}/vocab/vocab.txt")
  config = pretrain_test_config(**{"data.corpus": f"{bucket}/data/*.txt",
                                   "data.vocab_file": f"{bucket}/vocab/vocab.txt"})
  run = f"{bucket}/run"
  cwd = tmp_path / "cwd"  # the processes' working directory: nothing may land here
  cwd.mkdir()

  marker = tmp_path / "gcs.kill.json"
  log = tmp_path / "gcs.log"  # the three starts append to it

  def start(kill_at=None):
    return pretrain_subprocess(config, run, name="gcs", files_dir=tmp_path, cwd=cwd,
                               env=gcs_emulator.env, kill_at=kill_at, kill_marker=marker)

  # Killed at two chosen moments (tests/kill_points.py), each resumed by the same command.
  # First as orbax commits checkpoint 10: its files are in the bucket, its
  # commit_success.txt is not.
  code = start("save:10").wait(timeout=300)
  assert code == -signal.SIGKILL, f"exit {code}\n" + log.read_text()[-3000:]
  evidence = json.loads(marker.read_text())
  assert (evidence["phase"], evidence["step"]) == ("save", 10), evidence
  assert "commit_success.txt" not in evidence["entries"] and evidence["entries"], evidence
  assert paths.exists(f"{run}/checkpoints/5/commit_success.txt")
  assert not paths.exists(f"{run}/checkpoints/10/commit_success.txt")
  # Then with update 13 dispatched: the uncommitted 10 was not taken for a checkpoint
  # (the run resumed from 5), and was saved again, whole.
  marker.unlink()
  code = start("step:13").wait(timeout=300)
  assert code == -signal.SIGKILL, f"exit {code}\n" + log.read_text()[-3000:]
  assert json.loads(marker.read_text())["phase"] == "step"
  assert paths.exists(f"{run}/checkpoints/10/commit_success.txt")
  assert not paths.exists(f"{run}/checkpoints/15")
  assert start().wait(timeout=300) == 0, log.read_text()[-3000:]
  assert re.findall(r"resumed from \S+ at step (\d+)", log.read_text()) == ["5", "10"]

  _, resumed = checkpoint.load_params_from_workdir(run)
  _, reference = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  jax.tree.map(np.testing.assert_array_equal, resumed, reference)
  assert _losses(run) == _losses(str(pretrain_reference_run))
  for name in ("record.json", "config.json", "bert_config.json", "vocab.txt", "metrics.jsonl"):
    assert paths.exists(f"{run}/{name}"), name
  assert json.loads(paths.read_text(f"{run}/record.json"))["config"]["data.corpus"] == \
      f"{bucket}/data/*.txt"
  assert [os.path.basename(p) for p in paths.glob(f"{run}/tensorboard/events.out.tfevents.*")]
  assert not paths.exists(f"{run}/.lock")
  assert not list(cwd.iterdir()), list(cwd.iterdir())

  # Fine-tuning starts from the checkpoint in the bucket and writes its workdir there too.
  finetuned = f"{bucket}/finetune"
  config = toy_config(toy_files, init_checkpoint=run, num_epochs=1,
                      **{"optimizer.weight_decay": 0.0})
  summary = finetune_sweep.finetune(config, finetuned)
  assert "dev/accuracy" in summary
  result = json.loads(paths.read_text(f"{finetuned}/result.json"))
  assert result["final"]["dev/accuracy"] == summary["dev/accuracy"]
  # The encoder came from the bucket: positions past the fine-tuning length (16) get no
  # gradient and, without weight decay, keep the pretrained values exactly.
  _, best = checkpoint.load_params_from_workdir(f"{finetuned}/best")
  position = lambda p: np.asarray(p["bert"]["embeddings"]["position_embeddings"]["embedding"])
  np.testing.assert_array_equal(position(best)[16:], position(reference)[16:])
  assert not np.array_equal(position(best)[:16], position(reference)[:16])
  assert paths.glob(f"{finetuned}/predictions/*/dev_predictions.jsonl")
  assert not list(cwd.iterdir())
