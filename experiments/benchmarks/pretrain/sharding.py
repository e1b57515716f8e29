r"""Per-device memory and collective traffic of the REAL pretraining step on simulated meshes.

  python -m experiments.benchmarks.pretrain.sharding --size=mini --batch=64 --seq_len=128 \
      --mesh=1,8,1 --mesh=1,4,2 --mesh=2,2,2 --mesh=8,1,1

Nothing runs: for each (data, fsdp, tensor) mesh the script lowers and compiles the
pretraining train step exactly as the trainer jits it (optimizer, shardings and logical
axis rules included: bert_jax.preflight.compile.lower_train_step, the one copy, which
the TPU preflight compiles too), then reads

  args / temp   compiled.memory_analysis(): argument and temporary bytes per device;
  collectives   bytes per device by kind, parsed from the compiled HLO (per op the
                larger of its operand and its result; ops inside loops count once);
  BTH           all-reduces of a global-batch activation ([B, T, >= H] or
                [B*T, >= H]), which a working activation layout never needs;
  remat         XLA's "involuntary full rematerialization" warnings while compiling;
  constr        sharding constraints in the lowered (pre-compilation) module.

The script sets XLA_FLAGS for 8 host devices (and JAX_PLATFORMS=cpu) before jax is
imported unless they are set. It imports bert_jax.pretrain.trainer, which imports
TensorFlow through the data pipeline; transformers is never imported. The figures the
command above gave, before and after the activation sharding held, and the method in
full: experiments/results/sharding.md.
"""

import os

if __name__ == "__main__":  # as a program; importers (tests) keep their own environment
  if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  # Warnings must reach the log: XLA names each involuntary full rematerialization there.
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import contextlib
import json
import math
import re
import sys
import tempfile
from typing import Any

import jax

from bert_jax.model import config as model_config
from bert_jax.model import encoder as model_lib
from bert_jax.preflight import compile as preflight_compile
from bert_jax.preflight.compile import collective_stats
from bert_jax.training import sharding
from experiments.configs import pretrain

def parse_meshes(values: list[str]) -> list[tuple[int, int, int]]:
  """'1,8,1' '1,4,2;2,2,2' '1,8,1,8,1,1' -> [(1, 8, 1), (1, 4, 2), ...] (triples of ints)."""
  meshes = []
  for value in values:
    for piece in re.split(r"[;\s]+", value.strip()):
      if not piece:
        continue
      sizes = [int(s) for s in piece.split(",") if s]
      if len(sizes) % 3:
        raise ValueError(f"--mesh={value!r}: sizes come in (data, fsdp, tensor) triples")
      meshes.extend(tuple(sizes[i:i + 3]) for i in range(0, len(sizes), 3))
  return meshes


