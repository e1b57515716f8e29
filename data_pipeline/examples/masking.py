"""Masked-LM masking ops for the tf.data pretraining pipeline.

`mask_tokens` masks ONE example with pure, stateless TensorFlow ops, so it runs
inside `tf.data.Dataset.map`, in eager mode and under `tf.function` with
identical results for the same seed. The knobs (ratio, fixed vs Bernoulli
count, mask/random/keep split, whole-word and span masking) are independent so
that objective ablations change exactly one thing.

Ratio schedules: `MaskingSpec.schedule` "linear", "cosine" or "polynomial"
moves the ratio from `ratio` at step 0 to `final_ratio` at the run's last step;
"warmup_decay" rises from `final_ratio` to `ratio` first (Yang et al. 2023,
"Learning Better Masking for Better Language Model Pre-training": masking ratio
decay, e.g. linear from 2p towards ~0).

Corruption apart from prediction (Wettig et al. 2023, section 5: corrupt at
m_corr = `ratio`, predict at m_pred = `predict_ratio`): both sets are the
lowest-scoring shares of one draw of scores, so the smaller is a subset of the
larger. `predict_ratio` > `ratio` predicts the corrupted tokens plus uncorrupted
ones; `predict_ratio` < `ratio` corrupts the `ratio` share and predicts only its
lowest-scoring `predict_ratio` share, a uniformly random subset of the corrupted
tokens (the rest are corrupted and not predicted). Either way the corrupted set is
exactly what plain masking at `ratio` with the same seed corrupts, and
mask/random/keep applies to it. `uncorrupted_fraction()` is the expected share
of predictions whose input is unchanged. `ratio_at(step, total_steps)` is the one definition; the
pipeline passes each example's ratio to `mask_tokens`, and the static number of
predictions covers the schedule's largest ratio.

Seeds: derive one per example with `example_seed(base_seed, epoch, index)`.
Every random draw inside `mask_tokens` is a function of that seed only, and the
selection scores do not depend on the ratio, so for token-level masking the
positions chosen at a lower ratio are a subset of those chosen at a higher one
(same seed): ratio ablations differ in how much is masked, not in which noise.

The work is cut in three: the budget (how many tokens: the count strategy, here),
the selection (which positions are predicted and which corrupted, by unit:
data_pipeline.examples.selection) and one corruption step (mask/random/keep, here).
Selection is done on *units*: a unit is a token, or with whole-word / span
masking a word (its first piece plus the following continuation pieces).
Special tokens ([CLS], [SEP], [PAD], given by `maskable=False`) are always
units of their own and are never eligible, and a word never straddles one.

Choices worth knowing (they differ slightly from google-research/bert):
- The "fixed" count is round(ratio * maskable tokens) (Python's half-to-even
  round), at least 1; google-research counts [CLS]/[SEP] too.
- Whole words are taken in random order, skipping any word that would overflow
  the count, exactly like google-research's loop; so a sequence can end a few
  tokens short (or empty, if its only word is longer than the count).
- Random replacements exclude the special ids and [MASK] (google-research
  draws from the whole vocabulary, specials included); [unusedN] ids stay in,
  as this module never sees the vocabulary text.
- Span masking always works on whole words and has one mask/random/keep
  decision per span (SpanBERT); spans hitting each other merge into one run.
- CPU cost per example (measured single-threaded, T=128 / 512): ~0.2 ms
  token-level (no loop), ~0.4 ms whole-word, ~0.5 / 1 ms span at ratio 0.15;
  span masking loops once per span, so at T=512 and ratio 0.6 it costs ~3 ms.
"""

import dataclasses
import numbers
from typing import Sequence

import numpy as np

from data_pipeline.examples import masking_spec
from data_pipeline.examples import selection
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it


def example_seed(base_seed, epoch, index) -> tf.Tensor:
  """The stateless [2] int seed of one example: a function of (base_seed, epoch, index) only.

  Folding rather than adding keeps (epoch, index) pairs from colliding, and
  the result does not depend on the masking ratio or on any other example.
  """
  seed = tf.stack([tf.cast(base_seed, tf.int64), tf.constant(0, tf.int64)])
  seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(epoch, tf.int64))
  return tf.random.experimental.stateless_fold_in(seed, tf.cast(index, tf.int64))


