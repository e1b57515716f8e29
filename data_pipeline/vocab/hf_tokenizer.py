"""A whole tokenizer in the `tokenizers` library's format (tokenizer.json), as ModernBERT ships
its byte-level BPE, with the in-graph tokenizers' interface (data_pipeline/vocab/tokenizers.py).

The tokenizer runs in Hugging Face's `tokenizers` (Rust), never a BPE written here: its
own normalizer, pre-tokenizer and model decide every id, so the ids are what
transformers' AutoTokenizer gives for the same checkpoint (tests/test_hf_tokenizer.py,
on real text). It is the optional `bpe` extra, imported only for a tokenizer.json.
Inside tf.data the batch goes through tf.py_function (a store tokenizes each corpus
once, offline; training reads ids).

The pipeline names specials by role; the tokenizer must hold BERT's spellings as added
tokens ([PAD], [UNK], [CLS], [SEP], [MASK]: ModernBERT's do). Casing is the tokenizer's:
a lowercasing request (do_lower_case) is logged as not applying. No special tokens are added by
`tokenize`; the pipeline and the feature builders pack [CLS] A [SEP] B [SEP] themselves.
"""

import logging
from typing import Iterable

import numpy as np

from data_pipeline.vocab.specials import SPECIAL_TOKENS
from host import paths
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

FILE_NAME = "tokenizer.json"
EXTRA = "bpe"  # the setup.cfg extra that installs `tokenizers`


def is_tokenizer_file(path) -> bool:
  """Whether `path` names a tokenizer.json (the file this module reads)."""
  return str(path).endswith(FILE_NAME)


def _library():
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top  # the optional extra
  except ImportError:
    raise ValueError(f"a tokenizer.json needs the 'tokenizers' package: pip install "
                     f"'bert_jax[{EXTRA}]'") from None
  return tokenizers


class JsonTokenizer:
  """tokenizer.json as a pipeline tokenizer: tokenize(strings) -> ragged ids, vocab,
  special_ids, vocab_size, ids_to_tokens; `encode(texts)` for plain Python callers."""

  def __init__(self, path: str, do_lower_case: bool = False):
    """Loads `path`; ValueError (one line) for a missing or unreadable file, or a tokenizer
    without BERT's five special tokens. `do_lower_case` does not apply: the tokenizer's
    own normalizer decides the case (ModernBERT's is cased); asked for, it is said and
    ignored."""
    self.vocab_file = str(path)
    if do_lower_case:
      logging.warning("%s normalizes text itself (its own normalizer decides the case): "
                      "do_lower_case=True does not apply and is ignored", self.vocab_file)
    self.do_lower_case = False
    if not paths.exists(self.vocab_file):
      raise ValueError(f"tokenizer file {self.vocab_file!r} does not exist")
    try:
      self._tokenizer = _library().Tokenizer.from_str(paths.read_text(self.vocab_file))
    except Exception as e:  # the Rust side raises a bare Exception on a malformed file
      raise ValueError(f"{self.vocab_file} is not a tokenizers tokenizer.json: {e}") from None
    by_id = {i: t for t, i in self._tokenizer.get_vocab(with_added_tokens=True).items()}
    # Ids a BPE leaves unused still occupy rows of the model's table: named, never produced.
    self.vocab = [by_id.get(i, f"[unused_id_{i}]") for i in range(max(by_id) + 1 if by_id else 0)]
    ids = {role: self._tokenizer.token_to_id(token)
           for role, token in SPECIAL_TOKENS.items()}
    missing = [SPECIAL_TOKENS[r] for r, i in ids.items() if i is None]
    if missing:
      raise ValueError(f"tokenizer {self.vocab_file} lacks the special token(s) "
                       f"{', '.join(missing)}")
    self.special_ids = ids

  @property
  def vocab_size(self) -> int:
    """Rows the model's word table needs: the largest id plus one."""
    return len(self.vocab)

  def encode(self, texts: Iterable[str], add_special_tokens: bool = False) -> list[list[int]]:
    """Each text's ids (with the tokenizer's own post-processor when add_special_tokens)."""
    return [e.ids for e in self._tokenizer.encode_batch(
        list(texts), add_special_tokens=add_special_tokens)]

  def _encode_batch(self, strings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    texts = [s.decode("utf-8", errors="replace") for s in strings]
    rows = self.encode(texts)
    lengths = np.array([len(r) for r in rows], np.int64)
    flat = np.fromiter((i for r in rows for i in r), np.int32, count=int(lengths.sum()))
    return flat, lengths

  def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
    """Rank-1 tf.string -> tf.RaggedTensor[int32] ids, no specials added."""
    strings = tf.convert_to_tensor(strings, tf.string)
    flat, lengths = tf.numpy_function(self._encode_batch, [strings], (tf.int32, tf.int64),
                                      stateful=False)
    flat.set_shape([None])
    lengths.set_shape([None])
    return tf.RaggedTensor.from_row_lengths(flat, lengths)

  def ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    """Token strings for ids (numpy / list / eager tensor), for previews."""
    return [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]

  def word_starts(self) -> np.ndarray:
    """Per id: whether a piece opens a word (a byte-level BPE marks a leading space "Ġ",
    a Metaspace one "▁"; the specials are words of their own)."""
    specials = set(self.special_ids.values())
    return np.array([t.startswith(("\u0120", "\u2581")) or i in specials
                     for i, t in enumerate(self.vocab)])
