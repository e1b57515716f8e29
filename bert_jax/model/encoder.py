"""BERT encoder in Flax linen: embeddings, encoder layers, pooler, param layouts.

The same modules cover the ALBERT switches (factorised embedding size E with an
E -> H projection, cross-layer parameter sharing), the RoBERTa ones (positions
counted from pad_token_id + 1, a single token type, pre-LN blocks with a final
LayerNorm as fairseq's --encoder-normalize-before) and the scaling switches
(per-layer rematerialisation with a named policy, `nn.scan` over layers, the
attention kernel of bert_jax/model/attention.py), all fields of the BertConfig
of bert_jax/model/config.py. Parameters are float32 and carry logical axis names;
compute runs in `config.dtype`.

The parameter tree is a contract with bert_jax/convert (its layout module maps
every name to Hugging Face and TF names) and with saved checkpoints: change names
here only together with it. The task models with heads (BertForPreTraining, ...)
live in bert_jax/model/heads.py, which builds on this module.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp
import numpy as np

from bert_jax.model import attention as attention_lib
from bert_jax.model import dropout as dropout_lib
from bert_jax.model.config import BertConfig
from bert_jax.model.config import REMAT_POLICIES


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
  use_bias: bool = True  # the modern encoder's linears have none (BertConfig.use_bias)

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., *in] -> [..., *features] in the compute dtype."""
    n = self.num_contracted
    kernel = self.param("kernel", self.kernel_init, x.shape[-n:] + self.features, jnp.float32)
    contract = (tuple(range(x.ndim - n, x.ndim)), tuple(range(n)))
    if not self.use_bias:
      x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
      return jax.lax.dot_general(x, kernel, (contract, ((), ())))
    bias = self.param("bias", nn.with_logical_partitioning(
        nn.initializers.zeros_init(), self.axes[n:]), self.features, jnp.float32)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    return jax.lax.dot_general(x, kernel, (contract, ((), ()))) + bias


def dense(config: BertConfig, features, axes: tuple, name: str, *, axis=-1,
          dtype=None, use_bias: bool = True) -> nn.Module:
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
               use_bias=use_bias, name=name)


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


def _query_rows(x: jax.Array, queries: jax.Array) -> jax.Array:
  """x [B,T,...] at flat token indices `queries` [E] (row x T + position) -> [E,1,...]:
  the packed examples' [CLS] rows that a pooled-only last layer computes alone."""
  return x.reshape((-1,) + x.shape[2:])[queries][:, None]


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


def position_ids(config: BertConfig, input_mask: jax.Array) -> jax.Array:
  """[B,T] mask (1 = real token) -> [B,T] int32 rows of the position table.

  position_offset 0 (BERT): 0..T-1 whatever the padding. Otherwise fairseq's
  make_positions (HF's create_position_ids_from_input_ids), on the mask rather than on
  pad ids, so zero-padded rows count the same: the k-th real token sits at
  position_offset + k - 1, padding at position_offset - 1 (RoBERTa's pad row).
  """
  if not config.position_offset:
    return jnp.broadcast_to(jnp.arange(input_mask.shape[1], dtype=jnp.int32), input_mask.shape)
  real = (input_mask > 0).astype(jnp.int32)
  return jnp.cumsum(real, axis=1) * real + (config.position_offset - 1)


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
    self.dropout = dropout_lib.Dropout(cfg.hidden_dropout_prob)
    if cfg.embed_size != cfg.hidden_size:
      # E and H cannot both be named "embed" (flax refuses repeated names); H keeps it.
      self.projection = dense(cfg, cfg.hidden_size, (None, "embed"), "projection")

  def __call__(self, input_ids, segment_ids, input_mask=None, *,
               deterministic: bool = True, positions=None) -> jax.Array:
    """[B,T] ids (and, with position_offset, the [B,T] mask) -> [B,T,H] embeddings.

    `positions` [B,T] (packed documents: each restarts at 0) count from position_offset,
    instead of 0..T-1 (or, with position_offset, the real tokens' count)."""
    cfg = self.config
    seq_len = input_ids.shape[1]
    if seq_len + cfg.position_offset > cfg.max_position_embeddings:
      raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings "
                       f"({cfg.max_position_embeddings}" + (
                           f" less position_offset {cfg.position_offset}"
                           if cfg.position_offset else "") + ")")
    if positions is not None:
      positions = _lookup(self.position_embeddings, positions + cfg.position_offset)
    elif cfg.position_offset:
      positions = _lookup(self.position_embeddings, position_ids(cfg, input_mask))
    else:
      positions = self.position_embeddings(jnp.arange(seq_len))[None]
    if cfg.type_vocab_size == 1:
      # One token type (RoBERTa): every row adds it, whatever segment ids the packing wrote.
      segments = self.token_type_embeddings.embedding[0]
    else:
      segments = _lookup(self.token_type_embeddings, segment_ids)
    x = _lookup(self.word_embeddings, input_ids) + positions + segments
    x = self.layer_norm(_constrain(x, "batch", "length", "embed"))
    x = self.dropout(x, deterministic=deterministic)
    if cfg.embed_size != cfg.hidden_size:
      x = self.projection(x)
    return _constrain(x, "batch", "length", "embed")

  def word_embedding_table(self) -> jax.Array:
    """The [padded V,E] word embedding matrix (the MLM decoder is tied to it)."""
    return self.word_embeddings.embedding


