r"""The real pretraining step on this machine's accelerators: seq/s, MFU, memory, compile time.

  python -m experiments.benchmarks.pretrain.accelerator --quick        # < 6 min on one GPU
  python -m experiments.benchmarks.pretrain.accelerator --size=large --seq_len=512 --budget_s=1800
  python -m experiments.benchmarks.pretrain.accelerator --size=tiny --budget_s=60   # CPU smoke run

Each row compiles and times the pretraining train step exactly as the trainer runs it
(bert_jax.preflight.compile.lower_train_step, from experiments/configs/pretrain.py:base
with the row's network) on synthetic batches of the real shapes, sweeping attention x
remat policy x per-device batch, in that order, until --budget_s runs out:

  attention  auto    the fast recipe (attention dropout 0): the fused kernel auto picks
             paper   the paper recipe: attention dropout 0.1 through the einsum path
             einsum|xla|cudnn|splash   that kernel, attention dropout 0
  remat      a key of bert_jax.model.config.REMAT_POLICIES

Reported per row, as JSON lines to --output and a table at the end: step time, seq/s,
tokens/s, model TFLOP/s, MFU against the device's peak and against a bf16 matmul rate
measured at the start, memory, the activations the backward pass keeps (--kept_only
counts them alone, compiling nothing) and compile time; a row that fails is recorded
with its error. Only the jax stack and bert_jax modules that need no more are imported
(no TensorFlow, no transformers). --tf_check (on wherever JAX sees an accelerator)
checks in a child process that host.tf_cpu leaves TensorFlow no GPU or TPU.
Targets on one NVIDIA H200 (bf16, fast recipe): BERT-Base @128 >= 5,000 seq/s,
BERT-Large @512 >= 400 seq/s. The method in full: experiments/results/speed.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import math
import os
import re
import subprocess
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.preflight import compile as preflight_compile
from bert_jax.pretrain import cost
from bert_jax.run import metrics_io
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from experiments.configs import pretrain

ATTENTION = ("auto", "paper", "einsum", "xla", "cudnn", "splash")
# Per-device batches swept by default, by (size, sequence length) and platform kind.
DEFAULT_BATCHES = {
    ("tiny", 128): (8, 32), ("base", 128): (64, 128, 256), ("base", 512): (16, 32),
    ("large", 128): (32, 64, 128), ("large", 512): (16, 32, 64),
}
CPU_BATCHES = {"tiny": (8,), "base": (8,), "large": (4,)}
# --quick: the two target shapes, fast recipe, two batch sizes each.
QUICK = (("base", 128, (256, 512)), ("large", 512, (32, 64)))
VOCAB_SIZE = 30522


# Run in a child so that this process never imports TensorFlow. JAX first, as in the
# trainers: it takes its devices, then the pipeline's TensorFlow must see none of them.
_TF_CHECK = """
import json, jax
jax_devices = [d.platform for d in jax.devices()]
try:
  from host.tf_cpu import tf
except ImportError as e:
  print(json.dumps({"tensorflow": None, "why": str(e)})); raise SystemExit
int(tf.constant(1) + 1)  # TensorFlow initialised and ran an op
print(json.dumps({"tensorflow": tf.__version__, "jax_devices": jax_devices,
                  "tf_visible": {k: len(tf.config.get_visible_devices(k)) for k in ("GPU", "TPU")},
                  "tf_physical": {k: len(tf.config.list_physical_devices(k)) for k in ("GPU", "TPU")}}))
"""


def tensorflow_check() -> dict:
  """What TensorFlow sees after host.tf_cpu, beside JAX's devices; "ok" is whether
  it sees no GPU or TPU while JAX keeps every device it had."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
      "PYTHONPATH")]))}
  done = subprocess.run([sys.executable, "-c", _TF_CHECK], cwd=root, env=env,
                        capture_output=True, text=True, timeout=600)
  if done.returncode:
    return {"ok": False, "error": done.stderr.strip().splitlines()[-1:]}
  found = json.loads(done.stdout.strip().splitlines()[-1])
  if found["tensorflow"] is None:  # an image with the jax stack only: nothing to hide
    return {"ok": True, **found}
  want = [d.platform for d in jax.devices()]
  found["ok"] = not any(found["tf_visible"].values()) and found["jax_devices"] == want
  return found


