"""Feature extraction, as google-research/bert's extract_features.py.

    python -m bert_jax.extract_features --input_file=in.txt --output_file=out.npz \
        --init_checkpoint=PATH [--vocab_file=vocab.txt] [--max_seq_length=128]

One input per line; a sentence pair is written `A ||| B`. PATH is anything
`bert_jax.convert.load_pretrained` reads (a Hugging Face directory, an original
TF checkpoint, this project's export or training workdir). The `.npz` holds
`sequence_output` [N, T, H], `pooled_output` [N, H], `mean_pooled` [N, H] (the
input-mask-weighted mean of the last layer, the sentence-transformers pooling)
and `input_ids` [N, T].
"""

from __future__ import annotations

import io
from typing import Sequence

from absl import app
from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import convert
from bert_jax.finetune.features import packing
from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from data_pipeline.vocab import tokenizers
from host import paths
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

PAIR_SEPARATOR = " ||| "


def read_inputs(path: str) -> list[tuple[str, str | None]]:
  """Reads one input (or `A ||| B` pair) per line; a bad line is an error naming it."""
  inputs = []
  with paths.open_binary(path) as f:
    for line_number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8").rstrip("\r\n")
      except UnicodeDecodeError as e:
        # Skipping would silently misalign rows of the output with lines of the input.
        raise ValueError(f"{path}:{line_number}: not valid UTF-8 ({e.reason})") from None
      if not line.strip():
        raise ValueError(f"{path}:{line_number}: empty line (every line is one input)")
      a, sep, b = line.partition(PAIR_SEPARATOR)
      inputs.append((a, b if sep else None))
  if not inputs:
    raise ValueError(f"{path}: no input lines")
  return inputs


def build_features(inputs, tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
  """Tokenizes and packs `[CLS] A [SEP] (B [SEP])` into padded int32 arrays."""
  specials = tokenizer.special_ids
  firsts = _tokenize(tokenizer, [a for a, _ in inputs])
  seconds = _tokenize(tokenizer, [b or "" for _, b in inputs])
  n = len(inputs)
  ids = np.full((n, max_seq_length), specials["pad"], np.int32)
  mask = np.zeros((n, max_seq_length), np.int32)
  segments = np.zeros((n, max_seq_length), np.int32)
  for i, ((_, b), a_ids, b_ids) in enumerate(zip(inputs, firsts, seconds)):
    # The layout and truncation rule of fine-tuning's inputs (google-research/bert's).
    tokens, types = packing.pack(a_ids, None if b is None else b_ids, cls=specials["cls"],
                                 sep=specials["sep"], max_length=max_seq_length)
    ids[i, :len(tokens)] = tokens
    mask[i, :len(tokens)] = 1
    segments[i, :len(tokens)] = types
  return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def _tokenize(tokenizer, texts: list[str]) -> list[list[int]]:
  return tokenizer.tokenize(tf.constant(texts, dtype=tf.string)).to_list()


def extract(params, config: model_lib.BertConfig, features: dict[str, np.ndarray],
            batch_size: int) -> dict[str, np.ndarray]:
  """Runs the encoder over `features` in batches; returns the output arrays."""
  model = heads.encoder_for(config)

  @jax.jit
  def forward(batch):
    sequence, pooled = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                                   batch["segment_ids"], deterministic=True)
    weights = batch["input_mask"][..., None].astype(sequence.dtype)
    mean = (sequence * weights).sum(1) / jnp.maximum(weights.sum(1), 1.0)
    return sequence, pooled, mean

  n = len(features["input_ids"])
  outputs = {"sequence_output": [], "pooled_output": [], "mean_pooled": []}
  for start in range(0, n, batch_size):
    batch = {k: v[start:start + batch_size] for k, v in features.items()}
    real = len(batch["input_ids"])
    if real < batch_size:  # Pad the last batch so forward compiles once.
      batch = {k: np.concatenate([v, np.zeros((batch_size - real,) + v.shape[1:], v.dtype)])
               for k, v in batch.items()}
    for key, value in zip(outputs, forward(batch)):
      outputs[key].append(np.asarray(value, np.float32)[:real])
  result = {k: np.concatenate(v) for k, v in outputs.items()}
  result["input_ids"] = features["input_ids"]
  return result


def run(input_file: str, output_file: str, init_checkpoint: str, vocab_file: str | None,
        do_lower_case: bool, max_seq_length: int, batch_size: int) -> dict[str, np.ndarray]:
  """Reads, tokenizes, encodes and writes `output_file`; returns what was written."""
  config, params, vocab = convert.load_pretrained(init_checkpoint, target="encoder",
                                                  vocab_file=vocab_file)
  if vocab is None:
    raise ValueError(f"{init_checkpoint} carries no vocab.txt or tokenizer.json: pass "
                     "--vocab_file")
  if max_seq_length > config.max_position_embeddings:
    raise ValueError(f"--max_seq_length={max_seq_length} exceeds the checkpoint's "
                     f"max_position_embeddings={config.max_position_embeddings}")
  tokenizer = tokenizers.load_tokenizer(vocab_file=str(vocab), do_lower_case=do_lower_case)
  features = build_features(read_inputs(input_file), tokenizer, max_seq_length)
  result = extract(params, config, features, batch_size)
  buffer = io.BytesIO()
  np.savez(buffer, **result)
  paths.write_atomic(output_file, buffer.getvalue())  # never half a file under the final name
  logging.info("wrote %d inputs to %s", len(features["input_ids"]), output_file)
  return result


def _define_flags() -> None:
  # Defined only when run as a program: importing this module (tests, other tools)
  # must not claim global flag names such as --vocab_file.
  flags.DEFINE_string("input_file", None, "Text file: one input per line, pairs as `A ||| B`.")
  flags.DEFINE_string("output_file", None, "Where to write the .npz.")
  flags.DEFINE_string("init_checkpoint", None, "Anything bert_jax.convert loads.")
  flags.DEFINE_string("vocab_file", None, "Overrides the vocab.txt carried by the checkpoint.")
  flags.DEFINE_bool("do_lower_case", True, "Uncased models (the default); False for cased.")
  flags.DEFINE_integer("max_seq_length", 128, "Tokens per input incl. [CLS]/[SEP].")
  flags.DEFINE_integer("batch_size", 32, "Inputs per forward pass.")
  flags.mark_flags_as_required(["input_file", "output_file", "init_checkpoint"])


def main(argv: Sequence[str]) -> None:
  del argv
  f = flags.FLAGS
  run(f.input_file, f.output_file, f.init_checkpoint, f.vocab_file, f.do_lower_case,
      f.max_seq_length, f.batch_size)


if __name__ == "__main__":
  _define_flags()
  app.run(main)
