"""The modern encoder (architecture "modernbert") against the reference: transformers 5's
PyTorch ModernBertForMaskedLM, random weights, built in the test.

The reference is saved as Hugging Face saves it (config.json, model.safetensors), read by
bert_jax.convert, and our model must then give its last hidden states and MLM logits
within 1e-5 and, mapped back through the same layout table, the gradients of its MLM loss
within 1e-4 relative, on rows longer than the sliding window, one of them padded, with a
global and a sliding RoPE theta of their own. Export goes back bit for bit, tied or untied.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from bert_jax import convert
from bert_jax.convert import layout as convert_layout
from bert_jax.model import attention
from bert_jax.model import heads
from bert_jax.model.config import BertConfig
from bert_jax.pretrain import losses
from bert_jax.pretrain import trainer as pretrain_trainer
from experiments.configs import pretrain as pretrain_configs

ATOL = 1e-5
VOCAB, T = 97, 40  # rows of 40 tokens: longer than the 8-token window


def _hf_config(**changes) -> "transformers.ModernBertConfig":
  fields = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=2, global_attn_every_n_layers=3, local_attention=8,
                global_rope_theta=500.0, local_rope_theta=37.0, max_position_embeddings=64,
                pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                sep_token_id=2, attn_implementation="eager")
  fields.update(changes)
  return transformers.ModernBertConfig(**fields)


def _reference(tmp_path: pathlib.Path, **changes):
  """A random ModernBertForMaskedLM (norms perturbed from 1, so a misplaced one shows),
  saved to tmp_path/hf; returns (model, directory)."""
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM(_hf_config(**changes)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  directory = tmp_path / "hf"
  model.save_pretrained(directory)
  return model, directory


def _batch():
  """Three rows of T tokens: whole, and right-padded after 31 and after 7 tokens."""
  rng = np.random.default_rng(1)
  ids = rng.integers(3, VOCAB, (3, T)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 31:] = 0
  mask[2, 7:] = 0
  return ids, mask


def test_the_thetas_and_windows_are_exercised(tmp_path):
  """Fails if the test's reference does not have both layer kinds with different RoPE
  thetas, or its window is not shorter than the rows (else the parity below proves less)."""
  config = _hf_config()
  assert config.layer_types == ["full_attention", "sliding_attention", "sliding_attention",
                                "full_attention"]
  thetas = {k: v["rope_theta"] for k, v in config.rope_parameters.items()}
  assert thetas == {"full_attention": 500.0, "sliding_attention": 37.0}
  assert config.local_attention < T
  ours = convert.load_pretrained(str(_reference(tmp_path)[1]), target="pretraining")[0]
  assert (ours.architecture, ours.global_attn_every_n_layers, ours.local_attention,
          ours.rope_theta, ours.local_rope_theta) == ("modernbert", 3, 8, 500.0, 37.0)


@pytest.mark.parametrize("impl", ["einsum", "xla"])
def test_hidden_states_and_mlm_logits_equal_the_reference(tmp_path, impl):
  """Fails if our encoder's last hidden states or MLM logits differ from transformers' by
  more than 1e-5 anywhere in the rows (padded rows' real tokens included), through either
  attention implementation that runs here."""
  model, directory = _reference(tmp_path)
  config, params, *_ = convert.load_pretrained(str(directory), target="pretraining")
  config = config.replace(attention_impl=impl)
  ids, mask = _batch()
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask), output_hidden_states=True)
  ours = heads.BertForPreTraining(config, nsp_head=False).apply(
      {"params": params}, ids, mask, np.zeros_like(ids), None)
  sequence, _ = heads.encoder_for(config).apply({"params": params["bert"]}, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(sequence)[real], out.hidden_states[-1].numpy()[real],
                             atol=ATOL, rtol=0)
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[:, :, :VOCAB][real],
                             out.logits.numpy()[real], atol=ATOL, rtol=0)


def test_gradients_of_the_mlm_loss_equal_the_reference(tmp_path):
  """Fails if a parameter's gradient of the MLM loss (mean cross-entropy over 9 masked
  positions) differs from transformers' by more than 1e-4 of its largest entry."""
  model, directory = _reference(tmp_path)
  config, params, *_ = convert.load_pretrained(str(directory), target="pretraining")
  ids, mask = _batch()
  positions = np.array([[2, 9, 30], [0, 17, 25], [1, 3, 6]], np.int32)
  labels = np.random.default_rng(2).integers(3, VOCAB, positions.shape).astype(np.int32)
  weights = np.ones(positions.shape, np.float32)

  def loss_fn(p):
    out = heads.BertForPreTraining(config, nsp_head=False).apply(
        {"params": p}, ids, mask, np.zeros_like(ids), positions)
    return losses.masked_lm_loss(out["mlm_logits"], labels, weights)[0]

  grads = jax.grad(loss_fn)(params)
  model.zero_grad()
  logits = model(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(mask)).logits
  picked = logits[torch.arange(3)[:, None], torch.tensor(positions, dtype=torch.long)]
  torch.nn.functional.cross_entropy(picked.reshape(-1, VOCAB),
                                    torch.tensor(labels, dtype=torch.long).reshape(-1)).backward()
  reference = {name: p.grad.numpy() for name, p in model.named_parameters()}
  # The decoder is tied: transformers accumulates its gradient into the word table.
  ours = convert_layout.to_external(jax.tree.map(np.asarray, grads), config, "hf")
  compared = 0
  for name, value in ours.items():
    key = name if name.startswith(("head.", "decoder.")) else f"model.{name}"
    expected = reference[key]
    scale = np.abs(expected).max()
    np.testing.assert_allclose(value, expected, atol=1e-4 * scale, rtol=0, err_msg=key)
    compared += 1
  assert compared == len(reference)  # every parameter (the tied decoder is the word table)


