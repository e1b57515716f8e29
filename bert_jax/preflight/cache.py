"""Remembered preflight passes: the same config on the same slice is not compiled twice.

A BERT compile for a TPU slice takes minutes here; re-running a launch (to attach
after the laptop slept) or a preflight must not wait for one it already passed.
A pass is stored under a key of everything its verdict depends on: the config
argument and its file, the flags, the slice, every .py of the source tree that
builds the step (bert_jax/, data_pipeline/, host/, experiments/configs/), the
installed jax, jaxlib, libtpu, flax and optax, and the compiler flags in the
environment (LIBTPU_INIT_ARGS, XLA_FLAGS). Any change to one is another key, so a
stale pass is never served. (A config file of your own that imports modules outside
that tree: those modules are not in the key; --no_cache after editing them.) Only
passes are kept: a refusal may come from a
libtpu crash that a re-run would not repeat, and a refused command is followed
by a changed one anyway.

JAX-free (hashlib and importlib.metadata only): bert_jax.launch, which never
imports JAX, reads it before it would start a compiling child.
"""

import hashlib
import json
import os
from importlib import metadata

# What the compiled step depends on besides the flags: the code and the compiler.
SOURCES = ("bert_jax", "data_pipeline", "host", os.path.join("experiments", "configs"))
PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax")
COMPILER_ENV = ("LIBTPU_INIT_ARGS", "XLA_FLAGS")
# The source tree this module is part of (the directory holding bert_jax/).
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _version(package: str) -> str:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return ""


def key(config: str, overrides: list[str], accelerator_type: str,
        source_dir: str = SOURCE_ROOT) -> str:
  """A digest of what a preflight's verdict depends on (the module docstring lists it)."""
  digest = hashlib.sha256()
  digest.update(json.dumps([config, list(overrides), accelerator_type,
                            [_version(p) for p in PACKAGES],
                            [os.environ.get(v, "") for v in COMPILER_ENV]]).encode())
  files = [config.split(":", 1)[0]]
  for top in SOURCES:
    for root, dirs, names in os.walk(os.path.join(source_dir, top)):
      dirs.sort()
      files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
  for path in files:
    if os.path.isfile(path):
      digest.update(os.path.relpath(path, source_dir).encode())
      with open(path, "rb") as f:
        digest.update(hashlib.sha256(f.read()).digest())
  return digest.hexdigest()[:16]


def default_dir() -> str:
  """$BERT_JAX_PREFLIGHT_CACHE, else $BERT_JAX_CACHE/preflight, else ~/.cache/bert_jax/preflight
  (beside the project's other caches: data_pipeline.store.token_store.cache_root)."""
  if os.environ.get("BERT_JAX_PREFLIGHT_CACHE"):
    return os.environ["BERT_JAX_PREFLIGHT_CACHE"]
  root = os.environ.get("BERT_JAX_CACHE") or os.path.expanduser("~/.cache/bert_jax")
  return os.path.join(root, "preflight")


def path(directory: str, digest: str) -> str:
  return os.path.join(directory, digest + ".txt")


def remembered(config: str, accelerator_type: str, directory: str, digest: str) -> str:
  """The line a command prints for a remembered pass (the CLI and the launcher alike)."""
  return (f"{config} passed for {accelerator_type} before, with this source tree and these "
          f"flags ({path(directory, digest)}); not compiled again")


def lookup(directory: str, digest: str) -> str | None:
  """The remembered pass's summary, or None."""
  try:
    with open(path(directory, digest)) as f:
      return f.read().rstrip("\n")
  except OSError:
    return None


def remember(directory: str, digest: str, summary: str) -> None:
  """Store a pass (written whole, then renamed: a kill never leaves half a verdict)."""
  os.makedirs(directory, exist_ok=True)
  target = path(directory, digest)
  partial = f"{target}.{os.getpid()}.partial"
  with open(partial, "w") as f:
    f.write(summary + "\n")
  os.replace(partial, target)
