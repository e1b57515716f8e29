"""The modern encoder's CPU train step against transformers' PyTorch ModernBertForMaskedLM.

  python -m experiments.benchmarks.pretrain.modern_vs_transformers --size=modernbert-tiny \
      --batch=8 --seq_len=512 --vocab=8192

One MLM training step on each side, at the same shapes and the same network (our config
made from the reference's config.json by bert_jax.convert, as a checkpoint import does):
the masked-LM cross-entropy at 30% of the positions, its gradient, an AdamW update.

  ours        bert_jax.pretrain.steps.train_step, jitted (attention "auto": xla, the
              sliding layers through its blocked window path), float32
  reference   ModernBertForMaskedLM, attn_implementation "sdpa", sparse_prediction on
              (its MLM head on the masked positions only, as ours), torch.optim.AdamW,
              float32, torch threads = this process's CPU count

Rows are whole (no padding): transformers' sdpa path does not unpad, so padding would
cost both sides alike. Printed: the median step time of each (after --warmup steps),
their ratio, and the ratio of the FLOPs each executes per step (ours: XLA's cost
analysis of the compiled step; the reference: torch.utils.flop_counter over forward and
backward), so a speed ratio can be read against the work each side does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import numpy as np

from bert_jax.convert import modernbert as hf_modernbert
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.training import sharding
from experiments.configs import pretrain as pretrain_configs


def _reference_config(size: str, vocab: int):
  """A transformers ModernBertConfig with our size row's shape (random weights)."""
  import transformers  # pylint: disable=g-import-not-at-top  # the dev extra
  from bert_jax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  ours = BertConfig.from_size(size, vocab_size=vocab)
  # Special ids inside this vocabulary (the published ones are the 50k BPE's).
  fields = hf_modernbert.config_to_hf(ours, {"pad_token_id": 0, "bos_token_id": 1,
                                             "eos_token_id": 2, "cls_token_id": 1,
                                             "sep_token_id": 2})
  fields.update(attn_implementation="sdpa", sparse_prediction=True,
                max_position_embeddings=max(fields.get("max_position_embeddings", 0), 8192))
  return transformers.ModernBertConfig(**fields)


def _batch(vocab: int, batch: int, seq_len: int, ratio: float = 0.3, seed: int = 0):
  rng = np.random.default_rng(seed)
  predictions = round(ratio * seq_len)
  ids = rng.integers(5, vocab, (batch, seq_len)).astype(np.int32)
  positions = np.stack([np.sort(rng.choice(np.arange(1, seq_len), predictions, replace=False))
                        for _ in range(batch)]).astype(np.int32)
  labels = np.take_along_axis(ids, positions, 1)
  return ids, positions, labels


def time_reference(config, ids, positions, labels, steps: int, warmup: int):
  """(median seconds per step, FLOPs of one forward + backward) of the PyTorch side."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch.utils import flop_counter  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count() or 1)
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM(config).train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
  input_ids = torch.tensor(ids, dtype=torch.long)
  target = torch.full(input_ids.shape, -100, dtype=torch.long)
  rows = np.arange(len(ids))[:, None]
  target[rows, positions] = torch.tensor(labels, dtype=torch.long)
  mask = torch.ones_like(input_ids)

  def step():
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=input_ids, attention_mask=mask, labels=target).loss
    loss.backward()
    optimizer.step()

  counter = flop_counter.FlopCounterMode(display=False)
  with counter:
    step()
  times = []
  for i in range(warmup + steps):
    started = time.perf_counter()
    step()
    if i >= warmup:
      times.append(time.perf_counter() - started)
  return statistics.median(times), float(counter.get_total_flops())


def time_ours(config, bert_config, ids, positions, labels, steps: int, warmup: int):
  """(median seconds per step, XLA's FLOPs of the compiled step) of ours."""
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  programs = pretrain_steps.build(config, bert_config, mesh, seq_len=ids.shape[1],
                                  predictions=positions.shape[1])
  init_rng, dropout_rng = pretrain_steps.keys(config)
  batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
           "masked_lm_positions": positions, "masked_lm_ids": labels,
           "masked_lm_weights": np.ones(positions.shape, np.float32),
           "next_sentence_labels": np.zeros(len(ids), np.int32)}
  with sharding.activate(mesh, programs.rules):
    state = programs.layout.init(init_rng)
    batch = sharding.global_batch(batch, mesh)
    compiled = programs.train_step.lower(state, batch, dropout_rng).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    times = []
    for i in range(warmup + steps):
      started = time.perf_counter()
      state, metrics = programs.train_step(state, batch, dropout_rng)
      jax.block_until_ready(metrics)
      if i >= warmup:
        times.append(time.perf_counter() - started)
  return statistics.median(times), float(analysis["flops"])


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--size", default="modernbert-tiny")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq_len", type=int, default=512)
  parser.add_argument("--vocab", type=int, default=8192)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=2)
  args = parser.parse_args(argv)
  reference_config = _reference_config(args.size, args.vocab)
  bert_config = hf_modernbert.config_from_hf(reference_config.to_dict()).replace(
      dtype="float32", attention_impl="auto")
  config = pretrain_configs.get_config("modern")
  config.data.objective, config.phases, config.batch_warmup.tokens = "none", [], 0
  config.optimizer.update(name="adamw", schedule="polynomial", warmup_steps=0,
                          learning_rate=1e-4, weight_decay=0.01, grad_clip_norm=0.0)
  ids, positions, labels = _batch(args.vocab, args.batch, args.seq_len)
  ours, our_flops = time_ours(config, bert_config, ids, positions, labels, args.steps,
                              args.warmup)
  theirs, their_flops = time_reference(reference_config, ids, positions, labels, args.steps,
                                       args.warmup)
  print(f"{args.size} (L={bert_config.num_hidden_layers}, H={bert_config.hidden_size}, "
        f"window {bert_config.local_attention}), batch {args.batch} x {args.seq_len}, "
        f"vocab {args.vocab}, {jax.device_count()} x {jax.devices()[0].device_kind}")
  print("| side | s / step | tokens / s | executed GFLOP / step |\n|---|---:|---:|---:|")
  tokens = args.batch * args.seq_len
  print(f"| ours | {ours:.3f} | {tokens / ours:,.0f} | {our_flops / 1e9:,.1f} |")
  print(f"| transformers (sdpa) | {theirs:.3f} | {tokens / theirs:,.0f} | "
        f"{their_flops / 1e9:,.1f} |")
  print(f"speed ratio (theirs / ours): {theirs / ours:.2f}x; executed FLOPs ratio "
        f"(theirs / ours): {their_flops / our_flops:.2f}")


if __name__ == "__main__":
  main()