def describe_tensorflow_check(found: dict) -> str:
  """One line for the terminal."""
  if found.get("error"):
    return f"TensorFlow check FAILED to run: {found['error']}"
  if found.get("tensorflow") is None:
    return f"TensorFlow check: not installed ({found.get('why')}), nothing to hide"
  return (f"TensorFlow check {'ok' if found['ok'] else 'FAILED'}: after host.tf_cpu, "
          f"TensorFlow {found['tensorflow']} sees GPU {found['tf_visible']['GPU']}, "
          f"TPU {found['tf_visible']['TPU']} (physical: GPU {found['tf_physical']['GPU']}, "
          f"TPU {found['tf_physical']['TPU']}); JAX keeps {len(found['jax_devices'])} x "
          f"{sorted(set(found['jax_devices']))}")


def matmul_rate(dtype, seconds: float = 2.0) -> float:
  """FLOP/s of one square matmul on the first device (the achievable peak, measured)."""
  n = 8192 if jax.default_backend() != "cpu" else 1024
  a = jax.device_put(jnp.ones((n, n), dtype))
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds or count < 3:
    out = f(a)
    count += 1
  out.block_until_ready()
  return 2 * n ** 3 * count / (time.perf_counter() - start)


_RESIDUAL = re.compile(r"(bool|(?:bf|f|i|u)\d+)\[([\d,]*)\]")
_SHORT_DTYPES = {"bf": "bfloat", "f": "float", "i": "int", "u": "uint"}


