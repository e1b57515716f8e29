r"""Command line for vocabularies: tokenize a file, train a WordPiece vocab or a SentencePiece model.

  python -m data_pipeline.vocab.vocab_cli --vocab_file=V --input_file=IN --output_file=OUT [--nodo_lower_case]
  python -m data_pipeline.vocab.vocab_cli --spm_model_file=M --input_file=IN --output_file=OUT
  python -m data_pipeline.vocab.vocab_cli --mode=train_wordpiece --input_file='GLOB' --vocab_file=OUT --vocab_size=N
  python -m data_pipeline.vocab.vocab_cli --mode=train_spm --input_file='GLOB' --spm_model_prefix=P --vocab_size=N

Training reads --input_file as a glob of text files (every line) or as any corpus
spec --config.data.corpus takes ('parquet:GLOB', 'jsonl:GLOB', 'raw:GLOB',
'tfds:NAME', 'embedded'; every sentence), with --text_field, --tfds_data_dir,
--tfds_split and --sentence_splitter as data config's fields of those names
(training_text.py). Tokenizing writes one line of space-separated ids per input
line (no special tokens; a line that is not UTF-8 becomes an empty line). Paths
may be local or gs://. The work is data_pipeline.vocab.tokenizers' and
data_pipeline.vocab.vocab_training's; this module only parses flags (it sits
above both, so neither imports the other to offer a command line).

A bad input (a missing flag, a glob that matches nothing, a Parquet column that
is not there) is refused before anything is written: one line on stderr,
`error: ...`, exit code 1.
"""

import re
import sys
from typing import Callable

from absl import flags
from absl import logging

from data_pipeline.sources import sentences
from data_pipeline.vocab import tokenizers
from data_pipeline.vocab import training_text
from data_pipeline.vocab import vocab_training

# The corpus reader words its refusals for a pretraining config; here each field is a flag.
_FLAG_OF_FIELD = {"corpus": "input_file", "text_field": "text_field",
                  "tfds_data_dir": "tfds_data_dir", "tfds_split": "tfds_split",
                  "sentence_splitter": "sentence_splitter"}
_CONFIG_FIELD = re.compile(r"(?:--)?config\.data\.(" + "|".join(_FLAG_OF_FIELD) + r")\b")


def define_flags(flag_values=None):
  """Defines the CLI flags on `flag_values` (absl's global FLAGS by default).

  Called only by the CLI (or a test, on its own FlagValues), so that importing
  this module never registers flags that could clash with an importer's.
  """
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_enum("mode", "tokenize", ["tokenize", "train_wordpiece", "train_spm"],
                    "tokenize a file, or train a WordPiece vocab / SentencePiece model.",
                    flag_values=fv)
  flags.DEFINE_string("input_file", None, "Text file to tokenize; training: glob(s) of text "
                      "files, or a corpus spec (parquet:GLOB, jsonl:GLOB, raw:GLOB, tfds:NAME, "
                      "embedded).", flag_values=fv)
  flags.DEFINE_string("output_file", None, "tokenize: where the id lines go.", flag_values=fv)
  flags.DEFINE_string("vocab_file", "", "WordPiece vocab: read by tokenize, written by "
                      "train_wordpiece.", flag_values=fv)
  flags.DEFINE_string("spm_model_file", "", "tokenize: SentencePiece .model instead of a vocab.",
                      flag_values=fv)
  flags.DEFINE_string("spm_model_prefix", "", "train_spm: writes <prefix>.model and "
                      "<prefix>.vocab.", flag_values=fv)
  # Uncased is BERT's (and google-research/bert's CLI) default.
  flags.DEFINE_bool("do_lower_case", True, "Lowercase (and for WordPiece strip accents); "
                    "--nodo_lower_case: cased.", flag_values=fv)
  flags.DEFINE_integer("batch_size", 1024, "tokenize: lines per tf.data batch.", flag_values=fv)
  flags.DEFINE_integer("vocab_size", 30522, "Training: vocabulary size (BERT's 30,522).",
                       flag_values=fv)
  flags.DEFINE_enum("spm_model_type", "unigram", ["unigram", "bpe"], "train_spm: model type.",
                    flag_values=fv)
  flags.DEFINE_integer("max_lines", None, "Training: read at most this many lines (a corpus "
                       "spec's: sentences).", flag_values=fv)
  # A corpus spec's options, named and defaulted as the data config's fields.
  flags.DEFINE_string("text_field", "text", "Training from jsonl:/parquet:/tfds:: the field, "
                      "column or feature holding a document's text.", flag_values=fv)
  flags.DEFINE_string("tfds_data_dir", "", "Training from tfds:: the local data_dir.",
                      flag_values=fv)
  flags.DEFINE_string("tfds_split", "train", "Training from tfds:: the split.", flag_values=fv)
  flags.DEFINE_enum("sentence_splitter", "blingfire", list(sentences.SPLITTERS),
                    "Training from raw:/jsonl:/parquet:/tfds:: how documents are split into "
                    "sentences (a new pretraining run's default).", flag_values=fv)
  flags.mark_flag_as_required("input_file", flag_values=fv)
  return fv


