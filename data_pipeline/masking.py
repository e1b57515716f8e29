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
from data_pipeline import masking_spec
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

def example_seed(base_seed, epoch, index) -> tf.Tensor:
  """The stateless [2] int seed of one example: a function of (base_seed, epoch, index) only.

  Folding rather than adding keeps (epoch, index) pairs from colliding, and
  the result does not depend on the masking ratio or on any other example.
  """
  seed = tf.stack([tf.cast(base_seed, tf.int64), tf.constant(0, tf.int64)])
  seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(epoch, tf.int64))
  return tf.random.experimental.stateless_fold_in(seed, tf.cast(index, tf.int64))


def span_length_probs(spec: masking_spec.MaskingSpec) -> list:
  """P(span length = 1..max_span_length words): geometric, truncated and renormalised."""
  p = spec.span_geometric_p
  weights = [p * (1.0 - p) ** (n - 1) for n in range(1, spec.max_span_length + 1)]
  return [w / sum(weights) for w in weights]


def sample_span_lengths(seed, num: int, spec: masking_spec.MaskingSpec) -> tf.Tensor:
  """`num` span lengths in words, int32, drawn from `span_length_probs(spec)`."""
  logits = tf.math.log(tf.constant([span_length_probs(spec)], tf.float32))
  draws = tf.random.stateless_categorical(logits, num, seed, dtype=tf.int32)
  return draws[0] + 1


def _greedy_fill(lengths, candidates, scores, budget):
  """Chooses units in ascending score order, skipping any that would overflow `budget`.

  This is google-research/bert's whole-word loop (take the next unit unless it
  would exceed the budget, then carry on) made vectorised: each pass takes the
  longest prefix that fits, drops the first unit that does not (it can never
  fit later, the budget only shrinks), and repeats. With unit length 1 it ends
  after one pass; otherwise after a few.

  Args:
    lengths: [T] int32 tokens per unit.
    candidates: [T] bool units that may be chosen.
    scores: [T] float32 in [0, 1); lower is chosen first.
    budget: int32 scalar, the most tokens to choose.

  Returns:
    [T] bool, the chosen units.
  """
  size = tf.shape(lengths)[0]
  order = tf.argsort(tf.where(candidates, scores, 2.0), stable=True)
  sorted_lengths = tf.gather(lengths, order)
  rank = tf.range(size)

  def body(taken, alive, budget):
    fits = alive & (sorted_lengths <= budget)
    cumulative = tf.cumsum(tf.where(fits, sorted_lengths, 0))
    take = fits & (cumulative <= budget)
    over = fits & (cumulative > budget)
    first_over = tf.where(tf.reduce_any(over),
                          tf.argmax(tf.cast(over, tf.int32), output_type=tf.int32),
                          size)
    budget -= tf.reduce_sum(tf.where(take, sorted_lengths, 0))
    return taken | take, fits & (rank > first_over), budget

  taken, _, _ = tf.while_loop(
      lambda taken, alive, budget: tf.reduce_any(alive), body,
      (tf.zeros([size], tf.bool), tf.gather(candidates, order), budget))
  return tf.gather(taken, tf.math.invert_permutation(order))


