"""BERT encoder in Flax linen: config with a size table, embeddings, post-LN encoder, pooler.

The same modules cover the ALBERT switches (factorised embedding size E with an
E -> H projection, cross-layer parameter sharing) and the scaling switches
(per-layer rematerialisation with a named policy, `nn.scan` over layers, the
attention kernel of bert_jax/model/attention.py). Parameters are float32 and carry
logical axis names; compute runs in `config.dtype`.

The parameter tree is a contract with bert_jax/convert (its layout module maps
every name to Hugging Face and TF names) and with saved checkpoints: change names
here only together with it. The task models with heads (BertForPreTraining, ...)
live in bert_jax/model/heads.py, which builds on this module.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name
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
  max_position_embeddings: int = 512  # longest sequence the learned positions cover
  type_vocab_size: int = 2  # segment A / segment B
  initializer_range: float = 0.02  # stddev of the truncated-normal initialiser
  layer_norm_eps: float = 1e-12  # as google-research/bert
  embedding_size: int | None = None  # ALBERT factorised embedding E; None -> hidden_size
  share_layers: bool = False  # ALBERT cross-layer sharing: one layer applied L times
  dtype: str = "float32"  # compute dtype; params are always float32
  attention_impl: str | None = "auto"  # bert_jax/model/attention.py: auto|einsum|xla|cudnn|splash
  remat_policy: str = "none"  # a key of REMAT_POLICIES: what each layer keeps for backward
  remat: bool = False  # older configs' switch: True reads as remat_policy "full"
  scan_layers: bool = False  # nn.scan over layers: params get a leading [L] axis

  def __post_init__(self):
    positive = ("vocab_size", "vocab_multiple", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "max_position_embeddings",
                "type_vocab_size")
    for name in positive:
      _check_positive_int(name, getattr(self, name))
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
    for name in ("share_layers", "remat", "scan_layers", "attention_dropout_shared"):
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
    """A config from the size table (tiny|mini|small|medium|base|large), intermediate 4H."""
    if size not in SIZES:
      raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    layers, hidden, heads = SIZES[size]
    fields = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                  intermediate_size=4 * hidden)
    fields.update(overrides)
    return cls(**fields)

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any]) -> "BertConfig":
    """Reads a Hugging Face BertConfig (config.json contents); refuses what BERT here is not."""
    model_type = d.get("model_type", "bert")
    if model_type != "bert":
      raise ValueError(f"model_type must be 'bert', got {model_type!r}")
    position_type = d.get("position_embedding_type", "absolute")
    if position_type != "absolute":
      raise ValueError(f"position_embedding_type must be 'absolute', got {position_type!r}")
    fields = _read_keys(d, _HF_KEYS, "HF config")
    return cls(**fields)

  def to_hf_dict(self) -> dict:
    """The Hugging Face config.json contents for BertForPreTraining with these hyper-parameters."""
    if self.embedding_size not in (None, self.hidden_size) or self.share_layers:
      raise ValueError("embedding_size/share_layers (ALBERT switches) cannot be expressed as a "
                       "Hugging Face BertConfig")
    d = {key: getattr(self, key) for key in _HF_KEYS if key != "hidden_act"}
    d.update(architectures=["BertForPreTraining"], model_type="bert", hidden_act="gelu",
             position_embedding_type="absolute", pad_token_id=0)
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


# ----------------------------------------------------------------------------- building blocks

def param_init(config: BertConfig, axes: tuple) -> Callable:
  """BERT's truncated-normal initialiser, boxed with logical axis names."""
  return nn.with_logical_partitioning(
      jax.nn.initializers.truncated_normal(config.initializer_range), axes)


