"""Packed documents attend only to themselves: each document's outputs inside a packed row
equal the same document run alone, for post-LN BERT and the modern encoder (global and
sliding layers), through einsum and xla; splash (in Pallas's interpreter, at the attention
itself: the model refuses a TPU kernel on a CPU) keeps documents apart as einsum does,
in global and sliding layers; cudnn is refused for packed rows in one line; a classifier
on packed examples, whose last layer computes only their [CLS] rows, gives each example's
logits as if it ran alone.

Alone: the document in a row of its own, positions from 0, padding after it. Packed: three
documents one after the other in one row, positions restarting at each, their document
ids, padding at the tail.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import heads
from bert_jax.model.config import BertConfig

ATOL = 1e-5
DOCS = (23, 40, 31)  # lengths, [CLS] and [SEP] included


def _configs():
  return {
      "bert": BertConfig(vocab_size=97, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=128, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0),
      # Windows of 8 tokens: far shorter than the documents, so the sliding layers slide.
      "modernbert": BertConfig.from_size("modernbert-tiny", vocab_size=97, hidden_size=64,
                                         num_attention_heads=4, intermediate_size=96,
                                         local_attention=8, rope_theta=1000.0,
                                         local_rope_theta=100.0),
  }


def _rows(seq_len: int):
  """(packed row: ids, mask, positions, documents) and each document alone as a row."""
  rng = np.random.default_rng(0)
  docs = [rng.integers(5, 97, size=n).astype(np.int32) for n in DOCS]
  ids = np.zeros([1, seq_len], np.int32)
  positions = np.zeros([1, seq_len], np.int32)
  documents = np.zeros([1, seq_len], np.int32)
  alone, start = [], 0
  for d, doc in enumerate(docs):
    ids[0, start:start + len(doc)] = doc
    positions[0, start:start + len(doc)] = np.arange(len(doc))
    documents[0, start:start + len(doc)] = d + 1
    row = np.zeros([1, seq_len], np.int32)
    row[0, :len(doc)] = doc
    alone.append((start, row))
    start += len(doc)
  return (ids, (ids > 0).astype(np.int32), positions, documents), alone


@pytest.mark.parametrize("impl", ["einsum", "xla"])
@pytest.mark.parametrize("architecture", ["bert", "modernbert"])
def test_each_packed_document_equals_the_document_alone(architecture, impl):
  """Fails if any token of a document packed with others differs from the same document
  run alone by more than 1e-5 (a key of another document or of the padding attended, a
  position not restarted, a window measured across documents), or if the packed row's
  outputs equal the unmasked row's (the documents would not be kept apart at all)."""
  seq_len = 96
  config = _configs()[architecture].replace(attention_impl=impl)
  model = heads.encoder_for(config)
  (ids, mask, positions, documents), alone = _rows(seq_len)
  params = model.init(jax.random.key(1), ids, mask, ids * 0)["params"]
  # Random norms and biases too, so that no parameter is a no-op.
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(p.size), p.shape),
                        params)
  apply = jax.jit(lambda i, m, p=None, d=None: model.apply(
      {"params": params}, i, m, i * 0, positions=p, documents=d)[0])
  packed = np.asarray(apply(ids, mask, positions, documents))
  for (start, row), length in zip(alone, DOCS):
    single = np.asarray(apply(row, (row > 0).astype(np.int32)))
    np.testing.assert_allclose(packed[0, start:start + length], single[0, :length], atol=ATOL)
  unpacked = np.asarray(apply(ids, mask))
  assert np.abs(unpacked[0, DOCS[0]:sum(DOCS)] - packed[0, DOCS[0]:sum(DOCS)]).max() > 1e-2


@pytest.mark.parametrize("window", [None, 8])
def test_splash_keeps_documents_apart_as_einsum_does(window):
  """Fails if splash's segment ids (documents, padding) or its local mask give attention
  other than einsum's dense mask on a packed row of 128 tokens (three documents, a padded
  tail), within 1e-5."""
  from bert_jax.model import attention  # pylint: disable=g-import-not-at-top
  (ids, mask, _, documents), _ = _rows(128)
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 128, 2, 16)) for i in range(3))
  real, documents = jnp.asarray(mask > 0), jnp.asarray(documents)
  ours = attention.attend_masked("splash", q, k, v, real, window=window, documents=documents)
  dense = attention.attend_masked("einsum", q, k, v, real, window=window, documents=documents)
  rows = np.asarray(mask[0] > 0)  # padding queries: no defined output
  np.testing.assert_allclose(np.asarray(ours)[0, rows], np.asarray(dense)[0, rows], atol=ATOL)


