"""Tests of data_pipeline/examples/pretraining.py (+ pairs.py): pairs, determinism, eval set, resume, bad input.

The corpus is synthetic text of random whole words of the real bert-base-uncased
vocab, so every token run is unique and a decoded segment can be located in its
source document; the oracle tokenization is transformers' BertTokenizerFast.
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

from data_pipeline.sources import corpora
from data_pipeline.examples import pretraining
from data_pipeline import specs
from experiments.configs import data as data_configs

SEQ = 64
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory, uncased_vocab):
  """Three BERT-format files of 180 documents of random vocab words (plus 1-sentence docs)."""
  words = [w for w in uncased_vocab.read_text().split("\n")
           if w.isalpha() and w.isascii() and len(w) >= 3]
  rng = random.Random(1234)
  root = tmp_path_factory.mktemp("corpus")
  for f in range(3):
    docs = []
    for d in range(60):
      num_sentences = 1 if d % 20 == 0 else rng.randint(2, 9)
      docs.append([" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + "."
                   for _ in range(num_sentences)])
    (root / f"docs-{f}.txt").write_text("\n\n".join("\n".join(d) for d in docs) + "\n")
  return root


@pytest.fixture(scope="module")
def reference(uncased_vocab):
  """HF BertTokenizerFast: the oracle for what a sentence's ids must be."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.BertTokenizerFast(str(uncased_vocab), do_lower_case=True)


def _config(corpus_dir, uncased_vocab, **overrides):
  config = data_configs.data_config()
  config.corpus = str(corpus_dir / "*.txt")
  config.vocab_file = str(uncased_vocab)
  config.max_seq_length = SEQ
  config.shuffle_buffer = 32
  config.heldout_modulus = 10
  config.eval.num_examples = 64
  for key, value in overrides.items():
    target = config
    *path, leaf = key.split(".")
    for part in path:
      target = target[part]
    target[leaf] = value
  return config


def _batches(config, n, batch_size=32, **kwargs):
  source = pretraining.PretrainingInput(config, batch_size=batch_size, **kwargs)
  return [next(source) for _ in range(n)]


