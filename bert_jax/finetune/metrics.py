"""Official downstream metrics as pure numpy/python functions.

GLUE: accuracy, binary F1, Matthews correlation (CoLA), Pearson and Spearman
correlation (STS-B). SQuAD: exact match and F1 with the official answer
normalisation, for v1.1 and v2.0 (unanswerable questions, the no-answer
threshold and the HasAns/NoAns breakdown). NER: entity-level precision, recall
and F1 with the chunking rules of conlleval as seqeval's default mode applies
them (IOB1, IOB2 and IOBES tags).

Nothing here imports jax or tensorflow: the fine-tuning loop gathers predictions
to the host and scores them here, so the numbers match the official scripts
bit for bit rather than being approximated in-graph.
"""

import collections
import logging
import re
import string
from typing import Mapping, Sequence

import numpy as np

# ----------------------------------------------------------------------------
# Classification and regression (GLUE).
# ----------------------------------------------------------------------------


def _paired(predictions, labels, name: str) -> tuple[np.ndarray, np.ndarray]:
  """Both arguments as 1-D arrays of equal, non-zero length."""
  p = np.asarray(predictions).reshape(-1)
  y = np.asarray(labels).reshape(-1)
  if p.shape != y.shape:
    raise ValueError(f"{name}: {p.size} predictions but {y.size} labels")
  if p.size == 0:
    raise ValueError(f"{name}: no examples to score")
  return p, y


def accuracy(predictions, labels) -> float:
  """Fraction of predictions equal to the label."""
  p, y = _paired(predictions, labels, "accuracy")
  return float(np.mean(p == y))


def f1_binary(predictions, labels, positive=1) -> float:
  """F1 of the positive class (MRPC, QQP); 0.0 when it has no true positive."""
  p, y = _paired(predictions, labels, "f1_binary")
  tp = np.sum((p == positive) & (y == positive))
  fp = np.sum((p == positive) & (y != positive))
  fn = np.sum((p != positive) & (y == positive))
  # Zero true positives makes precision or recall 0/0; sklearn reports 0 there.
  if tp == 0:
    return 0.0
  return float(2 * tp / (2 * tp + fp + fn))


