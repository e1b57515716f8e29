"""Statistical and structural tests of data_pipeline/examples/masking.py.

Each statistical check maps `mask_tokens` over a few thousand synthetic
[CLS] A [SEP] B [SEP] [PAD]... sequences with BERT's vocabulary size, with fixed
seeds, and compares against numbers computed here independently (Python's
round, binomial standard deviations, scipy distributions). Tolerances are 4
binomial standard deviations.
"""

import hashlib
import math

import ml_collections
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from data_pipeline.examples import masking
from data_pipeline.examples import masking_spec
from data_pipeline.examples import selection

VOCAB = 30522
PAD, UNK, CLS, SEP, MASK = 0, 100, 101, 102, 103
SPECIALS = [PAD, UNK, CLS, SEP, MASK]
ALLOWED = VOCAB - len(SPECIALS)
LENGTH = 128
NUM = 1500
SIGMAS = 4.0


def _synthetic(num=NUM, length=LENGTH, low=999, high=VOCAB, seed=0):
  """Sequences, maskable flags and word starts (about 30% '##' continuation pieces)."""
  rng = np.random.default_rng(seed)
  ids = np.zeros([num, length], np.int32)
  maskable = np.zeros([num, length], bool)
  for n in range(num):
    len_a = rng.integers(5, 70)
    len_b = rng.integers(5, length - 3 - len_a + 1)
    ids[n, 0] = CLS
    ids[n, 1:1 + len_a] = rng.integers(low, high, len_a)
    ids[n, 1 + len_a] = SEP
    ids[n, 2 + len_a:2 + len_a + len_b] = rng.integers(low, high, len_b)
    ids[n, 2 + len_a + len_b] = SEP
    maskable[n, 1:1 + len_a] = True
    maskable[n, 2 + len_a:2 + len_a + len_b] = True
  word_starts = rng.random([num, length]) < 0.7
  word_starts[:, 1:] |= ~maskable[:, :-1]  # a segment starts with a word
  return ids, maskable, word_starts


DATA = _synthetic()


_CACHE = {}


def _run(spec, data=None, base_seed=0, vocab_size=VOCAB, special_ids=SPECIALS,
         mask_id=MASK):
  """mask_tokens over every sequence inside tf.data; returns numpy arrays.

  Runs on the default DATA are memoised: several tests read the same masks.
  """
  if data is None:
    key = (spec, base_seed, vocab_size, tuple(special_ids), mask_id)
    if key not in _CACHE:
      _CACHE[key] = _run(spec, DATA, base_seed, vocab_size, special_ids, mask_id)
    return _CACHE[key]
  ids, maskable, word_starts = data
  max_predictions = spec.max_predictions(ids.shape[1])

  def fn(index, ids, maskable, word_starts):
    return masking.mask_tokens(
        ids, maskable, word_starts, masking.example_seed(base_seed, 0, index),
        spec, mask_id=mask_id, vocab_size=vocab_size, special_ids=special_ids,
        max_predictions=max_predictions)

  dataset = tf.data.Dataset.from_tensor_slices(
      (tf.range(len(ids), dtype=tf.int64), ids, maskable, word_starts))
  dataset = dataset.map(fn, num_parallel_calls=2, deterministic=True)
  out = next(iter(dataset.batch(len(ids))))
  out = {k: v.numpy() for k, v in out.items()}
  # Corrupted, not predicted: only with predict_ratio below the ratio (Wettig et al.'s m_pred).
  _check_invariants(out, data, max_predictions,
                    unpredicted_change=0 < spec.predict_ratio < spec.ratio)
  return out


def _selected(out, shape):
  """[N, T] bool of predicted positions, from positions and weights."""
  selected = np.zeros(shape, bool)
  rows, slots = np.nonzero(out["masked_lm_weights"])
  selected[rows, out["masked_lm_positions"][rows, slots]] = True
  return selected


