"""Preflight's compile: the real pretraining step lowered and compiled for a slice's devices.

lower_train_step lowers the trainer's own step (bert_jax.pretrain.steps.build) on
ShapeDtypeStructs (nothing is allocated);
compile_phase compiles it for one phase's shapes with libtpu's compile-only
client and reads the program's memory, XLA's FLOPs and its collectives
(collective_stats); measure does that for every phase of a run, each compile
in a child process (bert_jax.preflight.isolation) so that a crash of libtpu
is reported for that phase instead of ending the preflight.
experiments/benchmarks/pretrain/sharding.py measures simulated meshes with the same
lower_train_step and collective_stats.
"""

import contextlib
import copy
import dataclasses
import functools
import math
import re
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax.model import attention
from bert_jax.model import encoder as model_lib
from bert_jax.preflight import isolation as preflight_isolation
from bert_jax.preflight.targets import OutOfMemory, Target, out_of_memory
from bert_jax.preflight.targets import PreflightError
from bert_jax.pretrain import cost as cost_lib
from bert_jax.pretrain import phases as phases_lib
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.training import sharding
from bert_jax.training import state as state_lib

GIB = float(1 << 30)

# Compiled HLO, read for its collectives (collective_stats).
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
              "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
# "bf16[64,128,256]{2,1,0}" -> dtype and dims; layouts and tuples around it are skipped.
_HLO_SHAPE = re.compile(r"\b(pred|[su](?:8|16|32|64)|bf16|f16|f32|f64)\[([0-9,]*)\]")
# An HLO instruction: "%name = <result type> <opcode>(<operand names>), attributes"; the
# compiled module's text names operands without their types.
_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
_ASYNC_SUFFIX = "-start"


@dataclasses.dataclass
class Measurement:
  """What compiling one phase of one setting for the target gave (bytes per device)."""
  phase: int
  seq_len: int
  predictions: int
  argument_bytes: float
  temp_bytes: float
  total_bytes: float           # arguments + outputs - donated (aliased) + temporaries
  available_bytes: float       # the chip's HBM, or libtpu's own limit when it refused
  flops: float | None = None   # XLA's cost analysis of the per-device program
  model_flops: float = 0.0     # bert_jax.pretrain.cost.step_flops of the global step (matmuls only)
  collectives: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)
  refused: str = ""            # libtpu's out-of-memory line (of HBM: temp_bytes is its figure)
  oom: OutOfMemory | None = None  # which memory space libtpu ran out of, and its figures
  devices: int = 1
  compile_s: float = 0.0
  crash: str = ""              # how the compiling child died ("signal 11, SIGSEGV"); no figures

  @property
  def fits(self) -> bool:
    return not self.refused and not self.crash and self.total_bytes <= self.available_bytes

  @property
  def other_space(self) -> bool:
    """libtpu refused it for a memory space other than HBM (the HBM figures are then partial)."""
    return self.oom is not None and not self.oom.is_hbm

  def space_figures(self) -> str:
    """'out of memory in VMEM (on-chip vector memory), not HBM: 64 MiB needed of 16 MiB'."""
    return (f"out of memory in {self.oom.space_name}, not HBM: {_size(self.oom.needed)} "
            f"needed of {_size(self.oom.available)}")

  def short(self) -> str:
    """'phase 2 >= 33.20 GiB' (HBM per device), or what the other memory space needed."""
    if self.crash:
      return f"phase {self.phase} libtpu crashed ({self.crash})"
    if self.other_space:
      return f"phase {self.phase} {self.space_figures()}"
    return f"phase {self.phase} {'>= ' if self.refused else ''}{self.total_bytes / GIB:.2f} GiB"

  def line(self) -> str:
    """'phase 2 (512 tokens, 77 predictions): args .. + temps .. = .. GiB of .. GiB: fits; ...'."""
    if self.crash:
      return (f"phase {self.phase} ({self.seq_len} tokens, {self.predictions} predictions): "
              f"libtpu crashed compiling it ({self.crash}): fit unknown, NOT CHECKED")
    if self.other_space:
      return (f"phase {self.phase} ({self.seq_len} tokens, {self.predictions} predictions): "
              f"args {self.argument_bytes / GIB:.2f} GiB of HBM per device; refused by libtpu: "
              f"{self.space_figures()} per device: DOES NOT FIT [compiled in "
              f"{self.compile_s:.0f} s]")
    at_least = ">= " if self.refused else ""
    text = (f"phase {self.phase} ({self.seq_len} tokens, {self.predictions} predictions): "
            f"args {self.argument_bytes / GIB:.2f} GiB + temps {at_least}"
            f"{self.temp_bytes / GIB:.2f} GiB = {at_least}{self.total_bytes / GIB:.2f} GiB "
            f"of {self.available_bytes / GIB:.2f} GiB per device: "
            f"{'fits' if self.fits else 'DOES NOT FIT'}")
    if self.flops:
      text += f"; XLA {self.flops:.3g} FLOPs/step per device"
      if self.model_flops:
        text += f" (model formula {self.model_flops / self.devices:.3g})"
    if self.collectives:
      text += "; collectives " + ", ".join(
          f"{kind} {n} x {b / 2**20:,.1f} MiB" for kind, (n, b) in self.collectives.items())
    return text + f" [compiled in {self.compile_s:.0f} s]"


