"""The tokenized-corpus store (data_pipeline/store/token_store.py, corpus_units.py, prepare_corpus.py).

What must hold, and what would make each test fail:
- its batches are the in-memory path's (data.tokenized_dir="none"), bit for bit, for
  NSP, SOP, none, whole-word masking by the "##" rule and by gold Chinese words, both
  phases, the held-out sets, one process and several (documents round-robin when
  there are fewer files than processes, files round-robin otherwise), tfds corpora
  split per process, and a position saved by the in-memory path resumes on it;
- a preparation killed with kill -9 mid-shard (its temporary file whole, not renamed) and,
  resumed, right after a later shard, then run again, ends with the same bytes as one
  never interrupted (and as one made by 2 worker processes);
- a changed file (even of the same size), vocabulary or option is another store; an
  option of the later stages (objective, heldout_modulus, lengths) is the same one;
- a truncated, damaged or foreign shard is refused by name, and rebuilt by the run;
- the in-memory path's refusals come the same from the store (a JSONL line's number
  in a later shard, a binary file);
- a process of 2 whose peer never comes prepares the rest itself;
- a gs:// store (the GCS emulator) gives the same batches.
The preparation killed with kill -9, the gs:// store, the 2-process jax.distributed run and
the resume of a workdir made before the store are tests/test_token_store_runs.py's.
"""

import errno
import hashlib
import json
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from data_pipeline import prepare
from data_pipeline.store import prepare_corpus
from data_pipeline.store import token_store
from data_pipeline.store import tokenized_corpus
from experiments import small_pretraining
from host import paths
from test_word_segmentation_pipeline import _config as segmented_config  # the toy's config
from test_word_segmentation_pipeline import toy  # pylint: disable=unused-import  # a fixture

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARD_BYTES = 4096  # the test corpus (~50 KB) in about a dozen shards, most of them byte ranges


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """(one-file corpus, the same documents in 3 files, vocab) of experiments/small_pretraining."""
  root = tmp_path_factory.mktemp("store_corpus")
  corpus, vocab = small_pretraining.write_corpus(root), small_pretraining.write_vocab(root)
  documents = corpus.read_text().split("\n\n")
  (root / "split").mkdir()
  for i in range(3):
    (root / "split" / f"part{i}.txt").write_text("\n\n".join(documents[i::3]).strip() + "\n")
  return corpus, root / "split" / "*.txt", vocab


@pytest.fixture(scope="module")
def store_root(tmp_path_factory):
  """One store directory for the module: stores differ by key, so tests share it."""
  return tmp_path_factory.mktemp("stores")


def _config(corpus, vocab, tokenized_dir, **overrides):
  config = small_pretraining.config(corpus, vocab)
  config.data.tokenized_dir = str(tokenized_dir)
  config.data.shard_bytes = SHARD_BYTES
  config.data.prepare_workers = 1
  config.data.eval.num_examples = 48  # whole global batches of 8, 16 and 24
  config.phase2.start_fraction = 0.5
  config.phase2.max_seq_length = 48
  config.phase2.max_predictions_per_seq = 7
  config.update_from_flattened_dict(overrides)
  return config


def _data(config, process_index=0, process_count=1, total_steps=10):
  from bert_jax.pretrain import phases  # pylint: disable=g-import-not-at-top
  return prepare.PretrainingData.prepare(
      phases.of(config), process_index, process_count, batch_size=8 * process_count,
      eval_batch_size=8 * process_count, total_steps=total_steps)


def _everything(data) -> list[dict]:
  """Both phases' first training batches, their positions after them, the eval sets."""
  out = []
  for phase in (1, 2):
    source = data.train_input(phase)
    out += [next(source) for _ in range(3)]
    out.append({"state": np.array(json.dumps(source.get_state()))})
    source.close()
  for phase in (1, 2):
    out += data.eval_batches("eval", phase)
  return out


