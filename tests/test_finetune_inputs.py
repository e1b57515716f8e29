"""Fine-tuning inputs are validated when they are read, before anything compiles or trains.

An empty or header-only split, a byte that is not UTF-8, broken JSON: each is
a ValueError naming the file (and the line, or the split) from the readers
(bert_jax/finetune/readers/tabular_files.py, glue.py, squad.py, conll.py) or a kind's
build (registry.py), never an
IndexError after the training. The same readers read gs:// through
host.paths, tested here against a local fake-gcs-server.
"""

import json
import os
import pathlib
import re

import pytest

from bert_jax.finetune.kinds import classification_task
from bert_jax.finetune.readers import conll
from bert_jax.finetune.readers import glue
from bert_jax.finetune.kinds import registry
from bert_jax.finetune.readers import squad
from bert_jax.finetune.readers import tabular_files
from bert_jax.finetune.features import tokenization
from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.finetune import trainer
from bert_jax.model import encoder as model_lib
from experiments.configs import finetune as finetune_configs
from host import paths
from test_finetune_trainer import toy_config  # the tiny fine-tuning config of the trainer tests
from test_finetune_trainer import toy_files  # pylint: disable=unused-import  # a fixture

# ISO-8859-1 "café": the 0xe9 byte cannot start a UTF-8 sequence.
LATIN1_CAFE = "café".encode("latin-1")


def _at(path) -> str:
  """A regex matching the file name as the error messages spell it."""
  return re.escape(os.fspath(path))


def _write(path: pathlib.Path, content: "str | bytes") -> pathlib.Path:
  if isinstance(content, str):
    content = content.encode("utf-8")
  path.write_bytes(content)
  return path


# ---------------------------------------------------------------------------- through the trainer


@pytest.mark.parametrize("content", ["", "sentence\tlabel\n", "\n\n"],
                         ids=["empty", "header_only", "blank_lines"])
def test_empty_dev_file_fails_before_training(toy_files, tmp_path, monkeypatch, content):
  """The careful user's case: it used to train every step, then fail in _predict."""
  dev = _write(tmp_path / "dev.tsv", content)
  runs = []
  monkeypatch.setattr(trainer, "finetune_run", lambda *a, **k: runs.append(a))
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=rf"^{_at(dev)}: the dev split has no examples \(empty file, "
                                       r"header only, or every row skipped\)$"):
    finetune_sweep.finetune(toy_config(toy_files, **{"task.dev_file": str(dev)}), str(workdir))
  assert not runs, "a run started (and would have compiled and trained) before the data check"
  assert not (workdir / "checkpoints").exists()
  assert not (workdir / "metrics.jsonl").exists()


def test_header_only_dev_csv_fails_before_anything_is_written(toy_files, tmp_path):
  """No stub this time: the real entry refuses the file and writes nothing in the workdir."""
  train = _write(tmp_path / "train.csv", toy_files["train"].read_text().replace("\t", ","))
  dev = _write(tmp_path / "dev.csv", "sentence,label\r\n")
  workdir = tmp_path / "run"
  config = toy_config(toy_files, **{"task.train_file": str(train), "task.dev_file": str(dev)})
  with pytest.raises(ValueError, match=rf"^{_at(dev)}: the dev split has no examples"):
    finetune_sweep.finetune(config, str(workdir))
  assert not workdir.exists() or sorted(p.name for p in workdir.iterdir()) == []


# ---------------------------------------------------------------------------- classification files


def test_non_utf8_csv_and_tsv_name_file_and_line(tmp_path):
  """Fails if a Latin-1 byte deep in a CSV, or in a GLUE TSV, is not refused with the file, its line
  and the byte, or a UTF-8 BOM hides the CSV header."""
  # The bad byte sits past the text layer's first decoded chunk, which cannot say where it is.
  rows = "".join(f"sentence {i},1\n" for i in range(2000))
  csv_file = _write(tmp_path / "train.csv", b"sentence,label\n" + rows.encode()
                    + b'"un ' + LATIN1_CAFE + b'",0\n')
  with pytest.raises(ValueError, match=rf"^{_at(csv_file)} is not valid UTF-8 at line 2002: "
                                       r"byte 0xe9 \(invalid continuation byte\)$"):
    tabular_files.read_examples(csv_file, text_a="sentence")
  tsv_dir = tmp_path / "sst"
  tsv_dir.mkdir()
  _write(tsv_dir / "train.tsv", b"sentence\tlabel\ngood\t1\nun " + LATIN1_CAFE + b"\t0\n")
  with pytest.raises(ValueError, match=r"sst/train\.tsv is not valid UTF-8 at line 3: byte 0xe9"):
    glue.load_task("sst2", tsv_dir)
  # A BOM is not an error, and the header after it is found.
  bom = _write(tmp_path / "bom.csv", "\ufeffsentence,label\nfine,1\n")
  assert [(e.text_a, e.label)
          for e in tabular_files.read_examples(bom, text_a="sentence")] == [("fine", "1")]


