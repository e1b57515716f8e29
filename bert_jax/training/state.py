"""The sharded training state, shared by pretraining (train.py) and fine-tuning.

Both trainers build their mesh, place parameters and optimizer state by logical
axis names, take optimizer updates (with gradient accumulation and the
non-finite guard) and decide where a run starts through these functions, so
there is one copy of each:

  setup_mesh          distributed init, accelerator check, device mesh, axis rules
  axis_rules          config.logical_axis_rules as flax wants them
  make_layout         shardings and abstract shapes of {params, opt_state, step}
  jit_steps           the train and eval steps compiled on a layout
  start               resume from the workdir, else init from a checkpoint, else random
  dropout_key         the dropout key in config.rng_impl's generator
  accumulated_grads   loss and gradients of a global batch, in micro-batches if asked
  apply_update        the optimizer step, optionally dropping a non-finite one
"""

import dataclasses
from typing import Any, Callable

from absl import logging
import flax.linen as nn
from flax.training import train_state as train_state_lib
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bert_jax import errors
from bert_jax.model import encoder as model_lib
from bert_jax.run import checkpoint
from bert_jax.run import job_state
from bert_jax.training import sharding

TrainState = train_state_lib.TrainState

# BertConfig fields a checkpoint must share with the configured model to be loaded into it.
ARCHITECTURE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                       "intermediate_size", "vocab_size", "embedding_size", "share_layers",
                       "max_position_embeddings", "type_vocab_size")


def setup_mesh(config: ml_collections.ConfigDict) -> tuple[jax.sharding.Mesh,
                                                         list[tuple[str, Any]]]:
  """Joins the distributed run (if configured) and builds the mesh; writes nothing.

  Returns (mesh, logical axis rules as flax wants them).
  """
  # Fine-tuning sweeps set up one run after another in the same processes.
  if config.distributed.enabled and not jax.distributed.is_initialized():
    kwargs = {"coordinator_address": config.distributed.coordinator_address or None,
              "num_processes": config.distributed.num_processes or None,
              "process_id": None if config.distributed.process_id < 0
                            else config.distributed.process_id}
    jax.distributed.initialize(**kwargs)
  if config.distributed.enabled:
    job_state.cluster_joined()  # the job's record may now ask which process this is
  check_accelerator(config.require_accelerator)
  mesh = sharding.make_mesh(config.mesh)
  rules = axis_rules(config)
  # The one line that says where the run is (the backends' probing is kept off the terminal).
  kinds = sorted({d.device_kind for d in jax.devices()})
  logging.info("mesh %s over %d devices (%d processes) of kind %s", dict(mesh.shape),
               jax.device_count(), jax.process_count(), ", ".join(kinds))
  return mesh, rules


def axis_rules(config: ml_collections.ConfigDict) -> list[tuple[str, Any]]:
  """config.logical_axis_rules as flax wants them (JSON round trips turn tuples into lists)."""
  return [(name, tuple(axes) if isinstance(axes, list) else axes)
          for name, axes in config.logical_axis_rules]


def check_accelerator(required: bool) -> None:
  """Refuses a job that requires a GPU or TPU (config.require_accelerator) but finds only CPUs.

  JAX falls back to its CPU backend when no CUDA/TPU build is installed or the
  build cannot see the devices; a GPU job would then train on CPUs for days without
  complaint. Called after jax.distributed.initialize (a GPU cluster's backend must
  not start before it) and before anything is written.
  """
  platform = jax.default_backend()
  if not required or platform != "cpu":
    return
  kinds = ", ".join(sorted({d.device_kind for d in jax.devices()}))
  raise errors.UsageError(
      f"config.require_accelerator=True but JAX {jax.__version__} found only {platform} devices "
      f"({jax.local_device_count()} x {kinds}): install JAX for the accelerator in this "
      "environment (`pip install -e '.[gpu]'` for NVIDIA GPUs, `pip install -e '.[tpu]'` on a "
      "Cloud TPU VM) and check `python -c 'import jax; print(jax.devices())'`, or set "
      "--config.require_accelerator=False to run on CPUs")


@dataclasses.dataclass
class StateLayout:
  """Where every part of a TrainState lives, and its abstract shapes for restoring."""
  mesh: jax.sharding.Mesh
  params: Any             # NamedSharding per parameter
  state: TrainState       # the same for the whole TrainState
  opt_state: Any          # NamedSharding per optimizer-state leaf
  abstract: dict          # {"params", "opt_state", "step"} as sharded ShapeDtypeStructs
  abstract_params: Any    # parameter shapes (unboxed)
  replicated: jax.sharding.NamedSharding
  batch: jax.sharding.NamedSharding   # leading (batch) axis over data and fsdp
  init: Callable[[jax.Array], TrainState]   # jitted random init, born sharded


