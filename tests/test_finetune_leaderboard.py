"""GLUE test-split prediction files in the layout the GLUE leaderboard accepts.

Synthetic GLUE-format directories laid out as download_glue_data.py leaves
them (test.tsv with a header and an index column and no label; MNLI's
test_matched / test_mismatched; the diagnostic set in diagnostic/ beside
MNLI/) are read by glue.py, predicted by the classification kind and written
as CoLA.tsv, MNLI-m.tsv, MNLI-mm.tsv, AX.tsv, STS-B.tsv, ... with the header
`index<TAB>prediction`, the leaderboard's label strings and STS-B clipped to
[0, 5]; AX is skipped when the diagnostic file is absent (unless the config
names one). One run through the whole trainer learns a toy SST-2 and writes
SST-2.tsv next to its dev predictions and into best/.
"""

import json
import logging
import pathlib
import re

import numpy as np
import pytest

from bert_jax.finetune.readers import glue
from bert_jax.finetune.readers import records
from bert_jax.finetune.kinds import registry
from bert_jax.finetune.features import tokenization
from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.model import encoder as model_lib
from experiments.configs import finetune as finetune_configs
from test_finetune_trainer import toy_config  # the tiny fine-tuning config of the trainer tests
from test_finetune_trainer import toy_files  # pylint: disable=unused-import  # a fixture

_MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                "sentence1_parse\tsentence2_parse\tsentence1\tsentence2")


def _write(path: pathlib.Path, text: str) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text, encoding="utf-8")
  return path


def _read_tsv(path: pathlib.Path) -> list[list[str]]:
  return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def glue_dir(tmp_path) -> pathlib.Path:
  """glue_data/{CoLA,MNLI,STS-B,QQP,diagnostic} with a few rows each, as the download has them."""
  root = tmp_path / "glue_data"
  # CoLA: train/dev without header, test with one.
  _write(root / "CoLA/train.tsv", "gj04\t1\t\tThe river ran.\ngj04\t0\t*\tRan the the.\n")
  _write(root / "CoLA/dev.tsv", "cj99\t1\t\tThe bird sang.\n")
  _write(root / "CoLA/test.tsv", "index\tsentence\n0\tThe tree grew.\n1\tGrew tree the.\n")
  mnli_row = lambda i, a, b, *label: (f"{i}\t1\t1{i}\tgov\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{a}"
                                      f"\t{b}" + "".join(f"\t{l}" for l in label) + "\n")
  labelled = _MNLI_HEADER + "\tlabel1\tgold_label\n"
  _write(root / "MNLI/train.tsv", labelled + mnli_row(0, "A man eats.", "He eats.", "entailment",
                                                      "entailment")
         + mnli_row(1, "A man eats.", "He sleeps.", "contradiction", "contradiction")
         + mnli_row(2, "Rain.", "Wet.", "neutral", "neutral"))
  for split in ("dev_matched", "dev_mismatched"):
    _write(root / f"MNLI/{split}.tsv", labelled + mnli_row(3, "Sun.", "Dry.", "neutral", "neutral"))
  _write(root / "MNLI/test_matched.tsv", _MNLI_HEADER + "\n" + mnli_row(0, "Sun.", "Hot.")
         + mnli_row(1, "Snow.", "Cold."))
  _write(root / "MNLI/test_mismatched.tsv", _MNLI_HEADER + "\n" + mnli_row(0, "Wind.", "Air."))
  _write(root / "diagnostic/diagnostic.tsv",
         "index\tsentence1\tsentence2\n0\tThe cat sat.\tA cat sat.\n1\tNo.\tYes.\n2\tA.\tB.\n")
  sts = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
  _write(root / "STS-B/train.tsv", sts + "\tscore\n0\tm\tx\t2012\t1\tn\tn\tA plane.\tA jet.\t5.0\n"
         "1\tm\tx\t2012\t2\tn\tn\tA cat.\tA car.\t1.0\n")
  _write(root / "STS-B/dev.tsv", sts + "\tscore\n0\tm\tx\t2012\t1\tn\tn\tA dog.\tA cat.\t2.5\n")
  _write(root / "STS-B/test.tsv", sts + "\n0\tm\tx\t2012\t1\tn\tn\tA.\tB.\n"
         "1\tm\tx\t2012\t2\tn\tn\tC.\tD.\n2\tm\tx\t2012\t3\tn\tn\tE.\tF.\n")
  qqp = "id\tqid1\tqid2\tquestion1\tquestion2"
  _write(root / "QQP/train.tsv", qqp + "\tis_duplicate\n1\t1\t2\tHow?\tWhy?\t0\n"
         "2\t3\t4\tWho?\tWho is?\t1\n")
  _write(root / "QQP/dev.tsv", qqp + "\tis_duplicate\n3\t5\t6\tWhat?\tWhat is?\t1\n")
  _write(root / "QQP/test.tsv", "id\tquestion1\tquestion2\n7\tWhere?\tWhen?\n9\tHow?\tHow so?\n")
  return root


