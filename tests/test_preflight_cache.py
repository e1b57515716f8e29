"""Remembered preflight passes (bert_jax/preflight/cache.py): the same command answers in a
second, and nothing a compile depends on can change without a new key."""

import os
import pathlib
import subprocess
import sys

from bert_jax.preflight import cache
from bert_jax.preflight.__main__ import main as preflight_main

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = "experiments/configs/pretrain.py:tiny"


def test_every_input_of_the_compile_is_in_the_key(tmp_path, monkeypatch):
  """Fails if a change to any source file the step is built from (bert_jax, data_pipeline,
  host, experiments/configs), the config file, a flag, the slice, a package version or
  the compiler flags in the environment keeps the key: a stale pass would be served."""
  for name in ("bert_jax/model/a.py", "data_pipeline/b.py", "host/c.py",
               "experiments/configs/pretrain.py", "docs/notes.py"):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text("x = 1\n")
  monkeypatch.chdir(tmp_path)
  monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
  config = "experiments/configs/pretrain.py:base"

  def key(**changes):
    return cache.key(changes.get("config", config), changes.get("overrides", []),
                     changes.get("slice", "v4-32"), str(tmp_path))

  first = key()
  assert key() == first  # deterministic
  seen = {first}
  for name in ("bert_jax/model/a.py", "data_pipeline/b.py", "host/c.py",
               "experiments/configs/pretrain.py"):
    (tmp_path / name).write_text("x = 2\n")
    seen.add(key())
  assert len(seen) == 5
  (tmp_path / "docs/notes.py").write_text("x = 2\n")  # outside the tree the step is built from
  assert key() in seen
  for changed in (key(config="experiments/configs/pretrain.py:large"),
                  key(overrides=["--config.batch_size=512"]), key(slice="v4-8")):
    assert changed not in seen
    seen.add(changed)
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=8192")
  assert key() not in seen
  monkeypatch.delenv("LIBTPU_INIT_ARGS")
  before = key()
  monkeypatch.setattr(cache, "_version", lambda package: "9.9" if package == "libtpu" else "1")
  assert key() != before


def test_a_pass_is_answered_again_without_jax_and_a_refusal_compiles(tmp_path, capsys,
                                                                      monkeypatch):
  """The real preflight of the tiny model for a v4-8, then the same command in a child whose
  `import jax` fails. Fails if the pass is not remembered, the re-run imports JAX (it would
  compile again) or prints another summary, or --no_cache does not compile."""
  monkeypatch.chdir(REPO)
  argv = [f"--config={TINY}", "--topology=v4-8", f"--cache_dir={tmp_path / 'cache'}",
          "--config.batch_size=256"]
  assert preflight_main(argv) == 0
  summary = capsys.readouterr().out.strip()
  assert "per device: fits" in summary
  (remembered,) = (tmp_path / "cache").iterdir()
  assert remembered.read_text().strip() == summary
  poisoned = tmp_path / "poisoned"
  (poisoned / "jax").mkdir(parents=True)
  (poisoned / "jax" / "__init__.py").write_text("raise ImportError('jax was imported')\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(poisoned), str(REPO)]))
  again = subprocess.run([sys.executable, "-m", "bert_jax.preflight", *argv], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.strip() == summary
  assert "passed for v4-8 before" in again.stderr and "not compiled again" in again.stderr
  forced = subprocess.run([sys.executable, "-m", "bert_jax.preflight", *argv, "--no_cache"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert forced.returncode != 0 and "jax was imported" in forced.stderr
