"""The network's hyper-parameters: BertConfig, the size table, the remat policies.

BertConfig is every field a BERT-family encoder here is built from (BERT,
ALBERT's and RoBERTa's switches, the scaling switches), validated on creation,
with the readers and writers of the Hugging Face and google-research config
files. bert_jax/model/encoder.py builds the network from it; checkpoints and
workdir records store it field by field (a field added later must default to
what the code did before it, bert_jax/run/workdir.py compares missing fields so).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import attention as attention_lib

# (num_hidden_layers, hidden_size, num_attention_heads); intermediate size is 4H.
SIZES = {
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
# The modern encoder's sizes (architecture "modernbert", bert_jax/model/modern.py): every
# field that differs from BERT's defaults. Base and large are ModernBERT's published
# configs (Warner et al. 2024: 22 x 768, GLU 1152, 12 heads; 28 x 1024, GLU 2624, 16
# heads; global attention every third layer, a 128-token window elsewhere, RoPE theta
# 160k global / 10k local, no biases but the decoder's, LayerNorm eps 1e-5, no dropout in
# pretraining); the tiny one is the same recipe small enough for CPU runs and tests.
_MODERN = dict(architecture="modernbert", use_bias=False, norm_bias=False,
               layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, global_attn_every_n_layers=3,
               rope_theta=160000.0, local_rope_theta=10000.0, type_vocab_size=1)
MODERN_SIZES = {
    "modernbert-tiny": dict(_MODERN, num_hidden_layers=4, hidden_size=128,
                            num_attention_heads=2, intermediate_size=192, local_attention=64,
                            max_position_embeddings=1024),
    "modernbert-base": dict(_MODERN, num_hidden_layers=22, hidden_size=768,
                            num_attention_heads=12, intermediate_size=1152, local_attention=128,
                            max_position_embeddings=8192),
    "modernbert-large": dict(_MODERN, num_hidden_layers=28, hidden_size=1024,
                             num_attention_heads=16, intermediate_size=2624, local_attention=128,
                             max_position_embeddings=8192),
}
ARCHITECTURES = ("bert", "modernbert")
GLU_ACTIVATIONS = ("gelu", "silu")  # GeGLU, SwiGLU
NORMS = ("layernorm", "rmsnorm")
POOLINGS = ("cls", "mean")

_DTYPES = ("float32", "bfloat16", "float16")
_ATTENTION_IMPLS = attention_lib.IMPLEMENTATIONS + (None,)  # None: older configs, read as auto

# Names the layers give their activations (jax.ad_checkpoint.checkpoint_name), for the
# remat policy that keeps exactly these: the q/k/v projections and the attention output
# projection, so the backward pass recomputes the attention core, LayerNorms and FFN.
PROJECTION_NAMES = ("query_proj", "key_proj", "value_proj", "attention_out")
# What each layer keeps for the backward pass (jax.checkpoint_policies), by name.
REMAT_POLICIES = {
    "none": None,  # no rematerialisation: every residual kept (fastest, most memory)
    "full": jax.checkpoint_policies.nothing_saveable,  # keep only the layer input
    "dots_saveable": jax.checkpoint_policies.dots_saveable,  # every matmul output
    # Matmuls without batch dimensions: the dense projections, not QK^T / PV.
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_qkv_out_proj": jax.checkpoint_policies.save_only_these_names(*PROJECTION_NAMES),
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hyper-parameters of a BERT-family encoder; defaults are BERT-Base (paper values)."""

  vocab_size: int = 30522  # true vocabulary (bert-base-uncased WordPiece), as HF/TF configs hold it
  vocab_multiple: int = 1  # word table and MLM logits padded to a multiple of this (e.g. 128)
  hidden_size: int = 768  # H
  num_hidden_layers: int = 12  # L
  num_attention_heads: int = 12  # A; head size is H / A
  intermediate_size: int = 3072  # feed-forward width, 4H in the paper
  hidden_dropout_prob: float = 0.1  # dropout on embeddings and every residual branch
  attention_probs_dropout_prob: float = 0.1  # dropout on attention probabilities
  # Which attention-dropout mask (einsum path in training only; the fused kernels drop
  # nothing): False draws one per example, head, query and key, as google-research/bert
  # (the paper's); True one [T, T] mask shared by every example and head, as transformers'
  # Flax BERT (flax's broadcast_dropout), fewer random bits for the same rate.
  attention_dropout_shared: bool = False
  max_position_embeddings: int = 512  # rows of the learned position table
  # Position id of the first token. 0 is BERT's (positions 0..T-1 whatever the padding);
  # RoBERTa's is pad_token_id + 1 = 2 (fairseq's make_positions): real tokens count up
  # from it, padding takes position_offset - 1, and the table has T + 2 rows (514).
  position_offset: int = 0
  type_vocab_size: int = 2  # segment A / segment B; 1 (RoBERTa): segment ids are not read
  initializer_range: float = 0.02  # stddev of the truncated-normal initialiser
  layer_norm_eps: float = 1e-12  # as google-research/bert
  embedding_size: int | None = None  # ALBERT factorised embedding E; None -> hidden_size
  share_layers: bool = False  # ALBERT cross-layer sharing: one layer applied L times
  # Pre-LN blocks, x + Attn(LN(x)) then h + FFN(LN(h)), and one LayerNorm after the last
  # layer (fairseq's --encoder-normalize-before, HF's RobertaPreLayerNorm); False: BERT's
  # post-LN. The embeddings keep their LayerNorm either way, as both references do.
  pre_layer_norm: bool = False
  dtype: str = "float32"  # compute dtype; params are always float32
  attention_impl: str | None = "auto"  # bert_jax/model/attention.py: auto|einsum|xla|cudnn|splash
  remat_policy: str = "none"  # a key of REMAT_POLICIES: what each layer keeps for backward
  remat: bool = False  # older configs' switch: True reads as remat_policy "full"
  scan_layers: bool = False  # nn.scan over layers: params get a leading [L] axis
  # --- The modern encoder (ModernBERT and those after it; bert_jax/model/modern.py). Each
  # default is BERT's behaviour, so every config and checkpoint from before reads the same.
  architecture: str = "bert"  # "bert" (encoder.py) | "modernbert" (modern.py)
  # modernbert: rotary positions (no position table), theta per layer kind.
  rope_theta: float = 160000.0  # RoPE base of the global-attention layers
  local_rope_theta: float = 10000.0  # RoPE base of the sliding-window layers
  # modernbert: layer i attends globally when i % n == 0, else within a sliding window of
  # local_attention tokens (a token sees the keys at |i - j| <= local_attention // 2).
  global_attn_every_n_layers: int = 1
  local_attention: int = 128
  glu_activation: str = "gelu"  # modernbert's feed-forward: GeGLU ("gelu") or SwiGLU ("silu")
  use_bias: bool = True  # modernbert: biases in the linear layers (attention, MLP, heads)
  norm_bias: bool = True  # modernbert: biases in the norms
  norm: str = "layernorm"  # modernbert: "layernorm" or "rmsnorm"
  # modernbert: the MLM decoder is the word table (True) or a matrix of its own.
  tie_word_embeddings: bool = True
  classifier_pooling: str = "cls"  # modernbert's classification head reads [CLS] or the mean
  # The special tokens' ids a Hugging Face modernbert config.json names (read on import,
  # written back on export; the network never reads them). None: not known.
  pad_token_id: int | None = None
  cls_token_id: int | None = None
  sep_token_id: int | None = None

  def __post_init__(self):
    positive = ("vocab_size", "vocab_multiple", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "max_position_embeddings",
                "type_vocab_size")
    for name in positive:
      _check_positive_int(name, getattr(self, name))
    offset = self.position_offset
    if (isinstance(offset, bool) or not isinstance(offset, (int, np.integer))
        or not 0 <= offset < self.max_position_embeddings):
      raise ValueError(f"position_offset must be an integer in [0, max_position_embeddings="
                       f"{self.max_position_embeddings}), got {offset!r}")
    if self.embedding_size is not None:
      _check_positive_int("embedding_size", self.embedding_size)
      if self.embedding_size > self.hidden_size:
        raise ValueError(
            f"embedding_size ({self.embedding_size}) must not exceed hidden_size "
            f"({self.hidden_size}): the factorisation is meant to shrink the embedding")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f"hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
          f"({self.num_attention_heads})")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")
    for name in ("initializer_range", "layer_norm_eps"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    for name in ("share_layers", "remat", "scan_layers", "attention_dropout_shared",
                 "pre_layer_norm"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
    if self.dtype not in _DTYPES:
      raise ValueError(f"dtype must be one of {_DTYPES}, got {self.dtype!r}")
    if self.attention_impl not in _ATTENTION_IMPLS:
      raise ValueError(
          f"attention_impl must be one of {_ATTENTION_IMPLS}, got {self.attention_impl!r}")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(
          f"remat_policy must be one of {tuple(REMAT_POLICIES)}, got {self.remat_policy!r}")
    if self.remat and self.remat_policy not in ("none", "full"):
      raise ValueError(f"remat=True (read as remat_policy 'full') contradicts "
                       f"remat_policy={self.remat_policy!r}: set remat_policy alone")
    self._check_modern()

  def _check_modern(self) -> None:
    """The modern encoder's fields (architecture, RoPE, windows, GLU, biases, norms)."""
    for name, allowed in (("architecture", ARCHITECTURES), ("glu_activation", GLU_ACTIVATIONS),
                          ("norm", NORMS), ("classifier_pooling", POOLINGS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
    for name in ("use_bias", "norm_bias", "tie_word_embeddings"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
    for name in ("rope_theta", "local_rope_theta"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    _check_positive_int("global_attn_every_n_layers", self.global_attn_every_n_layers)
    _check_positive_int("local_attention", self.local_attention)
    if self.architecture == "modernbert":
      if self.head_size % 2:
        raise ValueError(f"rotary positions need an even head size, got {self.head_size}")
      bert_only = {"embedding_size": None, "share_layers": False, "pre_layer_norm": False,
                   "position_offset": 0}
      wrong = [f"{k}={getattr(self, k)!r}" for k, v in bert_only.items() if getattr(self, k) != v]
      if wrong:
        raise ValueError(f"architecture 'modernbert' has no {', '.join(wrong)} (BERT-family "
                         "switches); leave them at their defaults")
    else:
      modern_only = {"use_bias": True, "norm_bias": True, "norm": "layernorm",
                     "tie_word_embeddings": True, "global_attn_every_n_layers": 1}
      wrong = [f"{k}={getattr(self, k)!r}" for k, v in modern_only.items()
               if getattr(self, k) != v]
      if wrong:
        raise ValueError(f"{', '.join(wrong)} are options of architecture 'modernbert', not "
                         "of 'bert': set architecture='modernbert' or leave them at their "
                         "defaults")

  def is_global(self, layer: int) -> bool:
    """Whether layer `layer` attends globally (else within its sliding window)."""
    return self.architecture != "modernbert" or layer % self.global_attn_every_n_layers == 0

  @property
  def effective_remat_policy(self) -> str:
    """remat_policy, with the older remat=True read as "full"."""
    return "full" if self.remat and self.remat_policy == "none" else self.remat_policy

  @property
  def head_size(self) -> int:
    """Per-head width D = H / A."""
    return self.hidden_size // self.num_attention_heads

  @property
  def padded_vocab_size(self) -> int:
    """Rows of the word table and width of the MLM logits: vocab_size rounded up to vocab_multiple.

    The padding rows are never looked up and their logits are masked out, so a padded
    model computes what the unpadded one does; checkpoints in HF/TF formats hold
    vocab_size rows (bert_jax.convert strips and restores the padding).
    """
    return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

  @property
  def embed_size(self) -> int:
    """Width E of the embedding tables (hidden_size unless factorised)."""
    return self.embedding_size or self.hidden_size

  @property
  def compute_dtype(self) -> jnp.dtype:
    """The jnp dtype activations are computed in."""
    return jnp.dtype(self.dtype)

  def replace(self, **kw) -> "BertConfig":
    """A copy with some fields changed (validated again)."""
    return dataclasses.replace(self, **kw)

  @classmethod
  def from_size(cls, size: str, **overrides) -> "BertConfig":
    """A config from the size table: BERT's (tiny|mini|small|medium|base|large, intermediate
    4H) or the modern encoder's (MODERN_SIZES: modernbert-tiny|-base|-large). An override
    of None leaves the row's value (or the default): a run config says "the size's own"
    so, e.g. the modern variant's max_position_embeddings whatever its size."""
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if size in MODERN_SIZES:
      if overrides.get("architecture", "modernbert") != "modernbert":
        raise ValueError(f"size {size!r} is the modern encoder's but architecture is "
                         f"{overrides['architecture']!r}: use a BERT size, or set "
                         f"architecture 'modernbert' (the pretrain config's modern variant)")
      fields = dict(MODERN_SIZES[size])
    elif size in SIZES:
      layers, hidden, heads = SIZES[size]
      fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                    intermediate_size=4 * hidden)
    else:
      raise ValueError(f"size must be one of {sorted(SIZES) + sorted(MODERN_SIZES)}, "
                       f"got {size!r}")
    fields.update(overrides)
    return cls(**fields)

  @property
  def hf_model_type(self) -> str:
    """The Hugging Face family that holds this network: bert, roberta, roberta-prelayernorm
    or modernbert.

    RoBERTa's families count positions from pad_token_id + 1, so a pre-LN network with
    BERT's positions (position_offset 0) has none; the ALBERT switches have none either.
    """
    if self.architecture == "modernbert":
      return "modernbert"
    if self.embedding_size not in (None, self.hidden_size) or self.share_layers:
      raise ValueError("embedding_size/share_layers (ALBERT switches) cannot be expressed as a "
                       "Hugging Face BERT or RoBERTa config: use the 'own' format")
    if self.pre_layer_norm and not self.position_offset:
      raise ValueError("pre_layer_norm=True with position_offset=0 has no Hugging Face format "
                       "(RobertaPreLayerNorm counts positions from pad_token_id + 1): set "
                       "position_offset=2 (RoBERTa's) or use the 'own' format")
    if self.pre_layer_norm:
      return "roberta-prelayernorm"
    return "roberta" if self.position_offset else "bert"

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "BertConfig":
    """Reads a Hugging Face Bert/Roberta/RobertaPreLayerNorm config.json; refuses other models."""
    model_type = d.get("model_type", "bert")
    if model_type not in HF_MODEL_TYPES:
      raise ValueError(f"model_type must be one of {HF_MODEL_TYPES}, got {model_type!r}")
    position_type = d.get("position_embedding_type", "absolute")
    if position_type != "absolute":
      raise ValueError(f"position_embedding_type must be 'absolute', got {position_type!r}")
    fields = _read_keys(d, _HF_KEYS, "HF config")
    if model_type != "bert":  # RoBERTa's positions start after its padding index
      pad = d.get("pad_token_id", 1)
      if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"pad_token_id must be a non-negative integer for model_type "
                         f"{model_type!r}, got {pad!r}")
      fields.update(position_offset=pad + 1,
                    pre_layer_norm=model_type == "roberta-prelayernorm")
    return cls(**fields)

  def to_hf_dict(self) -> dict:
    """The Hugging Face config.json contents for this network (its family: hf_model_type)."""
    model_type = self.hf_model_type
    d = {key: getattr(self, key) for key in _HF_KEYS if key != "hidden_act"}
    d.update(architectures=[HF_MODEL_TYPES[model_type]], model_type=model_type,
             hidden_act="gelu", position_embedding_type="absolute",
             pad_token_id=self.position_offset - 1 if self.position_offset else 0)
    return d

  @classmethod
  def from_tf_dict(cls, d: Mapping[str, Any] | str | os.PathLike) -> "BertConfig":
    """Reads google-research/bert's bert_config.json (a dict, or the file's path)."""
    if isinstance(d, (str, os.PathLike)):
      with open(d) as f:
        d = json.load(f)
    fields = _read_keys(d, _TF_KEYS, "bert_config.json")
    if d.get("embedding_size") is not None:  # ALBERT's config carries the factorised size
      fields["embedding_size"] = int(d["embedding_size"])
    return cls(**fields)


# Hugging Face model types read and written, with the pretraining class of each.
HF_MODEL_TYPES = {"bert": "BertForPreTraining", "roberta": "RobertaForMaskedLM",
                  "roberta-prelayernorm": "RobertaPreLayerNormForMaskedLM"}
# Keys both config formats share with ours; hidden_act is checked, not stored.
_TF_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "hidden_act", "hidden_dropout_prob",
            "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
            "initializer_range")
_HF_KEYS = _TF_KEYS + ("layer_norm_eps",)


def _read_keys(d: Mapping[str, Any], keys, source: str) -> dict:
  """Copies `keys` out of a foreign config dict; hidden_act must be exact GELU."""
  missing = [k for k in keys if k not in d and k != "layer_norm_eps"]
  if missing:
    raise ValueError(f"{source} lacks required key(s) {missing}")
  act = d["hidden_act"]
  if act != "gelu":
    raise ValueError(f"hidden_act must be 'gelu' (exact erf GELU), got {act!r} in {source}")
  return {k: d[k] for k in keys if k != "hidden_act" and k in d}


def _check_positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