def _check_invariants(out, data, max_predictions, unpredicted_change=False):
  """Layout rules that hold for every spec: run on every output of `_run`; a token that is not
  predicted is left as it was unless `unpredicted_change`."""
  ids, maskable, _ = data
  positions = out["masked_lm_positions"]
  weights = out["masked_lm_weights"]
  assert positions.shape == (len(ids), max_predictions)
  assert out["masked_lm_ids"].dtype == np.int32 and positions.dtype == np.int32
  assert weights.dtype == np.float32 and set(np.unique(weights)) <= {0.0, 1.0}
  counts = weights.sum(1).astype(int)
  # Weights are a prefix of ones; padding slots hold position 0 and id 0.
  np.testing.assert_array_equal(weights, np.arange(max_predictions) < counts[:, None])
  assert not positions[weights == 0].any() and not out["masked_lm_ids"][weights == 0].any()
  steps = np.diff(positions, axis=1)[weights[:, 1:] > 0]
  assert (steps > 0).all(), "positions not strictly ascending"
  selected = _selected(out, ids.shape)
  assert (selected.sum(1) == counts).all()
  assert not (selected & ~maskable).any(), "a special or padding token was masked"
  rows = np.nonzero(weights)[0]
  np.testing.assert_array_equal(out["masked_lm_ids"][weights > 0],
                                ids[rows, positions[weights > 0]])
  if not unpredicted_change:
    np.testing.assert_array_equal(out["input_ids"][~selected], ids[~selected])
  assert not (out["input_ids"] != ids)[~maskable].any(), "a special or padding token was changed"


def _within(observed_count, total, p, what):
  """Asserts observed_count / total is within SIGMAS binomial std of p."""
  std = math.sqrt(p * (1 - p) / total)
  fraction = observed_count / total
  assert abs(fraction - p) <= SIGMAS * std, (
      f"{what}: {fraction:.5f} vs {p:.5f} (tolerance {SIGMAS * std:.5f})")


def _word_index(maskable, word_starts):
  """[N, T] int: a global index per word (-1 on specials), re-derived here from the rules.

  A word starts at a word start or at the first maskable token after a special.
  """
  after_special = np.ones_like(maskable)
  after_special[:, 1:] = ~maskable[:, :-1]
  starts = maskable & (word_starts | after_special)
  index = np.cumsum(starts.ravel()).reshape(maskable.shape) - 1
  return np.where(maskable, index, -1)


def _per_word(values, words):
  """Sum of `values` over the pieces of each word (indexed as in `_word_index`)."""
  keep = words >= 0
  return np.bincount(words[keep], weights=values[keep].astype(float),
                     minlength=words.max() + 1)


# ---------------------------------------------------------------- counts


@pytest.mark.parametrize("ratio", [0.05, 0.15, 0.4, 0.6, 0.8])
def test_fixed_strategy_predicts_exactly_round_ratio_per_sequence(ratio):
  """Fails if any sequence predicts other than max(1, round(ratio x its maskable tokens))."""
  out = _run(masking_spec.bert_masking(ratio=ratio))
  num_maskable = DATA[1].sum(1)
  expected = np.array([max(1, round(ratio * int(n))) for n in num_maskable])
  np.testing.assert_array_equal(out["masked_lm_weights"].sum(1), expected)


@pytest.mark.parametrize("ratio", [0.05, 0.15, 0.4, 0.6, 0.8])
def test_bernoulli_strategy_masks_ratio_on_average(ratio):
  """Fails if Bernoulli masking's overall fraction is more than 4 binomial std from the ratio, or
  its per-sequence counts barely vary (as a fixed count would)."""
  out = _run(masking_spec.bert_masking(ratio=ratio, strategy="bernoulli"))
  counts = out["masked_lm_weights"].sum(1)
  _within(counts.sum(), DATA[1].sum(), ratio, "fraction masked")
  # Per-sequence counts really vary (a fixed count would pass the mean check).
  assert counts.std() > 0.5 * math.sqrt(ratio * (1 - ratio) * DATA[1].sum(1).mean())


def test_masks_are_nested_across_ratios_for_the_same_seed():
  """Fails if, with the same seed, a position masked at ratio 0.15 is not also masked at 0.4."""
  low = _selected(_run(masking_spec.bert_masking(ratio=0.15)), DATA[0].shape)
  high = _selected(_run(masking_spec.bert_masking(ratio=0.4)), DATA[0].shape)
  assert not (low & ~high).any()


# ---------------------------------------------------------------- corruption apart from prediction


