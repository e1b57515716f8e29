"""Tests of bert_jax/model/config.py and encoder.py: config, parameter counts and layouts, masking, dropout, dtypes.

Parity with the reference implementation (transformers' PyTorch BERT) is in tests/test_heads.py.
"""


import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax.model import config as model_config
from bert_jax.model import dropout as dropout_lib
from bert_jax.model import encoder as model_lib
from bert_jax.model.encoder import BertConfig, BertModel
from bert_jax.model.heads import BertForPreTraining

# Small enough for 2 shared CPU cores; odd sizes catch transposed shapes.
TINY = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=24)


def _inputs(batch=2, length=12, vocab=97, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, vocab, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  mask[1, 7:] = 0  # row 1 is padded after 7 tokens
  seg = np.zeros((batch, length), np.int32)
  seg[:, 5:] = 1
  return ids, mask, seg


def _key(seed=0):
  # The rbg generator compiles far faster than threefry on CPU; test randomness
  # needs no particular generator.
  return jax.random.key(seed, impl="rbg")


def _init(module, *args, seed=0):
  """Random params of the right tree and shapes, drawn in NumPy.

  Shapes come from jax.eval_shape (no compilation); the values only need to be
  BERT-like (N(0, 0.02) weights, LayerNorm scales near 1), not BERT's initialiser.
  """
  shapes = nn.unbox(jax.eval_shape(lambda: module.init(_key(), *args))["params"])
  rng = np.random.default_rng(seed)
  def draw(path, s):
    base = 1.0 if path[-1].key == "scale" else 0.0
    return (base + 0.02 * rng.standard_normal(s.shape)).astype(s.dtype)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def _apply(model, params, *args, deterministic=True, seed=0):
  return model.apply({"params": params}, *args, deterministic=deterministic,
                     rngs={"dropout": _key(seed)})


def _n(tree):
  return sum(x.size for x in jax.tree.leaves(tree))


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize("size,lha", list(model_config.SIZES.items()))
def test_size_table(size, lha):
  """Fails if a named size gets other layers, hidden size or heads than the table, or other than
  BERT's intermediate size, vocab, positions, type vocab, dropout or LayerNorm epsilon."""
  cfg = BertConfig.from_size(size)
  assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == lha
  assert cfg.intermediate_size == 4 * cfg.hidden_size
  assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.type_vocab_size) == (30522, 512, 2)
  assert cfg.hidden_dropout_prob == cfg.attention_probs_dropout_prob == 0.1
  assert cfg.layer_norm_eps == 1e-12