def _assert_same(batches, others):
  assert len(batches) == len(others)
  for x, y in zip(batches, others):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.mark.parametrize("objective,whole_word,layout,processes", [
    ("nsp", False, "one", 1), ("sop", False, "one", 1), ("none", False, "one", 1),
    ("nsp", True, "one", 1),  # whole-word masking, the "##" rule
    # Several processes' shares: the slowest cases (a pipeline per process), run in CI.
    pytest.param("nsp", False, "one", 3, marks=pytest.mark.slow),  # documents round-robin
    pytest.param("sop", False, "split", 2, marks=pytest.mark.slow),  # whole files round-robin
])
def test_store_gives_the_in_memory_batches(files, store_root, objective, whole_word, layout,
                                           processes, monkeypatch):
  """Fails if any batch, position or eval batch from the store differs from the in-memory
  path's, in either phase, for any process."""
  # The processes are prepared here one after another: process 0 waits for the others'
  # shards only briefly, then prepares them itself (its 60 s grace was a minute of idle CI).
  monkeypatch.setattr(prepare_corpus, "GRACE_S", 0.1)
  corpus = files[0] if layout == "one" else files[1]
  overrides = {"data.objective": objective, "data.masking.whole_word": whole_word}
  for p in range(processes):
    stored = _data(_config(corpus, files[2], store_root, **overrides), p, processes)
    memory = _data(_config(corpus, files[2], "none", **overrides), p, processes)
    _assert_same(_everything(stored), _everything(memory))
    assert stored.tokenized and all(c.num_tokens for c in stored.tokenized.values())


def test_gold_chinese_words_from_the_store(toy, tmp_path):
  """Gold whole-word masking: fails if the store's batches (word starts ride in the ids)
  differ from the in-memory path's, or if "gold" on an unmarked corpus is not refused
  the same way."""
  root, _ = toy
  batches = {}
  for where in ("none", tmp_path):
    config = segmented_config(root, "marked.txt", "gold")
    config.tokenized_dir, config.prepare_workers = str(where), 1
    config.heldout_modulus = 2  # a held-out set to build
    config.eval.num_examples = 4
    data = prepare.PretrainingData.prepare(prepare.one_phase(config, 4), batch_size=4,
                                           eval_batch_size=4, total_steps=4)
    source = data.train_input()
    batches[str(where)] = [next(source) for _ in range(3)] + data.eval_batches()
    source.close()
  _assert_same(batches["none"], batches[str(tmp_path)])
  for where in ("none", tmp_path):
    config = segmented_config(root, "plain.txt", "gold")
    config.tokenized_dir, config.prepare_workers = str(where), 1
    config.heldout_modulus = 2
    with pytest.raises(ValueError, match="no sentence whose gold words line up"):
      prepare.PretrainingData.prepare(prepare.one_phase(config, 4), batch_size=4,
                                      eval_batch_size=4, total_steps=4)


def _tiny_tfds(data_dir: pathlib.Path) -> None:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class StoreText(tfds.core.GeneratorBasedBuilder):
    """A 150-article text dataset (~20 KB) in real tfds format."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      rng = np.random.default_rng(0)
      for i in range(150):
        words = " ".join(rng.choice(small_pretraining.WORDS, 12))
        yield i, {"text": f"Article {i} is here. {words}. It ends!\n\nMore {i}: {words}."}

  StoreText(data_dir=str(data_dir)).download_and_prepare()


def test_tfds_units_per_process_are_the_process_parts(tmp_path, files):
  """Fails if a tfds store's training part of a process, or the held-out set, differs from
  what the in-memory path reads (tfds.even_splits per process, the whole split for eval)."""
  _tiny_tfds(tmp_path / "tfds")
  config = _config("tfds:store_text", files[2], tmp_path / "store",
                   **{"data.tfds_data_dir": str(tmp_path / "tfds"), "data.objective": "none"})
  tokenizer = tokenized_corpus.load_tokenizer(config.data)
  for p in range(2):
    store = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                         process_index=p, process_count=2, num_workers=1,
                                         tokenizer=tokenizer, grace_s=0.1)
    assert len(store.units) > 2  # several units per process
    for split, index, count in (("train", p, 2), ("eval", 0, 1)):
      got = prepare_corpus.read_selection(store, config.data, split=split, process_index=index,
                                          process_count=count)
      expected = tokenized_corpus.read_tokenized_corpus(
          config.data, tokenizer, split=split, process_index=index, process_count=count)
      for field in ("ids", "sentence_starts", "document_starts"):
        np.testing.assert_array_equal(getattr(got, field), getattr(expected, field))


def test_a_position_saved_by_the_in_memory_path_resumes_on_the_store(files, store_root):
  """A checkpoint written before the store existed holds an in-memory input's position:
  fails if the store's input refuses it or continues with other batches."""
  memory = _data(_config(files[0], files[2], "none")).train_input(1)
  next(memory)
  state = {"phase": 1, "input": memory.get_state()}
  expected = [next(memory) for _ in range(2)]
  memory.close()
  resumed = _data(_config(files[0], files[2], store_root)).train_input(1, state)
  _assert_same([next(resumed) for _ in range(2)], expected)
  resumed.close()