def vocab_size(config: ml_collections.ConfigDict) -> tuple[int, str]:
  """(true vocabulary size, where it comes from) without reading a vocabulary file.

  The trainer takes it from the tokenizer when config.model.vocab_size is 0;
  preflight reads nothing, so it takes the embedded corpus's learnt vocabulary
  size, else the size table's default (BERT's 30,522 WordPiece entries). The
  word table is a few percent of BERT-Base's memory, so a vocabulary of another
  size moves the figures little; pin --config.model.vocab_size to be exact.
  """
  if config.model.vocab_size:
    return config.model.vocab_size, "config.model.vocab_size"
  if config.data.corpus == "embedded" and not (config.data.vocab_file
                                               or config.data.spm_model_file):
    return config.data.embedded_vocab_size, "config.data.embedded_vocab_size"
  return model_lib.BertConfig.vocab_size, "the size table's default (BERT's WordPiece)"


def bert_config_of(config: ml_collections.ConfigDict) -> model_lib.BertConfig:
  """The run's BertConfig as the trainer makes it (steps.network), with vocab_size()'s size."""
  return pretrain_steps.network(config, vocab_size(config)[0])


@contextlib.contextmanager
def compiling_for(device: Any):
  """bert_jax.model.attention decides as it would on `device` (a TPU of the compile-only client).

  attention.platform() reads this process's devices (CPUs here), so "auto" would
  pick the CPU path and splash would run in Pallas's interpreter: the compiled
  program would not be the one the slice runs. Patched for the compile only.
  """
  saved = attention.platform, attention._device_kind, attention.KERNELS["splash"]  # pylint: disable=protected-access
  attention.platform = lambda: device.platform
  attention._device_kind = lambda: device.device_kind  # pylint: disable=protected-access
  attention.KERNELS["splash"] = functools.partial(saved[2], interpret=False)
  try:
    yield
  finally:
    attention.platform, attention._device_kind, attention.KERNELS["splash"] = saved  # pylint: disable=protected-access


def _check_config(config: ml_collections.ConfigDict, mesh) -> None:
  """bert_jax.pretrain.steps.check_config: the trainer's refusals come first, as one line."""
  config = copy.deepcopy(config)
  with config.unlocked():
    config.init_checkpoint = ""  # preflight reads nothing (it may be a gs:// path)
  try:
    pretrain_steps.check_config(config, mesh)
  except ValueError as e:
    raise PreflightError(f"the trainer would refuse this config: {e}") from None


def _size(n: float) -> str:
  """Bytes as '1.25 GiB' or '16.0 MiB' (an on-chip space is MiB); '?' when unknown."""
  if math.isnan(n):
    return "?"
  return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


@dataclasses.dataclass
class LoweredStep:
  """The pretraining step lowered on abstract arrays, with the layout and batch it was given."""
  lowered: Any                    # jax.stages.Lowered
  layout: state_lib.StateLayout
  batch: dict[str, jax.ShapeDtypeStruct]


