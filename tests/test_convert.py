"""Checkpoint conversion against the reference: transformers 5's PyTorch BERT with random
weights, built in the test.

The reference BertForPreTraining is saved as Hugging Face saves it (save_pretrained), and
its weights are also written under the original google-research/bert TF names by generic
renaming rules (below); each is imported with bert_jax.convert, and our model must then
reproduce the reference's MLM and NSP logits. Export goes back the other way and the
reference's from_pretrained must load it.
"""

import functools
import json
import logging
import pathlib
import subprocess
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from flax.traverse_util import unflatten_dict
import safetensors.numpy
import torch
import transformers

from bert_jax import convert
from bert_jax.convert import hf as convert_hf
from bert_jax.model import encoder as model_lib
from bert_jax.model import heads

ATOL = 1e-5
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- reference

@pytest.fixture(scope="module")
def reference():
  """A small transformers BertForPreTraining (PyTorch, eval mode) whose every weight is random.

  Biases and LayerNorm parameters are perturbed too (their init is 0/1), so a bias loaded
  into the wrong place cannot go unnoticed: N(0, 0.1), plus 1 for LayerNorm scales.
  state: its tensors as save_pretrained writes them (the tied MLM decoder not among them).
  """
  config = transformers.BertConfig(
      vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=37, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
      attn_implementation="eager")
  torch.manual_seed(0)
  model = transformers.BertForPreTraining(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():  # a tied tensor comes once
      p.copy_(0.1 * torch.randn_like(p) + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
  return types.SimpleNamespace(model=model, config=config, state=_torch_state(model))


def _torch_state(model) -> dict[str, np.ndarray]:
  return {name: p.detach().numpy().copy() for name, p in model.named_parameters()}


def _pytorch_state(ref) -> dict[str, np.ndarray]:
  """A fresh copy of the reference's tensors under their Hugging Face PyTorch names."""
  return {name: value.copy() for name, value in ref.state.items()}


def _random_like(shapes, rng):
  """Random float32 values for a tree of shapes (LayerNorm-like "scale" leaves around 1)."""
  flat = flatten_dict(shapes)
  values = {k: (rng.normal(0, 0.1, v.shape) + (k[-1] == "scale")).astype(np.float32)
            for k, v in flat.items()}
  return unflatten_dict(values)


@pytest.fixture(scope="module")
def batch():
  """Two sequences (the second padded), segment ids and masked-LM positions."""
  rng = np.random.default_rng(1)
  ids = rng.integers(5, 99, (2, 16)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 11:] = 0
  ids[1, 11:] = 0
  segments = np.zeros_like(ids)
  segments[:, 6:] = 1
  positions = np.array([[1, 3, 7, 14], [2, 5, 9, 0]], np.int32)
  return ids, mask, segments, positions


def _reference_logits(model, batch):
  ids, mask, segments, positions = batch
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                token_type_ids=torch.tensor(segments, dtype=torch.long))
  mlm = np.take_along_axis(out.prediction_logits.numpy(), positions[..., None], axis=1)
  return mlm, out.seq_relationship_logits.numpy()


@functools.cache
def _jitted_apply(config):
  # One compilation per config for the whole file: compiling dominates these tiny models.
  return jax.jit(heads.BertForPreTraining(config).apply)


def _our_logits(config, params, batch):
  ids, mask, segments, positions = batch
  out = _jitted_apply(config)({"params": params}, ids, mask, segments, positions)
  return np.asarray(out["mlm_logits"]), np.asarray(out["nsp_logits"])


def _assert_same_logits(config, params, ref, batch):
  mlm, nsp = _our_logits(config, params, batch)
  ref_mlm, ref_nsp = _reference_logits(ref.model, batch)
  np.testing.assert_allclose(mlm, ref_mlm, atol=ATOL, rtol=0)
  np.testing.assert_allclose(nsp, ref_nsp, atol=ATOL, rtol=0)


# Original google-research/bert names from the PyTorch ones: layer_N, LayerNorm gamma/beta,
# bare embedding tables, dense kernels stored [in, out] (PyTorch's Linear weights are
# [out, in]), cls/predictions/output_bias, cls/seq_relationship/output_weights stored [2, H].
def _tf_variables(state) -> dict[str, np.ndarray]:
  variables = {}
  for name, value in state.items():
    *parents, leaf = name.split(".")
    path = "/".join(parents).replace("layer/", "layer_")
    if name == "cls.predictions.bias":
      variables["cls/predictions/output_bias"] = value
    elif parents == ["cls", "seq_relationship"]:  # [2, H] = PyTorch's [out, in] already
      variables[f"{path}/output_{'weights' if leaf == 'weight' else 'bias'}"] = value
    elif parents[-1] == "LayerNorm":
      variables[f"{path}/{'gamma' if leaf == 'weight' else 'beta'}"] = value
    elif parents[-1].endswith("_embeddings"):
      variables[path] = value
    elif leaf == "weight":
      variables[f"{path}/kernel"] = np.ascontiguousarray(value.T)
    else:
      variables[f"{path}/bias"] = value
  return variables


def _write_vocab(path: pathlib.Path, size: int) -> pathlib.Path:
  path.write_text("".join(f"tok{i}\n" for i in range(size)))
  return path


def _write_hf_dir(path: pathlib.Path, ref, state: dict, metadata=None) -> pathlib.Path:
  """A Hugging Face directory of `state` (the reference's config), for checkpoints that
  save_pretrained would not write: other names, missing or extra tensors."""
  path.mkdir(parents=True, exist_ok=True)
  ref.config.save_pretrained(path)
  safetensors.numpy.save_file(state, str(path / "model.safetensors"),
                              metadata=metadata or {"format": "pt"})
  return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, reference):
  """The reference saved by its save_pretrained (a BertForPreTraining directory), with a
  vocab.txt."""
  path = tmp_path_factory.mktemp("hf")
  reference.model.save_pretrained(path)
  assert set(safetensors.numpy.load_file(str(path / "model.safetensors"))) == set(
      reference.state)
  _write_vocab(path / "vocab.txt", 99)
  return path


