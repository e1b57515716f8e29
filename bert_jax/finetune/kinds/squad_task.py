"""Task kind "squad": extractive span question answering, SQuAD v1.1 / v2.0.

Tasks: "squad_v1", "squad_v2" (config.task.train_file, dev_file: SQuAD JSON;
version_2_with_negative for unanswerable questions). Head:
heads.BertForQuestionAnswering ("qa_outputs"), start and end logits over
windows of the context (squad.convert_examples_to_features, doc_stride); the
loss is the mean of the start and end cross-entropies, averaged over windows.
Dev score: the n-best answers of run_squad's post-processing, scored as the
official evaluate-v1.1 / v2.0 scripts do (metrics.squad_evaluate);
predictions.json, nbest_predictions.json and (v2.0) null_odds.json.
"""

import jax.numpy as jnp

from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.readers import splits
from bert_jax.finetune.readers import squad
from bert_jax.finetune.kinds import task_kind
from bert_jax.model import heads

_NO_QUESTIONS = {"train": "no questions, or none whose answer matches its offsets",
                 "dev": "no questions"}


def _file(task_config, split: str) -> str:
  return task_config.train_file if split == "train" else task_config.dev_file


class SquadKind(task_kind.TaskKind):
  """Start/end logits over context windows, EM/F1; see the module docstring."""

  name = "squad"
  head_name = "qa_outputs"
  loss_features = ("start_positions", "end_positions")

  def main_metric(self, task_config):
    return "f1"

  def read(self, task_config):
    if not task_config.train_file or not task_config.dev_file:
      raise ValueError("SQuAD needs config.task.train_file and config.task.dev_file")
    examples = {}
    for split, limit in (("train", task_config.max_train_examples),
                         ("dev", task_config.max_dev_examples)):
      path = _file(task_config, split)
      read = splits.require_examples(squad.read_squad(path, is_training=split == "train"),
                                     path, split, _NO_QUESTIONS[split])
      examples[split] = read[:limit] if limit > 0 else read
    name = "squad_v2" if task_config.version_2_with_negative else "squad_v1"
    return task_kind.Data(name, None, examples["train"], {"dev": examples["dev"]})

  def model(self, bert_config, labels):
    del labels
    return heads.BertForQuestionAnswering(bert_config)

  def featurize(self, task, split, examples):
    task.tokenizer.prime(t for e in examples for t in [e.question_text] + list(e.doc_tokens))
    c = task.config
    windows = squad.convert_examples_to_features(
        examples, tokenize_word=task.tokenizer, vocab=task.tokenizer.vocab,
        max_seq_length=task.max_seq_length, doc_stride=c.doc_stride,
        max_query_length=c.max_query_length, is_training=split == "train")
    # A question whose context has no wordpiece yields no window; a split of only those, nothing.
    splits.require_examples(windows, _file(c, split), split, "every context is empty")
    return task_kind.Split(split, examples, squad.features_to_arrays(windows), windows)

  def loss(self, task, out, batch):
    start_logits, end_logits = out
    if "pack_index" in batch or task.config.get("mask_padding_logits", False):
      # Over the real tokens only (a packed example's outputs end with it).
      real = (batch["pack_index"] >= 0 if "pack_index" in batch else batch["input_mask"] > 0)
      start_logits = jnp.where(real, start_logits, -1e9)
      end_logits = jnp.where(real, end_logits, -1e9)
    per_example = 0.5 * (task_kind.softmax_nll(start_logits, batch["start_positions"])
                         + task_kind.softmax_nll(end_logits, batch["end_positions"]))
    return jnp.sum(per_example), self.loss_weight(task, batch)

  def outputs(self, task, out):
    del task
    return {"start_logits": out[0], "end_logits": out[1]}

  def score(self, task, split, outputs):
    c = task.config
    v2 = c.version_2_with_negative
    results = {f.unique_id: (s, e) for f, s, e in zip(
        split.windows, outputs["start_logits"], outputs["end_logits"])}
    predictions, nbest, null_odds = squad.postprocess_predictions(
        split.examples, split.windows, results, tokenize_word=task.tokenizer,
        n_best_size=c.n_best_size, max_answer_length=c.max_answer_length,
        version_2_with_negative=v2, null_score_diff_threshold=c.null_score_diff_threshold)
    metrics = metrics_lib.squad_evaluate(squad.gold_answers(split.examples), predictions,
                                         version="2.0" if v2 else "1.1",
                                         na_probs=null_odds if v2 else None)
    return ({k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))},
            {"predictions": predictions, "nbest": nbest, "null_odds": null_odds if v2 else None})

  def write_predictions(self, task, directory, split, predictions):
    del task, split
    squad.write_predictions(directory, predictions["predictions"], predictions["nbest"],
                            predictions["null_odds"])


KIND = SquadKind()