def saved_activations(loss, *args) -> list[tuple[int, str]]:
  """(bytes, jax's description) of each activation the backward pass of `loss` keeps:
  what a remat policy trades for recomputation, counted from the traced program (so
  the same on every device and compiler). Arguments, literals and constants (the
  parameters, the batch) are left out; so are PRNG keys (a few words each)."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    jax.ad_checkpoint.print_saved_residuals(loss, *args)
  rows = []
  for line in out.getvalue().splitlines():
    if any(f"from {what}" in line for what in ("the argument", "a literal", "a constant")):
      continue
    match = _RESIDUAL.match(line)
    if match is None:
      continue
    name, dims = match.groups()
    if name != "bool":
      prefix = re.match(r"[a-z]+", name).group(0)
      name = _SHORT_DTYPES[prefix] + name[len(prefix):]
    size = math.prod(int(d) for d in dims.split(",") if d)
    rows.append((size * jnp.dtype(name).itemsize, line))
  return rows


def _kept_gib(cfg: model_lib.BertConfig, per_device: int, seq_len: int, predictions: int
              ) -> float:
  """Activations kept for the backward pass of one device's share of the batch, GiB.

  The network alone (no optimizer, no shardings, nothing lowered): its parameter
  shapes from bert_jax.pretrain.cost.abstract_params, so --kept_only stays a matter of seconds.
  """
  model = heads.BertForPreTraining(cfg)
  host = synthetic_batch(per_device, seq_len, predictions)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in host.items()}
  params = cost.abstract_params(cfg, nsp_head=True)

  def loss(params, batch):
    out = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                      batch["segment_ids"], batch["masked_lm_positions"], deterministic=False,
                      rngs={"dropout": jax.random.key(0)})
    return sum(logits.sum() for logits in out.values())

  return sum(b for b, _ in saved_activations(loss, params, batch)) / 2 ** 30


def synthetic_batch(batch: int, seq_len: int, predictions: int, seed: int = 0) -> dict:
  """A host batch with the pipeline's features and shapes (random tokens, unique positions)."""
  rng = np.random.default_rng(seed)
  positions = np.sort(rng.random((batch, seq_len - 1)).argsort(axis=1)[:, :predictions] + 1,
                      axis=1).astype(np.int32)
  return {
      "input_ids": rng.integers(5, VOCAB_SIZE, (batch, seq_len)).astype(np.int32),
      "input_mask": np.ones((batch, seq_len), np.int32),
      "segment_ids": (np.arange(seq_len)[None] >= seq_len // 2).astype(np.int32).repeat(batch, 0),
      "masked_lm_positions": positions,
      "masked_lm_ids": rng.integers(5, VOCAB_SIZE, (batch, predictions)).astype(np.int32),
      "masked_lm_weights": np.ones((batch, predictions), np.float32),
      "next_sentence_labels": rng.integers(0, 2, (batch,)).astype(np.int32),
  }


def bert_config(size: str, attention: str, remat: str, dtype: str, scan: bool
                ) -> model_lib.BertConfig:
  """The row's network: "paper" is einsum with attention dropout 0.1, the rest drop nothing."""
  paper = attention == "paper"
  return model_lib.BertConfig.from_size(
      size, vocab_size=VOCAB_SIZE, vocab_multiple=128, dtype=dtype,
      attention_impl="einsum" if paper else attention,
      attention_probs_dropout_prob=0.1 if paper else 0.0, remat_policy=remat, scan_layers=scan)


def step_config(global_batch: int, rng_impl: str) -> ml_collections.ConfigDict:
  """What bert_jax.preflight.compile.lower_train_step reads for a row: experiments/configs/pretrain.py
  (base) as the trainer gets it (optimizer, NSP head, logical axis rules, a data-parallel
  mesh over every device, no accumulation, no non-finite skipping), with the row's batch."""
  config = pretrain.get_config("base")
  config.batch_size = global_batch
  config.rng_impl = rng_impl
  config.total_steps = 100_000  # the LR schedule's length: no bearing on a step's cost
  return config


def run_row(row: dict, args, peak: float | None, measured: float) -> dict:
  """Compiles and times one configuration; returns the row with its figures."""
  cfg = bert_config(row["size"], row["attention"], row["remat"], args.dtype, row["scan"])
  seq_len, per_device = row["seq_len"], row["batch_per_device"]
  predictions = math.ceil(0.15 * seq_len)
  global_batch = per_device * jax.device_count()
  row.update(attention_impl=_resolved(cfg, seq_len), global_batch=global_batch,
             predictions=predictions, dtype=args.dtype, rng_impl=args.rng_impl,
             kept_gib=_kept_gib(cfg, per_device, seq_len, predictions))
  if args.kept_only:
    return row
  config = step_config(global_batch, args.rng_impl)
  mesh, _ = state_lib.setup_mesh(config)
  start = time.perf_counter()
  # The trainer's model, optimizer, shardings and jit, on abstract arrays (the one copy).
  step = preflight_compile.lower_train_step(config, cfg, mesh, seq_len, predictions)
  compiled = step.lowered.compile()
  row["compile_s"] = time.perf_counter() - start
  layout = step.layout
  row["memory_gib"] = _compiled_gib(compiled)
  flops = cost.step_flops(cfg, layout.abstract_params, sequences=global_batch, seq_len=seq_len,
                          predictions=global_batch * predictions)
  row["model_tflop_per_step"] = flops / 1e12
  if args.compile_only:
    return row
  # The key the step was lowered for: the trainer's, from config.seed in config.rng_impl.
  rng = state_lib.dropout_key(jax.random.PRNGKey(config.seed), config.rng_impl)
  state = layout.init(jax.random.key(0))
  batch = sharding.global_batch(synthetic_batch(global_batch, seq_len, predictions), mesh)
  for _ in range(args.warmup_steps):
    state, _ = compiled(state, batch, rng)
  jax.block_until_ready(state)  # --warmup_steps=0 is allowed: nothing to wait for but state
  start = time.perf_counter()
  for _ in range(args.steps):
    state, metrics = compiled(state, batch, rng)
  jax.block_until_ready((state, metrics))
  seconds = (time.perf_counter() - start) / args.steps
  if not np.isfinite(float(metrics["loss"])):
    raise FloatingPointError(f"non-finite loss {float(metrics['loss'])}")
  rate = flops / seconds
  row.update(step_ms=1e3 * seconds, seq_per_s=global_batch / seconds,
             tokens_per_s=global_batch * seq_len / seconds, model_tflops=rate / 1e12,
             mfu_peak=rate / peak if peak else None,
             mfu_measured=rate / (measured * jax.device_count()),
             device_peak_gib=_device_peak_gib(), loss=float(metrics["loss"]))
  return row


def _resolved(cfg: model_lib.BertConfig, seq_len: int) -> str:
  """The kernel training runs through (or the reason it cannot)."""
  from bert_jax.model import attention  # pylint: disable=g-import-not-at-top
  try:
    return attention.resolve(cfg.attention_impl, dtype=cfg.compute_dtype, head_size=cfg.head_size,
                             dropout_rate=cfg.attention_probs_dropout_prob, training=True,
                             seq_len=seq_len)
  except ValueError as e:
    return f"refused: {e}"


def _compiled_gib(compiled) -> float | None:
  try:
    m = compiled.memory_analysis()
    used = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)
    return used / 2 ** 30
  except Exception:  # pylint: disable=broad-except  # not every backend reports it
    return None


