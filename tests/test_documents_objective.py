"""Objective "documents" (data_pipeline/examples/documents.py): whole documents packed by best
fit, each attending only to itself.

The packer on hand-made documents (best fit, the window, long documents cut, order), and
the pipeline on the synthetic corpus of tests/test_pretraining.py: every document's tokens
arrive whole and in order with their own [CLS]/[SEP], positions restart, document ids
separate them, padding only at a row's tail, masks never on specials, the same rows at
any masking ratio, and an exact resume in a fresh process.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_pipeline.examples import documents
from data_pipeline.examples import pretraining
from data_pipeline.store.tokenized_corpus import TokenizedCorpus  # pylint: disable=g-importing-member
import test_pretraining as base  # the synthetic corpus and its helpers
from test_pretraining import corpus_dir  # noqa: F401  (the fixture, by name)


def _corpus(lengths):
  """A TokenizedCorpus of one-sentence documents of the given lengths; document d's tokens
  are 1000 d + 1, 1000 d + 2, ..."""
  ids = np.concatenate([1000 * d + 1 + np.arange(n) for d, n in enumerate(lengths)]).astype(np.int32)
  sentence_starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
  document_starts = np.arange(len(lengths) + 1, dtype=np.int64)
  return TokenizedCorpus(ids=ids, sentence_starts=sentence_starts,
                         document_starts=document_starts)


def test_best_fit_over_a_bounded_window():
  """Fails if a piece does not go to the open row it leaves least room in (the oldest on a
  tie), a new row is not opened when none has room, the oldest row is not closed when the
  window is full, a full row stays open, or a document longer than a row is not cut into
  pieces of max_seq_length - 2 tokens."""
  # Costs (length + 2): 10, 8, 5, 4, 3, 7 into rows of 16, a window of 2.
  rows = documents.packed_rows(_corpus([8, 6, 3, 2, 1, 5]), range(6), max_seq_length=16,
                               window=2)
  firsts = [[int(p[0]) // 1000 for p in r.pieces] for r in rows]
  # doc0 -> row A (10); doc1 needs 8: opens B; doc2 (5) fits A (6 left) and B (8 left):
  # A, least room; A is then 15 used, closed (1 left); doc3 (4) -> B; doc4 (3) -> B
  # (15 used, closed); doc5 (7) opens C.
  assert firsts == [[0, 2], [1, 3, 4], [5]]
  assert [r.used for r in rows] == [15, 15, 7]
  # The window: with one open row, a piece that does not fit closes it.
  assert [[int(p[0]) // 1000 for p in r.pieces]
          for r in documents.packed_rows(_corpus([8, 6, 3]), range(3), max_seq_length=16,
                                         window=1)] == [[0], [1, 2]]
  # A long document: pieces of 14 tokens, in order, each a document of its own.
  long = documents.packed_rows(_corpus([30]), [0], max_seq_length=16, window=4)
  pieces = [p for r in long for p in r.pieces]
  assert [len(p) for p in pieces] == [14, 14, 2]
  np.testing.assert_array_equal(np.concatenate(pieces), 1 + np.arange(30))


def test_assembled_rows_restart_positions_and_number_documents():
  """Fails if a document does not open with [CLS] and end with [SEP], its positions do not
  restart at 0, its document id is not its number in the row, or padding is anywhere but
  the tail (document id 0)."""
  rows = documents.packed_rows(_corpus([8, 6, 3]), range(3), max_seq_length=32, window=4)
  arrays = documents.assemble(rows, max_seq_length=32, cls_id=101, sep_id=102, pad_id=0)
  ids, docs, positions = (arrays[k][0] for k in ("input_ids", documents.DOCUMENT_IDS,
                                                  documents.POSITION_IDS))
  assert len(rows) == 1 and rows[0].used == 23
  np.testing.assert_array_equal(docs, [1] * 10 + [2] * 8 + [3] * 5 + [0] * 9)
  np.testing.assert_array_equal(positions[:23], list(range(10)) + list(range(8)) + list(range(5)))
  assert [ids[i] for i in (0, 9, 10, 17, 18, 22)] == [101, 102, 101, 102, 101, 102]
  assert not ids[23:].any() and not arrays["segment_ids"].any()


def _config(corpus_dir, uncased_vocab, **overrides):  # noqa: F811
  return base._config(corpus_dir, uncased_vocab, objective="documents", **overrides)  # pylint: disable=protected-access


def test_filled_rows_are_full_and_hold_every_token_once():
  """Fails if a filled row (but the last) has room left, a token is lost or repeated, a
  piece that fits does not go by best fit, the window's oldest row is not topped off with
  a piece's head, or the block's end leaves more than one row open."""
  corpus = _corpus([8, 6, 3, 2, 1, 5, 30])
  order = np.arange(7)
  pieces = documents.block_pieces(corpus, order, (0, 10**9), cls_id=-1, sep_id=-2)
  # Costs 10, 8, 5, 4, 3, 7, 32 = 69 tokens into rows of 16: four full rows and 5 left.
  rows = documents.filled_rows(pieces, max_seq_length=16, window=2)
  assert [r.used for r in rows] == [16, 16, 16, 16, 5]
  tokens = np.concatenate([p for r in rows for p in r.pieces])
  np.testing.assert_array_equal(np.sort(tokens), np.sort(np.concatenate(pieces)))
  # doc0 (10) opens A; doc1 (8) opens B; doc2 (5) fits both, A leaves least room (15);
  # doc3 (4) and doc4 (3) fit only B (15); doc5 (7) fits nowhere and the window is full,
  # so A, the oldest, takes its head (1 token) and closes; the rest opens C.
  first = rows[0]
  assert [len(p) for p in first.pieces] == [10, 5, 1]
  assert int(first.pieces[2][0]) == -1  # the head of doc5: its [CLS]
  assert [len(p) for p in rows[1].pieces] == [8, 4, 3, 1]
  # A short run, one window: each row is filled in turn, pieces cut at the row's end.
  one = documents.filled_rows(pieces, max_seq_length=16, window=1)
  assert [r.used for r in one] == [16, 16, 16, 16, 5]
  np.testing.assert_array_equal(np.concatenate([p for r in one for p in r.pieces]),
                                np.concatenate(pieces))


def test_block_spans_cut_the_stream_exactly():
  """Fails if consecutive spans of the epoch's token stream lose, repeat or reorder a
  token, or a document's [CLS] / [SEP] are not where its stream puts them."""
  corpus = _corpus([8, 6, 3, 2, 1, 5, 30])
  order = np.array([3, 6, 0, 5, 1, 4, 2])
  stream = np.concatenate([np.concatenate([[-1], corpus.ids[corpus.sentence_starts[d]:
                                                        corpus.sentence_starts[d + 1]], [-2]])
                           for d in order])
  for width in (7, 16, 33):
    cut = [documents.block_pieces(corpus, order, (lo, lo + width), cls_id=-1, sep_id=-2)
           for lo in range(0, len(stream), width)]
    np.testing.assert_array_equal(np.concatenate([p for block in cut for p in block]), stream)
    assert all(sum(map(len, block)) == width for block in cut[:-1])


