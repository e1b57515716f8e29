"""Fine-tuning tokenizes with the checkpoint's own tokenizer, SentencePiece as WordPiece.

A checkpoint keeps its tokenizer beside it (vocab.txt, or spm.model: a pretraining
workdir copies the one it trained with). With none named in the config, fine-tuning
uses that one; a named one that differs (another model, or the other kind) is refused
in one line unless config.allow_vocab_change says the change is intended.
"""

import inspect
import json
import pathlib
import shutil

import numpy as np
import pytest

from bert_jax import convert
from bert_jax import errors
from bert_jax import jobs
from bert_jax.finetune import trainer
from bert_jax.finetune import prepare as finetune_prepare
from bert_jax.run import workdir as workdir_lib
from data_pipeline.vocab import vocab_training
from experiments.configs import finetune as finetune_configs


@pytest.fixture(scope="module")
def spm_models(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
  """Two SentencePiece models (300 and 320 pieces, BERT's specials) of numpy's docstrings."""
  root = tmp_path_factory.mktemp("spm")
  lines = [line for name in sorted(dir(np))
           for line in (inspect.getdoc(getattr(np, name)) or "").splitlines() if line.strip()]
  corpus = root / "corpus.txt"
  corpus.write_text("\n".join(lines[:3000]) + "\n", encoding="utf-8")
  return tuple(pathlib.Path(vocab_training.train_sentencepiece(
      str(corpus), str(root / f"sp{size}"), vocab_size=size)) for size in (300, 320))


@pytest.fixture(scope="module")
def spm_checkpoint(minilm_dir, spm_models, tmp_path_factory) -> pathlib.Path:
  """MiniLM's weights as an HF directory whose tokenizer is spm.model (the 300-piece
  model), without vocab.txt: what a SentencePiece-pretrained checkpoint looks like."""
  root = tmp_path_factory.mktemp("spm_checkpoint")
  shutil.copy(minilm_dir / "config.json", root / "config.json")
  (root / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
  shutil.copy(spm_models[0], root / workdir_lib.SPM_FILE)
  return root


def _task_config(root: pathlib.Path, checkpoint: pathlib.Path, **overrides):
  """A 32-row custom classification task of plain English, 4 steps of batch 8 at length 16,
  fine-tuned from `checkpoint` with neither vocab_file nor spm_model_file set."""
  words = "the river city runs past a bridge over old stone walls near water".split()
  rows = ["sentence\tlabel"] + [
      f"{words[i % 12]} {words[(5 * i) % 12]} {'river' if i % 2 else 'city'}\t"
      f"{'pos' if i % 2 else 'neg'}" for i in range(32)]
  root.mkdir(exist_ok=True)
  (root / "train.tsv").write_text("\n".join(rows) + "\n")
  (root / "dev.tsv").write_text("\n".join(rows[:9]) + "\n")
  c = finetune_configs.get_config("custom")
  c.task.train_file, c.task.dev_file = str(root / "train.tsv"), str(root / "dev.tsv")
  c.task.labels, c.task.positive_label = "neg,pos", "pos"
  c.init_checkpoint = str(checkpoint)
  c.max_seq_length, c.padding = 16, "fixed"
  c.batch_size = c.eval_batch_size = 8
  c.num_epochs = 1
  c.update_from_flattened_dict(overrides)
  return c


def test_checkpoint_spm_is_found_where_vocab_txt_would_be(tmp_path):
  """Fails if checkpoint_spm misses the spm.model of a training workdir (given as the
  workdir, its checkpoints/ or one step in it) or of an export directory, or invents one."""
  workdir = tmp_path / "w"
  (workdir / "checkpoints" / "5").mkdir(parents=True)
  assert convert.checkpoint_spm(workdir) is None
  (workdir / workdir_lib.SPM_FILE).write_bytes(b"model")
  for path in (workdir, workdir / "checkpoints", workdir / "checkpoints" / "5"):
    assert convert.checkpoint_spm(path) == workdir / workdir_lib.SPM_FILE, path
  export = tmp_path / "export"
  export.mkdir()
  (export / workdir_lib.SPM_FILE).write_bytes(b"model")
  assert convert.checkpoint_spm(export) == export / workdir_lib.SPM_FILE
  assert convert.checkpoint_vocab(export) is None


def test_a_sentencepiece_checkpoint_uses_its_own_model_and_refuses_another(
    spm_checkpoint, spm_models, minilm_dir, tmp_path):
  """Fails if a checkpoint whose tokenizer is spm.model is not tokenized with it when the
  config names none (it was refused with "has no vocab.txt"), if another SentencePiece
  model or a WordPiece vocabulary passes without config.allow_vocab_change (or is refused
  with it), or if the same model's bytes at another path are refused."""
  own = spm_checkpoint / workdir_lib.SPM_FILE
  config = lambda **o: _task_config(tmp_path / "task", spm_checkpoint, **o)
  prepared = finetune_prepare.prepare(config())
  assert prepared.spm_model_file == str(own)
  assert len(prepared.tokenizer.vocab) == 300
  copy = tmp_path / "same.model"
  shutil.copy(own, copy)
  assert finetune_prepare.prepare(config(spm_model_file=str(copy))).spm_model_file == str(copy)
  with pytest.raises(errors.UsageError, match=r"is not the SentencePiece model of "
                     r".* differs: 320 vs 300 pieces, first difference at id \d+; drop "
                     r"config.spm_model_file .*allow_vocab_change=True"):
    finetune_prepare.prepare(config(spm_model_file=str(spm_models[1])))
  with pytest.raises(errors.UsageError, match=r"config.vocab_file=.* is another kind of "
                     r"tokenizer than config.init_checkpoint=.* was trained with .*spm.model"):
    finetune_prepare.prepare(config(vocab_file=str(minilm_dir / "vocab.txt")))
  changed = finetune_prepare.prepare(config(spm_model_file=str(spm_models[1]), allow_vocab_change=True))
  assert changed.spm_model_file == str(spm_models[1]) and len(changed.tokenizer.vocab) == 320


@pytest.mark.slow  # a 4-step fine-tune of MiniLM (L=6, H=384)
def test_a_sentencepiece_checkpoint_fine_tunes_and_its_workdir_keeps_the_model(
    spm_checkpoint, tmp_path, capfd):
  """Fails if the fine-tuning command a SentencePiece checkpoint's user types first (no
  tokenizer named) does not finish, or if its workdir and best/ do not keep the model it
  tokenized with (the record's hash, spm.model itself), so a run from best/ would lack it."""
  run = tmp_path / "ft"
  assert jobs.run(_task_config(tmp_path / "task", spm_checkpoint), str(run)) == 0, (
      capfd.readouterr().err[-3000:])
  record = json.loads((run / "record.json").read_text())
  own = spm_checkpoint / workdir_lib.SPM_FILE
  assert record["spm_sha256"] == workdir_lib.sha256_of(str(own))
  assert record["vocab_sha256"] is None
  for kept in (run / workdir_lib.SPM_FILE, run / trainer.BEST_DIR / workdir_lib.SPM_FILE):
    assert kept.read_bytes() == own.read_bytes(), kept
  assert convert.checkpoint_spm(run / trainer.BEST_DIR) == run / trainer.BEST_DIR / "spm.model"