def _device_peak_gib() -> float | None:
  stats = jax.devices()[0].memory_stats() or {}
  peak = stats.get("peak_bytes_in_use")
  return peak / 2 ** 30 if peak is not None else None


def plan(args) -> list[dict]:
  """The rows to run, in order of priority."""
  cpu = jax.default_backend() == "cpu"
  if args.quick:
    return [dict(size=size, seq_len=seq, attention="auto", remat="none", batch_per_device=b,
                 scan=_scan(args, size))
            for size, seq, batches in QUICK for b in batches]
  if args.batch:
    batches = tuple(int(b) for b in args.batch.split(","))
  elif cpu:
    batches = CPU_BATCHES.get(args.size, (4,))
  else:
    batches = DEFAULT_BATCHES.get((args.size, args.seq_len), (16, 32))
  attention = args.attention.split(",") if args.attention else (
      ["auto", "paper"] if cpu else ["auto", "paper", "xla"])
  remat = args.remat.split(",") if args.remat else (
      ["none", "full"] if cpu else ["none", "save_qkv_out_proj", "full"])
  for name in attention:
    if name not in ATTENTION:
      raise SystemExit(f"--attention: {name!r} is not one of {ATTENTION}")
  for name in remat:
    if name not in model_lib.REMAT_POLICIES:
      raise SystemExit(f"--remat: {name!r} is not one of {tuple(model_lib.REMAT_POLICIES)}")
  scans = (False, True) if args.scan_layers == "both" else (_scan(args, args.size),)
  return [dict(size=args.size, seq_len=args.seq_len, attention=a, remat=r, batch_per_device=b,
               scan=s) for a in attention for r in remat for s in scans for b in batches]


def _scan(args, size: str) -> bool:
  if args.scan_layers in ("true", "false"):
    return args.scan_layers == "true"
  return size == "large"  # as experiments/configs/pretrain.py: scanned where compiles are long


def table(rows: list[dict]) -> str:
  """The rows as a fixed-width text table."""
  head = (f"{'size':5} {'seq':>4} {'attention':10} {'kernel':7} {'remat':17} {'scan':4} "
          f"{'batch':>5} {'step ms':>8} {'seq/s':>8} {'tok/s':>9} {'TFLOP/s':>7} {'MFU pk':>6} "
          f"{'MFU mm':>6} {'mem GiB':>7} {'kept GiB':>8} {'compile':>7}")
  lines = [head]
  for r in rows:
    if r.get("status") != "ok":
      lines.append(f"{r['size']:5} {r['seq_len']:4d} {r['attention']:10} {'':7} {r['remat']:17} "
                   f"{str(r['scan'])[0]:4} {r['batch_per_device']:5d} {r.get('status', '')[:80]}")
      continue
    pct = lambda x: f"{100 * x:5.1f}%" if x is not None else "   n/a"
    num = lambda x, f: format(x, f) if x is not None else "n/a"
    lines.append(
        f"{r['size']:5} {r['seq_len']:4d} {r['attention']:10} {r['attention_impl'][:7]:7} "
        f"{r['remat']:17} {str(r['scan'])[0]:4} {r['batch_per_device']:5d} "
        f"{num(r.get('step_ms'), '8.1f')} {num(r.get('seq_per_s'), '8.1f')} "
        f"{num(r.get('tokens_per_s'), '9.0f')} {num(r.get('model_tflops'), '7.2f')} "
        f"{pct(r.get('mfu_peak'))} {pct(r.get('mfu_measured'))} "
        f"{num(r.get('memory_gib'), '7.2f')} {num(r.get('kept_gib'), '8.3f')} "
        + (f"{r['compile_s']:6.1f}s" if r.get("compile_s") is not None else "    n/a"))
  return "\n".join(lines)


