"""Vocabulary training: WordPiece (tensorflow-text's learner) and SentencePiece.

Both learn from a training_text.TrainingText: text files (a glob or a list; one
sentence, line or document per line, lines that are not UTF-8 skipped and
counted in the log), or the sentences of any corpus spec a pretraining run reads
("parquet:<glob>", "jsonl:<glob>", "raw:<glob>", "tfds:<name>", "embedded").
Both reserve BERT's special tokens so the result loads straight into the
tokenizers of `data_pipeline.vocab.tokenizers`:

* `train_wordpiece_vocab` words the text exactly as `WordPieceTokenizer` does
  (normalization, punctuation and CJK splitting), so the learned pieces are the
  ones the tokenizer will look for, then runs tensorflow-text's
  `bert_vocab_from_dataset` learner. The vocab starts with
  [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4).
* `train_sentencepiece` runs the sentencepiece trainer (unigram or BPE) with
  [PAD] as pad id 0, [UNK] as unk id 1, no BOS/EOS, and [CLS] [SEP] [MASK] as
  user-defined symbols (ids 2-4), which SentencePiece never splits, even when
  they are written inside the text.
"""

import os
import tempfile
from typing import Sequence

from absl import logging
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it
from tensorflow_text.tools.wordpiece_vocab import bert_vocab_from_dataset as bert_vocab

from data_pipeline.vocab import tokenizers
from data_pipeline.vocab import training_text
from host import paths

# Reserved ids 0-4 for both kinds of vocabulary, in this order.
RESERVED_TOKENS = [tokenizers.SPECIAL_TOKENS[r] for r in ("pad", "unk", "cls", "sep", "mask")]

Source = str | Sequence[str] | training_text.TrainingText


def _text(input_files: Source) -> training_text.TrainingText:
  """`input_files` as checked training text (a glob or corpus spec is checked here)."""
  if isinstance(input_files, training_text.TrainingText):
    return input_files
  return training_text.TrainingText(input_files)


def train_wordpiece_vocab(input_files: Source, vocab_file: str, vocab_size: int,
                          do_lower_case: bool = True, max_lines: int | None = None,
                          learn_params: dict | None = None) -> list[str]:
  """Learns a WordPiece vocab of at most about `vocab_size` tokens; writes `vocab_file`.

  Args:
    input_files: glob(s) of text files, a corpus spec, or a TrainingText (one with
      options other than the defaults: a Parquet column other than "text", ...).
    vocab_file: output path, one token per line (the WordPieceTokenizer format).
    vocab_size: target size including the reserved tokens; the learner's
      frequency-threshold search lands at most 5% below it (above it only when
      the corpus is too small for the search to converge).
    do_lower_case: must match the tokenizer that will use the vocab.
    max_lines: read at most this many lines (None: all).
    learn_params: extra arguments of tensorflow-text's
      `wordpiece_tokenizer_learner_lib.learn` (e.g. lower_thresh).

  Returns:
    The vocabulary, reserved tokens first.
  """
  if vocab_size <= len(RESERVED_TOKENS):
    raise ValueError(f"vocab_size={vocab_size} leaves no room beside the {len(RESERVED_TOKENS)} "
                     "reserved tokens")
  text = _text(input_files)  # checked before the learner starts: a refusal, not a tf error
  lines = tf.data.Dataset.from_generator(lambda: text.lines(max_lines),
                                         output_signature=tf.TensorSpec([], tf.string))

  @tf.autograph.experimental.do_not_convert
  def words_joined(batch):
    # The learner re-splits on whitespace and punctuation with its own (NFKC)
    # rules; handing it our words, already normalized and split, and disabling
    # its lowercasing makes that a no-op, so it counts exactly our words.
    words = tokenizers.bert_words(batch, do_lower_case)
    short = tf.strings.length(words, unit="UTF8_CHAR") <= tokenizers.MAX_CHARS_PER_WORD
    return tf.strings.reduce_join(tf.ragged.boolean_mask(words, short), axis=1, separator=" ")

  dataset = lines.batch(1024).map(words_joined)
  vocab = bert_vocab.bert_vocab_from_dataset(
      # The learner's size counts the learned pieces only.
      dataset, vocab_size=vocab_size - len(RESERVED_TOKENS), reserved_tokens=RESERVED_TOKENS,
      bert_tokenizer_params={"lower_case": False}, learn_params=learn_params or {})
  if len(vocab) <= len(RESERVED_TOKENS):
    raise ValueError(f"no text to learn a vocabulary from in {text.source!r}")
  paths.write_atomic(vocab_file, "".join(token + "\n" for token in vocab))
  logging.info("wrote %d WordPiece tokens to %s", len(vocab), vocab_file)
  return vocab


def train_sentencepiece(input_files: Source, model_prefix: str, vocab_size: int,
                        model_type: str = "unigram", do_lower_case: bool = False,
                        character_coverage: float = 0.9995,
                        input_sentence_size: int = 1_000_000, max_lines: int | None = None,
                        **trainer_kwargs) -> str:
  """Trains a SentencePiece model with BERT's specials; returns `<model_prefix>.model`.

  Args:
    input_files: glob(s) of text files, a corpus spec, or a TrainingText.
    model_prefix: writes `<model_prefix>.model` and `<model_prefix>.vocab`.
    vocab_size: exact number of pieces, reserved ones included.
    model_type: "unigram" or "bpe".
    do_lower_case: lowercase the training text; load the model with
      `SentencePieceTokenizer(..., do_lower_case=True)` then.
    character_coverage: fraction of characters covered by the alphabet
      (0.9995 for large alphabets such as CJK, 1.0 for small ones).
    input_sentence_size: the trainer samples at most this many lines.
    max_lines: read at most this many lines (None: all).
    **trainer_kwargs: passed on to `SentencePieceTrainer.train`.
  """
  import sentencepiece as spm  # Deferred: only training needs the Python trainer.
  if model_type not in ("unigram", "bpe"):
    raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
  lines = _text(input_files).lines(max_lines)
  if do_lower_case:
    lines = (line.lower() for line in lines)
  # The trainer writes local files only: train into a temporary directory, then copy
  # <prefix>.model / .vocab to where they were asked for (local or gs://).
  with tempfile.TemporaryDirectory(prefix="bert_jax_spm_") as tmp:
    local_prefix = os.path.join(tmp, "spm")
    _train_spm(spm, lines, local_prefix, vocab_size, model_type, character_coverage,
               input_sentence_size, trainer_kwargs)
    for suffix in (".model", ".vocab"):
      paths.copy_file(local_prefix + suffix, f"{model_prefix}{suffix}")
  model_file = f"{model_prefix}.model"
  logging.info("wrote SentencePiece model %s (%d pieces)", model_file, vocab_size)
  return model_file


def _train_spm(spm, lines, model_prefix, vocab_size, model_type, character_coverage,
               input_sentence_size, trainer_kwargs) -> None:
  """SentencePieceTrainer.train with BERT's reserved pieces at ids 0-4."""
  spm.SentencePieceTrainer.train(
      sentence_iterator=lines, model_prefix=str(model_prefix), vocab_size=vocab_size,
      model_type=model_type, character_coverage=character_coverage,
      input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
      pad_id=0, pad_piece=RESERVED_TOKENS[0], unk_id=1, unk_piece=RESERVED_TOKENS[1],
      bos_id=-1, eos_id=-1, user_defined_symbols=RESERVED_TOKENS[2:],
      minloglevel=2, **trainer_kwargs)
