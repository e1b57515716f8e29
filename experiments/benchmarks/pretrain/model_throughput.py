"""Forward+backward throughput of our BertForPreTraining against transformers' Flax BERT.

Usage (the issue's figure: base model, sequence length 128, on this machine):

  python -m experiments.benchmarks.pretrain.model_throughput --size=base --batch=8 --seq_len=128

One training step is timed: the pretraining loss (masked-LM + NSP cross-entropy) and
its gradient with respect to every parameter, dropout on, jitted, after a warm-up
call that compiles. Three rows, with identical config, batch, dtype and number of
masked predictions:

  ours (gathered MLM)  our model as trained: the MLM head only at masked_lm_positions.
  ours (full MLM)      our model with the MLM head on every position, then gathered:
                       the same work as the reference, so this row compares the code.
  reference            transformers' FlaxBertForPreTraining, which always computes
                       MLM logits on every position; the loss gathers the masked ones.

The reference needs transformers 4's Flax BERT: the peers extra, in an environment of its
own (docs/install.md). Figures on shared CPUs are noisy: other processes take cores. Compare the ratios of
one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model.encoder import BertConfig
from bert_jax.model.heads import BertForPreTraining
from bert_jax.pretrain import losses


def _batch(cfg: BertConfig, batch: int, seq_len: int, predictions: int, seed: int = 0) -> dict:
  """A random pretraining batch with the google-research/bert features."""
  rng = np.random.default_rng(seed)
  positions = np.stack([np.sort(rng.choice(np.arange(1, seq_len), predictions, replace=False))
                        for _ in range(batch)]).astype(np.int32)
  seg = np.zeros((batch, seq_len), np.int32)
  seg[:, seq_len // 2:] = 1
  return {
      "input_ids": rng.integers(0, cfg.vocab_size, (batch, seq_len)).astype(np.int32),
      "input_mask": np.ones((batch, seq_len), np.int32),
      "segment_ids": seg,
      "masked_lm_positions": positions,
      "masked_lm_ids": rng.integers(0, cfg.vocab_size, (batch, predictions)).astype(np.int32),
      "masked_lm_weights": np.ones((batch, predictions), np.float32),
      "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32),
  }


def _gather(logits, positions):
  return jnp.take_along_axis(logits, positions[:, :, None], axis=1)


def _ours(cfg: BertConfig, batch: dict, full_mlm: bool):
  """(jitted loss-and-grad step, params) for our model."""
  model = BertForPreTraining(cfg)
  b = batch

  def loss(params, rng):
    positions = None if full_mlm else b["masked_lm_positions"]
    out = model.apply({"params": params}, b["input_ids"], b["input_mask"], b["segment_ids"],
                      positions, deterministic=False, rngs={"dropout": rng})
    if full_mlm:
      out = {**out, "mlm_logits": _gather(out["mlm_logits"], b["masked_lm_positions"])}
    return losses.pretraining_loss(out, b)[0]

  params = jax.jit(lambda: model.init(jax.random.key(0), b["input_ids"], b["input_mask"],
                                      b["segment_ids"], b["masked_lm_positions"]))()["params"]
  return jax.jit(jax.value_and_grad(loss)), params


def _reference(cfg: BertConfig, batch: dict):
  """(jitted loss-and-grad step, params) for transformers' FlaxBertForPreTraining."""
  import transformers  # the peers extra (transformers<5: its Flax BERT), benchmark-only
  hf_config = transformers.BertConfig(**cfg.to_hf_dict())
  ref = transformers.FlaxBertForPreTraining(hf_config, dtype=cfg.compute_dtype, seed=0)
  b = batch

  def loss(params, rng):
    out = ref.module.apply({"params": params}, b["input_ids"], b["input_mask"],
                           b["segment_ids"], jnp.broadcast_to(
                               jnp.arange(b["input_ids"].shape[1]), b["input_ids"].shape),
                           None, deterministic=False, rngs={"dropout": rng})
    logits = {"mlm_logits": _gather(out.prediction_logits.astype(jnp.float32),
                                    b["masked_lm_positions"]),
              "nsp_logits": out.seq_relationship_logits.astype(jnp.float32)}
    return losses.pretraining_loss(logits, b)[0]

  return jax.jit(jax.value_and_grad(loss)), ref.params


def _time(step, params, steps: int) -> tuple[float, float, float]:
  """(compile+first call seconds, mean step seconds, loss) for a jitted step."""
  rng = jax.random.key(1)
  start = time.perf_counter()
  loss, grads = step(params, rng)
  jax.block_until_ready((loss, grads))
  first = time.perf_counter() - start
  start = time.perf_counter()
  for i in range(steps):
    loss, grads = step(params, jax.random.fold_in(rng, i))
  jax.block_until_ready((loss, grads))
  return first, (time.perf_counter() - start) / steps, float(loss)


def main(argv=None) -> None:
  """Parses flags, times the three variants and prints tokens/s and ratios."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="base", help="tiny|mini|small|medium|base|large")
  p.add_argument("--batch", type=int, default=8, help="sequences per step")
  p.add_argument("--seq_len", type=int, default=128, help="tokens per sequence")
  p.add_argument("--dtype", default="float32", help="compute dtype: float32|bfloat16")
  p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up call")
  p.add_argument("--predictions", type=int, default=20,
                 help="masked positions per sequence (google-research/bert: 20 at length 128)")
  p.add_argument("--skip_reference", action="store_true", help="time our model only")
  args = p.parse_args(argv)

  cfg = BertConfig.from_size(args.size, dtype=args.dtype)
  batch = _batch(cfg, args.batch, args.seq_len, args.predictions)
  tokens = args.batch * args.seq_len
  print(f"{args.size} (L={cfg.num_hidden_layers}, H={cfg.hidden_size}, A="
        f"{cfg.num_attention_heads}), batch {args.batch} x {args.seq_len}, dtype {args.dtype}, "
        f"{args.predictions} predictions/seq, dropout on, {args.steps} timed steps; "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s)")
  variants = [("ours (gathered MLM)", lambda: _ours(cfg, batch, full_mlm=False)),
              ("ours (full MLM)", lambda: _ours(cfg, batch, full_mlm=True))]
  if not args.skip_reference:
    variants.append(("reference (transformers)", lambda: _reference(cfg, batch)))
  results = {}
  for name, build in variants:
    step, params = build()
    first, per_step, loss = _time(step, params, args.steps)
    results[name] = tokens / per_step
    print(f"  {name:26s} {results[name]:9.1f} tokens/s  ({per_step:.2f} s/step, "
          f"compile+first {first:.1f} s, loss {loss:.3f})", flush=True)
    del step, params
  ref = results.get("reference (transformers)")
  if ref:
    for name in ("ours (gathered MLM)", "ours (full MLM)"):
      print(f"  ratio {name} / reference: {results[name] / ref:.2f}")


if __name__ == "__main__":
  main()