def _key_dir(config):
  return token_store.store_dir(config.data, token_store.store_key(
      config.data, config.data.vocab_file, "", 1))


def test_a_changed_file_vocab_or_option_is_another_store(files, tmp_path):
  """Fails if a change the shards depend on reuses a store (a stale hit), or if one they do
  not depend on makes a new one."""
  corpus = tmp_path / "corpus.txt"
  shutil.copy(files[0], corpus)
  base = _config(corpus, files[2], tmp_path / "stores")
  store = prepare_corpus.prepare_store(base.data, vocab_file=str(files[2]), spm_model_file="",
                                       num_workers=1)
  assert store.directory == _key_dir(base) and store.prepared["units"] > 1
  same = [{"data.objective": "sop"}, {"data.heldout_modulus": 7}, {"data.max_seq_length": 48},
          {"data.objective": "documents", "data.pack_window": 64, "data.pack_fill": False},
          {"data.shuffle_buffer": 1024},
          {"data.masking.ratio": 0.3}, {"data.prepare_workers": 2}, {"data.eval.max_documents": 9}]
  for change in same:
    config = _config(corpus, files[2], tmp_path / "stores", **change)
    again = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                         num_workers=1)
    assert again.directory == store.directory and again.prepared["units"] == 0, change
  other_vocab = tmp_path / "vocab.txt"
  other_vocab.write_text(files[2].read_text().replace("[unused0]", "[unused_x]"))
  misses = {"vocab": _config(corpus, other_vocab, tmp_path / "stores"),
            "option": _config(corpus, files[2], tmp_path / "stores",
                              **{"data.max_sentences_per_document": 3}),
            "splitter": _config(corpus, files[2], tmp_path / "stores",
                                **{"data.sentence_splitter": "regex"}),
            "shards": _config(corpus, files[2], tmp_path / "stores", **{"data.shard_bytes": 8192})}
  for name, config in misses.items():
    assert _key_dir(config) != store.directory, name
  text = corpus.read_text()
  time.sleep(0.01)  # a new mtime
  corpus.write_text(text.replace("river", "stone", 1))  # the same size, other content
  assert len(corpus.read_text()) == len(text)
  assert _key_dir(base) != store.directory
  changed = prepare_corpus.prepare_store(base.data, vocab_file=str(files[2]), spm_model_file="",
                                         num_workers=1)
  assert changed.prepared["units"] == store.prepared["units"]  # tokenized again, all of it


