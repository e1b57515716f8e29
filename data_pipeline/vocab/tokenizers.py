"""In-graph tokenizers for the tf.data pipeline: BERT WordPiece and SentencePiece.

Both tokenizers are plain TensorFlow ops (tensorflow-text underneath), so they run
inside `tf.data` maps; both expose the same small interface:

  tokenize(strings)                 rank-1 tf.string -> tf.RaggedTensor[int32] ids
  tokenize_with_word_ids(strings)   -> (ids, word_ids): word_ids[i, j] is the index,
                                       within line i, of the word piece j belongs to
  vocab_size, special_ids (pad/unk/cls/sep/mask), ids_to_tokens(ids)

No special tokens are added; the pipeline assembles `[CLS] A [SEP] B [SEP]` itself.

WordPiece reproduces transformers' `BertTokenizerFast` (the `tokenizers` Rust
BertNormalizer + BertPreTokenizer + WordPiece, `add_special_tokens=False`), which is
what the reference checkpoints were tokenized with. The text path, in HF's order:

  1. The five special tokens written literally in the text ("[CLS]", "[MASK]", ...,
     case-sensitive, anywhere, even inside a word) stay one token each, as HF does
     for its added special tokens. They are swapped for private-use sentinels before
     normalization so that lowercasing and punctuation splitting cannot touch them.
  2. Clean: drop NUL, U+FFFD and "other" characters (Cc except \\t\\n\\r, Cf, Co);
     every Unicode whitespace character separates words.
  3. Pad every CJK ideograph with spaces (before NFD, as HF does; HF's blocks,
     whose Extension E starts at U+2B920 rather than google-research's U+2B820).
  4. Uncased only: NFD, drop non-spacing marks (Mn), then lowercase. Lowercasing is
     ICU's full per-character mapping; capital sigma is mapped to "σ" first because
     ICU applies the context-sensitive final-sigma rule and HF does not.
     NOT tensorflow-text's `case_fold_utf8`, which applies NFKC and would change
     ligatures, full-width forms, superscripts, ... where BERT does not.
  5. Split on whitespace; every punctuation character (ASCII 33-47, 58-64, 91-96,
     123-126 and Unicode P*) is its own word.
  6. Words longer than 100 characters (characters, not bytes, as in HF) -> [UNK];
     the rest go through greedy longest-match-first WordPiece ("##" suffixes), a word
     with any unmatchable remainder becoming a single [UNK].

Known, documented divergences from HF (each tested in tests/test_tokenizers.py):
  * Unicode tables. HF's Rust crates classify characters with Unicode 8-era
    tables; TensorFlow's RE2/ICU with current ones. 568 code points (115 in the
    BMP, none of them in the test corpora) were added or re-categorised since, as
    non-spacing marks (Mn), punctuation (P*) or format characters (Cf): HF treats
    them as letters where we strip, split or drop them (e.g. U+2E5D OBLIQUE
    HYPHEN splits a word here, not in HF), and the reverse for the few that left
    those categories (U+166D, U+1734). All of them are [UNK] in BERT's vocabs, so
    only the word boundaries around them differ.
  * Invalid UTF-8 reaches HF as a Python error; here the bad bytes are replaced by
    U+FFFD, which step 2 then drops (the CLI logs and blanks such lines instead).

SentencePiece: a `.model` file is run with tensorflow-text's SentencepieceTokenizer.
Its special ids are looked up by piece: "[CLS]", "[SEP]", "[MASK]" must be pieces
of the model (`train_sentencepiece` adds them as user-defined symbols, so they are
also never split when written in text); pad is the piece "[PAD]" or else the
model's pad id; unk is the model's unk id.

tokenize_file (and its command line, data_pipeline/vocab/vocab_cli.py) writes one output
line of space-separated ids per input line, no special tokens.

Input lines that are not valid UTF-8 produce an empty output line (so line i of the
output always belongs to line i of the input); they are counted and their line
numbers logged.
"""

import re
from typing import Iterable, Sequence

import numpy as np
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it
import tensorflow_text as tf_text

from data_pipeline.vocab.specials import SPECIAL_TOKENS  # role -> spelling; read by role only
from host import paths

# HF's WordPiece turns any word longer than this many characters into [UNK].
MAX_CHARS_PER_WORD = 100

# Supplementary private-use code points standing in for in-text special tokens
# between steps 1 and 5 (see module docstring); real Co characters are dropped.
_SENTINEL_BASE = 0xF0000
_SENTINELS = tuple(chr(_SENTINEL_BASE + i) for i in range(len(SPECIAL_TOKENS)))
_SENTINEL_CLASS = rf"\x{{{_SENTINEL_BASE:X}}}-\x{{{_SENTINEL_BASE + len(_SENTINELS) - 1:X}}}"