@contextlib.contextmanager
def captured_stderr(lines: list[str]):
  """Appends what the process writes to file descriptor 2 (XLA's C++ log) to `lines`."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as f:
    os.dup2(f.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      f.seek(0)
      text = f.read().decode(errors="replace")
      lines.extend(text.splitlines())
      sys.stderr.write(text)


def count_constraints(lowered_text: str) -> int:
  """Sharding constraints in a lowered module (Shardy or GSPMD spelling)."""
  return (lowered_text.count("sdy.sharding_constraint")
          + lowered_text.count("@Sharding"))


def bench_config(mesh_sizes: tuple[int, int, int], *, size: str, batch: int, seq_len: int,
                 predictions: int, vocab_size: int, variant: str = "base",
                 grad_accum_steps: int = 1, vocab_multiple: int | None = None):
  """The pretraining config `variant` with this model size, batch and mesh."""
  config = pretrain.get_config(variant)
  config.model_size = size
  config.model.vocab_size = vocab_size
  if vocab_multiple is not None:
    config.model.vocab_multiple = vocab_multiple
  config.batch_size = batch
  config.grad_accum_steps = grad_accum_steps
  config.data.max_seq_length = seq_len
  config.data.masking.max_predictions_per_seq = predictions
  config.mesh.update(data=mesh_sizes[0], fsdp=mesh_sizes[1], tensor=mesh_sizes[2])
  return config


def lower_train_step(config) -> tuple[Any, model_lib.BertConfig]:
  """(jax.stages.Lowered, BertConfig): bert_jax.pretrain.trainer.train_step lowered as the trainer jits it.

  bert_jax.preflight.compile.lower_train_step (the one copy, which the TPU preflight
  compiles too) over the first devices of this process; nothing is allocated.
  """
  bert_config = model_lib.BertConfig.from_size(config.model_size, **config.model.to_dict())
  num_devices = math.prod(config.mesh[a] for a in sharding.MESH_AXES)
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:num_devices])
  step = preflight_compile.lower_train_step(config, bert_config, mesh, config.data.max_seq_length,
                                            config.data.masking.max_predictions_per_seq)
  return step.lowered, bert_config


def measure(config) -> dict[str, Any]:
  """Lowers and compiles the real train step for `config` (see bench_config); its figures."""
  lowered, bert_config = lower_train_step(config)
  log = []
  with captured_stderr(log):
    compiled = lowered.compile()
  memory = compiled.memory_analysis()
  batch, seq_len = config.batch_size, config.data.max_seq_length
  stats = collective_stats(compiled.as_text(), batch, seq_len, bert_config.hidden_size)
  mib = lambda n: round(n / 2**20, 1)
  return {
      "mesh": [config.mesh[a] for a in sharding.MESH_AXES], "size": config.model_size,
      "batch": batch, "seq_len": seq_len, "grad_accum_steps": config.grad_accum_steps,
      "vocab_size": bert_config.vocab_size, "padded_vocab_size": bert_config.padded_vocab_size,
      "dtype": bert_config.dtype,
      "argument_mib": mib(memory.argument_size_in_bytes),
      "temp_mib": mib(memory.temp_size_in_bytes),
      "collective_mib": mib(sum(stats["bytes"].values())),
      "collective_mib_by_kind": {k: mib(v) for k, v in stats["bytes"].items()},
      "collective_counts": stats["counts"],
      "batch_activation_all_reduces": len(stats["batch_all_reduces"]),
      "full_rematerializations": sum("Involuntary full rematerialization" in l for l in log),
      "constraints": count_constraints(lowered.as_text()),
  }


def table(rows: list[dict[str, Any]]) -> str:
  """The figures as a fixed-width table, one line per mesh (MiB per device)."""
  lines = ["mesh (d,f,t)  args   temp   coll  all-red all-gath red-scat all2all permute "
           "BTH remat constr"]
  for r in rows:
    k = r["collective_mib_by_kind"]
    lines.append(
        f"{','.join(map(str, r['mesh'])):12} {r['argument_mib']:5.1f} {r['temp_mib']:6.1f} "
        f"{r['collective_mib']:6.1f} {k['all-reduce']:8.1f} {k['all-gather']:8.1f} "
        f"{k['reduce-scatter']:8.1f} {k['all-to-all']:7.1f} {k['collective-permute']:7.1f} "
        f"{r['batch_activation_all_reduces']:3d} {r['full_rematerializations']:5d} "
        f"{r['constraints']:6d}")
  return "\n".join(lines)


def main(argv=None) -> list[dict[str, Any]]:
  """Parses flags, measures every mesh, prints the table and one JSON line per mesh."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--size", default="mini", choices=sorted(model_config.SIZES))
  parser.add_argument("--mesh", action="append", default=None,
                      help="data,fsdp,tensor; repeat, or separate meshes by ';'")
  parser.add_argument("--batch", type=int, default=64, help="global batch")
  parser.add_argument("--seq_len", type=int, default=128)
  parser.add_argument("--predictions", type=int, default=20, help="masked positions per sequence")
  parser.add_argument("--vocab_size", type=int, default=30522, help="true (unpadded) vocabulary")
  parser.add_argument("--vocab_multiple", type=int, default=None,
                      help="pad the vocabulary to a multiple of this (default: the variant's)")
  parser.add_argument("--grad_accum_steps", type=int, default=1)
  parser.add_argument("--variant", default="base", choices=pretrain.VARIANTS,
                      help="pretrain config variant giving dtype, optimizer and rules")
  args = parser.parse_args(argv)
  # A persistent-cache hit skips the compiler, and with it the warnings counted here.
  jax.config.update("jax_enable_compilation_cache", False)
  meshes = parse_meshes(args.mesh or ["1,8,1"])
  rows = []
  for mesh_sizes in meshes:
    rows.append(measure(bench_config(
        mesh_sizes, size=args.size, batch=args.batch, seq_len=args.seq_len,
        predictions=args.predictions, vocab_size=args.vocab_size, variant=args.variant,
        grad_accum_steps=args.grad_accum_steps, vocab_multiple=args.vocab_multiple)))
    print(json.dumps(rows[-1]), flush=True)
  print(table(rows))
  return rows


if __name__ == "__main__":
  main()