class Dense(nn.Module):
  """y = x . kernel + bias: x's last `num_contracted` axes against a full-shape kernel.

  What nn.DenseGeneral computes, with the same parameters ("kernel" [*in, *features],
  "bias" [*features]); it exists because DenseGeneral initialises its kernel flat 2-D
  and reshapes it, and under a mesh the logical box then constrains the flat value
  with every axis name and fails. Here every parameter is created in its own shape,
  so the trainers can run under a mesh and the activation constraints hold.
  """

  features: tuple[int, ...]  # output dimensions
  num_contracted: int  # trailing input axes contracted with the kernel's leading ones
  axes: tuple  # logical names of every kernel dimension; the bias takes the output names
  dtype: Any  # compute dtype; params are float32
  kernel_init: Callable

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., *in] -> [..., *features] in the compute dtype."""
    n = self.num_contracted
    kernel = self.param("kernel", self.kernel_init, x.shape[-n:] + self.features, jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(
        nn.initializers.zeros_init(), self.axes[n:]), self.features, jnp.float32)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    contract = (tuple(range(x.ndim - n, x.ndim)), tuple(range(n)))
    return jax.lax.dot_general(x, kernel, (contract, ((), ()))) + bias


def dense(config: BertConfig, features, axes: tuple, name: str, *, axis=-1,
          dtype=None) -> nn.Module:
  """A Dense with BERT init, fp32 params, compute dtype and named kernel/bias axes.

  `axes` names every kernel dimension (inputs then outputs); the bias takes the output
  names. `axis` is -1 or (-2, -1): the trailing input axes contracted. `dtype`
  overrides the compute dtype (the small output heads run in float32).
  """
  features = (features,) if isinstance(features, int) else tuple(features)
  num_contracted = 1 if isinstance(axis, int) else len(axis)
  if len(axes) != num_contracted + len(features):
    raise ValueError(f"{name}: {len(axes)} axis names for a kernel of "
                     f"{num_contracted + len(features)} dimensions")
  return Dense(features=features, num_contracted=num_contracted, axes=tuple(axes),
               dtype=dtype or config.compute_dtype, kernel_init=param_init(config, axes),
               name=name)


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  """LayerNorm over the last axis; flax reduces in float32 even when computing in bfloat16."""
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
      name=name)


def gelu(x: jax.Array) -> jax.Array:
  """Exact (erf) GELU, as the paper and google-research/bert use."""
  return jax.nn.gelu(x, approximate=False)


def _constrain(x: jax.Array, *axes) -> jax.Array:
  # A no-op without a mesh and rules; under bert_jax.training.sharding.activate (the trainers)
  # it pins the activation layout, so GSPMD need not guess it from the parameters.
  return nn.with_logical_constraint(x, axes)


def _lookup(embed: nn.Embed, ids: jax.Array) -> jax.Array:
  """[B,T] ids -> [B,T,E] rows of an embedding table, E still split as in the table.

  The rules give "table_embed" the table's mesh axes for E and the batch what is left
  (e.g. "data"); the constraint after the embeddings' sum then moves the rows to the
  batch layout with an all-to-all. Asked to go from the lookup straight to the batch
  layout, GSPMD replicates the global-batch [B,T,E] rows on every device (an
  "involuntary full rematerialization") wherever data and fsdp both split the batch.
  """
  rows = jnp.take(embed.embedding, ids, axis=0)  # what nn.Embed computes for float32 tables
  return _constrain(rows, "batch", "length", "table_embed")


# ----------------------------------------------------------------------------- modules

class BertEmbeddings(nn.Module):
  """Word + learned absolute position + segment embeddings, LayerNorm, dropout (+ E -> H)."""

  config: BertConfig

  def setup(self):
    cfg = self.config
    # Lookups stay float32: the sum and LayerNorm statistics are then exact, and the
    # LayerNorm output is cast to the compute dtype.
    embed = lambda n, axes, name: nn.Embed(
        n, cfg.embed_size, dtype=jnp.float32, param_dtype=jnp.float32,
        embedding_init=param_init(cfg, axes), name=name)
    self.word_embeddings = embed(cfg.padded_vocab_size, ("vocab", "embed"), "word_embeddings")
    self.position_embeddings = embed(cfg.max_position_embeddings, ("pos", "embed"),
                                     "position_embeddings")
    self.token_type_embeddings = embed(cfg.type_vocab_size, ("type", "embed"),
                                       "token_type_embeddings")
    self.layer_norm = layer_norm(cfg, "layer_norm")
    self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
    if cfg.embed_size != cfg.hidden_size:
      # E and H cannot both be named "embed" (flax refuses repeated names); H keeps it.
      self.projection = dense(cfg, cfg.hidden_size, (None, "embed"), "projection")

  def __call__(self, input_ids, segment_ids, *, deterministic: bool = True) -> jax.Array:
    """[B,T] ids -> [B,T,H] embeddings in the compute dtype."""
    seq_len = input_ids.shape[1]
    if seq_len > self.config.max_position_embeddings:
      raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings "
                       f"({self.config.max_position_embeddings})")
    x = (_lookup(self.word_embeddings, input_ids)
         + self.position_embeddings(jnp.arange(seq_len))[None]
         + _lookup(self.token_type_embeddings, segment_ids))
    x = self.layer_norm(_constrain(x, "batch", "length", "embed"))
    x = self.dropout(x, deterministic=deterministic)
    if self.config.embed_size != self.config.hidden_size:
      x = self.projection(x)
    return _constrain(x, "batch", "length", "embed")

  def word_embedding_table(self) -> jax.Array:
    """The [padded V,E] word embedding matrix (the MLM decoder is tied to it)."""
    return self.word_embeddings.embedding


class BertSelfAttention(nn.Module):
  """Multi-head self-attention with output projection (no residual, no LayerNorm)."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, *, deterministic: bool = True, first_only: bool = False
               ) -> jax.Array:
    """x [B,T,H], mask [B,1,1,T] bool (True = attend) -> [B,T,H] ([B,1,H]: first_only).

    first_only: only the first position ([CLS]) queries; keys and values stay all T.
    """
    cfg = self.config
    heads = (cfg.num_attention_heads, cfg.head_size)
    qkv_axes = ("embed", "heads", "kv")
    # Named so that remat_policy "save_qkv_out_proj" can keep exactly these.
    q, k, v = (
        checkpoint_name(_constrain(dense(cfg, heads, qkv_axes, name)(
            x[:, :1] if first_only and name == "query" else x),
                                   "batch", "length", "heads", "kv"), f"{name}_proj")
        for name in ("query", "key", "value"))
    rate = cfg.attention_probs_dropout_prob
    # Resolved while tracing: auto takes einsum only where probabilities are dropped
    # (the paper recipe's training), a fused kernel everywhere else.
    impl = attention_lib.resolve(cfg.attention_impl, dtype=cfg.compute_dtype,
                                 head_size=cfg.head_size, dropout_rate=rate,
                                 training=not deterministic, seq_len=x.shape[1])
    if first_only and impl in ("splash", "cudnn"):
      # One query row ([B,N,1,T] probabilities) is too small for a fused kernel to
      # matter, and splash's query blocks are 128 rows: XLA's attention does the same maths.
      impl = "xla"
    dropout = None
    if impl == "einsum" and not deterministic and rate > 0:
      # einsum_attention's probabilities are [B, N, T, S]: broadcasting over batch and
      # heads draws one [T, S] mask for all of them.
      shared = (0, 1) if cfg.attention_dropout_shared else ()
      dropout = lambda probs: nn.Dropout(rate, broadcast_dims=shared)(probs, deterministic=False)
    out = attention_lib.attend(impl, q, k, v, mask, dropout)
    out = _constrain(out, "batch", "length", "heads", "kv")
    out = dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "output", axis=(-2, -1))(out)
    return checkpoint_name(out, "attention_out")


