"""setup.cfg's Python and package floors against what the code calls.

A worker that installs '.[tpu]' on a Python whose newest JAX lacks an API the
code calls dies with an AttributeError after the slice is paid for (the TPU VM
images' python3 is 3.10, whose last JAX is 0.6.x). So setup.cfg's floors are
tested here: python_requires excludes 3.10; each floor admits the installed
version; every API in APIS exists in the installed packages, is really used by
the code (grepped, so the list cannot rot) and needs no newer release than the
floor of its package (each entry names the release that has it, checked in that
release's source; `at_least` is where the floor must not go below).

Checked by hand at the floors (jax/jaxlib 0.7.1, flax 0.11.2, optax 0.2.5,
orbax-checkpoint 0.11.17; 2026-12-01): bert_jax imports, and the fast tests of
tests/test_optim.py, test_sharding.py and test_checkpoint.py pass (the first two
with orbax-checkpoint 0.11.18); orbax-checkpoint 0.11.16 fails to
import under jax 0.7 (jax.experimental.layout.DeviceLocalLayout was renamed),
and under flax 0.11.1 nn.with_logical_constraint drops its constraint inside
jax.set_mesh (test_flax_honours_constraints_under_set_mesh shows the difference).
"""

import configparser
import importlib
import importlib.metadata
import inspect
import pathlib
import re

from packaging.requirements import Requirement
from packaging.version import Version
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("bert_jax", "data_pipeline", "experiments", "host")

# How the source names a module -> (the module, the import that binds the name there).
ALIASES = {
    "ocp": ("orbax.checkpoint", r"^import orbax\.checkpoint as ocp$"),
    "checkpoint_managers": ("orbax.checkpoint.checkpoint_managers",
                            r"^from orbax\.checkpoint import checkpoint_managers$"),
    "nn": ("flax.linen", r"^import flax\.linen as nn$"),
    "multihost_utils": ("jax.experimental.multihost_utils",
                        r"^from jax\.experimental import multihost_utils$"),
    "AxisType": ("jax.sharding.AxisType", r"^from jax\.sharding import .*\bAxisType\b"),
}

