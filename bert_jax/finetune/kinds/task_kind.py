"""The task-kind interface: everything the fine-tuning trainer asks about a kind of task.

A kind of task (classification, ner, squad, tagging) is one TaskKind object,
registered by name in registry.py; config.task.kind names it. The trainer
(trainer.py) never names a kind. Before any data is read it asks the kind
for its head parameter name (to load a fine-tuned head from a checkpoint) and
its main metric (to pick the best learning rate); then the kind builds the
Task, and the trainer asks the Task for everything else.

What a kind holds, one method or attribute each:

  head_name, model()      which task model of bert_jax.model.heads, and its head's parameter name
  read()                  its reader(s): every split, checked (an empty split names its file)
  featurize()             examples -> padded numpy arrays, one row per example or window
  loss(), loss_weight()   the summed loss of a batch and the weight it is averaged over
  loss_features           the feature arrays the loss reads (beside INPUTS)
  outputs()               what evaluation keeps of the model's output
  main_metric(), score()  its main dev metric; dev outputs -> (metrics, predictions)
  write_predictions()     dev predictions into a directory (default: <split>_predictions.jsonl)
  write_test()            predictions of unlabelled test splits (GLUE leaderboard files)

build() is the same for every kind: read, model, featurize every split, so
every input is read and featurised before anything compiles. Adding a kind
is one module with a TaskKind subclass, one line in registry.py and its
tasks in experiments/configs/finetune.py.
"""

import dataclasses
import json
import logging
import os
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.model import encoder as model_lib
from host import paths

# The model's inputs, in the order every task model of bert_jax.model.heads takes them.
INPUTS = ("input_ids", "input_mask", "segment_ids")


@dataclasses.dataclass
class Data:
  """What a kind's reader returns: every split of one task, read and checked."""
  name: str                          # the task's name (logs, summary)
  labels: tuple[str, ...] | None     # what label ids index; None: regression, spans
  train: list
  dev: dict[str, list]               # dev split -> examples (MNLI has two)
  test: dict[str, list] = dataclasses.field(default_factory=dict)  # unlabelled: written only
  spec: Any = None                   # the kind's own description of the task (GLUE: TaskSpec)


@dataclasses.dataclass
class Split:
  """One split featurised: its examples and their model rows."""
  name: str
  examples: list
  features: dict[str, np.ndarray]    # padded arrays, one row per example or window
  windows: Any = None                # the kind's bookkeeping of rows (SQuAD: its windows)


@dataclasses.dataclass
class Task:
  """One task, built: what the trainer trains on, evaluates and writes; its kind does the work."""
  kind: "TaskKind"
  config: ml_collections.ConfigDict  # config.task
  tokenizer: Any                     # tokenization.WordTokenizer (word -> pieces, vocab)
  max_seq_length: int
  data: Data
  model: nn.Module
  train: Split | None = None
  dev: dict[str, Split] = dataclasses.field(default_factory=dict)
  test: dict[str, Split] = dataclasses.field(default_factory=dict)

  @property
  def name(self) -> str:
    return self.data.name

  @property
  def labels(self) -> tuple[str, ...] | None:
    return self.data.labels

  @property
  def main_metric(self) -> str:
    return self.kind.main_metric(self.config)

  @property
  def head_name(self) -> str:
    return self.kind.head_name

  @property
  def train_features(self) -> tuple[str, ...]:
    """The feature arrays a train step reads; bookkeeping arrays stay on the host."""
    return INPUTS + tuple(self.kind.loss_features)

  def loss(self, out: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(summed loss, its weight) of a batch; the trainer divides by the global weight."""
    return self.kind.loss(self, out, batch)

  def loss_weight(self, batch: dict[str, jax.Array]) -> jax.Array:
    """What the loss of `batch` is averaged over (examples, or labelled tokens)."""
    return self.kind.loss_weight(self, batch)

  def outputs(self, out: Any) -> dict[str, jax.Array]:
    """What evaluation keeps of the model's output, one row per feature row."""
    return self.kind.outputs(self, out)

  def score(self, split: Split, outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], Any]:
    """(dev metrics, JSON-able predictions) of a dev split's outputs."""
    return self.kind.score(self, split, outputs)

  def write_predictions(self, directory: "str | os.PathLike", split: str,
                        predictions: Any) -> None:
    """Writes a dev split's predictions (from score) into `directory` (local or gs://)."""
    self.kind.write_predictions(self, directory, split, predictions)

  def write_test(self, split: Split, outputs: dict[str, np.ndarray],
                 directory: "str | os.PathLike") -> None:
    """Writes an unlabelled test split's predictions into `directory`."""
    self.kind.write_test(self, split, outputs, directory)