def main(argv=None) -> list[dict]:
  """Runs the sweep; returns the rows (also written to --output and printed)."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--size", default="base", help="row of bert_jax.model.config.SIZES")
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--attention", default="", help=f"comma list of {ATTENTION} (default by device)")
  p.add_argument("--remat", default="", help="comma list of remat policies (default by device)")
  p.add_argument("--batch", default="", help="comma list of per-device batches (default by size)")
  p.add_argument("--scan_layers", default="auto", choices=("auto", "true", "false", "both"),
                 help="auto: scanned for large, as the configs")
  p.add_argument("--dtype", default="", help="compute dtype (default bfloat16, float32 on CPU)")
  p.add_argument("--rng_impl", default="rbg", choices=("threefry", "rbg", "unsafe_rbg"))
  p.add_argument("--steps", type=int, default=10, help="timed steps per row")
  p.add_argument("--warmup_steps", type=int, default=2, help="untimed steps after compiling")
  p.add_argument("--budget_s", type=float, default=900.0, help="wall-clock budget of the sweep")
  p.add_argument("--quick", action="store_true",
                 help="base@128 and large@512, fast recipe, two batches each (< 6 min on a GPU)")
  p.add_argument("--compile_only", action="store_true", help="lower and compile, run nothing")
  p.add_argument("--kept_only", action="store_true",
                 help="count the activations each row keeps for the backward pass (what a "
                      "remat policy buys, from the traced program of the kernel this device "
                      "resolves), compile nothing")
  p.add_argument("--output", default="accelerator_benchmark.jsonl", help="JSON lines out")
  p.add_argument("--tf_check", default="auto", choices=("auto", "yes", "no"),
                 help="check TensorFlow sees no accelerator after host.tf_cpu "
                      "(auto: where JAX has one)")
  args = p.parse_args(argv)
  start = time.perf_counter()
  args.dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
  device = jax.devices()[0]
  peak = metrics_io.peak_flops(0.0)
  measured = 0.0 if args.compile_only or args.kept_only else matmul_rate(jnp.dtype(args.dtype))
  header = {"date": datetime.date.today().isoformat(), "device_kind": device.device_kind,
            "platform": device.platform, "num_devices": jax.device_count(),
            "jax": jax.__version__, "dtype": args.dtype,
            "peak_tflops_table": peak / 1e12 if peak else None,
            "matmul_tflops_measured": measured / 1e12}
  if args.tf_check == "yes" or (args.tf_check == "auto" and jax.default_backend() != "cpu"):
    header["tf_check"] = tensorflow_check()
    print(describe_tensorflow_check(header["tf_check"]), flush=True)
  print(f"{jax.device_count()} x {device.device_kind} ({device.platform}), jax {jax.__version__}; "
        f"{args.dtype} matmul measured {measured / 1e12:.2f} TFLOP/s per device, table peak "
        f"{peak / 1e12 / jax.device_count() if peak else 'n/a'}", flush=True)
  rows, last_seconds = [], 0.0
  with open(args.output, "a") as out:
    for row in plan(args):
      elapsed = time.perf_counter() - start
      if elapsed + last_seconds > args.budget_s:
        row["status"] = f"skipped: budget ({elapsed:.0f}s of {args.budget_s:.0f}s used)"
      else:
        began = time.perf_counter()
        try:
          row = run_row(dict(row), args, peak, measured)
          row["status"] = "ok"
        except Exception as e:  # pylint: disable=broad-except  # one failed row is a result
          row["status"] = f"error: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
          traceback.print_exc(limit=2, file=sys.stderr)
          row.setdefault("compile_s", 0.0)
        last_seconds = time.perf_counter() - began
        row["row_s"] = last_seconds
      row = {**header, **row}
      rows.append(row)
      out.write(json.dumps(row) + "\n")
      out.flush()
      if row["status"] == "ok":
        print(table([row]).splitlines()[1], flush=True)
  print(table(rows))
  print(f"rows written to {args.output} ({time.perf_counter() - start:.0f}s)")
  return rows


if __name__ == "__main__":
  main()
