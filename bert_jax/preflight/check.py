"""Preflight's verdict: every phase of a run compiled for a slice, and the knobs searched.

`run` compiles every phase of a pretraining config for an accelerator type
(bert_jax.preflight.compile.measure) and, when one does not fit, tries the
knob settings of bert_jax.preflight.knobs, cheapest first; its Report holds
the printed summary and the one-line refusal. `load_config` reads a config as
bert_jax.main would, without touching the caller's flags. The command line is
bert_jax/preflight/__main__.py; bert_jax.launch runs it in a child process
before it creates a slice.
"""

import dataclasses
from typing import Any, Callable, Sequence

import jax
import ml_collections

from bert_jax.preflight import compile as compile_lib
from bert_jax.preflight import knobs as preflight_knobs
from bert_jax.preflight.targets import PreflightError, devices, target
from bert_jax.training import sharding

GIB = compile_lib.GIB


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


@dataclasses.dataclass
class Report:
  """A preflight's outcome: the printed summary and, when it does not fit, the refusal line."""
  summary: str
  refusal: str               # "" when every phase fits
  measurements: list[compile_lib.Measurement]
  fix: Any = None            # bert_jax.preflight.knobs.Attempt that fits, when one was needed


def run(config: ml_collections.ConfigDict, accelerator_type: str, *, name: str = "",
        search: bool = True, progress: Callable[[str], None] | None = None,
        isolate: bool = True) -> Report:
  """Compiles every phase of `config` for `accelerator_type`; searches knobs when one does not fit.

  `progress` (e.g. a print to stderr) hears of each compile as it finishes.
  `isolate`: each compile_lib.measure() in a child process (see there), so that a
  crash of libtpu is reported (a phase that crashed as configured is searched like
  one that does not fit; a knob setting that crashes is skipped), never a fit.
  """
  tpu = target(accelerator_type)
  slice_devices = devices(tpu)
  bert_config = compile_lib.bert_config_of(config)
  vocab, source = compile_lib.vocab_size(config)
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
  measurements = compile_lib.measure(config, tpu, slice_devices, progress=progress,
                                     isolate=isolate)
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
      lambda c, only: compile_lib.measure(c, tpu, slice_devices, only, progress, isolate=isolate),
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
