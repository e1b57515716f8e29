"""Cloud TPU slices as compile targets: gcloud accelerator type -> topology and HBM per chip.

bert_jax.preflight compiles the train step for a slice on a machine without a
TPU, through libtpu's compile-only client (jax.experimental.topologies), as
MaxText's train_compile.py does. That client wants a topology name
("v4:2x2x4") and a chip configuration; this module turns the names gcloud and
bert_jax.launch use ("v4-32", "v5litepod-16", "v6e-8"; "v5e-16" is an alias
of "v5litepod-16") into them. `out_of_memory` reads libtpu's refusal of a
program that does not fit one of the chip's memory spaces (HBM, or an on-chip
one such as VMEM).
"""

import dataclasses
import os
import re

from bert_jax import accelerators

# libtpu's out-of-memory refusals, as libtpu 0.0.42.1 words them (tests/test_preflight.py
# compiles programs that provoke each and reads them back):
#   "Ran out of memory on HBM, the total memory required for HLO temporaries (40.00G)
#    exceeds available HBM (30.75G)."
#   "... Ran out of memory in memory space hbm. Used 24.50G of 15.75G hbm. Exceeded hbm
#    capacity by 8.75G. ..." (any memory space by name: hbm, vmem, ...)
#   "Allocation (size=67108864) would exceed memory (size=16777216) :: #allocation2
#    [shape = 'u8[67108864]{0}', space=vmem, size = 0x4000000, scoped, ...]" (a kernel's or
#    fusion's scoped on-chip buffer, in bytes)
# Sizes are XLA's HumanReadableNumBytes (powers of 1024) unless given as size=BYTES.
_HLO_TEMPS = re.compile(r"HLO temporaries \(([0-9.]+[BKMGTPE]?)\) exceeds available HBM "
                        r"\(([0-9.]+[BKMGTPE]?)\)")
_SPACE_USED = re.compile(r"Ran out of memory in memory space (\w+)\. Used ([0-9.]+[BKMGTPE]?) of "
                         r"([0-9.]+[BKMGTPE]?)\b")