class BertSelfAttention(nn.Module):
  """Multi-head self-attention with output projection (no residual, no LayerNorm)."""

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, *, deterministic: bool = True, first_only: bool = False,
               documents=None, queries=None) -> jax.Array:
    """x [B,T,H], mask [B,1,1,T] bool (True = attend) -> [B,T,H] ([B,1,H]: first_only).

    first_only: only the first position ([CLS]) queries; keys and values stay all T.
    documents [B,T] (packed rows): a token attends only its own document's keys.
    queries [E] (packed rows, with first_only): the flat index (row x T + position) of
    each example's [CLS]; only those query, each over its own row's document: [E,1,H].
    """
    cfg = self.config
    heads = (cfg.num_attention_heads, cfg.head_size)
    qkv_axes = ("embed", "heads", "kv")
    if queries is not None:
      first_x = _query_rows(x, queries)
    else:
      first_x = x[:, :1] if first_only else x
    # Named so that remat_policy "save_qkv_out_proj" can keep exactly these.
    q, k, v = (
        checkpoint_name(_constrain(dense(cfg, heads, qkv_axes, name)(
            first_x if name == "query" else x),
                                   "batch", "length", "heads", "kv"), f"{name}_proj")
        for name in ("query", "key", "value"))
    if queries is not None:
      # Each example's keys are its row's, masked to its document: the unpacked
      # first_only attention, on rows gathered per example.
      rows = queries // x.shape[1]
      k, v = k[rows], v[rows]
      own = documents.reshape(-1)[queries]
      mask = (mask[rows] & (documents[rows] == own[:, None])[:, None, None, :])
      documents = None
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
      dropout = lambda probs: dropout_lib.Dropout(rate, broadcast_dims=shared)(
          probs, deterministic=False)
    if documents is None:
      out = attention_lib.attend(impl, q, k, v, mask, dropout)
    else:  # every kernel by the documents' own mask or segments (attention.attend_masked)
      out = attention_lib.attend_masked(impl, q, k, v, mask[:, 0, 0, :], documents=documents,
                                        dropout=dropout)
    out = _constrain(out, "batch", "length", "heads", "kv")
    out = dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), "output", axis=(-2, -1))(out)
    return checkpoint_name(out, "attention_out")


