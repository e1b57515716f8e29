"""Scaled dot-product attention kernels, chosen by config.model.attention_impl.

  einsum   the paper's path, written out: float32 [B,N,T,T] logits, masked softmax,
           dropout on the probabilities (attention_probs_dropout_prob). The only
           implementation that can drop attention probabilities, so the paper recipe
           trains through it.
  xla      jax.nn.dot_product_attention(implementation="xla") with the boolean mask:
           the same maths, whatever fusion XLA finds; no dropout.
  cudnn    cuDNN flash attention (NVIDIA GPUs, bfloat16/float16, head size <= 128 and
           a multiple of 8); padding goes in as key_value_seq_lengths, the only form
           cuDNN accepts (a [B,1,1,T] mask becomes a bias that its check refuses).
  splash   the Pallas splash attention kernel of TPUs; padding goes in as segment ids
           (queries all in segment 1, keys 1 if real and 0 if padding), which is exact
           for any mask. Under a mesh it runs per shard inside shard_map.
  auto     einsum when attention probabilities are dropped (training with
           attention_probs_dropout_prob > 0), else cudnn on NVIDIA GPUs, splash on
           TPUs, xla elsewhere. None (older configs) means auto.

Why no fused kernel trains the paper recipe: jax.nn.dot_product_attention has no
dropout, splash has none, and jax's cuDNN binding takes its dropout seed as a
static number, i.e. the same mask at every step. The "fast" recipe
(experiments/configs/pretrain.py:base_fast) sets attention_probs_dropout_prob=0,
as MosaicBERT and Cramming train, so that the fused kernels serve training.

Padding: BERT's input_mask is a prefix of ones (right padding) in every pipeline
here; cudnn's lengths assume it, splash's segment ids and xla's mask do not. A row
with no real token attends to its first position under cudnn and splash (finite,
and no loss reads it) where einsum and xla average all positions.
"""

from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("auto", "einsum", "xla", "cudnn", "splash")
FUSED = ("xla", "cudnn", "splash")  # no dropout on the attention probabilities


def platform() -> str:
  """The platform of this process's devices ("cpu", "gpu", "tpu"); tests may patch it."""
  return jax.devices()[0].platform


def _device_kind() -> str:
  return jax.devices()[0].device_kind


def _cudnn_problem(dtype, head_size: int) -> str | None:
  """Why cuDNN flash attention cannot run these shapes on this device (None: it can)."""
  if platform() != "gpu" or "NVIDIA" not in _device_kind().upper():
    return f"it needs an NVIDIA GPU and this process runs on {platform()} ({_device_kind()})"
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    return (f"cuDNN flash attention computes in bfloat16/float16 and config.model.dtype is "
            f"{jnp.dtype(dtype).name}")
  if head_size > 128 or head_size % 8:
    return f"cuDNN flash attention needs a head size <= 128 and a multiple of 8, not {head_size}"
  return None


def _splash_problem(seq_len: int | None) -> str | None:
  """Why the splash kernel cannot run here (None: it can)."""
  if platform() != "tpu":
    return (f"it is a TPU (Pallas Mosaic) kernel and this process runs on {platform()} "
            f"({_device_kind()})")
  if seq_len is not None and seq_len % 128:
    return f"its key blocks are multiples of 128 tokens and the sequence length is {seq_len}"
  return None


def check(impl: str | None, *, dtype, head_size: int, dropout_rate: float, training: bool,
          seq_len: int | None = None) -> None:
  """Refuses an implementation this device or this recipe cannot run, naming the field.

  Raises:
    ValueError: naming config.model.attention_impl, why, and what to use instead.
  """
  if impl not in IMPLEMENTATIONS + (None,):
    raise ValueError(f"config.model.attention_impl={impl!r}: expected one of {IMPLEMENTATIONS}")
  if impl in FUSED and training and dropout_rate > 0:
    raise ValueError(
        f"config.model.attention_impl={impl!r} has no dropout on the attention probabilities "
        f"and config.model.attention_probs_dropout_prob={dropout_rate}: use 'einsum' (or "
        "'auto') for the paper recipe, or attention_probs_dropout_prob=0 (the fast recipe, "
        "experiments/configs/pretrain.py:base_fast)")
  problem = (_cudnn_problem(dtype, head_size) if impl == "cudnn"
             else _splash_problem(seq_len) if impl == "splash" else None)
  if problem:
    raise ValueError(f"config.model.attention_impl={impl!r} cannot run here: {problem}. Use "
                     "'auto' (the fastest this device has), 'xla' or 'einsum'")


