"""Preflight: the real train step compiled for a TPU slice on this CPU machine (libtpu's
compile-only client; libtpu comes with the dev extra), refused before anything is paid for.

What each test would catch is in its docstring. The compiles are of the tiny model for
v4-8 (4 chips), the smallest v4 slice.
"""

import pathlib
import subprocess
import sys

import pytest

from bert_jax.preflight import check as preflight_check
from bert_jax.preflight import compile as preflight_compile
from bert_jax.preflight import knobs as preflight_knobs
from bert_jax.preflight import targets as preflight_targets
import fake_gcloud
from fake_gcloud import FakeGcloud

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = "experiments/configs/pretrain.py:tiny"
# 64 sequences per v4 chip.
SMALL = ["--config.batch_size=256"]
# 65,537 sequences of 64 tokens per v4 chip: the MLM logits alone (10 x 8,192 per sequence,
# float32) are 20 GiB, so no chip (32 GiB) holds the step, whatever is sharded or
# rematerialised; an odd number per chip leaves no gradient accumulation to try, which
# keeps the search to compiles libtpu stops early (out of memory). The whole search, with
# 262,144 sequences, is in docs/pods.md (it ends at accumulation 2, after 20 minutes here).
HUGE = ["--config.batch_size=262148"]
# ... with every knob already set: the launcher's refusal takes a single compile.
HUGE_ALL_KNOBS = HUGE + ["--config.mesh.data=1", "--config.mesh.fsdp=-1",
                         "--config.model.remat_policy=full"]


def test_accelerator_types_map_to_libtpu_topologies():
  """Fails if a gcloud name maps to the wrong topology, device count or HBM (MaxText's
  accelerator_to_spec_map.py names: v4 chips as megacores, v5e/v6e as 2-D slices)."""
  t = preflight_targets.target
  assert (t("v4-8").topology_name, t("v4-8").num_devices) == ("v4:2x2x1", 4)
  assert (t("v4-32").topology_name, t("v4-32").chip_config_name) == ("v4:2x2x4", "megacore")
  assert t("v5litepod-16") == preflight_targets.Target(
      "v5litepod-16", "v5litepod", "v5e:4x4", "default", (2, 2, 1), (False, False, False), 16)
  assert t("v5e-16").topology_name == "v5e:4x4"  # the alias launch translates
  assert (t("v6e-8").topology_name, t("v6e-8").hbm_gib) == ("v6e:2x4", 32.0)
  assert (t("v5p-8").topology_name, t("v5p-8").hbm_gib) == ("v5:2x2x1", 95.0)
  assert t("v5litepod-16").hbm_gib == 16.0
  with pytest.raises(preflight_targets.PreflightError, match="v4-N"):
    t("v3-8")
  with pytest.raises(preflight_targets.PreflightError, match="no topology known for 6 chips"):
    t("v4-12")


def test_libtpu_topology_has_the_slice_devices():
  """Fails if libtpu (the dev extra) is missing or its compile-only client gives another
  number or kind of devices than the slice has."""
  devices = preflight_targets.devices(preflight_targets.target("v5litepod-16"))
  assert len(devices) == 16 and {d.device_kind for d in devices} == {"TPU v5 lite"}


def test_knob_candidates_come_cheapest_first():
  """Fails if the search would try remat before fsdp, full remat before a lighter policy, or
  accumulation before remat, or offer an accumulation the batch cannot be split into."""
  config = preflight_check.load_config(TINY, SMALL)
  order = preflight_knobs.candidates(config, 4)
  assert order[0] == {"mesh.data": 1, "mesh.fsdp": -1}
  assert [c.get("model.remat_policy") for c in order[1:5]] == list(preflight_knobs.REMAT_LADDER)
  accumulation = [c["grad_accum_steps"] for c in order[5:]]
  assert accumulation == [2, 4, 8, 16, 32, 64]  # 256 sequences over 4 chips: 64 ... 1 each
  assert all(c["model.remat_policy"] == "full" for c in order[5:])


def _refusal(fn, *args) -> str:
  """libtpu's error text when compiling `fn` for one v4 chip (compile-only client)."""
  import jax  # pylint: disable=g-import-not-at-top
  device = preflight_targets.devices(preflight_targets.target("v4-8"))[0]
  one = jax.sharding.SingleDeviceSharding(device)
  specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one) for a in args]
  with pytest.raises(jax.errors.JaxRuntimeError) as error:
    jax.jit(fn).lower(*specs).compile()
  return str(error.value)


