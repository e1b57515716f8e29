"""RoBERTa and the pre-LN encoder against the reference: transformers 5's PyTorch
RobertaForMaskedLM and RobertaPreLayerNormForMaskedLM with random weights, built in the test.

The reference is saved as Hugging Face saves it (save_pretrained), comes in through
bert_jax.convert, and our model must then give the reference's MLM logits and, mapped
back through the same layout table, its gradients, on a batch with padding and segment
ids the single token type must ignore. Export goes back the other way, bit for bit, and
transformers' from_pretrained loads it. The encoder options (scanned, shared, remat,
pooled_only, attention kernels) are held to the per-layer pre-LN computation.
"""

import functools
import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from bert_jax import convert
from bert_jax.convert import layout as convert_layout
from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from bert_jax.model.config import BertConfig

ATOL = 1e-5
PAD = 1  # RoBERTa's padding id; positions start at PAD + 1
FAMILIES = {
    "roberta": (transformers.RobertaConfig, transformers.RobertaForMaskedLM,
                transformers.RobertaModel, "roberta"),
    "roberta-prelayernorm": (transformers.RobertaPreLayerNormConfig,
                             transformers.RobertaPreLayerNormForMaskedLM,
                             transformers.RobertaPreLayerNormModel, "roberta_prelayernorm"),
}


# ----------------------------------------------------------------------------- reference

@functools.cache
def _reference(family: str):
  """The family's masked-LM model, every weight random: N(0, 0.1), LayerNorm scales around
  1, biases too (their init is 0), so a misplaced bias shows. In eval mode, float32."""
  config_cls, mlm_cls, _, _ = FAMILIES[family]
  config = config_cls(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=20, type_vocab_size=1,
                      hidden_act="gelu", pad_token_id=PAD, layer_norm_eps=1e-5,
                      attn_implementation="eager")
  torch.manual_seed(0)
  model = mlm_cls(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():  # the tied decoder is the word table: once
      scale = name.endswith(("LayerNorm.weight", "layer_norm.weight"))
      p.copy_(0.1 * torch.randn_like(p) + (1.0 if scale else 0.0))
  return model


def _state(model) -> dict[str, np.ndarray]:
  """The reference's tensors as save_pretrained writes them (a tied one once)."""
  return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def _batch():
  """Two rows, the second right-padded with PAD; segment ids that a single type ignores."""
  rng = np.random.default_rng(1)
  ids = rng.integers(3, 99, (2, 16)).astype(np.int32)
  ids[:, 0] = 0  # <s>
  ids[1, 11:] = PAD
  mask = (ids != PAD).astype(np.int32)
  segments = np.zeros_like(ids)
  segments[:, 6:] = 1
  return ids, mask, segments


def _write_hf_dir(path: pathlib.Path, model, state) -> pathlib.Path:
  path.mkdir(parents=True, exist_ok=True)
  model.config.save_pretrained(path)
  safetensors.numpy.save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
  return path


@functools.cache
def _hf_dir(family: str, root: str) -> pathlib.Path:
  path = pathlib.Path(root) / family
  _reference(family).save_pretrained(path)
  return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("roberta"))


def _reference_logits(model, batch) -> torch.Tensor:
  """The reference's MLM logits (no segment ids: its single token type)."""
  ids, mask, _ = batch
  return model(input_ids=torch.tensor(ids, dtype=torch.long),
               attention_mask=torch.tensor(mask, dtype=torch.long)).logits


@functools.cache
def _apply(config: BertConfig):
  return jax.jit(heads.BertForPreTraining(config, nsp_head=False).apply)