@pytest.mark.parametrize("fields,named", [
    (dict(hidden_size=100, num_attention_heads=12), "num_attention_heads"),
    (dict(num_hidden_layers=0), "num_hidden_layers"),
    (dict(vocab_size=-5), "vocab_size"),
    (dict(intermediate_size=3.5), "intermediate_size"),
    (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob"),
    (dict(attention_probs_dropout_prob=-0.1), "attention_probs_dropout_prob"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
    (dict(embedding_size=1024), "embedding_size"),
    (dict(embedding_size=0), "embedding_size"),
    (dict(dtype="float64"), "dtype"),
    (dict(attention_impl="flash"), "attention_impl"),
    (dict(share_layers="yes"), "share_layers"),
])
def test_config_refuses_impossible_values(fields, named):
  """Fails if BertConfig accepts this impossible value, or refuses it without naming the field."""
  with pytest.raises(ValueError, match=named):
    BertConfig(**fields)


def test_config_unknown_size():
  """Fails if from_size accepts an unknown size name."""
  with pytest.raises(ValueError, match="size"):
    BertConfig.from_size("huge")


def test_hf_dict_round_trip_through_transformers():
  """Fails if our config does not survive a round trip through transformers' BertConfig, or
  transformers' defaults do not read as our (BERT-Base) defaults."""
  cfg = BertConfig.from_size("mini", hidden_dropout_prob=0.2)
  hf = transformers.BertConfig(**cfg.to_hf_dict())
  assert hf.hidden_act == "gelu" and hf.num_hidden_layers == 4 and hf.hidden_dropout_prob == 0.2
  assert BertConfig.from_hf_dict(hf.to_dict()) == cfg
  # The defaults of transformers' BertConfig are BERT-Base, as ours.
  assert BertConfig.from_hf_dict(transformers.BertConfig().to_dict()) == BertConfig()


def test_hf_dict_refuses_other_activations_and_models():
  """Fails if an HF config with gelu_new or relative position embeddings is read, or a share_layers
  config is written as an HF config."""
  d = transformers.BertConfig(hidden_act="gelu_new").to_dict()
  with pytest.raises(ValueError, match="hidden_act"):
    BertConfig.from_hf_dict(d)
  d = transformers.BertConfig(position_embedding_type="relative_key").to_dict()
  with pytest.raises(ValueError, match="position_embedding_type"):
    BertConfig.from_hf_dict(d)
  with pytest.raises(ValueError, match="share_layers"):
    BertConfig(share_layers=True).to_hf_dict()


def test_tf_dict():
  """Fails if google-research's BERT-Base bert_config.json does not read as our base config, or one
  missing vocab_size or with another activation is accepted."""
  # The bert_config.json google-research/bert ships with BERT-Base uncased.
  d = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
       "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
       "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,
       "type_vocab_size": 2, "vocab_size": 30522}
  assert BertConfig.from_tf_dict(d) == BertConfig.from_size("base")
  with pytest.raises(ValueError, match="vocab_size"):
    BertConfig.from_tf_dict({k: v for k, v in d.items() if k != "vocab_size"})
  with pytest.raises(ValueError, match="hidden_act"):
    BertConfig.from_tf_dict({**d, "hidden_act": "relu"})


# ----------------------------------------------------------------------------- parameters

def _hf_count(hf_class, cfg: BertConfig) -> int:
  """Parameters of a transformers PyTorch model built from our config (on the meta device:
  shapes only, no memory, no download). parameters() yields a tied tensor once: the MLM
  decoder, tied to the word embeddings, and its bias, tied to the head's, count once."""
  with torch.device("meta"):
    model = hf_class(transformers.BertConfig(**cfg.to_hf_dict()))
  return sum(p.numel() for p in model.parameters())


# Large repeats base's structure at other sizes (the same layers, 24 of them): CI checks it,
# the quick loop keeps base, which fails on the same missing or extra parameter.
@pytest.mark.parametrize("size,encoder,pretraining", [
    ("base", 109_482_240, 110_106_428),
    pytest.param("large", 335_141_888, 336_226_108, marks=pytest.mark.slow)])
def test_parameter_counts_equal_transformers_models(size, encoder, pretraining):
  """Our counts equal transformers' BertModel / BertForPreTraining (PyTorch) built from the
  same config (tied decoder); the figures are docs/verified.md's. Fails on a missing or extra
  parameter anywhere (a bias, a LayerNorm, an untied decoder, the pooler)."""
  cfg = BertConfig.from_size(size)
  assert model_lib.count_params(BertModel(cfg)) == _hf_count(transformers.BertModel, cfg) \
      == encoder
  assert model_lib.count_params(BertForPreTraining(cfg)) == \
      _hf_count(transformers.BertForPreTraining, cfg) == pretraining


def test_parameter_tree_and_logical_names():
  """Fails if a kernel's shape, a parameter's logical names or float32 dtype differ from the listed
  layout, or any parameter is not logically partitioned."""
  cfg = BertConfig(**TINY)
  ids, mask, seg = _inputs()
  boxed = jax.eval_shape(lambda: BertModel(cfg).init(_key(), ids, mask, seg))["params"]
  flat = flax.traverse_util.flatten_dict(boxed, sep="/")
  shapes = {k: v.value.shape for k, v in flat.items()}
  assert shapes["embeddings/word_embeddings/embedding"] == (97, 32)
  assert shapes["encoder/layer_1/attention/query/kernel"] == (32, 4, 8)
  assert shapes["encoder/layer_1/attention/output/kernel"] == (4, 8, 32)
  assert shapes["encoder/layer_0/intermediate/kernel"] == (32, 48)
  assert shapes["pooler/dense/kernel"] == (32, 32)
  for k, v in flat.items():
    assert isinstance(v, nn.LogicallyPartitioned), k
    assert len(v.names) == v.value.ndim and v.value.dtype == jnp.float32, k
  assert flat["encoder/layer_0/attention/key/kernel"].names == ("embed", "heads", "kv")
  assert flat["encoder/layer_0/output/kernel"].names == ("mlp", "embed")


def test_layer_sharing_divides_encoder_params_by_num_layers():
  """Fails if share_layers keeps more than one layer's parameters (a third of three layers'), or
  changes the embeddings."""
  cfg = BertConfig(**{**TINY, "num_hidden_layers": 3})
  args = _inputs()
  separate = _init(BertModel(cfg), *args)
  shared = _init(BertModel(cfg.replace(share_layers=True)), *args)
  assert list(shared["encoder"]) == ["layer"]
  assert _n(separate["encoder"]) == 3 * _n(shared["encoder"])
  assert _n(separate["embeddings"]) == _n(shared["embeddings"])


def test_albert_factorised_embedding_shapes():
  """Fails if embedding_size does not shrink the embedding tables, LayerNorm and MLM transform to E
  with an E-to-H projection, or a projection exists without it."""
  cfg = BertConfig(**TINY, embedding_size=8)
  ids, mask, seg = _inputs()
  params = _init(BertForPreTraining(cfg), ids, mask, seg, np.zeros((2, 3), np.int32))
  emb = params["bert"]["embeddings"]
  assert emb["word_embeddings"]["embedding"].shape == (97, 8)
  assert emb["position_embeddings"]["embedding"].shape == (24, 8)
  assert emb["layer_norm"]["scale"].shape == (8,)
  assert emb["projection"]["kernel"].shape == (8, 32) and emb["projection"]["bias"].shape == (32,)
  assert params["mlm_head"]["transform"]["kernel"].shape == (32, 8)
  assert params["mlm_head"]["layer_norm"]["scale"].shape == (8,)
  # Without factorisation there is no projection at all.
  plain = _init(BertModel(BertConfig(**TINY)), ids, mask, seg)
  assert "projection" not in plain["embeddings"]


# ----------------------------------------------------------------------------- behaviour

@pytest.fixture(scope="module")
def tiny():
  cfg = BertConfig(**TINY)
  args = _inputs()
  return cfg, _init(BertModel(cfg), *args), args


def test_padding_mask_masks(tiny):
  """Fails if changing a padded token moves a real output or the pooled output, or changing a real
  token does not move the real outputs."""
  cfg, params, (ids, mask, seg) = tiny
  seq, pooled = _apply(BertModel(cfg), params, ids, mask, seg)
  changed = ids.copy()
  changed[1, 9] = (changed[1, 9] + 5) % 97  # a padded position of row 1
  seq2, pooled2 = _apply(BertModel(cfg), params, changed, mask, seg)
  np.testing.assert_allclose(seq2[1, :7], seq[1, :7], atol=1e-6)
  np.testing.assert_allclose(pooled2, pooled, atol=1e-6)
  # Control: the same change at a real position does move the real outputs.
  changed = ids.copy()
  changed[1, 3] = (changed[1, 3] + 5) % 97
  seq3, _ = _apply(BertModel(cfg), params, changed, mask, seg)
  assert np.abs(seq3[1, :7] - seq[1, :7]).max() > 1e-3


def test_dropout_only_when_not_deterministic(tiny):
  """Fails if dropout seeds change deterministic outputs, training with dropout equals evaluation or
  ignores its seed, or training with dropout off differs from evaluation."""
  cfg, params, args = tiny
  model = BertModel(cfg)
  run = lambda det, seed=0: _apply(model, params, *args, deterministic=det, seed=seed)[0]
  np.testing.assert_array_equal(run(True, 0), run(True, 1))  # rng ignored at inference
  assert np.abs(run(False, 0) - run(True)).max() > 1e-2
  assert np.abs(run(False, 0) - run(False, 1)).max() > 1e-2
  # Dropout off: training mode is the deterministic function.
  off = BertModel(cfg.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
  np.testing.assert_allclose(
      _apply(off, params, *args, deterministic=False)[0], run(True), atol=1e-6)


def test_attention_dropout_path_agrees_with_dot_product_attention(tiny):
  """Fails if training with a vanishing attention-dropout rate differs from evaluation (padding
  included), or attention dropout 0.5 leaves the training output unchanged."""
  cfg, params, args = tiny
  # With a vanishing rate the explicit softmax + dropout path drops nothing, so it
  # must reproduce jax.nn.dot_product_attention, padding mask included.
  cfg = cfg.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=1e-9)
  model = BertModel(cfg)
  train = _apply(model, params, *args, deterministic=False)[0]
  np.testing.assert_allclose(train, _apply(model, params, *args)[0], atol=1e-5)
  # And attention dropout alone really is active in training.
  heavy = BertModel(cfg.replace(attention_probs_dropout_prob=0.5))
  out = _apply(heavy, params, *args, deterministic=False)[0]
  assert np.abs(out - train).max() > 1e-2


def _relative_rms(got, want, scale_of=None) -> float:
  """rms(got - want) / rms(scale_of): bfloat16's error relative to what it computed."""
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  scale = want if scale_of is None else np.asarray(scale_of, np.float32)
  return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(scale ** 2)))