# HF's clean_text removes "other" characters (Cc except \t\n\r, Cf, Co), NUL and
# U+FFFD. Co is spelled out as ranges so that our sentinels survive it.
_REMOVED_CHARS = (
    r"[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x9F\p{Cf}\x{FFFD}"
    r"\x{E000}-\x{F8FF}\x{F0005}-\x{FFFFD}\x{100000}-\x{10FFFD}]")
# Rust's char::is_whitespace minus the Cc ones already removed above.
_WHITESPACE = r"[\t\n\r\p{Z}]+"
# BERT's _is_punctuation: all ASCII non-alphanumeric printable characters plus P*.
_PUNCTUATION = r"[!-/:-@\[-`{-~\p{P}]"
# BERT's _is_chinese_char blocks as HF's Rust code has them: its Extension E
# block starts at U+2B920, not U+2B820, so U+2B820-U+2B91F are ordinary letters.
_CJK = (r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}"
        r"\x{2B740}-\x{2B81F}\x{2B920}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]")
_SPLIT = f"{_WHITESPACE}|{_PUNCTUATION}|[{_SENTINEL_CLASS}]"
_KEEP = f"{_PUNCTUATION}|[{_SENTINEL_CLASS}]"

# The ops below have no tensor-dependent Python control flow, so AutoGraph has
# nothing to convert; skipping it saves seconds per trace inside tf.data maps.
_graph_safe = tf.autograph.experimental.do_not_convert


def read_vocab(vocab_file: str) -> list[str]:
  """Reads a WordPiece vocab (one token per line, id = line number).

  Raises:
    ValueError: the file is missing, empty, not UTF-8, has duplicate or empty
      tokens, or lacks any of [PAD] [UNK] [CLS] [SEP] [MASK].
  """
  if not paths.exists(vocab_file):
    raise ValueError(f"vocab file {vocab_file!r} does not exist")
  data = paths.read_bytes(vocab_file)
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ValueError(f"vocab file {vocab_file!r} is not UTF-8 (line {line}: {e.reason})") from None
  # Exactly HF's load_vocab: one token per line, only the newline stripped.
  tokens = text.split("\n")
  if tokens and tokens[-1] == "":
    tokens.pop()
  if not tokens:
    raise ValueError(f"vocab file {vocab_file!r} is empty")
  seen = {}
  for i, token in enumerate(tokens):
    if not token:
      raise ValueError(f"vocab file {vocab_file!r} line {i + 1}: empty token")
    if token in seen:
      raise ValueError(f"vocab file {vocab_file!r} line {i + 1}: token {token!r} "
                       f"duplicates line {seen[token] + 1}")
    seen[token] = i
  missing = [t for t in SPECIAL_TOKENS.values() if t not in seen]
  if missing:
    raise ValueError(f"vocab file {vocab_file!r} lacks the special token(s) {', '.join(missing)}")
  return tokens


def _rank1_strings(strings) -> tf.Tensor:
  """The input as a rank-1 tf.string tensor; other ranks are a caller bug."""
  strings = tf.convert_to_tensor(strings, tf.string)
  if strings.shape.rank is not None and strings.shape.rank != 1:
    raise ValueError(f"tokenizers take a rank-1 batch of strings, got shape {strings.shape}")
  return strings


def sanitize_utf8(strings: tf.Tensor) -> tf.Tensor:
  """Replaces invalid UTF-8 bytes by U+FFFD (which tokenization then drops)."""
  return tf.strings.unicode_transcode(
      strings, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)


def is_valid_utf8(strings: tf.Tensor) -> tf.Tensor:
  """Elementwise: True where a string is valid UTF-8."""
  return tf.equal(sanitize_utf8(strings), strings)


def _protect_specials(text: tf.Tensor, tokens: Sequence[str]) -> tf.Tensor:
  """Replaces literal special tokens by their sentinel code points."""
  # A sentinel already present in the input must not impersonate a special: HF
  # drops such private-use characters, so replace them by one that step 2 drops.
  text = tf.strings.regex_replace(text, f"[{_SENTINEL_CLASS}]", "\uE000")
  for token, sentinel in zip(tokens, _SENTINELS):
    text = tf.strings.regex_replace(text, re.escape(token), sentinel)
  return text


