"""One dropout-mask stream for two Flax models: the same masks, call for call.

For the fine-tuning comparison's step-by-step check (finetune_sides.same_start_logits
with same_masks). Our encoder draws its masks through flax's Dropout, transformers' Flax
BERT through Dropout and, for attention, flax's dot_product_attention_weights; each
module's key is folded with its own path, so two models given one key draw different
masks. Inside `common_masks`, both flax functions draw from one stream instead: a
forward pass's i-th mask is bernoulli(fold_in(root, i)), root being the "dropout" key the
step passed to `apply`. Two trainings given the same roots then drop exactly the same
units, and whatever still separates them is their arithmetic, not their random draws.

Only for this check: it replaces a module attribute of flax's and reads flax's module
stack, which no shipped code may rely on.
"""

import contextlib
import types

import jax
from flax.linen import attention as flax_attention
from flax.linen import module as flax_module
from flax.linen import stochastic as flax_stochastic


class Stream:
  """The masks of each traced forward pass, drawn from its root key in call order.

  length: the model's sequence length. Our encoder's last layer computes only the [CLS]
  row for a classifier (BertEncoder's first_only), so its masks there have 1 where the
  reference's have `length` rows; both draw the full mask and keep its first row, so that
  row's units are dropped alike on both sides.
  """

  def __init__(self, length: int):
    self.length = length
    self.root = None
    self.index = 0
    self.shapes: list[list[tuple[int, ...]]] = []  # per traced forward pass, per mask

  def bernoulli(self, key, p=0.5, shape=None):
    """jax.random.bernoulli's signature; `key` (the calling module's own) is not used."""
    del key
    module = flax_module._context.module_stack[-1]  # pylint: disable=protected-access
    root = module.scope.rngs["dropout"].rng  # the key given to apply, before any fold
    if root is not self.root:  # a new trace: its masks count from 0 again
      self.root, self.index = root, 0
      self.shapes.append([])
    shape = tuple(shape)
    full = shape
    if len(shape) >= 3 and shape[-2] == 1 and self.length > 1:
      full = shape[:-2] + (self.length, shape[-1])
    keep = jax.random.bernoulli(jax.random.fold_in(root, self.index), p, full)
    self.shapes[-1].append(full)
    self.index += 1
    return keep[..., :1, :] if full != shape else keep


@contextlib.contextmanager
def common_masks(stream: Stream | None):
  """While entered, every flax dropout mask comes from `stream` (None: flax's own draws,
  untouched). Only programs traced inside it draw so: trace both sides' steps in it."""
  if stream is None:
    yield
    return
  shim = types.SimpleNamespace(**{name: getattr(jax.random, name) for name in dir(jax.random)
                                  if not name.startswith("_")})
  shim.bernoulli = stream.bernoulli
  saved = flax_stochastic.random, flax_attention.random
  flax_stochastic.random = flax_attention.random = shim
  try:
    yield
  finally:
    flax_stochastic.random, flax_attention.random = saved