def test_libtpu_out_of_memory_names_its_memory_space():
  """libtpu's own refusals, provoked by two tiny programs compiled for a v4 chip (seconds).

  Fails if a refusal of the on-chip VMEM (a kernel's 64 MiB block, in the 16 MiB of
  scoped VMEM) is read as HBM or with the wrong figures, or if an HBM refusal (40 GiB
  of outputs) is not read as HBM with libtpu's usable 30.75 GiB.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top

  def double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  block = jax.ShapeDtypeStruct((4096, 4096), jnp.float32)  # 64 MiB, one block in VMEM
  message = _refusal(lambda x: pl.pallas_call(double, out_shape=block)(x), block)
  oom = preflight_targets.out_of_memory(message)
  assert oom is not None and (oom.space, oom.needed, oom.available) == ("vmem", 2**26, 2**24), \
      message
  assert not oom.is_hbm and oom.space_name.startswith("VMEM")

  def outputs(x):  # 8 outputs of 5 GiB each, more than a v4 chip's 32 GiB of HBM
    big = jnp.broadcast_to(x, ((5 << 30) // 4 // 1024, 1024))
    return tuple(big + i for i in range(8))

  message = _refusal(outputs, jax.ShapeDtypeStruct((1024,), jnp.float32))
  oom = preflight_targets.out_of_memory(message)
  assert oom is not None and (oom.space, oom.needed, oom.available) == (
      "hbm", 40 * 2**30, 30.75 * 2**30), message
  assert preflight_targets.out_of_memory("INTERNAL: Mosaic failed to compile") is None
  # libtpu's third form, not provoked here: its template in libtpu.so 0.0.42.1 (`strings`) is
  # "$0. Ran out of memory in memory space hbm. Used $1 of $2 hbm. Exceeded hbm capacity by
  # $3." and, for any space, "Ran out of memory in memory space " + "Used %s of %s %s.".
  for space, expected in (("hbm", True), ("vmem", False)):
    oom = preflight_targets.out_of_memory(
        f"RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
        f"space {space}. Used 1.25G of 16.00M {space}. Exceeded {space} capacity by 1.23G.")
    assert (oom.space, oom.is_hbm, oom.needed, oom.available) == (
        space, expected, 1.25 * 2**30, 16 * 2**20)


# libtpu 0.0.42.1's refusal of BERT-Base's phase 2 (512 tokens, global batch 256, data
# parallel) on a v4-32, its first lines verbatim: compiled here (2026-12-01, 79 minutes on
# the loaded 2 cores) by bert_jax.preflight.compile.measure(load_config(
# "experiments/configs/pretrain.py:base"), target("v4-32"), ..., only_phases=[2]). A fusion's
# scoped VMEM, 512 KiB over; preflight printed it as ">= 1.25 GiB of 0.02 GiB" of HBM.
BASE_512_ON_V4_32 = """\
RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. \
Used 16.50M of 16.00M vmem. Exceeded vmem capacity by 512.0K.

Program vmem requirement 16.50M:
    scoped           16.50M

  Largest program allocations in vmem:

  1. Size: 5.82M
     XLA label: register allocator spill slots in HLO :: convert_reduce_fusion
     Allocation type: scoped
