"""Tests for bert_jax/finetune/metrics.py.

Oracles: scikit-learn and scipy for the GLUE metrics, seqeval (default mode)
for entity scores (transformers 4's port of the official SQuAD evaluate-v2.0 script:
peers/test_squad_oracles.py), and hand-computed cases from the documented behaviour of the official
evaluate-v1.1 / evaluate-v2.0 scripts.
"""

import math
import random

import numpy as np
import pytest
import scipy.stats
import seqeval.metrics
import seqeval.metrics.sequence_labeling
import sklearn.metrics

from bert_jax.finetune import metrics

# ---------------------------------------------------------------------------- GLUE


def _random_pairs(seed, n, k):
  rng = np.random.default_rng(seed)
  return rng.integers(0, k, n), rng.integers(0, k, n)


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
  """Fails if accuracy or Matthews correlation (2 and 3 classes) or binary F1 on random labels
  differs from sklearn's."""
  for k in (2, 3):
    p, y = _random_pairs(seed, 37 + seed, k)
    assert metrics.accuracy(p, y) == pytest.approx(sklearn.metrics.accuracy_score(y, p))
    assert metrics.matthews_corrcoef(p, y) == pytest.approx(
        sklearn.metrics.matthews_corrcoef(y, p), abs=1e-12)
  p, y = _random_pairs(seed, 41, 2)
  assert metrics.f1_binary(p, y) == pytest.approx(sklearn.metrics.f1_score(y, p))


def test_classification_metrics_hand_computed():
  """Fails if accuracy, binary F1 or MCC on a five-example case differ from the hand-computed
  values, or F1 ignores a positive label given by name."""
  # tp=2, fp=1, fn=1, tn=1 -> F1 = 4/6; MCC = (2*1 - 1*1)/sqrt(3*3*2*2) = 1/6.
  p = [1, 1, 1, 0, 0]
  y = [1, 1, 0, 1, 0]
  assert metrics.accuracy(p, y) == pytest.approx(0.6)
  assert metrics.f1_binary(p, y) == pytest.approx(2 / 3)
  assert metrics.matthews_corrcoef(p, y) == pytest.approx(1 / 6)
  # String labels, positive given by name.
  assert metrics.f1_binary(["a", "b"], ["b", "b"], positive="b") == pytest.approx(2 / 3)


def test_classification_metric_edge_cases():
  """Fails if a constant predictor's MCC or an F1 without true positives is not 0, perfect or
  inverted predictions are not MCC +1/-1, or mismatched lengths or no examples are accepted."""
  # A constant predictor: MCC 0 (sklearn convention), F1 0 with no true positive.
  assert metrics.matthews_corrcoef([1, 1, 1], [0, 1, 0]) == 0.0
  assert sklearn.metrics.matthews_corrcoef([0, 1, 0], [1, 1, 1]) == 0.0
  assert metrics.f1_binary([0, 0], [1, 0]) == 0.0
  assert metrics.matthews_corrcoef([0, 1], [0, 1]) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef([1, 0], [0, 1]) == pytest.approx(-1.0)
  with pytest.raises(ValueError, match="3 predictions but 2 labels"):
    metrics.accuracy([1, 2, 3], [1, 2])
  with pytest.raises(ValueError, match="no examples"):
    metrics.accuracy([], [])


@pytest.mark.parametrize("seed", range(4))
def test_correlations_match_scipy_with_ties(seed):
  """Fails if Pearson, Spearman or average ranks on tied STS-B-like scores differ from scipy's."""
  rng = np.random.default_rng(seed)
  # STS-B gold scores come in steps of 0.2, so ties are the normal case.
  y = np.round(rng.uniform(0, 5, 60) * 5) / 5
  p = np.round(y + rng.normal(0, 1, 60), 1)
  assert metrics.pearson(p, y) == pytest.approx(scipy.stats.pearsonr(p, y)[0], abs=1e-12)
  assert metrics.spearman(p, y) == pytest.approx(scipy.stats.spearmanr(p, y)[0], abs=1e-12)
  np.testing.assert_allclose(metrics.average_ranks(y), scipy.stats.rankdata(y))


def test_spearman_hand_computed_ties():
  """Fails if tied values do not share their mean rank, Spearman of a monotone pair is not +1/-1, or
  Pearson of a constant is not NaN."""
  # Ranks of [1, 2, 2, 3] are [1, 2.5, 2.5, 4]: the tie shares the mean rank.
  np.testing.assert_array_equal(metrics.average_ranks([3, 2, 1, 2]), [4, 2.5, 1, 2.5])
  assert metrics.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
  assert metrics.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
  assert math.isnan(metrics.pearson([1, 1, 1], [1, 2, 3]))


# ---------------------------------------------------------------------------- SQuAD


