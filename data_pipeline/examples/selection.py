"""Which positions masked-LM masking predicts and corrupts: token, whole-word and span units.

data_pipeline.examples.masking.mask_tokens draws the scores and the budget and hands them here;
`select` returns the predicted and corrupted positions and each position's
mask/random/keep draw, and masking.mask_tokens corrupts them in one step. A new unit
of masking (a new way to choose positions) is a function here, a MaskingSpec field
(data_pipeline.examples.masking_spec, which also answers what a setting means: its expected
predictions and its description) and a config field (experiments/configs/data.py).

Every op is stateless TensorFlow on one example (it runs inside tf.data's map).
"""

import dataclasses
from typing import Callable

from data_pipeline.examples import masking_spec
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it


@dataclasses.dataclass
class Selection:
  """One example's choice: [T] tensors."""
  predicted: tf.Tensor  # bool: positions with a masked_lm_* slot
  corrupted: tf.Tensor  # bool: positions mask/random/keep applies to
  decision: tf.Tensor   # float32 in [0, 1): the mask/random/keep draw of each position


@dataclasses.dataclass
class Budget:
  """How many tokens an example predicts: the count and its checks (mask_tokens makes it)."""
  tokens: tf.Tensor                          # int32: the most tokens to choose
  fixed_count: Callable[[tf.Tensor], tf.Tensor]  # rate -> round(rate * maskable), at least 1
  fits: Callable[[tf.Tensor], tf.Tensor]     # a count, checked against the static P


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


def select(spec: masking_spec.MaskingSpec, maskable, word_starts, scores, seeds, ratio32,
           budget: Budget, length) -> Selection:
  """The predicted and corrupted positions of one example, by spec's unit.

  Args:
    spec: the MaskingSpec.
    maskable: [T] bool; word_starts: [T] bool (whole-word and span units only).
    scores: [T] float32 in [0, 1), independent of the ratio: lower is chosen first.
    seeds: the example's six stateless seeds (mask_tokens splits them).
    ratio32: this example's ratio, float32.
    budget: the count (Budget).
    length: T, int32 scalar.
  """
  if not (spec.whole_word or spec.span):
    return _tokens(spec, maskable, scores, seeds, ratio32, budget, length)
  return _units(spec, maskable, word_starts, scores, seeds, ratio32, budget.tokens, length)


def _tokens(spec, maskable, scores, seeds, ratio32, budget: Budget, length) -> Selection:
  """Token level (the hot path): the `budget` lowest-scoring candidates, no loop."""
  candidates = maskable
  if spec.strategy == "bernoulli":
    candidates &= scores < ratio32
  ranked = candidates  # ranked by score; with predict_ratio the larger of the two sets
  count = budget.tokens
  if spec.predict_ratio:
    # One ranking, two budgets: the corrupted set is the ratio's own selection and the
    # predicted set the predict_ratio share of the same scores, so the smaller of the two
    # is the lowest-scoring part of the larger (a uniformly random subset of it).
    predict = tf.constant(spec.predict_ratio, tf.float64)
    corrupt_candidates, corrupt_budget = candidates, count
    if spec.strategy == "bernoulli":
      candidates = maskable & (scores < tf.cast(predict, tf.float32))
      if spec.predict_ratio < spec.ratio:
        corrupt_budget = length  # a corrupted token takes no prediction slot: no cap
    else:
      count = budget.fits(budget.fixed_count(predict))
    ranked = corrupt_candidates if spec.predict_ratio < spec.ratio else candidates
  rank = tf.math.invert_permutation(
      tf.argsort(tf.where(ranked, scores, 2.0), stable=True))
  predicted = candidates & (rank < count)
  # Without predict_ratio the predicted tokens are the corrupted ones.
  corrupted = corrupt_candidates & (rank < corrupt_budget) if spec.predict_ratio else predicted
  return Selection(predicted, corrupted, tf.random.stateless_uniform([length], seeds[2]))


def _units(spec, maskable, word_starts, scores, seeds, ratio32, budget, length) -> Selection:
  """Whole words or SpanBERT spans: units chosen whole, one mask/random/keep draw each."""
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
  predicted = tf.gather(chosen_units, unit_id) & maskable
  # One mask/random/keep draw per word or span.
  decision = tf.gather(tf.random.stateless_uniform([length], seeds[2]), decision_group)
  return Selection(predicted, predicted, decision)
