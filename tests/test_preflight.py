"""Preflight: the real train step compiled for a TPU slice on this CPU machine (libtpu's
compile-only client; libtpu comes with the dev extra), refused before anything is paid for.

What each test would catch is in its docstring. The compiles are of the tiny model for
v4-8 (4 chips), the smallest v4 slice.
"""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from bert_jax import preflight
from bert_jax import preflight_knobs
from bert_jax import preflight_targets

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
      "v5litepod-16", "v5e", "v5e:4x4", "default", (2, 2, 1), (False, False, False), 16)
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
  config = preflight.load_config(TINY, SMALL)
  order = preflight_knobs.candidates(config, 4)
  assert order[0] == {"mesh.data": 1, "mesh.fsdp": -1}
  assert [c.get("model.remat_policy") for c in order[1:5]] == list(preflight_knobs.REMAT_LADDER)
  accumulation = [c["grad_accum_steps"] for c in order[5:]]
  assert accumulation == [2, 4, 8, 16, 32, 64]  # 256 sequences over 4 chips: 64 ... 1 each
  assert all(c["model.remat_policy"] == "full" for c in order[5:])


@pytest.mark.slow
def test_tiny_model_compiles_for_v4_8_with_hbm_and_flops():
  """Fails if the step does not compile for the TPU topology, if a per-device figure is
  missing or zero, or if XLA's FLOPs are far from bert_jax.cost's count of the same step.

  Why 1.0-1.6: bert_jax.cost counts matmul FLOPs only (2 per multiply-add, backward twice the
  forward); XLA also counts the element-wise work (GELU, softmax, LayerNorm, dropout, Adam),
  which at H=128 is a visible share, so XLA's figure is larger but of the same size. A FLOP
  count per device that forgot the mesh (4x) or the backward pass (1/3) falls outside.
  """
  config = preflight.load_config(TINY, SMALL)
  report = preflight.run(config, "v4-8", name=TINY)
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
  with pytest.raises(preflight.PreflightError) as error:
    preflight.check_launch(TINY, HUGE, "v4-8")
  line = str(error.value)
  assert "\n" not in line
  assert line.startswith("preflight: phase 1 (64 tokens) of experiments/configs/pretrain.py:tiny "
                         "needs >= "), line
  assert "GiB of HBM per chip on v4-8, which has 30.75 GiB" in line  # libtpu's usable HBM
  assert "no knob tried fits (fsdp, remat policy, gradient accumulation)" in line
  summary = error.value.summary
  # Each knob compiled, cheapest first, with the figure it gave.
  tried = [l.strip() for l in summary.splitlines() if l.startswith("    --config.")]
  assert [t.split(":")[0] for t in tried] == [
      "--config.mesh.data=1 --config.mesh.fsdp=-1"] + [
      f"--config.mesh.data=1 --config.mesh.fsdp=-1 --config.model.remat_policy={p}"
      for p in preflight_knobs.REMAT_LADDER], summary
  assert all(" GiB: does not fit" in t for t in tried)


FAKE_GCLOUD = textwrap.dedent("""\
    #!{python}
    import os, sys
    with open(os.environ["FAKE_GCLOUD_ARGV"], "a") as f:
      f.write(" ".join(sys.argv[1:]) + "\\n")
    print("ERROR: (gcloud) NOT_FOUND: no such resource", file=sys.stderr)
    sys.exit(1)
    """)


@pytest.mark.slow
def test_launcher_refuses_an_oversized_batch_before_creating_anything(tmp_path):
  """Fails if bert_jax.launch creates (or ssh's into) a slice for a config preflight refuses,
  or exits without the one-line refusal. The fake gcloud records every call; the launcher
  may only have read the slice's and the job's state (both 'not found') before refusing."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  gcloud = bin_dir / "gcloud"
  gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
  gcloud.chmod(0o755)
  calls = tmp_path / "argv.txt"
  calls.write_text("")
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             FAKE_GCLOUD_ARGV=str(calls), JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.launch", "--action=run", "--name=bert-tiny",
       "--project=p", "--zone=us-central2-b", "--accelerator_type=v4-8", f"--config={TINY}",
       "--workdir=gs://bucket/run1", f"--logdir={tmp_path / 'logs'}", "--retry_s=0.01",
       *HUGE_ALL_KNOBS],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert result.returncode != 0
  assert "preflight: phase 1 (64 tokens)" in result.stdout + result.stderr, result.stderr[-2000:]
  recorded = calls.read_text().splitlines()
  assert not [c for c in recorded if any(w in c.split() for w in ("create", "ssh", "scp"))], \
      recorded
  assert all(" describe " in f" {c} " or c.startswith("storage cat") for c in recorded), recorded
