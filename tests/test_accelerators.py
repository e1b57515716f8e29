"""bert_jax/accelerators.py: the one table of accelerator facts, and its readers agreeing on it.

The launcher (workers per slice), the preflight (topology, devices, HBM), the cost
estimate (devices of a device set) and the MFU (peak per device kind) once each
parsed "vN-M" their own way from their own table; now they read this one.
"""

import pytest

from bert_jax import accelerators
from bert_jax.launch import plan as launch_plan
from bert_jax.preflight import targets
from bert_jax.pretrain import cost


def test_every_generation_has_a_peak_and_every_alias_a_generation():
  """Fails if a generation's device kind has no peak TFLOP/s (no MFU on it), an alias names no
  generation, or the parser accepts a name it should refuse."""
  assert all(g.device_kind in accelerators.PEAK_TFLOPS for g in accelerators.GENERATIONS.values())
  assert all(g in accelerators.PEAK_TFLOPS for g in accelerators.GPUS.values())
  assert set(accelerators.ALIASES.values()) <= set(accelerators.GENERATIONS)
  assert accelerators.canonical("v5e-16") == "v5litepod-16"
  assert accelerators.canonical(" v4-32 ") == "v4-32"
  assert accelerators.canonical("tpu-32") == "tpu-32"  # not a type: left for the caller to refuse
  for name in ("v9-8", "v4", "v4-", "4-32", "v4-32x"):
    assert accelerators.parse(name) is None, name


@pytest.mark.parametrize("name", ["v4-8", "v4-32", "v5p-8", "v5litepod-16", "v5e-256", "v6e-8",
                                  "v6e-16"])
def test_launcher_preflight_and_cost_read_the_same_slice(name):
  """Fails if the preflight's devices, the cost estimate's devices and the launcher's workers
  disagree with the table for one slice (each used to keep its own copy)."""
  generation, number = accelerators.parse(name)
  tpu = targets.target(name)
  kind, devices = cost.device_set(name)
  assert tpu.num_devices == devices == accelerators.devices(generation, number)
  assert kind == generation.device_kind
  assert tpu.hbm_gib == generation.hbm_gib > 0
  workers = launch_plan.num_workers(name)
  assert workers == (1 if number <= generation.single_host_max
                     else number // generation.count_unit)
  assert launch_plan.default_runtime_version(name) == generation.runtime_version


def test_the_figures_as_the_sources_state_them():
  """Fails if a figure moved: HBM per chip (Cloud TPU architecture pages), dense bf16 peak per
  JAX device (a v2/v3 device is one TensorCore, half a chip)."""
  hbm = {n: g.hbm_gib for n, g in accelerators.GENERATIONS.items()}
  assert hbm == {"v2": 0.0, "v3": 0.0, "v4": 32.0, "v5litepod": 16.0, "v5p": 95.0, "v6e": 32.0}
  peak = accelerators.PEAK_TFLOPS
  assert (peak["TPU v2"], peak["TPU v3"], peak["TPU v4"], peak["TPU v5 lite"]) == (
      22.5, 61.5, 275.0, 197.0)
  assert (peak["TPU v5p"], peak["TPU v6 lite"], peak["NVIDIA H200"]) == (459.0, 918.0, 989.0)
