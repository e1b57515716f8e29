r"""Preflight: compile the real pretraining step for a TPU slice here, before paying for it.

  python -m bert_jax.preflight --config=experiments/configs/pretrain.py:large \
      --topology=v5litepod-16 [--config.X=V ...]

compiles bert_jax.pretrain_step.train_step exactly as bert_jax.pretrain jits it
(model, optimizer, parameter/optimizer/batch shardings from
bert_jax.train_state.make_layout, the config's mesh and logical axis rules) for
every phase of the run (128 and 512 tokens in the paper recipe), for the
slice's devices as libtpu's compile-only client describes them, on this CPU
machine, as MaxText's train_compile.py does. Nothing is materialised: the
state and batches are ShapeDtypeStructs, no corpus is read and nothing is
written (the vocabulary size comes from the config: see `vocab_size`).

Per device and phase it prints arguments, temporaries and total HBM against
the chip's (bert_jax.preflight_targets.HBM_GIB), XLA's FLOPs per step and the
collectives of the compiled program (collective_stats; lower_train_step and
collective_stats are shared with experiments/benchmarks/sharding.py). XLA's cost analysis counts a loop's body once: with gradient
accumulation or config.model.scan_layers its FLOPs are one micro-batch's or one
layer's, so bert_jax.cost's model FLOPs are printed beside them. A phase that does not fit is refused with one line naming the
phase, the GiB needed and available, and the cheapest knob setting that fits:
bert_jax.preflight_knobs tries them in order of extra compute (compiling each).
Each compile runs in a child process (bert_jax.preflight_isolation), so that a
crash of libtpu is reported for that phase or knob setting, never as a fit.

bert_jax.launch calls `check_launch` before it creates a slice. The table
in docs/pods.md ("Preflight") is printed by experiments/benchmarks/preflight_table.py.
"""

import contextlib
import copy
import dataclasses
import functools
import math
import re
import sys
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections

from bert_jax import attention
from bert_jax import cost as cost_lib
from bert_jax import heads
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import phases as phases_lib
from bert_jax import preflight_isolation
from bert_jax import preflight_knobs
from bert_jax import pretrain_step
from bert_jax import sharding
from bert_jax import train_state as state_lib
from bert_jax.preflight_targets import PreflightError, Target, devices, target  # noqa: F401
from bert_jax.preflight_targets import OutOfMemory, out_of_memory

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
  model_flops: float = 0.0     # bert_jax.cost.step_flops of the global step (matmuls only)
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


