"""Tests of bert_jax/model/heads.py: parity with transformers' Flax BERT (encoder, pooler, MLM, NSP,
task heads) on a small random config, MLM gathering, and the task models' outputs.

The reference oracle is transformers 4.x's FlaxBert* classes. Random weights are drawn
once in our tree and mapped into the reference's layout by the small mapping below (the
real checkpoint converter is bert_jax/convert/__init__.py and has its own tests).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

from bert_jax.model.encoder import BertConfig, BertModel
from bert_jax.model import heads

H, A, L, V, I = 32, 4, 2, 99, 37
D = H // A


def _hf_config(**kw):
  return transformers.BertConfig(
      vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
      intermediate_size=I, max_position_embeddings=40, **kw)


@pytest.fixture(scope="module")
def hf_config():
  return _hf_config()


@pytest.fixture(scope="module")
def config(hf_config):
  return BertConfig.from_hf_dict(hf_config.to_dict())


@pytest.fixture(scope="module")
def inputs():
  rng = np.random.default_rng(1)
  ids = rng.integers(0, V, (2, 16)).astype(np.int32)
  mask = np.ones((2, 16), np.int32)
  mask[1, 10:] = 0  # padding: the reference and we must both mask it
  seg = np.zeros((2, 16), np.int32)
  seg[:, 8:] = 1
  return ids, mask, seg


def _random_params(module, *args, seed=0):
  """Random params in our tree (shapes by jax.eval_shape), N(0, 0.05); LN scales near 1."""
  shapes = nn.unbox(jax.eval_shape(
      lambda: module.init(jax.random.key(0, impl="rbg"), *args))["params"])
  rng = np.random.default_rng(seed)
  def draw(path, s):
    base = 1.0 if path[-1].key == "scale" else 0.0
    return (base + 0.05 * rng.standard_normal(s.shape)).astype(np.float32)
  return jax.tree_util.tree_map_with_path(draw, shapes)


def _to_hf_encoder(p):
  """Our BertModel params -> the reference's "bert" subtree (same maths, other names/shapes)."""
  ln = lambda x: {"scale": x["scale"], "bias": x["bias"]}
  e = p["embeddings"]
  out = {"embeddings": {k: e[k] for k in ("word_embeddings", "position_embeddings",
                                          "token_type_embeddings")},
         "encoder": {"layer": {}}, "pooler": {"dense": p["pooler"]["dense"]}}
  out["embeddings"]["LayerNorm"] = ln(e["layer_norm"])
  for i in range(L):
    lay = p["encoder"][f"layer_{i}"]
    att = lay["attention"]
    out["encoder"]["layer"][str(i)] = {
        "attention": {
            "self": {n: {"kernel": att[n]["kernel"].reshape(H, H),
                         "bias": att[n]["bias"].reshape(H)} for n in ("query", "key", "value")},
            "output": {"dense": {"kernel": att["output"]["kernel"].reshape(H, H),
                                 "bias": att["output"]["bias"]},
                       "LayerNorm": ln(lay["attention_layer_norm"])}},
        "intermediate": {"dense": lay["intermediate"]},
        "output": {"dense": lay["output"], "LayerNorm": ln(lay["output_layer_norm"])}}
  return out


def _hf(cls, hf_config, params, ids, mask, seg):
  ref = cls(hf_config, _do_init=False)
  return ref(ids, attention_mask=mask, token_type_ids=seg, params=params)


@pytest.fixture(scope="module")
def pretraining(config, inputs):
  positions = np.array([[0, 3, 7, 15], [1, 2, 9, 0]], np.int32)
  model = heads.BertForPreTraining(config)
  params = _random_params(model, *inputs, positions)
  return model, params, positions