def test_an_epoch_of_filled_rows(corpus_dir, uncased_vocab):  # noqa: F811
  """On the test corpus, the pipeline's stream: fails if a row but the epoch's last has
  padding (or that row is not last after the block's shuffle), a piece is not a
  contiguous run of some document's [CLS] doc [SEP], the pieces' tokens do not add up to
  the documents', or a piece's positions and number do not restart."""
  config = _config(corpus_dir, uncased_vocab)
  assert config.pack_fill
  from data_pipeline.store import tokenized_corpus  # pylint: disable=g-import-not-at-top
  tokenizer = tokenized_corpus.load_tokenizer(config)
  corpus = tokenized_corpus.read_tokenized_corpus(config, tokenizer, split="train",
                                                  process_index=0, process_count=1)
  stream = pretraining.ExampleStream(
      corpus, objective="documents", max_seq_length=base.SEQ, short_seq_prob=0.0, seed=0,
      shuffle_buffer=4, special_ids=tokenizer.special_ids, pack_window=8, pack_fill=True)
  assert stream.num_blocks() > 3
  covered = {}
  padded = []
  for block in range(stream.num_blocks()):
    arrays = documents.assemble(stream.block_instances(0, block), max_seq_length=base.SEQ,
                                cls_id=101, sep_id=102, pad_id=0, wrapped=False)
    ids, docs = arrays["input_ids"], arrays[documents.DOCUMENT_IDS]
    padded += [(block, row) for row in np.nonzero((docs == 0).any(axis=1))[0]]
    for row in range(len(ids)):
      for number in range(1, docs[row].max() + 1):
        at = np.nonzero(docs[row] == number)[0]
        assert at[-1] - at[0] == len(at) - 1
        np.testing.assert_array_equal(arrays[documents.POSITION_IDS][row, at],
                                      np.arange(len(at)))
        covered.setdefault(len(at), []).append(ids[row, at])
  assert padded == [(stream.num_blocks() - 1, len(ids) - 1)]  # the epoch's last row only
  whole = [np.concatenate([[101], corpus.ids[corpus.sentence_starts[corpus.document_starts[d]]:
                                             corpus.sentence_starts[corpus.document_starts[d + 1]]],
                           [102]]) for d in range(corpus.num_documents)]
  pieces = [p for group in covered.values() for p in group]
  assert sum(map(len, pieces)) == sum(map(len, whole))
  # Each piece is a run of some document's [CLS] doc [SEP] (its bytes, found there).
  joined = b"|".join(w.tobytes() for w in whole)
  assert all(p.astype(whole[0].dtype).tobytes() in joined for p in pieces)