def normalize(text: tf.Tensor, do_lower_case: bool) -> tf.Tensor:
  """BERT normalization (steps 2-4 of the module docstring), string -> string."""
  text = tf.strings.regex_replace(text, _REMOVED_CHARS, "")
  text = tf.strings.regex_replace(text, f"({_CJK})", r" \1 ")
  if do_lower_case:
    text = tf_text.normalize_utf8(text, "NFD")
    text = tf.strings.regex_replace(text, r"\p{Mn}", "")
    text = tf.strings.regex_replace(text, "\u03A3", "\u03C3")
    text = tf.strings.lower(text, encoding="utf-8")
  return text


def split_words(text: tf.Tensor) -> tf.RaggedTensor:
  """Whitespace + punctuation split of normalized text -> ragged [batch, words]."""
  words, _, _ = tf_text.regex_split_with_offsets(text, _SPLIT, _KEEP)
  return words


@_graph_safe
def bert_words(strings: tf.Tensor, do_lower_case: bool,
               special_tokens: Sequence[str] = ()) -> tf.RaggedTensor:
  """BERT pre-tokenization: rank-1 strings -> normalized words, ragged [batch, words].

  `special_tokens` (at most five) written literally in the text come out as
  single, unnormalized words; pass () to treat them as ordinary text.
  """
  if len(special_tokens) > len(_SENTINELS):
    raise ValueError(f"at most {len(_SENTINELS)} special tokens, got {list(special_tokens)}")
  text = sanitize_utf8(_rank1_strings(strings))
  # Also run without specials: it removes sentinel look-alikes from the input.
  text = _protect_specials(text, special_tokens)
  words = split_words(normalize(text, do_lower_case))
  if not special_tokens:
    return words
  flat = words.flat_values
  for token, sentinel in zip(special_tokens, _SENTINELS):
    flat = tf.where(tf.equal(flat, sentinel), token, flat)
  return words.with_flat_values(flat)


def _word_ids(pieces: tf.RaggedTensor) -> tf.RaggedTensor:
  """[batch, words, pieces] ragged -> [batch, pieces] index of each piece's word."""
  position = tf.ragged.range(tf.cast(pieces.row_lengths(), tf.int32)).flat_values
  per_piece = tf.gather(position, pieces.values.value_rowids())
  return tf.RaggedTensor.from_row_splits(
      per_piece, tf.gather(pieces.values.row_splits, pieces.row_splits))