# ----------------------------------------------------------------------------- HF import / export

def test_hf_import_matches_reference_logits(hf_dir, reference, batch):
  """Fails if an imported Hugging Face directory gives other MLM/NSP logits than the reference,
  misses its vocab.txt or sizes, or its tree's shapes differ from the ones our model initialises."""
  config, params, vocab = convert.load_pretrained(hf_dir)
  assert vocab == hf_dir / "vocab.txt"
  assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (2, 32, 37)
  _assert_same_logits(config, params, reference, batch)
  # The converted tree is exactly the one our model initialises.
  ids, mask, segments, positions = batch
  shapes = jax.eval_shape(lambda: heads.BertForPreTraining(config).init(
      jax.random.PRNGKey(0), ids, mask, segments, positions))
  expected = jax.tree.map(lambda x: x.shape, nn.unbox(shapes["params"]))
  assert jax.tree.map(np.shape, params) == expected


def test_hf_export_loads_in_reference(hf_dir, reference, batch, tmp_path):
  """Fails if the HF export loses the vocab or the BertForPreTraining architecture, or transformers
  reloads it with any weight or logit differing from the reference's."""
  config, params, vocab = convert.load_pretrained(hf_dir)
  out = convert.export_hf(params, config, tmp_path / "export", vocab)
  assert (out / "vocab.txt").read_text() == vocab.read_text()
  assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
  reloaded = _reload(out)
  # Equal weights everywhere: transformers fills missing weights randomly with only a warning.
  want, got = reference.state, _torch_state(reloaded)
  assert set(got) == set(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  for got, want in zip(_reference_logits(reloaded, batch),
                       _reference_logits(reference.model, batch)):
    np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)


