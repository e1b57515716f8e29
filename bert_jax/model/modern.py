"""The modern encoder (ModernBERT, Warner et al. 2024; Ettin, mmBERT after it), in Flax linen.

What differs from BERT (bert_jax/model/encoder.py), each a field of the one BertConfig
(architecture "modernbert"; bert_jax/model/config.py's MODERN_SIZES give the recipe):

- rotary positions instead of a position table, with a RoPE theta per layer kind
  (rope_theta on global layers, local_rope_theta on sliding ones); no segment table;
- pre-norm blocks: x + Attn(Norm(x)) then h + GLU(Norm(h)), no norm before the first
  layer's attention (the embeddings' norm serves), one final norm;
- attention global every `global_attn_every_n_layers` layers (i % n == 0) and within a
  sliding window elsewhere: a token attends the keys at |i - j| <= local_attention // 2;
- a gated feed-forward: act(x W_in) * (x W_gate), GeGLU (GELU) or SwiGLU (SiLU);
- no biases in linears (use_bias) or norms (norm_bias); LayerNorm or RMSNorm.

The parameter tree is a contract with bert_jax/convert (layout's modernbert table):
q, k and v are one kernel [H, 3, A, D] and the GLU's two input matrices one [H, 2, I],
as Hugging Face stores them (Wqkv, Wi). Activations carry the same logical axis names
as BERT's, so the sharding rules of experiments/configs serve both.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp

from bert_jax.model import attention as attention_lib
from bert_jax.model import dropout as dropout_lib
from bert_jax.model import encoder as bert_lib
from bert_jax.model.config import BertConfig
from bert_jax.model.config import REMAT_POLICIES

_constrain = bert_lib._constrain  # pylint: disable=protected-access


def norm(config: BertConfig, name: str) -> nn.Module:
  """config.norm over the last axis (LayerNorm with or without bias, or RMSNorm); float32
  statistics whatever the compute dtype."""
  scale = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
  if config.norm == "rmsnorm":
    return nn.RMSNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
                      param_dtype=jnp.float32, scale_init=scale, name=name)
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32,
      use_bias=config.norm_bias, scale_init=scale,
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
      name=name)


def rope_tables(positions: jax.Array, head_size: int, theta: float
                ) -> tuple[jax.Array, jax.Array]:
  """[B,T] int positions -> (cos, sin), each float32 [B,T,D]: the rotary angles
  position * theta^(-2i/D), i < D/2, repeated for both halves of a head (the GPT-NeoX
  layout Hugging Face's rotate_half pairs with)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_size, 2, dtype=jnp.float32) / head_size))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq
  angles = jnp.concatenate([angles, angles], axis=-1)
  return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """x [B,T,N,D] rotated by the [B,T,D] tables, in float32, back in x's dtype."""
  half = x.shape[-1] // 2
  f = x.astype(jnp.float32)
  rotated = jnp.concatenate([-f[..., half:], f[..., :half]], axis=-1)
  return (f * cos[:, :, None] + rotated * sin[:, :, None]).astype(x.dtype)


def _dense(config: BertConfig, features, axes: tuple, name: str, *, axis=-1) -> nn.Module:
  """A Dense with the encoder's init, with or without a bias (config.use_bias)."""
  return bert_lib.dense(config, features, axes, name, axis=axis, use_bias=config.use_bias)


class ModernEmbeddings(nn.Module):
  """Word embeddings, norm, dropout: positions enter the attention as rotations."""

  config: BertConfig

  def setup(self):
    cfg = self.config
    self.word_embeddings = nn.Embed(
        cfg.padded_vocab_size, cfg.hidden_size, dtype=jnp.float32, param_dtype=jnp.float32,
        embedding_init=bert_lib.param_init(cfg, ("vocab", "embed")), name="word_embeddings")
    self.norm = norm(cfg, "norm")
    self.dropout = dropout_lib.Dropout(cfg.hidden_dropout_prob)

  def __call__(self, input_ids, *, deterministic: bool = True) -> jax.Array:
    """[B,T] ids -> [B,T,H]."""
    x = _constrain(bert_lib._lookup(self.word_embeddings, input_ids),  # pylint: disable=protected-access
                   "batch", "length", "embed")
    x = self.dropout(self.norm(x), deterministic=deterministic)
    return _constrain(x, "batch", "length", "embed")

  def word_embedding_table(self) -> jax.Array:
    """The [padded V,H] word embedding matrix (the MLM decoder is tied to it)."""
    return self.word_embeddings.embedding


class ModernAttention(nn.Module):
  """Self-attention with rotary positions, global or within a sliding window."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, key_real, rope, is_global, *, deterministic: bool = True,
               documents=None) -> jax.Array:
    """x [B,T,H], key_real [B,T] bool, rope (cos, sin) [B,T,D] -> [B,T,H].

    `is_global` (a Python bool): attend every key, else the window's. `documents` [B,T]
    int (packed rows): a token attends only the keys of its own document.
    """
    cfg = self.config
    qkv = _dense(cfg, (3, cfg.num_attention_heads, cfg.head_size),
                 ("embed", None, "heads", "kv"), "qkv")(x)
    q, k, v = (checkpoint_name(_constrain(qkv[:, :, i], "batch", "length", "heads", "kv"),
                               f"{name}_proj") for i, name in enumerate(("query", "key", "value")))
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    rate = cfg.attention_probs_dropout_prob
    impl = attention_lib.resolve(cfg.attention_impl, dtype=cfg.compute_dtype,
                                 head_size=cfg.head_size, dropout_rate=rate,
                                 training=not deterministic, seq_len=x.shape[1])
    dropout = None
    if impl == "einsum" and not deterministic and rate > 0:
      dropout = lambda probs: dropout_lib.Dropout(rate)(probs, deterministic=False)
    window = None if is_global else cfg.local_attention // 2
    out = attention_lib.attend_masked(impl, q, k, v, key_real, window=window,
                                      documents=documents, dropout=dropout)
    out = _constrain(out, "batch", "length", "heads", "kv")
    out = _dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "output", axis=(-2, -1))(out)
    out = dropout_lib.Dropout(rate)(out, deterministic=deterministic)
    return checkpoint_name(out, "attention_out")


class ModernLayer(nn.Module):
  """Pre-norm block: h = x + Attn(Norm(x)) (no norm on layer 0), y = h + GLU(Norm(h))."""

  config: BertConfig
  first: bool = False  # layer 0: its attention reads the embeddings' norm directly
  is_global: bool = True

  @nn.compact
  def __call__(self, x, key_real, rope, deterministic: bool = True, documents=None
               ) -> jax.Array:
    """x [B,T,H] -> [B,T,H]; `rope`: this layer kind's (cos, sin)."""
    cfg = self.config
    h = x if self.first else norm(cfg, "attention_norm")(x)
    h = x + ModernAttention(cfg, name="attention")(
        h, key_real, rope, self.is_global, deterministic=deterministic, documents=documents)
    h = _constrain(h, "batch", "length", "embed")
    y = _dense(cfg, (2, cfg.intermediate_size), ("embed", None, "mlp"), "mlp_in")(
        norm(cfg, "mlp_norm")(h))
    activation = bert_lib.gelu if cfg.glu_activation == "gelu" else jax.nn.silu
    y = _constrain(activation(y[..., 0, :]) * y[..., 1, :], "batch", "length", "mlp")
    y = dropout_lib.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
    y = _dense(cfg, cfg.hidden_size, ("mlp", "embed"), "mlp_out")(y)
    return _constrain(h + y, "batch", "length", "embed")


class ModernEncoder(nn.Module):
  """The layers (layer_i, each global or sliding) and the final norm."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, key_real, positions, *, deterministic: bool = True, documents=None
               ) -> jax.Array:
    """x [B,T,H], key_real [B,T] bool, positions [B,T] int -> [B,T,H]."""
    cfg = self.config
    tables = {True: rope_tables(positions, cfg.head_size, cfg.rope_theta),
              False: rope_tables(positions, cfg.head_size, cfg.local_rope_theta)}
    layer_cls: Callable = ModernLayer
    policy = cfg.effective_remat_policy
    if policy != "none":
      # static_argnums counts `self` as 0: `deterministic` (4) is a Python bool.
      layer_cls = nn.remat(ModernLayer, static_argnums=(4,), policy=REMAT_POLICIES[policy])
    for i in range(cfg.num_hidden_layers):
      is_global = cfg.is_global(i)
      x = layer_cls(cfg, first=i == 0, is_global=is_global, name=f"layer_{i}")(
          x, key_real, tables[is_global], deterministic, documents)
    return _constrain(norm(cfg, "final_norm")(x), "batch", "length", "embed")


class ModernBertModel(nn.Module):
  """The modern encoder: embeddings, encoder; the pooled vector is [CLS]'s or the mean of
  the real tokens' (classifier_pooling), which its task heads read."""

  config: BertConfig

  def setup(self):
    self.embeddings = ModernEmbeddings(self.config)
    self.encoder = ModernEncoder(self.config)

  def __call__(self, input_ids, input_mask, segment_ids=None, *, deterministic: bool = True,
               pooled_only: bool = False, positions=None, documents=None):
    """int32 [B,T] ids, mask (1 = real token) -> (sequence [B,T,H], pooled [B,H]).

    `segment_ids` are not read (the modern encoder has no segment table). `positions`
    [B,T] (default 0..T-1) rotate the queries and keys; `documents` [B,T] keep each
    token's attention inside its own document (packed rows). `pooled_only` is accepted
    for the task heads' sake and changes nothing: every layer computes every row.
    """
    del segment_ids, pooled_only
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32),
                                   input_ids.shape)
    real = input_mask > 0
    x = self.embeddings(input_ids, deterministic=deterministic)
    x = self.encoder(x, real, positions, deterministic=deterministic, documents=documents)
    return x, self.pool(x, real)

  def pool(self, sequence: jax.Array, real: jax.Array) -> jax.Array:
    """The pooled vector of [B,T,H] rows: [CLS]'s, or the mean of the real tokens'
    (classifier_pooling)."""
    if self.config.classifier_pooling == "mean":
      weights = real.astype(jnp.float32)[..., None]
      return (sequence.astype(jnp.float32) * weights).sum(1) / jnp.maximum(weights.sum(1), 1.0)
    return sequence[:, 0]

  def word_embedding_table(self) -> jax.Array:
    """The [padded V,H] float32 word embedding matrix, for heads tied to it."""
    return self.embeddings.word_embedding_table()
