"""What the per-word task kinds (ner, tagging) share: head, loss, features, per-word predictions.

Both tag every word on its first wordpiece with heads.BertForTokenClassification
("classifier"); the loss is softmax cross-entropy on those pieces, averaged
over them (not over sentences: a long sentence weighs what its words weigh);
sentences longer than one row are windowed at config.task.doc_stride and
each word is predicted in the window that gives it the most context
(token_features). A subclass adds its reader (read), its label list and its
metrics (main_metric, score).
"""

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from bert_jax.finetune.readers import records
from bert_jax.finetune.kinds import task_kind
from bert_jax.finetune.features import token_features
from bert_jax.model import heads


class TokenKind(task_kind.TaskKind):
  """A kind that tags words; subclasses provide read, main_metric and score."""

  head_name = "classifier"
  loss_features = ("label_ids", "label_weights")

  def model(self, bert_config, labels: Sequence[str]):
    return heads.BertForTokenClassification(bert_config, num_labels=len(labels))

  def featurize(self, task, split, sentences: list[records.TaggedSentence]):
    task.tokenizer.prime(w for s in sentences for w in s.tokens)
    return task_kind.Split(split, sentences, token_features.token_classification_features(
        sentences, tokenize_word=task.tokenizer, vocab=task.tokenizer.vocab,
        labels=task.labels, max_seq_length=task.max_seq_length,
        doc_stride=task.config.doc_stride))

  def loss(self, task, logits, batch):
    weights = batch["label_weights"]
    nll = task_kind.softmax_nll(logits, batch["label_ids"])
    return jnp.sum(nll * weights), self.loss_weight(task, batch)

  def loss_weight(self, task, batch):
    del task
    return jnp.sum(batch["label_weights"])

  def outputs(self, task, logits):
    del task
    return {"pred_ids": jnp.argmax(logits, axis=-1).astype(jnp.int32)}


def word_predictions(task: task_kind.Task, split: task_kind.Split,
                     outputs: dict[str, np.ndarray]) -> list[list[str]]:
  """Each sentence's predicted tags, one per word, from the kept outputs of its rows."""
  return token_features.word_predictions(outputs["pred_ids"], split.features, split.examples,
                                         task.labels)


def prediction_rows(sentences: Sequence[records.TaggedSentence],
                    predicted: Sequence[Sequence[str]]) -> list[dict]:
  """One JSON-able row per sentence: where it is from, its words, gold and predicted tags."""
  return [{"source": s.source, "tokens": s.tokens, "gold": s.labels, "prediction": p}
          for s, p in zip(sentences, predicted)]