def load_config(config_arg: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config bert_jax.main would run: `--config=config_arg` plus "--config.X=V" overrides.

  Parsed with ml_collections' config_flags on private FlagValues, so the caller's
  absl flags (bert_jax.launch's, say) are untouched.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  argv = ["preflight", f"--config={config_arg}"]
  for o in overrides:
    argv.append(o if o.startswith("--") else "--config." + o.removeprefix("config."))
  values = flags.FlagValues()
  try:
    # sys_argv: the overrides are defined from the argv the config is read from.
    config_flags.DEFINE_config_file("config", None, "Experiment config file[:variant].",
                                    flag_values=values, lock_config=True, sys_argv=argv)
    values(argv)
  except flags.Error as e:
    raise PreflightError(f"--config={config_arg} {' '.join(overrides)}: {e}") from None
  return values.config


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
  """The run's BertConfig as bert_jax.pretrain.build_bert_config makes it, minus the tokenizer."""
  return model_lib.BertConfig.from_size(
      config.model_size, **dict(config.model.to_dict(), vocab_size=vocab_size(config)[0]))


@contextlib.contextmanager
def compiling_for(device: Any):
  """bert_jax.attention decides as it would on `device` (a TPU of the compile-only client).

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


def _check_config(config: ml_collections.ConfigDict, bert_config, mesh) -> None:
  """bert_jax.pretrain.check_config: the trainer's refusals come first, as one line."""
  from bert_jax import pretrain  # pylint: disable=g-import-not-at-top  # TF: only here
  config = copy.deepcopy(config)
  with config.unlocked():
    config.init_checkpoint = ""  # preflight reads nothing (it may be a gs:// path)
  try:
    pretrain.check_config(config, bert_config, mesh)
  except ValueError as e:
    raise PreflightError(f"the trainer would refuse this config: {e}") from None


def _size(n: float) -> str:
  """Bytes as '1.25 GiB' or '16.0 MiB' (an on-chip space is MiB); '?' when unknown."""
  if math.isnan(n):
    return "?"
  return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def abstract_batch(batch: int, seq_len: int, predictions: int,
                   batch_sharding: jax.sharding.NamedSharding) -> dict[str, jax.ShapeDtypeStruct]:
  """The pretraining batch's shapes and dtypes (as data_pipeline.pretraining feeds them)."""
  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding)
  return {
      "input_ids": spec((batch, seq_len), jnp.int32),
      "input_mask": spec((batch, seq_len), jnp.int32),
      "segment_ids": spec((batch, seq_len), jnp.int32),
      "masked_lm_positions": spec((batch, predictions), jnp.int32),
      "masked_lm_ids": spec((batch, predictions), jnp.int32),
      "masked_lm_weights": spec((batch, predictions), jnp.float32),
      "next_sentence_labels": spec((batch,), jnp.int32),
  }


@dataclasses.dataclass
class LoweredStep:
  """The pretraining step lowered on abstract arrays, with the layout and batch it was given."""
  lowered: Any                    # jax.stages.Lowered
  layout: state_lib.StateLayout
  batch: dict[str, jax.ShapeDtypeStruct]


def lower_train_step(config: ml_collections.ConfigDict, bert_config: model_lib.BertConfig,
                     mesh: jax.sharding.Mesh, seq_len: int, predictions: int) -> LoweredStep:
  """bert_jax.pretrain_step.train_step lowered as bert_jax.pretrain jits it; nothing allocated.

  The trainer's sections "model and optimizer", "shardings" and "step" on
  ShapeDtypeStructs over `mesh` (the slice's TPU devices here, simulated CPUs in
  experiments/benchmarks/sharding.py, which measures meshes with it): the
  optimizer of bert_jax.optim, the shardings of bert_jax.train_state.make_layout,
  the config's logical axis rules under bert_jax.sharding.activate, the dropout
  key of config.rng_impl, and the state donated.
  """
  # JSON round trips turn the rules' tuples into lists; flax wants tuples.
  rules = [(name, tuple(axes) if isinstance(axes, list) else axes)
           for name, axes in config.logical_axis_rules]
  model = heads.BertForPreTraining(bert_config, nsp_head=config.data.objective != "none")
  tx, _ = optim.make_optimizer(config.optimizer, config.total_steps)

  def init_params(rng):
    ids = jnp.zeros((1, seq_len), jnp.int32)
    return model.init({"params": rng}, ids, ids, ids, jnp.zeros((1, predictions), jnp.int32),
                      deterministic=True)["params"]

  layout = state_lib.make_layout(model, init_params, tx, mesh, rules, jax.random.key(0))
  state = state_lib.TrainState(
      step=layout.abstract["step"], apply_fn=model.apply, params=layout.abstract["params"],
      tx=tx, opt_state=layout.abstract["opt_state"])
  batch = abstract_batch(config.batch_size, seq_len, predictions, layout.batch)
  key = jax.eval_shape(lambda: state_lib.dropout_key(jax.random.PRNGKey(config.seed),
                                                      config.rng_impl))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=layout.replicated)
  with sharding.activate(mesh, rules):
    lowered = jax.jit(
        functools.partial(pretrain_step.train_step, grad_accum_steps=config.grad_accum_steps,
                          skip_nonfinite=config.skip_nonfinite_steps),
        in_shardings=(layout.state, layout.batch, layout.replicated),
        out_shardings=(layout.state, layout.replicated), donate_argnums=(0,)
    ).lower(state, batch, rng)
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
    _check_config(config, bert_config_of(config), sharding.make_mesh(config.mesh, slice_devices))