def make_layout(model: nn.Module, init_params: Callable[[jax.Array], Any],
                tx: optax.GradientTransformation, mesh: jax.sharding.Mesh,
                rules: list[tuple[str, Any]], rng: jax.Array) -> StateLayout:
  """Shardings from the logical axis names on `init_params(rng)`'s boxed parameters.

  Parameters, optimizer state and batches get explicit shardings here; the
  activations get theirs from the model's logical constraints, which hold only
  where the step is traced under sharding.activate(mesh, rules), as both
  trainers do. `init` (random initialisation) needs no mesh in scope.
  """
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init_params, rng)
    param_shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract_params = nn.unbox(boxed)
  sharding.check_divisible(abstract_params, param_shardings)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  abstract_opt_state = jax.eval_shape(tx.init, abstract_params)
  # Moments take their parameter's sharding; counters and the like are replicated.
  opt_shardings = optax.tree_map_params(
      tx, lambda _, s: s, abstract_opt_state, param_shardings,
      transform_non_params=lambda _: replicated)
  state_shardings = TrainState(step=replicated, apply_fn=model.apply, params=param_shardings,
                               tx=tx, opt_state=opt_shardings)
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      {"params": abstract_params, "opt_state": abstract_opt_state,
       "step": jax.ShapeDtypeStruct((), jnp.int32)},
      {"params": param_shardings, "opt_state": opt_shardings, "step": replicated})

  def init(rng):
    with nn.logical_axis_rules(rules):
      return TrainState.create(apply_fn=model.apply, params=nn.unbox(init_params(rng)), tx=tx)

  return StateLayout(mesh=mesh, params=param_shardings, state=state_shardings,
                     opt_state=opt_shardings, abstract=abstract,
                     abstract_params=abstract_params, replicated=replicated,
                     batch=sharding.batch_sharding(mesh),
                     init=jax.jit(init, out_shardings=state_shardings))


def jit_steps(layout: StateLayout, train_step: Callable, eval_step: Callable
              ) -> tuple[Callable, Callable]:
  """(train, eval) jitted with the layout's explicit shardings.

  train(state, batch, rng) -> (state, metrics): the state donated (updated in
  place, never two copies in memory), the metrics replicated. eval(params,
  batch) -> its outputs, replicated.
  """
  train = jax.jit(train_step, in_shardings=(layout.state, layout.batch, layout.replicated),
                  out_shardings=(layout.state, layout.replicated), donate_argnums=(0,))
  evaluate = jax.jit(eval_step, in_shardings=(layout.params, layout.batch),
                     out_shardings=layout.replicated)
  return train, evaluate


def start(manager, layout: StateLayout, model: nn.Module, tx: optax.GradientTransformation,
          rng: jax.Array, load_init: Callable[[Any], Any] | None = None,
          init_source: str = "") -> tuple[TrainState, dict | None]:
  """Where a run starts, decided once: (state, data_state or None).

    1. the newest checkpoint in `manager` that restores (auto-resume; see
       checkpoint.restore_latest for damaged ones), else
    2. `load_init(fresh params as host arrays) -> params` (a pretrained checkpoint), else
    3. random initialisation from `rng`.
  """
  if manager.latest_step() is not None:
    step, restored, data_state = checkpoint.restore_latest(manager, layout.abstract)
    state = TrainState(step=restored["step"], apply_fn=model.apply, params=restored["params"],
                       tx=tx, opt_state=restored["opt_state"])
    logging.info("resumed from %s at step %d", manager.directory, step)
    return state, data_state
  if load_init is not None:
    fresh = jax.device_get(layout.init(rng).params)
    params = jax.device_put(load_init(fresh), layout.params)
    state = TrainState(step=jnp.zeros((), jnp.int32), apply_fn=model.apply, params=params,
                       tx=tx, opt_state=jax.jit(tx.init, out_shardings=layout.opt_state)(params))
    logging.info("initialised from %s", init_source)
    return state, None
  return layout.init(rng), None


# config.rng_impl -> jax PRNG implementation of the dropout key.
RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def check_rng_impl(rng_impl: str) -> None:
  """Refuses an unknown config.rng_impl, naming the choices."""
  if rng_impl not in RNG_IMPLS:
    raise ValueError(f"config.rng_impl={rng_impl!r}: expected one of {tuple(RNG_IMPLS)}")