def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (CoLA), in the K-class form that is the phi
  coefficient for two classes; 0.0 when either side is constant."""
  p, y = _paired(predictions, labels, "matthews_corrcoef")
  classes, codes = np.unique(np.concatenate([y, p]), return_inverse=True)
  k = len(classes)
  conf = np.zeros((k, k), dtype=np.float64)
  np.add.at(conf, (codes[:y.size], codes[y.size:]), 1)
  t_sum = conf.sum(axis=1)   # true occurrences per class
  p_sum = conf.sum(axis=0)   # predicted occurrences per class
  n = conf.sum()
  correct = np.trace(conf)
  cov_yp = correct * n - np.dot(t_sum, p_sum)
  cov_pp = n * n - np.dot(p_sum, p_sum)
  cov_yy = n * n - np.dot(t_sum, t_sum)
  if cov_pp * cov_yy == 0:
    return 0.0
  return float(cov_yp / np.sqrt(cov_yy * cov_pp))


def pearson(predictions, labels) -> float:
  """Pearson correlation coefficient (STS-B); nan when either side is constant."""
  p, y = _paired(predictions, labels, "pearson")
  p = p.astype(np.float64) - np.mean(p, dtype=np.float64)
  y = y.astype(np.float64) - np.mean(y, dtype=np.float64)
  denom = np.sqrt(np.dot(p, p) * np.dot(y, y))
  return float(np.dot(p, y) / denom) if denom > 0 else float("nan")


def average_ranks(values) -> np.ndarray:
  """1-based ranks, ties sharing the mean of the ranks they span."""
  v = np.asarray(values).reshape(-1)
  order = np.argsort(v, kind="stable")
  sorted_v = v[order]
  # Boundaries of runs of equal values in sorted order.
  new_run = np.concatenate([[True], sorted_v[1:] != sorted_v[:-1]])
  run_id = np.cumsum(new_run) - 1
  starts = np.flatnonzero(new_run)
  ends = np.concatenate([starts[1:], [v.size]])
  mean_rank = (starts + 1 + ends) / 2.0   # mean of ranks starts+1 .. ends
  ranks = np.empty(v.size, dtype=np.float64)
  ranks[order] = mean_rank[run_id]
  return ranks


def spearman(predictions, labels) -> float:
  """Spearman rank correlation (STS-B): Pearson of average ranks, so ties
  are handled as scipy.stats.spearmanr handles them."""
  p, y = _paired(predictions, labels, "spearman")
  return pearson(average_ranks(p), average_ranks(y))


# ----------------------------------------------------------------------------
# SQuAD v1.1 / v2.0.
# ----------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)   # ASCII only, as the official scripts


def normalize_answer(text: str) -> str:
  """The official SQuAD normalisation: lowercase, drop ASCII punctuation,
  drop the articles a/an/the, collapse whitespace (in that order)."""
  text = text.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def squad_exact(prediction: str, gold: str) -> int:
  """1 if the normalised strings are equal, else 0."""
  return int(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str, version: str = "2.0") -> float:
  """Bag-of-tokens F1 of the normalised strings.

  v2.0 scores an empty-vs-empty pair 1 and empty-vs-nonempty 0 (that is how
  unanswerable questions are scored); v1.1 has no such case and scores any pair
  with an empty side 0.
  """
  pred_toks = normalize_answer(prediction).split()
  gold_toks = normalize_answer(gold).split()
  if version == "2.0" and (not pred_toks or not gold_toks):
    return float(pred_toks == gold_toks)
  common = collections.Counter(pred_toks) & collections.Counter(gold_toks)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_toks)
  recall = num_same / len(gold_toks)
  return 2 * precision * recall / (precision + recall)


def _gold_answers(answers: Sequence[str], version: str) -> list[str]:
  """Gold texts a prediction is compared against (max over them)."""
  if version == "1.1":
    return list(answers)
  # v2.0 drops answers that normalise to nothing; a question left with none is
  # unanswerable and only the empty prediction matches it.
  kept = [a for a in answers if normalize_answer(a)]
  return kept or [""]


def squad_evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str], *,
                   version: str = "2.0", na_probs: Mapping[str, float] | None = None,
                   na_prob_thresh: float = 1.0) -> dict:
  """Scores predictions as the official evaluate-v1.1 / evaluate-v2.0 scripts do.

  Args:
    gold: question id -> gold answer texts (empty list: unanswerable, v2.0).
    predictions: question id -> predicted text ("" = no answer).
    version: "1.1" or "2.0".
    na_probs: v2.0 only, question id -> no-answer probability (or score
      difference); a question whose value exceeds na_prob_thresh is scored as
      if the prediction were empty. With it, the best thresholds are reported.
    na_prob_thresh: see na_probs.

  Returns:
    Percentages: exact_match and f1 (v1.1), or exact, f1, total, HasAns_* and
    NoAns_* and, with na_probs, best_exact(_thresh) and best_f1(_thresh) (v2.0).
  """
  if version not in ("1.1", "2.0"):
    raise ValueError(f"squad_evaluate: version must be '1.1' or '2.0', got {version!r}")
  unknown = sorted(set(predictions) - set(gold))
  if unknown:
    logging.warning("squad_evaluate: %d predictions for unknown question ids, e.g. %s",
                    len(unknown), unknown[0])
  missing = [qid for qid in gold if qid not in predictions]
  if missing:
    # v1.1 scores a missing prediction 0 and keeps it in the total; v2.0 leaves
    # the question out of the totals. Either way the user is told.
    logging.warning("squad_evaluate: missing predictions for %d questions, e.g. %s",
                    len(missing), missing[0])
  exact, f1 = {}, {}
  for qid, answers in gold.items():
    if qid not in predictions:
      if version == "1.1":
        exact[qid] = f1[qid] = 0.0
      continue
    golds = _gold_answers(answers, version)
    pred = predictions[qid]
    exact[qid] = float(max(squad_exact(pred, g) for g in golds))
    f1[qid] = max(squad_f1(pred, g, version) for g in golds)
  if not exact:
    raise ValueError("squad_evaluate: no question has a prediction")
  if version == "1.1":
    return {"exact_match": 100.0 * sum(exact.values()) / len(exact),
            "f1": 100.0 * sum(f1.values()) / len(f1)}

  # Like the official script, HasAns means "the file lists an answer", even one
  # that normalises to nothing (and so is scored as unanswerable).
  has_ans = {qid: bool(a) for qid, a in gold.items()}
  raw_exact, raw_f1 = dict(exact), dict(f1)
  if na_probs is not None:
    lacking = [qid for qid in exact if qid not in na_probs]
    if lacking:
      raise ValueError(f"squad_evaluate: na_probs has no entry for {len(lacking)} "
                       f"questions, e.g. {lacking[0]!r}")
    for qid in exact:
      if na_probs[qid] > na_prob_thresh:
        exact[qid] = f1[qid] = float(not has_ans[qid])
  out = _summary(exact, f1, list(exact))
  for name, want in (("HasAns", True), ("NoAns", False)):
    qids = [q for q in exact if has_ans[q] == want]
    if qids:
      for key, value in _summary(exact, f1, qids).items():
        out[f"{name}_{key}"] = value
  if na_probs is not None:
    for key, raw in (("exact", raw_exact), ("f1", raw_f1)):
      best, thresh = _best_threshold(predictions, raw, na_probs, has_ans)
      out[f"best_{key}"] = best
      out[f"best_{key}_thresh"] = thresh
  return out


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], qids: list[str]) -> dict:
  """exact / f1 as percentages over qids, and their count."""
  return {"exact": 100.0 * sum(exact[q] for q in qids) / len(qids),
          "f1": 100.0 * sum(f1[q] for q in qids) / len(qids),
          "total": len(qids)}


def _best_threshold(predictions, raw_scores, na_probs, has_ans) -> tuple[float, float]:
  """Best score over no-answer thresholds, sweeping them in increasing order.

  At a threshold below every na_prob all questions are answered "no answer",
  scoring 1 on each unanswerable one; raising it past a question's na_prob
  switches that question to its prediction.
  """
  score = sum(1 for q in raw_scores if not has_ans[q])
  best_score, best_thresh = score, 0.0
  for qid in sorted(raw_scores, key=lambda q: na_probs[q]):
    if has_ans[qid]:
      score += raw_scores[qid]
    elif predictions[qid]:
      score -= 1
    if score > best_score:
      best_score, best_thresh = score, na_probs[qid]
  return 100.0 * best_score / len(raw_scores), float(best_thresh)


# ----------------------------------------------------------------------------
# Entity-level NER scores (conlleval / seqeval default mode).
# ----------------------------------------------------------------------------

_CHUNK_PREFIXES = frozenset("BIES")


def _split_tag(tag: str) -> tuple[str, str]:
  """("B", "PER") for "B-PER", ("O", "") for "O"."""
  if tag == "O":
    return "O", ""
  prefix, sep, kind = tag.partition("-")
  if prefix not in _CHUNK_PREFIXES or not sep or not kind:
    raise ValueError(f"tag {tag!r} is neither 'O' nor B-/I-/E-/S- followed by a type")
  return prefix, kind


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """Chunks (type, first, last) of one tag sequence, inclusive indices.

  The conlleval rules, which make IOB1 and IOB2 (and IOBES) read alike: a
  chunk ends after E- or S-, before B-, S- or O, and wherever the type changes;
  an I- or E- tag after O (or after a finished E-/S- chunk) or after a
  different type starts a new chunk rather than being an error.
  """
  chunks = []
  prev_prefix, prev_kind, start = "O", "", 0
  for i, tag in enumerate(list(tags) + ["O"]):
    prefix, kind = _split_tag(tag)
    inside = prev_prefix != "O"
    ends = inside and (prev_prefix in "ES" or prefix in "BSO" or kind != prev_kind)
    if ends:
      chunks.append((prev_kind, start, i - 1))
    starts = prefix != "O" and (
        prefix in "BS" or prev_prefix in "OES" or kind != prev_kind)
    if starts:
      start = i
    prev_prefix, prev_kind = prefix, kind
  return chunks


def entity_scores(true_tags: Sequence[Sequence[str]],
                  pred_tags: Sequence[Sequence[str]]) -> dict:
  """Micro-averaged entity precision / recall / F1 and a per-type breakdown.

  A predicted entity counts only if type, start and end all match a gold one.
  Sentences are scored separately, so no entity spans a sentence boundary.
  Precision (recall) is 0.0 when there are no predicted (gold) entities.

  Returns:
    {"precision", "recall", "f1", "num_true", "num_pred",
     "per_type": {type: {"precision", "recall", "f1", "support"}}}
  """
  if len(true_tags) != len(pred_tags):
    raise ValueError(f"entity_scores: {len(true_tags)} gold sentences but "
                     f"{len(pred_tags)} predicted")
  gold, pred = set(), set()
  for n, (t, p) in enumerate(zip(true_tags, pred_tags)):
    if len(t) != len(p):
      raise ValueError(f"entity_scores: sentence {n} has {len(t)} gold tags but "
                       f"{len(p)} predicted")
    gold.update((n,) + c for c in get_entities(t))
    pred.update((n,) + c for c in get_entities(p))

  def prf(g: set, p: set) -> tuple[float, float, float]:
    tp = len(g & p)
    precision = tp / len(p) if p else 0.0
    recall = tp / len(g) if g else 0.0
    f1 = 2 * precision * recall / (precision + recall) if tp else 0.0
    return precision, recall, f1

  per_type = {}
  for kind in sorted({c[1] for c in gold | pred}):
    g = {c for c in gold if c[1] == kind}
    p = {c for c in pred if c[1] == kind}
    precision, recall, f1 = prf(g, p)
    per_type[kind] = {"precision": precision, "recall": recall, "f1": f1, "support": len(g)}
  precision, recall, f1 = prf(gold, pred)
  return {"precision": precision, "recall": recall, "f1": f1, "num_true": len(gold),
          "num_pred": len(pred), "per_type": per_type}