def test_every_document_arrives_whole_and_in_order(corpus_dir, uncased_vocab):  # noqa: F811
  """Unfilled packing (data.pack_fill=False, as workdirs recorded before the field ran):
  fails if a packed document's tokens (between its [CLS] and [SEP]) are not one whole
  training document, or a short document is cut, its positions do not restart, its id is
  not its number in the row, a masked position falls on a special token or padding, a row
  has padding before its last document, or the rows are under 90% full."""
  config = _config(corpus_dir, uncased_vocab, pack_fill=False)
  from data_pipeline.store import tokenized_corpus  # pylint: disable=g-import-not-at-top
  tokenizer = tokenized_corpus.load_tokenizer(config)
  corpus = tokenized_corpus.read_tokenized_corpus(config, tokenizer, split="train",
                                                  process_index=0, process_count=1)
  whole = {}
  for d in range(corpus.num_documents):
    first, last = corpus.document_starts[d], corpus.document_starts[d + 1]
    whole[d] = corpus.ids[corpus.sentence_starts[first]:corpus.sentence_starts[last]].tolist()
  starts = {tuple(t[:3]): d for d, t in whole.items()}
  batches = base._batches(config, 3)  # pylint: disable=protected-access
  seen = 0
  for batch in batches:
    ids = base._restored(batch)  # pylint: disable=protected-access
    docs, positions = batch[documents.DOCUMENT_IDS], batch[documents.POSITION_IDS]
    for row in range(len(ids)):
      real = batch["input_mask"][row].sum()
      assert batch["input_mask"][row, :real].all() and not docs[row, real:].any()
      for number in range(1, docs[row].max() + 1):
        at = np.nonzero(docs[row] == number)[0]
        tokens = ids[row, at]
        assert tokens[0] == 101 and tokens[-1] == 102
        np.testing.assert_array_equal(positions[row, at], np.arange(len(at)))
        body = tokens[1:-1].tolist()
        d = starts.get(tuple(body[:3]))  # None: a later piece of a long document
        if d is not None and len(whole[d]) <= base.SEQ - 2:
          assert body == whole[d]
          seen += 1
      masked = batch["masked_lm_positions"][row][batch["masked_lm_weights"][row] > 0]
      assert np.isin(ids[row, masked], [0, 101, 102], invert=True).all()
  assert seen > 50
  fill = np.mean([b["input_mask"].mean() for b in batches])
  assert fill > 0.9, fill