# bfloat16 keeps 8 significant bits (a rounding is off by up to 2^-9, 0.2%); two layers of
# bf16 matmuls measure ~0.75% relative rms here. 2% leaves room for other seeds and CPUs
# and is 3x below what a logits cast through bf16 gives (shown in the test).
BF16_RELATIVE_RMS = 0.02


def test_bfloat16_forward_close_to_float32(tiny):
  """Scale-aware: each output's error relative to the part bf16 computed. The MLM logits'
  output bias is set as a trained one looks (log-frequency-like, about -4 +- 2) and is
  added in float32, so their scale is the logits minus that bias. Fails if the logits
  went through bfloat16 (shown below: ~6% relative), or on any error of that size or
  worse in a layer. It cannot tell LayerNorm statistics or the softmax computed in
  bfloat16 apart at this size: their errors here are within bf16's own (~0.75%)."""
  cfg, params, (ids, mask, seg) = tiny
  # Jitted: op by op, each bfloat16 primitive is compiled on its own, most of the time here.
  jit_apply = jax.jit(_apply, static_argnums=0)
  positions = np.array([[1, 4, 9], [0, 2, 6]], np.int32)
  full = _init(BertForPreTraining(cfg), ids, mask, seg, positions)
  bias = (-4 + 2 * np.random.default_rng(1).standard_normal(cfg.vocab_size)).astype(np.float32)
  full["mlm_head"]["output_bias"] = bias
  f32 = jit_apply(BertForPreTraining(cfg), full, ids, mask, seg, positions)
  bf16 = jit_apply(BertForPreTraining(cfg.replace(dtype="bfloat16")), full, ids, mask, seg,
                   positions)
  assert bf16["mlm_logits"].dtype == bf16["nsp_logits"].dtype == jnp.float32
  mlm_error = lambda out: _relative_rms(out["mlm_logits"], f32["mlm_logits"],
                                        f32["mlm_logits"] - bias)
  assert mlm_error(bf16) < BF16_RELATIVE_RMS
  assert _relative_rms(bf16["nsp_logits"], f32["nsp_logits"]) < BF16_RELATIVE_RMS
  # A head that returned its logits in bfloat16 (the bias then rounded with them) fails.
  through_bf16 = {k: v.astype(jnp.bfloat16).astype(jnp.float32) for k, v in bf16.items()}
  assert mlm_error(through_bf16) > 2 * BF16_RELATIVE_RMS
  seq16, _ = jit_apply(BertModel(cfg.replace(dtype="bfloat16")), params, ids, mask, seg)
  seq32, _ = jit_apply(BertModel(cfg), params, ids, mask, seg)
  assert seq16.dtype == jnp.bfloat16
  assert _relative_rms(seq16, seq32) < BF16_RELATIVE_RMS
  # And bfloat16 really ran: float32 all through would be exact to ~1e-7.
  assert _relative_rms(seq16, seq32) > 1e-4


