"""experiments/benchmarks/pretrain/accelerator.py and train_step.py: import only the jax stack (the
train-step reference needs transformers only when present), and run on CPU.

Smoke tests only: one row, one step. The benchmarks' figures are measurements for an
accelerator, not CI checks (the transformers reference row is run by hand).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import types

import pytest

from experiments.benchmarks.pretrain import accelerator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  return env


_FORBIDDEN = ("tensorflow", "transformers", "torch", "tensorflow_text")
# Prints the forbidden top-level modules loaded so far, and fails if there are any.
_CHECK_MODULES = (f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {_FORBIDDEN!r}); "
                  "print('loaded:', bad); sys.exit(1 if bad else 0)")


def test_benchmarks_import_neither_tensorflow_nor_transformers():
  """Both benchmarks in one fresh interpreter (one start, one JAX import): fails if either
  of them, or the attention module they run, loads any of _FORBIDDEN."""
  code = ("import sys; import experiments.benchmarks.pretrain.accelerator; "
          f"import experiments.benchmarks.pretrain.train_step; import bert_jax.model.attention; {_CHECK_MODULES}")
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
  """Fails if --quick's rows lose a target shape, its fast recipe or the configs' scan."""
  rows = accelerator.plan(_args(quick=True))
  assert [(r["size"], r["seq_len"], r["batch_per_device"]) for r in rows] == [
      ("base", 128, 256), ("base", 128, 512), ("large", 512, 32), ("large", 512, 64)]
  assert {r["attention"] for r in rows} == {"auto"}
  assert [r["scan"] for r in rows] == [False, False, True, True]  # as the configs


def test_plan_sweeps_attention_then_remat_then_batch():
  """Fails if the sweep's order changes or an unknown --remat/--attention is accepted."""
  rows = accelerator.plan(_args(attention="auto,paper", remat="none,full", batch="4,8"))
  assert [(r["attention"], r["remat"], r["batch_per_device"]) for r in rows] == [
      ("auto", "none", 4), ("auto", "none", 8), ("auto", "full", 4), ("auto", "full", 8),
      ("paper", "none", 4), ("paper", "none", 8), ("paper", "full", 4), ("paper", "full", 8)]
  with pytest.raises(SystemExit, match="--remat"):
    accelerator.plan(_args(remat="sometimes"))
  with pytest.raises(SystemExit, match="--attention"):
    accelerator.plan(_args(attention="flash"))


def test_paper_rows_drop_attention_probabilities_and_fast_rows_do_not():
  """Fails if a paper row ran a fused kernel (no attention dropout) or a fast row kept it."""
  paper = accelerator.bert_config("tiny", "paper", "none", "float32", False)
  fast = accelerator.bert_config("tiny", "auto", "full", "float32", True)
  assert (paper.attention_impl, paper.attention_probs_dropout_prob) == ("einsum", 0.1)
  assert (fast.attention_impl, fast.attention_probs_dropout_prob) == ("auto", 0.0)
  assert (fast.remat_policy, fast.scan_layers, fast.padded_vocab_size) == ("full", True, 30592)


def test_kept_only_counts_what_each_remat_policy_keeps(tmp_path):
  """--kept_only: the activations kept for the backward pass per row, nothing compiled;
  less as the policy saves less, and nearly twice as much for twice the batch (a few
  kept arrays, such as the padded vocabulary's logit mask, do not grow with it). Two
  policies are enough for the benchmark's plumbing (fails if a row compiled, if the
  policy or the batch did not reach the row); the order of all five is test_remat's."""
  rows = accelerator.main(["--size=tiny", "--seq_len=64", "--batch=4,8", "--attention=paper",
                           "--remat=none,full", "--kept_only",
                           f"--output={tmp_path / 'kept.jsonl'}"])
  kept = {(r["remat"], r["batch_per_device"]): r["kept_gib"] for r in rows}
  assert all(r["status"] == "ok" and "compile_s" not in r for r in rows)
  assert len(rows) == 4
  for batch in (4, 8):
    assert kept[("none", batch)] > kept[("full", batch)], kept
  for policy in ("none", "full"):
    assert 1.8 * kept[(policy, 4)] < kept[(policy, 8)] <= 2 * kept[(policy, 4)], kept