def _our_logits(config, params, batch):
  ids, mask, segments = batch
  return _apply(config)({"params": params}, ids, mask, segments, None)["mlm_logits"]


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_gradients_equal_the_reference(family, root):
  """Our imported model gives the reference's logits at every position and its gradients.

  Fails if the pre-LN blocks, the final LayerNorm, the positions counted from PAD + 1 or
  the single token type differ from transformers' (a post-LN or BERT-positioned encoder
  misses by far more than 1e-5), or if the layout table maps a tensor to the wrong place.
  """
  ref = _reference(family)
  prefix = FAMILIES[family][3]
  config, params, _ = convert.load_pretrained(_hf_dir(family, root), allow_missing_heads=True)
  assert (config.pre_layer_norm, config.position_offset, config.type_vocab_size) == (
      family == "roberta-prelayernorm", PAD + 1, 1)
  assert "nsp_head" not in params  # the roberta families have none; pooler freshly made
  batch = _batch()
  with torch.no_grad():
    np.testing.assert_allclose(_our_logits(config, params, batch),
                               _reference_logits(ref, batch).numpy(), atol=ATOL, rtol=0)

  # Per-token weights of a mean, as a loss has: gradients of order 1, not of the sum of 3k.
  # A loss weighs real tokens only: PyTorch's embeddings (padding_idx=PAD) give their PAD
  # rows no gradient from a lookup, so padded positions in the loss would move our PAD
  # rows and not the reference's.
  weights = (np.random.default_rng(2).normal(size=(2, 16, 99)) / 32).astype(np.float32)
  weights *= batch[1][..., None]
  ref.zero_grad(set_to_none=True)
  (_reference_logits(ref, batch) * torch.tensor(weights)).sum().backward()
  want = {name.removeprefix(f"{prefix}."): p.grad.numpy()
          for name, p in ref.named_parameters()}
  ours = jax.grad(lambda p: jnp.sum(_our_logits(config, p, batch) * weights))(params)
  got = convert_layout.to_external(ours, config, "hf", source="gradients")
  # The reference's masked-LM model has no pooler; ours (fresh) gets no gradient either.
  assert not any(np.any(got.pop(f"pooler.dense.{n}")) for n in ("weight", "bias"))
  assert set(got) == set(want)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=0, err_msg=name)


def test_post_ln_reading_of_a_pre_ln_checkpoint_misses(root):
  """The same weights in post-LN blocks miss the reference by far: the parity above needs
  the pre-LN order (fails if pre_layer_norm changed nothing)."""
  ref = _reference("roberta-prelayernorm")
  config, params, _ = convert.load_pretrained(_hf_dir("roberta-prelayernorm", root),
                                              allow_missing_heads=True)
  encoder = params["bert"]["encoder"]
  del encoder["final_layer_norm"]
  for i in range(config.num_hidden_layers):  # each LayerNorm in post-LN's place of it
    encoder[f"layer_{i}"]["output_layer_norm"] = encoder[f"layer_{i}"].pop(
        "intermediate_layer_norm")
  batch = _batch()
  with torch.no_grad():
    want = _reference_logits(ref, batch).numpy()
  gap = np.abs(np.asarray(_our_logits(config.replace(pre_layer_norm=False), params, batch))
               - want).max()
  assert gap > 1000 * ATOL


def test_positions_count_real_tokens_from_the_padding_index():
  """Real tokens take positions PAD+1, PAD+2, ...; padding takes PAD (fairseq's make_positions),
  BERT's are 0..T-1. Fails if positions ignored the offset or the padding."""
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int32)
  roberta = BertConfig(max_position_embeddings=12, position_offset=PAD + 1)
  np.testing.assert_array_equal(model_lib.position_ids(roberta, mask),
                                [[2, 3, 4, 5], [2, 3, 1, 1]])
  np.testing.assert_array_equal(model_lib.position_ids(BertConfig(), mask),
                                [[0, 1, 2, 3], [0, 1, 2, 3]])
  config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=8, max_position_embeddings=12, position_offset=2,
                      type_vocab_size=1)
  long = np.ones((1, 11), np.int32)  # 11 tokens from position 2 need 13 rows
  with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
    model_lib.BertModel(config).init(jax.random.key(0), long, long, long)


# ----------------------------------------------------------------------------- encoder options

_TINY = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                   intermediate_size=48, max_position_embeddings=24, position_offset=2,
                   type_vocab_size=1, pre_layer_norm=True, hidden_dropout_prob=0.0,
                   attention_probs_dropout_prob=0.0)