def test_csv_errors_name_the_physical_line(tmp_path):
  """A quoted field may span lines; the line reported is where the record starts."""
  path = _write(tmp_path / "train.csv",
                'sentence,label\n"two\nlines",1\n"three\nmore\nlines",2\nlast,x\n')
  with pytest.raises(ValueError, match=r"train\.csv:4: label '2' is not one of"):
    tabular_files.read_examples(path, text_a="sentence", labels=["1", "x"])
  examples = tabular_files.read_examples(path, text_a="sentence")
  assert [e.guid.rsplit(":", 1)[1] for e in examples] == ["2", "4", "7"]
  assert examples[0].text_a == "two\nlines"
  huge = _write(tmp_path / "huge.csv", "sentence,label\nok,1\n" + "x" * 200_000 + ",1\n")
  with pytest.raises(ValueError, match=r"huge\.csv:3: not valid CSV \(field larger than"):
    tabular_files.read_examples(huge, text_a="sentence")


def test_empty_splits_name_file_and_split(tmp_path):
  """Fails if a header-only GLUE dev.tsv, a QQP train file of only short rows, or an empty custom
  train file is not refused naming the file and the empty split."""
  # GLUE TSV directory: a dev.tsv with only its header.
  sst = tmp_path / "sst"
  sst.mkdir()
  _write(sst / "train.tsv", "sentence\tlabel\nfine movie\t1\n")
  _write(sst / "dev.tsv", "sentence\tlabel\n")
  with pytest.raises(ValueError, match=r"sst/dev\.tsv: the dev split has no examples"):
    glue.load_task("sst2", sst)
  # Every row unusable: QQP skips short rows, and here all of them are short.
  qqp = tmp_path / "qqp"
  qqp.mkdir()
  _write(qqp / "train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n1\t1\t2\tHow?\n")
  with pytest.raises(ValueError, match=r"qqp/train\.tsv: the train split has no examples"):
    glue.load_split("qqp", qqp, "train")
  # An empty train file is named as such, not as a dev label missing from an empty label set.
  _write(tmp_path / "train.jsonl", "\n")
  _write(tmp_path / "dev.jsonl", '{"t": "a", "y": "x"}\n')
  task = glue.custom_task("mine", train_file="train.jsonl", dev_file="dev.jsonl", text_a="t",
                          label="y")
  with pytest.raises(ValueError, match=r"train\.jsonl: the train split has no examples"):
    glue.load_task(task, tmp_path)


def test_broken_jsonl_line(tmp_path):
  """Fails if a truncated JSON line, or a Latin-1 byte, in a custom task's JSONL dev file is not
  refused with the file and its line."""
  _write(tmp_path / "train.jsonl", '{"t": "a", "y": "x"}\n')
  dev = _write(tmp_path / "dev.jsonl", '{"t": "a", "y": "x"}\n\n{"t": "b", "y": "x"\n')
  task = glue.custom_task("mine", train_file="train.jsonl", dev_file="dev.jsonl", text_a="t",
                          label="y")
  with pytest.raises(ValueError,
                     match=rf"^{_at(dev)}:3: not valid JSON \(Expecting ',' delimiter\)$"):
    glue.load_task(task, tmp_path)
  _write(dev, b'{"t": "a", "y": "x"}\n{"t": "' + LATIN1_CAFE + b'", "y": "x"}\n')
  with pytest.raises(ValueError, match=rf"^{_at(dev)} is not valid UTF-8 at line 2"):
    glue.load_task(task, tmp_path)


# ------------------------------------------------------------------------ through a kind's build


