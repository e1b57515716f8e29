r"""Tokens/s and MFU of the jitted pretraining train step, against transformers + optax.

Usage (the issue's figures: tiny and base at sequence length 128, this machine):

  python -m experiments.benchmarks.pretrain.train_step --sizes=tiny,base --seq_len=128 --batch=8

Rows per size (--rows), the same BertConfig, batch, dtype and optimizer:

  ours       the trainer's step, built by bert_jax.pretrain.steps.build (BertForPreTraining,
             MLM head on the masked positions only, AdamW chain of bert_jax.training.optim,
             jitted with donation); the paper recipe (attention dropout 0.1 on the einsum path,
             threefry dropout bits): like for like with the reference.
  ours_rbg   the same with config.rng_impl "rbg" (XLA's RngBitGenerator for the masks).
  ours_fast  the fast recipe (experiments/configs/pretrain.py:base_fast): attention
             dropout 0, so attention "auto" takes the fused kernel (XLA here), rbg.
  reference  transformers' FlaxBertForPreTraining (MLM logits on every position,
             gathered at the masked ones for the same loss), value_and_grad and the
             same optax optimizer, jitted with donation, paper dropout; skipped with a
             message without transformers 4's Flax BERT (the peers extra).

A step is the whole update: forward, backward, clipping, AdamW, parameter write. MFU
counts model FLOPs only, for both rows (the reference's logits on unmasked positions are
not credited); on a CPU pass --peak_tflops. The ratio line also prints the ratio of the
FLOPs the two steps execute. The rows' timed steps alternate and each reports its median
step, so the ratio holds when the load changes. Imports no TensorFlow, and transformers
only for the reference row. The method in full and the figures: experiments/results/speed.md.
"""

import argparse
import functools
import time

import importlib.util

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.pretrain import cost
from bert_jax.pretrain import losses
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.run import metrics_io
from bert_jax.training import optim
from bert_jax.training import sharding
from experiments.configs import pretrain