def test_encoder_and_pretraining_heads_match_transformers(hf_config, inputs, pretraining):
  """Fails if our MLM/NSP logits at the gathered positions, or the encoder's unpadded sequence
  output and pooled output, differ from transformers' Flax BERT on the same random weights."""
  model, params, positions = pretraining
  hf_bert = _to_hf_encoder(params["bert"])
  mlm = params["mlm_head"]
  hf_params = {"bert": hf_bert, "cls": {
      "predictions": {"transform": {"dense": mlm["transform"],
                                    "LayerNorm": mlm["layer_norm"]},
                      "bias": mlm["output_bias"]},
      "seq_relationship": params["nsp_head"]}}
  ref = _hf(transformers.FlaxBertForPreTraining, hf_config, hf_params, *inputs)
  out = model.apply({"params": params}, *inputs, positions)
  ref_mlm = np.take_along_axis(np.asarray(ref.prediction_logits), positions[..., None], axis=1)
  np.testing.assert_allclose(out["mlm_logits"], ref_mlm, atol=1e-5)
  np.testing.assert_allclose(out["nsp_logits"], ref.seq_relationship_logits, atol=1e-5)

  ref = _hf(transformers.FlaxBertModel, hf_config, hf_bert, *inputs)
  seq, pooled = BertModel(model.config).apply({"params": params["bert"]}, *inputs)
  real = inputs[1].astype(bool)  # padded rows' outputs are not defined by either model
  np.testing.assert_allclose(np.asarray(seq)[real], np.asarray(ref.last_hidden_state)[real],
                             atol=1e-5)
  np.testing.assert_allclose(pooled, ref.pooler_output, atol=1e-5)


def test_mlm_gather_equals_full_sequence_then_gather(inputs, pretraining):
  """Fails if MLM logits computed at the positions differ from the full sequence's logits gathered
  there, or either has another shape."""
  model, params, positions = pretraining
  gathered = model.apply({"params": params}, *inputs, positions)["mlm_logits"]
  full = model.apply({"params": params}, *inputs, None)["mlm_logits"]
  assert full.shape == (2, 16, V) and gathered.shape == (2, 4, V)
  np.testing.assert_allclose(
      gathered, np.take_along_axis(np.asarray(full), positions[..., None], axis=1), atol=1e-6)


def test_mlm_cost_follows_predictions_not_length(config, inputs, pretraining):
  """Fails if the traced MLM decoder's output is [B, T, V] rather than [B, P, V]."""
  model, params, positions = pretraining
  # The V-wide decoder runs on B*P rows: its dot has P (4), not T (16), in its shape.
  jaxpr = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, *inputs, positions))(params))
  assert f"f32[2,4,{V}]" in jaxpr and f"f32[2,16,{V}]" not in jaxpr


def test_mlm_decoder_is_tied_to_word_embeddings(inputs, pretraining):
  """Fails if the MLM head holds parameters besides transform, layer_norm and output_bias (its own
  decoder), or halving the word embeddings leaves the MLM logits unchanged."""
  model, params, positions = pretraining
  assert set(params["mlm_head"]) == {"transform", "layer_norm", "output_bias"}
  bumped = jax.tree.map(lambda x: x, params)
  bumped["bert"]["embeddings"]["word_embeddings"]["embedding"] = (
      params["bert"]["embeddings"]["word_embeddings"]["embedding"] * 0.5)
  a = model.apply({"params": params}, *inputs, positions)["mlm_logits"]
  b = model.apply({"params": bumped}, *inputs, positions)["mlm_logits"]
  assert np.abs(a - b).max() > 1e-3


def test_without_nsp_head(config, inputs):
  """Fails if nsp_head=False still creates NSP parameters or returns anything but mlm_logits."""
  model = heads.BertForPreTraining(config, nsp_head=False)
  positions = np.zeros((2, 3), np.int32)
  params = _random_params(model, *inputs, positions)
  assert set(params) == {"bert", "mlm_head"}
  assert set(model.apply({"params": params}, *inputs, positions)) == {"mlm_logits"}


@pytest.mark.parametrize("num_labels", [3, 1])
def test_sequence_classification_matches_transformers(config, inputs, num_labels):
  """Fails if sequence-classification logits (3 labels, or 1 for regression) differ in shape, dtype
  or value from transformers', or the tree holds more than bert and classifier."""
  model = heads.BertForSequenceClassification(config, num_labels=num_labels)
  params = _random_params(model, *inputs)
  assert set(params) == {"bert", "classifier"}
  out = model.apply({"params": params}, *inputs)
  assert out.shape == (2, num_labels) and out.dtype == jnp.float32
  hf = _hf_config(num_labels=num_labels)
  ref = _hf(transformers.FlaxBertForSequenceClassification, hf,
            {"bert": _to_hf_encoder(params["bert"]), "classifier": params["classifier"]},
            *inputs)
  np.testing.assert_allclose(out, ref.logits, atol=1e-5)