@pytest.mark.parametrize("strategy", ["fixed", "bernoulli"])
def test_predict_ratio_below_ratio_predicts_a_random_subset_of_the_corrupted(strategy):
  """Wettig et al.'s m_corr 0.4, m_pred 0.15, mask-only. Fails if a predicted token is not
  corrupted, the corrupted set is not plain 0.4 masking's with the same seed, the predicted one
  not plain 0.15's, the fixed counts are not round(0.4 n) and round(0.15 n) (Bernoulli: rates
  more than 4 binomial std off), P is sized for the corruption, or P(predicted | corrupted)
  differs between the first and second half of a sequence by over 4 std (not a random subset)."""
  mask_only = dict(mask_prob=1.0, random_prob=0.0, keep_prob=0.0, strategy=strategy)
  spec = masking_spec.bert_masking(ratio=0.4, predict_ratio=0.15, **mask_only)
  assert spec.max_predictions(LENGTH) == (20 if strategy == "fixed" else LENGTH)
  assert spec.uncorrupted_fraction() == 0.0  # every prediction is a [MASK]ed token
  out = _run(spec)
  ids, maskable, _ = DATA
  predicted = _selected(out, ids.shape)
  corrupted = out["input_ids"] == MASK  # DATA's ids are never [MASK]
  assert not (predicted & ~corrupted).any()
  plain_corrupt = _run(masking_spec.bert_masking(ratio=0.4, **mask_only))
  np.testing.assert_array_equal(out["input_ids"], plain_corrupt["input_ids"])
  plain_predict = _run(masking_spec.bert_masking(ratio=0.15, **mask_only))
  np.testing.assert_array_equal(predicted, _selected(plain_predict, ids.shape))
  n = maskable.sum(1)
  if strategy == "fixed":
    np.testing.assert_array_equal(corrupted.sum(1), [max(1, round(0.4 * int(k))) for k in n])
    np.testing.assert_array_equal(predicted.sum(1), [max(1, round(0.15 * int(k))) for k in n])
  else:
    _within(corrupted.sum(), n.sum(), 0.4, "fraction corrupted")
    _within(predicted.sum(), n.sum(), 0.15, "fraction predicted")
  # Which corrupted tokens are predicted does not depend on where they sit.
  first_half = np.arange(LENGTH) < LENGTH // 2
  shares = []
  for half in (first_half, ~first_half):
    c = corrupted & half
    shares.append((predicted[c].mean(), c.sum()))
  (a, n_a), (b, n_b) = shares
  pooled = predicted[corrupted].mean()
  std = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
  assert abs(a - b) <= SIGMAS * std, shares


def test_predict_ratio_below_ratio_corrupts_with_the_mix():
  """m_corr 0.4, m_pred 0.15 with 80/10/10. Fails if the [MASK] / random / kept shares of the
  corrupted tokens (plain 0.4's selection, same seed) or the kept share of the predicted ones
  (uncorrupted_fraction, keep_prob here) are more than 4 binomial std off."""
  spec = masking_spec.bert_masking(ratio=0.4, predict_ratio=0.15)
  assert spec.uncorrupted_fraction() == pytest.approx(0.1)
  out = _run(spec)
  ids = DATA[0]
  corrupted = _selected(_run(masking_spec.bert_masking(ratio=0.4)), ids.shape)
  new, old = out["input_ids"][corrupted], ids[corrupted]
  _within((new == MASK).sum(), len(old), 0.8, "[MASK] share")
  _within(((new != MASK) & (new != old)).sum(), len(old), 0.1 * (1 - 1 / ALLOWED), "random share")
  predicted = _selected(out, ids.shape)
  assert not (predicted & ~corrupted).any()
  kept = (out["input_ids"] == ids)[predicted]
  _within(kept.sum(), len(kept), spec.uncorrupted_fraction() + 0.1 / ALLOWED, "kept share")


# Digests of mask_tokens' outputs for the modes that existed before predict_ratio could be
# below the ratio, made by that code (commit f5a48b3) on _synthetic(num=300, seed=4), base seed 11.
_BEFORE = [
    (dict(ratio=0.15), "491e9c25ea5a2f4b"),
    (dict(ratio=0.4, mask_prob=1.0, random_prob=0.0, keep_prob=0.0), "f1699629b129f83e"),
    (dict(ratio=0.3, strategy="bernoulli"), "ac1f339afe99601e"),
    (dict(ratio=0.3, whole_word=True), "ae36bf9d6064a218"),
    (dict(ratio=0.3, whole_word=True, strategy="bernoulli"), "e499b0f17b3d51fc"),
    (dict(ratio=0.3, span=True), "088328b2a63e8688"),
    (dict(ratio=0.15, predict_ratio=0.4), "9a08cc1398b3f804"),
    (dict(ratio=0.15, predict_ratio=0.4, strategy="bernoulli"), "6269d533cbfed4c4"),
    (dict(ratio=0.15, predict_ratio=0.4, mask_prob=1.0, random_prob=0.0, keep_prob=0.0),
     "ad997135edfcfadb"),
]