class WordPieceTokenizer:
  """BERT WordPiece tokenizer as TensorFlow ops, id-identical to HF BertTokenizerFast."""

  def __init__(self, vocab_file: str, do_lower_case: bool = True):
    """Loads `vocab_file` (see `read_vocab` for the errors it raises)."""
    self.vocab_file = str(vocab_file)
    self.do_lower_case = bool(do_lower_case)
    self.vocab = read_vocab(self.vocab_file)
    index = {t: i for i, t in enumerate(self.vocab)}
    self.special_ids = {role: index[tok] for role, tok in SPECIAL_TOKENS.items()}
    self._special_tokens = tuple(SPECIAL_TOKENS.values())
    # Word-length limit is enforced on characters before this op (HF counts chars);
    # 4 bytes per character keeps the op's byte limit from ever biting first.
    self._wordpiece = tf_text.FastWordpieceTokenizer(
        vocab=self.vocab, suffix_indicator="##",
        max_bytes_per_word=4 * MAX_CHARS_PER_WORD, token_out_type=tf.int32,
        unknown_token=SPECIAL_TOKENS["unk"], no_pretokenization=True)

  @property
  def vocab_size(self) -> int:
    """Number of ids (lines in the vocab file)."""
    return len(self.vocab)

  def words(self, strings: tf.Tensor) -> tf.RaggedTensor:
    """The words WordPiece sees, ragged [batch, words]; over-long words are [UNK]."""
    return self._words_and_lengths(strings)[0]

  def _words_and_lengths(self, strings: tf.Tensor) -> tuple[tf.RaggedTensor, tf.Tensor]:
    """(`words`, each pre-tokenized word's length in characters before the [UNK] swap)."""
    words = bert_words(strings, self.do_lower_case, self._special_tokens)
    flat = words.flat_values
    lengths = tf.strings.length(flat, unit="UTF8_CHAR")
    too_long = lengths > MAX_CHARS_PER_WORD
    return words.with_flat_values(tf.where(too_long, SPECIAL_TOKENS["unk"], flat)), lengths

  def _pieces(self, strings: tf.Tensor) -> tf.RaggedTensor:
    words = self.words(strings)
    return words.with_values(self._wordpiece.tokenize(words.values))

  @_graph_safe
  def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
    """Rank-1 tf.string -> tf.RaggedTensor[int32] [batch, (pieces)], no specials added."""
    return self._pieces(strings).merge_dims(1, 2)

  @_graph_safe
  def tokenize_with_word_ids(self, strings: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    """Like `tokenize`, plus the int32 index (within its line) of each piece's word.

    A word is what BERT's pre-tokenizer yields: a whitespace-delimited run without
    punctuation, one punctuation character, one CJK character or one special token.
    Pieces j and j+1 belong to the same word iff word_ids are equal.
    """
    pieces = self._pieces(strings)
    return pieces.merge_dims(1, 2), _word_ids(pieces)

  @_graph_safe
  def tokenize_with_word_lengths(self, strings: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    """Like `tokenize`, plus the int32 length in characters of each piece's word.

    An [UNK] stands for one whole pre-tokenized word (step 6: unmatchable, or
    over MAX_CHARS_PER_WORD), whose text it no longer spells; its word's length
    is what a word segmentation needs to line up past it
    (data_pipeline/sources/word_segmentation.py). Lengths count the normalized word (after
    step 4), as the pieces spell it; a literal special token counts its spelling.
    """
    words, lengths = self._words_and_lengths(strings)
    pieces = self._wordpiece.tokenize(words.values)  # ragged [words, pieces]
    ids = words.with_values(pieces).merge_dims(1, 2)
    return ids, ids.with_flat_values(tf.gather(lengths, pieces.value_rowids()))

  def ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    """Token strings for ids (numpy / list / eager tensor), for previews."""
    return [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]


class SentencePieceTokenizer:
  """A SentencePiece `.model` run in-graph, with the WordPieceTokenizer interface."""

  def __init__(self, model_file: str, do_lower_case: bool = False):
    """Loads `model_file`; raises ValueError if it is unreadable or lacks BERT specials.

    `do_lower_case` lowercases the text (not the special tokens in it) before the
    model, as ALBERT does; leave it False for models that normalize themselves.
    """
    import sentencepiece as spm  # Only to inspect pieces; the op is tensorflow-text's.
    self.model_file = str(model_file)
    self.do_lower_case = bool(do_lower_case)
    if not paths.exists(self.model_file):
      raise ValueError(f"SentencePiece model {self.model_file!r} does not exist")
    proto = paths.read_bytes(self.model_file)
    processor = spm.SentencePieceProcessor()
    try:
      processor.LoadFromSerializedProto(proto)
    except Exception as e:  # sentencepiece raises a bare RuntimeError/OSError.
      raise ValueError(f"{self.model_file!r} is not a SentencePiece model: {e}") from None
    self.vocab = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
    index = {p: i for i, p in enumerate(self.vocab)}
    special_ids = {"unk": processor.unk_id()}
    if SPECIAL_TOKENS["pad"] in index:
      special_ids["pad"] = index[SPECIAL_TOKENS["pad"]]
    elif processor.pad_id() >= 0:
      special_ids["pad"] = processor.pad_id()
    missing = [SPECIAL_TOKENS[r] for r in ("pad", "cls", "sep", "mask")
               if r not in special_ids and SPECIAL_TOKENS[r] not in index]
    if missing:
      raise ValueError(f"SentencePiece model {self.model_file!r} lacks the piece(s) "
                       f"{', '.join(missing)} (train it with train_sentencepiece, which adds them)")
    for role in ("cls", "sep", "mask"):
      special_ids[role] = index[SPECIAL_TOKENS[role]]
    self.special_ids = {r: special_ids[r] for r in SPECIAL_TOKENS}
    # A piece starts a word if it carries the word-boundary marker or is one of
    # the specials (user-defined symbols are words of their own); [UNK] is not:
    # it stands for characters inside a word as often as for whole words.
    own_words = {SPECIAL_TOKENS[r] for r in ("pad", "cls", "sep", "mask")}
    starts = [p.startswith("\u2581") or p in own_words for p in self.vocab]
    self._starts_word = tf.constant(starts, tf.bool)
    self._spm = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)

  @property
  def vocab_size(self) -> int:
    """Number of pieces in the model."""
    return len(self.vocab)

  @_graph_safe
  def tokenize(self, strings: tf.Tensor) -> tf.RaggedTensor:
    """Rank-1 tf.string -> tf.RaggedTensor[int32] of piece ids, no specials added."""
    text = sanitize_utf8(_rank1_strings(strings))
    if self.do_lower_case:
      specials = tuple(SPECIAL_TOKENS.values())
      text = tf.strings.lower(_protect_specials(text, specials), encoding="utf-8")
      for token, sentinel in zip(specials, _SENTINELS):
        text = tf.strings.regex_replace(text, sentinel, token)
    return self._spm.tokenize(text)

  @_graph_safe
  def tokenize_with_word_ids(self, strings: tf.Tensor) -> tuple[tf.RaggedTensor, tf.RaggedTensor]:
    """Like `tokenize`, plus each piece's word index within its line (see WordPiece)."""
    ids = self.tokenize(strings)
    starts = tf.gather(self._starts_word, ids.values)
    # The first piece of a line always opens word 0, marker or not.
    first = tf.ragged.range(ids.row_lengths(), dtype=tf.int64).flat_values == 0
    starts = ids.with_values(tf.cast(starts | first, tf.int32))
    return ids, tf.math.cumsum(starts, axis=1) - 1

  def ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    """Piece strings for ids (numpy / list / eager tensor), for previews."""
    return [self.vocab[int(i)] for i in np.asarray(ids).reshape(-1)]


def load_tokenizer(vocab_file: str = "", spm_model_file: str = "",
                   do_lower_case: bool = True):
  """WordPieceTokenizer for `vocab_file` (a tokenizer.json: hf_tokenizer.JsonTokenizer), or
  SentencePieceTokenizer for `spm_model_file`.

  Exactly one of the two must be given. For SentencePiece, `do_lower_case`
  lowercases before the model (see SentencePieceTokenizer).
  """
  if bool(vocab_file) == bool(spm_model_file):
    raise ValueError("give exactly one of vocab_file and spm_model_file "
                     f"(got vocab_file={vocab_file!r}, spm_model_file={spm_model_file!r})")
  if spm_model_file:
    return SentencePieceTokenizer(spm_model_file, do_lower_case=do_lower_case)
  if str(vocab_file).endswith("tokenizer.json"):  # a whole tokenizer (ModernBERT's BPE)
    from data_pipeline.vocab import hf_tokenizer  # pylint: disable=g-import-not-at-top
    return hf_tokenizer.JsonTokenizer(vocab_file, do_lower_case=do_lower_case)
  return WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case)


