"""Hugging Face's `modernbert` format: its config.json and its tensors' names, both ways.

transformers' ModernBertConfig <-> our BertConfig (architecture "modernbert"), refusing
in one line what our encoder does not compute (a layer pattern other than global every
n-th layer, different biases per linear kind, an activation other than GELU or SiLU, a
decoder without bias, RMSNorm: transformers' ModernBERT has only LayerNorm); and the
layout of its ModernBertModel / ModernBertForMaskedLM tensors: Wqkv [3H, H] is our
[H, 3, A, D] kernel, Wi [2I, H] our [H, 2, I] one, the decoder tied to the word table
unless tie_word_embeddings is False. layout.layout and hf.py call these for a
modernbert config; everything else of the conversion (assembly, padding, safetensors)
is shared.
"""

from typing import Any, Mapping

from bert_jax.model import encoder as model_lib

MODEL_TYPE = "modernbert"
PREFIX = "model"  # the encoder's key prefix in ModernBertForMaskedLM
ENCODER_CLASS = "ModernBertModel"
PRETRAINING_CLASS = "ModernBertForMaskedLM"
_ACTIVATIONS = {"gelu": "gelu", "silu": "silu"}  # HF hidden_activation -> glu_activation
# transformers' ModernBertConfig defaults for the special tokens (its BPE's ids): written
# unless the export is given the tokenizer's own.
TOKEN_IDS = {"pad_token_id": 50283, "bos_token_id": 50281, "eos_token_id": 50282,
             "cls_token_id": 50281, "sep_token_id": 50282}


def _period(layer_types: list[str]) -> int:
  """n such that layer i is global exactly when i % n == 0 (ValueError otherwise)."""
  for n in range(1, len(layer_types) + 1):
    if all((kind == "full_attention") == (i % n == 0) for i, kind in enumerate(layer_types)):
      return n
  raise ValueError(f"config.json layer_types {layer_types} is not 'full_attention' every "
                   "n-th layer and 'sliding_attention' between: not this encoder's pattern")