def test_existing_modes_mask_bit_identically_to_before():
  """Fails if any mode that existed before predict_ratio < ratio (token, whole-word and span
  masking, fixed and Bernoulli, predict_ratio above the ratio) now gives other bytes in any
  output for the same data and seed."""
  data = _synthetic(num=300, seed=4)
  for kwargs, digest in _BEFORE:
    out = _run(masking_spec.bert_masking(**kwargs), data=data, base_seed=11)
    h = hashlib.sha256()
    for key in sorted(out):
      h.update(key.encode())
      h.update(np.ascontiguousarray(out[key]).tobytes())
    assert h.hexdigest()[:16] == digest, kwargs


# ---------------------------------------------------------------- 80/10/10


@pytest.mark.parametrize("probs", [(0.8, 0.1, 0.1), (0.5, 0.25, 0.25)])
def test_mask_random_keep_split(probs):
  """Fails if the [MASK], random-replacement or kept shares of predicted tokens are more than 4
  binomial std from the configured probabilities (a random draw may hit the original id)."""
  mask_prob, random_prob, keep_prob = probs
  out = _run(masking_spec.bert_masking(ratio=0.4, mask_prob=mask_prob,
                                 random_prob=random_prob, keep_prob=keep_prob))
  weights = out["masked_lm_weights"] > 0
  rows = np.nonzero(weights)[0]
  new = out["input_ids"][rows, out["masked_lm_positions"][weights]]
  old = out["masked_lm_ids"][weights]
  total = len(old)
  # A random draw equals the original id with probability 1 / ALLOWED.
  _within((new == MASK).sum(), total, mask_prob, "[MASK] share")
  _within(((new != MASK) & (new != old)).sum(), total,
          random_prob * (1 - 1 / ALLOWED), "random share")
  _within((new == old).sum(), total, keep_prob + random_prob / ALLOWED, "kept share")


def test_random_replacements_are_uniform_over_non_special_ids():
  """Fails if a random replacement draws a special or [MASK] id, or the draws fail a chi-square test
  of uniformity over the allowed ids."""
  vocab, specials, mask_id = 64, [0, 1, 2, 3, 17, 40], 4
  data = _synthetic(num=600, low=41, high=64, seed=1)
  out = _run(masking_spec.bert_masking(ratio=0.5, mask_prob=0.0, random_prob=1.0, keep_prob=0.0),
             data=data, vocab_size=vocab, special_ids=specials, mask_id=mask_id)
  weights = out["masked_lm_weights"] > 0
  rows = np.nonzero(weights)[0]
  drawn = out["input_ids"][rows, out["masked_lm_positions"][weights]]
  allowed = sorted(set(range(vocab)) - set(specials) - {mask_id})
  assert set(drawn.tolist()) <= set(allowed), "a special id was drawn"
  counts = np.array([(drawn == i).sum() for i in allowed])
  assert scipy.stats.chisquare(counts).pvalue > 1e-4, counts


# ---------------------------------------------------------------- words and spans


def _check_whole_words(out, data):
  """Every word is masked entirely or not at all; returns per-decision word counts."""
  ids, maskable, word_starts = data
  words = _word_index(maskable, word_starts)
  selected = _selected(out, ids.shape)
  pieces = _per_word(np.ones_like(selected), words)
  chosen = _per_word(selected, words)
  partly = (chosen > 0) & (chosen < pieces)
  assert not partly.any(), f"{partly.sum()} words partly masked"
  new = out["input_ids"]
  kinds = [selected & (new == MASK), selected & (new != MASK) & (new != ids),
           selected & (new == ids)]
  kind_counts = [_per_word(kind, words) for kind in kinds]
  masked = chosen > 0
  mixed = sum((count > 0) & (count < chosen) for count in kind_counts)
  return masked.sum(), (mixed[masked] > 0).sum(), (kind_counts[0][masked] == chosen[masked]).sum()


