"""experiments/benchmarks/accelerator.py: imports only the jax stack, and runs on CPU."""

import json
import os
import subprocess
import sys
import types

import pytest

from experiments.benchmarks import accelerator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  return env


def test_benchmark_imports_neither_tensorflow_nor_transformers():
  code = ("import sys; import experiments.benchmarks.accelerator as a; "
          "import bert_jax.attention; "
          "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
          "('tensorflow', 'transformers', 'torch', 'tensorflow_text')); "
          "print('loaded:', bad); sys.exit(1 if bad else 0)")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "loaded: []" in done.stdout


def _args(**kw):
  fields = dict(quick=False, size="base", seq_len=128, attention="", remat="", batch="",
                scan_layers="auto")
  fields.update(kw)
  return types.SimpleNamespace(**fields)


def test_quick_plan_is_the_two_target_shapes_on_the_fast_recipe():
  rows = accelerator.plan(_args(quick=True))
  assert [(r["size"], r["seq_len"], r["batch_per_device"]) for r in rows] == [
      ("base", 128, 256), ("base", 128, 512), ("large", 512, 32), ("large", 512, 64)]
  assert {r["attention"] for r in rows} == {"auto"}
  assert [r["scan"] for r in rows] == [False, False, True, True]  # as the configs


def test_plan_sweeps_attention_then_remat_then_batch():
  rows = accelerator.plan(_args(attention="auto,paper", remat="none,full", batch="4,8"))
  assert [(r["attention"], r["remat"], r["batch_per_device"]) for r in rows] == [
      ("auto", "none", 4), ("auto", "none", 8), ("auto", "full", 4), ("auto", "full", 8),
      ("paper", "none", 4), ("paper", "none", 8), ("paper", "full", 4), ("paper", "full", 8)]
  with pytest.raises(SystemExit, match="--remat"):
    accelerator.plan(_args(remat="sometimes"))
  with pytest.raises(SystemExit, match="--attention"):
    accelerator.plan(_args(attention="flash"))


def test_paper_rows_drop_attention_probabilities_and_fast_rows_do_not():
  paper = accelerator.bert_config("tiny", "paper", "none", "float32", False)
  fast = accelerator.bert_config("tiny", "auto", "full", "float32", True)
  assert (paper.attention_impl, paper.attention_probs_dropout_prob) == ("einsum", 0.1)
  assert (fast.attention_impl, fast.attention_probs_dropout_prob) == ("auto", 0.0)
  assert (fast.remat_policy, fast.scan_layers, fast.padded_vocab_size) == ("full", True, 30592)


@pytest.mark.slow
def test_tiny_sweep_runs_on_cpu_and_writes_json_lines(tmp_path):
  out = tmp_path / "bench.jsonl"
  done = subprocess.run(
      [sys.executable, "-m", "experiments.benchmarks.accelerator", "--size=tiny",
       "--budget_s=60", f"--output={out}"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["attention"], r["remat"]) for r in rows] == [
      ("auto", "none"), ("auto", "full"), ("paper", "none"), ("paper", "full")]
  ran = [r for r in rows if r["status"] == "ok"]
  assert ran and all(r["status"].startswith("skipped: budget") for r in rows if r not in ran)
  for r in ran:
    assert r["device_kind"] == "cpu" and r["matmul_tflops_measured"] > 0
    assert r["attention_impl"] == ("einsum" if r["attention"] == "paper" else "xla")
    assert r["seq_per_s"] > 0 and r["tokens_per_s"] == pytest.approx(128 * r["seq_per_s"])
    assert 0 < r["mfu_measured"] < 2 and r["mfu_peak"] is None  # no CPU peak in the table
    assert r["compile_s"] > 0 and r["memory_gib"] > 0 and r["loss"] > 0
  assert "seq/s" in done.stdout and "MFU" in done.stdout
