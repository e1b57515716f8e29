r"""Writes a few pretraining batches to .npz and prints decoded examples with the masks visible.

  python -m data_pipeline.preview --config=experiments/configs/pretrain.py:tiny \
      --num_batches=4 --output=/tmp/batches.npz

--config is an experiment config (its ``data`` field is used, e.g.
experiments/configs/pretrain.py:tiny) or a data config itself
(experiments/configs/data.py). ``--corpus`` and ``--vocab_file`` override the
config, as do ``--config.data.<field>=...`` flags.

The .npz holds every batch feature (input_ids, input_mask, segment_ids,
masked_lm_positions, masked_lm_ids, masked_lm_weights, next_sentence_labels),
the batches concatenated along the example axis ([num_batches * batch_size, ...]).
In the printout each predicted position reads ``shown(original)``: ``[MASK](dog)``
is masked, ``cat(dog)`` a random replacement, ``dog(dog)`` a kept token.

The batches are a training run's first (data_pipeline.prepare.PretrainingData, one
process, a run of --num_batches steps), read through the same tokenized store
(data.tokenized_dir) the run reads, so a preview after a preparation reads no text.
"""

import io

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from data_pipeline import prepare
from host import paths


def _define_flags() -> None:
  # Only when run as a program: importing this module (tests) must not claim --config.
  config_flags.DEFINE_config_file("config", None, "experiment or data config file[:arg]")
  flags.mark_flag_as_required("config")
  flags.DEFINE_integer("num_batches", 2, "batches to write")
  flags.DEFINE_integer("batch_size", 8, "examples per batch")
  flags.DEFINE_string("output", "batches.npz", ".npz file to write")
  flags.DEFINE_integer("num_shown", 3, "examples to print")
  flags.DEFINE_string("corpus", None, "overrides data.corpus")
  flags.DEFINE_string("vocab_file", None, "overrides data.vocab_file")


def data_config_from(config):
  """The data config inside an experiment config (or the config itself)."""
  return config.data if "data" in config else config


def render(example: dict, tokenizer) -> str:
  """One example as text: tokens up to the padding, predictions as shown(original)."""
  length = int(example["input_mask"].sum())
  tokens = tokenizer.ids_to_tokens(example["input_ids"][:length])
  for position, original, weight in zip(example["masked_lm_positions"],
                                        example["masked_lm_ids"], example["masked_lm_weights"]):
    if weight > 0:
      tokens[position] = f"{tokens[position]}({tokenizer.ids_to_tokens([original])[0]})"
  return " ".join(tokens)


def write_preview(data_config, *, num_batches: int, batch_size: int, output: str,
                  num_shown: int) -> dict:
  """Writes the batches to ``output`` and prints ``num_shown`` decoded examples; returns the arrays."""
  data = prepare.PretrainingData.prepare(prepare.one_phase(data_config, num_batches),
                                         batch_size=batch_size, eval_batch_size=batch_size,
                                         total_steps=num_batches)
  source = data.train_input()
  batches = [next(source) for _ in range(num_batches)]
  source.close()
  arrays = {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  paths.write_atomic(output, buffer.getvalue())  # local or gs://
  print(f"wrote {num_batches} batches of {batch_size} to {output}: "
        + ", ".join(f"{k} {v.dtype}{list(v.shape)}" for k, v in arrays.items()))
  for i in range(min(num_shown, len(arrays["input_ids"]))):
    example = {key: value[i] for key, value in arrays.items()}
    print(f"\n--- example {i}: next_sentence_label={int(example['next_sentence_labels'])}, "
          f"{int(example['masked_lm_weights'].sum())} predictions")
    print(render(example, source.tokenizer))
  return arrays


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  fv = flags.FLAGS
  data_config = data_config_from(fv.config)
  if fv.corpus is not None:
    data_config.corpus = fv.corpus
  if fv.vocab_file is not None:
    data_config.vocab_file = fv.vocab_file
  write_preview(data_config, num_batches=fv.num_batches, batch_size=fv.batch_size,
                output=fv.output, num_shown=fv.num_shown)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
