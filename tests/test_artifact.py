"""What a launched worker installs is what the package declares (bert_jax.launch.artifact).

The launcher uploads the project's sdist; these tests install exactly that file into a
fresh virtual environment outside the checkout (conftest's `installed_artifact`,
tests/installed_artifact.py) and run it there as a worker does. A package that the
metadata leaves out (as `host/` once was) fails them; so does a start that could not tell
the launcher how it ended (plan.RUN_AND_RECORD). Every documented command's --help runs
from the same installed copy in tests/test_commands.py.
"""

import json
import pathlib
import re
import subprocess
import sys

import pytest

from installed_artifact import PACKAGES, REPO


def test_the_upload_is_the_sdist_and_holds_every_declared_package(installed_artifact, tmp_path):
  """Fails if the sdist lacks a top-level package of setup.cfg, or if the installed copy
  imports any package from the checkout instead of its own environment."""
  from bert_jax.launch import artifact
  assert set(PACKAGES) <= set(artifact.top_level(str(installed_artifact.sdist)))
  where = installed_artifact.imports(tmp_path)
  assert set(where) == set(PACKAGES)
  for package, path in where.items():
    assert pathlib.Path(path).is_relative_to(installed_artifact.venv), (package, path)
    assert not pathlib.Path(path).is_relative_to(REPO), (package, path)
  # In the worker's working directory (the sdist unpacked), the job imports that tree.
  for package, path in installed_artifact.imports(installed_artifact.tree).items():
    assert pathlib.Path(path).is_relative_to(installed_artifact.tree), (package, path)


def test_a_build_outside_a_source_tree_is_one_line(tmp_path):
  """Fails if staging from a directory without setup.cfg does anything but refuse by name."""
  from bert_jax.launch import artifact
  with pytest.raises(artifact.BuildError, match=r"is not a bert_jax source tree \(no setup.cfg\)"):
    artifact.build(str(tmp_path), str(tmp_path / "upload"))
  assert not (tmp_path / "upload").exists()


def _run_and_record(python, cwd, home, args, attempt="7", timeout=60, env=None):
  from bert_jax.launch import plan
  return subprocess.run([str(python), "-c", plan.run_and_record_line(), *args], cwd=cwd,
                        env={**(env or {}), "HOME": str(home), "BERT_JAX_JOB_ATTEMPT": attempt},
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("code, expected", [
    ("raise SystemExit(0)", "0"), ("raise SystemExit(75)", "75"),
    ("raise SystemExit('error: bad flag')", "1"), ("import no_such_module_here", "1"),
    ("pass", "0")])
def test_the_start_records_how_the_job_ended(tmp_path, code, expected):
  """Fails if RUN_AND_RECORD loses a job's exit code or its output: the launcher tells a job
  that died at import from one still starting by this file alone."""
  (tmp_path / "job_module.py").write_text(f"print('hello', flush=True)\n{code}\n")
  result = _run_and_record(sys.executable, tmp_path, tmp_path, ["job_module", "--flag"])
  assert result.returncode == int(expected), result.stderr
  assert (tmp_path / "bert_jax_job.exit").read_text() == f"{expected} 7\n"
  assert result.stdout == "hello\n"
  if "error: bad flag" in code:
    assert result.stderr == "error: bad flag\n"
  if "no_such_module" in code:
    assert "ModuleNotFoundError: No module named 'no_such_module_here'" in result.stderr


@pytest.mark.slow  # a 5-step pretraining run in a fresh process (~25 s)
def test_the_installed_copy_trains_as_a_worker_starts_it(installed_artifact, tmp_path):
  """Fails if the installed artifact cannot run a short pretraining job started exactly as
  a worker starts one (RUN_AND_RECORD, in the unpacked tree, a config named relative to it),
  or if that start does not record exit 0 for its attempt."""
  from experiments import small_pretraining
  corpus, vocab = small_pretraining.write_corpus(tmp_path), small_pretraining.write_vocab(tmp_path)
  workdir = tmp_path / "run"
  args = ["bert_jax.main", "--config=experiments/configs/pretrain.py:tiny",
          f"--workdir={workdir}", f"--config.data.corpus={corpus}",
          f"--config.data.vocab_file={vocab}", "--config.total_steps=5", "--config.batch_size=8",
          "--config.eval_batch_size=8", "--config.data.eval.num_examples=16",
          "--config.data.max_seq_length=32", "--config.optimizer.warmup_steps=1",
          "--config.log_every_steps=1", "--config.checkpoint.every_steps=5"]
  result = _run_and_record(installed_artifact.python, installed_artifact.tree, tmp_path, args,
                           timeout=600, env=installed_artifact.env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert (tmp_path / "bert_jax_job.exit").read_text() == "0 7\n"
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5]
  assert (workdir / "checkpoints" / "5").is_dir(), sorted(p.name for p in workdir.iterdir())
  # The job's last line says it is done, how long it took and where its checkpoints are.
  last = result.stdout.strip().splitlines()[-1]
  assert re.fullmatch(rf"done in \d+ min \d\d s: checkpoints in {re.escape(str(workdir))}"
                      rf"/checkpoints, metrics in {re.escape(str(workdir))}/metrics.jsonl",
                      last), last