def config_from_hf(d: Mapping[str, Any]) -> "model_lib.BertConfig":
  """A BertConfig from a transformers ModernBertConfig's config.json."""
  biases = {d.get(k, False) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
  if len(biases) > 1:
    raise ValueError("config.json sets attention_bias, mlp_bias and classifier_bias "
                     "differently; this encoder has one use_bias for all its linears")
  if not d.get("decoder_bias", True):
    raise ValueError("config.json decoder_bias=false: this encoder's MLM decoder has a bias")
  activation = d.get("hidden_activation", "gelu")
  if activation not in _ACTIVATIONS:
    raise ValueError(f"config.json hidden_activation={activation!r}: expected one of "
                     f"{sorted(_ACTIVATIONS)} (GeGLU or SwiGLU)")
  layers = d["num_hidden_layers"]
  every = d.get("global_attn_every_n_layers", 3)
  layer_types = d.get("layer_types") or [
      "sliding_attention" if i % every else "full_attention" for i in range(layers)]
  rope = d.get("rope_parameters") or {}
  full = (rope.get("full_attention") or {}).get("rope_theta",
                                                d.get("global_rope_theta", 160000.0))
  local = (rope.get("sliding_attention") or {}).get("rope_theta",
                                                    d.get("local_rope_theta", 10000.0))
  return model_lib.BertConfig(
      architecture="modernbert", vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
      num_hidden_layers=layers, num_attention_heads=d["num_attention_heads"],
      intermediate_size=d["intermediate_size"],
      max_position_embeddings=d.get("max_position_embeddings", 8192),
      initializer_range=d.get("initializer_range", 0.02),
      layer_norm_eps=d.get("norm_eps", 1e-5), norm_bias=bool(d.get("norm_bias", False)),
      use_bias=biases.pop(), glu_activation=_ACTIVATIONS[activation],
      global_attn_every_n_layers=_period(layer_types),
      local_attention=d.get("local_attention", 128), rope_theta=float(full),
      local_rope_theta=float(local), type_vocab_size=1,
      hidden_dropout_prob=float(d.get("mlp_dropout", 0.0)),
      attention_probs_dropout_prob=float(d.get("attention_dropout", 0.0)),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", True)),
      classifier_pooling=d.get("classifier_pooling", "cls"),
      pad_token_id=d.get("pad_token_id"), cls_token_id=d.get("cls_token_id", d.get("bos_token_id")),
      sep_token_id=d.get("sep_token_id", d.get("eos_token_id")))


def config_to_hf(config: "model_lib.BertConfig", token_ids: Mapping[str, int] | None = None,
                 encoder_only: bool = False) -> dict:
  """The config.json of transformers' ModernBertConfig for `config` (the special tokens'
  ids from `token_ids` (a tokenizer's), else the config's, else TOKEN_IDS)."""
  if config.norm != "layernorm":
    raise ValueError(f"norm={config.norm!r}: transformers' ModernBERT has LayerNorm only; "
                     "use the 'own' format")
  layer_types = ["full_attention" if config.is_global(i) else "sliding_attention"
                 for i in range(config.num_hidden_layers)]
  d = {"architectures": [ENCODER_CLASS if encoder_only else PRETRAINING_CLASS],
       "model_type": MODEL_TYPE, "vocab_size": config.vocab_size,
       "hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers,
       "num_attention_heads": config.num_attention_heads,
       "intermediate_size": config.intermediate_size,
       "hidden_activation": config.glu_activation, "classifier_activation": "gelu",
       "max_position_embeddings": config.max_position_embeddings,
       "initializer_range": config.initializer_range, "norm_eps": config.layer_norm_eps,
       "norm_bias": config.norm_bias, "attention_bias": config.use_bias,
       "mlp_bias": config.use_bias, "classifier_bias": config.use_bias, "decoder_bias": True,
       "local_attention": config.local_attention, "layer_types": layer_types,
       "rope_parameters": {
           "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
           "sliding_attention": {"rope_type": "default", "rope_theta": config.local_rope_theta}},
       "embedding_dropout": config.hidden_dropout_prob,
       "mlp_dropout": config.hidden_dropout_prob,
       "attention_dropout": config.attention_probs_dropout_prob,
       "tie_word_embeddings": config.tie_word_embeddings,
       "classifier_pooling": config.classifier_pooling}
  known = {"pad_token_id": config.pad_token_id, "bos_token_id": config.cls_token_id,
           "cls_token_id": config.cls_token_id, "eos_token_id": config.sep_token_id,
           "sep_token_id": config.sep_token_id}
  d.update(token_ids or {k: TOKEN_IDS[k] if v is None else v for k, v in known.items()})
  return d


def entries(t, config, groups) -> None:
  """Adds every tensor of the modern encoder's pretraining tree to layout.Table `t`
  (`groups`: layout's ENCODER and MLM_HEAD names). Our own format's names are the tree's;
  the "hf" names are ModernBertForMaskedLM's without the encoder's "model." prefix."""
  encoder, mlm = groups
  h, a, d, i = (config.hidden_size, config.num_attention_heads, config.head_size,
                config.intermediate_size)
  vocab_pad = config.padded_vocab_size - config.vocab_size

  def norm(path, group, hf):
    t.add(path + ("scale",), group, (h,), hf=f"{hf}.weight", tf="")
    if config.norm_bias:
      t.add(path + ("bias",), group, (h,), hf=f"{hf}.bias", tf="")

  def linear(path, group, shape, hf, in_ndim=1):
    t.add(path + ("kernel",), group, shape, hf=f"{hf}.weight", tf="", kernel_in_ndim=in_ndim)
    if config.use_bias:
      t.add(path + ("bias",), group, shape[in_ndim:], hf=f"{hf}.bias", tf="")

  t.add(("embeddings", "word_embeddings", "embedding"), encoder, (config.padded_vocab_size, h),
        hf="embeddings.tok_embeddings.weight", tf="", table=True, pad_rows=vocab_pad)
  norm(("embeddings", "norm"), encoder, "embeddings.norm")
  for n in range(config.num_hidden_layers):
    p, hf = ("encoder", f"layer_{n}"), f"layers.{n}"
    if n:  # layer 0's attention reads the embeddings' norm
      norm(p + ("attention_norm",), encoder, f"{hf}.attn_norm")
    linear(p + ("attention", "qkv"), encoder, (h, 3, a, d), f"{hf}.attn.Wqkv")
    linear(p + ("attention", "output"), encoder, (a, d, h), f"{hf}.attn.Wo", in_ndim=2)
    norm(p + ("mlp_norm",), encoder, f"{hf}.mlp_norm")
    linear(p + ("mlp_in",), encoder, (h, 2, i), f"{hf}.mlp.Wi")
    linear(p + ("mlp_out",), encoder, (i, h), f"{hf}.mlp.Wo")
  norm(("encoder", "final_norm"), encoder, "final_norm")
  linear((mlm, "transform"), mlm, (h, h), "head.dense")
  norm((mlm, "layer_norm"), mlm, "head.norm")
  t.add((mlm, "output_bias"), mlm, (config.padded_vocab_size,), hf="decoder.bias", tf="",
        pad_rows=vocab_pad)
  if not config.tie_word_embeddings:
    t.add((mlm, "decoder"), mlm, (config.padded_vocab_size, h), hf="decoder.weight", tf="",
          table=True, pad_rows=vocab_pad)