def _reload(directory):
  """transformers' BertForPreTraining.from_pretrained of an export: nothing missing, nothing
  unexpected, nothing of another shape."""
  model, info = transformers.BertForPreTraining.from_pretrained(
      directory, attn_implementation="eager", output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  return model.eval()


def test_padded_vocab_exports_the_true_vocab_and_imports_padded(hf_dir, reference, batch,
                                                                 tmp_path):
  """vocab_multiple pads our tables only: HF export strips the padding, imports restore it."""
  config, params, vocab = convert.load_pretrained(hf_dir, vocab_multiple=8)
  assert (config.vocab_size, config.vocab_multiple, config.padded_vocab_size) == (99, 8, 104)
  words = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  bias = params["mlm_head"]["output_bias"]
  assert words.shape == (104, 32) and bias.shape == (104,)
  assert not words[99:].any() and not bias[99:].any()
  # The reference's logits on the real ids; the padding ids never win.
  mlm, nsp = _our_logits(config, params, batch)
  ref_mlm, ref_nsp = _reference_logits(reference.model, batch)
  np.testing.assert_allclose(mlm[..., :99], ref_mlm, atol=ATOL, rtol=0)
  np.testing.assert_allclose(nsp, ref_nsp, atol=ATOL, rtol=0)
  assert (mlm[..., 99:] == np.finfo(np.float32).min).all()

  # Export: the true vocabulary in the shapes transformers expects, whatever the padding holds.
  words[99:] = 1.0
  out = convert.export_hf(params, config, tmp_path / "hf", vocab)
  assert json.loads((out / "config.json").read_text())["vocab_size"] == 99
  tensors = safetensors.numpy.load_file(str(out / "model.safetensors"))
  assert tensors["bert.embeddings.word_embeddings.weight"].shape == (99, 32)
  assert tensors["cls.predictions.bias"].shape == (99,)
  want, got = reference.state, _torch_state(_reload(out))
  assert set(got) == set(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)

  # Our own format keeps the padding (and says so); re-padding keeps the real rows.
  own = convert.export_own(params, config, tmp_path / "own", vocab)
  config2, params2, _ = convert.load_pretrained(own)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  config3, params3, _ = convert.load_pretrained(own, target="encoder", vocab_multiple=1)
  assert config3.padded_vocab_size == 99
  np.testing.assert_array_equal(params3["embeddings"]["word_embeddings"]["embedding"],
                                words[:99])


def test_hf_key_variants(tmp_path, reference, batch):
  """No "bert." prefix, gamma/beta LayerNorm names, tied decoder copies stored, float16."""
  state = {}
  for name, value in _pytorch_state(reference).items():
    name = name.removeprefix("bert.")
    if "LayerNorm" in name:
      name = name.replace(".weight", ".gamma").replace(".bias", ".beta")
    state[name] = value
  state["cls.predictions.decoder.weight"] = state["embeddings.word_embeddings.weight"]
  state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
  state["embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
  config, params, _ = convert.load_pretrained(_write_hf_dir(tmp_path / "a", reference, state))
  _assert_same_logits(config, params, reference, batch)

  half = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in state.items()}
  _, params16, _ = convert.load_pretrained(_write_hf_dir(tmp_path / "b", reference, half))
  np.testing.assert_array_equal(
      params16["mlm_head"]["transform"]["kernel"],
      state["cls.predictions.transform.dense.weight"].astype(np.float16).astype(np.float32).T)

  state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1
  with pytest.raises(ValueError, match=r"cls\.predictions\.decoder\.weight"):
    convert.load_pretrained(_write_hf_dir(tmp_path / "c", reference, state))


def test_masked_lm_layout_needs_consent_for_pooler_and_nsp(tmp_path, reference, batch):
  """BertForMaskedLM checkpoints have no pooler and no NSP head."""
  state = {k: v for k, v in _pytorch_state(reference).items()
           if not k.startswith(("bert.pooler.", "cls.seq_relationship."))}
  state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
  path = _write_hf_dir(tmp_path, reference, state)
  with pytest.raises(ValueError, match=r"bert\.pooler\.dense\.weight.*cls\.seq_relationship"):
    convert.load_pretrained(path)
  config, params, _ = convert.load_pretrained(path, allow_missing_heads=True)
  mlm, _ = _our_logits(config, params, batch)
  np.testing.assert_allclose(mlm, _reference_logits(reference.model, batch)[0], atol=ATOL,
                             rtol=0)


def test_safetensors_writer_reads_back_with_reference_library(tmp_path):
  """Fails if a file from our safetensors writer (float32, bfloat16, an empty float16 tensor) reads
  back with other values through the safetensors library, or other values, dtypes or metadata
  through our reader."""
  import ml_dtypes
  tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),
             "b": np.array([1.5, -2], ml_dtypes.bfloat16), "c": np.zeros((0, 4), np.float16)}
  convert_hf.write_safetensors(tmp_path / "x.safetensors", tensors, metadata={"format": "pt"})
  back = safetensors.numpy.load_file(str(tmp_path / "x.safetensors"))
  ours, metadata = convert_hf.read_safetensors(tmp_path / "x.safetensors")
  assert metadata == {"format": "pt"}
  for name, value in tensors.items():
    np.testing.assert_array_equal(back[name].astype(np.float32), value.astype(np.float32))
    assert ours[name].dtype == value.dtype
    np.testing.assert_array_equal(ours[name], value)


