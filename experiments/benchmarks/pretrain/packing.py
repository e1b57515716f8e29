"""Packed documents against padded ones, and sliding against full attention, on this CPU.

  python -m experiments.benchmarks.pretrain.packing --lengths=512,1024,2048

Three tables, on the embedded corpus's documents (the `modern` variant's data: its
8,192-entry vocabulary, the training split) and the modern tiny encoder:

1. Real tokens over computed tokens at each length. Packed: objective "documents"
   (data_pipeline/examples/documents.py: best fit over data.pack_window rows within each
   shuffle block, as the pipeline packs), filled (data.pack_fill, the default: every row
   filled to its end, blocks of shuffle_buffer rows' tokens) and unfilled (rows close
   with room, blocks of shuffle_buffer documents). Padded: one document per row ([CLS]
   doc [SEP], a longer one cut into pieces), the rest padding. With each packing, the
   pieces per document: 1 where no document is cut; above it, long documents' cuts
   (both) and filling's cuts at row ends (the difference).
2. The train step's time per real token, packed against padded: the same jitted step of
   the modern tiny at batch x length tokens (packed rows with their document ids and
   positions, padded rows without), divided by the real tokens a batch of each holds on
   average (table 1).
3. How the step time grows with the length at a fixed number of tokens per batch
   (--tokens): every layer global (full) against ModernBERT's pattern with only layer 0
   global (sliding, a --window-token window): full attention's work per token grows with
   the length, the window's does not (xla's blocked path, bert_jax.model.attention).

Each step is timed --steps times after a compiling call; the median is printed. Figures
on shared CPUs are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from bert_jax.model.config import BertConfig
from bert_jax.pretrain import phases
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.training import sharding
from data_pipeline import prepare
from data_pipeline.examples import documents
from experiments.configs import pretrain as pretrain_configs


def corpus_and_specials():
  """(config, tokenized training documents, special ids, vocabulary size) of the modern
  variant."""
  config = pretrain_configs.get_config("modern")
  data = prepare.PretrainingData.prepare(phases.of(config)[:1], batch_size=config.batch_size,
                                         eval_batch_size=config.eval_batch_size,
                                         total_steps=config.total_steps)
  corpus = data._corpus(config.data, "train")  # pylint: disable=protected-access
  return config, corpus, data.tokenizer.special_ids, data.vocab_size


def packings(corpus, length: int, window: int, block: int, *, filled: bool,
             specials: dict):
  """(packed real / computed tokens, packed pieces per document, padded real / computed,
  the first block's packed rows), over every document in corpus order, blocks as the
  pipeline cuts them."""
  order = np.arange(corpus.num_documents)
  rows = []
  if filled:
    stream = int(documents.stream_costs(corpus, order).sum())
    for lo in range(0, stream, block * length):
      pieces = documents.block_pieces(corpus, order, (lo, lo + block * length),
                                      cls_id=specials["cls"], sep_id=specials["sep"])
      rows.append(documents.filled_rows(pieces, max_seq_length=length, window=window))
  else:
    for start in range(0, corpus.num_documents, block):
      rows.append(documents.packed_rows(corpus, order[start:start + block],
                                        max_seq_length=length, window=window))
  every = [r for block_rows in rows for r in block_rows]
  packed = documents.efficiency(every, length)
  per_document = sum(len(r.pieces) for r in every) / corpus.num_documents
  padded_used = padded_rows = 0
  for d in order:
    pieces = documents.pieces_of(corpus, int(d), length)
    padded_used += sum(len(p) + 2 for p in pieces)
    padded_rows += len(pieces)
  return packed, per_document, padded_used / (padded_rows * length), rows[0]


def _batch(rows, length: int, batch: int, specials: dict, packed: bool, predictions: int):
  """A training batch of `batch` filled rows, or each row's first piece alone."""
  if not packed:
    rows = [documents.Row([r.pieces[0]], len(r.pieces[0])) for r in rows]
  arrays = documents.assemble(rows[:batch], max_seq_length=length, cls_id=specials["cls"],
                              sep_id=specials["sep"], pad_id=specials["pad"], wrapped=False)
  rng = np.random.default_rng(0)
  out = {"input_ids": arrays["input_ids"],
         "input_mask": (arrays["input_ids"] != specials["pad"]).astype(np.int32),
         "segment_ids": arrays["segment_ids"],
         "masked_lm_positions": np.sort(rng.integers(1, length, (batch, predictions)), 1)
                                .astype(np.int32),
         "masked_lm_ids": rng.integers(5, 100, (batch, predictions)).astype(np.int32),
         "masked_lm_weights": np.ones((batch, predictions), np.float32),
         "next_sentence_labels": arrays["next_sentence_labels"]}
  if packed:
    out.update({k: arrays[k] for k in (documents.DOCUMENT_IDS, documents.POSITION_IDS)})
  return out


def step_time(config, bert_config: BertConfig, batch: dict, steps: int) -> float:
  """Median seconds of the run's jitted train step on `batch` (after one compiling call)."""
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  programs = pretrain_steps.build(config, bert_config, mesh, seq_len=batch["input_ids"].shape[1],
                                  predictions=batch["masked_lm_ids"].shape[1])
  init_rng, dropout_rng = pretrain_steps.keys(config)
  with sharding.activate(mesh, programs.rules):
    state = programs.layout.init(init_rng)
    global_batch = sharding.global_batch(batch, mesh)
    state, metrics = programs.train_step(state, global_batch, dropout_rng)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(steps):
      started = time.perf_counter()
      state, metrics = programs.train_step(state, global_batch, dropout_rng)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - started)
  return float(np.median(times))


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--lengths", default="512,1024,2048")
  parser.add_argument("--batch", type=int, default=4, help="rows per step in table 2")
  parser.add_argument("--tokens", type=int, default=8192, help="tokens per step in table 3")
  parser.add_argument("--window", type=int, default=128, help="table 3's sliding window")
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--tables", default="1,2,3", help="which tables to print")
  args = parser.parse_args(argv)
  tables = {int(t) for t in args.tables.split(",")}
  lengths = [int(x) for x in args.lengths.split(",")]
  config, corpus, specials, vocab_size = corpus_and_specials()
  config.data.objective = "documents"
  bert_config = pretrain_steps.network(config, vocab_size)
  print(f"corpus: {corpus.num_documents:,} documents, {corpus.num_tokens:,} tokens; "
        f"pack window {config.data.pack_window} rows, shuffle blocks of "
        f"{config.data.shuffle_buffer} documents (filled: rows)")
  if 1 in tables:
    print("\n| length | real / computed, filled | unfilled | padded | pieces per document, "
          "filled | unfilled |\n|---:|---:|---:|---:|---:|---:|")
  for length in lengths if 1 in tables else ():
    fill, room = (packings(corpus, length, config.data.pack_window,
                           config.data.shuffle_buffer, filled=f, specials=specials)
                  for f in (True, False))
    print(f"| {length} | {fill[0]:.4f} | {room[0]:.4f} | {fill[2]:.4f} | {fill[1]:.4f} | "
          f"{room[1]:.4f} |")
  if 2 in tables:
    print("\n| length | real / computed, packed | padded | step s, packed | padded | "
          "s per 1k real tokens, packed | padded |\n|---:|---:|---:|---:|---:|---:|---:|")
  for length in lengths if 2 in tables else ():
    packed_eff, _, padded_eff, rows = packings(corpus, length, config.data.pack_window,
                                               config.data.shuffle_buffer, filled=True,
                                               specials=specials)
    predictions = round(0.3 * length)
    times = {}
    for packed in (True, False):
      batch = _batch(rows, length, args.batch, specials, packed, predictions)
      times[packed] = step_time(config, bert_config, batch, args.steps)
    per = {p: 1000 * times[p] / (args.batch * length * (packed_eff if p else padded_eff))
           for p in times}
    print(f"| {length} | {packed_eff:.4f} | {padded_eff:.4f} | {times[True]:.3f} | "
          f"{times[False]:.3f} | {per[True]:.4f} | {per[False]:.4f} |")
  if 3 in tables:
    print(f"\n| length | rows x length | step s, full attention | sliding ({args.window}) | "
          "full / sliding |\n|---:|---:|---:|---:|---:|")
  for length in lengths if 3 in tables else ():
    rows_per = max(1, args.tokens // length)
    rows = packings(corpus, length, config.data.pack_window, config.data.shuffle_buffer,
                    filled=True, specials=specials)[3]
    batch = _batch(rows, length, rows_per, specials, True, round(0.3 * length))
    full = step_time(config, bert_config.replace(global_attn_every_n_layers=1), batch,
                     args.steps)
    sliding = step_time(config, bert_config.replace(
        global_attn_every_n_layers=bert_config.num_hidden_layers + 1,
        local_attention=args.window), batch, args.steps)
    print(f"| {length} | {rows_per} x {length} | {full:.3f} | {sliding:.3f} | "
          f"{full / sliding:.2f} |")


if __name__ == "__main__":
  main()