class BertLayer(nn.Module):
  """Transformer block with exact GELU: post-LN (BERT) or pre-LN (config.pre_layer_norm).

  post-LN: h = LN(x + Attn(x)), y = LN(h + FFN(h)).
  pre-LN:  h = x + Attn(LN(x)), y = h + FFN(LN(h)); the encoder adds the final LayerNorm.
  """

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, deterministic: bool = True, first_only: bool = False,
               documents=None, queries=None) -> jax.Array:
    """x [B,T,H], mask [B,1,1,T] -> [B,T,H], or [B,1,H] (the [CLS] row) when first_only.

    `deterministic` and `first_only` are positional so remat can mark them static;
    `documents` [B,T]: packed rows' documents, `queries` [E] their examples' [CLS]
    (BertSelfAttention): with first_only, [E,1,H].
    """
    cfg = self.config
    # One Dropout module drawn from twice: both masks come from Dropout_0's rng stream.
    # A module per call would draw the second from Dropout_1's, other masks than the
    # ones runs from before pre_layer_norm trained on, so they would not resume
    # bit-identically (tests/test_model.py holds the stream).
    hidden_dropout = dropout_lib.Dropout(cfg.hidden_dropout_prob)
    drop = lambda y: hidden_dropout(y, deterministic=deterministic)
    attention = BertSelfAttention(cfg, name="attention")
    attention_norm = layer_norm(cfg, "attention_layer_norm")
    h = attention(attention_norm(x) if cfg.pre_layer_norm else x, mask,
                  deterministic=deterministic, first_only=first_only, documents=documents,
                  queries=queries)
    if queries is not None:  # the residual of the rows still computed
      x = _query_rows(x, queries)
    elif first_only:
      x = x[:, :1]
    h = x + drop(h) if cfg.pre_layer_norm else attention_norm(x + drop(h))
    h = _constrain(h, "batch", "length", "embed")
    # Pre-LN normalises the FFN's input (HF: intermediate.LayerNorm), post-LN its sum.
    y = layer_norm(cfg, "intermediate_layer_norm")(h) if cfg.pre_layer_norm else h
    y = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(y)
    y = _constrain(gelu(y), "batch", "length", "mlp")
    y = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(y)
    if cfg.pre_layer_norm:
      y = h + drop(y)
    else:
      y = layer_norm(cfg, "output_layer_norm")(h + drop(y))
    return _constrain(y, "batch", "length", "embed")


class BertEncoder(nn.Module):
  """L BertLayers: separate (layer_i), shared (layer) or scanned (layers, leading [L] axis).

  With pre_layer_norm, then the final LayerNorm (final_layer_norm).
  """

  config: BertConfig

  @nn.compact
  def __call__(self, x, mask, *, deterministic: bool = True, first_only: bool = False,
               documents=None, queries=None) -> jax.Array:
    """x [B,T,H], mask [B,1,1,T] -> [B,T,H]; `documents` [B,T]: packed rows' documents.

    first_only (unscanned encoders): the last layer computes only the first row, [B,1,H]:
    all a pooled-output head reads of it, so its FFN and attention output projection
    run on one row instead of T (exact: no other row of the last layer reaches [CLS]).
    With packed rows, `queries` [E] names each example's [CLS] (its flat index) and
    the result is those rows, [E,1,H]. A scanned encoder has one program for all layers
    and still computes every row (then reads the queries' rows).
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
          lambda module, carry, m, d: (module(carry, m, deterministic, False, d), None),
          split_rngs={"params": not cfg.share_layers, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast), length=cfg.num_hidden_layers, **params)
      name = "layer" if cfg.share_layers else "layers"
      x, _ = scan(layer_cls(cfg, name=name), x, mask, documents)
      if queries is not None:
        x = _query_rows(x, queries)
    else:
      last = cfg.num_hidden_layers - 1
      shared = layer_cls(cfg, name="layer") if cfg.share_layers else None
      for i in range(cfg.num_hidden_layers):
        layer = shared or layer_cls(cfg, name=f"layer_{i}")
        at_last = first_only and i == last
        x = layer(x, mask, deterministic, at_last, documents,
                  queries if at_last else None)
    if cfg.pre_layer_norm:
      # Pre-LN blocks leave the residual stream unnormalised: one LayerNorm after the last.
      x = _constrain(layer_norm(cfg, "final_layer_norm")(x), "batch", "length", "embed")
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
               pooled_only: bool = False, positions=None, documents=None, queries=None):
    """int32 [B,T] ids, mask (1 = real token), segments -> (sequence [B,T,H], pooled [B,H]).

    pooled_only: the caller reads only `pooled`, so the last layer may compute only the
    [CLS] row (BertEncoder's first_only); `sequence` is then [B,1,H] or [B,T,H].
    Packed rows: `positions` [B,T] restart at each document, `documents` [B,T] keep each
    token's attention inside its document; with pooled_only, `queries` [E] (each
    example's [CLS], its flat index) makes `sequence` [E,1,H] and `pooled` [E,H].
    """
    x = self.embeddings(input_ids, segment_ids, input_mask, deterministic=deterministic,
                        positions=positions)
    mask = (input_mask > 0)[:, None, None, :]
    x = self.encoder(x, mask, deterministic=deterministic, first_only=pooled_only,
                     documents=documents, queries=queries if pooled_only else None)
    return x, self.pooler(x)

  def pool(self, sequence: jax.Array, real: jax.Array) -> jax.Array:
    """The pooled vector of [B,T,H] rows (the pooler on each row's first token)."""
    del real
    return self.pooler(sequence)

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