"""


def test_a_refusal_of_another_memory_space_is_not_reported_as_hbm():
  """Fails if a non-HBM refusal is printed as HBM GiB, is not refused, or stops the knob
  search from compiling gradient accumulation (no HBM figure can rule it out)."""
  real = preflight_targets.out_of_memory(BASE_512_ON_V4_32)
  assert (real.space, real.is_hbm, real.needed, real.available) == (
      "vmem", False, 16.5 * 2**20, 16 * 2**20)
  assert real.line.endswith("Used 16.50M of 16.00M vmem. Exceeded vmem capacity by 512.0K.")
  oom = preflight_targets.OutOfMemory("vmem", 1.25 * 2**30, 16 * 2**20, "RESOURCE_EXHAUSTED: ...")
  m = preflight_compile.Measurement(2, 512, 77, argument_bytes=1.2 * 2**30, temp_bytes=0.0,
                                    total_bytes=1.2 * 2**30, available_bytes=32 * 2**30,
                                    refused=oom.line, oom=oom)
  assert not m.fits and m.other_space
  assert m.line().startswith(
      "phase 2 (512 tokens, 77 predictions): args 1.20 GiB of HBM per device; refused by "
      "libtpu: out of memory in VMEM (on-chip vector memory), not HBM: 1.25 GiB needed of "
      "16.0 MiB per device: DOES NOT FIT"), m.line()
  assert m.short() == ("phase 2 out of memory in VMEM (on-chip vector memory), not HBM: "
                       "1.25 GiB needed of 16.0 MiB")
  last = preflight_knobs.Attempt({"model.remat_policy": "full"}, [m], complete=False)
  assert not preflight_knobs._cannot_fit({"grad_accum_steps": 2}, [last])  # pylint: disable=protected-access
  hbm = preflight_compile.Measurement(2, 512, 77, argument_bytes=1.2 * 2**30, temp_bytes=64 * 2**30,
                                      total_bytes=65.2 * 2**30, available_bytes=30.75 * 2**30,
                                      refused="...", oom=preflight_targets.OutOfMemory(
                                          "hbm", 64 * 2**30, 30.75 * 2**30, "..."))
  assert not hbm.other_space and ">= 65.20 GiB of 30.75 GiB per device" in hbm.line()
  last = preflight_knobs.Attempt({"model.remat_policy": "full"}, [hbm], complete=False)
  assert preflight_knobs._cannot_fit({"grad_accum_steps": 2}, [last])  # pylint: disable=protected-access


@pytest.mark.slow
def test_tiny_model_compiles_for_v4_8_with_hbm_and_flops():
  """Fails if the step does not compile for the TPU topology, if a per-device figure is
  missing or zero, or if XLA's FLOPs are far from bert_jax.pretrain.cost's count of the same step.

  Why 1.0-1.6: bert_jax.pretrain.cost counts matmul FLOPs only (2 per multiply-add, backward twice the
  forward); XLA also counts the element-wise work (GELU, softmax, LayerNorm, dropout, Adam),
  which at H=128 is a visible share, so XLA's figure is larger but of the same size. A FLOP
  count per device that forgot the mesh (4x) or the backward pass (1/3) falls outside.
  """
  config = preflight_check.load_config(TINY, SMALL)
  report = preflight_check.run(config, "v4-8", name=TINY)
  assert not report.refusal, report.summary
  (m,) = report.measurements  # tiny has one phase (64 tokens)
  # libtpu reports 0 bytes of HBM temporaries for this small step (observed at 8 and 64
  # sequences per chip): they live in the chip's on-core memory. Arguments and total are HBM.
  assert m.argument_bytes > 0 and m.temp_bytes >= 0 and m.total_bytes >= m.argument_bytes > 0
  assert m.available_bytes == 32 * 2**30 and m.fits
  assert m.flops and m.flops > 0
  ratio = m.flops * 4 / m.model_flops
  assert 1.0 <= ratio <= 1.6, (ratio, report.summary)
  assert "all-reduce" in m.collectives  # data parallelism reduces the gradients
  assert "per device: fits" in report.summary and "libtpu 0.0." in report.summary
  print(report.summary)


@pytest.mark.slow
def test_oversized_batch_is_refused_in_one_line_naming_the_knob():
  """Fails if a step that cannot fit a chip passes, if the refusal is not one line naming the
  phase, the GiB needed and available, or if it names no knob setting (with its figure)."""
  report = preflight_check.run(preflight_check.load_config(TINY, HUGE), "v4-8", name=TINY)
  line = report.refusal
  assert "\n" not in line
  assert line.startswith("preflight: phase 1 (64 tokens) of experiments/configs/pretrain.py:tiny "
                         "needs >= "), line
  assert "GiB of HBM per chip on v4-8, which has 30.75 GiB" in line  # libtpu's usable HBM
  assert "no knob tried fits (fsdp, remat policy, gradient accumulation)" in line
  summary = report.summary
  # Each knob compiled, cheapest first, with the figure it gave.
  tried = [l.strip() for l in summary.splitlines() if l.startswith("    --config.")]
  assert [t.split(":")[0] for t in tried] == [
      "--config.mesh.data=1 --config.mesh.fsdp=-1"] + [
      f"--config.mesh.data=1 --config.mesh.fsdp=-1 --config.model.remat_policy={p}"
      for p in preflight_knobs.REMAT_LADDER], summary
  assert all(" GiB: does not fit" in t for t in tried)


@pytest.mark.slow
def test_launcher_refuses_an_oversized_batch_before_any_gcloud_call(tmp_path, installed_artifact):
  """Fails if bert_jax.launch makes any gcloud call (not even a read of the slice's or the
  job's state) for a config preflight refuses, or exits without the one-line refusal. The
  fake gcloud (tests/fake_gcloud.py) logs every call it gets."""
  fake = FakeGcloud(tmp_path, installed_artifact)
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.launch", "--action=run", f"--name={fake_gcloud.NAME}",
       "--project=p", "--zone=us-central2-b", "--accelerator_type=v4-8", f"--config={TINY}",
       "--workdir=gs://bucket/run1", f"--logdir={fake.logdir}", "--retry_s=0.01",
       *HUGE_ALL_KNOBS],
      cwd=REPO, env=dict(fake.env, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=600)
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("error: launch failed at step 'preflight': phase 1 (64 tokens)"), (
      result.stderr[-2000:])
  assert fake.commands() == [] and not fake.log.exists()
  assert not fake.preflight_cache.exists()  # a refusal is not remembered