def mask_tokens(input_ids, maskable, word_starts, seed, spec: masking_spec.MaskingSpec, *,
                mask_id: int, vocab_size: int, special_ids: Sequence[int],
                max_predictions: int, ratio=None) -> dict:
  """Masks one example for masked-LM training (graph-compatible, stateless).

  Args:
    input_ids: [T] int token ids (cast to int32).
    maskable: [T] bool, False for [CLS], [SEP], [PAD] and anything else that
      must never be predicted.
    word_starts: [T] bool, True on the first piece of each word (False on
      "##" continuations); required with whole_word or span, else ignored and
      may be None. A maskable piece right after an unmaskable token always
      starts a word.
    seed: [2] int32/int64 stateless seed, e.g. from `example_seed`.
    spec: the MaskingSpec.
    mask_id: id of [MASK].
    vocab_size: number of ids; random replacements are drawn uniformly from
      [0, vocab_size) minus `special_ids` and `mask_id` ([unusedN] ids are
      kept: like google-research/bert we do not inspect the vocab text).
    special_ids: ids never used as random replacements ([PAD], [UNK], [CLS],
      [SEP], [MASK], ...).
    max_predictions: static P; pass `spec.max_predictions(max_seq_length)`.
    ratio: this example's ratio (a float64 scalar, may be a tensor), e.g.
      `spec.ratio_at(step, total_steps)` under a schedule; None -> spec.ratio
      (a constant schedule). P must hold it: it is at most spec.max_ratio.

  Returns:
    dict with input_ids [T] int32 (masked), masked_lm_positions [P] int32
    (ascending, padded with 0), masked_lm_ids [P] int32 (original ids, padded
    with 0), masked_lm_weights [P] float32 (1.0 real, 0.0 padding).

  Raises:
    ValueError: inconsistent ids, missing word_starts, or a static T for which
      max_predictions is too small (checked when T is known at trace time).
  """
  excluded = _check_arguments(input_ids, word_starts, spec, mask_id=mask_id,
                              vocab_size=vocab_size, special_ids=special_ids,
                              max_predictions=max_predictions)
  max_predictions = int(max_predictions)
  input_ids = tf.cast(input_ids, tf.int32)
  maskable = tf.cast(maskable, tf.bool)
  length = tf.shape(input_ids)[0]
  seeds = tf.random.experimental.stateless_split(seed, 6)
  # float64 for the count (exactly Python's round(ratio * n)); the per-token draws
  # are float32, and float32(ratio) is what comparing them with a Python float gives.
  ratio = tf.constant(spec.ratio, tf.float64) if ratio is None else tf.cast(ratio, tf.float64)
  ratio32 = tf.cast(ratio, tf.float32)
  # Independent of the ratio, so token-level masks at different ratios are nested.
  scores = tf.random.stateless_uniform([length], seeds[0])
  budget = _budget(spec, maskable, seeds, ratio, ratio32, length, max_predictions,
                   static=_static_length(input_ids) is not None)
  chosen = selection.select(spec, maskable, word_starts, scores, seeds, ratio32, budget, length)
  return _corrupt(input_ids, chosen, spec, seeds[3], mask_id=mask_id, vocab_size=vocab_size,
                  excluded=excluded, max_predictions=max_predictions)


def _static_length(input_ids):
  return tf.TensorShape(input_ids.shape)[0] if hasattr(input_ids, "shape") else None


