"""Device mesh, logical-axis rules -> NamedSharding, and global batch placement.

The model names its parameter and activation axes ("embed", "heads", ...); the
config's rules table maps those names onto the mesh axes ('data', 'fsdp',
'tensor'). Everything here is the same on 1 CPU, 8 GPUs and a TPU pod: only the
mesh sizes in the config change.
"""

from collections.abc import Iterator, Mapping, Sequence
import contextlib
import math
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")
# Batch examples are split over every axis that does not split the model.
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """Resolves the config's axis sizes (one may be -1) against `num_devices`.

  Raises:
    ValueError: naming the axes when the sizes cannot cover the devices exactly.
  """
  sizes = [int(mesh_config[name]) for name in MESH_AXES]
  for name, size in zip(MESH_AXES, sizes):
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{name}={size}: axis sizes are positive or -1")
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh {dict(zip(MESH_AXES, sizes))}: at most one axis may be -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(
          f"config.mesh {dict(zip(MESH_AXES, sizes))}: the fixed axes ({known} devices) "
          f"do not divide the {num_devices} available devices")
    sizes[sizes.index(-1)] = num_devices // known
  elif known != num_devices:
    raise ValueError(
        f"config.mesh {dict(zip(MESH_AXES, sizes))} needs {known} devices but "
        f"{num_devices} are available (use -1 on one axis to take the rest)")
  return tuple(sizes)


def make_mesh(mesh_config: Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
  """Builds the ('data', 'fsdp', 'tensor') mesh over `devices` (default: all)."""
  devices = jax.devices() if devices is None else list(devices)
  shape = mesh_shape(mesh_config, len(devices))
  # Auto axes: GSPMD propagates shardings from the explicit in/out shardings
  # and the model's logical constraints.
  return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                       devices=devices)


@contextlib.contextmanager
def activate(mesh: Mesh, rules: Sequence[tuple[str, Any]]) -> Iterator[None]:
  """Mesh and logical-axis rules in scope: what both trainers trace and run their steps under.

  The model's activation constraints (nn.with_logical_constraint) need both; without
  the mesh they are silently dropped and GSPMD guesses activation layouts from the
  parameters, e.g. keeping the whole global batch on every device under FSDP.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules([tuple(r) for r in rules]):
    yield


def data_parallel_size(mesh: Mesh) -> int:
  """Number of ways the batch dimension is split."""
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding of a batch leaf: leading (example) axis split over BATCH_AXES."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules: Sequence[tuple[str, Any]]) -> Any:
  """NamedShardings for a tree whose leaves may be nn.LogicallyPartitioned.

  Works on abstract trees (jax.eval_shape output); unboxed leaves (e.g. the
  optimizer's step counter) are replicated.
  """
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, [tuple(r) for r in rules])


def check_divisible(abstract_tree: Any, shardings: Any) -> None:
  """Raises ValueError naming the first array whose dims do not split evenly.

  Checked on shapes before anything compiles, so a mesh that cannot hold the
  model (e.g. a vocabulary not divisible by the tensor axis) is refused early.
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(abstract_tree)
  flat_shardings = jax.tree_util.tree_leaves(shardings)
  for (path, leaf), sharding in zip(flat, flat_shardings, strict=True):
    spec = sharding.spec
    for dim, axes in zip(leaf.shape, spec):
      if axes is None:
        continue
      axes = (axes,) if isinstance(axes, str) else axes
      ways = math.prod(sharding.mesh.shape[a] for a in axes)
      if dim % ways:
        raise ValueError(
            f"{jax.tree_util.keystr(path)} has shape {leaf.shape}: dimension {dim} cannot "
            f"be split {ways} ways over mesh axes {axes}; change config.mesh or the model size")


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles the global batch from this host's piece (all hosts call it).

  Each host holds `global_batch / process_count` consecutive examples; the
  result is one jax.Array per feature split over the batch axes.
  """
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}


class DevicePrefetch:
  """An input with its next batch already read and on the devices while a step runs.

  Wraps a pipeline with `next()`, `last_fingerprint`, `get_state()` and `close()`
  (data_pipeline.examples.pretraining.PretrainingInput). `next(prefetch)` gives (host batch,
  global device batch); `fetch_next()`, called right after a step is dispatched,
  reads and places the following batch while that step computes, so the devices
  never wait for the host's read and copy. `get_state()` and `last_fingerprint`
  describe the batch last given out, not the one read ahead: a checkpoint taken
  between steps resumes exactly where the steps are.
  """

  def __init__(self, data: Any, mesh: Mesh):
    self.data, self._mesh = data, mesh
    self._ahead = None  # (host batch, device batch, fingerprint, pipeline state)
    self.last_fingerprint, self._state = data.last_fingerprint, data.get_state()

  def fetch_next(self) -> None:
    """Reads the next batch and starts its transfer to the devices (asynchronous)."""
    if self._ahead is None:
      local = next(self.data)
      self._ahead = (local, global_batch(local, self._mesh), self.data.last_fingerprint,
                     self.data.get_state())

  def __iter__(self):
    return self

  def __next__(self) -> tuple[Mapping[str, np.ndarray], dict[str, jax.Array]]:
    self.fetch_next()
    (local, placed, self.last_fingerprint, self._state), self._ahead = self._ahead, None
    return local, placed

  def get_state(self) -> dict[str, Any]:
    """The pipeline position after the batch last given out."""
    return self._state

  def close(self) -> None:
    """Closes the wrapped pipeline."""
    self.data.close()