def test_the_same_rows_at_any_masking_ratio(corpus_dir, uncased_vocab):  # noqa: F811
  """Fails if another masking ratio changes the packed rows (ids, documents, positions)
  rather than only the masks."""
  low = base._batches(_config(corpus_dir, uncased_vocab), 2)  # pylint: disable=protected-access
  high = base._batches(_config(corpus_dir, uncased_vocab, **{"masking.ratio": 0.4}), 2)  # pylint: disable=protected-access
  for x, y in zip(low, high):
    np.testing.assert_array_equal(base._restored(x), base._restored(y))  # pylint: disable=protected-access
    for key in (documents.DOCUMENT_IDS, documents.POSITION_IDS, "input_mask"):
      np.testing.assert_array_equal(x[key], y[key], err_msg=key)
    assert y["masked_lm_weights"].sum() > 2 * x["masked_lm_weights"].sum()


@pytest.mark.slow  # a fresh Python process imports TensorFlow and rebuilds the pipeline
def test_exact_resume_in_a_fresh_process(corpus_dir, uncased_vocab, tmp_path):  # noqa: F811
  """Packed batches after set_state in a new process equal the uninterrupted run's (ids,
  masks, document and position ids); fails if the packer's rows depended on anything but
  the block and the offset in it."""
  config = _config(corpus_dir, uncased_vocab)
  source = pretraining.PretrainingInput(config, batch_size=16)
  for _ in range(5):
    next(source)
  state = source.get_state()
  later = [next(source) for _ in range(6)]
  output = tmp_path / "resumed.npz"
  env = {**os.environ, "PYTHONPATH": str(base.REPO)}
  run = subprocess.run(
      [sys.executable, "-c", base._RESUME_SCRIPT.replace("batch_size=32", "batch_size=16"),  # pylint: disable=protected-access
       config.to_json(), json.dumps(state), "6", str(output)],
      env=env, cwd=base.REPO, capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  resumed = np.load(output)
  for i, batch in enumerate(later):
    assert documents.DOCUMENT_IDS in batch
    for key, value in batch.items():
      np.testing.assert_array_equal(resumed[f"{i}/{key}"], value, err_msg=f"batch {i} {key}")


def test_a_record_from_before_filling_resumes_only_unfilled(tmp_path):
  """A documents workdir recorded before data.pack_fill packed with room left: resuming it
  filled would change its rows, so its record compares as if it said False; for the other
  objectives the field changes nothing. Fails if the missing field is waved through for
  documents, or refused for nsp."""
  from bert_jax.run import workdir  # pylint: disable=g-import-not-at-top

  def resume(objective, fill):
    old = {"config": {"data.objective": objective}}  # as the code before the field wrote it
    new = {"config": {"data.objective": objective, "data.pack_fill": fill},
           "bert_config": {}, "data": {}}
    return workdir.differences(old, new, quiet=True)

  assert resume("documents", True) == [("config.data.pack_fill", False, True)]
  assert resume("documents", False) == []
  assert resume("nsp", True) == []
  done = tmp_path / "checkpoints" / "1"  # work the record speaks for (a committed step)
  done.mkdir(parents=True)
  (done / "_CHECKPOINT_METADATA").write_text("{}")
  with pytest.raises(workdir.WorkdirError,
                     match=r"to resume it as it ran, --config.data.pack_fill=False; "):
    workdir.check_record(str(tmp_path), {"config": {"data.objective": "documents"}},
                         {"config": {"data.objective": "documents", "data.pack_fill": True},
                          "bert_config": {}, "data": {}, "code_version": "x"}, quiet=True)