def make_batch(bert_config, batch: int, seq_len: int, predictions: int) -> dict:
  """A random batch with the pipeline's features and shapes."""
  rng = np.random.default_rng(0)
  positions = np.sort(np.stack([rng.choice(np.arange(1, seq_len), predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  return {
      "input_ids": rng.integers(5, bert_config.vocab_size, (batch, seq_len)).astype(np.int32),
      "input_mask": np.ones((batch, seq_len), np.int32),
      "segment_ids": (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32).repeat(batch, 0),
      "masked_lm_positions": positions,
      "masked_lm_ids": rng.integers(5, bert_config.vocab_size, (batch, predictions)).astype(
          np.int32),
      "masked_lm_weights": np.ones((batch, predictions), np.float32),
      "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32),
  }


def ours(bert_config, batch, rng_impl: str = "threefry"):
  """(step function, state) for the trainer's own step (bert_jax.pretrain.steps.build) on the
  base recipe's config (optimizer over 1000 steps), one device."""
  config = pretrain.get_config("base")
  config.total_steps, config.rng_impl = 1000, rng_impl
  config.batch_size = batch["input_ids"].shape[0]
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  programs = pretrain_steps.build(config, bert_config, mesh,
                                  seq_len=batch["input_ids"].shape[1],
                                  predictions=batch["masked_lm_positions"].shape[1])
  key = pretrain_steps.keys(config)[1]

  def step(state, b):
    with sharding.activate(mesh, programs.rules):
      return programs.train_step(state, b, key)
  return step, programs.layout.init(jax.random.key(0))


# Row name -> (BertConfig overrides, rng_impl) of our step.
OURS = {
    "ours": ({}, "threefry"),
    "ours_rbg": ({}, "rbg"),
    "ours_fast": ({"attention_probs_dropout_prob": 0.0}, "rbg"),
}


def reference(bert_config, tx, batch):
  """(step function, state) for transformers' FlaxBertForPreTraining with the same optax chain."""
  import transformers  # pylint: disable=g-import-not-at-top  # benchmark-only dependency
  hf_config = transformers.BertConfig(**{k: v for k, v in bert_config.to_hf_dict().items()
                                         if k not in ("architectures", "model_type")})
  hf = transformers.FlaxBertForPreTraining(hf_config, dtype=jnp.dtype(bert_config.dtype),
                                           _do_init=False)
  params = hf.init_weights(jax.random.key(0), batch["input_ids"].shape)

  def loss_fn(params, b, rng):
    out = hf(b["input_ids"], b["input_mask"], b["segment_ids"], params=params, dropout_rng=rng,
             train=True)
    mlm_logits = jnp.take_along_axis(out.prediction_logits,
                                     b["masked_lm_positions"][:, :, None], axis=1)
    mlm, _ = losses.masked_lm_loss(mlm_logits, b["masked_lm_ids"], b["masked_lm_weights"])
    return mlm + losses.nsp_loss(out.seq_relationship_logits, b["next_sentence_labels"])

  @functools.partial(jax.jit, donate_argnums=(0,))
  def step(state, b):
    params, opt_state, count = state
    loss, grads = jax.value_and_grad(loss_fn)(params, b, jax.random.fold_in(
        jax.random.key(1), count))
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state, count + 1), loss

  return step, (params, tx.init(params), jnp.zeros((), jnp.int32))


def flax_bert_available() -> bool:
  """Whether transformers with its Flax BERT (4.x; 5 removed Flax) is importable."""
  if importlib.util.find_spec("transformers") is None:
    return False
  import transformers  # pylint: disable=g-import-not-at-top  # benchmark-only dependency
  return hasattr(transformers, "FlaxBertForPreTraining")


def time_interleaved(rows: dict, batch: dict, steps: int) -> tuple[dict, dict]:
  """({name: median seconds per step}, {name: compile + first step seconds}).

  The rows' steps alternate (round r times row 1's step r, then row 2's, ...), so
  that a load which comes and goes on a shared machine falls on every row alike;
  the median drops a round that a burst of load hit.
  """
  batch = jax.device_put(batch)
  states, first, times = {}, {}, {name: [] for name in rows}
  for name, (step, state) in rows.items():
    start = time.perf_counter()
    states[name], out = step(state, batch)
    jax.block_until_ready(out)
    first[name] = time.perf_counter() - start
  for _ in range(steps):
    for name, (step, _) in rows.items():
      start = time.perf_counter()
      states[name], out = step(states[name], batch)
      jax.block_until_ready((states[name], out))
      times[name].append(time.perf_counter() - start)
  return {name: float(np.median(t)) for name, t in times.items()}, first


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default="tiny,base", help="rows of bert_jax.model.config.SIZES")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--predictions", type=int, default=20, help="masked positions per sequence")
  parser.add_argument("--dtype", default="float32", help="compute dtype (params stay float32)")
  parser.add_argument("--steps", type=int, default=5,
                      help="timed steps per row, interleaved across rows (median reported)")
  parser.add_argument("--rows", default="ours,ours_rbg,ours_fast,reference",
                      help=f"comma list of {(*OURS, 'reference')}")
  parser.add_argument("--peak_tflops", type=float, default=0.0,
                      help="peak TFLOP/s of all devices together (0: the device table)")
  args = parser.parse_args()
  opt_config = pretrain.get_config("base").optimizer
  peak = (args.peak_tflops * 1e12 if args.peak_tflops
          else metrics_io.peak_flops(0.0))
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; batch {args.batch} x "
        f"seq {args.seq_len}, {args.predictions} predictions, dtype {args.dtype}")
  rows = args.rows.split(",")
  for name in rows:
    if name not in (*OURS, "reference"):
      raise SystemExit(f"--rows: {name!r} is not one of {(*OURS, 'reference')}")
  if "reference" in rows and not flax_bert_available():
    print("reference row skipped: transformers' Flax BERT is not installed (it is the peers "
          "extra's, transformers<5: pip install -e '.[peers]' in an environment of its own)")
    rows.remove("reference")
  for size in args.sizes.split(","):
    base_config = model_lib.BertConfig.from_size(size, dtype=args.dtype)
    tx, _ = optim.make_optimizer(opt_config, total_steps=1000)
    batch = make_batch(base_config, args.batch, args.seq_len, args.predictions)
    # Useful work, the same for every row (the reference's unused logits are not credited).
    shapes = jax.eval_shape(lambda: heads.BertForPreTraining(base_config).init(
        jax.random.key(0), batch["input_ids"], batch["input_mask"], batch["segment_ids"],
        batch["masked_lm_positions"]))
    flops = cost.step_flops(base_config, nn.unbox(shapes["params"]), sequences=args.batch,
                            seq_len=args.seq_len, predictions=args.batch * args.predictions)
    built = {}
    for name in rows:
      if name == "reference":
        built[name] = reference(base_config, tx, batch)
      else:
        overrides, rng_impl = OURS[name]
        built[name] = ours(base_config.replace(**overrides), batch, rng_impl)
    seconds, first = time_interleaved(built, batch, args.steps)
    del built
    rates = {}
    for name in rows:
      rates[name] = args.batch * args.seq_len / seconds[name]
      mfu = f"{100 * flops / seconds[name] / peak:.1f}%" if peak else "n/a (peak unknown)"
      print(f"{size:5s} {name:9s} {rates[name]:10.0f} tokens/s  {seconds[name] * 1e3:8.1f} ms/step "
            f" {flops / seconds[name] / 1e9:7.1f} model GFLOP/s  MFU {mfu}  "
            f"(compile + first step {first[name]:.1f} s)", flush=True)
    if "reference" in rates:
      # The reference computes vocabulary logits at every position, ours at the
      # masked ones; the rest of both steps is the same matmuls in the same compiler,
      # so at equal efficiency the speed ratio is the FLOP ratio.
      executed = cost.step_flops(base_config, nn.unbox(shapes["params"]), sequences=args.batch,
                                 seq_len=args.seq_len, predictions=args.batch * args.seq_len)
      print(f"{size:5s} ratio to reference: " + ", ".join(
          f"{name} {rates[name] / rates['reference']:.2f}x" for name in rates
          if name != "reference")
          + f" (the FLOP ratio, {executed / flops:.2f}x, is what equal efficiency gives)",
          flush=True)


if __name__ == "__main__":
  main()
