"""What a launch uploads: the project's source distribution, built from its package metadata.

The workers install exactly what `pip` would install from this source tree: the
sdist that setuptools builds from setup.cfg (`packages = find:` and its includes),
never a hand-kept list of folders (such a list once left out `host/`, and every
launched job died at import). The sdist is also unpacked on each worker as the
job's working directory, so a config named by a relative path
(`experiments/configs/pretrain.py:base`) is found there as here.

The build runs setuptools' PEP 517 hook in a child process (setuptools is a
declared dependency: see setup.cfg); nothing is imported from the tree itself.
"""

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

# The sdist's name inside the upload directory, whatever the project's version.
ARTIFACT = "bert_jax.tar.gz"

_BUILD = ("import sys\nfrom setuptools import build_meta\n"
          "print(build_meta.build_sdist(sys.argv[1]))\n")


class BuildError(Exception):
  """The source distribution could not be built; str() is one line saying why."""


def build(source_dir: str, upload_dir: str) -> str:
  """Builds the sdist of the project at `source_dir` into `upload_dir` (emptied first) as
  ARTIFACT; returns its path.

  Raises:
    BuildError: `source_dir` is not the project's source tree, or setuptools failed.
  """
  if not os.path.isfile(os.path.join(source_dir, "setup.cfg")):
    raise BuildError(f"{source_dir!r} is not a bert_jax source tree (no setup.cfg)")
  shutil.rmtree(upload_dir, ignore_errors=True)
  os.makedirs(upload_dir)
  # setuptools assembles the sdist in SOURCE/NAME-VERSION/ and rewrites SOURCE/*.egg-info:
  # two builds of one tree at once (a grid's launches, in threads or processes) would
  # trample each other, so they take turns on a lock named after the tree.
  lock = os.path.join(tempfile.gettempdir(), "bert_jax_sdist_" + hashlib.sha256(
      os.path.realpath(source_dir).encode()).hexdigest()[:16] + ".lock")
  with open(lock, "a") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    result = subprocess.run([sys.executable, "-c", _BUILD, upload_dir], cwd=source_dir,
                            capture_output=True, text=True, check=False)
  lines = result.stdout.strip().splitlines()
  if result.returncode or not lines:
    detail = [line for line in (result.stderr or result.stdout).splitlines() if line.strip()]
    raise BuildError(f"building the source distribution of {source_dir} failed: "
                     f"{(detail or ['no output'])[-1].strip()}")
  path = os.path.join(upload_dir, ARTIFACT)
  os.replace(os.path.join(upload_dir, lines[-1]), path)
  return path


def top_level(path: str) -> list[str]:
  """The top-level packages and files an sdist holds (its first directory stripped), sorted."""
  with tarfile.open(path) as tar:
    names = {member.name.split("/")[1] for member in tar.getmembers() if "/" in member.name}
  return sorted(names)