def compile_phase(config: ml_collections.ConfigDict, tpu: Target, slice_devices: list,
                  phase: dict[str, Any], check: bool = True) -> Measurement:
  """Compiles the train step of `config` at one phase's shapes for the slice; its figures.

  The trainer's sections "mesh", "model and optimizer", "shardings" and "step"
  (bert_jax.pretrain), on abstract arrays over the slice's devices. `check`:
  check_for_slice first (preflight's child skips it: the parent checked, and
  the check imports TensorFlow, seconds a child need not spend).
  """
  started = time.time()
  seq_len, predictions = phase["seq_len"], phase["predictions"]
  bert_config = bert_config_of(config)
  mesh = sharding.make_mesh(config.mesh, slice_devices)
  with compiling_for(slice_devices[0]):
    if check:
      _check_config(config, bert_config, mesh)
    step = lower_train_step(config, bert_config, mesh, seq_len, predictions)
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
  stats = collective_stats(compiled.as_text(), config.batch_size, seq_len, bert_config.hidden_size)
  collectives = {k: (n, float(stats["bytes"][k])) for k, n in stats["counts"].items() if n}
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  return Measurement(phase["phase"], seq_len, predictions,
                     argument_bytes=float(memory.argument_size_in_bytes),
                     temp_bytes=float(memory.temp_size_in_bytes), total_bytes=float(total),
                     available_bytes=tpu.hbm_gib * GIB,
                     flops=float(cost["flops"]) if cost and "flops" in cost else None,
                     model_flops=cost_lib.step_flops(
                         bert_config, layout.abstract_params, sequences=config.batch_size,
                         seq_len=seq_len, predictions=config.batch_size * predictions),
                     devices=len(slice_devices),
                     collectives=collectives, compile_s=time.time() - started)


def measure(config: ml_collections.ConfigDict, tpu: Target, slice_devices: list,
            only_phases: Sequence[int] = (), progress: Callable[[str], None] | None = None,
            isolate: bool = True) -> list[Measurement]:
  """compile_phase for every phase of the run (or those in `only_phases`); `progress` is
  told each result as it comes (a large model's compile takes minutes on a CPU).

  With `isolate` (the default) they compile in a child process
  (bert_jax.preflight_isolation: a few seconds more per call), so that a phase whose
  compile kills libtpu comes back as a Measurement with `crash` set (it never
  fits) and the phases after it are still compiled.
  """
  todo = [p for p in phases_lib.phases(config) if not only_phases or p["phase"] in only_phases]
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


@dataclasses.dataclass
class Report:
  """A preflight's outcome: the printed summary and, when it does not fit, the refusal line."""
  summary: str
  refusal: str               # "" when every phase fits
  measurements: list[Measurement]
  fix: Any = None            # bert_jax.preflight_knobs.Attempt that fits, when one was needed


