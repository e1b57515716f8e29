"""Packing word pieces into BERT's input rows: `[CLS] A [SEP] (B [SEP])` and its segment ids.

One definition of the layout and of google-research/bert's truncation rule,
used by every fine-tuning featuriser (classification_features here, SQuAD's
`[CLS] question [SEP] context [SEP]` windows, token classification's
`[CLS] pieces [SEP]` rows) and by bert_jax/extract_features.py. Functions
work on piece strings or ids alike.

(Pretraining packs pairs differently and keeps its own rule:
data_pipeline/examples/pairs.py trims the longer side from the front or the back at
random, as google-research's create_pretraining_data does, on numpy arrays.)

Featurisation takes a `tokenize_word(str) -> list[str]` callable and a vocab
mapping, so it does not depend on TensorFlow.
"""

from typing import Callable, Mapping, Sequence, TypeVar

import numpy as np

from bert_jax.finetune.readers import records

T = TypeVar("T")
CLS, SEP = "[CLS]", "[SEP]"


def tokenize_text(text: str, tokenize_word: Callable[[str], list[str]]) -> list[str]:
  """Wordpieces of a text: whitespace words, each through `tokenize_word`; a tokenizer that
  reads whole texts (a tokenizer.json: its `text` method) reads it whole, as its checkpoint's
  tokenizer does."""
  whole = getattr(tokenize_word, "text", None)
  if whole is not None:
    return whole(text)
  return [piece for word in text.split() for piece in tokenize_word(word)]


def truncate_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
  """Trims the pair in place to max_length tokens in all, one token at a time
  from the longer one (from b on a tie), as google-research/bert does: this
  keeps more of a short sentence than cutting both proportionally."""
  while len(tokens_a) + len(tokens_b) > max_length:
    (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def pack(a: Sequence[T], b: Sequence[T] | None, *, cls: T = CLS, sep: T = SEP,
         max_length: int | None = None, pair_separators: int = 1) -> tuple[list[T], list[int]]:
  """(tokens, segment ids) of `[CLS] a [SEP]`, or `[CLS] a [SEP] b [SEP]` with b in segment 1.

  With `max_length`, a single sequence is cut at the end and a pair by
  truncate_pair so that the row, specials included, fits; `a` and `b`
  themselves are not modified. pair_separators=2 writes RoBERTa's pair,
  `<s> a </s></s> b </s>` (the second separator counts with segment 0).
  """
  a = list(a)
  if b is None:
    if max_length is not None:
      del a[max_length - 2:]
    tokens = [cls] + a + [sep]
    return tokens, [0] * len(tokens)
  b = list(b)
  if max_length is not None:
    truncate_pair(a, b, max_length - 2 - pair_separators)
  return ([cls] + a + [sep] * pair_separators + b + [sep],
          [0] * (len(a) + 1 + pair_separators) + [1] * (len(b) + 1))


def classification_features(examples: Sequence[records.Example], *,
                            tokenize_word: Callable[[str], list[str]],
                            vocab: Mapping[str, int], max_seq_length: int,
                            labels: Sequence[str] | None,
                            pair_separators: int = 1) -> dict[str, np.ndarray]:
  """`[CLS] a [SEP] (b [SEP])` features as int32 arrays, padded to max_seq_length.

  pair_separators: [SEP]s between a and b (the tokenizer's; RoBERTa's pairs have 2).

  Returns input_ids, input_mask, segment_ids [N, T] and label_ids [N] (int32;
  float32 for regression, i.e. labels=None; -1 / nan for unlabelled examples).
  """
  n = len(examples)
  input_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  label_ids = np.zeros((n,), np.float32 if labels is None else np.int32)
  label_index = None if labels is None else {l: i for i, l in enumerate(labels)}
  for i, ex in enumerate(examples):
    a = tokenize_text(ex.text_a, tokenize_word)
    b = tokenize_text(ex.text_b, tokenize_word) if ex.text_b is not None else None
    tokens, segments = pack(a, b, max_length=max_seq_length, pair_separators=pair_separators)
    try:
      ids = [vocab[t] for t in tokens]
    except KeyError as e:
      raise ValueError(f"{ex.guid}: token {e.args[0]!r} is not in the vocabulary") from None
    input_ids[i, :len(ids)] = ids
    input_mask[i, :len(ids)] = 1
    segment_ids[i, :len(ids)] = segments
    if ex.label is None:
      label_ids[i] = -1 if labels is not None else np.nan
    elif label_index is None:
      label_ids[i] = float(ex.label)
    else:
      if ex.label not in label_index:
        raise ValueError(f"{ex.guid}: label {ex.label!r} is not one of {list(labels)}")
      label_ids[i] = label_index[ex.label]
  return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
          "label_ids": label_ids}