def dropout_key(key: jax.Array, rng_impl: str) -> jax.Array:
  """A run's dropout key in config.rng_impl's generator, from its (raw threefry) `key`.

  "threefry" returns `key` itself: runs keep the dropout masks they always had.
  "rbg" / "unsafe_rbg" make a key of that generator from bits drawn with `key`:
  XLA's RngBitGenerator then makes the masks, a fraction of threefry's cost on GPUs
  and TPUs (rbg still splits and folds in with threefry; unsafe_rbg does not).
  The train step folds the step number into it, so a resumed run draws the same
  masks as an uninterrupted one with any of the three.
  """
  check_rng_impl(rng_impl)
  if rng_impl == "threefry":
    return key
  impl = RNG_IMPLS[rng_impl]
  shape = jax.random.key_data(jax.random.key(0, impl=impl)).shape
  return jax.random.wrap_key_data(jax.random.bits(key, shape, jnp.uint32), impl=impl)


def check_architecture(loaded: model_lib.BertConfig, configured: model_lib.BertConfig,
                       source: str) -> None:
  """Refuses a checkpoint whose network differs from the configured one, naming the field."""
  for field in ARCHITECTURE_FIELDS:
    if getattr(loaded, field) != getattr(configured, field):
      raise ValueError(f"{source} has {field}={getattr(loaded, field)} but the configured "
                       f"model has {getattr(configured, field)}")


def merge_params(fresh: Any, loaded: Any, path: str = "") -> Any:
  """`fresh` with every subtree present in `loaded` replaced; shapes must agree.

  Raises:
    ValueError: naming the parameter path and both shapes.
  """
  if not isinstance(fresh, dict):
    if np.shape(fresh) != np.shape(loaded):
      raise ValueError(f"checkpoint parameter {path} has shape {np.shape(loaded)} but the "
                       f"model's is {np.shape(fresh)}")
    return np.asarray(loaded, dtype=fresh.dtype)
  return {k: merge_params(v, loaded[k], f"{path}/{k}" if path else k) if k in loaded else v
          for k, v in fresh.items()}


def stack_if_scanned(bert_params: Any, bert_config: model_lib.BertConfig) -> Any:
  """Imported encoders are per-layer; a scanned model wants its layers stacked."""
  if bert_config.scan_layers:
    return model_lib.stack_layers(bert_params, bert_config.num_hidden_layers)
  return bert_params


def accumulated_grads(loss_fn: Callable, params: Any, batch: dict[str, jax.Array],
                      rng: jax.Array, grad_accum_steps: int) -> tuple[tuple[Any, Any], Any]:
  """((loss, sums), grads) of `loss_fn(params, micro_batch, rng) -> (loss, sums)` summed
  over `grad_accum_steps` micro-batches of `batch`.

  loss_fn must weight its micro-batch's loss by the micro-batch's share of the
  whole batch (the caller closes over the full-batch normalisers), so the sums
  equal the full-batch loss and gradient exactly.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    return grad_fn(params, batch, rng)

  # Micro-batch j takes examples j, j+k, j+2k...: every device keeps its own
  # rows, where a contiguous split would move each micro-batch to a few devices.
  def split(x):
    x = x.reshape((x.shape[0] // grad_accum_steps, grad_accum_steps) + x.shape[1:])
    return jnp.moveaxis(x, 1, 0)
  micro_batches = jax.tree.map(split, batch)

  def accumulate(carry, xs):
    j, micro = xs
    micro = nn.with_logical_constraint(micro, jax.tree.map(
        lambda x: ("batch",) + (None,) * (x.ndim - 1), micro))
    (loss, sums), grads = grad_fn(params, micro, jax.random.fold_in(rng, j))
    return jax.tree.map(jnp.add, carry, (loss, sums, grads)), None

  first = jax.tree.map(lambda x: x[0], micro_batches)
  (loss0, sums0), grads0 = jax.eval_shape(grad_fn, params, first, rng)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (loss0, sums0, grads0))
  (loss, sums, grads), _ = jax.lax.scan(
      accumulate, zeros, (jnp.arange(grad_accum_steps), micro_batches))
  return (loss, sums), grads


def apply_update(state: TrainState, grads: Any, loss: jax.Array,
                 skip_nonfinite: bool) -> tuple[TrainState, jax.Array, jax.Array]:
  """(new state, gradient global norm, finite flag) after one optimizer update.

  With skip_nonfinite a NaN/Inf loss or gradient leaves params and optimizer
  state as they were; the step counter (and so the data and dropout stream)
  moves on either way.
  """
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  new_state = state.apply_gradients(grads=grads)
  if skip_nonfinite:
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    new_state = new_state.replace(params=keep(new_state.params, state.params),
                                  opt_state=keep(new_state.opt_state, state.opt_state))
  return new_state, grad_norm, finite
