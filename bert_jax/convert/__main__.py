r"""Command line: `python -m bert_jax.convert --input=CKPT --output=DIR --format=hf|own`.

Reads anything bert_jax.convert reads (a Hugging Face directory, an original
TF checkpoint, a bert_jax export or training workdir; local or gs://) and
writes it as a Hugging Face directory (safetensors) or our own orbax export.
"""

import sys

from absl import app
from absl import flags
from absl import logging
import jax

from bert_jax import convert
from host import paths

FLAGS = flags.FLAGS


def _define_flags() -> None:
  # Only when run as a program: importing this module (extract_features, the trainer, tests)
  # must not claim global flag names such as --vocab_file.
  flags.DEFINE_string("input", None, "Checkpoint to convert: HF directory, TF checkpoint "
                      "(directory or prefix), bert_jax export or training workdir.")
  flags.DEFINE_string("output", None, "Output directory.")
  flags.DEFINE_enum("format", None, ["hf", "own"], "Output format: Hugging Face directory "
                    "(safetensors) or bert_jax's own orbax checkpoint.")
  flags.DEFINE_string("vocab_file", None, "Vocabulary to ship with the output; overrides the "
                      "one found beside the input.")
  flags.DEFINE_enum("target", "auto", ["auto", "pretraining", "encoder"], "Which tree to "
                    "convert: auto keeps the pretraining heads when the input has them.")
  flags.DEFINE_bool("allow_missing_heads", False, "Initialise a pooler/MLM/NSP head the "
                    "input lacks instead of refusing (only with --target=pretraining).")
  flags.DEFINE_integer("vocab_multiple", None, "Pad the vocabulary rows to a multiple of this "
                       "(own format; the hf format always holds the true vocabulary).")


def main(argv):
  """Converts --input to --output."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax reports every save step at INFO.
  path = paths.path(FLAGS.input)
  try:
    params, config, vocab, kind, target = convert.load_checkpoint(
        path, FLAGS.target, FLAGS.allow_missing_heads, FLAGS.vocab_file, FLAGS.vocab_multiple)
    if FLAGS.format == "hf":
      out = convert.export_hf(params, config, FLAGS.output, vocab)
    else:
      out = convert.export_own(params, config, FLAGS.output, vocab)
  except ValueError as e:  # bad input: the message names the problem; no traceback needed.
    sys.exit(f"error: {e}")
  leaves = jax.tree.leaves(params)
  print(f"converted {kind} {path} -> {FLAGS.format} {out}\n"
        f"  model: {target} (L={config.num_hidden_layers}, H={config.hidden_size}, "
        f"A={config.num_attention_heads}, V={config.vocab_size}), {len(leaves)} tensors, "
        f"{sum(x.size for x in leaves):,} parameters\n"
        f"  vocab: {vocab if vocab else 'none (warning: the output has no vocab.txt)'}")


if __name__ == "__main__":
  _define_flags()
  flags.mark_flags_as_required(["input", "output", "format"])
  app.run(main)
