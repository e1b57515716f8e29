"""One table of accelerator facts: TPU generations and GPUs, and one parser of their names.

Everything that needs to know what "v4-32" or "v5e-16" is reads it here: the
launcher (workers per slice, the TPU VM image, gcloud's name for an alias),
the preflight (libtpu's topology, chips per host, HBM per chip), the cost
estimate (JAX devices of a device set) and the MFU (peak TFLOP/s per device
kind). A Cloud TPU accelerator type is "<generation>-<number>": the number
counts TensorCores for v2/v3/v4/v5p and chips for v5e (v5litepod) and v6e
(cloud.google.com/tpu/docs: "TPU versions", v5e and v6e "Supported
configurations"). Imports nothing heavy (the launcher reads it without JAX).
"""

import dataclasses
import re

# (Sources, per figure.) HBM per chip in GiB, as Google's Cloud TPU system-architecture
# pages state it: v4 "32 GiB HBM2", v5e "16 GiB HBM2", v5p "95 GiB HBM2e", v6e "32 GB HBM"
# (MaxText's table says the same in its comments). The compiler keeps a little for
# itself: libtpu's own limit, when a program exceeds it, is in its error (15.75G on v5e).
# Topology names and bounds as MaxText's src/maxtext/utils/accelerator_to_spec_map.py
# gives them to jax.experimental.topologies.get_topology_desc.
CUBES = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
         256: "4x8x8", 512: "8x8x8"}  # v4 / v5p chips -> 3-D torus shape
PLANES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
          256: "16x16"}  # v5e / v6e chips -> 2-D shape
PLANE_WRAP = {128: (False, True, False), 256: (True, True, False)}  # wraparound links


@dataclasses.dataclass(frozen=True)
class Generation:
  """One TPU generation: how its slices are named, laid out over VMs and compiled for."""
  name: str                 # gcloud's: the key of GENERATIONS ("v5litepod", not "v5e")
  device_kind: str          # jax Device.device_kind of its devices
  devices_per_unit: float   # JAX devices per unit of the type's number (v4: a chip = 2 cores)
  count_unit: int           # type number per worker (VM) on multi-host slices
  single_host_max: int      # the largest number that still fits on one VM
  runtime_version: str      # default TPU VM software image
  hbm_gib: float = 0.0      # HBM per chip (0: preflight knows no target for it)
  topology_prefix: str = ""  # libtpu's topology name prefix ("v5e:4x4"); "" as hbm_gib
  chip_config: str = ""     # libtpu's chip configuration: "megacore" (v4, v5p) or "default"

  @property
  def shapes(self) -> dict[int, str]:
    """Chips -> libtpu topology shape: a 3-D torus (v4, v5p) or a 2-D plane (v5e, v6e)."""
    return CUBES if self.chip_config == "megacore" else PLANES


# On v2/v3 each TensorCore is a device; from v4 on a device is a chip. v5e/v6e
# multi-host slices use 4-chip VMs while v5litepod-8 / v6e-8 are one 8-chip VM.
# One row per generation, in Generation's field order:
#  name         device kind     per unit, unit, one-host max, TPU VM image,  HBM, topology, chips
GENERATIONS = {row[0]: Generation(*row) for row in (
    ("v2", "TPU v2", 1.0, 8, 8, "tpu-ubuntu2204-base"),
    ("v3", "TPU v3", 1.0, 8, 8, "tpu-ubuntu2204-base"),
    ("v4", "TPU v4", 0.5, 8, 8, "tpu-ubuntu2204-base", 32.0, "v4", "megacore"),
    ("v5litepod", "TPU v5 lite", 1.0, 4, 8, "v2-alpha-tpuv5-lite", 16.0, "v5e", "default"),
    ("v5p", "TPU v5p", 0.5, 8, 8, "v2-alpha-tpuv5", 95.0, "v5", "megacore"),
    ("v6e", "TPU v6 lite", 1.0, 4, 8, "v2-alpha-tpuv6e", 32.0, "v6e", "default"),
)}
# Names people use for the same hardware; gcloud itself wants the key of GENERATIONS.
ALIASES = {"v5e": "v5litepod"}

# GPUs by the short name a device set uses ("8xH200") -> jax Device.device_kind.
GPUS = {"H200": "NVIDIA H200", "H100": "NVIDIA H100 80GB HBM3", "A100": "NVIDIA A100-SXM4-80GB"}

# Dense bf16 peak TFLOP/s per JAX device, by jax Device.device_kind (for MFU). On TPU v2
# and v3 each TensorCore is a device (half a chip: 45 and 123 TFLOP/s per chip); from v4
# on a device is a chip.
PEAK_TFLOPS = {
    "TPU v2": 22.5, "TPU v3": 61.5, "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5e": 197.0,
    "TPU v5p": 459.0,
    "TPU v6 lite": 918.0, "NVIDIA A100-SXM4-40GB": 312.0, "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H200": 989.0,
}

_TYPE = re.compile(r"(v\w+?)-(\d+)")


def parse(accelerator_type: str) -> "tuple[Generation, int] | None":
  """(generation, number) of "v4-32", "v5litepod-16", "v5e-16" (an alias); None when the name
  is not <known generation>-<number>."""
  match = _TYPE.fullmatch(accelerator_type.strip())
  if not match:
    return None
  generation = GENERATIONS.get(ALIASES.get(match.group(1), match.group(1)))
  return (generation, int(match.group(2))) if generation else None


def canonical(accelerator_type: str) -> str:
  """The name gcloud knows: 'v5e-16' -> 'v5litepod-16' (anything else unchanged)."""
  parsed = parse(accelerator_type)
  return f"{parsed[0].name}-{parsed[1]}" if parsed else accelerator_type


def one_host_type(accelerator_type: str) -> str:
  """The largest slice of the same generation on one VM: 'v4-32' -> 'v4-8' (the type itself
  when it is not a known <generation>-<number>)."""
  parsed = parse(accelerator_type)
  return f"{parsed[0].name}-{parsed[0].single_host_max}" if parsed else accelerator_type


def devices(generation: Generation, number: int) -> int:
  """JAX devices of a slice: v4-32 -> 16 (megacore chips), v3-32 -> 32 (cores), v6e-8 -> 8."""
  return max(1, int(number * generation.devices_per_unit))
