"""Tests of bert_jax/model/heads.py: parity with transformers' PyTorch BERT (encoder, pooler, MLM,
NSP, task heads) on a small random config, MLM gathering, and the task models' outputs.

The reference oracle is transformers 5's BertModel / BertFor* classes in PyTorch, with
random weights drawn in the test. Each is saved as Hugging Face saves it
(save_pretrained) and read into our tree by bert_jax.convert, as a user would
(load_pretrained, or load_for_finetuning for a task head); the converter's own
refusals and formats are tested in tests/test_convert.py.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax import convert
from bert_jax.model.encoder import BertConfig, BertModel
from bert_jax.model import heads

H, A, L, V, I = 32, 4, 2, 99, 37
D = H // A
POSITIONS = np.array([[0, 3, 7, 15], [1, 2, 9, 0]], np.int32)  # MLM positions, all real tokens


def _hf_config(**kw):
  return transformers.BertConfig(
      vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=A,
      intermediate_size=I, max_position_embeddings=40, attn_implementation="eager", **kw)


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


def _shapes(module, *args):
  """Our model's parameter tree, as shapes (jax.eval_shape: nothing computed)."""
  return jax.tree.map(lambda x: x.shape, nn.unbox(jax.eval_shape(
      lambda: module.init(jax.random.key(0, impl="rbg"), *args))["params"]))


def _reference(cls, directory, **kw):
  """A transformers PyTorch `cls` on the small config, every weight random: N(0, 0.05),
  LayerNorm scales around 1, biases too (their init is 0), so a misplaced one shows.
  Saved to `directory` by save_pretrained; returns the model, in eval mode."""
  torch.manual_seed(0)
  model = cls(_hf_config(**kw)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():  # a tied tensor comes once
      p.copy_(0.05 * torch.randn_like(p) + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
  model.save_pretrained(directory)
  return model


def _run(model, ids, mask, seg):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 token_type_ids=torch.tensor(seg, dtype=torch.long))


def _task_reference(cls, head, directory, **kw):
  """The reference task model, and its checkpoint read by bert_jax.convert as fine-tuning
  reads one: our config and the tree {"bert": encoder, head: its kernel and bias}."""
  model = _reference(cls, directory, **kw)
  config, encoder, found, _ = convert.load_for_finetuning(directory, task_heads=(head,))
  assert set(found) == {head}
  return model, config, {"bert": encoder, head: found[head]}


@pytest.fixture(scope="module")
def pretraining(config, inputs):
  positions = POSITIONS
  model = heads.BertForPreTraining(config)
  params = _random_params(model, *inputs, positions)
  return model, params, positions


def test_encoder_and_pretraining_heads_match_transformers(config, inputs, tmp_path):
  """Fails if our MLM/NSP logits at the gathered positions, or the encoder's unpadded sequence
  output and pooled output, differ from transformers' BertForPreTraining (and its BertModel)
  on the same random weights, read from its saved checkpoint."""
  reference = _reference(transformers.BertForPreTraining, tmp_path / "hf")
  loaded, params, _ = convert.load_pretrained(tmp_path / "hf", target="pretraining")
  assert loaded == config
  model = heads.BertForPreTraining(loaded)
  assert jax.tree.map(np.shape, params) == _shapes(model, *inputs, POSITIONS)
  ref = _run(reference, *inputs)
  out = model.apply({"params": params}, *inputs, POSITIONS)
  ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(), POSITIONS[..., None], axis=1)
  np.testing.assert_allclose(out["mlm_logits"], ref_mlm, atol=1e-5)
  np.testing.assert_allclose(out["nsp_logits"], ref.seq_relationship_logits.numpy(), atol=1e-5)

  assert isinstance(reference.bert, transformers.BertModel)
  ref = _run(reference.bert, *inputs)
  seq, pooled = BertModel(loaded).apply({"params": params["bert"]}, *inputs)
  real = inputs[1].astype(bool)  # padded rows' outputs are not defined by either model
  np.testing.assert_allclose(np.asarray(seq)[real], ref.last_hidden_state.numpy()[real],
                             atol=1e-5)
  np.testing.assert_allclose(pooled, ref.pooler_output.numpy(), atol=1e-5)


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
def test_sequence_classification_matches_transformers(config, inputs, num_labels, tmp_path):
  """Fails if sequence-classification logits (3 labels, or 1 for regression) differ in shape, dtype
  or value from transformers' BertForSequenceClassification, or the tree holds more than bert
  and classifier."""
  model = heads.BertForSequenceClassification(config, num_labels=num_labels)
  shapes = _shapes(model, *inputs)
  assert set(shapes) == {"bert", "classifier"}
  reference, loaded, params = _task_reference(
      transformers.BertForSequenceClassification, "classifier", tmp_path, num_labels=num_labels)
  assert loaded == config and jax.tree.map(np.shape, params) == shapes
  out = model.apply({"params": params}, *inputs)
  assert out.shape == (2, num_labels) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, _run(reference, *inputs).logits.numpy(), atol=1e-5)


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


def test_token_classification_matches_transformers(config, inputs, tmp_path):
  """Fails if token-classification logits differ in shape, dtype or (unpadded) value from
  transformers' BertForTokenClassification."""
  model = heads.BertForTokenClassification(config, num_labels=5)
  reference, loaded, params = _task_reference(
      transformers.BertForTokenClassification, "classifier", tmp_path, num_labels=5)
  assert loaded == config and params["classifier"]["kernel"].shape == (H, 5)
  out = model.apply({"params": params}, *inputs)
  assert out.shape == (2, 16, 5) and out.dtype == jnp.float32
  real = inputs[1].astype(bool)
  np.testing.assert_allclose(np.asarray(out)[real],
                             _run(reference, *inputs).logits.numpy()[real], atol=1e-5)


def test_question_answering_matches_transformers(config, inputs, tmp_path):
  """Fails if start/end logits differ in shape, dtype or (unpadded) value from transformers'
  BertForQuestionAnswering, or the tree holds more than bert and qa_outputs."""
  model = heads.BertForQuestionAnswering(config)
  assert set(_shapes(model, *inputs)) == {"bert", "qa_outputs"}
  reference, loaded, params = _task_reference(
      transformers.BertForQuestionAnswering, "qa_outputs", tmp_path)
  assert loaded == config
  start, end = model.apply({"params": params}, *inputs)
  assert start.shape == end.shape == (2, 16) and start.dtype == jnp.float32
  ref = _run(reference, *inputs)
  real = inputs[1].astype(bool)
  np.testing.assert_allclose(np.asarray(start)[real], ref.start_logits.numpy()[real], atol=1e-5)
  np.testing.assert_allclose(np.asarray(end)[real], ref.end_logits.numpy()[real], atol=1e-5)


def test_task_heads_dropout_only_in_training(config, inputs):
  """Fails if two dropout seeds give different logits in evaluation, or the same logits in
  training."""
  model = heads.BertForSequenceClassification(config.replace(attention_probs_dropout_prob=0.0))
  params = _random_params(model, *inputs)
  run = lambda det, seed: model.apply({"params": params}, *inputs, deterministic=det,
                                      rngs={"dropout": jax.random.key(seed, impl="rbg")})
  np.testing.assert_array_equal(run(True, 0), run(True, 1))
  assert np.abs(run(False, 0) - run(False, 1)).max() > 1e-4