def test_test_splits_are_read_unlabelled_with_their_index(glue_dir, caplog):
  """Fails if test splits read with labels or without their index, MNLI lacks AX, test files are
  read without test=True, a task with no test split is accepted, a missing diagnostic file gives no
  warning, or a missing MNLI test file is not refused."""
  cola = glue.load_task("cola", glue_dir / "CoLA", test=True)
  assert [(e.index, e.text_a, e.label) for e in cola.test["test"]] == [
      ("0", "The tree grew.", None), ("1", "Grew tree the.", None)]
  mnli = glue.load_task("mnli", glue_dir / "MNLI", test=True)
  assert {s: len(e) for s, e in mnli.test.items()} == {"test_matched": 2, "test_mismatched": 1,
                                                        "ax": 3}
  assert (mnli.test["ax"][0].text_a, mnli.test["ax"][0].text_b) == ("The cat sat.", "A cat sat.")
  assert [e.index for e in glue.load_split("qqp", glue_dir / "QQP", "test")] == ["7", "9"]
  # Without test=True nothing is read from test files; a task without them is refused.
  assert glue.load_task("cola", glue_dir / "CoLA").test == {}
  custom = glue.custom_task("c", train_file="train.tsv", dev_file="dev.tsv", text_a="sentence")
  with pytest.raises(ValueError, match="task 'c' has no test split to predict"):
    glue.load_task(custom, glue_dir, test=True)
  # A copy of GLUE without the diagnostic set: MNLI's own test files, and a warning.
  (glue_dir / "diagnostic/diagnostic.tsv").unlink()
  with caplog.at_level(logging.WARNING):
    mnli = glue.load_task("mnli", glue_dir / "MNLI", test=True)
  assert set(mnli.test) == {"test_matched", "test_mismatched"}
  assert re.search(r"no ax split \(.*glue_data/diagnostic/diagnostic\.tsv\)", caplog.text)
  # The test splits of the task itself are not optional.
  (glue_dir / "MNLI/test_mismatched.tsv").unlink()
  with pytest.raises(ValueError, match=r"MNLI/test_mismatched\.tsv does not exist"):
    glue.load_task("mnli", glue_dir / "MNLI", test=True)


def test_leaderboard_rows_and_file():
  """Fails if STS-B rows are not clipped to [0, 5] with three decimals, unindexed rows are not
  numbered, a prediction count mismatch is accepted, or a GLUE task's leaderboard file names differ
  from the listed ones."""
  stsb = glue.get_task("stsb")
  examples = [records.Example(f"t:{i}", "a", "b", None, str(10 + i)) for i in range(4)]
  rows = glue.leaderboard_rows(stsb, examples, [-0.4, 2.51234, 5.7, 4.9996])
  assert rows == [("10", "0.000"), ("11", "2.512"), ("12", "5.000"), ("13", "5.000")]
  # No index column (e.g. a tfds split without idx): the row number.
  unindexed = [records.Example("t:1", "a", None, None)] * 2
  assert glue.leaderboard_rows(glue.get_task("rte"), unindexed,
                               ["entailment", "not_entailment"]) == [
                                   ("0", "entailment"), ("1", "not_entailment")]
  with pytest.raises(ValueError, match="3 predictions for 2 test examples"):
    glue.leaderboard_rows(glue.get_task("rte"), unindexed, ["entailment"] * 3)
  names = {name: {s: n for s, n in glue.TASKS[name].leaderboard.items()}
           for name in finetune_configs.GLUE}
  assert names == {"cola": {"test": "CoLA"}, "sst2": {"test": "SST-2"},
                   "mrpc": {"test": "MRPC"}, "stsb": {"test": "STS-B"}, "qqp": {"test": "QQP"},
                   "mnli": {"test_matched": "MNLI-m", "test_mismatched": "MNLI-mm", "ax": "AX"},
                   "qnli": {"test": "QNLI"}, "rte": {"test": "RTE"}, "wnli": {"test": "WNLI"}}


@pytest.fixture(scope="module")
def build(uncased_vocab):
  """The classification kind's build on a finetune.py config with predict_test."""
  tokenizer = tokenization.load_word_tokenizer(str(uncased_vocab), "", True)
  bert_config = model_lib.BertConfig.from_size("tiny", vocab_size=len(tokenizer.vocab))

  def run(name, data_dir, **task_fields):
    config = finetune_configs.get_config(name)
    config.task.update(dict(task_fields, data_dir=str(data_dir), predict_test=True))
    return registry.get_kind(config.task.kind).build(config.task, bert_config, tokenizer, 32)
  return run