class BertLayer(nn.Module):
  """Post-LN Transformer block: LN(x + Attn(x)), then LN(h + FFN(h)) with exact GELU."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool = True, first_only: bool = False
               ) -> jax.Array:
    """x [B,T,H], mask [B,1,1,T] -> [B,T,H], or [B,1,H] (the [CLS] row) when first_only.

    `deterministic` and `first_only` are positional so remat can mark them static.
    """
    cfg = self.config
    drop = nn.Dropout(cfg.hidden_dropout_prob)
    h = BertSelfAttention(cfg, name="attention")(x, mask, deterministic=deterministic,
                                                 first_only=first_only)
    if first_only:
      x = x[:, :1]  # the residual of the one row still computed
    h = layer_norm(cfg, "attention_layer_norm")(x + drop(h, deterministic=deterministic))
    h = _constrain(h, "batch", "length", "embed")
    y = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(h)
    y = _constrain(gelu(y), "batch", "length", "mlp")
    y = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(y)
    y = layer_norm(cfg, "output_layer_norm")(h + drop(y, deterministic=deterministic))
    return _constrain(y, "batch", "length", "embed")


class BertEncoder(nn.Module):
  """L BertLayers: separate (layer_i), shared (layer) or scanned (layers, leading [L] axis)."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, *, deterministic: bool = True, first_only: bool = False
               ) -> jax.Array:
    """x [B,T,H], mask [B,1,1,T] -> [B,T,H].

    first_only (unscanned encoders): the last layer computes only the first row, [B,1,H]:
    all a pooled-output head reads of it, so its FFN and attention output projection
    run on one row instead of T (exact: no other row of the last layer reaches [CLS]).
    A scanned encoder has one program for all layers and still computes every row.
    """
    cfg = self.config
    policy = cfg.effective_remat_policy
    layer_cls = BertLayer
    if policy != "none":
      # static_argnums counts `self` as 0: `deterministic` (3) and `first_only` (4) are
      # Python bools. Under scan, CSE across iterations cannot happen, so its prevention
      # is dropped (jax's advice for checkpoint inside scan).
      layer_cls = nn.remat(BertLayer, static_argnums=(3, 4), policy=REMAT_POLICIES[policy],
                           prevent_cse=not cfg.scan_layers)
    if cfg.scan_layers:
      # Shared layers broadcast one set of params over the loop; otherwise each
      # step gets its own slice of params stacked on a leading "layers" axis.
      params = dict(variable_broadcast="params") if cfg.share_layers else dict(
          variable_axes={"params": 0}, metadata_params={nn.PARTITION_NAME: "layers"})
      scan = nn.scan(
          lambda module, carry, m: (module(carry, m, deterministic, False), None),
          split_rngs={"params": not cfg.share_layers, "dropout": True},
          in_axes=(nn.broadcast,), length=cfg.num_hidden_layers, **params)
      name = "layer" if cfg.share_layers else "layers"
      x, _ = scan(layer_cls(cfg, name=name), x, mask)
      return x
    last = cfg.num_hidden_layers - 1
    if cfg.share_layers:
      layer = layer_cls(cfg, name="layer")
      for i in range(cfg.num_hidden_layers):
        x = layer(x, mask, deterministic, first_only and i == last)
      return x
    for i in range(cfg.num_hidden_layers):
      x = layer_cls(cfg, name=f"layer_{i}")(x, mask, deterministic, first_only and i == last)
    return x


