"""Preflight compiles in child processes: a crash of libtpu is one attempt's refusal, not the end.

libtpu 0.0.42.1 died (SIGSEGV) compiling BERT-Large at fsdp + dots_saveable for v6e-8,
which ended the whole preflight. Here the child is tests/preflight_crashing_child.py: the
real child, except that it kills itself with a real SIGSEGV for the config fields named in
PREFLIGHT_TEST_CRASH_ON. The model is the tiny one at 2 sequences per v4 chip (a compile
takes 10-20 s here, each child about 4 s more).
"""

import json
import pathlib
import sys

import pytest

from bert_jax.preflight import __main__ as preflight_cli
from bert_jax.preflight import check as preflight_check
from bert_jax.preflight import isolation as preflight_isolation

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = "experiments/configs/pretrain.py:tiny"
CRASHING_CHILD = (sys.executable, str(REPO / "tests" / "preflight_crashing_child.py"))
FSDP_DOTS = ("--config.mesh.data=1 --config.mesh.fsdp=-1 "
             "--config.model.remat_policy=dots_saveable")


@pytest.fixture
def crash_on(monkeypatch):
  """crash_on(fields): children asked to compile a config with these field values die by SIGSEGV."""
  monkeypatch.setattr(preflight_isolation, "CHILD_COMMAND", CRASHING_CHILD)
  return lambda fields: monkeypatch.setenv("PREFLIGHT_TEST_CRASH_ON", json.dumps(fields))


def test_how_a_child_ended_is_named():
  """Fails if a child killed by a signal is not reported with the signal's number and name."""
  assert preflight_isolation.how_it_ended(-11) == "signal 11, SIGSEGV"
  assert preflight_isolation.how_it_ended(-6) == "signal 6, SIGABRT"
  assert preflight_isolation.how_it_ended(3) == "exit status 3"


@pytest.mark.slow
def test_a_crashing_setting_is_skipped_and_the_search_goes_on(crash_on):
  """The step as configured (remat none, data parallel) and the first knob (fsdp, remat
  none) crash their children; fsdp + dots_saveable compiles and fits.

  Fails if a crash ends the preflight (or the test process), if a crashed compile is
  counted as fitting or shown with figures, if the search stops at the crashed setting
  instead of going on to the next, or if the verdict does not name the fix that fits.
  """
  crash_on({"model.remat_policy": "none"})
  config = preflight_check.load_config(TINY, ["--config.batch_size=8"])
  report = preflight_check.run(config, "v4-8", name=TINY)
  (as_configured,) = report.measurements
  assert as_configured.crash == "signal 11, SIGSEGV" and not as_configured.fits
  assert "libtpu crashed compiling it (signal 11, SIGSEGV): fit unknown" in report.summary
  tried = [l.strip() for l in report.summary.splitlines() if l.startswith("    --config.")]
  assert tried[0] == ("--config.mesh.data=1 --config.mesh.fsdp=-1: libtpu crashed compiling "
                      "this setting (signal 11, SIGSEGV); skipped"), report.summary
  assert tried[1].startswith(FSDP_DOTS + ": phase 1 ") and tried[1].endswith(": fits")
  assert len(tried) == 2  # stopped at the first that fits
  assert report.fix is not None and report.fix.flags == FSDP_DOTS
  assert report.refusal.startswith(
      f"preflight: libtpu {preflight_check.libtpu_version()} crashed (signal 11, SIGSEGV) compiling "
      f"phase 1 (64 tokens) of {TINY} for v4-8, so whether it fits is unknown; cheapest fix "
      f"that fits: {FSDP_DOTS} ("), report.refusal


def test_a_crash_on_the_only_attempt_is_a_one_line_refusal(crash_on, capsys):
  """Every knob already set (fsdp, full remat, 1 sequence per chip: nothing to accumulate),
  so the step as configured is the only compile, and it crashes.

  Fails if the CLI exits 0, prints a traceback, claims a fit, or does not end with one
  line saying libtpu crashed on which phase and that there is no knob left to try.
  """
  crash_on({})  # every config
  code = preflight_cli.main([f"--config={TINY}", "--topology=v4-8", "--config.batch_size=4",
                            "--config.mesh.data=1", "--config.mesh.fsdp=-1",
                            "--config.model.remat_policy=full"])
  out, err = capsys.readouterr()
  assert code == 1
  assert "Traceback" not in out + err
  assert "fits" not in out.replace("fits is unknown", "")
  last = err.strip().splitlines()[-1]
  assert last.startswith("preflight: libtpu ") and last.endswith(
      f"crashed (signal 11, SIGSEGV) compiling phase 1 (64 tokens) of {TINY} for v4-8, so "
      "whether it fits is unknown; no knob left to try: set another remat policy, mesh or "
      "libtpu version by hand, or --skip_preflight at your own risk"), err[-2000:]