@pytest.fixture(scope="module")
def build(uncased_vocab):
  """The kind's build (registry.get_kind) on a finetune.py config of `name`, task fields
  overridden."""
  tokenizer = tokenization.load_word_tokenizer(str(uncased_vocab), "", True)
  bert_config = model_lib.BertConfig.from_size("tiny", vocab_size=len(tokenizer.vocab))

  def run(name, **task_fields):
    config = finetune_configs.get_config(name)
    config.task.update({k: str(v) if isinstance(v, pathlib.Path) else v
                        for k, v in task_fields.items()})
    return registry.get_kind(config.task.kind).build(config.task, bert_config, tokenizer, 128)
  return run


def test_empty_conll_dev_file(build, allennlp_fixtures, tmp_path):
  """Fails if an empty or DOCSTART-only CoNLL dev file, or one with a Latin-1 byte, is not refused
  with the file (and line), or a real dev file builds fewer than 2 rows."""
  train = allennlp_fixtures / "conll2003.txt"
  for content in ("", "-DOCSTART- -X- O O\n\n"):
    dev = _write(tmp_path / "dev.txt", content)
    with pytest.raises(ValueError, match=rf"^{_at(dev)}: the dev split has no examples "
                                         r"\(empty file, or no token lines\)$"):
      build("conll", train_file=train, dev_file=dev, scheme="iob1")
  dev = _write(tmp_path / "dev.txt", b"EU B-ORG\n\n" + LATIN1_CAFE + b" O\n")
  with pytest.raises(ValueError, match=rf"^{_at(dev)} is not valid UTF-8 at line 3: byte 0xe9"):
    build("conll", train_file=train, dev_file=dev, scheme="iob1")
  task = build("conll", train_file=train, dev_file=train, scheme="iob1")
  assert len(task.dev["dev"].features["input_ids"]) >= 2


def test_squad_files(build, allennlp_fixtures, tmp_path):
  """Fails if malformed, empty, non-UTF-8, question-less or context-less SQuAD dev files, or a train
  file whose answers all miss their offsets, are not refused with the file and the reason."""
  fixture = allennlp_fixtures / "squad.json"
  broken = _write(tmp_path / "dev.json", '{"data": [\n  {"paragraphs": [}\n]}')
  with pytest.raises(ValueError,
                     match=rf"^{_at(broken)}:2:19: malformed JSON \(Expecting value\)$"):
    build("squad_v1", train_file=fixture, dev_file=broken)
  empty = _write(tmp_path / "empty.json", "\n")
  with pytest.raises(ValueError,
                     match=rf"^{_at(empty)}: the file is empty \(expected SQuAD JSON\)$"):
    build("squad_v1", train_file=fixture, dev_file=empty)
  latin = _write(tmp_path / "latin.json", b'{"data": [],\n"v": "' + LATIN1_CAFE + b'"}')
  with pytest.raises(ValueError, match=rf"^{_at(latin)} is not valid UTF-8 at line 2: byte 0xe9"):
    squad.read_squad(latin, is_training=False)
  no_data = _write(tmp_path / "none.json", json.dumps({"version": "1.1", "data": []}))
  with pytest.raises(ValueError, match=rf"^{_at(no_data)}: the dev split has no examples "
                                       r"\(no questions\)$"):
    build("squad_v1", train_file=fixture, dev_file=no_data)
  # Questions, but every context empty: no window to predict on.
  blank = _write(tmp_path / "blank.json", json.dumps({"data": [{"paragraphs": [
      {"context": " ", "qas": [{"id": "q", "question": "Who?", "answers": []}]}]}]}))
  with pytest.raises(ValueError, match=rf"^{_at(blank)}: the dev split has no examples "
                                       r"\(every context is empty\)$"):
    build("squad_v1", train_file=fixture, dev_file=blank)
  # Training questions whose answers all miss their offsets are skipped: none left.
  off = _write(tmp_path / "off.json", json.dumps({"data": [{"paragraphs": [
      {"context": "The cat sat.", "qas": [{"id": "q", "question": "Who?",
                                            "answers": [{"text": "dog", "answer_start": 4}]}]}]}]}))
  with pytest.raises(ValueError, match=rf"^{_at(off)}: the train split has no examples"):
    build("squad_v1", train_file=off, dev_file=fixture)