def test_scanned_layers_match_per_layer(tiny):
  """Fails if stacked layers differ in layout from what the scanned model initialises, the scanned
  (remat) model's outputs differ from the per-layer model's, unstacking does not give the params
  back, or stacking with the wrong layer count is accepted."""
  cfg, params, args = tiny
  ref = _apply(BertModel(cfg), params, *args)
  stacked = model_lib.stack_layers(params, cfg.num_hidden_layers)
  assert "layers" in stacked["encoder"] and "layer_0" not in stacked["encoder"]
  assert stacked["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (2, 32, 4, 8)
  # remat on as well: it must not change the forward pass, and this runs its scan path.
  scanned_model = BertModel(cfg.replace(scan_layers=True, remat=True))
  # The layout stack_layers produces is exactly the one the scanned model initialises.
  fresh = _init(scanned_model, *args)
  assert jax.tree.map(np.shape, fresh) == jax.tree.map(np.shape, stacked)
  out = _apply(scanned_model, stacked, *args)
  for a, b in zip(out, ref):
    np.testing.assert_allclose(a, b, atol=1e-6)
  back = model_lib.unstack_layers(stacked)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  with pytest.raises(ValueError, match="3 layers"):
    model_lib.stack_layers(params, 3)


@pytest.mark.parametrize("features,axis,axes,x_shape", [
    (8, -1, ("embed", "mlp"), (3, 5, 6)),
    ((2, 4), -1, ("embed", "heads", "kv"), (3, 5, 6)),
    (6, (-2, -1), ("heads", "kv", "embed"), (3, 5, 2, 4)),
])
def test_dense_keeps_dense_generals_parameters_and_outputs(features, axis, axes, x_shape):
  """model.dense (full-shape kernels) is nn.DenseGeneral with the same parameter tree and values."""
  cfg = BertConfig(**TINY)
  n_out = 1 if isinstance(features, int) else len(features)
  reference = nn.DenseGeneral(
      features=features, axis=axis, dtype=cfg.compute_dtype, param_dtype=jnp.float32,
      kernel_init=model_lib.param_init(cfg, axes),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), axes[-n_out:]))
  ours = model_lib.dense(cfg, features, axes, "dense", axis=axis)
  x = jax.random.normal(jax.random.key(1), x_shape)
  want, got = reference.init(jax.random.key(0), x), ours.init(jax.random.key(0), x)
  assert jax.tree.map(lambda b: b.names, got, is_leaf=lambda v: isinstance(v, nn.Partitioned)) == \
      jax.tree.map(lambda b: b.names, want, is_leaf=lambda v: isinstance(v, nn.Partitioned))
  jax.tree.map(np.testing.assert_array_equal, nn.unbox(got), nn.unbox(want))
  np.testing.assert_array_equal(ours.apply(got, x), reference.apply(want, x))


