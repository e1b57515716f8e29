"""config.rng_impl: each dropout generator resumes bit-exactly from a checkpoint.

In process, with the real train step and orbax checkpoints: steps 1-4 straight,
against steps 1-2, save, restore into a fresh state, steps 3-4.
"""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.pretrain import steps as pretrain_step
from bert_jax.run import checkpoint
from bert_jax.training import optim
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from experiments.configs import optim_and_mesh

STEPS = 4


def _batches():
  rng = np.random.default_rng(0)
  out = []
  for _ in range(STEPS):
    mask = np.ones((4, 16), np.int32)
    mask[1, 11:] = 0
    out.append({
        "input_ids": rng.integers(5, 96, (4, 16)).astype(np.int32), "input_mask": mask,
        "segment_ids": (np.arange(16) >= 8).astype(np.int32)[None].repeat(4, 0),
        "masked_lm_positions": np.sort(rng.permutation(np.arange(1, 11))[:3])[None].repeat(
            4, 0).astype(np.int32),
        "masked_lm_ids": rng.integers(5, 96, (4, 3)).astype(np.int32),
        "masked_lm_weights": np.ones((4, 3), np.float32),
        "next_sentence_labels": rng.integers(0, 2, (4,)).astype(np.int32)})
  return out


def _setup():
  bert_config = model_lib.BertConfig.from_size(
      "tiny", vocab_size=96, hidden_size=32, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=16)  # paper dropout: 0.1 hidden, 0.1 attention
  model = heads.BertForPreTraining(bert_config)
  tx, _ = optim.make_optimizer(optim_and_mesh.optimizer_config(), total_steps=100)
  config = ml_collections.ConfigDict()
  optim_and_mesh.add_sharding(config)
  mesh = sharding.make_mesh(config.mesh, devices=jax.devices()[:1])
  ids = jnp.zeros((1, 16), jnp.int32)
  init = lambda rng: model.init({"params": rng}, ids, ids, ids, ids[:, :3])["params"]
  layout = state_lib.make_layout(model, init, tx, mesh, config.logical_axis_rules,
                                 jax.random.key(0))
  step = jax.jit(functools.partial(pretrain_step.train_step, grad_accum_steps=1,
                                   skip_nonfinite=False),
                 in_shardings=(layout.state, layout.batch, layout.replicated),
                 out_shardings=(layout.state, layout.replicated))
  return model, tx, mesh, layout, step


@pytest.fixture(scope="module")
def setup():
  return _setup()


def _run(step, state, batches, mesh, key):
  losses = []
  for b in batches:
    state, metrics = step(state, sharding.global_batch(b, mesh), key)
    losses.append(float(metrics["loss"]))
  return state, losses


# Each generator compiles its own train step (the key's type differs) and runs a save and
# restore: the default (threefry) stays in the quick loop, the others run in CI.
@pytest.mark.parametrize("rng_impl", [
    impl if impl == "threefry" else pytest.param(impl, marks=pytest.mark.slow)
    for impl in state_lib.RNG_IMPLS])
def test_resume_is_bit_exact_for_each_generator(setup, rng_impl, tmp_path):
  """Fails if, with this dropout generator, steps 3-4 after a save and restore at step 2 give other
  losses or weights than four straight steps, or the pipeline position is not restored."""
  model, tx, mesh, layout, step = setup
  _, raw = jax.random.split(jax.random.PRNGKey(0))
  key = state_lib.dropout_key(raw, rng_impl)
  batches = _batches()
  straight, straight_losses = _run(step, layout.init(jax.random.key(0)), batches, mesh, key)

  half, first_losses = _run(step, layout.init(jax.random.key(0)), batches[:2], mesh, key)
  ckpt = ml_collections.ConfigDict({"keep": 2, "keep_period": 0, "async_save": False})
  manager = checkpoint.make_manager(str(tmp_path), ckpt)
  checkpoint.save(manager, 2, {"params": half.params, "opt_state": half.opt_state,
                               "step": half.step}, {"position": 2})
  manager.wait_until_finished()
  restored, data_state = checkpoint.restore(manager, layout.abstract)
  manager.close()
  assert data_state == {"position": 2}
  resumed = state_lib.TrainState(step=restored["step"], apply_fn=model.apply,
                                 params=restored["params"], tx=tx,
                                 opt_state=restored["opt_state"])
  resumed, later_losses = _run(step, resumed, batches[2:], mesh, key)
  assert first_losses + later_losses == straight_losses
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.params),
               jax.device_get(straight.params))


def test_generators_draw_different_masks_and_threefry_is_unchanged(setup):
  """The choice matters (other masks, other outputs); threefry keeps the runs' old key.

  Fails if dropout_key ignored rng_impl (two generators, one output) or returned a new
  key for threefry. The network's training forward pass, with the step's fold_in of the
  step number, is where the key is used: one compile per generator (the key's type
  differs) of the forward alone, not of the whole train step (the resume test above
  runs the step)."""
  model, _, _, layout, _ = setup
  _, raw = jax.random.split(jax.random.PRNGKey(0))
  assert state_lib.dropout_key(raw, "threefry") is raw
  params = layout.init(jax.random.key(0)).params
  b = _batches()[0]

  @jax.jit
  def forward(key):
    out = model.apply({"params": params}, b["input_ids"], b["input_mask"], b["segment_ids"],
                      b["masked_lm_positions"], deterministic=False,
                      rngs={"dropout": jax.random.fold_in(key, 0)})
    return out["mlm_logits"].sum() + out["nsp_logits"].sum()

  losses = {impl: float(forward(state_lib.dropout_key(raw, impl)))
            for impl in state_lib.RNG_IMPLS}
  assert len(set(losses.values())) == 3, losses
  assert jax.random.key_impl(state_lib.dropout_key(raw, "rbg")) == jax.random.key_impl(
      jax.random.key(0, impl="rbg"))


def test_unknown_generator_is_refused():
  """Fails if an unknown rng_impl ("philox") is accepted, or refused without listing threefry and
  rbg."""
  with pytest.raises(ValueError, match=r"config.rng_impl='philox'.*'threefry', 'rbg'"):
    state_lib.check_rng_impl("philox")
