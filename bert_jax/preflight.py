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
collectives of the compiled program (counted as experiments/benchmarks/sharding.py
counts them). XLA's cost analysis counts a loop's body once: with gradient
accumulation or config.model.scan_layers its FLOPs are one micro-batch's or one
layer's, so bert_jax.cost's model FLOPs are printed beside them. A phase that does not fit is refused with one line naming the
phase, the GiB needed and available, and the cheapest knob setting that fits:
bert_jax.preflight_knobs tries them in order of extra compute (compiling each).

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
from bert_jax import preflight_knobs
from bert_jax import pretrain_step
from bert_jax import sharding
from bert_jax import train_state as state_lib
from bert_jax.preflight_targets import PreflightError, Target, devices, target  # noqa: F401
from experiments.benchmarks import sharding as sharding_bench

GIB = float(1 << 30)
# libtpu's refusals: "...HLO temporaries (29.40G) exceeds available HBM (15.75G)" and
# "Used 24.50G of 15.75G hbm": XLA's HumanReadableNumBytes, powers of 1024.
_SIZE = re.compile(r"([0-9.]+)([KMGT])\b")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


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
  refused: str = ""            # libtpu's out-of-memory message (then temp_bytes is its figure)
  devices: int = 1
  compile_s: float = 0.0

  @property
  def fits(self) -> bool:
    return not self.refused and self.total_bytes <= self.available_bytes

  def line(self) -> str:
    """'phase 2 (512 tokens, 77 predictions): args .. + temps .. = .. GiB of .. GiB: fits; ...'."""
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


def _available(message: str, hbm_gib: float) -> tuple[float, float]:
  """(needed, available) bytes from libtpu's out-of-memory message (available: the chip's)."""
  sizes = [float(n) * _UNITS[u] for n, u in _SIZE.findall(message)]
  if len(sizes) >= 2:
    return sizes[0], sizes[1]
  return float("nan"), hbm_gib * GIB


def compile_phase(config: ml_collections.ConfigDict, tpu: Target, slice_devices: list,
                  phase: dict[str, Any]) -> Measurement:
  """Compiles the train step of `config` at one phase's shapes for the slice; its figures.

  The trainer's sections "mesh", "model and optimizer", "shardings" and "step"
  (bert_jax.pretrain), on abstract arrays over the slice's devices.
  """
  started = time.time()
  seq_len, predictions = phase["seq_len"], phase["predictions"]
  bert_config = bert_config_of(config)
  mesh = sharding.make_mesh(config.mesh, slice_devices)
  rules = [(name, tuple(axes) if isinstance(axes, list) else axes)
           for name, axes in config.logical_axis_rules]
  with compiling_for(slice_devices[0]):
    _check_config(config, bert_config, mesh)
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
    batch = sharding_bench.abstract_batch(config.batch_size, seq_len, predictions, layout.batch)
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
  # What the arguments take per device, from their shardings: known even when libtpu refuses.
  argument_bytes = float(sum(jnp.dtype(x.dtype).itemsize * math.prod(x.sharding.shard_shape(x.shape))
                             for x in jax.tree.leaves((layout.abstract, batch))))
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    message = str(e)
    if "RESOURCE_EXHAUSTED" not in message and "hbm" not in message.lower():
      raise
    needed, available = _available(message, tpu.hbm_gib)
    line = next((l for l in message.splitlines() if "memory" in l.lower()), message)
    return Measurement(phase["phase"], seq_len, predictions, argument_bytes=argument_bytes,
                       temp_bytes=needed, total_bytes=argument_bytes + needed,
                       available_bytes=available, refused=line.strip()[:300],
                       compile_s=time.time() - started)
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  stats = sharding_bench.collective_stats(compiled.as_text(), config.batch_size, seq_len,
                                          bert_config.hidden_size)
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
            only_phases: Sequence[int] = (), progress: Callable[[str], None] | None = None
            ) -> list[Measurement]:
  """compile_phase for every phase of the run (or those in `only_phases`); `progress` is
  told each result as it comes (a large model's compile takes minutes on a CPU)."""
  out = []
  for p in phases_lib.phases(config):
    if not only_phases or p["phase"] in only_phases:
      out.append(compile_phase(config, tpu, slice_devices, p))
      if progress:
        progress(f"preflight: {out[-1].line()}")
  return out


@dataclasses.dataclass
class Report:
  """A preflight's outcome: the printed summary and, when it does not fit, the refusal line."""
  summary: str
  refusal: str               # "" when every phase fits
  measurements: list[Measurement]
  fix: Any = None            # bert_jax.preflight_knobs.Attempt that fits, when one was needed


def run(config: ml_collections.ConfigDict, accelerator_type: str, *, name: str = "",
        search: bool = True, progress: Callable[[str], None] | None = None) -> Report:
  """Compiles every phase of `config` for `accelerator_type`; searches knobs when one does not fit.

  `progress` (e.g. a print to stderr) hears of each compile as it finishes.
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
  measurements = measure(config, tpu, slice_devices, progress=progress)
  lines += ["  " + m.line() for m in measurements]
  failing = [m for m in measurements if not m.fits]
  if not failing:
    return Report("\n".join(lines), "", measurements)
  worst = max(failing, key=lambda m: m.total_bytes)
  needs = (f"phase {worst.phase} ({worst.seq_len} tokens) of {name or config.get('variant', '')} "
           f"needs {'>= ' if worst.refused else ''}{worst.total_bytes / GIB:.2f} GiB of HBM per "
           f"chip on {accelerator_type}, which has {worst.available_bytes / GIB:.2f} GiB")
  if not search:
    return Report("\n".join(lines), f"preflight: {needs}", measurements)
  attempts = preflight_knobs.search(
      config, tpu.num_devices, lambda c, only: measure(c, tpu, slice_devices, only, progress),
      [m.phase for m in failing], progress)
  lines.append("  knobs tried, least extra compute first (each compiled):")
  lines += ["    " + a.line() for a in attempts]
  fix = next((a for a in attempts if a.fits), None)
  if fix:
    lines.append(f"  cheapest that fits: {fix.flags}")
    refusal = (f"preflight: {needs}; cheapest fix that fits: {fix.flags} "
               f"({fix.worst_gib:.2f} GiB)")
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