def _check_arguments(input_ids, word_starts, spec, *, mask_id, vocab_size, special_ids,
                     max_predictions) -> list[int]:
  """mask_tokens' argument checks (ValueError); the ids random replacement excludes."""
  excluded = sorted(set(int(i) for i in special_ids) | {int(mask_id)})
  if not 0 <= mask_id < vocab_size:
    raise ValueError(f"mask_id {mask_id} is outside the vocabulary [0, {vocab_size})")
  if excluded[0] < 0 or excluded[-1] >= vocab_size:
    raise ValueError(f"special_ids {list(special_ids)} fall outside [0, {vocab_size})")
  if len(excluded) >= vocab_size:
    raise ValueError("special_ids leave no id for random replacement")
  if isinstance(max_predictions, bool) \
      or not isinstance(max_predictions, numbers.Integral) or max_predictions < 1:
    raise ValueError(f"max_predictions must be a positive int, got {max_predictions!r}")
  if (spec.whole_word or spec.span) and word_starts is None:
    raise ValueError("word_starts is required for whole_word or span masking")
  static_length = _static_length(input_ids)
  if static_length is not None:
    # Raises ValueError naming max_predictions_per_seq if P cannot hold a draw.
    dataclasses.replace(spec, max_predictions_per_seq=int(max_predictions)
                        ).max_predictions(int(static_length))
  return excluded


def _budget(spec, maskable, seeds, ratio, ratio32, length, max_predictions, *,
            static: bool) -> selection.Budget:
  """The count strategy: how many tokens this example predicts (selection.Budget)."""
  num_maskable = tf.reduce_sum(tf.cast(maskable, tf.int32))

  def fixed_count(rate):
    # float64 and half-to-even rounding, exactly Python's round(rate * n); at least 1.
    count = tf.cast(tf.math.round(tf.cast(num_maskable, tf.float64) * rate), tf.int32)
    return tf.where(num_maskable > 0, tf.maximum(count, 1), 0)

  def fits(count):
    if static:
      return count
    # A dynamic T longer than the one P was derived for: fail, never truncate.
    check = tf.debugging.assert_less_equal(
        count, max_predictions,
        message="masking: max_predictions too small for this sequence length")
    with tf.control_dependencies([check]):
      return tf.identity(count)

  if spec.strategy == "fixed":
    tokens = fixed_count(ratio)
    if not spec.predict_ratio:  # else the predicted count, set in selection, takes the slots
      tokens = fits(tokens)
  elif spec.span:
    # A Binomial(num_maskable, ratio) token budget, filled with spans.
    token_draws = tf.random.stateless_uniform([length], seeds[5])
    tokens = tf.reduce_sum(tf.cast(maskable & (token_draws < ratio32), tf.int32))
    tokens = tf.minimum(tokens, max_predictions)
  else:
    tokens = tf.constant(max_predictions, tf.int32)
  return selection.Budget(tokens, fixed_count, fits)


def _corrupt(input_ids, chosen: selection.Selection, spec, seed, *, mask_id, vocab_size,
             excluded, max_predictions) -> dict:
  """The one corruption step: mask/random/keep on the corrupted positions, and the
  masked_lm_* features of the predicted ones."""
  # mask/random/keep applies to the corrupted tokens: with predict_ratio above ratio a part of
  # the predicted ones (the rest are predicted from their own input), below it more than them.
  length = tf.shape(input_ids)[0]
  changed, decision = chosen.corrupted, chosen.decision
  to_mask = changed & (decision < spec.mask_prob)
  to_random = changed & ~to_mask & (decision < spec.mask_prob + spec.random_prob)
  # Uniform over the allowed ids: a uniform rank among them, looked up in a table.
  allowed = tf.constant(np.setdiff1d(np.arange(vocab_size, dtype=np.int32), excluded))
  random_ids = tf.gather(allowed, tf.random.stateless_uniform(
      [length], seed, minval=0, maxval=vocab_size - len(excluded), dtype=tf.int32))
  masked_ids = tf.where(to_mask, mask_id, tf.where(to_random, random_ids, input_ids))

  positions = tf.cast(tf.where(chosen.predicted)[:, 0], tf.int32)
  num = tf.shape(positions)[0]
  padding = [[0, max_predictions - num]]
  return {
      "input_ids": masked_ids,
      "masked_lm_positions": tf.ensure_shape(tf.pad(positions, padding), [max_predictions]),
      "masked_lm_ids": tf.ensure_shape(
          tf.pad(tf.gather(input_ids, positions), padding), [max_predictions]),
      "masked_lm_weights": tf.cast(tf.range(max_predictions) < num, tf.float32),
  }