_ALLOCATION = re.compile(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)")
_SPACE_NAMED = re.compile(r"\bspace=(\w+)|\bin memory space (\w+)")
_UNITS = {"B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50, "E": 2**60}
# What each on-chip space is, for the refusal line (names as libtpu prints them).
_SPACE_NAMES = {"hbm": "HBM", "vmem": "VMEM (on-chip vector memory)",
                "smem": "SMEM (on-chip scalar memory)", "cmem": "CMEM (on-chip common memory)",
                "sflag": "SFLAG (on-chip sync flags)"}


@dataclasses.dataclass(frozen=True)
class OutOfMemory:
  """libtpu's refusal of a program: which memory space, and its bytes needed and available."""
  space: str          # as libtpu names it: "hbm", "vmem", ...; "memory space N"; "" if unnamed
  needed: float       # bytes (nan when the message gives none)
  available: float    # bytes (nan when the message gives none)
  line: str           # the message's line that says so

  @property
  def is_hbm(self) -> bool:
    return self.space == "hbm"

  @property
  def space_name(self) -> str:
    """'HBM', 'VMEM (on-chip vector memory)', 'memory space 3', 'an unnamed memory space'."""
    return _SPACE_NAMES.get(self.space, self.space.upper() if self.space.isalpha()
                            else self.space or "an unnamed memory space")


def _bytes(size: str) -> float:
  """'16.00M' -> 16777216.0 (a bare number is bytes)."""
  unit = size[-1] if size[-1] in _UNITS else "B"
  return float(size.rstrip("".join(_UNITS))) * _UNITS[unit]


def out_of_memory(message: str) -> OutOfMemory | None:
  """The memory space and figures of libtpu's out-of-memory refusal; None for another error.

  Tells HBM apart from the chip's other memory spaces: a fusion or kernel that
  overflows the on-chip scoped VMEM (16 MiB on v4) is refused with that
  space's figures, which are not HBM's and must not be read as such.
  """
  lower = message.lower()
  if "resource_exhausted" not in lower and "out of memory" not in lower:
    return None
  line = next((l for l in message.splitlines()
               if "memory" in l.lower() or "allocation" in l.lower()), message).strip()[:300]
  if match := _HLO_TEMPS.search(message):
    return OutOfMemory("hbm", _bytes(match[1]), _bytes(match[2]), line)
  if match := _SPACE_USED.search(message):
    return OutOfMemory(match[1].lower(), _bytes(match[2]), _bytes(match[3]), line)
  named = _SPACE_NAMED.search(message)
  space = (named[1] or named[2]).lower() if named else ""
  if space.isdigit():
    space = f"memory space {space}"
  if not space and "hbm" in lower:
    space = "hbm"
  if match := _ALLOCATION.search(message):
    return OutOfMemory(space, float(match[1]), float(match[2]), line)
  return OutOfMemory(space, float("nan"), float("nan"), line)


class PreflightError(Exception):
  """A slice or configuration preflight refuses; str() is one line saying what to do."""


@dataclasses.dataclass(frozen=True)
class Target:
  """One slice as jax.experimental.topologies.get_topology_desc wants it."""
  accelerator_type: str       # gcloud's name, e.g. "v5litepod-16"
  family: str                 # its generation: a key of bert_jax.accelerators.GENERATIONS
  topology_name: str          # e.g. "v5e:4x4"
  chip_config_name: str       # "megacore" (v4, v5p) or "default"
  chips_per_host_bounds: tuple[int, int, int]
  wrap: tuple[bool, bool, bool]
  num_devices: int

  @property
  def hbm_gib(self) -> float:
    """HBM per device (chip), GiB."""
    return accelerators.GENERATIONS[self.family].hbm_gib


def target(accelerator_type: str) -> Target:
  """The Target of a gcloud accelerator type ("v4-32", "v5litepod-16", "v5e-16", "v6e-8").

  Raises:
    PreflightError: naming the types this module knows.
  """
  parsed = accelerators.parse(accelerator_type)
  if parsed is None or not parsed[0].hbm_gib:
    raise PreflightError(f"accelerator type {accelerator_type!r}: preflight knows v4-N, v5p-N, "
                         "v5litepod-N (alias v5e-N) and v6e-N")
  generation, number = parsed
  chips = accelerators.devices(generation, number)
  shapes = generation.shapes
  if chips not in shapes:
    sizes = ", ".join(f"{generation.name}-{int(c / generation.devices_per_unit)}" for c in shapes)
    raise PreflightError(f"accelerator type {accelerator_type!r}: no topology known for "
                         f"{chips} chips (known: {sizes})")
  if shapes is accelerators.CUBES:
    wrap = (True, True, True) if chips >= 64 else (False, False, False)
  else:
    wrap = accelerators.PLANE_WRAP.get(chips, (False, False, False))
  return Target(accelerator_type=accelerator_type, family=generation.name,
                topology_name=f"{generation.topology_prefix}:{shapes[chips]}",
                chip_config_name=generation.chip_config,
                chips_per_host_bounds=(1, 1, 1) if chips == 1 else (2, 2, 1), wrap=wrap,
                num_devices=chips)


def devices(tpu: Target) -> list:
  """The slice's devices from libtpu's compile-only client (no TPU needed).

  Raises:
    PreflightError: when libtpu is not installed (pip install '.[dev]' or jax[tpu]).
  """
  # A process that already initialised libtpu (any JAX process on a machine where libtpu
  # is installed tries to) holds /tmp/libtpu_lockfile; the compile-only client touches no
  # chip, so a second loader is safe, and without this it fails with ABORTED.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # Without it libtpu asks the GCE metadata server what it runs on.
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  try:
    import libtpu  # pylint: disable=g-import-not-at-top,unused-import  # noqa: F401
  except ImportError:
    raise PreflightError(
        "preflight needs libtpu to compile for a TPU slice: pip install -e '.[dev]' (or "
        "'jax[tpu]'), or skip the check with --skip_preflight") from None
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  desc = topologies.get_topology_desc(
      platform="tpu", topology_name=tpu.topology_name, chip_config_name=tpu.chip_config_name,
      chips_per_host_bounds=tpu.chips_per_host_bounds, wrap=tpu.wrap)
  found = list(desc.devices)
  if len(found) != tpu.num_devices:
    raise PreflightError(f"{tpu.accelerator_type}: libtpu's topology {tpu.topology_name} has "
                         f"{len(found)} devices, expected {tpu.num_devices}")
  return found