@pytest.mark.parametrize("text, expected", [
    ("The  Quick, brown fox!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("theory of anthem", "theory of anthem"),   # articles only as whole words
    ("A-B", "ab"),                              # punctuation removed, not split
    ("Éclair — “quoted”", "éclair — “quoted”"),  # non-ASCII punctuation survives
    ("the", ""),
    ("  \t\n", ""),
    ("a.the", "athe"),    # punctuation goes first, so "athe" is no article
])
def test_normalize_answer(text, expected):
  """Fails if SQuAD answer normalisation gives another string than the official scripts' for this
  text (case, articles as whole words, ASCII punctuation, whitespace)."""
  assert metrics.normalize_answer(text) == expected


def test_squad_f1_hand_computed():
  """Fails if SQuAD F1 or exact match differ from the hand-computed values (token multiplicity,
  empty against empty 1 in v2.0 but 0 in v1.1)."""
  # pred tokens [quick, brown, fox, jumps], gold [quick, fox]: p=2/4, r=2/2 -> F1 2/3.
  assert metrics.squad_f1("the quick brown fox jumps", "Quick fox") == pytest.approx(2 / 3)
  # Repeated tokens count with multiplicity: common = min counts.
  assert metrics.squad_f1("fox fox fox", "fox") == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
  assert metrics.squad_f1("dog", "cat") == 0.0
  # Empty-vs-empty: 1 in v2.0, 0 in v1.1 (no special case there).
  assert metrics.squad_f1("", "the", "2.0") == 1.0
  assert metrics.squad_f1("", "the", "1.1") == 0.0
  assert metrics.squad_f1("", "cat", "2.0") == 0.0
  assert metrics.squad_exact("The Cat.", "cat") == 1


def test_squad_v11_max_over_gold_and_missing_prediction():
  """Fails if v1.1 scores are not the max over gold answers, or a missing prediction is not scored 0
  and kept in the total."""
  gold = {"q1": ["Denver Broncos", "The Denver Broncos", "Broncos"],
          "q2": ["Santa Clara, California"],
          "q3": ["1882"]}
  preds = {"q1": "broncos", "q2": "Santa Clara"}   # q3 missing: scores 0, stays in total
  out = metrics.squad_evaluate(gold, preds, version="1.1")
  # q1: EM 1 (vs "Broncos"), F1 1; q2: EM 0, F1 = 2*(1)*(2/3)/(5/3) = 0.8; q3: 0.
  assert out["exact_match"] == pytest.approx(100 / 3)
  assert out["f1"] == pytest.approx(100 * 1.8 / 3)


def test_squad_v20_unanswerable_and_breakdown():
  """Fails if v2.0 exact, F1, totals or the HasAns/NoAns breakdown differ from the hand count (an
  answer normalising to "" counts as HasAns but scores as unanswerable)."""
  gold = {"a1": ["Paris"], "a2": ["the Seine river", "Seine"],
          "n1": [], "n2": [],
          "t1": ["the"]}   # an answer that normalises to "": scored as unanswerable
  preds = {"a1": "paris", "a2": "river", "n1": "", "n2": "France", "t1": ""}
  out = metrics.squad_evaluate(gold, preds, version="2.0")
  # exact: a1 1, a2 0, n1 1, n2 0, t1 1. f1: a2 = max(F1(river, seine river)=2/3, 0).
  assert out["total"] == 5
  assert out["exact"] == pytest.approx(100 * 3 / 5)
  assert out["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0 + 1) / 5)
  # The official script counts t1 as HasAns (the file lists an answer).
  assert out["HasAns_total"] == 3 and out["NoAns_total"] == 2
  assert out["HasAns_exact"] == pytest.approx(100 * 2 / 3)
  assert out["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 3)
  assert out["NoAns_exact"] == pytest.approx(50.0)


def test_squad_v20_missing_prediction_left_out():
  """Fails if a v2.0 question without a prediction is counted in the total."""
  out = metrics.squad_evaluate({"a": ["x"], "b": ["y"]}, {"a": "x"}, version="2.0")
  assert out["total"] == 1 and out["exact"] == 100.0


def test_squad_v20_no_answer_threshold_and_best_thresh():
  """Fails if na_prob_thresh does not turn predictions above it into "no answer", the threshold
  sweep gives another best_exact or best_exact_thresh, or na_probs missing a question is
  accepted."""
  gold = {"a1": ["Paris"], "a2": ["Seine"], "n1": [], "n2": []}
  preds = {"a1": "Paris", "a2": "Loire", "n1": "Lyon", "n2": ""}
  na = {"a1": 0.1, "a2": 0.6, "n1": 0.8, "n2": 0.3}
  out = metrics.squad_evaluate(gold, preds, version="2.0", na_probs=na, na_prob_thresh=0.5)
  # Above 0.5 scored as "no answer": a2 -> 0 (has an answer), n1 -> 1.
  # a1 1, a2 0, n1 1, n2 1 (prediction empty).
  assert out["exact"] == pytest.approx(75.0)
  # Sweep by na_prob: start with all-no-answer = 2 (n1, n2); a1 (0.1) +1 -> 3 best
  # at 0.1; n2 (0.3) empty prediction: +0 -> 3; a2 (0.6) +0; n1 (0.8) -1.
  assert out["best_exact"] == pytest.approx(75.0)
  assert out["best_exact_thresh"] == pytest.approx(0.1)
  with pytest.raises(ValueError, match="na_probs has no entry"):
    metrics.squad_evaluate(gold, preds, na_probs={"a1": 0.0})


def test_squad_evaluate_rejects_bad_arguments():
  """Fails if an unknown SQuAD version, or predictions for no question, is accepted."""
  with pytest.raises(ValueError, match="version"):
    metrics.squad_evaluate({}, {}, version="3")
  with pytest.raises(ValueError, match="no question has a prediction"):
    metrics.squad_evaluate({"a": ["x"]}, {}, version="2.0")


# ---------------------------------------------------------------------------- NER


def _seqeval_entities(tags):
  return sorted(seqeval.metrics.sequence_labeling.get_entities(list(tags)))


@pytest.mark.parametrize("tags, expected", [
    # IOB1: I- opens a chunk; B- only separates adjacent chunks of one type.
    (["I-PER", "I-PER", "B-PER", "O", "I-LOC"], [("PER", 0, 1), ("PER", 2, 2), ("LOC", 4, 4)]),
    # IOB2 with a type change inside: the I-LOC starts its own chunk.
    (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
    # IOBES.
    (["S-PER", "B-LOC", "E-LOC", "E-LOC"], [("PER", 0, 0), ("LOC", 1, 2), ("LOC", 3, 3)]),
    (["O", "O"], []),
])
def test_get_entities_hand_computed(tags, expected):
  """Fails if the chunks read from IOB1, IOB2 or IOBES tags differ from the hand-written ones or
  from seqeval's."""
  assert sorted(metrics.get_entities(tags)) == sorted(expected)
  assert sorted(metrics.get_entities(tags)) == _seqeval_entities(tags)


def test_entities_match_seqeval_on_random_sequences():
  """Fails if, on 500 random mixed-scheme tag sequences, the chunks differ from seqeval's."""
  rng = random.Random(0)
  vocab = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "I-ORG", "B-ORG"]
  for _ in range(500):
    tags = [rng.choice(vocab) for _ in range(rng.randint(1, 9))]
    assert sorted(metrics.get_entities(tags)) == _seqeval_entities(tags), tags


def test_entity_scores_match_seqeval():
  """Fails if entity precision, recall, F1, or a type's F1 or support differs from seqeval's on
  random noisy predictions."""
  rng = random.Random(1)
  vocab = ["O", "O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-MISC"]
  true, pred = [], []
  for _ in range(60):
    n = rng.randint(1, 12)
    t = [rng.choice(vocab) for _ in range(n)]
    p = [x if rng.random() < 0.7 else rng.choice(vocab) for x in t]
    true.append(t)
    pred.append(p)
  out = metrics.entity_scores(true, pred)
  assert out["precision"] == pytest.approx(seqeval.metrics.precision_score(true, pred))
  assert out["recall"] == pytest.approx(seqeval.metrics.recall_score(true, pred))
  assert out["f1"] == pytest.approx(seqeval.metrics.f1_score(true, pred))
  report = seqeval.metrics.classification_report(true, pred, output_dict=True)
  for kind, scores in out["per_type"].items():
    assert scores["f1"] == pytest.approx(report[kind]["f1-score"])
    assert scores["support"] == report[kind]["support"]


def test_entity_scores_hand_computed_and_sentence_boundaries():
  """Fails if a missed entity does not halve recall, an entity merges across a sentence boundary, or
  precision with nothing predicted is not 0."""
  true = [["B-PER", "I-PER", "O"], ["I-LOC"]]
  # PER matched; LOC predicted with the wrong extent is a miss (and a false positive).
  pred = [["B-PER", "I-PER", "O"], ["O"]]
  out = metrics.entity_scores(true, pred)
  assert (out["precision"], out["recall"]) == (1.0, 0.5)
  assert out["f1"] == pytest.approx(2 / 3)
  # An entity at the end of one sentence does not merge with one starting the next.
  out = metrics.entity_scores([["I-PER"], ["I-PER"]], [["I-PER"], ["I-PER"]])
  assert out["num_true"] == 2 and out["f1"] == 1.0
  # Nothing predicted: precision 0 by convention (seqeval: zero_division -> 0).
  assert metrics.entity_scores([["B-PER"]], [["O"]])["precision"] == 0.0


def test_entity_scores_bad_input():
  """Fails if a sentence or sentence-count mismatch between gold and predicted, or a tag without a
  valid prefix, is accepted."""
  with pytest.raises(ValueError, match="sentence 0 has 2 gold tags but 1 predicted"):
    metrics.entity_scores([["O", "O"]], [["O"]])
  with pytest.raises(ValueError, match="1 gold sentences but 2 predicted"):
    metrics.entity_scores([["O"]], [["O"], ["O"]])
  with pytest.raises(ValueError, match="'PER'"):
    metrics.get_entities(["PER"])
  with pytest.raises(ValueError, match="'X-PER'"):
    metrics.get_entities(["X-PER"])