@pytest.mark.parametrize("tied", [True, False])
def test_hf_round_trip_is_bit_identical(tmp_path, tied):
  """Fails if a Hugging Face modernbert directory read into our tree and written back
  differs in any tensor bit, in its set of tensors, or in a config field the model reads;
  an untied checkpoint keeps its decoder of its own."""
  _, directory = _reference(tmp_path, tie_word_embeddings=tied)
  config, params, *_ = convert.load_pretrained(str(directory), target="pretraining")
  assert config.tie_word_embeddings == tied
  assert ("decoder" in params["mlm_head"]) == (not tied)
  out = convert.export_hf(params, config, tmp_path / "back")
  before = safetensors.numpy.load_file(str(directory / "model.safetensors"))
  after = safetensors.numpy.load_file(str(out / "model.safetensors"))
  if tied:  # transformers may or may not write the tied copy: we never do
    before.pop("decoder.weight", None)
  assert sorted(after) == sorted(before)
  for name, value in before.items():
    assert after[name].dtype == value.dtype and after[name].tobytes() == value.tobytes(), name
  old, new = (json.loads((d / "config.json").read_text()) for d in (directory, out))
  read = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
          "intermediate_size", "hidden_activation", "norm_eps", "norm_bias", "attention_bias",
          "mlp_bias", "local_attention", "layer_types", "tie_word_embeddings",
          "classifier_pooling", "model_type")
  assert {k: new[k] for k in read} == {k: old[k] for k in read}
  assert {k: v["rope_theta"] for k, v in new["rope_parameters"].items()} == {
      k: v["rope_theta"] for k, v in old["rope_parameters"].items()}
  reloaded = transformers.ModernBertForMaskedLM.from_pretrained(out)  # transformers reads it
  assert reloaded.config.layer_types == _hf_config().layer_types


