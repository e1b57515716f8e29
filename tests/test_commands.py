"""Every `python -m ...` command README.md and docs/*.md name still runs: each with --help,
from the installed artifact a launched worker runs (tests/installed_artifact.py).

The commands are collected from the documents by a regular expression, so a module
that is renamed or moved without its documentation fails here (`No module named`),
as does one whose flags no longer parse or whose import breaks. An argparse command
exits 0 after its usage; an absl command prints its usage and then exits 1 by absl's
design (absl/app.py: HelpFlag ends with _exit_before_main(1)), so for those the test
asks for absl's own closing line, which only its --help path prints.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
NOT_OURS = {"pytest", "venv", "pip"}
ABSL_HELP_END = "Try --helpfull to get a list of all flags."


def documented_commands() -> list[str]:
  """The modules of every `python -m MODULE` (or python3) in the README and docs/, sorted."""
  found = set()
  for doc in DOCS:
    found.update(re.findall(r"\bpython3? -m ([A-Za-z_][\w.]*\w)", doc.read_text()))
  return sorted(found - NOT_OURS)


def test_the_documents_name_the_commands():
  """Fails if the collection finds too few commands (the regular expression broke) or misses
  the entry points every reader needs."""
  commands = documented_commands()
  assert {"bert_jax.main", "bert_jax.launch", "bert_jax.preflight", "bert_jax.pretrain.cost",
          "experiments.ablation", "bert_jax.convert"} <= set(commands), commands
  assert len(commands) >= 10


@pytest.mark.slow  # each command imports what it runs (JAX, TensorFlow): ~5-10 s apiece
@pytest.mark.parametrize("module", documented_commands())
def test_each_documented_command_prints_its_usage(module, installed_artifact, tmp_path):
  """Fails if `python -m MODULE --help` does not print the command's usage, or ends any other
  way than argparse's exit 0 or absl's exit 1 after its usage (a missing module, an import
  error or a traceback all fail).

  Run by the installed artifact (what a launched worker installs, tests/installed_artifact.py)
  in a directory outside the checkout: a module the package metadata leaves out fails here.
  """
  result = subprocess.run([str(installed_artifact.python), "-m", module, "--help"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=installed_artifact.env())
  out = result.stdout
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  if ABSL_HELP_END in out:  # absl: the module's docstring, its flags, then this line
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "flags:" in out, out[-2000:]
  else:  # argparse, or a command with its own usage text
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "usage" in out.lower(), out[-2000:]


def test_the_job_and_ablation_commands_start_without_tensorflow():
  """Fails if importing bert_jax.main, experiments.ablation's or experiments.evaluate's
  command (in a fresh process) imports TensorFlow: it is two thirds of a process's start,
  and their --help and flag or config refusals must not wait for it
  (docs/architecture.md; bert_jax.jobs imports a trainer only when its job runs)."""
  code = ("import sys, bert_jax.main, experiments.ablation.__main__, "
          "experiments.evaluate.__main__; "
          "print(sorted(m for m in ('tensorflow', 'tensorflow_text', 'keras') "
          "if m in sys.modules))")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == "[]", result.stdout