def resolve(impl: str | None, *, dtype, head_size: int, dropout_rate: float, training: bool,
            seq_len: int | None = None) -> str:
  """The implementation a call runs: auto's pick, or the requested one once checked."""
  if impl not in ("auto", None):
    check(impl, dtype=dtype, head_size=head_size, dropout_rate=dropout_rate,
          training=training, seq_len=seq_len)
    return impl
  if training and dropout_rate > 0:
    return "einsum"
  if platform() == "tpu" and _splash_problem(seq_len) is None:
    return "splash"
  if platform() == "gpu" and _cudnn_problem(dtype, head_size) is None:
    return "cudnn"
  return "xla"


# ----------------------------------------------------------------------------- padding forms

def kv_lengths(mask: jax.Array) -> jax.Array:
  """[B,1,1,T] bool (True = real key) -> int32 [B] real lengths, at least 1 (cuDNN's form).

  Exact for right padding (a prefix of real tokens), which is what BERT inputs are.
  """
  return jnp.maximum(jnp.sum(mask[:, 0, 0, :], axis=-1, dtype=jnp.int32), 1)


def kv_segment_ids(mask: jax.Array) -> jax.Array:
  """[B,1,1,T] bool -> int32 [B,T] key segment ids: 1 real, 0 padding (splash's form).

  With every query in segment 1 a query attends exactly the real keys, whatever the
  mask's shape. Position 0 is always 1 so that no row is empty (an all-padding row
  would give the kernel a zero softmax denominator); a real sequence starts with
  [CLS] there anyway.
  """
  return jnp.asarray(mask[:, 0, 0, :], jnp.int32).at[:, 0].set(1)


# ----------------------------------------------------------------------------- kernels

def einsum_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                     dropout: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
  """q, k, v [B,T,N,D], mask [B,1,1,T] -> [B,T,N,D]: the paper's attention, spelled out.

  Logits and softmax are float32 also under bfloat16; `dropout` (if given) is applied
  to the probabilities, as google-research/bert does.
  """
  logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32)
  logits = logits / np.sqrt(q.shape[-1]).astype(np.float32)
  logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout is not None:
    probs = dropout(probs)
  return jnp.einsum("bnts,bsnd->btnd", probs.astype(v.dtype), v)


def xla_attention(q, k, v, mask) -> jax.Array:
  """jax.nn.dot_product_attention (XLA) with the boolean mask."""
  return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")


def cudnn_attention(q, k, v, mask) -> jax.Array:
  """cuDNN flash attention with the padding as key/value lengths."""
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=kv_lengths(mask),
                                      implementation="cudnn")


def _splash_block(seq_len: int) -> int:
  """Largest of 512/256/128 dividing the length (the kernel's key blocks are multiples of
  128 lanes, also in the interpreter; _splash_problem refuses other lengths)."""
  return next(b for b in (512, 256, 128) if seq_len % b == 0)


def _splash_kernel(num_heads: int, seq_len: int, interpret: bool, window: int | None = None):
  # Built afresh in every trace, not cached: the kernel holds its mask tables as jax
  # arrays, which inside a trace (nn.scan's layer body, jit) are that trace's values; a
  # kernel cached from one trace and called in another leaks them (UnexpectedTracerError
  # under scan_layers, found by compiling large for a TPU in bert_jax.preflight). The mask
  # processing itself is cached by Pallas on the NumPy side.
  # Imported here: Pallas's TPU ops are only needed where splash runs.
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # pylint: disable=g-import-not-at-top
  block = _splash_block(seq_len)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                            block_q_dq=block, block_kv_dq=block)
  one = (splash.FullMask((seq_len, seq_len)) if window is None
         else splash.LocalMask((seq_len, seq_len), (window, window), 0))
  mask = splash.MultiHeadMask([one] * num_heads)
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                interpret=interpret), splash.SegmentIds