class BertPooler(nn.Module):
  """tanh dense on the [CLS] (first) token."""

  config: BertConfig

  @nn.compact
  def __call__(self, x) -> jax.Array:
    """[B,T,H] -> [B,H]."""
    # Only one H may be named "embed"; the output side stays unnamed (replicated).
    return jnp.tanh(dense(self.config, self.config.hidden_size, ("embed", None), "dense")(x[:, 0]))


class BertModel(nn.Module):
  """The BERT encoder: embeddings, encoder stack, pooler."""

  config: BertConfig

  def setup(self):
    self.embeddings = BertEmbeddings(self.config)
    self.encoder = BertEncoder(self.config)
    self.pooler = BertPooler(self.config)

  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True,
               pooled_only: bool = False):
    """int32 [B,T] ids, mask (1 = real token), segments -> (sequence [B,T,H], pooled [B,H]).

    pooled_only: the caller reads only `pooled`, so the last layer may compute only the
    [CLS] row (BertEncoder's first_only); `sequence` is then [B,1,H] or [B,T,H].
    """
    x = self.embeddings(input_ids, segment_ids, deterministic=deterministic)
    mask = (input_mask > 0)[:, None, None, :]
    x = self.encoder(x, mask, deterministic=deterministic, first_only=pooled_only)
    return x, self.pooler(x)

  def word_embedding_table(self) -> jax.Array:
    """The [padded V,E] float32 word embedding matrix, for heads tied to it."""
    return self.embeddings.word_embedding_table()


# ----------------------------------------------------------------------------- param layouts

def _map_encoders(params, fn):
  """Applies fn to every dict stored under an "encoder" key, anywhere in the tree."""
  if not isinstance(params, Mapping):
    return params
  return {k: fn(v) if k == "encoder" and isinstance(v, Mapping) else _map_encoders(v, fn)
          for k, v in params.items()}


def stack_layers(params, num_layers: int):
  """Per-layer params (encoder/layer_{i}) -> scanned layout (encoder/layers, leading [L]).

  Works on plain (unboxed) trees of any model here; a tree without per-layer encoder
  params (shared or already scanned) passes through unchanged.
  """
  def stack(enc):
    if "layer_0" not in enc:
      return dict(enc)
    names = [f"layer_{i}" for i in range(num_layers)]
    missing = [n for n in names if n not in enc]
    extra = sorted(k for k in enc if k.startswith("layer_") and k not in names)
    if missing or extra:
      raise ValueError(f"encoder params do not hold exactly {num_layers} layers: "
                       f"missing {missing}, unexpected {extra}")
    rest = {k: v for k, v in enc.items() if k not in names}
    return {**rest, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *(enc[n] for n in names))}
  return _map_encoders(params, stack)


def unstack_layers(params):
  """Scanned layout (encoder/layers, leading [L]) -> per-layer params (encoder/layer_{i})."""
  def unstack(enc):
    if "layers" not in enc:
      return dict(enc)
    layers = enc["layers"]
    num = jax.tree.leaves(layers)[0].shape[0]
    rest = {k: v for k, v in enc.items() if k != "layers"}
    return {**rest, **{f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], layers)
                       for i in range(num)}}
  return _map_encoders(params, unstack)


def count_params(module: nn.Module, seq_len: int = 8) -> int:
  """Number of parameters of a model here, from shapes only (jax.eval_shape; no memory)."""
  ids = jnp.zeros((1, seq_len), jnp.int32)
  args = (ids, ids, ids)
  if "masked_lm_positions" in _call_params(module):
    args += (jnp.zeros((1, 1), jnp.int32),)
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *args))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes["params"])))


def _call_params(module: nn.Module):
  return inspect.signature(type(module).__call__).parameters