def _encoder_outputs(config, params, batch, pooled_only=False):
  ids, mask, segments = batch
  return model_lib.BertModel(config).apply({"params": params}, ids, mask, segments,
                                           pooled_only=pooled_only)


@pytest.mark.parametrize("option", [pytest.param("scan_layers", marks=pytest.mark.slow),
                                    "remat_full", "einsum", "pooled_only"])
def test_pre_ln_options_compute_what_the_per_layer_loop_does(option):
  """Each encoder option computes the per-layer pre-LN encoder's outputs and gradients.

  Fails if the final LayerNorm were skipped or doubled under scan, remat changed the
  numbers, an attention kernel saw other inputs, or the one-row last layer of
  pooled_only normalised another row than the full computation's.
  """
  ids = np.random.default_rng(3).integers(3, 50, (2, 10)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  batch = (ids, mask, np.zeros_like(ids))
  params = nn.unbox(model_lib.BertModel(_TINY).init(jax.random.key(1), *batch)["params"])
  config, their_params, pooled_only = _TINY, params, False
  if option == "scan_layers":
    config = _TINY.replace(scan_layers=True)
    their_params = model_lib.stack_layers(params, _TINY.num_hidden_layers)
  elif option == "remat_full":
    config = _TINY.replace(remat_policy="full")
  elif option == "einsum":
    config = _TINY.replace(attention_impl="einsum")
  else:
    pooled_only = True
  loss = lambda cfg, p, only: jnp.sum(_encoder_outputs(cfg, p, batch, only)[1] ** 2)
  np.testing.assert_allclose(_encoder_outputs(config, their_params, batch, pooled_only)[1],
                             _encoder_outputs(_TINY, params, batch)[1], atol=1e-6, rtol=0)
  got = jax.grad(lambda p: loss(config, p, pooled_only))(their_params)
  if option == "scan_layers":
    got = model_lib.unstack_layers(got)
  want = jax.grad(lambda p: loss(_TINY, p, False))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), got, want)
  assert "final_layer_norm" in params["encoder"]


def test_shared_pre_ln_layers_scan_and_loop_agree():
  """ALBERT sharing on a pre-LN encoder: one layer, scanned or looped, the same outputs."""
  ids = np.random.default_rng(4).integers(3, 50, (2, 8)).astype(np.int32)
  batch = (ids, np.ones_like(ids), np.zeros_like(ids))
  shared = _TINY.replace(share_layers=True)
  params = nn.unbox(model_lib.BertModel(shared).init(jax.random.key(2), *batch)["params"])
  assert set(params["encoder"]) == {"layer", "final_layer_norm"}
  np.testing.assert_allclose(_encoder_outputs(shared.replace(scan_layers=True), params, batch)[0],
                             _encoder_outputs(shared, params, batch)[0], atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- conversion

@pytest.mark.parametrize("family", list(FAMILIES))
def test_hf_round_trip_is_bit_identical_and_loads_in_the_reference(family, root, tmp_path):
  """export -> import -> export writes the same bytes; transformers loads the export with
  the very weights it started from and computes the same logits (our pooler rides along,
  unused by its masked-LM class; without one the export is that class's layout exactly).
  Fails if a name, a transpose or the config drifts."""
  ref = _reference(family)
  config, params, _ = convert.load_pretrained(_hf_dir(family, root), target="pretraining",
                                              allow_missing_heads=True)
  first = convert.export_hf(params, config, tmp_path / "first", None)
  hf_config = json.loads((first / "config.json").read_text())
  assert (hf_config["model_type"], hf_config["pad_token_id"], hf_config["architectures"]) == (
      family, PAD, [{"roberta": "RobertaForMaskedLM",
                     "roberta-prelayernorm": "RobertaPreLayerNormForMaskedLM"}[family]])
  config2, params2, _ = convert.load_pretrained(first)
  assert config2 == config
  second = convert.export_hf(params2, config2, tmp_path / "second", None)
  for name in ("config.json", "model.safetensors"):
    assert (first / name).read_bytes() == (second / name).read_bytes(), name

  del params["bert"]["pooler"]
  exact = convert.export_hf(params, config, tmp_path / "exact", None)
  names = set(safetensors.numpy.load_file(str(exact / "model.safetensors")))
  assert names == set(_state(ref))  # RobertaForMaskedLM's own tensors, no more
  batch = _batch()
  with torch.no_grad():
    want_logits = _reference_logits(ref, batch).numpy()
  for out in (first, exact):
    reloaded, info = FAMILIES[family][1].from_pretrained(
        out, attn_implementation="eager", output_loading_info=True)
    # transformers fills a missing weight randomly with only a warning.
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    want, got = _state(ref), _state(reloaded.eval())
    assert set(got) == set(want)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    with torch.no_grad():
      np.testing.assert_array_equal(_reference_logits(reloaded, batch).numpy(), want_logits)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_encoder_export_is_the_family_model(family, root, tmp_path):
  """An encoder tree exports as RobertaModel / RobertaPreLayerNormModel, which loads it and
  computes our sequence output. Fails if the final LayerNorm or pooler went astray."""
  config, params, _ = convert.load_pretrained(_hf_dir(family, root), target="encoder",
                                              allow_missing_heads=True)
  out = convert.export_hf(params, config, tmp_path / "encoder", None)
  model, info = FAMILIES[family][2].from_pretrained(
      out, attn_implementation="eager", output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert json.loads((out / "config.json").read_text())["architectures"] == [
      type(model).__name__]
  ids, mask, segments = _batch()
  sequence, pooled = _encoder_outputs(config, params, (ids, mask, segments))
  with torch.no_grad():
    theirs = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long))
  np.testing.assert_allclose(sequence, theirs.last_hidden_state.numpy(), atol=ATOL, rtol=0)
  np.testing.assert_allclose(pooled, theirs.pooler_output.numpy(), atol=ATOL, rtol=0)