def test_every_kernel_honours_the_window():
  """Fails if xla or splash (in Pallas's interpreter here) attends outside the sliding
  window or across padding differently from the einsum path: the same outputs within
  1e-5 at a window of 32 on 256-token rows, one of them padded."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 256, 2, 16)), jnp.float32) for _ in range(3))
  real = jnp.asarray(np.arange(256)[None] < np.array([[256], [150]]))
  expected = attention.attend_masked("einsum", q, k, v, real, window=16)
  for impl in ("xla", "splash"):
    got = attention.attend_masked(impl, q, k, v, real, window=16)
    np.testing.assert_allclose(np.asarray(got)[np.asarray(real)],
                               np.asarray(expected)[np.asarray(real)], atol=1e-5, err_msg=impl)
  banded = attention.dense_mask(real, window=16)[1, 0]
  assert bool(banded[100, 116]) and not bool(banded[100, 117]) and not bool(banded[0, 200])
  assert not bool(banded[10, 160])  # padding: never a key


def test_the_sizes_and_their_published_values():
  """Fails if modernbert-base or -large lose ModernBERT's published shape, or if the modern
  options are accepted on a BERT config (where they would silently mean nothing)."""
  base, large = (BertConfig.from_size(s, vocab_size=50368)
                 for s in ("modernbert-base", "modernbert-large"))
  assert (base.num_hidden_layers, base.hidden_size, base.intermediate_size,
          base.num_attention_heads) == (22, 768, 1152, 12)
  assert (large.num_hidden_layers, large.hidden_size, large.intermediate_size,
          large.num_attention_heads) == (28, 1024, 2624, 16)
  assert [base.is_global(i) for i in range(6)] == [True, False, False, True, False, False]
  assert (base.local_attention, base.rope_theta, base.local_rope_theta) == (128, 160000.0,
                                                                            10000.0)
  assert not base.use_bias and not base.norm_bias
  with pytest.raises(ValueError, match="options of architecture 'modernbert', not of 'bert'"):
    BertConfig(use_bias=False)


@pytest.mark.parametrize("size", ["modernbert-tiny", "modernbert-base", "modernbert-large"])
def test_the_modern_variant_is_each_size_rows_recipe(size):
  """Fails if the pretrain config's modern variant, moved to another modern size, builds
  another network than the size row (its window or positions left at the tiny's), or if a
  modern size with the BERT architecture is accepted (it would mean a BERT of that shape)."""
  config = pretrain_configs.get_config("modern")
  config.model_size = size
  ours = BertConfig.from_size(size, **dict(config.model.to_dict(), vocab_size=50368))
  keep = ("vocab_size", "dtype", "vocab_multiple")  # the run's, not the architecture's
  row = BertConfig.from_size(size, vocab_size=50368).replace(
      **{k: getattr(ours, k) for k in keep})
  assert ours == row
  with pytest.raises(ValueError, match="modern encoder's but architecture is 'bert'"):
    BertConfig.from_size(size, architecture="bert")


def test_the_modern_encoder_trains_through_the_pretraining_loop(pretrain_test_config, tmp_path):
  """Fails if the pretraining loop cannot train the modern encoder with sliding windows shorter
  than its rows (packed MLM-only data, no NSP head), or its training loss does not fall."""
  model = {f"model.{k}": v for k, v in pretrain_configs.get_config("modern").model.items()
           if k not in ("max_position_embeddings", "local_attention", "dtype",
                        "vocab_multiple")}
  config = pretrain_test_config(**model, **{
      "model_size": "modernbert-tiny", "model.local_attention": 8, "data.objective": "none",
      "data.masking.ratio": 0.3, "data.masking.max_predictions_per_seq": 0, "total_steps": 30, "optimizer.learning_rate": 3e-3,
      "checkpoint.every_steps": 30})
  pretrain_trainer.train_and_evaluate(config, str(tmp_path))
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses_ = [r["loss"] for r in records if "loss" in r]
  assert len(losses_) == 30 and np.mean(losses_[-5:]) < np.mean(losses_[:5]) - 0.2, losses_