def test_cudnn_refuses_packed_rows_in_one_line():
  """Fails if cuDNN attention, which jax binds without segment ids, accepts packed rows (it
  would let documents attend across), or refuses them without naming the fix."""
  from bert_jax.model import attention  # pylint: disable=g-import-not-at-top
  q = jnp.zeros((1, 8, 2, 16), jnp.bfloat16)
  with pytest.raises(ValueError, match="cannot keep packed documents apart.*'xla' or 'auto'"):
    attention.attend_masked("cudnn", q, q, q, jnp.ones((1, 8), bool),
                            documents=jnp.ones((1, 8), jnp.int32))


@pytest.mark.parametrize("packed", [False, True])
def test_blocked_local_attention_is_the_dense_sliding_window(packed):
  """Fails if the blocked sliding-window attention (xla's path for rows longer than three
  windows: O(T x window) work) differs from the dense band mask by more than 1e-5 on real
  queries, with padding, a length that is no multiple of the window, and (packed) documents."""
  from bert_jax.model import attention  # pylint: disable=g-import-not-at-top
  (ids, mask, _, documents), _ = _rows(101)
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 101, 2, 16)) for i in range(3))
  real = jnp.asarray(mask > 0)
  docs = jnp.asarray(documents) if packed else None
  blocked = attention.blocked_local_attention(q, k, v, real, 8, docs)
  dense = attention.attend_masked("einsum", q, k, v, real, window=8, documents=docs)
  rows = np.asarray(mask[0] > 0)
  np.testing.assert_allclose(np.asarray(blocked)[0, rows], np.asarray(dense)[0, rows],
                             atol=ATOL)
  via_xla = attention.attend_masked("xla", q, k, v, real, window=8, documents=docs)
  np.testing.assert_allclose(np.asarray(via_xla)[0, rows], np.asarray(dense)[0, rows],
                             atol=ATOL)


@pytest.mark.parametrize("variant", ["post_ln", "pre_ln", "scanned"])
def test_packed_classifier_reads_each_example_as_alone(variant):
  """A classifier on packed examples computes only their [CLS] rows in the last layer
  (encoder.BertEncoder's `queries`): fails if any example's logits differ from the same
  example run alone beyond 1e-5, or if the last layer's [CLS] saw another document."""
  from bert_jax.finetune.features import packed as packed_lib  # the fine-tuning packer
  config = _configs()["bert"].replace(
      pre_layer_norm=variant == "pre_ln", scan_layers=variant == "scanned")
  model = heads.BertForSequenceClassification(config, num_labels=3)
  rng = np.random.default_rng(0)
  seq_len, lengths = 48, (30, 7, 18, 41, 12)
  features = {k: np.zeros((len(lengths), seq_len), np.int32)
              for k in ("input_ids", "input_mask", "segment_ids")}
  for i, n in enumerate(lengths):
    features["input_ids"][i, :n] = rng.integers(5, 97, size=n)
    features["input_mask"][i, :n] = 1
  batch = packed_lib.pack(features, (), np.arange(len(lengths)), seq_len)
  assert len(batch["input_ids"]) < len(lengths)  # some rows hold several examples
  params = model.init(jax.random.key(1), *(features[k] for k in
                                           ("input_ids", "input_mask", "segment_ids")))["params"]
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.key(p.size), p.shape),
                        params)
  alone = np.asarray(model.apply({"params": params}, features["input_ids"],
                                 features["input_mask"], features["segment_ids"]))
  packed = np.asarray(model.apply(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      positions=batch["position_ids"], documents=batch["document_ids"],
      pack_index=batch["pack_index"]))
  np.testing.assert_allclose(packed, alone, atol=ATOL)