class TaskKind:
  """One kind of fine-tuning task. Subclasses set the attributes and the methods
  that raise NotImplementedError here; the rest have defaults."""

  name: str = ""                     # config.task.kind; the registry's key
  head_name: str = ""                # the head's top-level parameter name in the task model
  loss_features: tuple[str, ...] = ()  # feature arrays the loss reads, beside INPUTS

  # -------------------------------------------------------- before any data is read

  def main_metric(self, task_config: ml_collections.ConfigDict) -> str:
    """The dev metric that picks the best checkpoint and learning rate."""
    raise NotImplementedError(f"task kind {self.name!r} has no main_metric")

  # ------------------------------------------------------------ data and model

  def read(self, task_config: ml_collections.ConfigDict) -> Data:
    """Reads and checks every split the task config names."""
    raise NotImplementedError(f"task kind {self.name!r} has no reader")

  def model(self, bert_config: model_lib.BertConfig,
            labels: Sequence[str] | None) -> nn.Module:
    """The task model (a bert_jax.model.heads module) whose head is `head_name`."""
    raise NotImplementedError(f"task kind {self.name!r} has no model")

  def featurize(self, task: Task, split: str, examples: list) -> Split:
    """Model rows of one split (tokenizer: task.tokenizer, length: task.max_seq_length)."""
    raise NotImplementedError(f"task kind {self.name!r} has no featurisation")

  def build(self, task_config: ml_collections.ConfigDict, bert_config: model_lib.BertConfig,
            tokenizer: Any, max_seq_length: int) -> Task:
    """Reads, featurises and builds the model: everything before anything compiles."""
    data = self.read(task_config)
    if task_config.get("test_fraction", 0.0) and "test" not in data.dev:
      # Silently reporting dev as test would be worse than refusing (finetune/splits.py).
      raise ValueError(f"config.task.test_fraction={task_config.test_fraction}: task kind "
                       f"{self.name!r} carves no test split; only classification does")
    task = Task(self, task_config, tokenizer, max_seq_length, data,
                self.model(bert_config, data.labels))
    task.train = self.featurize(task, "train", data.train)
    task.dev = {split: self.featurize(task, split, examples)
                for split, examples in data.dev.items()}
    task.test = {split: self.featurize(task, split, examples)
                 for split, examples in data.test.items()}
    return task

  # ------------------------------------------------------------------- training

  def loss(self, task: Task, out: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array,
                                                                             jax.Array]:
    """(summed loss, its weight) of a batch."""
    raise NotImplementedError(f"task kind {self.name!r} has no loss")

  def loss_weight(self, task: Task, batch: dict[str, jax.Array]) -> jax.Array:
    """What the loss is averaged over; default: the batch's examples (a packed batch's
    pack_index has one row per example, its inputs one per packed row)."""
    del task
    examples = batch["pack_index"] if "pack_index" in batch else batch["input_ids"]
    return jnp.asarray(examples.shape[0], jnp.float32)

  # ----------------------------------------------------------------- evaluation

  def outputs(self, task: Task, out: Any) -> dict[str, jax.Array]:
    """What evaluation keeps of the model's output; default: {"logits": out}."""
    del task
    return {"logits": out}

  def score(self, task: Task, split: Split,
            outputs: dict[str, np.ndarray]) -> tuple[dict[str, float], Any]:
    """(dev metrics, JSON-able predictions) from the outputs of every row of `split`."""
    raise NotImplementedError(f"task kind {self.name!r} has no score")

  def write_predictions(self, task: Task, directory: "str | os.PathLike", split: str,
                        predictions: Any) -> None:
    """Default: `<split>_predictions.jsonl`, one JSON object per row of `predictions`."""
    del task
    write_jsonl(paths.join(directory, f"{split}_predictions.jsonl"), predictions)

  def write_test(self, task: Task, split: Split, outputs: dict[str, np.ndarray],
                 directory: "str | os.PathLike") -> None:
    """Writes the predictions of an unlabelled test split (only kinds whose read() gives one)."""
    raise NotImplementedError(f"task kind {self.name!r} writes no test predictions")


# ---------------------------------------------------------------------------- shared by kinds


def softmax_nll(logits: jax.Array, label_ids: jax.Array) -> jax.Array:
  """-log softmax(logits)[label] over the last axis: [..., C] logits, [...] ids -> [...]."""
  log_probs = jax.nn.log_softmax(logits)
  return -jnp.take_along_axis(log_probs, label_ids[..., None].astype(jnp.int32), axis=-1)[..., 0]


def write_jsonl(path: "str | os.PathLike", rows: Sequence[Any]) -> None:
  """Writes rows as JSON lines, whole or not at all (local or gs://)."""
  paths.makedirs(paths.path(path).parent)
  paths.write_atomic(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
  logging.info("wrote %d predictions to %s", len(rows), os.fspath(path))