def _restored(batch):
  """input_ids with every masked position given back its original id."""
  ids = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"])
  ids[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
  return ids


def _segments(batch):
  """(A ids, B ids, label) of every row, from the unmasked ids."""
  out = []
  for ids, seg, mask, label in zip(_restored(batch), batch["segment_ids"], batch["input_mask"],
                                   batch["next_sentence_labels"]):
    n = mask.sum()
    a = ids[1:n][seg[1:n] == 0][:-1]
    b = ids[1:n][seg[1:n] == 1][:-1]
    out.append((a, b, int(label)))
  return out


class _Locator:
  """Finds a token run in the oracle-tokenized source documents."""

  def __init__(self, documents, reference):
    self.docs = []
    for doc in documents:
      ids = [i for s in doc for i in reference(s, add_special_tokens=False)["input_ids"]]
      self.docs.append("," + ",".join(map(str, ids)) + ",")

  def find(self, run):
    """[(doc index, token offset)] of every occurrence."""
    needle = "," + ",".join(map(str, run)) + ","
    hits = []
    for d, text in enumerate(self.docs):
      at = text.find(needle)
      if at >= 0:
        hits.append((d, text[:at + 1].count(",") - 1))
    return hits


def _documents(config, split="train"):
  return list(corpora.read_documents(config.corpus, split=split,
                                     heldout_modulus=config.heldout_modulus))


def test_features_follow_the_contract(corpus_dir, uncased_vocab):
  """Fails if a batch's features differ in name, shape or dtype from the contract (10 predictions at
  length 64), or a row lacks one [CLS] first and exactly two [SEP]."""
  config = _config(corpus_dir, uncased_vocab)
  batch = _batches(config, 1, batch_size=8)[0]
  p = specs.max_predictions(config)
  assert p == 10  # ceil(0.15 * 64)
  expected = {"input_ids": ([8, SEQ], np.int32), "input_mask": ([8, SEQ], np.int32),
              "segment_ids": ([8, SEQ], np.int32), "masked_lm_positions": ([8, p], np.int32),
              "masked_lm_ids": ([8, p], np.int32), "masked_lm_weights": ([8, p], np.float32),
              "next_sentence_labels": ([8], np.int32)}
  assert {k: (list(v.shape), v.dtype) for k, v in batch.items()} == expected
  ids = _restored(batch)
  assert (ids[:, 0] == 101).all()  # [CLS]
  assert ((ids == 102).sum(1) == 2).all()  # two [SEP]
  assert (batch["input_mask"].sum(1) <= SEQ).all()


def test_nsp_balance_positive_follows_negative_from_other_document(
    corpus_dir, uncased_vocab, reference):
  """Fails if NSP labels are not near half random, an IsNext B does not follow its A in the same
  document, or a random B comes from A's document (over 100 of each checked)."""
  config = _config(corpus_dir, uncased_vocab)
  locator = _Locator(_documents(config), reference)
  rows = [r for b in _batches(config, 12) for r in _segments(b)]
  labels = np.array([r[2] for r in rows])
  # google-research's scheme is ~50/50 plus a small random-B excess (one-sentence chunks).
  assert 0.42 < labels.mean() < 0.60, labels.mean()
  checked = {0: 0, 1: 0}
  for a, b, label in rows:
    if len(a) < 4 or len(b) < 4:
      continue
    (doc_a, at_a), = locator.find(a)
    (doc_b, at_b), = locator.find(b)
    if label == 0:
      assert doc_a == doc_b and at_b >= at_a + len(a)
    else:
      assert doc_a != doc_b
    checked[label] += 1
  assert checked[0] > 100 and checked[1] > 100, checked


def test_sop_swaps_half_of_the_pairs(corpus_dir, uncased_vocab, reference):
  """Fails if SOP labels are not near half swapped, a pair's segments come from two documents, or
  the order of A and B does not match the label (over 200 checked)."""
  config = _config(corpus_dir, uncased_vocab, objective="sop")
  locator = _Locator(_documents(config), reference)
  rows = [r for b in _batches(config, 10) for r in _segments(b)]
  labels = np.array([r[2] for r in rows])
  assert 0.42 < labels.mean() < 0.58, labels.mean()
  checked = 0
  for a, b, label in rows:
    if len(a) >= 4 and len(b) >= 4:
      (doc_a, at_a), = locator.find(a)
      (doc_b, at_b), = locator.find(b)
      assert doc_a == doc_b
      assert (at_b >= at_a + len(a)) if label == 0 else (at_a >= at_b + len(b))
      checked += 1
  assert checked > 200


def test_none_objective_packs_full_sentences_across_documents(corpus_dir, uncased_vocab, reference):
  """Fails if objective "none" sets segment ids or labels, a row does not open with [CLS] and end
  with [SEP], a [SEP] inside a row is not a document end followed by a document start, or the rows
  are not full to within a sentence."""
  config = _config(corpus_dir, uncased_vocab, objective="none")
  documents = _documents(config)
  locator = _Locator(documents, reference)
  doc_lengths = [d.count(",") - 1 for d in locator.docs]
  batches = _batches(config, 4)
  boundaries = 0
  for batch in batches:
    assert not batch["segment_ids"].any() and not batch["next_sentence_labels"].any()
    for ids, n in zip(_restored(batch), batch["input_mask"].sum(1)):
      assert ids[0] == 101 and ids[n - 1] == 102
      pieces = np.split(ids[1:n - 1], np.nonzero(ids[1:n - 1] == 102)[0])
      pieces = [p[p != 102] for p in pieces]
      spans = [locator.find(p)[0] for p in pieces]
      for (d0, at0), p0, (d1, at1) in zip(spans, pieces, spans[1:]):
        assert at0 + len(p0) == doc_lengths[d0] and at1 == 0  # boundary = doc end -> doc start
        boundaries += 1
  assert boundaries > 20
  fill = np.concatenate([b["input_mask"].sum(1) for b in batches])
  assert np.median(fill) >= SEQ - 14  # full up to one sentence short


def test_deterministic_across_runs_and_across_masking_ratios(corpus_dir, uncased_vocab):
  """Fails if two runs give different batches, another masking ratio or whole-word masking changes
  the pairs rather than only the masks (or does not mask more), or a new epoch repeats the first's
  pairs."""
  base = _batches(_config(corpus_dir, uncased_vocab), 4)
  again = _batches(_config(corpus_dir, uncased_vocab), 4)
  for x, y in zip(base, again):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
  other = _batches(_config(corpus_dir, uncased_vocab, **{"masking.ratio": 0.5,
                                                         "masking.whole_word": True}), 4)
  for x, y in zip(base, other):
    np.testing.assert_array_equal(_restored(x), _restored(y))
    for key in ("segment_ids", "input_mask", "next_sentence_labels"):
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    assert y["masked_lm_weights"].sum() > 2.5 * x["masked_lm_weights"].sum()
  # A new epoch brings new pairs (no dupe_factor copies).
  source = pretraining.PretrainingInput(_config(corpus_dir, uncased_vocab), batch_size=32)
  first = next(source)
  while source.get_state()["epoch"] == 0:
    next(source)
  source.set_state({**source.get_state(), "epoch": 1, "block": 0, "offset": 0, "index": 0})
  assert not np.array_equal(_restored(first), _restored(next(source)))


def test_eval_set_is_fixed_heldout_and_independent_of_training(corpus_dir, uncased_vocab,
                                                               reference):
  """Fails if the eval set changes with the training masking, its masked share is 0.02 or more
  off 0.15, two hosts' halves do not make the same batches, or an eval segment is found in
  training text or not in held-out text."""
  config = _config(corpus_dir, uncased_vocab)
  evals = pretraining.make_eval_batches(config, batch_size=16)
  assert len(evals) == 4
  other = pretraining.make_eval_batches(
      _config(corpus_dir, uncased_vocab, **{"masking.ratio": 0.6, "masking.strategy": "bernoulli"}),
      batch_size=16)
  for x, y in zip(evals, other):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
  masked = sum(b["masked_lm_weights"].sum() for b in evals)
  maskable = sum((b["input_mask"].sum(1) - 3).sum() for b in evals)
  assert abs(masked / maskable - 0.15) < 0.02
  # Split over two hosts: the same global batches, sliced.
  halves = [pretraining.make_eval_batches(config, batch_size=8, process_index=p, process_count=2)
            for p in range(2)]
  for k, batch in enumerate(evals):
    for key in batch:
      np.testing.assert_array_equal(
          batch[key], np.concatenate([halves[0][k][key], halves[1][k][key]]), err_msg=key)
  # Held-out text is never training text.
  heldout = _Locator(_documents(config, "eval"), reference)
  train = _Locator(_documents(config, "train"), reference)
  found = 0
  for batch in evals:
    for a, _, _ in _segments(batch):
      if len(a) >= 4:
        assert heldout.find(a) and not train.find(a)
        found += 1
  assert found > 30


def test_hosts_get_disjoint_documents_and_their_share_of_the_batch(corpus_dir, uncased_vocab):
  """Fails if either of two hosts has no documents, they share one, together they miss one of the
  whole run's, or a host's batch is not its half."""
  config = _config(corpus_dir, uncased_vocab)

  def doc_set(source):
    corpus = source.stream.corpus
    return {tuple(corpus.ids[corpus.sentence_starts[corpus.document_starts[d]]:
                             corpus.sentence_starts[corpus.document_starts[d + 1]]])
            for d in range(corpus.num_documents)}

  whole = doc_set(pretraining.PretrainingInput(config, batch_size=16))
  hosts = [pretraining.PretrainingInput(config, batch_size=8, process_index=p, process_count=2)
           for p in range(2)]
  parts = [doc_set(h) for h in hosts]
  assert parts[0] and parts[1] and not parts[0] & parts[1]
  assert parts[0] | parts[1] == whole
  assert next(hosts[1])["input_ids"].shape == (8, SEQ)


_RESUME_SCRIPT = """
import json, sys
import ml_collections, numpy as np
from data_pipeline.examples import pretraining
config = ml_collections.ConfigDict(json.loads(sys.argv[1]))
source = pretraining.PretrainingInput(config, batch_size=32)
source.set_state(json.loads(sys.argv[2]))
batches = [next(source) for _ in range(int(sys.argv[3]))]
np.savez(sys.argv[4], **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})
print(json.dumps(source.get_state()))
"""


@pytest.mark.slow  # a fresh Python process imports TensorFlow and rebuilds the pipeline
def test_exact_resume_in_a_fresh_process(corpus_dir, uncased_vocab, tmp_path):
  """Batches after set_state in a new process equal the uninterrupted run's; fails if any
  part of the position (epoch, block, offset, shuffle state) were not in get_state."""
  config = _config(corpus_dir, uncased_vocab)
  source = pretraining.PretrainingInput(config, batch_size=32)
  seen = [next(source) for _ in range(6)]
  state = source.get_state()
  later = [next(source) for _ in range(8)]
  assert source.get_state()["epoch"] >= 1  # the resumed part crosses an epoch boundary
  output = tmp_path / "resumed.npz"
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  run = subprocess.run(
      [sys.executable, "-c", _RESUME_SCRIPT, config.to_json(), json.dumps(state), "8",
       str(output)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  resumed = np.load(output)
  for i, batch in enumerate(later):
    for key, value in batch.items():
      np.testing.assert_array_equal(resumed[f"{i}/{key}"], value, err_msg=f"batch {i} {key}")
  assert json.loads(run.stdout.strip().splitlines()[-1]) == source.get_state()
  assert not np.array_equal(seen[-1]["input_ids"], later[0]["input_ids"])
  with pytest.raises(ValueError, match="fingerprint"):
    pretraining.PretrainingInput(_config(corpus_dir, uncased_vocab, seed=7),
                                 batch_size=32).set_state(state)


def test_bad_input_never_crashes_an_epoch(corpus_dir, uncased_vocab, tmp_path):
  """Fails if undecodable, overlong, empty, literal-special or control-character input stops two
  epochs, or a row lacks one [CLS] and two [SEP], or holds a [PAD] id inside its text."""
  for name in ("docs-0.txt", "docs-1.txt"):
    (tmp_path / name).write_bytes((corpus_dir / name).read_bytes())
  (tmp_path / "empty.txt").write_bytes(b"")
  (tmp_path / "junk.txt").write_bytes(
      b"\xff\xfe\x00 not utf8.\nSolo document.\n\n" + b"y" * (2 << 20) + b"\n\n\n"
      + b"[CLS] [SEP] [MASK].\n[PAD] [PAD].\n\n" + b"\x01\x02\x03.\n\x07.\n")
  # junk.txt's stray byte line is 1 of its 11 lines: over the default refusal threshold
  # (tested in test_refusals); here the pipeline must survive it, so the threshold is raised.
  config = _config(tmp_path, uncased_vocab, max_seq_length=32, shuffle_buffer=1000,
                   max_undecodable_fraction=0.2)
  source = pretraining.PretrainingInput(config, batch_size=16)
  while source.get_state()["epoch"] < 2:  # two whole epochs
    batch = next(source)
    ids = _restored(batch)
    assert ((ids == 101).sum(1) == 1).all() and ((ids == 102).sum(1) == 2).all()
    assert not (ids[batch["input_mask"] == 1] == 0).any()  # no literal [PAD] inside text


def test_clear_errors(corpus_dir, uncased_vocab, tmp_path):
  """Fails if a glob matching nothing, an unknown objective, an empty vocab_file, a too-small
  max_predictions_per_seq or a corpus of one-sentence documents is accepted, or refused without
  naming it."""
  with pytest.raises(ValueError, match=r"missing-\*\.txt"):
    pretraining.PretrainingInput(_config(tmp_path, uncased_vocab, corpus=str(tmp_path / "missing-*.txt")),
                                 batch_size=4)
  with pytest.raises(ValueError, match="objective"):
    pretraining.PretrainingInput(_config(corpus_dir, uncased_vocab, objective="mlm"), batch_size=4)
  with pytest.raises(ValueError, match="vocab_file"):
    pretraining.PretrainingInput(_config(corpus_dir, uncased_vocab, vocab_file=""), batch_size=4)
  with pytest.raises(ValueError, match="max_predictions_per_seq"):
    specs.max_predictions(_config(corpus_dir, uncased_vocab,
                                  **{"masking.max_predictions_per_seq": 5}))
  (tmp_path / "single.txt").write_text("Only one sentence.\n\nAnother lonely one.\n")
  with pytest.raises(ValueError, match=">= 2 sentences"):
    pretraining.PretrainingInput(_config(tmp_path, uncased_vocab, corpus=str(tmp_path / "single.txt"),
                                         heldout_modulus=1000), batch_size=4)


def test_preview_writes_the_batches_and_shows_the_masks(corpus_dir, uncased_vocab, tmp_path,
                                                        capsys):
  """Fails if the preview's saved batches differ from the pipeline's, or its printout lacks [MASK]
  followed by the original of each prediction of the first row."""
  from data_pipeline import preview  # pylint: disable=g-import-not-at-top
  config = _config(corpus_dir, uncased_vocab)
  output = tmp_path / "batches.npz"
  preview.write_preview(config, num_batches=2, batch_size=4, output=str(output), num_shown=2)
  saved = np.load(output)
  expected = _batches(config, 2, batch_size=4)
  for key in expected[0]:
    np.testing.assert_array_equal(saved[key], np.concatenate([b[key] for b in expected]))
  printed = capsys.readouterr().out
  vocab = uncased_vocab.read_text().split("\n")
  first = {key: saved[key][0] for key in saved.files}
  shown = [f"({vocab[i]})" for i, w in zip(first["masked_lm_ids"], first["masked_lm_weights"]) if w]
  assert "[MASK](" in printed and all(s in printed for s in shown)


def test_close_keeps_the_position(corpus_dir, uncased_vocab):
  """close() twice, then next(): the stream goes on where it was; fails if close dropped
  the position (the restart would repeat batches 1-2) or a second close raised."""
  config = _config(corpus_dir, uncased_vocab)
  reference = pretraining.PretrainingInput(config, batch_size=32)
  expected = [next(reference) for _ in range(4)]
  reference.close()
  source = pretraining.PretrainingInput(config, batch_size=32)
  got = [next(source) for _ in range(2)]
  source.close()
  source.close()  # idempotent
  got += [next(source) for _ in range(2)]  # restarts from the kept position
  for want, have in zip(expected, got):
    for key in want:
      np.testing.assert_array_equal(have[key], want[key], err_msg=key)


@pytest.mark.slow  # two fresh Python processes, each importing TensorFlow
def test_a_process_that_leaves_its_input_running_exits(corpus_dir, uncased_vocab):
  """A process that leaves its input running must still exit (the pipeline is drained
  at exit; dropping it mid-flight can deadlock on the GIL): a hang fails on the timeout,
  a crash at exit on the return code (two runs: two chances to hit a racy exit)."""
  config = _config(corpus_dir, uncased_vocab)
  script = ("import json, sys, ml_collections\n"
            "from data_pipeline.examples import pretraining\n"
            "source = pretraining.PretrainingInput(\n"
            "    ml_collections.ConfigDict(json.loads(sys.argv[1])), batch_size=32)\n"
            "for _ in range(3): next(source)\n")
  for _ in range(2):
    run = subprocess.run([sys.executable, "-c", script, config.to_json()], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]


# ---------------------------------------------------------------- masking-ratio schedules


def _schedule_config(corpus_dir, uncased_vocab, **overrides):
  """Linear 0.6 -> 0.1: every step of a short schedule masks a different amount."""
  return _config(corpus_dir, uncased_vocab, **{"masking.ratio": 0.6, "masking.schedule": "linear",
                                               "masking.final_ratio": 0.1, **overrides})


def _counts_at(spec, step, total, batch):
  """Python's round(ratio * maskable tokens), at least 1, per row ([CLS] A [SEP] B [SEP])."""
  maskable = batch["input_mask"].sum(1) - 3
  return np.array([max(1, round(spec.ratio_at(step, total) * int(n))) for n in maskable])


def test_schedule_masks_every_batch_at_its_steps_ratio(corpus_dir, uncased_vocab):
  """Fails if a scheduled batch's counts are not round(ratio at its step x maskable), a stream
  started at step 3 does not start there, the pairs or fingerprints differ from a constant run's,
  another seed keeps the fingerprint, or a schedule without total_steps is accepted."""
  config = _schedule_config(corpus_dir, uncased_vocab)
  spec = specs.masking_spec(config)
  assert specs.max_predictions(config) == 39  # ceil(0.6 * 64): the schedule's largest
  source = pretraining.PretrainingInput(config, batch_size=8, schedule_steps=5)
  batches, fingerprints = [], []
  for _ in range(7):
    batches.append(next(source))
    fingerprints.append(source.last_fingerprint)
  for step, batch in enumerate(batches):
    np.testing.assert_array_equal(batch["masked_lm_weights"].sum(1),
                                  _counts_at(spec, step, 5, batch), err_msg=f"step {step}")
  totals = [b["masked_lm_weights"].sum() for b in batches]
  assert totals[0] > totals[2] > totals[4] > totals[5] and totals[0] > 3 * totals[5]
  # A stream that starts mid-run (phase 2) starts mid-schedule.
  late = pretraining.PretrainingInput(config, batch_size=8, schedule_steps=5, first_step=3)
  first = next(late)
  np.testing.assert_array_equal(first["masked_lm_weights"].sum(1), _counts_at(spec, 3, 5, first))
  # What the batches hold apart from masks, and its fingerprint, is the constant run's.
  constant = pretraining.PretrainingInput(_config(corpus_dir, uncased_vocab), batch_size=8)
  for batch, fingerprint in zip(batches, fingerprints):
    other = next(constant)
    assert constant.last_fingerprint == fingerprint
    np.testing.assert_array_equal(_restored(batch), _restored(other))
  other_data = pretraining.PretrainingInput(_config(corpus_dir, uncased_vocab, seed=3),
                                            batch_size=8)
  next(other_data)
  assert other_data.last_fingerprint != fingerprints[0]
  with pytest.raises(ValueError, match="total_steps"):
    pretraining.PretrainingInput(config, batch_size=8)  # a schedule needs its length


_SCHEDULE_RESUME_SCRIPT = """
import json, sys
import ml_collections, numpy as np
from data_pipeline.examples import pretraining
config = ml_collections.ConfigDict(json.loads(sys.argv[1]))
source = pretraining.PretrainingInput(config, batch_size=16, schedule_steps=8)
source.set_state(json.loads(sys.argv[2]))
batches, fingerprints = [], []
for _ in range(int(sys.argv[3])):
  batches.append(next(source))
  fingerprints.append(source.last_fingerprint)
np.savez(sys.argv[4], **{f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()})
print(json.dumps([source.get_state(), fingerprints]))
"""


@pytest.mark.slow  # a fresh Python process imports TensorFlow and rebuilds the pipeline
def test_exact_resume_across_a_schedule_change_in_a_fresh_process(corpus_dir, uncased_vocab,
                                                                   tmp_path):
  """Resumed mid-schedule in a new process: the same batches, masks and fingerprints; fails
  if the resumed stream restarted the schedule at step 0 or lost the example count."""
  config = _schedule_config(corpus_dir, uncased_vocab)
  source = pretraining.PretrainingInput(config, batch_size=16, schedule_steps=8)
  for _ in range(3):
    next(source)
  state = source.get_state()
  assert state["example"] == 48
  later, fingerprints = [], []
  for _ in range(6):  # steps 3..8: the ratio falls at every one, then stays at the end
    later.append(next(source))
    fingerprints.append(source.last_fingerprint)
  output = tmp_path / "resumed.npz"
  run = subprocess.run(
      [sys.executable, "-c", _SCHEDULE_RESUME_SCRIPT, config.to_json(), json.dumps(state), "6",
       str(output)], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
      capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  resumed = np.load(output)
  for i, batch in enumerate(later):
    for key, value in batch.items():
      np.testing.assert_array_equal(resumed[f"{i}/{key}"], value, err_msg=f"batch {i} {key}")
  end_state, resumed_fingerprints = json.loads(run.stdout.strip().splitlines()[-1])
  assert end_state == source.get_state() and resumed_fingerprints == fingerprints
  counts = [b["masked_lm_weights"].sum() for b in later]
  assert len(set(counts)) >= 4, counts  # the resumed part really spans a schedule change
  # Without the example count a scheduled stream cannot know its step: refused.
  del state["example"]
  with pytest.raises(ValueError, match="malformed pipeline state"):
    pretraining.PretrainingInput(config, batch_size=16, schedule_steps=8).set_state(state)


def test_heldout_masks_do_not_depend_on_the_schedule(corpus_dir, uncased_vocab):
  """Fails if the held-out batches change with the training schedule, eval_own does not mask the
  same pairs at the schedule's end ratio, or under constant masking differs from the held-out
  set."""
  constant = _config(corpus_dir, uncased_vocab)
  scheduled = _schedule_config(corpus_dir, uncased_vocab)
  heldout = pretraining.make_eval_batches(constant, batch_size=16)
  for x, y in zip(heldout, pretraining.make_eval_batches(scheduled, batch_size=16)):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
  # eval_own: the same pairs, masked like the run ends its training (0.1 here).
  own = pretraining.make_eval_batches(scheduled, batch_size=16, own_masking=True)
  spec = specs.masking_spec(scheduled)
  for x, y in zip(heldout, own):
    np.testing.assert_array_equal(_restored(x), _restored(y))
    np.testing.assert_array_equal(y["masked_lm_weights"].sum(1), _counts_at(spec, 8, 8, y))
  # A run masking like BERT evaluates eval_own on exactly the held-out set.
  for x, y in zip(heldout, pretraining.make_eval_batches(constant, batch_size=16,
                                                         own_masking=True)):
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