# ----------------------------------------------------------------------------- TF import

def _write_tf_checkpoint(directory, variables, config):
  """An original-layout TF1 checkpoint (model.ckpt-1000) with bert_config.json and vocab."""
  import tensorflow as tf
  graph = tf.Graph()
  with graph.as_default():
    for name, value in variables.items():
      tf.compat.v1.Variable(value, name=name)
      # Adam slots, as the original run_pretraining.py writes them beside each weight.
      tf.compat.v1.Variable(np.zeros_like(value), name=f"{name}/adam_m")
      tf.compat.v1.Variable(np.zeros_like(value), name=f"{name}/adam_v")
    tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      saver.save(session, str(directory / "model.ckpt"), global_step=1000)
  (directory / "bert_config.json").write_text(json.dumps({
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_hidden_layers,
      "num_attention_heads": config.num_attention_heads,
      "intermediate_size": config.intermediate_size, "hidden_act": "gelu",
      "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size, "initializer_range": 0.02}))
  _write_vocab(directory / "vocab.txt", config.vocab_size)


def test_tf_checkpoint_import_matches_reference(tmp_path, reference, batch):
  """Fails if a TF1 checkpoint, named by directory or by prefix, imports with other logits than the
  reference or without its vocab, or an encoder import keeps the MLM head or drops the pooler."""
  import tensorflow as tf
  _write_tf_checkpoint(tmp_path, _tf_variables(reference.state), reference.config)
  names = {n for n, _ in tf.train.list_variables(str(tmp_path / "model.ckpt-1000"))}
  assert "bert/encoder/layer_1/attention/self/query/kernel" in names  # TF1 names kept.

  for path in (tmp_path, tmp_path / "model.ckpt-1000"):  # directory or prefix
    ours, params, vocab = convert.load_pretrained(path)
    assert vocab == tmp_path / "vocab.txt"
    _assert_same_logits(ours, params, reference, batch)

  _, encoder, _ = convert.load_pretrained(tmp_path, target="encoder")
  assert "mlm_head" not in encoder and "pooler" in encoder


@pytest.mark.parametrize("script,head,names", [
    ("run_classifier", "classifier", ("output_weights", "output_bias")),
    ("run_squad", "qa_outputs", ("cls/squad/output_weights", "cls/squad/output_bias"))])
def test_tf_fine_tuned_checkpoint_task_head(tmp_path, reference, script, head, names):
  """google-research's fine-tuning scripts keep the head as [labels, H] (transpose_b):
  it must arrive as our [H, labels] kernel; without asking for it, it is refused by name."""
  del script
  variables = {k: v for k, v in _tf_variables(reference.state).items()
               if not k.startswith("cls/")}  # run_classifier / run_squad drop the MLM/NSP
  weights = np.random.default_rng(1).normal(size=(3, 32)).astype(np.float32)
  variables.update({names[0]: weights, names[1]: np.arange(3, dtype=np.float32)})
  _write_tf_checkpoint(tmp_path, variables, reference.config)

  _, encoder, heads, _ = convert.load_for_finetuning(tmp_path, task_heads=(head,))
  np.testing.assert_array_equal(heads[head]["kernel"], weights.T)
  np.testing.assert_array_equal(heads[head]["bias"], [0, 1, 2])
  np.testing.assert_array_equal(encoder["embeddings"]["word_embeddings"]["embedding"],
                                variables["bert/embeddings/word_embeddings"])
  with pytest.raises(ValueError, match=f"unused tensors.*{names[0]}"):
    convert.load_pretrained(tmp_path, target="encoder")


# ----------------------------------------------------------------------------- bad input

def test_missing_unused_and_misshapen_tensors_are_named(tmp_path, reference):
  """Fails if the refusal does not name the missing tensor, the unused tensor and the misshapen
  tensor with its shape and the expected one."""
  state = _pytorch_state(reference)
  del state["cls.predictions.transform.LayerNorm.bias"]
  state["bert.encoder.layer.2.output.dense.weight"] = np.zeros((32, 37), np.float32)
  state["bert.encoder.layer.1.intermediate.dense.weight"] = np.zeros((37, 33), np.float32)
  with pytest.raises(ValueError) as error:
    convert.load_pretrained(_write_hf_dir(tmp_path, reference, state))
  message = str(error.value)
  assert "missing tensors (1" in message
  assert "cls.predictions.transform.LayerNorm.bias" in message
  assert "unused tensors (1)" in message
  assert "bert.encoder.layer.2.output.dense.weight" in message
  assert "bert.encoder.layer.1.intermediate.dense.weight: has shape (37, 33), expected (37, 32)" \
      in message


@pytest.mark.parametrize("corruption", ["header_too_long", "not_json", "short_data"])
def test_corrupt_safetensors_is_refused(tmp_path, hf_dir, corruption):
  """Fails if a safetensors file with an oversized header length, a header that is not JSON, or
  truncated data loads instead of raising "corrupt safetensors file" with its path."""
  raw = (hf_dir / "model.safetensors").read_bytes()
  header_len = int.from_bytes(raw[:8], "little")
  if corruption == "header_too_long":
    raw = (len(raw) * 2).to_bytes(8, "little") + raw[8:]
  elif corruption == "not_json":
    raw = raw[:8] + b"{" * header_len + raw[8 + header_len:]
  else:
    raw = raw[:-100]
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "config.json").write_bytes((hf_dir / "config.json").read_bytes())
  (bad / "model.safetensors").write_bytes(raw)
  with pytest.raises(ValueError, match=r"corrupt safetensors file .*model\.safetensors"):
    convert.load_pretrained(bad)


def test_unknown_path_is_refused(tmp_path):
  """Fails if an empty directory is not refused as "not a checkpoint", or a directory holding only
  pytorch_model.bin is not refused naming model.safetensors and pytorch_model.bin."""
  with pytest.raises(ValueError, match="not a checkpoint"):
    convert.load_pretrained(tmp_path)
  (tmp_path / "config.json").write_text("{}")
  (tmp_path / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(ValueError, match=r"no single-file model\.safetensors.*pytorch_model\.bin"):
    convert.load_pretrained(tmp_path)


def test_broken_config_is_named(tmp_path, hf_dir):
  """Fails if a config.json that is not JSON, or one whose num_attention_heads does not divide the
  hidden size, loads instead of raising an error naming it."""
  (tmp_path / "model.safetensors").write_bytes((hf_dir / "model.safetensors").read_bytes())
  (tmp_path / "config.json").write_text('{"hidden_size": 32,')
  with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
    convert.load_pretrained(tmp_path)
  config = json.loads((hf_dir / "config.json").read_text())
  config["num_attention_heads"] = 5
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="num_attention_heads"):
    convert.load_pretrained(tmp_path)


# ----------------------------------------------------------------------------- own format

def test_own_format_round_trip(hf_dir, reference, batch, tmp_path, caplog):
  """Fails if the own-format export does not reload to the same config, vocab, weights and logits, a
  scanned tree does not reload per layer (warning of no vocab.txt), an encoder import keeps the
  heads, or a tree missing a weight is written instead of refused by name."""
  config, params, vocab = convert.load_pretrained(hf_dir)
  out = convert.export_own(params, config, tmp_path / "own", vocab)
  assert (out / "vocab.txt").read_text() == vocab.read_text()
  config2, params2, vocab2 = convert.load_pretrained(out)
  assert config2 == config and vocab2 == out / "vocab.txt"
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  _assert_same_logits(config2, params2, reference, batch)

  # A scanned (stacked) tree is stored in the canonical per-layer layout.
  stacked = model_lib.stack_layers(params, config.num_hidden_layers)
  convert.export_own(stacked, config.replace(scan_layers=True), tmp_path / "scanned", None)
  with caplog.at_level(logging.WARNING):
    config3, params3, vocab3 = convert.load_pretrained(tmp_path / "scanned")
  assert vocab3 is None and config3 == config  # scan_layers=False: matches the params.
  assert "no vocab.txt" in caplog.text
  jax.tree.map(np.testing.assert_array_equal, params3, params)

  # An encoder-only import of the pretraining export drops the heads.
  _, encoder, _ = convert.load_pretrained(out, target="encoder")
  jax.tree.map(np.testing.assert_array_equal, encoder, params["bert"])

  # A tree that does not match the config is refused by name before anything is written.
  broken = jax.tree.map(lambda x: x, params)
  del broken["bert"]["encoder"]["layer_1"]["output"]["bias"]
  with pytest.raises(ValueError, match="encoder/layer_1/output/bias"):
    convert.export_own(broken, config, tmp_path / "broken", None)
  assert not (tmp_path / "broken").exists()


def test_albert_switches_round_trip_own_format_only(tmp_path):
  """Fails if an ALBERT-style config (embedding_size, share_layers) does not round-trip through the
  own format, or exports to HF instead of refusing by embedding_size."""
  config = model_lib.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3,
                                num_attention_heads=4, intermediate_size=64,
                                embedding_size=16, share_layers=True)
  ids = jnp.ones((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: heads.BertForPreTraining(config).init(
      jax.random.PRNGKey(0), ids, ids, ids, ids[:, :2]))["params"]
  params = _random_like(nn.unbox(shapes), np.random.default_rng(0))
  convert.export_own(params, config, tmp_path / "albert", None)
  config2, params2, _ = convert.load_pretrained(tmp_path / "albert")
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)
  with pytest.raises(ValueError, match="embedding_size"):
    convert.export_hf(params2, config, tmp_path / "hf", None)


def test_training_workdir_imports_through_checkpoint_module(hf_dir, tmp_path, reference, batch):
  """A workdir written by bert_jax.run.checkpoint (scanned layers, as a TPU run saves them)."""
  import ml_collections
  from bert_jax.run import checkpoint
  from bert_jax.run import workdir
  config, params, vocab = convert.load_pretrained(hf_dir)
  scanned = config.replace(scan_layers=True)
  manager = checkpoint.make_manager(str(tmp_path), types.SimpleNamespace(
      keep=1, keep_period=0, async_save=False))
  state = {"params": model_lib.stack_layers(params, config.num_hidden_layers),
           "opt_state": {"count": np.zeros((), np.int32)}, "step": np.asarray(7)}
  checkpoint.save(manager, 7, state, {"position": 0})
  manager.wait_until_finished()
  workdir.write_run_files(str(tmp_path), ml_collections.ConfigDict(), scanned,
                          vocab_file=str(vocab))

  for path in (tmp_path, tmp_path / "checkpoints", tmp_path / "checkpoints" / "7"):
    config2, params2, vocab2 = convert.load_pretrained(path)
    assert config2 == config and vocab2 == tmp_path / "vocab.txt"
    jax.tree.map(np.testing.assert_array_equal, params2, params)
  _assert_same_logits(config2, params2, reference, batch)


# ----------------------------------------------------------------------------- command line

def test_cli_converts_hf_to_own(hf_dir, tmp_path, reference, batch):
  """Fails if `python -m bert_jax.convert` HF-to-own does not exit 0 with its summary, the given
  vocab and the reference's logits, or a missing input does not exit 1 naming the path without a
  traceback."""
  vocab = _write_vocab(tmp_path / "other_vocab.txt", 99)
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.convert", f"--input={hf_dir}",
       f"--output={tmp_path / 'out'}", "--format=own", f"--vocab_file={vocab}"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 0, result.stderr
  assert "converted Hugging Face directory" in result.stdout
  assert "pretraining (L=2, H=32, A=4, V=99)" in result.stdout
  config, params, vocab_out = convert.load_pretrained(tmp_path / "out")
  assert vocab_out.read_text() == vocab.read_text()
  _assert_same_logits(config, params, reference, batch)

  # Bad input: the error names the problem, exit status 1, no traceback.
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.convert", f"--input={tmp_path / 'missing'}",
       f"--output={tmp_path / 'out2'}", "--format=hf"],
      cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert result.returncode == 1
  assert f"error: checkpoint path {tmp_path / 'missing'} does not exist" in result.stderr
  assert "Traceback" not in result.stderr