def _splash_local(q, k, v, segments, q_segments=None, *, interpret: bool,
                  window: int | None = None) -> jax.Array:
  """Splash on one shard: q, k, v [b,T,n,D], key segments [b,T] (query segments [b,T]:
  all 1 by default) -> [b,T,n,D]; `window`: its local mask's half-width."""
  _, seq_len, heads, head_size = q.shape
  kernel, segment_ids = _splash_kernel(heads, seq_len, interpret, window)
  # The kernel takes no scale: fold 1/sqrt(D) into q (exact for D a power of 4).
  q = q * jnp.asarray(1 / np.sqrt(head_size), q.dtype)
  to_heads = lambda x: jnp.swapaxes(x, 1, 2)  # [b,T,n,D] -> [b,n,T,D]
  ids = segment_ids(q=jnp.ones_like(segments) if q_segments is None else q_segments,
                    kv=segments)
  out = jax.vmap(kernel)(to_heads(q), to_heads(k), to_heads(v), segment_ids=ids)
  return to_heads(out).astype(v.dtype)


def splash_attention(q, k, v, mask, *, interpret: bool | None = None) -> jax.Array:
  """The TPU splash kernel with the padding as segment ids; q, k, v [B,T,N,D].

  `interpret` runs the Pallas kernel in its interpreter (any backend, slow): the
  default is the interpreter everywhere but on TPUs, which is how the tests run it
  on CPU. Under a mesh (bert_jax.training.sharding.activate) the kernel runs per shard in
  shard_map, batch and heads split as the logical rules say: a Pallas call cannot
  be partitioned by GSPMD.
  """
  if interpret is None:
    interpret = jax.default_backend() != "tpu"
  local = functools.partial(_splash_local, interpret=interpret)
  segments = kv_segment_ids(mask)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return local(q, k, v, segments)
  spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
  qkv = jax.sharding.PartitionSpec(*spec)
  seg = jax.sharding.PartitionSpec(spec[0], None)
  return jax.shard_map(local, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv,
                       check_vma=False)(q, k, v, segments)


KERNELS = {"xla": xla_attention, "cudnn": cudnn_attention, "splash": splash_attention}


# ----------------------------------------------------------------------------- windows, documents

def dense_mask(key_real: jax.Array, *, window: int | None = None,
               documents: jax.Array | None = None) -> jax.Array:
  """[B,T] real keys -> the boolean mask einsum and xla take: [B,1,1,T] for padding alone,
  [B,1,T,T] with a sliding window (|i - j| <= window) or documents (same document only)."""
  mask = key_real[:, None, None, :]
  if window is not None:
    positions = jnp.arange(key_real.shape[1])
    mask = mask & (jnp.abs(positions[:, None] - positions[None, :]) <= window)[None, None]
  if documents is not None:
    mask = mask & (documents[:, :, None] == documents[:, None, :])[:, None]
  return mask