def run(fv) -> None:
  """Runs the CLI mode selected by parsed flag values `fv` (see module docstring)."""
  checked(fv)()


def checked(fv) -> Callable[[], None]:
  """The work of `fv`'s mode, once its whole input is checked; ValueError (or OSError, from
  the user's files) before anything is written when it is not."""
  if fv.mode == "tokenize":
    if not fv.output_file:
      raise ValueError("--output_file is required with --mode=tokenize")
    tokenizer = tokenizers.load_tokenizer(vocab_file=fv.vocab_file,
                                          spm_model_file=fv.spm_model_file,
                                          do_lower_case=fv.do_lower_case)

    def tokenize():
      stats = tokenizers.tokenize_file(tokenizer, fv.input_file, fv.output_file, fv.batch_size)
      logging.info("tokenized %d lines into %s", stats["lines"], fv.output_file)
    return tokenize
  if fv.mode == "train_wordpiece" and not fv.vocab_file:
    raise ValueError("--vocab_file (the output vocab) is required with --mode=train_wordpiece")
  if fv.mode == "train_spm" and not fv.spm_model_prefix:
    raise ValueError("--spm_model_prefix is required with --mode=train_spm")
  if fv.vocab_size <= len(vocab_training.RESERVED_TOKENS):
    raise ValueError(f"--vocab_size={fv.vocab_size} leaves no room beside the "
                     f"{len(vocab_training.RESERVED_TOKENS)} reserved tokens: give more")
  text = training_text.TrainingText(
      fv.input_file, text_field=fv.text_field, tfds_data_dir=fv.tfds_data_dir,
      tfds_split=fv.tfds_split, sentence_splitter=fv.sentence_splitter)
  if fv.mode == "train_wordpiece":
    return lambda: vocab_training.train_wordpiece_vocab(
        text, fv.vocab_file, fv.vocab_size, do_lower_case=fv.do_lower_case,
        max_lines=fv.max_lines)
  return lambda: vocab_training.train_sentencepiece(
      text, fv.spm_model_prefix, fv.vocab_size, model_type=fv.spm_model_type,
      do_lower_case=fv.do_lower_case, max_lines=fv.max_lines)


def in_flag_terms(message: str) -> str:
  """A refusal of the corpus reader with its config fields named as this CLI's flags."""
  return _CONFIG_FIELD.sub(lambda m: "--" + _FLAG_OF_FIELD[m.group(1)], message)


def main(fv) -> None:
  """Checks, then works; a refused input is one line on stderr and exit code 1."""
  try:
    work = checked(fv)
  except (ValueError, OSError) as e:  # judged before any work: the user's input, not a bug
    lines = (line.strip() for line in in_flag_terms(str(e) or repr(e)).splitlines())
    sys.exit("error: " + " ".join(line for line in lines if line))
  work()


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _flags = define_flags()
  app.run(lambda argv: main(_flags))