def run(config: ml_collections.ConfigDict, accelerator_type: str, *, name: str = "",
        search: bool = True, progress: Callable[[str], None] | None = None,
        isolate: bool = True) -> Report:
  """Compiles every phase of `config` for `accelerator_type`; searches knobs when one does not fit.

  `progress` (e.g. a print to stderr) hears of each compile as it finishes.
  `isolate`: each measure() in a child process (see measure), so that a crash
  of libtpu is reported (a phase that crashed as configured is searched like
  one that does not fit; a knob setting that crashes is skipped), never a fit.
  """
  tpu = target(accelerator_type)
  slice_devices = devices(tpu)
  bert_config = bert_config_of(config)
  vocab, source = vocab_size(config)
  mesh_shape = sharding.mesh_shape(config.mesh, tpu.num_devices)
  dp = mesh_shape[0] * mesh_shape[1]
  lines = [
      f"preflight {name or config.get('variant', '')} on {accelerator_type}: "
      f"{tpu.num_devices} x {slice_devices[0].device_kind} (topology {tpu.topology_name}, "
      f"{tpu.hbm_gib:g} GiB HBM per chip), jax {jax.__version__}, libtpu {libtpu_version()}",
      f"  model {config.model_size} (L={bert_config.num_hidden_layers}, "
      f"H={bert_config.hidden_size}), vocab {vocab:,} ({source}), {bert_config.dtype}, "
      f"remat {bert_config.remat_policy}; global batch {config.batch_size} = "
      f"{config.batch_size // max(dp, 1)} per device"
      + (f" in {config.grad_accum_steps} micro-batches" if config.grad_accum_steps > 1 else "")
      + f"; mesh data={mesh_shape[0]} fsdp={mesh_shape[1]} tensor={mesh_shape[2]}"]
  measurements = measure(config, tpu, slice_devices, progress=progress, isolate=isolate)
  lines += ["  " + m.line() for m in measurements]
  failing = [m for m in measurements if not m.fits]
  if not failing:
    return Report("\n".join(lines), "", measurements)
  # HBM's shortfall first: another space's refusal gives no HBM figure to compare.
  # A crash, which gives no figure at all, is named only when nothing else failed.
  worst = max(failing, key=lambda m: (not m.crash, not m.other_space, m.total_bytes))
  what = f"phase {worst.phase} ({worst.seq_len} tokens) of {name or config.get('variant', '')}"
  if worst.crash:
    needs = (f"libtpu {libtpu_version()} crashed ({worst.crash}) compiling {what} for "
             f"{accelerator_type}, so whether it fits is unknown")
  elif worst.other_space:
    # A real run compiles the same program and is refused the same way: still a refusal.
    needs = (f"{what} does not compile for {accelerator_type}: libtpu ran {worst.space_figures()}"
             " per chip (a real run would be refused the same way)")
  else:
    needs = (f"{what} needs {'>= ' if worst.refused else ''}{worst.total_bytes / GIB:.2f} GiB of "
             f"HBM per chip on {accelerator_type}, which has {worst.available_bytes / GIB:.2f} GiB")
  if not search:
    return Report("\n".join(lines), f"preflight: {needs}", measurements)
  attempts = preflight_knobs.search(
      config, tpu.num_devices,
      lambda c, only: measure(c, tpu, slice_devices, only, progress, isolate=isolate),
      [m.phase for m in failing], progress)
  lines.append("  knobs tried, least extra compute first (each compiled):" if attempts else
               "  knobs tried: none left (fsdp, full remat, no batch left to accumulate over)")
  lines += ["    " + a.line() for a in attempts]
  fix = next((a for a in attempts if a.fits), None)
  if fix:
    lines.append(f"  cheapest that fits: {fix.flags}")
    refusal = (f"preflight: {needs}; cheapest fix that fits: {fix.flags} "
               f"({fix.worst_gib:.2f} GiB)")
  elif worst.crash:
    refusal = (f"preflight: {needs}; {'no knob tried fits' if attempts else 'no knob left to try'}"
               ": set another remat policy, mesh or libtpu version by hand, or --skip_preflight "
               "at your own risk")
  else:
    refusal = (f"preflight: {needs}; no knob tried fits (fsdp, remat policy, gradient "
               "accumulation): use a larger slice or a smaller global batch")
  return Report("\n".join(lines), refusal, measurements, fix)


def libtpu_version() -> str:
  """The installed libtpu's version ('' when absent)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version("libtpu")
  except metadata.PackageNotFoundError:
    return ""


def check_launch(config_arg: str, overrides: Sequence[str], accelerator_type: str) -> str:
  """The launcher's preflight: the summary when every phase fits.

  Raises:
    PreflightError: one line (phase, GiB needed and available, the cheapest fix)
      when a phase does not fit, libtpu is missing or the config is refused;
      its `summary` attribute holds the full printout when there is one.
  """
  config = load_config(config_arg, overrides)
  if config.get("family", "pretrain") != "pretrain":
    return f"preflight: {config_arg} is not a pretraining config; nothing compiled"
  report = run(config, accelerator_type, name=config_arg)
  if report.refusal:
    error = PreflightError(report.refusal)
    error.summary = report.summary
    raise error
  return report.summary


def main(argv: Sequence[str] | None = None) -> int:
  """CLI: --config=FILE[:variant] --topology=TYPE [--config.X=V ...]; exit 1 when it does not fit."""
  import argparse  # pylint: disable=g-import-not-at-top
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--config", required=True, help="pretraining config file[:variant]")
  parser.add_argument("--topology", required=True,
                      help="gcloud accelerator type: v4-8, v4-32, v5litepod-16 (or v5e-16), v6e-8")
  parser.add_argument("--no_search", action="store_true",
                      help="only report; do not try the knobs when a phase does not fit")
  args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
  try:
    config = load_config(args.config, overrides)
    report = run(config, args.topology, name=args.config, search=not args.no_search,
                 progress=lambda line: print(line, file=sys.stderr, flush=True))
  except PreflightError as e:
    print(f"preflight: {e}" if not str(e).startswith("preflight") else str(e), file=sys.stderr)
    return 1
  print(report.summary, flush=True)
  if report.refusal:
    print(report.refusal, file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