# (as the source spells it, distribution, at_least, where that release was seen to have it).
# The first four groups set the floors; the rest are checked to exist and to be below them.
APIS = [
    # jax: the floor 0.7.1 is jax.set_mesh as a context manager.
    ("jax.set_mesh", "jax", "0.7.1",
     "jax/__init__.py at jax-v0.7.1 (absent at 0.7.0, which had only jax.sharding.set_mesh, "
     "a global setter); CHANGELOG 0.7.1: 'Exposed jax.set_mesh'"),
    ("jax.shard_map", "jax", "0.6.1", "jax/__init__.py at jax-v0.6.1 (check_vma keyword)"),
    ("jax.sharding.get_abstract_mesh", "jax", "0.5.3", "jax/sharding.py at jax-v0.5.3"),
    ("AxisType.Auto", "jax", "0.6.0", "jax/_src/mesh.py at jax-v0.6.0"),
    ("jax.make_mesh", "jax", "0.4.35", "jax/__init__.py at jax-v0.4.35 (axis_types, devices)"),
    ("jax.make_array_from_process_local_data", "jax", "0.4.31", "jax/__init__.py at jax-v0.4.31"),
    ("jax.nn.dot_product_attention", "jax", "0.4.31", "CHANGELOG 0.4.31"),
    ("jax.random.key", "jax", "0.4.16", "CHANGELOG 0.4.16"),
    ("jax.tree.map", "jax", "0.4.25", "CHANGELOG 0.4.25: 'Added jax.tree module'"),
    ("jax.checkpoint_policies.save_only_these_names", "jax", "0.4.16", "jax/__init__.py"),
    ("jax.ad_checkpoint.print_saved_residuals", "jax", "0.4.16", "jax/ad_checkpoint.py"),
    ("multihost_utils.reached_preemption_sync_point", "jax", "0.4.16",
     "jax/experimental/multihost_utils.py"),
    ("multihost_utils.process_allgather", "jax", "0.4.16", "jax/experimental/multihost_utils.py"),
    # optax: the floor 0.2.5 is the optax.tree namespace (bert_jax.training.optim's Adam moments).
    ("optax.tree.update_moment", "optax", "0.2.5",
     "optax/tree/__init__.py at v0.2.5 (optax 0.2.4 has no optax.tree)"),
    ("optax.tree.update_moment_per_elem_norm", "optax", "0.2.5", "optax/tree/__init__.py at v0.2.5"),
    ("optax.tree_map_params", "optax", "0.2.3", "optax/__init__.py at v0.2.3"),
    ("optax.scale_by_learning_rate", "optax", "0.2.3", "optax/__init__.py at v0.2.3"),
    ("optax.lamb", "optax", "0.2.3", "optax/__init__.py at v0.2.3"),
    # orbax-checkpoint: preservation policies came in 0.11.14; 0.11.17 is the first that
    # imports under jax 0.7 (0.11.14-0.11.16 use jax.experimental.layout.DeviceLocalLayout).
    ("checkpoint_managers.AnyPreservationPolicy", "orbax-checkpoint", "0.11.17",
     "checkpoint/orbax/checkpoint/checkpoint_managers.py at v0.11.14; import under jax 0.7.1 "
     "tried on 0.11.16 (fails) and 0.11.17 (works)"),
    ("checkpoint_managers.LatestN", "orbax-checkpoint", "0.11.14", "checkpoint_managers.py"),
    ("checkpoint_managers.EveryNSteps", "orbax-checkpoint", "0.11.14", "checkpoint_managers.py"),
    ("ocp.CheckpointManagerOptions", "orbax-checkpoint", "0.11.14",
     "checkpoint_manager.py at v0.11.14 (preservation_policy field)"),
    ("ocp.args.Composite", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/args.py"),
    ("ocp.args.StandardSave", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/args.py"),
    ("ocp.args.StandardRestore", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/args.py"),
    ("ocp.args.JsonSave", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/args.py"),
    ("ocp.args.JsonRestore", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/args.py"),
    ("ocp.args.PyTreeRestore", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/args.py"),
    ("ocp.utils.checkpoint_steps", "orbax-checkpoint", "0.11.0", "orbax/checkpoint/utils.py"),
    # flax: the floor 0.11.2 is nn.with_logical_constraint honouring jax.set_mesh (flax reads
    # jax.sharding.get_abstract_mesh from 0.11.2, flax/core/meta.py get_global_mesh; before, only
    # the legacy `with mesh:` resource env) -- see test_flax_honours_constraints_under_set_mesh.
    ("nn.with_logical_constraint", "flax", "0.11.2", "flax/core/meta.py at v0.11.2"),
    ("nn.with_logical_partitioning", "flax", "0.10.0", "flax/linen/__init__.py"),
    ("nn.logical_axis_rules", "flax", "0.10.0", "flax/linen/__init__.py"),
    ("nn.logical_to_mesh_axes", "flax", "0.10.0", "flax/linen/__init__.py"),
    ("nn.logical_to_mesh_sharding", "flax", "0.10.0", "flax/linen/__init__.py"),
    ("nn.LogicallyPartitioned", "flax", "0.10.0", "flax/linen/__init__.py"),
    ("nn.unbox", "flax", "0.10.0", "flax/linen/__init__.py"),
]

# Keywords the code passes that a release could lack even where the name exists.
KEYWORDS = [("jax.shard_map", "check_vma"), ("jax.make_mesh", "axis_types"),
            ("ocp.CheckpointManagerOptions", "preservation_policy")]

FLOORED = ("jax", "flax", "optax", "orbax-checkpoint")


def _setup_cfg() -> configparser.ConfigParser:
  parser = configparser.ConfigParser()
  parser.read(REPO / "setup.cfg")
  return parser


def _requirements(value: str) -> dict[str, Requirement]:
  reqs = [Requirement(line.strip()) for line in value.strip().splitlines() if line.strip()]
  return {r.name: r for r in reqs}


def _floor(requirement: Requirement) -> Version:
  (lower,) = [s for s in requirement.specifier if s.operator == ">="]
  return Version(lower.version)


def _resolve(spelling: str):
  """The object `spelling` names in the installed packages (AttributeError if absent)."""
  head, *rest = spelling.split(".")
  parts = (ALIASES[head][0] if head in ALIASES else head).split(".") + rest
  for k in range(len(parts), 0, -1):  # the longest importable module prefix
    try:
      obj = importlib.import_module(".".join(parts[:k]))
    except ImportError:
      continue
    for name in parts[k:]:
      obj = getattr(obj, name)
    return obj
  raise ImportError(spelling)


def _source() -> str:
  return "\n".join(p.read_text() for d in SOURCE_DIRS for p in sorted((REPO / d).rglob("*.py")))


def test_python_requires_excludes_the_tpu_images_python_3_10():
  """Fails if pip could install this on Python 3.10, where the newest JAX is 0.6.x."""
  spec = Requirement("x" + _setup_cfg()["options"]["python_requires"]).specifier
  assert "3.10" not in spec and "3.10.12" not in spec
  assert "3.11" in spec and "3.12" in spec


def test_floors_admit_the_installed_versions_and_the_extras_share_jaxs():
  """Fails if a floor is above what is installed here (the floors would be untested), or if
  the [tpu]/[gpu] extras would let pip pick an older jax than install_requires."""
  cfg = _setup_cfg()
  reqs = _requirements(cfg["options"]["install_requires"])
  for name in FLOORED:
    installed = importlib.metadata.version(name)
    assert reqs[name].specifier.contains(installed, prereleases=True), (name, installed)
  extras = cfg["options.extras_require"]
  for extra, accelerator in (("tpu", "tpu"), ("gpu", "cuda12")):
    (jax_req,) = [r for r in _requirements(extras[extra]).values() if r.name == "jax"]
    assert jax_req.extras == {accelerator}, extra
    assert jax_req.specifier == reqs["jax"].specifier, extra


@pytest.mark.parametrize("spelling, dist, at_least, evidence", APIS,
                         ids=[api[0] for api in APIS])
def test_each_api_the_code_calls_exists_and_is_within_the_floor(spelling, dist, at_least,
                                                                evidence):
  """Fails if the installed package lacks the API, if the code no longer uses it (drop it
  from APIS), or if setup.cfg's floor for its package is below the release that has it."""
  del evidence  # for the reader
  assert _resolve(spelling) is not None
  head = spelling.split(".")[0]
  source = _source()
  assert re.search(rf"(?<![\w.]){re.escape(spelling)}\b", source), f"{spelling} is not used"
  if head in ALIASES:  # the name means that module in the code, not something else
    assert re.search(ALIASES[head][1], source, re.M), ALIASES[head][1]
  floor = _floor(_requirements(_setup_cfg()["options"]["install_requires"])[dist])
  assert floor >= Version(at_least), (spelling, str(floor), at_least)


@pytest.mark.parametrize("spelling, keyword", KEYWORDS)
def test_keywords_the_code_passes_exist(spelling, keyword):
  """Fails if the installed release's signature lacks a keyword the code passes, or the
  code stopped passing it."""
  assert keyword in inspect.signature(_resolve(spelling)).parameters
  assert re.search(rf"\b{keyword}=", _source())


def test_flax_honours_constraints_under_set_mesh():
  """bert_jax.training.sharding.activate puts the mesh in scope with jax.set_mesh; flax before 0.11.2
  looks only at the legacy `with mesh:` environment and silently drops every activation
  constraint (GSPMD then guesses layouts). Fails if the constraint is not in the program."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.training import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  with sharding.activate(mesh, [("batch", "data")]):
    text = jax.jit(lambda x: nn.with_logical_constraint(x * 2, ("batch", None))).lower(
        jnp.ones((jax.device_count(), 4))).as_text()
  assert re.search(r'sharding_constraint.*\{"data"\}', text), text