def blocked_local_attention(q, k, v, key_real: jax.Array, window: int,
                            documents: jax.Array | None = None) -> jax.Array:
  """Sliding-window attention at O(T x window) work: q, k, v [B,T,N,D] -> [B,T,N,D].

  The sequence is cut into blocks of `window` (the half-width) positions; a query of block
  i can only see keys of blocks i-1, i and i+1, so each block attends to those 3 x window
  keys under the band (|i - j| <= window), padding and document mask, instead of all T.
  The same attention as the dense mask's (tests/test_packed_attention.py), in float32.
  """
  b, t, n, d = q.shape
  size = window
  blocks = -(-t // size)
  pad = blocks * size - t
  grow = lambda x, value=0: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2),
                                    constant_values=value)
  positions = jnp.arange(blocks * size)
  real = grow(key_real, False)
  docs = grow(documents if documents is not None else jnp.zeros((b, t), jnp.int32), -1)
  # Keys of blocks i-1, i, i+1 beside block i's queries: one block of padding each side.
  def around(x, value):
    x = x.reshape((b, blocks, size) + x.shape[2:])
    x = jnp.pad(x, [(0, 0), (1, 1)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)  # [B, blocks, 3 size, ...]
  qb = grow(q).reshape(b, blocks, size, n, d)
  kb, vb = around(grow(k), 0), around(grow(v), 0)
  key_pos = around(jnp.broadcast_to(positions, (b, blocks * size)), -(2 * size + 1))
  key_ok = around(real, False)
  query_pos = positions.reshape(blocks, size)
  band = jnp.abs(query_pos[None, :, :, None] - key_pos[:, :, None, :]) <= window
  same_doc = docs.reshape(b, blocks, size)[..., :, None] == around(docs, -2)[:, :, None, :]
  mask = band & key_ok[:, :, None, :] & same_doc  # [B, blocks, size, 3 size]
  logits = jnp.einsum("bcqnd,bcknd->bcnqk", qb, kb, preferred_element_type=jnp.float32)
  logits = logits / np.sqrt(d).astype(np.float32)
  logits = jnp.where(mask[:, :, None], logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  out = jnp.einsum("bcnqk,bcknd->bcqnd", probs.astype(v.dtype), vb)
  return out.reshape(b, blocks * size, n, d)[:, :t]


def _splash_masked(q, k, v, key_real, window, documents) -> jax.Array:
  """splash_attention with a local mask and documents as segments (a key of another
  document, or padding, never matches a query's segment)."""
  interpret = jax.default_backend() != "tpu"
  q_segments = (jnp.ones(key_real.shape, jnp.int32) if documents is None
                else documents.astype(jnp.int32) + 1)
  kv_segments = jnp.where(key_real, q_segments, 0).at[:, 0].set(q_segments[:, 0])
  local = functools.partial(_splash_local, interpret=interpret, window=window)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return local(q, k, v, kv_segments, q_segments)
  spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
  qkv = jax.sharding.PartitionSpec(*spec)
  seg = jax.sharding.PartitionSpec(spec[0], None)
  return jax.shard_map(local, in_specs=(qkv, qkv, qkv, seg, seg), out_specs=qkv,
                       check_vma=False)(q, k, v, kv_segments, q_segments)


def attend_masked(impl: str, q, k, v, key_real: jax.Array, *, window: int | None = None,
                  documents: jax.Array | None = None,
                  dropout: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
  """Runs resolved implementation `impl` on [B,T] real keys, within a sliding window of
  half-width `window` (None: global) and inside each token's document (`documents` [B,T]
  ints, None: one per row): einsum and xla by a dense mask, splash by its local mask and
  segment ids, cudnn by its window and key lengths.

  Raises:
    ValueError: cudnn with documents (jax's cuDNN binding takes no segments).
  """
  if impl == "xla" and window is not None and key_real.shape[1] > 3 * window:
    # Far longer rows than the window: only the keys near each query (linear in T).
    return blocked_local_attention(q, k, v, key_real, window, documents)
  if impl in ("einsum", "xla"):
    mask = dense_mask(key_real, window=window, documents=documents)
    return einsum_attention(q, k, v, mask, dropout) if impl == "einsum" else xla_attention(
        q, k, v, mask)
  if impl == "splash":
    return _splash_masked(q, k, v, key_real, window, documents)
  if documents is not None:
    raise ValueError("config.model.attention_impl='cudnn' cannot keep packed documents apart "
                     "(jax's cuDNN attention takes no segment ids): use 'xla' or 'auto' for "
                     "packed rows")
  lengths = jnp.maximum(jnp.sum(key_real, axis=-1, dtype=jnp.int32), 1)
  return jax.nn.dot_product_attention(
      q, k, v, key_value_seq_lengths=lengths, implementation="cudnn",
      local_window_size=None if window is None else (window, window))


def attend(impl: str, q, k, v, mask, dropout: Callable[[jax.Array], jax.Array] | None = None):
  """Runs resolved implementation `impl`; `dropout` is used by einsum only (and must then be
  None for the fused kernels: resolve() refuses them when probabilities are dropped)."""
  if impl == "einsum":
    return einsum_attention(q, k, v, mask, dropout)
  return KERNELS[impl](q, k, v, mask)


def check_training(bert_config, seq_len: int) -> None:
  """check() for training `bert_config` (a bert_jax.model.encoder.BertConfig) on `seq_len` tokens:
  what the trainers call before anything is written."""
  check(bert_config.attention_impl, dtype=bert_config.compute_dtype,
        head_size=bert_config.head_size, dropout_rate=bert_config.attention_probs_dropout_prob,
        training=True, seq_len=seq_len)
