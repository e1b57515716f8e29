"""RoBERTa's byte-level BPE (vocab.json + merges.txt) as a fine-tuning word tokenizer.

The byte-level BPE runs in Hugging Face's `tokenizers` library (the Rust BPE model
and GPT-2 byte-level pre-tokenizer transformers' RobertaTokenizerFast is built on),
never a BPE written here. It is an optional extra (`pip install 'bert_jax[bpe]'`),
imported only when a vocab.json is given; without it the load is refused in one line.

BpeWordTokenizer has WordTokenizer's interface (bert_jax/finetune/features/tokenization.py):
`tokenizer(word) -> pieces`, `prime(texts)`, `vocab`, `vocab_file`, `do_lower_case`,
`pair_separators` (its word cache, CachedWords, serves tokenization.TextTokenizer too).
The feature builders split texts on whitespace and ask for each
word's pieces, so every word is encoded as it reads after a space ("Ġword"): what
RobertaTokenizerFast(add_prefix_space=True) gives for pre-split words
(is_split_into_words=True), the mode transformers requires for word-level input.
Against the default reading of a raw line, that differs in the first word's "Ġ"
and in runs of whitespace (collapsed here, as the WordPiece path does).

The packing code writes BERT's role names ([CLS], [SEP], [UNK], [PAD], [MASK]);
`vocab` resolves them to RoBERTa's <s>, </s>, <unk>, <pad>, <mask> without counting
them as entries, and a sentence pair is packed `<s> A </s></s> B </s>` as RoBERTa's
(pair_separators = 2).
"""

from typing import Iterable

from bert_jax import errors
from host import paths

MERGES_NAME = "merges.txt"  # beside vocab.json, as Hugging Face names them
# BERT's role names, as the feature builders write them -> RoBERTa's special tokens.
ROLES = {"[CLS]": "<s>", "[SEP]": "</s>", "[UNK]": "<unk>", "[PAD]": "<pad>", "[MASK]": "<mask>"}
EXTRA = "bpe"  # the setup.cfg extra that installs `tokenizers`


class _Vocab(dict):
  """token -> id; a missing BERT role name reads as its RoBERTa special's id.

  The roles are not entries: len() stays the vocabulary's size (the model's vocab_size).
  """

  def __missing__(self, token: str) -> int:
    if token in ROLES:
      return self[ROLES[token]]
    raise KeyError(token)


def _import_tokenizers():
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top  # the optional extra
  except ImportError:
    raise errors.UsageError(
        f"a byte-level BPE vocabulary (vocab.json) needs the 'tokenizers' package: "
        f"pip install 'bert_jax[{EXTRA}]'") from None
  return tokenizers


class CachedWords:
  """Word pieces memoised, for the word tokenizers of a tokenizers-library vocabulary (this
  module's and tokenization.TextTokenizer): a subclass gives `_encode_words(words)`, the
  pieces of each word as read after a space, and `_max_cached_words`, `_cache`."""

  def _encode_words(self, words: list[str]) -> list[list[str]]:
    raise NotImplementedError

  def __call__(self, word: str) -> list[str]:
    """The pieces of one whitespace-delimited word, as read after a space.

    The returned list is shared with the cache; callers must not modify it.
    """
    pieces = self._cache.get(word)
    if pieces is None:
      [pieces] = self._encode_words([word])
      if len(self._cache) < self._max_cached_words:
        self._cache[word] = pieces
    return pieces

  def prime(self, texts: Iterable[str | None]) -> None:
    """Tokenizes (and caches) the distinct whitespace words of `texts`, in one batch."""
    room = self._max_cached_words - len(self._cache)
    words = sorted({w for t in texts if t is not None for w in t.split()} - set(self._cache))
    words = words[:max(room, 0)]
    self._cache.update(zip(words, self._encode_words(words)))


class BpeWordTokenizer(CachedWords):
  """Word -> byte-level BPE pieces over vocab.json + merges.txt, memoised.

  Attributes:
    vocab: token -> id (a _Vocab: BERT role names resolve to RoBERTa's specials).
    vocab_file: the vocab.json path (merges.txt lies beside it).
    do_lower_case: always False (byte-level BPE is cased).
    pair_separators: separators between the two texts of a pair (RoBERTa: </s></s>).
  """

  do_lower_case = False
  pair_separators = 2

  def __init__(self, vocab_file: str, max_cached_words: int):
    """Loads vocab_file and the merges.txt beside it; refuses a broken pair in one line.

    Words beyond `max_cached_words` are tokenized but not memoised (bounded memory).
    """
    tokenizers = _import_tokenizers()
    self._max_cached_words = max_cached_words
    self.vocab_file = str(vocab_file)
    merges = paths.join(str(paths.path(self.vocab_file).parent), MERGES_NAME)
    for path in (self.vocab_file, merges):
      if not paths.exists(path):
        raise errors.UsageError(f"BPE vocabulary file {path} does not exist (a byte-level BPE "
                                f"is vocab.json with {MERGES_NAME} beside it)")
    # Through the path layer, so a gs:// vocabulary reads as a local one.
    with paths.local_file(self.vocab_file) as vocab_path, paths.local_file(merges) as merges_path:
      try:
        model = tokenizers.models.BPE.from_file(vocab_path, merges_path)
      except Exception as e:  # the Rust side raises a bare Exception on a malformed file
        raise errors.UsageError(f"cannot read the BPE vocabulary {self.vocab_file} with "
                                f"{MERGES_NAME}: {e}") from None
    self._tokenizer = tokenizers.Tokenizer(model)
    self._tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=True)
    self.vocab = _Vocab(self._tokenizer.get_vocab(with_added_tokens=False))
    missing = [t for t in ROLES.values() if t not in self.vocab]
    clashing = [r for r in ROLES if r in self.vocab]
    if missing or clashing:
      raise errors.UsageError(
          f"BPE vocabulary {self.vocab_file}: " + (f"lacks RoBERTa's special token(s) "
                                                   f"{', '.join(missing)}" if missing else
                                                   f"holds {', '.join(clashing)} as entries, "
                                                   "which the packing uses as role names"))
    # Literal specials in text stay one token, as RobertaTokenizerFast's added tokens do.
    self._tokenizer.add_special_tokens(
        [tokenizers.AddedToken(t, lstrip=t == "<mask>", normalized=False)
         for t in ROLES.values()])
    self._cache: dict[str, list[str]] = {}

  def _encode(self, words: list[str]) -> list[list[str]]:
    return [e.tokens for e in self._tokenizer.encode_batch(
        [[w] for w in words], is_pretokenized=True, add_special_tokens=False)]

  def _encode_words(self, words: list[str]) -> list[list[str]]:
    return self._encode(words)