# ---------------------------------------------------------------------------- gs://


@pytest.fixture(scope="module")
def gcs_bucket(gcs_emulator):
  """A bucket of this module's on the session's GCS emulator."""
  return gcs_emulator.bucket("finetune-inputs")


def test_custom_csv_and_squad_from_gcs(gcs_bucket, allennlp_fixtures, tmp_path):
  """Fails if CSV, SQuAD or CoNLL files read from gs:// differ from the local reads (guids naming
  the gs:// file and line), or a bad byte, an empty dev file or a missing file is not refused naming
  the gs:// path."""
  local = tmp_path / "csv"
  local.mkdir()
  _write(local / "train.csv", 'text,label\n"naïve, café",pos\n"two\nlines",neg\n')
  _write(local / "dev.csv", "text,label\nfine,pos\n")
  remote = f"{gcs_bucket}/task"
  for name in ("train.csv", "dev.csv"):
    paths.copy_file(local / name, f"{remote}/{name}")
  expected = glue.load_task(glue.custom_task("c", train_file="train.csv", dev_file="dev.csv",
                                             text_a="text"), local)

  def content(data):
    return ([(e.text_a, e.label) for e in data.train],
            {s: [(e.text_a, e.label) for e in d] for s, d in data.dev.items()}, data.labels)
  # File names relative to a gs:// data_dir, and full gs:// file names without one.
  for data_dir, prefix in ((remote, ""), (None, remote + "/")):
    data = glue.load_task(glue.custom_task("c", train_file=prefix + "train.csv",
                                           dev_file=prefix + "dev.csv", text_a="text"), data_dir)
    assert content(data) == content(expected)
    assert data.train[1].guid == f"{remote}/train.csv:3"

  paths.copy_file(allennlp_fixtures / "squad.json", f"{remote}/squad.json")
  for is_training in (True, False):
    assert (squad.read_squad(f"{remote}/squad.json", is_training=is_training)
            == squad.read_squad(allennlp_fixtures / "squad.json", is_training=is_training))

  # Errors name the gs:// file and line exactly as they do locally.
  paths.write_atomic(f"{remote}/latin.csv", b"text,label\nok,pos\n" + LATIN1_CAFE + b",neg\n")
  with pytest.raises(ValueError, match=rf"^{_at(remote)}/latin\.csv is not valid UTF-8 at line 3"):
    tabular_files.read_examples(f"{remote}/latin.csv", text_a="text")
  paths.write_atomic(f"{remote}/empty_dev.csv", "text,label\n")
  with pytest.raises(ValueError,
                     match=rf"^{_at(remote)}/empty_dev\.csv: the dev split has no examples"):
    glue.load_task(glue.custom_task("c", train_file="train.csv", dev_file="empty_dev.csv",
                                    text_a="text"), remote)
  with pytest.raises(ValueError, match=rf"{_at(remote)}/missing\.csv does not exist"):
    glue.load_task(glue.custom_task("c", train_file="missing.csv", dev_file="dev.csv",
                                    text_a="text"), remote)
  conll_file = f"{remote}/dev.txt"
  paths.write_atomic(conll_file, "EU B-ORG\nrejects O\n")
  [sentence] = conll.read_conll(conll_file, scheme="iob2")
  assert (sentence.tokens, sentence.source) == (["EU", "rejects"], f"{conll_file}:1")


def test_predictions_written_to_gcs(gcs_bucket):
  """Fails if classification or SQuAD predictions written to gs:// read back otherwise, or an nbest
  file is written when none was given."""
  out = f"{gcs_bucket}/run/predictions/8"
  rows = [{"guid": "a:2", "prediction": "pos", "label": "pos"}]
  classification_task.KIND.write_predictions(None, out, "dev", rows)
  written = paths.read_text(f"{out}/dev_predictions.jsonl").splitlines()
  assert [json.loads(l) for l in written] == rows
  squad.write_predictions(f"{out}/squad", {"q": "the cat"}, None, {"q": -1.5})
  assert json.loads(paths.read_text(f"{out}/squad/predictions.json")) == {"q": "the cat"}
  assert json.loads(paths.read_text(f"{out}/squad/null_odds.json")) == {"q": -1.5}
  assert not paths.exists(f"{out}/squad/nbest_predictions.json")