def test_wrong_shapes_and_formats_are_refused(root, tmp_path):
  """A RoBERTa tensor of the wrong shape is named as BERT's are; a pre-LN tree has no TF
  format; BERT positions under pre-LN have no HF family; an NSP head has no RoBERTa name."""
  ref = _reference("roberta-prelayernorm")
  state = _state(ref)
  state["roberta_prelayernorm.encoder.layer.1.intermediate.LayerNorm.weight"] = np.ones(
      33, np.float32)
  with pytest.raises(ValueError, match=r"roberta_prelayernorm\.encoder\.layer\.1\.intermediate"
                     r"\.LayerNorm\.weight: has shape \(33,\), expected \(32,\)"):
    convert.load_pretrained(_write_hf_dir(tmp_path / "bad", ref, state))
  config, params, _ = convert.load_pretrained(_hf_dir("roberta-prelayernorm", root),
                                              allow_missing_heads=True)
  with pytest.raises(ValueError, match="'tf' layout is google-research/bert's post-LN"):
    convert_layout.layout(config, "tf")
  with pytest.raises(ValueError, match="pre_layer_norm=True with position_offset=0"):
    convert.export_hf(params, config.replace(position_offset=0), tmp_path / "x", None)
  params["nsp_head"] = {"kernel": np.zeros((32, 2), np.float32), "bias": np.zeros(2, np.float32)}
  with pytest.raises(ValueError, match="has an NSP head"):
    convert.export_hf(params, config, tmp_path / "y", None)


def test_own_format_keeps_the_pre_ln_switches(root, tmp_path):
  """Our own export stores pre_layer_norm and position_offset and gives the same logits."""
  config, params, _ = convert.load_pretrained(_hf_dir("roberta-prelayernorm", root),
                                              allow_missing_heads=True)
  out = convert.export_own(params, config, tmp_path / "own", None)
  config2, params2, _ = convert.load_pretrained(out)
  assert config2 == config and config2.pre_layer_norm and config2.position_offset == 2
  np.testing.assert_array_equal(_our_logits(config2, params2, _batch()),
                                _our_logits(config, params, _batch()))