def lower_train_step(config: ml_collections.ConfigDict, bert_config: model_lib.BertConfig,
                     mesh: jax.sharding.Mesh, seq_len: int, predictions: int,
                     batch_size: int | None = None) -> LoweredStep:
  """The trainer's train step (bert_jax.pretrain.steps.build, the one builder) lowered on
  ShapeDtypeStructs over `mesh` (the slice's TPU devices here, simulated CPUs in
  experiments/benchmarks/pretrain/sharding.py), under the config's logical axis rules, with the
  run's dropout key's type; nothing allocated. `batch_size`: the phase's (the run's
  config.batch_size by default)."""
  programs = pretrain_steps.build(config, bert_config, mesh, seq_len=seq_len,
                                  predictions=predictions)
  layout = programs.layout
  batch = pretrain_steps.abstract_batch(batch_size or config.batch_size, seq_len, predictions,
                                        layout.batch, packed=config.data.objective == "documents")
  key = jax.eval_shape(lambda: pretrain_steps.keys(config)[1])
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=layout.replicated)
  with sharding.activate(mesh, programs.rules):
    lowered = programs.train_step.lower(programs.abstract_state(), batch, rng)
  return LoweredStep(lowered, layout, batch)


def _shapes(text: str) -> list[tuple[tuple[int, ...], int]]:
  """[(dims, bytes)] of every array type written in `text`."""
  out = []
  for dtype, dims in _HLO_SHAPE.findall(text):
    dims = tuple(int(d) for d in dims.split(",") if d)
    out.append((dims, math.prod(dims) * _HLO_BYTES[dtype]))
  return out


def is_batch_activation(dims: tuple[int, ...], batch: int, seq_len: int, hidden: int) -> bool:
  """A [batch, T, >= hidden] (or flattened [batch * T, >= hidden]) array of the global batch."""
  if dims[:2] == (batch, seq_len):
    rest = dims[2:]
  elif dims[:1] == (batch * seq_len,):
    rest = dims[1:]
  else:
    return False
  return math.prod(rest) >= hidden


def collective_stats(hlo_text: str, batch: int, seq_len: int, hidden: int) -> dict[str, Any]:
  """Bytes per collective kind in a compiled HLO module, and the whole-batch all-reduces.

  An op counts the larger of its result and its operands (tuples summed); the
  asynchronous "-start" form counts once, its "-done" not at all; ops inside
  loops count once.
  """
  results = {}  # instruction name -> [(elements, bytes)] of its result
  ops = []
  for line in hlo_text.splitlines():
    match = _HLO_INSTRUCTION.match(line)
    if not match:
      continue
    name, result, opcode, rest = match.groups()
    results[name] = _shapes(result)
    is_async = opcode.endswith(_ASYNC_SUFFIX)
    kind = opcode[:-len(_ASYNC_SUFFIX)] if is_async else opcode
    if kind in COLLECTIVES:
      operands = re.findall(r"%[\w.\-]+", rest.split(")", 1)[0])
      ops.append((kind, is_async, results[name], operands))
  totals = {kind: 0 for kind in COLLECTIVES}
  counts = {kind: 0 for kind in COLLECTIVES}
  batch_all_reduces = []
  for kind, is_async, result_shapes, operand_names in ops:
    operand_shapes = [s for n in operand_names for s in results.get(n, [])]
    result_bytes = sum(b for _, b in result_shapes)
    operand_bytes = sum(b for _, b in operand_shapes)
    if is_async and kind != "all-reduce":  # the start's result tuple holds the operand too
      result_bytes -= operand_bytes
    totals[kind] += max(result_bytes, operand_bytes)
    counts[kind] += 1
    batch_operands = [d for d, _ in operand_shapes
                      if is_batch_activation(d, batch, seq_len, hidden)]
    if kind == "all-reduce" and batch_operands:
      batch_all_reduces.append(batch_operands)
  return {"bytes": totals, "counts": counts, "batch_all_reduces": batch_all_reduces}


def check_for_slice(config: ml_collections.ConfigDict, slice_devices: list) -> None:
  """The trainer's refusals of `config` on the slice's mesh, as one line (PreflightError)."""
  with compiling_for(slice_devices[0]):
    _check_config(config, sharding.make_mesh(config.mesh, slice_devices))