@pytest.mark.parametrize("strategy", ["fixed", "bernoulli"])
def test_whole_word_masking_groups_pieces_and_decisions(strategy):
  """Fails if whole-word masking masks part of a word, decides per piece (over 2 mixed words), its
  [MASK] share of words is off by 4 std, or its counts overshoot the target, fall short in over 3%
  of sequences (fixed) or miss the ratio on average (Bernoulli)."""
  spec = masking_spec.bert_masking(ratio=0.15, whole_word=True, strategy=strategy)
  out = _run(spec)
  masked_words, mixed, mask_words = _check_whole_words(out, DATA)
  # Only a random draw equal to the original (p = 1/ALLOWED per piece) can look mixed.
  assert mixed <= 2, f"{mixed} of {masked_words} words had per-piece decisions"
  _within(mask_words, masked_words, spec.mask_prob, "[MASK] share of words")
  counts = out["masked_lm_weights"].sum(1)
  if strategy == "fixed":
    target = np.array([max(1, round(0.15 * int(n))) for n in DATA[1].sum(1)])
    # Skipping a word that would overflow can leave a sequence short, never over.
    assert (counts <= target).all() and (counts == target).mean() > 0.97
  else:
    _within(counts.sum(), DATA[1].sum(), 0.15, "fraction masked")


def test_span_lengths_follow_truncated_geometric():
  """Fails if a span length falls outside [1, 10] or the lengths fail a chi-square test against
  Geometric(0.2) truncated at 10."""
  spec = masking_spec.bert_masking(ratio=0.15, span=True)
  lengths = selection.sample_span_lengths(tf.constant([3, 4]), 20000, spec).numpy()
  pmf = scipy.stats.geom(0.2).pmf(np.arange(1, 11))
  observed = np.array([(lengths == k).sum() for k in range(1, 11)])
  assert observed.sum() == len(lengths), "span length outside [1, 10]"
  assert scipy.stats.chisquare(observed, pmf / pmf.sum() * len(lengths)).pvalue > 1e-4


def test_span_masking_masks_contiguous_whole_word_spans():
  """Fails if span masking masks part of a word, overshoots the target or falls short in over 10% of
  sequences, its runs average 2.5 words or fewer (or token masking's 1.5 or more), or over 10% of
  runs mix [MASK] with other decisions."""
  spec = masking_spec.bert_masking(ratio=0.15, span=True, whole_word=True)
  out = _run(spec)
  _check_whole_words(out, DATA)
  ids, maskable, starts = DATA
  selected = _selected(out, ids.shape)
  target = np.array([max(1, round(0.15 * int(n))) for n in maskable.sum(1)])
  counts = selected.sum(1)
  assert (counts <= target).all() and (counts == target).mean() > 0.9
  # Runs of masked words: long (mean near 3.8 words, less truncation and merges)
  # and the runs of token-level masking at the same ratio are ~1 word.
  words = _word_index(maskable, starts)
  first = np.nonzero(words >= 0)
  # Word order is row-major, so adjacent indexes are adjacent words unless a
  # special token (or a row end) separates them.
  flat = first[0] * ids.shape[1] + first[1]
  word_first = np.full(words.max() + 1, flat.max() + 1)
  np.minimum.at(word_first, words[first], flat)
  word_last = np.full(words.max() + 1, -1)
  np.maximum.at(word_last, words[first], flat)
  adjacent = np.concatenate([[False], word_first[1:] == word_last[:-1] + 1])

  def mean_run_words(selected):
    masked = _per_word(selected, words) > 0
    run_starts = masked & ~(adjacent & np.concatenate([[False], masked[:-1]]))
    return masked.sum() / run_starts.sum()

  assert mean_run_words(selected) > 2.5
  token_level = _selected(_run(masking_spec.bert_masking(ratio=0.15)), ids.shape)
  assert mean_run_words(token_level) < 1.5
  # One [MASK]/other decision per span: only merged spans mix inside a run
  # (a few %); per-word decisions would mix ~40% of these multi-word runs.
  previous = np.zeros_like(selected)
  previous[:, 1:] = selected[:, :-1]
  run = (np.cumsum((selected & ~previous).ravel()) - 1).reshape(selected.shape)
  run_length = np.bincount(run[selected])
  run_masks = np.bincount(run[selected], weights=(out["input_ids"] == MASK)[selected])
  mixed = (run_masks > 0) & (run_masks < run_length)
  assert mixed.mean() < 0.1, mixed.mean()


# ---------------------------------------------------------------- max_predictions