def tokenize_file(tokenizer, input_file: str, output_file: str, batch_size: int = 1024) -> dict:
  """Writes one line of space-separated ids per line of `input_file` (see module doc).

  Lines go through tf.data in batches of `batch_size`, so memory stays bounded
  whatever the file size. A line that is not UTF-8 yields an empty output line
  and is logged. Returns counts: {"lines", "non_utf8_lines"}.
  """
  from absl import logging  # Deferred: only the CLI path logs.
  if not paths.exists(input_file):
    raise ValueError(f"input file {input_file!r} does not exist")

  @tf.function
  def tokenize_batch(lines):
    return tokenizer.tokenize(lines), is_valid_utf8(lines)

  lines = non_utf8 = 0
  # TextLineDataset reads through TensorFlow's own file systems; a gs:// input is
  # downloaded first (see host.paths for why TF never talks to GCS here).
  with paths.local_file(input_file) as local_input, paths.open_text(output_file, "w") as out:
    dataset = tf.data.TextLineDataset(local_input).batch(batch_size).map(
        tokenize_batch, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)
    for ids, valid in dataset:
      splits, values, valid = ids.row_splits.numpy(), ids.values.numpy(), valid.numpy()
      rows = []
      for i in range(len(valid)):
        if not valid[i]:
          non_utf8 += 1
          # Bounded logging: a binary file would otherwise flood the log.
          if non_utf8 <= 20:
            logging.warning("%s:%d is not UTF-8; wrote an empty line", input_file, lines + i + 1)
          rows.append("")
        else:
          rows.append(" ".join(map(str, values[splits[i]:splits[i + 1]])))
      out.write("".join(row + "\n" for row in rows))
      lines += len(valid)
  if non_utf8:
    logging.warning("%s: %d of %d lines were not UTF-8 (empty output lines)",
                    input_file, non_utf8, lines)
  return {"lines": lines, "non_utf8_lines": non_utf8}


if __name__ == "__main__":
  # The command line moved to data_pipeline.vocab.vocab_cli (same flags); this module only
  # tokenizes. Running it says so instead of doing nothing with exit status 0.
  import sys  # pylint: disable=g-import-not-at-top
  sys.exit("data_pipeline.vocab.tokenizers is not a command any more: run\n  python -m "
           "data_pipeline.vocab.vocab_cli " + " ".join(sys.argv[1:]))