def test_kind_writes_mnli_ax_and_stsb_files(build, glue_dir, tmp_path):
  """Logits in, leaderboard files out: label strings by id, indices from the files."""
  mnli = build("mnli", glue_dir / "MNLI")
  assert mnli.labels == ("contradiction", "entailment", "neutral")
  assert set(mnli.test) == {"test_matched", "test_mismatched", "ax"}
  out = tmp_path / "predictions"
  for split in mnli.test.values():
    n = len(split.features["input_ids"])
    # Row i predicts label i % 3.
    mnli.write_test(split, {"logits": np.eye(3)[np.arange(n) % 3]}, out)
  assert _read_tsv(out / "MNLI-m.tsv") == [["index", "prediction"], ["0", "contradiction"],
                                           ["1", "entailment"]]
  assert _read_tsv(out / "MNLI-mm.tsv") == [["index", "prediction"], ["0", "contradiction"]]
  assert _read_tsv(out / "AX.tsv") == [["index", "prediction"], ["0", "contradiction"],
                                       ["1", "entailment"], ["2", "neutral"]]
  # AX from elsewhere: config.task.ax_file.
  ax = _write(tmp_path / "elsewhere/ax.tsv", "index\tsentence1\tsentence2\n5\tA.\tB.\n")
  assert [e.index for e in build("mnli", glue_dir / "MNLI", ax_file=str(ax)).test["ax"]
          .examples] == ["5"]
  # An AX file the config names must exist (only the default location may lack it).
  with pytest.raises(ValueError, match=r"elsewhere/missing\.tsv does not exist"):
    build("mnli", glue_dir / "MNLI", ax_file=str(tmp_path / "elsewhere/missing.tsv"))

  stsb = build("stsb", glue_dir / "STS-B")
  [split] = stsb.test.values()
  stsb.write_test(split, {"logits": np.array([[-1.0], [3.25], [7.0]])}, out)
  assert _read_tsv(out / "STS-B.tsv") == [["index", "prediction"], ["0", "0.000"],
                                          ["1", "3.250"], ["2", "5.000"]]
  qqp = build("qqp", glue_dir / "QQP")
  qqp.write_test(qqp.test["test"], {"logits": np.array([[0.0, 1.0], [1.0, 0.0]])}, out)
  assert _read_tsv(out / "QQP.tsv") == [["index", "prediction"], ["7", "1"], ["9", "0"]]
  with pytest.raises(ValueError, match="has no test split to predict"):
    build("custom", glue_dir, train_file=str(glue_dir / "QQP/train.tsv"),
          dev_file=str(glue_dir / "QQP/dev.tsv"), text_a="question1", label="is_duplicate")


def test_tfds_test_splits_and_ax(tmp_path):
  """Fails if MNLI's test splits read from (mocked) tfds lack AX, or AX's premises and indices
  differ from tfds' glue/ax rows."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(num_examples=4):
    data = glue.load_task("mnli", f"tfds:{tmp_path}", test=True)
    ref = list(tfds.as_numpy(tfds.load("glue/ax", split="test", data_dir=str(tmp_path))))
  assert {s: len(e) for s, e in data.test.items()} == {"test_matched": 4, "test_mismatched": 4,
                                                        "ax": 4}
  assert [(e.text_a, e.index) for e in data.test["ax"]] == [
      (r["premise"].decode(), str(r["idx"])) for r in ref]


@pytest.mark.slow  # a whole fine-tuning run (about a minute on 2 CPU cores)
def test_trainer_writes_the_leaderboard_file_of_the_best_evaluation(toy_files, tmp_path):
  """A toy SST-2 directory ("pos" = contains "river") through the whole trainer."""
  data = tmp_path / "SST-2"
  data.mkdir()
  for split in ("train", "dev"):
    rows = toy_files[split].read_text().splitlines()
    _write(data / f"{split}.tsv", "sentence\tlabel\n" + "".join(
        f"{r.split(chr(9))[0]}\t{int(r.endswith('pos'))}\n" for r in rows[1:]))
  test_sentences = [r.split("\t")[0] for r in toy_files["dev"].read_text().splitlines()[1:]]
  _write(data / "test.tsv", "index\tsentence\n" + "".join(
      f"{i}\t{s}\n" for i, s in enumerate(test_sentences)))
  config = toy_config(toy_files, **{"task.name": "sst2", "task.data_dir": str(data),
                                    "task.predict_test": True, "task.labels": "",
                                    "task.positive_label": "1"})
  summary = finetune_sweep.finetune(config, str(tmp_path / "run"))
  assert summary["dev/accuracy"] >= 0.95, summary
  run = tmp_path / "run"
  best = json.loads((run / "best" / "metrics.json").read_text())
  for directory in (run / "predictions" / str(best["step"]), run / "best" / "predictions"):
    rows = _read_tsv(directory / "SST-2.tsv")
    assert rows[0] == ["index", "prediction"] and len(rows) == 1 + len(test_sentences)
    assert [r[0] for r in rows[1:]] == [str(i) for i in range(len(test_sentences))]
    right = sum(r[1] == str(int("river" in s.split())) for r, s in zip(rows[1:], test_sentences))
    assert right / len(test_sentences) >= 0.95
    assert (directory / "dev_predictions.jsonl").exists()