def compile_phase(config: ml_collections.ConfigDict, tpu: Target, slice_devices: list,
                  phase: dict[str, Any], check: bool = True) -> Measurement:
  """Compiles the train step of `config` at one phase's shapes for the slice; its figures.

  The trainer's sections "mesh", "model and optimizer", "shardings" and "step"
  (bert_jax.pretrain.trainer), on abstract arrays over the slice's devices. `check`:
  check_for_slice first (preflight's child skips it: the parent checked, and
  the check imports TensorFlow, seconds a child need not spend).
  """
  started = time.time()
  seq_len, predictions = phase["seq_len"], phase["predictions"]
  batch_size = phase.get("batch_size") or config.batch_size
  bert_config = bert_config_of(config)
  mesh = sharding.make_mesh(config.mesh, slice_devices)
  with compiling_for(slice_devices[0]):
    if check:
      _check_config(config, mesh)
    step = lower_train_step(config, bert_config, mesh, seq_len, predictions, batch_size)
  layout = step.layout
  # What the arguments take per device, from their shardings: known even when libtpu refuses.
  argument_bytes = float(sum(jnp.dtype(x.dtype).itemsize * math.prod(x.sharding.shard_shape(x.shape))
                             for x in jax.tree.leaves((layout.abstract, step.batch))))
  try:
    compiled = step.lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    oom = out_of_memory(str(e))
    if oom is None:
      raise
    if oom.is_hbm:  # its figures are HBM temporaries and libtpu's usable HBM
      temps, available = oom.needed, oom.available
    else:  # another space's figures are not HBM's: the HBM known is the arguments
      temps, available = 0.0, tpu.hbm_gib * GIB
    return Measurement(phase["phase"], seq_len, predictions, argument_bytes=argument_bytes,
                       temp_bytes=temps, total_bytes=argument_bytes + temps,
                       available_bytes=available, refused=oom.line, oom=oom,
                       compile_s=time.time() - started)
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  stats = collective_stats(compiled.as_text(), batch_size, seq_len, bert_config.hidden_size)
  collectives = {k: (n, float(stats["bytes"][k])) for k, n in stats["counts"].items() if n}
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  return Measurement(phase["phase"], seq_len, predictions,
                     argument_bytes=float(memory.argument_size_in_bytes),
                     temp_bytes=float(memory.temp_size_in_bytes), total_bytes=float(total),
                     available_bytes=tpu.hbm_gib * GIB,
                     flops=float(cost["flops"]) if cost and "flops" in cost else None,
                     model_flops=cost_lib.step_flops(
                         bert_config, layout.abstract_params, sequences=batch_size,
                         seq_len=seq_len, predictions=batch_size * predictions),
                     devices=len(slice_devices),
                     collectives=collectives, compile_s=time.time() - started)


def _largest(shapes: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The phases to compile: of those with the same length and predictions (a batch
  warmup's sizes and the phase they lead to), the largest batch only: a smaller batch of
  the same step needs less memory, and each compile costs minutes."""
  largest: dict[tuple, dict[str, Any]] = {}
  for p in shapes:
    key = (p["seq_len"], p["predictions"])
    if key not in largest or p["batch_size"] > largest[key]["batch_size"]:
      largest[key] = p
  return [p for p in shapes if largest[(p["seq_len"], p["predictions"])] is p]


def measure(config: ml_collections.ConfigDict, tpu: Target, slice_devices: list,
            only_phases: Sequence[int] = (), progress: Callable[[str], None] | None = None,
            isolate: bool = True) -> list[Measurement]:
  """compile_phase for every phase of the run (or those in `only_phases`); `progress` is
  told each result as it comes (a large model's compile takes minutes on a CPU).

  With `isolate` (the default) they compile in a child process
  (bert_jax.preflight.isolation: a few seconds more per call), so that a phase whose
  compile kills libtpu comes back as a Measurement with `crash` set (it never
  fits) and the phases after it are still compiled.
  """
  todo = [p for p in _largest(phases_lib.shapes(config))
          if not only_phases or p["phase"] in only_phases]
  if isolate:
    check_for_slice(config, slice_devices)  # here: the child does not check
    results = preflight_isolation.compile_phases(config, tpu, todo)
  else:
    results = (compile_phase(config, tpu, slice_devices, p) for p in todo)
  out = []
  for result in results:
    if isinstance(result, preflight_isolation.Crash):
      if progress and result.log_tail:  # libtpu's stack dump, for a bug report
        progress(f"preflight: the compiling process's last output:\n{result.log_tail}")
      p = result.phase
      result = Measurement(p["phase"], p["seq_len"], p["predictions"], argument_bytes=0.0,
                           temp_bytes=0.0, total_bytes=0.0, available_bytes=tpu.hbm_gib * GIB,
                           crash=result.how, devices=len(slice_devices))
    out.append(result)
    if progress:
      progress(f"preflight: {result.line()}")
  return out