def test_truncated_damaged_or_foreign_shards_are_refused_by_name_and_rebuilt(
    files, tmp_path, caplog):
  """Fails if a shard cut short, with a flipped byte, or from another store is read without
  a refusal naming it, or if the run does not rebuild it and train on the same batches."""
  config = _config(files[0], files[2], tmp_path)
  expected = _everything(_data(config))
  store = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                       num_workers=1)
  shard = pathlib.Path(store.directory) / token_store.shard_name(3)
  good = shard.read_bytes()
  other = _config(files[1], files[2], tmp_path)  # another store's shard 3
  foreign = pathlib.Path(prepare_corpus.prepare_store(
      other.data, vocab_file=str(files[2]), spm_model_file="", num_workers=1).directory)
  damaged = bytearray(good)
  header = token_store.Shard(str(shard), store.manifest["key"], 3)
  damaged[header.data_start + header.header["arrays"]["ids"]["offset"] + 3] ^= 0xFF
  for bad, why in ((good[:len(good) // 2], "truncated"), (bytes(damaged), "checksum"),
                   ((foreign / token_store.shard_name(3)).read_bytes(), "another store")):
    shard.write_bytes(bad)
    with pytest.raises(token_store.ShardError, match=rf"{shard}.*{why}"):
      store.select("train", 0, 1, 0, config.data.heldout_modulus)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      _assert_same(_everything(_data(config)), expected)
    assert any(str(shard) in r.getMessage() and "rebuilding" in r.getMessage()
               for r in caplog.records), why
    assert shard.read_bytes() == good


def test_a_cut_manifest_is_named_with_what_to_do(files, tmp_path):
  """Fails if a store whose manifest.json was cut is read past without a refusal naming the
  file and the fix, or if the fix (deleting it) does not give the same batches again."""
  config = _config(files[0], files[2], tmp_path)
  expected = _everything(_data(config))
  store = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                       num_workers=1)
  manifest = pathlib.Path(store.directory) / token_store.MANIFEST
  manifest.write_text(manifest.read_text()[:200])
  with pytest.raises(ValueError, match=rf"{manifest} is damaged \(.*\): delete it"):
    token_store.read_manifest(store.directory)
  manifest.unlink()
  _assert_same(_everything(_data(config)), expected)


# The command on a full disk: writes past 32 KiB fail with EFBIG (test_checkpoint's way), set
# by a shell before it execs the command (a preexec_fn would fork this JAX process).
_FULL_DISK = ["bash", "-c", 'trap "" XFSZ; ulimit -f 32; exec "$@"', "full_disk"]


_ANOTHER_ROOT = ("or choose another store root with --config.data.tokenized_dir=DIR (or "
                 "BERT_JAX_CACHE=DIR, whose tokenized/ is the default root)")


@pytest.mark.parametrize("case", ["a file on its path", "a full disk"])
def test_a_store_root_that_cannot_be_written_is_one_line_and_leaves_nothing(files, tmp_path,
                                                                           case):
  """The offline command into a store root under a file (ENOTDIR) or on a full disk (EFBIG
  past 32 KiB; a shard of the whole corpus is larger): fails unless it exits 1 with one
  line naming the file it could not write, the root and what to do (it was a 25-30 line
  OSError traceback; a training run printed the path as '?'), or if anything is left:
  the root and its parent, made by the command, are gone again."""
  from test_refusals import _refusal_line  # pylint: disable=g-import-not-at-top
  if case == "a file on its path":
    (tmp_path / "file").write_text("not a directory\n")
    root, fix, cause = tmp_path / "file" / "stores", "make {root} a writable directory", (
        "key.json: Not a directory")
  else:
    root, fix, cause = tmp_path / "full" / "stores", "free space on {root}", (
        "shards/00000.tok: File too large")
  args, env = _prepare_command(files, root, 1)
  args[args.index(f"--config.data.shard_bytes={SHARD_BYTES}")] = "--config.data.shard_bytes=1000000"
  run = subprocess.run((_FULL_DISK if case == "a full disk" else []) + args, cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
  line = _refusal_line(run.stderr, run.returncode)
  match = re.fullmatch(rf"error: cannot write the tokenized store: {re.escape(str(root))}/"
                       rf"[0-9a-f]{{20}}/(\S+: [^;]+); (.*)", line)
  assert match, line
  assert match.groups() == (cause, f"{fix.format(root=root)}, {_ANOTHER_ROOT}")
  assert sorted(p.name for p in tmp_path.iterdir()) == (["file"] if "file" in case else [])


def test_a_read_only_store_root_is_told_to_fix_its_permissions(files, tmp_path, monkeypatch):
  """As root (the CI's user) a directory's mode stops no write, so the storage's answer is
  played here: fails unless a read-only file system's error (no file name in it, as a
  failed write gives) is refused naming the file, the root and the fixes."""
  config = _config(files[0], files[2], tmp_path / "stores")

  def read_only(path, data):
    del data
    raise OSError(errno.EROFS, os.strerror(errno.EROFS))
  monkeypatch.setattr(paths, "write_atomic", read_only)
  with pytest.raises(ValueError) as refusal:
    prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                 num_workers=1)
  assert str(refusal.value) == (
      f"cannot write the tokenized store: {_key_dir(config)}/key.json: Read-only file system; "
      f"fix the permissions of {tmp_path / 'stores'}, {_ANOTHER_ROOT}")
  assert not (tmp_path / "stores").exists()


def test_the_command_verifies_every_shard_before_it_says_already_prepared(files, tmp_path):
  """A complete store with a truncated shard and one with a flipped byte (its size and header
  right: only its checksum tells): fails if the offline command says "already prepared"
  (it did, "checked in 0.0 s", leaving the repair to a run's start) rather than naming
  both, rebuilding them and saying so; or if a store found whole is written to."""
  from experiments.configs import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config("tiny")  # the command's config (_prepare_command)
  config.data.update(corpus=str(files[0]), vocab_file=str(files[2]),
                     tokenized_dir=str(tmp_path), shard_bytes=SHARD_BYTES)
  store = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                       num_workers=1)
  shards = {i: pathlib.Path(store.directory) / token_store.shard_name(i) for i in (3, 5)}
  good = {i: shard.read_bytes() for i, shard in shards.items()}
  shards[3].write_bytes(good[3][:len(good[3]) // 2])
  header = store.shard(5)
  damaged = bytearray(good[5])
  damaged[header.data_start + header.header["arrays"]["ids"]["offset"] + 3] ^= 0xFF
  shards[5].write_bytes(bytes(damaged))
  args, env = _prepare_command(files, tmp_path, 1)
  run = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                       check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  for i, why in ((3, r"\d+ bytes where its header says \d+ \(truncated or overwritten\)"),
                 (5, r"array 'ids' does not match its checksum \(damaged\)")):
    assert re.search(rf"rebuilding a shard that cannot be used: {re.escape(str(shards[i]))}: "
                     rf"{why}$", run.stderr, re.MULTILINE), run.stderr
    assert shards[i].read_bytes() == good[i]
  assert f"tokenized 2 of {len(store.units)} shards here" in run.stdout, run.stdout
  written = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
  again = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                       num_workers=1, check_shards=True)
  assert again.prepared["units"] == 0
  assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == written


def test_an_overlong_line_is_named_on_every_path(files, tmp_path, caplog):
  """A corpus file with a 5 MiB line: fails unless the in-memory path, the store's first
  start (it tokenizes) and a later one (it reads the store) each warn, naming the file
  (the store's said nothing)."""
  corpus = tmp_path / "long.txt"
  text = files[0].read_text()
  corpus.write_text(text + "\n" + "x" * (5 << 20) + "\n\n" + text)
  warning = (f"corpus file {corpus}: skipped 1 line longer than config.data.max_line_bytes="
             "1048576 bytes (minified code or binary data, not prose?); raise it to read them")
  for where in ("none", tmp_path / "stores", tmp_path / "stores"):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      _data(_config(corpus, files[2], where))
    assert warning in [r.getMessage() for r in caplog.records], (where, caplog.text)


def test_lone_cr_line_ends_are_lines_and_a_lf_file_keeps_its_store(files, tmp_path):
  """The corpus with "\\r" (old Mac) and "\\r\\n" line ends: fails if either tokenizes to
  other ids, sentences or documents than with "\\n" ones, in memory or from the store (in
  byte ranges cut at its line starts), as a "\\r" file did (one document); or if the
  key of a "\\n" file changed (its store, made before, would be made again) while a "\\r"
  file's, read otherwise now, did not."""
  text = files[0].read_bytes()
  corpora_read = {}
  for name, end in (("lf", b"\n"), ("cr", b"\r"), ("crlf", b"\r\n")):
    (tmp_path / f"{name}.txt").write_bytes(text.replace(b"\n", end))
    for where in ("none", tmp_path / "stores") if name != "crlf" else (tmp_path / "stores",):
      data = _data(_config(tmp_path / f"{name}.txt", files[2], where))
      corpora_read[name, str(where)] = list(data.tokenized.values())
  expected = corpora_read["lf", "none"]
  assert len(expected) == 2 and expected[0].num_documents > 40
  for key, got in corpora_read.items():
    for want, have in zip(expected, got, strict=True):
      for field in ("ids", "sentence_starts", "document_starts"):
        np.testing.assert_array_equal(getattr(have, field), getattr(want, field),
                                      err_msg=f"{key}: {field}")
  plain = lambda name: "sha256:" + hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
  assert token_store.file_digest(str(tmp_path / "lf.txt"), text=True) == plain("lf.txt")
  assert token_store.file_digest(str(tmp_path / "crlf.txt"), text=True) == plain("crlf.txt")
  assert token_store.file_digest(str(tmp_path / "cr.txt"), text=True) != plain("cr.txt")


def test_refusals_are_the_in_memory_paths(tmp_path, files):
  """Fails if a bad JSONL line in a later shard is named with another line number than the
  in-memory path's, or a binary file with another message."""
  lines = [json.dumps({"text": f"Line {i} is text. It has two sentences."}) for i in range(400)]
  lines[350] = '{"body": "no text"}'
  (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
  (tmp_path / "mixed").mkdir()
  shutil.copy(files[0], tmp_path / "mixed" / "a.txt")
  (tmp_path / "mixed" / "blob.bin").write_bytes(np.random.default_rng(0).bytes(1 << 14))
  for corpus, named in ((f"jsonl:{tmp_path}/a.jsonl", "a.jsonl:351: "),
                        (f"{tmp_path}/mixed/*", "corpus file .*blob.bin: .* are not UTF-8")):
    messages = []
    for where in ("none", tmp_path / "stores"):
      config = _config(corpus, files[2], where, **{"data.objective": "none"})
      with pytest.raises(ValueError) as refusal:
        _data(config)
      messages.append(str(refusal.value))
    assert messages[0] == messages[1] and re.search(named, messages[0]), messages


def test_a_process_whose_peer_never_comes_prepares_the_rest(files, tmp_path):
  """Process 0 of 2 alone (a store on its own host's disk): fails if it does not take over
  the other's shards after the grace period, or if the store differs from one process's."""
  config = _config(files[0], files[2], tmp_path / "alone")
  started = time.monotonic()
  store = prepare_corpus.prepare_store(config.data, vocab_file=str(files[2]), spm_model_file="",
                                       process_index=0, process_count=2, num_workers=1,
                                       grace_s=0.5)
  assert store.prepared["units"] == len(store.units) and time.monotonic() - started < 120
  single = _config(files[0], files[2], tmp_path / "single")
  prepare_corpus.prepare_store(single.data, vocab_file=str(files[2]), spm_model_file="",
                               num_workers=1)
  assert _tree(tmp_path / "alone") == _tree(tmp_path / "single")


def _tree(root: pathlib.Path) -> dict[str, bytes]:
  """Every file under `root` by relative path (temporary files included: none may be left)."""
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
          if p.is_file() and "file_digests" not in p.parts}


def _prepare_command(files, root, workers, **env):
  args = [sys.executable, "-m", "data_pipeline.store.prepare_corpus",
          "--config=experiments/configs/pretrain.py:tiny", f"--config.data.corpus={files[0]}",
          f"--config.data.vocab_file={files[2]}", f"--config.data.tokenized_dir={root}",
          f"--config.data.shard_bytes={SHARD_BYTES}", f"--num_workers={workers}"]
  return args, {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", **env}