def test_max_predictions_derived_from_ratio():
  """Fails if max_predictions for a ratio and length differs from the listed value (20 for 0.15 at
  128, the full length for Bernoulli, an explicit cap kept)."""
  assert masking_spec.bert_masking(ratio=0.15).max_predictions(128) == 20  # BERT's value
  assert masking_spec.bert_masking(ratio=0.15).max_predictions(512) == 77
  assert masking_spec.bert_masking(ratio=0.1).max_predictions(30) == 3
  assert masking_spec.bert_masking(ratio=0.8).max_predictions(128) == 103
  assert masking_spec.bert_masking(ratio=0.15, strategy="bernoulli").max_predictions(128) == 128
  assert masking_spec.bert_masking(ratio=0.15, max_predictions_per_seq=19).max_predictions(128) == 19


@pytest.mark.parametrize("kwargs,length", [
    (dict(ratio=0.15, max_predictions_per_seq=18), 128),
    (dict(ratio=0.4, max_predictions_per_seq=20), 128),
    (dict(ratio=0.15, strategy="bernoulli", max_predictions_per_seq=20), 128),
])
def test_max_predictions_too_small_is_an_error(kwargs, length):
  """Fails if an explicit max_predictions_per_seq below what the ratio (or Bernoulli's tail) needs
  is accepted."""
  with pytest.raises(ValueError, match="max_predictions_per_seq"):
    masking_spec.bert_masking(**kwargs).max_predictions(length)


def test_bernoulli_cap_accepted_exactly_when_overflow_is_negligible():
  """Fails if a Bernoulli cap whose overflow probability exceeds 2e-9 is accepted, or one under
  0.5e-9 is refused or changed."""
  for cap in range(19, 128):
    tail = scipy.stats.binom.sf(cap, 128, 0.15)
    spec = masking_spec.bert_masking(ratio=0.15, strategy="bernoulli", max_predictions_per_seq=cap)
    if tail > 2e-9:
      with pytest.raises(ValueError, match="max_predictions_per_seq"):
        spec.max_predictions(128)
    elif tail < 0.5e-9:
      assert spec.max_predictions(128) == cap


def test_mask_tokens_rejects_too_small_max_predictions():
  """Fails if mask_tokens accepts max_predictions=15 where ratio 0.15 of the sequence needs more."""
  spec = masking_spec.bert_masking(ratio=0.15)
  with pytest.raises(ValueError, match="max_predictions_per_seq"):
    masking.mask_tokens(DATA[0][0], DATA[1][0], None, [1, 2], spec, mask_id=MASK,
                        vocab_size=VOCAB, special_ids=SPECIALS, max_predictions=15)


# ---------------------------------------------------------------- specs


def _config(**overrides):
  fields = dict(
      ratio=0.15, mask_prob=0.8, random_prob=0.1, keep_prob=0.1, strategy="fixed",
      whole_word=False, span=False, span_geometric_p=0.2, max_span_length=10,
      max_predictions_per_seq=0, schedule="constant", final_ratio=0.0, schedule_power=1.0,
      schedule_warmup=0.0, predict_ratio=0.0)
  return ml_collections.ConfigDict({**fields, **overrides})


@pytest.mark.parametrize("overrides,field", [
    (dict(ratio=0.0), "ratio"), (dict(ratio=1.0), "ratio"), (dict(ratio=-0.2), "ratio"),
    (dict(mask_prob=0.7), "mask_prob"), (dict(keep_prob=0.2), "keep_prob"),
    (dict(random_prob=-0.1, keep_prob=0.3), "random_prob"),
    (dict(strategy="poisson"), "strategy"), (dict(whole_word="yes"), "whole_word"),
    (dict(span_geometric_p=0.0), "span_geometric_p"),
    (dict(max_span_length=0), "max_span_length"),
    (dict(max_predictions_per_seq=-1), "max_predictions_per_seq"),
    (dict(max_predictions_per_seq=5), "max_predictions_per_seq"),
])
def test_invalid_config_names_the_field(overrides, field):
  """Fails if an out-of-range or mistyped masking field is accepted, or refused without its name."""
  with pytest.raises(ValueError, match=field):
    masking_spec.MaskingSpec.from_config(_config(**overrides), 128)