@pytest.mark.slow
def test_one_row_runs_on_cpu_and_writes_a_json_line(tmp_path):
  """A smoke run, not a measurement: one tiny row (1 timed step) completes through the
  trainer's step, off TensorFlow and transformers, and the TensorFlow check runs in its
  child. On CPU that check cannot fail for the right reason (no GPU/TPU to hide: see
  tests/test_tf_cpu.py); here it shows the check runs and reports. Fails if the row
  errors, a field is missing or absurd, or the benchmark process loads TensorFlow."""
  out = tmp_path / "bench.jsonl"
  code = ("import runpy, sys; sys.argv = ['accelerator', '--size=tiny', '--seq_len=64', "
          "'--attention=paper', '--remat=none', '--batch=2', '--steps=1', "
          f"'--warmup_steps=0', '--tf_check=yes', '--output={out}']; "
          "runpy.run_module('experiments.benchmarks.pretrain.accelerator', run_name='__main__'); "
          + _CHECK_MODULES)
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "loaded: []" in done.stdout
  [row] = [json.loads(line) for line in out.read_text().splitlines()]
  assert (row["status"], row["attention"], row["remat"], row["batch_per_device"]) == (
      "ok", "paper", "none", 2), row
  assert row["device_kind"] == "cpu" and row["attention_impl"] == "einsum"
  assert row["tokens_per_s"] == pytest.approx(64 * row["seq_per_s"]) and row["seq_per_s"] > 0
  assert row["mfu_peak"] is None and row["loss"] > 0  # no CPU peak in the table
  assert row["tf_check"]["ok"] and row["tf_check"]["tf_visible"] == {"GPU": 0, "TPU": 0}
  assert "TensorFlow check ok" in done.stdout and "seq/s" in done.stdout


def test_fast_variants_differ_from_the_paper_only_in_attention_dropout():
  """The fast recipe's accuracy cost is a benchmark (experiments/benchmarks/pretrain/fast_recipe.py,
  result in experiments/results/fast_recipe.md); this keeps the variants honest: fails if
  a fast variant changes anything but attention dropout (and its dropout generator)."""
  from experiments.configs import pretrain  # pylint: disable=g-import-not-at-top
  for size in ("tiny", "base", "large"):
    paper, fast = pretrain.get_config(size), pretrain.get_config(f"{size}_fast")
    assert fast.model.attention_probs_dropout_prob == 0.0
    assert paper.model.attention_probs_dropout_prob == 0.1
    assert paper.model.attention_impl == fast.model.attention_impl == "auto"
    differ = {k for k, v in fast.to_dict().items() if paper.to_dict()[k] != v}
    # layouts: how each recipe fits a slice, found by its own preflight (no attention
    # dropout frees memory, so a fast recipe often fits with less remat); what it trains
    # is unchanged (bert_jax.run.layouts applies only mesh, remat and accumulation).
    assert differ <= {"model", "variant", "rng_impl", "layouts"}, differ
    assert {k for k, v in fast.model.to_dict().items()
            if paper.model[k] != v} == {"attention_probs_dropout_prob"}
  assert pretrain.get_config("tiny_fast").rng_impl == "threefry"  # the comparison's twin


@pytest.mark.slow
def test_train_step_benchmark_runs_without_transformers(monkeypatch, capsys):
  """The reference row is skipped with a message when transformers is absent."""
  from experiments.benchmarks.pretrain import train_step  # pylint: disable=g-import-not-at-top
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "transformers" else find_spec(name, *a))
  monkeypatch.setattr(sys, "argv", ["train_step", "--sizes=tiny", "--rows=ours,reference",
                                    "--steps=1", "--seq_len=32", "--predictions=5"])
  train_step.main()
  printed = capsys.readouterr().out
  assert "reference row skipped: transformers' Flax BERT is not installed" in printed
  assert re.search(r"tiny +ours +\d+ tokens/s", printed), printed
  assert "ratio" not in printed and not re.search(r"tiny +reference", printed)
