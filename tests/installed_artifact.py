"""The launch's upload, installed as a worker installs it, outside the checkout (conftest's
`installed_artifact` fixture; tests/test_artifact.py and the fake-gcloud workers use it).

`install(root)` builds the sdist with the launcher's own code (bert_jax.launch.artifact),
makes a fresh virtual environment under `root`, pip-installs exactly that file into it
(`--no-deps`: nothing from the checkout), and unpacks it into `root/tree` as a worker's
install does (the job's working directory).

Its dependencies (JAX, TensorFlow, ...) are not downloaded again: a `.pth` file adds this
test environment's site-packages directory to the new environment's path. Python runs the
`.pth` files of site directories only, never those of a directory a `.pth` adds, so this
environment's editable install of the checkout (itself a `.pth` hook) stays out of it: the
project's packages come from the installed artifact alone, which `Installed.imports`
shows.
"""

import dataclasses
import os
import pathlib
import subprocess
import sys
import sysconfig
import tarfile

REPO = pathlib.Path(__file__).resolve().parents[1]
# The project's top-level packages (setup.cfg's [options.packages.find] include).
PACKAGES = ("bert_jax", "data_pipeline", "experiments", "host")


@dataclasses.dataclass(frozen=True)
class Installed:
  """One installed artifact: its sdist, environment, interpreter and unpacked tree."""
  sdist: pathlib.Path
  venv: pathlib.Path
  python: pathlib.Path
  tree: pathlib.Path

  def env(self, **extra: str) -> dict:
    """An environment for its processes: no PYTHONPATH, no active virtual environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(JAX_PLATFORMS="cpu", **extra)
    return env

  def imports(self, cwd: pathlib.Path) -> dict:
    """Where each project package is imported from, by this interpreter run in `cwd`."""
    code = ("import importlib, json\n"
            f"print(json.dumps({{p: importlib.import_module(p).__file__ for p in {PACKAGES!r}}}))")
    out = subprocess.run([str(self.python), "-c", code], cwd=cwd, env=self.env(),
                         capture_output=True, text=True, check=True, timeout=120).stdout
    import json  # pylint: disable=g-import-not-at-top
    return json.loads(out.strip().splitlines()[-1])


def install(root: pathlib.Path) -> Installed:
  """Builds, installs and unpacks the upload under `root` (see the module docstring)."""
  from bert_jax.launch import artifact  # pylint: disable=g-import-not-at-top
  sdist = pathlib.Path(artifact.build(str(REPO), str(root / "upload")))
  venv = root / "venv"
  subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
  python = venv / "bin" / "python"
  # --no-deps --no-index: only this file is installed. --no-build-isolation with this
  # environment's setuptools and wheel on the path of the build alone: nothing is downloaded.
  dependencies = sysconfig.get_paths()["purelib"]
  subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  "--no-deps", "--no-index", "--no-build-isolation", str(sdist)],
                 cwd=root, check=True, timeout=600,
                 env=dict(os.environ, PYTHONPATH=dependencies))
  site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                         "['purelib'])"], capture_output=True, text=True, check=True).stdout
  (pathlib.Path(site.strip()) / "test_dependencies.pth").write_text(dependencies + "\n")
  tree = root / "tree"
  tree.mkdir()
  with tarfile.open(sdist) as tar:  # as the worker's `tar -xzf ... --strip-components=1`
    for member in tar.getmembers():
      parts = member.name.split("/", 1)
      if len(parts) == 2 and parts[1]:
        member.name = parts[1]
        tar.extract(member, tree, filter="data")
  return Installed(sdist=sdist, venv=venv, python=python, tree=tree)
