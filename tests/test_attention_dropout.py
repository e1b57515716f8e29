"""config.model.attention_dropout_shared: which attention-dropout mask the einsum path draws.

False (the default, the paper's and google-research/bert's): one mask per example, head,
query and key. True (transformers' Flax BERT, flax's broadcast_dropout): one [T, T] mask
shared by every example and head. The masks are read off the real model: every
nn.Dropout call on a 4-D input inside BertModel is the attention-probabilities one
(hidden dropout sees [B, T, H]), captured with nn.intercept_methods.
"""

import functools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import errors
from bert_jax.model import encoder as model_lib
from bert_jax.run import workdir

RATE = 0.5  # half the probabilities dropped: two independent [8, 8] masks agree with p 2^-64
BATCH, LENGTH, HEADS = 3, 8, 2


def _config(shared: bool) -> model_lib.BertConfig:
  # attention_impl stays "auto": in training with dropout it takes the einsum path, as runs do.
  return model_lib.BertConfig(
      vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=HEADS,
      intermediate_size=64, max_position_embeddings=16, attention_probs_dropout_prob=RATE,
      attention_dropout_shared=shared)


def _inputs():
  ids = jax.random.randint(jax.random.PRNGKey(1), (BATCH, LENGTH), 1, 64)
  return ids, jnp.ones_like(ids), jnp.zeros_like(ids)  # no padding: every probability > 0


# Jitted: op by op, the first init and apply of even this model take ~15 s on 2 loaded cores.
@functools.cache
def _params(shared: bool = False):
  return jax.jit(model_lib.BertModel(_config(shared)).init)(
      jax.random.PRNGKey(0), *_inputs())["params"]


@functools.partial(jax.jit, static_argnums=0)
def _eval(shared: bool, params):
  return model_lib.BertModel(_config(shared)).apply({"params": params}, *_inputs())


@functools.partial(jax.jit, static_argnums=0)
def _train(shared: bool, params, rng):
  """(sequence output, [(probabilities in, out)] of every attention dropout), training mode."""
  seen = []

  def capture(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, nn.Dropout) and args[0].ndim == 4:
      seen.append((args[0], out))
    return out

  with nn.intercept_methods(capture):
    seq, _ = model_lib.BertModel(_config(shared)).apply(
        {"params": params}, *_inputs(), deterministic=False, rngs={"dropout": rng})
  return seq, seen


def _attention_dropouts(shared: bool):
  seen = jax.tree.map(np.asarray, _train(shared, _params(), jax.random.PRNGKey(2))[1])
  assert len(seen) == 1, "expected one attention dropout in the one-layer model"
  return seen


def _dropped(probs_in, probs_out):
  assert probs_in.shape == (BATCH, HEADS, LENGTH, LENGTH)  # [B, heads, T, T]
  assert (probs_in > 0).all()
  dropped = probs_out == 0
  # What is kept is scaled by 1 / (1 - rate), as nn.Dropout does.
  np.testing.assert_allclose(probs_out[~dropped], probs_in[~dropped] / (1 - RATE), rtol=1e-6)
  return dropped


def test_shared_mask_is_one_t_by_t_mask_for_every_example_and_head():
  """Fails if any example or head gets its own mask (e.g. broadcast over the wrong axes)."""
  for probs_in, probs_out in _attention_dropouts(shared=True):
    dropped = _dropped(probs_in, probs_out)
    assert 0.2 < dropped.mean() < 0.8  # the mask does drop, at about the rate
    np.testing.assert_array_equal(dropped, np.broadcast_to(dropped[0, 0], dropped.shape))


def test_per_example_mask_differs_across_examples_and_heads():
  """The default (the paper's): fails if examples or heads share a mask."""
  for probs_in, probs_out in _attention_dropouts(shared=False):
    dropped = _dropped(probs_in, probs_out)
    assert 0.2 < dropped.mean() < 0.8
    for b in range(1, BATCH):
      assert (dropped[b, 0] != dropped[0, 0]).any(), f"example {b} has example 0's mask"
    assert (dropped[0, 1] != dropped[0, 0]).any(), "head 1 has head 0's mask"


def test_eval_is_the_same_whichever_mask_and_the_default_is_per_example():
  """Deterministic output and parameters do not depend on the flag; its default is False."""
  assert model_lib.BertConfig().attention_dropout_shared is False
  params = _params()
  for a, b in zip(_eval(False, params), _eval(True, params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert jax.tree.all(jax.tree.map(np.array_equal, _params(True), params))


def test_training_output_with_the_same_rng_is_reproducible_and_depends_on_the_flag():
  """The same dropout rng gives the same step with shared masks; the flag reaches the model."""
  def train_out(shared, seed=2):
    return np.asarray(_train(shared, _params(), jax.random.PRNGKey(seed))[0])

  np.testing.assert_array_equal(train_out(True), train_out(True))
  assert not np.allclose(train_out(True), train_out(False))
  assert not np.allclose(train_out(True), train_out(True, seed=3))


def test_non_bool_is_refused():
  """Fails if BertConfig accepts a non-bool attention_dropout_shared ("yes") without a
  ValueError."""
  with pytest.raises(ValueError, match="attention_dropout_shared must be a bool"):
    model_lib.BertConfig(attention_dropout_shared="yes")


def test_configs_and_the_benchmark_default_to_the_papers_mask():
  """pretrain/finetune configs keep per-example masks, and so does the benchmark's side
  (what the configs ship); its --attention_dropout_mask=shared is transformers' recipe.
  Would fail if a default drew one mask for every example and head."""
  from experiments.configs import finetune as finetune_configs  # pylint: disable=g-import-not-at-top
  from experiments.configs import pretrain as pretrain_configs  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import finetune_sides as sides  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import finetune_vs_transformers as bench  # pylint: disable=g-import-not-at-top
  for config in (pretrain_configs.get_config("tiny"), finetune_configs.get_config("sst2")):
    assert config.model.attention_dropout_shared is False
  assert model_lib.BertConfig.from_size(
      "tiny", **pretrain_configs.get_config("tiny").model.to_dict() | {"vocab_size": 64}
  ).attention_dropout_shared is False
  default = sides.ours_config(bench.flags().parse_args([]), (0,))
  assert default.model.attention_dropout_shared is False
  shared = sides.ours_config(bench.flags().parse_args(["--attention_dropout_mask=shared"]), (0,))
  assert shared.model.attention_dropout_shared is True


def _open(path, bert_config):
  config = ml_collections.ConfigDict({"variant": "tiny", "total_steps": 10})
  return workdir.open_workdir(str(path), config, bert_config)


def test_a_record_without_the_field_reads_as_per_example_masks(tmp_path):
  """A workdir recorded before the field existed ran per-example masks: resuming with the
  default passes, resuming with shared masks is refused by name (it is another recipe)."""
  run = tmp_path / "run"
  tiny = model_lib.BertConfig.from_size("tiny", vocab_size=96)
  _open(run, tiny).release()
  (run / "checkpoints" / "5").mkdir(parents=True)  # work the record speaks for
  (run / "checkpoints" / "5" / "_CHECKPOINT_METADATA").write_text("{}")
  record_file = run / "record.json"
  record = json.loads(record_file.read_text())
  del record["bert_config"]["attention_dropout_shared"]  # as older code wrote it
  record_file.write_text(json.dumps(record))

  _open(run, tiny).release()
  with pytest.raises(errors.UsageError, match="network attention_dropout_shared=False"):
    _open(run, tiny.replace(attention_dropout_shared=True))