def _span_fill(lengths, eligible, scores, span_lengths, budget):
  """SpanBERT: spans of whole units from random anchors until `budget` tokens.

  Each anchor is the lowest-scoring unit not yet chosen: SpanBERT redraws an
  anchor that is already masked, which is the same as drawing uniformly among
  the unmasked ones, and this way no loop iteration is wasted. A span covers
  the anchor and the following units, stopping at an ineligible unit ([SEP])
  and at the first unit that would overflow the budget, so the count never
  exceeds it; an anchor that does not fit is never tried again (the budget
  only shrinks). Overlapping spans merge into one longer run.

  Returns:
    ([T] bool chosen units, [T] int32 span index of each chosen unit).
  """
  size = tf.shape(lengths)[0]
  unit = tf.range(size)
  # Units with the same count of ineligible units before them share a run
  # between specials; a span must stay inside its anchor's run.
  run = tf.cumsum(tf.cast(~eligible, tf.int32))

  def body(i, chosen, dead, span_of, count):
    anchor = tf.argmin(tf.where(chosen | dead, 2.0, scores), output_type=tf.int32)
    new = ((unit >= anchor) & (unit < anchor + span_lengths[i])
           & (run == run[anchor]) & ~chosen)
    cumulative = tf.cumsum(tf.where(new, lengths, 0))
    add = new & (cumulative <= budget - count)
    count += tf.reduce_sum(tf.where(add, lengths, 0))
    return (i + 1, chosen | add, dead | (unit == anchor), tf.where(add, i, span_of),
            count)

  def cond(i, chosen, dead, span_of, count):
    return (count < budget) & tf.reduce_any(~(chosen | dead))

  _, chosen, _, span_of, _ = tf.while_loop(
      cond, body, (0, tf.zeros([size], tf.bool), ~eligible,
                   tf.zeros([size], tf.int32), 0))
  return chosen, span_of


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
  max_predictions = int(max_predictions)
  if (spec.whole_word or spec.span) and word_starts is None:
    raise ValueError("word_starts is required for whole_word or span masking")
  static_length = tf.TensorShape(input_ids.shape)[0] if hasattr(input_ids, "shape") else None
  if static_length is not None:
    # Raises ValueError naming max_predictions_per_seq if P cannot hold a draw.
    dataclasses.replace(spec, max_predictions_per_seq=int(max_predictions)
                        ).max_predictions(int(static_length))

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
  num_maskable = tf.reduce_sum(tf.cast(maskable, tf.int32))

  def fixed_count(rate):
    # float64 and half-to-even rounding, exactly Python's round(rate * n); at least 1.
    count = tf.cast(tf.math.round(tf.cast(num_maskable, tf.float64) * rate), tf.int32)
    return tf.where(num_maskable > 0, tf.maximum(count, 1), 0)

  def fits(count):
    if static_length is not None:
      return count
    # A dynamic T longer than the one P was derived for: fail, never truncate.
    check = tf.debugging.assert_less_equal(
        count, max_predictions,
        message="masking: max_predictions too small for this sequence length")
    with tf.control_dependencies([check]):
      return tf.identity(count)

  if spec.strategy == "fixed":
    budget = fixed_count(ratio)
    if not spec.predict_ratio:  # else the predicted count, set below, takes the slots
      budget = fits(budget)
  elif spec.span:
    # A Binomial(num_maskable, ratio) token budget, filled with spans.
    token_draws = tf.random.stateless_uniform([length], seeds[5])
    budget = tf.reduce_sum(tf.cast(maskable & (token_draws < ratio32), tf.int32))
    budget = tf.minimum(budget, max_predictions)
  else:
    budget = tf.constant(max_predictions, tf.int32)

  corrupted = None  # None: the predicted tokens are the corrupted ones (predict_ratio 0)
  if not (spec.whole_word or spec.span):
    # Token level (the hot path): the `budget` lowest-scoring candidates, no loop.
    candidates = maskable
    if spec.strategy == "bernoulli":
      candidates &= scores < ratio32
    ranked = candidates  # ranked by score; with predict_ratio the larger of the two sets
    if spec.predict_ratio:
      # One ranking, two budgets: the corrupted set is the ratio's own selection and the
      # predicted set the predict_ratio share of the same scores, so the smaller of the two
      # is the lowest-scoring part of the larger (a uniformly random subset of it).
      predict = tf.constant(spec.predict_ratio, tf.float64)
      corrupt_candidates, corrupt_budget = candidates, budget
      if spec.strategy == "bernoulli":
        candidates = maskable & (scores < tf.cast(predict, tf.float32))
        if spec.predict_ratio < spec.ratio:
          corrupt_budget = length  # a corrupted token takes no prediction slot: no cap
      else:
        budget = fits(fixed_count(predict))
      ranked = corrupt_candidates if spec.predict_ratio < spec.ratio else candidates
    rank = tf.math.invert_permutation(
        tf.argsort(tf.where(ranked, scores, 2.0), stable=True))
    selected = candidates & (rank < budget)
    if spec.predict_ratio:
      corrupted = corrupt_candidates & (rank < corrupt_budget)
    decision = tf.random.stateless_uniform([length], seeds[2])
  else:
    # Units: every maskable word start, every unmaskable token, and any maskable
    # token after an unmaskable one (a truncated segment may begin with "##").
    after_special = tf.concat([[True], ~maskable[:-1]], axis=0)
    unit_start = tf.cast(word_starts, tf.bool) | ~maskable | after_special
    unit_id = tf.cumsum(tf.cast(unit_start, tf.int32)) - 1
    unit_length = tf.math.unsorted_segment_sum(tf.ones([length], tf.int32), unit_id, length)
    unit_eligible = tf.math.unsorted_segment_max(
        tf.cast(maskable, tf.int32), unit_id, length) > 0
    if spec.span:
      span_lengths = sample_span_lengths(seeds[1], length, spec)
      chosen_units, span_of = _span_fill(unit_length, unit_eligible, scores,
                                         span_lengths, budget)
      decision_group = tf.gather(span_of, unit_id)
    else:
      candidates = unit_eligible
      if spec.strategy == "bernoulli":
        candidates &= scores < ratio32
      chosen_units = _greedy_fill(unit_length, candidates, scores, budget)
      decision_group = unit_id
    selected = tf.gather(chosen_units, unit_id) & maskable
    # One mask/random/keep draw per word or span.
    decision = tf.gather(tf.random.stateless_uniform([length], seeds[2]), decision_group)

  # mask/random/keep applies to the corrupted tokens: with predict_ratio above ratio a part of
  # the predicted ones (the rest are predicted from their own input), below it more than them.
  changed = selected if corrupted is None else corrupted
  to_mask = changed & (decision < spec.mask_prob)
  to_random = changed & ~to_mask & (decision < spec.mask_prob + spec.random_prob)
  # Uniform over the allowed ids: a uniform rank among them, looked up in a table.
  allowed = tf.constant(np.setdiff1d(np.arange(vocab_size, dtype=np.int32), excluded))
  random_ids = tf.gather(allowed, tf.random.stateless_uniform(
      [length], seeds[3], minval=0, maxval=vocab_size - len(excluded), dtype=tf.int32))
  masked_ids = tf.where(to_mask, mask_id, tf.where(to_random, random_ids, input_ids))

  positions = tf.cast(tf.where(selected)[:, 0], tf.int32)
  num = tf.shape(positions)[0]
  padding = [[0, max_predictions - num]]
  return {
      "input_ids": masked_ids,
      "masked_lm_positions": tf.ensure_shape(tf.pad(positions, padding), [max_predictions]),
      "masked_lm_ids": tf.ensure_shape(
          tf.pad(tf.gather(input_ids, positions), padding), [max_predictions]),
      "masked_lm_weights": tf.cast(tf.range(max_predictions) < num, tf.float32),
  }
