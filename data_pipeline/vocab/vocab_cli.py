r"""Command line for vocabularies: tokenize a file, train a WordPiece vocab or a SentencePiece model.

  python -m data_pipeline.vocab.vocab_cli --vocab_file=V --input_file=IN --output_file=OUT [--nodo_lower_case]
  python -m data_pipeline.vocab.vocab_cli --spm_model_file=M --input_file=IN --output_file=OUT
  python -m data_pipeline.vocab.vocab_cli --mode=train_wordpiece --input_file='GLOB' --vocab_file=OUT --vocab_size=N
  python -m data_pipeline.vocab.vocab_cli --mode=train_spm --input_file='GLOB' --spm_model_prefix=P --vocab_size=N

Tokenizing writes one line of space-separated ids per input line (no special
tokens; a line that is not UTF-8 becomes an empty line). Paths may be local or
gs://. The work is data_pipeline.vocab.tokenizers' and data_pipeline.vocab.vocab_training's;
this module only parses flags (it sits above both, so neither imports the other
to offer a command line).
"""

from absl import flags
from absl import logging

from data_pipeline.vocab import tokenizers
from data_pipeline.vocab import vocab_training


def define_flags(flag_values=None):
  """Defines the CLI flags on `flag_values` (absl's global FLAGS by default).

  Called only by the CLI (or a test, on its own FlagValues), so that importing
  this module never registers flags that could clash with an importer's.
  """
  fv = flags.FLAGS if flag_values is None else flag_values
  flags.DEFINE_enum("mode", "tokenize", ["tokenize", "train_wordpiece", "train_spm"],
                    "tokenize a file, or train a WordPiece vocab / SentencePiece model.",
                    flag_values=fv)
  flags.DEFINE_string("input_file", None, "Text file to tokenize; glob(s) of training text.",
                      flag_values=fv)
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
  flags.DEFINE_integer("max_lines", None, "Training: read at most this many lines.",
                       flag_values=fv)
  flags.mark_flag_as_required("input_file", flag_values=fv)
  return fv


def run(fv) -> None:
  """Runs the CLI mode selected by parsed flag values `fv` (see module docstring)."""
  if fv.mode == "tokenize":
    if not fv.output_file:
      raise ValueError("--output_file is required with --mode=tokenize")
    tokenizer = tokenizers.load_tokenizer(vocab_file=fv.vocab_file,
                                          spm_model_file=fv.spm_model_file,
                                          do_lower_case=fv.do_lower_case)
    stats = tokenizers.tokenize_file(tokenizer, fv.input_file, fv.output_file, fv.batch_size)
    logging.info("tokenized %d lines into %s", stats["lines"], fv.output_file)
  elif fv.mode == "train_wordpiece":
    if not fv.vocab_file:
      raise ValueError("--vocab_file (the output vocab) is required with --mode=train_wordpiece")
    vocab_training.train_wordpiece_vocab(fv.input_file, fv.vocab_file, fv.vocab_size,
                                         do_lower_case=fv.do_lower_case, max_lines=fv.max_lines)
  else:
    if not fv.spm_model_prefix:
      raise ValueError("--spm_model_prefix is required with --mode=train_spm")
    vocab_training.train_sentencepiece(fv.input_file, fv.spm_model_prefix, fv.vocab_size,
                                       model_type=fv.spm_model_type,
                                       do_lower_case=fv.do_lower_case, max_lines=fv.max_lines)


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _flags = define_flags()
  app.run(lambda argv: run(_flags))