def _full_rows_classifier(model, params, inputs):
  """The classifier's logits with every row of the last layer computed (pooled_only=False)."""
  _, pooled = BertModel(model.config).apply({"params": params["bert"]}, *inputs)
  k, b = params["classifier"]["kernel"], params["classifier"]["bias"]
  return pooled @ k + b


@pytest.mark.parametrize("variant", [{}, {"remat_policy": "full"}, {"share_layers": True}])
def test_classification_last_layer_computes_only_cls_with_the_same_logits_and_gradients(
    config, inputs, variant):
  """Fails if the one-row last layer (plain, full remat, shared layers) gives other logits or
  gradients than computing every row, or its last FFN no longer runs on [B, 1, I]."""
  # Fails if the one-row last layer changed the logits or the gradients (e.g. the
  # keys/values cut to one row too, or the residual taken from the wrong row), or if it
  # no longer saved work: the last FFN must run on [B,1,I], not [B,T,I].
  model = heads.BertForSequenceClassification(config.replace(
      attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, **variant), num_labels=3)
  params = _random_params(model, *inputs)
  np.testing.assert_allclose(model.apply({"params": params}, *inputs),
                             _full_rows_classifier(model, params, inputs), atol=1e-6)
  loss = lambda f: lambda p: jnp.sum(jnp.sin(f(p)))
  ours = jax.grad(loss(lambda p: model.apply({"params": p}, *inputs, deterministic=False,
                                             rngs={"dropout": jax.random.key(0)})))(params)
  full = jax.grad(loss(lambda p: _full_rows_classifier(model, p, inputs)))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), ours, full)
  jaxpr = str(jax.make_jaxpr(lambda p: model.apply({"params": p}, *inputs))(params))
  assert jaxpr.count(f"f32[2,16,{I}]") and f"f32[2,1,{I}]" in jaxpr
  full_jaxpr = str(jax.make_jaxpr(lambda p: _full_rows_classifier(model, p, inputs))(params))
  assert f"f32[2,1,{I}]" not in full_jaxpr


def test_token_classification_matches_transformers(config, inputs):
  """Fails if token-classification logits differ in shape, dtype or (unpadded) value from
  transformers'."""
  model = heads.BertForTokenClassification(config, num_labels=5)
  params = _random_params(model, *inputs)
  out = model.apply({"params": params}, *inputs)
  assert out.shape == (2, 16, 5) and out.dtype == jnp.float32
  hf = _hf_config(num_labels=5)
  ref = _hf(transformers.FlaxBertForTokenClassification, hf,
            {"bert": _to_hf_encoder(params["bert"]), "classifier": params["classifier"]},
            *inputs)
  real = inputs[1].astype(bool)
  np.testing.assert_allclose(np.asarray(out)[real], np.asarray(ref.logits)[real], atol=1e-5)


def test_question_answering_matches_transformers(hf_config, config, inputs):
  """Fails if start/end logits differ in shape, dtype or (unpadded) value from transformers', or the
  tree holds more than bert and qa_outputs."""
  model = heads.BertForQuestionAnswering(config)
  params = _random_params(model, *inputs)
  assert set(params) == {"bert", "qa_outputs"}
  start, end = model.apply({"params": params}, *inputs)
  assert start.shape == end.shape == (2, 16) and start.dtype == jnp.float32
  ref = _hf(transformers.FlaxBertForQuestionAnswering, hf_config,
            {"bert": _to_hf_encoder(params["bert"]), "qa_outputs": params["qa_outputs"]},
            *inputs)
  real = inputs[1].astype(bool)
  np.testing.assert_allclose(np.asarray(start)[real], np.asarray(ref.start_logits)[real],
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(end)[real], np.asarray(ref.end_logits)[real], atol=1e-5)


def test_task_heads_dropout_only_in_training(config, inputs):
  """Fails if two dropout seeds give different logits in evaluation, or the same logits in
  training."""
  model = heads.BertForSequenceClassification(config.replace(attention_probs_dropout_prob=0.0))
  params = _random_params(model, *inputs)
  run = lambda det, seed: model.apply({"params": params}, *inputs, deterministic=det,
                                      rngs={"dropout": jax.random.key(seed, impl="rbg")})
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert np.abs(run(False, 0) - run(False, 1)).max() > 1e-4