def test_scanned_logical_names_get_a_layers_axis(tiny):
  """Fails if a scanned kernel's logical names do not lead with a "layers" axis."""
  cfg, _, args = tiny
  boxed = jax.eval_shape(
      lambda: BertModel(cfg.replace(scan_layers=True)).init(_key(), *args))["params"]
  kernel = boxed["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert kernel.names == ("layers", "embed", "heads", "kv")


def test_shared_scanned_layers_match_shared_loop(tiny):
  """Fails if shared layers under scan give other outputs than the shared loop."""
  cfg, _, args = tiny
  shared = cfg.replace(share_layers=True)
  params = _init(BertModel(shared), *args)
  out = _apply(BertModel(shared.replace(scan_layers=True)), params, *args)
  ref = _apply(BertModel(shared), params, *args)
  for a, b in zip(out, ref):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_too_long_sequence_is_refused(tiny):
  """Fails if a sequence longer than max_position_embeddings is accepted."""
  cfg, params, _ = tiny
  ids, mask, seg = _inputs(length=30)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    _apply(BertModel(cfg), params, ids, mask, seg)


class _PostLnLayerAsTrainedBefore(nn.Module):
  """BertLayer as written before pre_layer_norm existed (91a1695), the post-LN block that
  every earlier run trained with: one Dropout module, drawn from twice."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic=True):
    cfg = self.config
    drop = nn.Dropout(cfg.hidden_dropout_prob)
    h = model_lib.BertSelfAttention(cfg, name="attention")(x, mask, deterministic=deterministic)
    h = model_lib.layer_norm(cfg, "attention_layer_norm")(x + drop(h, deterministic=deterministic))
    y = model_lib.dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(h)
    y = model_lib.dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(model_lib.gelu(y))
    return model_lib.layer_norm(cfg, "output_layer_norm")(h + drop(y, deterministic=deterministic))


def test_post_ln_layer_draws_the_dropout_masks_earlier_runs_trained_on():
  """Fails if the post-LN block's training output (dropout on) differs in any bit from the block
  as it was before pre_layer_norm: e.g. a Dropout module per call draws the second mask from
  another rng stream, and a run started before then no longer resumes bit-identically."""
  cfg = BertConfig(**TINY)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 12, cfg.hidden_size)),
                  jnp.float32)
  mask = (jnp.asarray(_inputs()[1]) > 0)[:, None, None, :]
  params = _init(model_lib.BertLayer(cfg), x, mask)
  run = lambda layer, seed: layer.apply({"params": params}, x, mask, False,
                                        rngs={"dropout": _key(seed)})
  for seed in (0, 1):
    np.testing.assert_array_equal(run(model_lib.BertLayer(cfg), seed),
                                  run(_PostLnLayerAsTrainedBefore(cfg), seed))
  # Control: the masks matter, so equal outputs are equal masks.
  assert np.abs(run(model_lib.BertLayer(cfg), 0) - run(model_lib.BertLayer(cfg), 1)).max() > 1e-2


def test_dropout_draws_flax_masks_behind_a_barrier():
  """Fails if the model's Dropout draws any other mask or gradient than flax's nn.Dropout
  (the same keys, broadcast dims, scaling), or if its mask no longer passes an optimization
  barrier, which keeps XLA:TPU from fusing the mask's hash into its consumers
  (bert_jax/model/dropout.py: the v6e compile time)."""
  x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 4, 8, 8)), jnp.float32)

  def run(module, seed):
    apply = lambda v: module.apply({}, v, False, rngs={"dropout": jax.random.key(seed)})
    return apply(x), jax.grad(lambda v: (apply(v) ** 2).sum())(x), apply

  for dims in ((), (0, 1), (-1,)):
    for seed in (0, 1):
      out, grad, apply = run(dropout_lib.Dropout(0.3, broadcast_dims=dims), seed)
      ref_out, ref_grad, _ = run(nn.Dropout(0.3, broadcast_dims=dims), seed)
      np.testing.assert_array_equal(out, ref_out)
      np.testing.assert_array_equal(grad, ref_grad)
      assert 0.05 < float((out == 0).mean()) < 0.6  # control: about 30% are dropped
      assert "optimization_barrier" in str(jax.make_jaxpr(apply)(x))
  # Off (deterministic, or rate 0) it is the identity, as flax's.
  np.testing.assert_array_equal(dropout_lib.Dropout(0.3).apply({}, x, True), x)
  np.testing.assert_array_equal(
      dropout_lib.Dropout(0.0).apply({}, x, False, rngs={"dropout": jax.random.key(0)}), x)
