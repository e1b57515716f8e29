"""Dropout whose keep mask XLA computes apart from the values it masks.

The draw is flax's nn.Dropout's: the same rng (this class is also named Dropout, so its
modules are Dropout_0, Dropout_1, ... as before and make_rng gives the same keys), the
same bernoulli, the same scaling. Only the mask passes through
jax.lax.optimization_barrier before it is used.

Why: without the barrier, XLA:TPU fuses threefry's hash of the mask (some 150 u32 ops
per element) into the matmul and LayerNorm fusions that consume it. libtpu lowers those
fusions only after retries (up to 6 each): BERT-Base's step for a v6e-8 compiled in
105 s at 128 tokens instead of 37, and 87 s at 512 instead of 57, with the same memory
(experiments/results/preflight.md). The mask is then a tensor of its own, one byte an
element, where XLA had recomputed it inside each fusion that used it.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp


class Dropout(nn.Dropout):
  """nn.Dropout with the keep mask behind an optimization barrier (see the module doc)."""

  @nn.compact
  def __call__(self, inputs, deterministic: bool | None = None, rng=None):
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:  # as flax: no division by a zero keep probability
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    if rng is None:
      rng = self.make_rng(self.rng_collection)
    shape = list(inputs.shape)
    for dim in self.broadcast_dims:
      shape[dim] = 1
    keep = jax.lax.optimization_barrier(jax.random.bernoulli(rng, p=keep_prob, shape=shape))
    return jax.lax.select(jnp.broadcast_to(keep, inputs.shape), inputs / keep_prob,
                          jnp.zeros_like(inputs))