def test_from_config_reads_every_field_and_requires_it():
  """Fails if from_config builds another spec than bert_masking with the same fields, or accepts a
  config missing "span"."""
  spec = masking_spec.MaskingSpec.from_config(_config(ratio=0.4, whole_word=True), 128)
  assert spec == masking_spec.bert_masking(ratio=0.4, whole_word=True)
  config = _config().to_dict()
  del config["span"]
  with pytest.raises(ValueError, match="span"):
    masking_spec.MaskingSpec.from_config(config, 128)


def test_whole_word_without_word_starts_is_an_error():
  """Fails if whole-word masking without word starts is accepted instead of refused naming
  word_starts."""
  with pytest.raises(ValueError, match="word_starts"):
    masking.mask_tokens(DATA[0][0], DATA[1][0], None, [1, 2],
                        masking_spec.bert_masking(ratio=0.15, whole_word=True), mask_id=MASK,
                        vocab_size=VOCAB, special_ids=SPECIALS, max_predictions=20)


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("kwargs", [dict(ratio=0.15), dict(ratio=0.3, whole_word=True),
                                    dict(ratio=0.3, span=True, strategy="bernoulli")])
def test_same_seed_same_masks_in_eager_graph_and_tf_data(kwargs):
  """Fails if eager, tf.function and tf.data give different masks for the same seed, a rerun
  differs, or another base seed leaves 10% or more of the sequences' positions unchanged."""
  spec = masking_spec.bert_masking(**kwargs)
  subset = tuple(a[:50] for a in DATA)
  via_data = _run(spec, data=subset, base_seed=7)

  def one(ids, maskable, word_starts, n):
    return masking.mask_tokens(
        ids, maskable, word_starts, masking.example_seed(7, 0, n), spec,
        mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS,
        max_predictions=spec.max_predictions(LENGTH))

  graph = tf.function(one)
  for n in (0, 17, 49):
    row = tuple(a[n] for a in subset)
    eager = one(*row, n)
    traced = graph(*row, tf.constant(n))
    for key, value in eager.items():
      np.testing.assert_array_equal(value.numpy(), via_data[key][n])
      np.testing.assert_array_equal(traced[key].numpy(), via_data[key][n])
  again = _run(spec, data=subset, base_seed=7)
  other = _run(spec, data=subset, base_seed=8)
  np.testing.assert_array_equal(again["input_ids"], via_data["input_ids"])
  differ = (other["masked_lm_positions"] != via_data["masked_lm_positions"]).any(1)
  assert differ.mean() > 0.9


def test_example_seed_depends_on_every_input():
  """Fails if two of the 12 (seed, epoch, index) combinations give the same example seed, or one
  combination gives two."""
  seeds = {tuple(masking.example_seed(s, e, i).numpy().tolist())
           for s in (0, 1) for e in (0, 1) for i in (0, 1, 2)}
  assert len(seeds) == 12
  np.testing.assert_array_equal(masking.example_seed(3, 2, 5), masking.example_seed(3, 2, 5))


def test_the_spec_answers_what_a_setting_means():
  """Fails if MaskingSpec's answers to the ablation's planner and report (expected
  predictions over a schedule, the columns, the one-line description, a recorded config
  with fields it predates) are not what the setting means."""
  bert = masking_spec.bert_masking()
  assert bert.expected_predictions(128, 1000) == 19  # round(0.15 * 125), of 20 slots
  assert bert.describe() == ("ratio 0.15 constant, 80/10/10 mask/random/keep, token units, "
                             "strategy fixed")
  decay = masking_spec.bert_masking(0.3, schedule="linear", final_ratio=0.1)
  assert abs(decay.mean_ratio(1000) - 0.2) < 1e-3
  assert decay.expected_predictions(128, 1000) == 25  # the mean ratio 0.2 of 125 tokens
  assert decay.columns()["schedule"] == "linear 0.30->0.10"
  rate = masking_spec.bert_masking(0.15, predict_ratio=0.4)
  assert rate.expected_predictions(128, 1000) == 50  # the prediction rate, within 52 slots
  assert rate.columns()["mix"] == "80/10/10, predict 0.40"
  assert rate.columns()["uncorrupted_fraction"] == round(rate.uncorrupted_fraction(), 4)
  words = masking_spec.bert_masking(whole_word=True)
  assert words.describe().endswith("whole word units, strategy fixed")
  # A record from before schedules and prediction rates existed: BERT's values for those.
  assert masking_spec.MaskingSpec.from_record({"ratio": 0.4, "whole_word": True}) == \
      masking_spec.bert_masking(0.4, whole_word=True)
