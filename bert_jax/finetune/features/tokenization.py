"""Word -> wordpiece strings over the project's own tokenizers, for the feature builders.

The fine-tuning feature builders (packing.classification_features,
squad.convert_examples_to_features, token_features.token_classification_features) take a
`tokenize_word` callable (pieces of ONE whitespace-delimited word) and a
`vocab` mapping. WordTokenizer provides both from a data_pipeline tokenizer
(WordPiece or SentencePiece), so fine-tuning needs no `transformers`; a RoBERTa
vocab.json (byte-level BPE) gets bert_jax/finetune/features/bpe.py's tokenizer instead,
with the same interface. `pair_separators` says how many [SEP] a sentence pair has
between its texts (BERT 1, RoBERTa 2).

Every call into the TensorFlow tokenizer costs a fixed overhead (milliseconds),
so pieces are memoised per word, and `prime` tokenizes all distinct words of a
dataset in a few batched calls before the feature builders ask for them one by
one.
"""

from typing import Iterable

import numpy as np

from bert_jax import errors
from bert_jax.finetune.features import bpe
from data_pipeline.vocab import tokenizers
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

# Words per batched TensorFlow call in `prime`: large enough to amortise the
# per-call overhead, small enough to keep the ragged intermediates small.
PRIME_CHUNK = 4096
# Memoised words kept at most; beyond it words are tokenized but not cached, so
# a huge corpus (Chinese reviews are one "word" each) cannot exhaust memory.
MAX_CACHED_WORDS = 1_000_000


class WordTokenizer:
  """Callable word -> wordpiece strings over a data_pipeline tokenizer, memoised.

  Attributes:
    vocab: token string -> id.
    vocab_file: the vocab (WordPiece) or model (SentencePiece) file.
    do_lower_case: whether the tokenizer lowercases.
    pair_separators: [SEP] tokens between the two texts of a pair (BERT's one).
  """

  pair_separators = 1

  def __init__(self, tokenizer, max_cached_words: int = MAX_CACHED_WORDS):
    """Wraps a WordPieceTokenizer or SentencePieceTokenizer."""
    self.tokenizer = tokenizer
    self.vocab = {token: i for i, token in enumerate(tokenizer.vocab)}
    self.vocab_file = getattr(tokenizer, "vocab_file", None) or getattr(tokenizer, "model_file")
    self.do_lower_case = bool(tokenizer.do_lower_case)
    self._tokens = np.asarray(tokenizer.vocab, dtype=object)
    self._max_cached_words = max_cached_words
    self._cache: dict[str, list[str]] = {}
    # One traced graph for every batch size: an eager call would dispatch each
    # of the tokenizer's dozen ops separately, which dominates single-word calls.
    self._tokenize = tf.function(tokenizer.tokenize,
                                 input_signature=[tf.TensorSpec([None], tf.string)])

  def _tokenize_batch(self, words: list[str]) -> list[list[str]]:
    ids = self._tokenize(tf.constant(words, tf.string))
    splits, values = ids.row_splits.numpy(), ids.values.numpy()
    pieces = self._tokens[values].tolist()
    return [pieces[splits[i]:splits[i + 1]] for i in range(len(words))]

  def _remember(self, word: str, pieces: list[str]) -> None:
    if len(self._cache) < self._max_cached_words:
      self._cache[word] = pieces

  def __call__(self, word: str) -> list[str]:
    """The pieces of one whitespace-delimited word ([] if it has none, e.g. control chars).

    The returned list is shared with the cache; callers must not modify it.
    """
    pieces = self._cache.get(word)
    if pieces is None:
      [pieces] = self._tokenize_batch([word])
      self._remember(word, pieces)
    return pieces

  def prime(self, texts: Iterable[str | None]) -> None:
    """Tokenizes (and caches) every distinct whitespace word of `texts`, batched.

    None entries (e.g. a missing second sentence) are skipped.
    """
    words = {w for text in texts if text is not None for w in text.split()}
    words = sorted(words.difference(self._cache))
    for start in range(0, len(words), PRIME_CHUNK):
      if len(self._cache) >= self._max_cached_words:
        break
      chunk = words[start:start + PRIME_CHUNK]
      for word, pieces in zip(chunk, self._tokenize_batch(chunk)):
        self._remember(word, pieces)


class TextTokenizer(bpe.CachedWords):
  """A whole tokenizer (tokenizer.json, data_pipeline's JsonTokenizer) for the feature
  builders: `text(t)` gives a text's pieces exactly as the checkpoint's own tokenizer
  (packing.tokenize_text reads texts whole through it), and a call gives one word's pieces
  as read after a space, for the per-word kinds (tagging, NER, SQuAD), which align labels
  and answers to words: what transformers gives for pre-split words with
  add_prefix_space. [CLS] A [SEP] B [SEP] is BERT's layout, ModernBERT's too."""

  pair_separators = 1
  do_lower_case = False

  def __init__(self, tokenizer, max_cached_words: int = MAX_CACHED_WORDS):
    self.tokenizer = tokenizer
    self.vocab_file = tokenizer.vocab_file
    self.vocab = {token: i for i, token in enumerate(tokenizer.vocab)}
    self._tokens = tokenizer.vocab
    self._max_cached_words = max_cached_words
    self._cache: dict[str, list[str]] = {}

  def _pieces(self, texts: list[str]) -> list[list[str]]:
    return [[self._tokens[i] for i in ids] for ids in self.tokenizer.encode(texts)]

  def text(self, text: str) -> list[str]:
    """The pieces of a whole text, no special tokens added."""
    return self._pieces([text])[0]

  def _encode_words(self, words: list[str]) -> list[list[str]]:
    return self._pieces([" " + w for w in words])


def load_word_tokenizer(vocab_file: str = "", spm_model_file: str = "",
                        do_lower_case: bool = True):
  """WordTokenizer over `tokenizers.load_tokenizer` (give exactly one of the two files);
  for a byte-level BPE vocab_file (RoBERTa's vocab.json, merges.txt beside it) the
  bpe.BpeWordTokenizer, which is cased: do_lower_case=True is refused for it; for a whole
  tokenizer (a tokenizer.json, ModernBERT's) the TextTokenizer."""
  if str(vocab_file).endswith("tokenizer.json") and not spm_model_file:
    return TextTokenizer(tokenizers.load_tokenizer(vocab_file=vocab_file,
                                                   do_lower_case=do_lower_case))
  if str(vocab_file).endswith(".json") and not spm_model_file:
    if do_lower_case:
      raise errors.UsageError(
          f"{vocab_file} is a byte-level BPE vocabulary, which is cased (RoBERTa's): set "
          "config.do_lower_case=False")
    return bpe.BpeWordTokenizer(vocab_file, max_cached_words=MAX_CACHED_WORDS)
  return WordTokenizer(tokenizers.load_tokenizer(vocab_file=vocab_file,
                                                 spm_model_file=spm_model_file,
                                                 do_lower_case=do_lower_case))
