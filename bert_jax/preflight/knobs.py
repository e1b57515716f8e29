"""The knobs that make a pretraining step fit a chip's HBM, tried in order of extra compute.

When a phase does not fit, bert_jax.preflight compiles the step again with
each setting below, in this order, and stops at the first with which every
phase fits. The order is the cost each adds to a step:

  1. fsdp (--config.mesh.data=1 --config.mesh.fsdp=-1): parameters, gradients and
     Adam's moments split over every device instead of copied on each. No extra
     FLOPs; the price is all-gathers of the weights and reduce-scatters of the
     gradients, which XLA overlaps with compute on the ICI. It shrinks the
     arguments, not the activations.
  2. a remat policy (config.model.remat_policy, bert_jax.model.config.REMAT_POLICIES),
     lightest first: dots_saveable (recomputes only element-wise work),
     dots_with_no_batch_dims_saveable (also the attention matmuls),
     save_qkv_out_proj (also the FFN), full (one extra forward, ~+33% FLOPs).
     XLA's FLOPs per step are printed with each, so the recomputation shows.
  3. gradient accumulation (config.grad_accum_steps = 2, 4, 8...), with the
     full policy: the same update from smaller micro-batches. It adds no FLOPs
     but runs each matmul on half (a quarter...) the rows in sequence; at the
     paper's global batch of 256 a 16-chip slice already has only 16 sequences
     per chip, so halving them costs more MXU utilisation than recomputing. It
     comes last, for the configurations nothing else fits.

Each setting keeps the earlier ones (fsdp stays on while remat is tried).
"""

import copy
import dataclasses
from typing import Any, Callable, Sequence

import ml_collections

from bert_jax.model import encoder as model_lib
from bert_jax.preflight.targets import PreflightError
from bert_jax.pretrain import phases as phases_lib
from bert_jax.training import sharding

GIB = float(1 << 30)

# Lightest (least recomputation) first; "none" keeps everything and is the default.
REMAT_LADDER = ("dots_saveable", "dots_with_no_batch_dims_saveable", "save_qkv_out_proj", "full")
assert set(REMAT_LADDER) < set(model_lib.REMAT_POLICIES), "a policy the model no longer has"


@dataclasses.dataclass
class Attempt:
  """One knob setting and what compiling it gave."""
  settings: dict[str, Any]          # config field ("mesh.fsdp") -> value
  measurements: list[Any]           # bert_jax.preflight.compile.Measurement, one per phase compiled
  complete: bool                    # every phase compiled (not only the failing ones)
  refused: str = ""                 # the trainer's refusal of the setting, if any

  @property
  def flags(self) -> str:
    """The setting as bert_jax.main / launch flags."""
    return " ".join(f"--config.{k}={v}" for k, v in self.settings.items())

  @property
  def fits(self) -> bool:
    return (self.complete and not self.refused
            and all(m.fits for m in self.measurements))

  @property
  def worst_gib(self) -> float:
    return max((m.total_bytes for m in self.measurements), default=0.0) / GIB

  def line(self) -> str:
    """'--config.X=V: phase 2 12.3 GiB (XLA 1.2e13 FLOPs), phase 1 ...: fits'."""
    if self.refused:
      return f"{self.flags}: {self.refused}"
    parts = []
    for m in self.measurements:
      part = m.short()
      if m.flops:
        part += f" (XLA {m.flops:.3g} FLOPs/device)"
      parts.append(part)
    return f"{self.flags}: {', '.join(parts)}: {'fits' if self.fits else 'does not fit'}"


def candidates(config: ml_collections.ConfigDict, num_devices: int) -> list[dict[str, Any]]:
  """The settings to try, in the module docstring's order (each a dict of config fields)."""
  data, fsdp, tensor = sharding.mesh_shape(config.mesh, num_devices)
  base: dict[str, Any] = {}
  out = []
  if data > 1:  # not yet fully sharded
    base = {"mesh.data": 1, "mesh.fsdp": -1}
    out.append(dict(base))
  current = config.model.remat_policy
  start = REMAT_LADDER.index(current) + 1 if current in REMAT_LADDER else 0
  for policy in REMAT_LADDER[start:]:
    out.append({**base, "model.remat_policy": policy})
  heaviest = {"model.remat_policy": "full"} if current != "full" else {}
  dp = (data * fsdp) if not base else num_devices // tensor
  k = config.grad_accum_steps * 2
  while config.batch_size % (dp * k) == 0:
    out.append({**base, **heaviest, "grad_accum_steps": k})
    k *= 2
  return out


def apply(config: ml_collections.ConfigDict, settings: dict[str, Any]) -> ml_collections.ConfigDict:
  """A copy of `config` with dotted fields ("model.remat_policy") set."""
  config = copy.deepcopy(config)
  with config.unlocked():
    config.update_from_flattened_dict(settings)
  return config


def search(config: ml_collections.ConfigDict, num_devices: int,
           measure: Callable[[ml_collections.ConfigDict, Sequence[int]], list[Any]],
           failing_phases: Sequence[int], progress: Callable[[str], None] | None = None
           ) -> list[Attempt]:
  """Tries candidates() in order; stops at the first with which every phase fits.

  `measure(config, phases)` compiles those phases of a config for the slice
  (bert_jax.preflight.compile.measure bound to it) and returns their Measurements. A
  setting whose compile crashed libtpu (a Measurement with `crash`, from
  measure's child process) is refused ("libtpu crashed compiling this setting
  (signal 11, SIGSEGV); skipped") and the search goes on to the next.

  Each candidate compiles the failing phases first; only one that fits them
  compiles the others (a knob that shrinks one phase shrinks them all, but
  that is checked, not assumed).
  """
  attempts = []
  for settings in candidates(config, num_devices):
    if _cannot_fit(settings, attempts):
      continue
    trial = apply(config, settings)
    if progress:
      progress(f"preflight: trying {Attempt(settings, [], False).flags}")
    try:
      first = measure(trial, failing_phases)
    except PreflightError as e:
      attempts.append(Attempt(settings, [], False, refused=str(e)))
      continue
    attempt = Attempt(settings, first, complete=False)
    if all(m.fits for m in first):
      rest = [q["phase"] for q in phases_lib.shapes(trial) if q["phase"] not in failing_phases]
      attempt.measurements += measure(trial, rest) if rest else []
      attempt.measurements.sort(key=lambda m: m.phase)
      attempt.complete = True
    crashed = [m for m in attempt.measurements if m.crash]
    if crashed:  # libtpu died compiling it: no figure, never a fit
      attempt.refused = f"libtpu crashed compiling this setting ({crashed[0].crash}); skipped"
    attempts.append(attempt)
    if attempt.fits:
      break
  return attempts


def _cannot_fit(settings: dict[str, Any], attempts: list[Attempt]) -> bool:
  """Whether a gradient-accumulation setting is sure not to fit, judged from the last attempt.

  Temporaries are a fixed part (gradients, optimizer work) plus a part that
  scales with the micro-batch; scaling the whole of the last attempt's by
  k_last / k therefore underestimates the need, so a setting skipped here
  would not have fitted. It spares the compiles of k = 2, 4, 8... when a
  batch is many times too large.
  """
  k = settings.get("grad_accum_steps")
  last = attempts[-1] if attempts else None
  if k is None or last is None or not last.measurements or last.refused:
    return False
  if any(m.other_space for m in last.measurements):  # no HBM figure to scale: compile it
    return False
  k_last = last.settings.get("grad_accum_steps", 1)
  return any(m.argument_bytes + m.temp_bytes * k_last / k > m.available_bytes
             for m in last.measurements)
