"""Length buckets change no SQuAD or tagging/NER prediction (docs/finetuning.md's promise).

Evaluation (steps.predict over buckets.eval_batches) pads each batch to the
shortest bucket holding its longest row instead of to max_seq_length; attention
masks the padding. So from the same weights every logit of a real position is
fixed padding's, within 1e-5, and what is predicted from them is the same: SQuAD's
answers, n-best lists and null odds, and every word's tag. Training is not
involved (how train batches are cut is buckets.TrainBatches', tested apart).
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.finetune.features import buckets as buckets_lib
from bert_jax.finetune.kinds import registry
from bert_jax.finetune import steps
from bert_jax.finetune.features import tokenization
from bert_jax.model import encoder as model_lib
from bert_jax.training import state as state_lib
from experiments.configs import finetune as finetune_configs

MAX_LENGTH = 128
BUCKET = 32  # buckets 32, 64, 96, 128


class _KeepLogits:
  """A task kind that keeps the model's logits beside what the kind keeps (a token kind
  keeps only their argmax), so the test can compare them; everything else is the kind's."""

  def __init__(self, kind):
    self._kind = kind

  def __getattr__(self, name):
    return getattr(self._kind, name)

  def outputs(self, task, out):
    kept = self._kind.outputs(task, out)
    return kept if isinstance(out, tuple) else {**kept, "logits": out}


def _predict_both_ways(name: str, tokenizer, **task_fields):
  """(task, {padding: {dev split: outputs}}): the task built with a tiny random model,
  its dev splits predicted with one set of weights under "buckets" and "fixed"."""
  config = finetune_configs.get_config(name)
  config.update_from_flattened_dict({
      "max_seq_length": MAX_LENGTH, "bucket_multiple": BUCKET, "batch_size": 8,
      "eval_batch_size": 8, **{f"task.{k}": v for k, v in task_fields.items()}})
  bert_config = model_lib.BertConfig.from_size(
      "tiny", vocab_size=len(tokenizer.vocab), **config.model.to_dict())
  task = registry.get_kind(config.task.kind).build(config.task, bert_config, tokenizer,
                                                   MAX_LENGTH)
  task = dataclasses.replace(task, kind=_KeepLogits(task.kind))
  ids = jnp.zeros((1, MAX_LENGTH), jnp.int32)
  params = task.model.init({"params": jax.random.PRNGKey(0)}, ids, ids, ids,
                           deterministic=True)["params"]
  mesh, rules = state_lib.setup_mesh(config)
  outputs = {}
  for padding in ("buckets", "fixed"):
    config.padding = padding
    programs = steps.build(config, task, {}, mesh, rules, total_steps=1)
    outputs[padding] = {split: steps.predict(programs, params, dev.features,
                                             config.eval_batch_size, mesh)
                        for split, dev in task.dev.items()}
    lengths = {length for _, length in programs.eval_shapes}
    if padding == "buckets":  # the comparison means something only if buckets were used
      assert len(lengths) >= 2 and min(lengths) < MAX_LENGTH, lengths
    else:
      assert lengths == {MAX_LENGTH}, lengths
  return task, outputs


def _assert_real_positions_close(features: dict, a: dict, b: dict, keys: tuple[str, ...]):
  """Every key's values at real (unpadded) positions within 1e-5 between `a` and `b`."""
  real = features["input_mask"].astype(bool)
  for key in keys:
    assert a[key].shape == b[key].shape, key
    difference = np.abs(a[key] - b[key])[real]
    assert difference.max() < 1e-5, (key, difference.max())
    # A model whose logits did not vary would make the equality empty.
    assert np.ptp(b[key][real]) > 1e-3, key


@pytest.mark.slow  # featurises the fixture, then an eval program per shape, twice
def test_squad_predictions_nbest_and_null_odds_do_not_depend_on_buckets(allennlp_fixtures,
                                                                        uncased_vocab, tmp_path):
  """SQuAD v2.0 post-processing on the allennlp fixture (doc stride 32: its contexts span
  several full-length windows) and a short paragraph (one answerable and one unanswerable
  question, in the shortest bucket). Would fail if bucket padding moved or leaked into a
  start or end logit, or changed one answer, one n-best list (texts in order, their
  logits and probabilities) or one null odds value."""
  tokenizer = tokenization.load_word_tokenizer(str(uncased_vocab), "", True)
  data = json.loads((allennlp_fixtures / "squad.json").read_text())
  data["data"].append({"title": "short", "paragraphs": [{
      "context": "The cat sat on the mat near the door.",
      "qas": [{"id": "short_answerable", "question": "Where did the cat sit?",
               "answers": [{"text": "on the mat", "answer_start": 12}]},
              {"id": "short_unanswerable", "question": "What colour was the dog?",
               "answers": [], "is_impossible": True}]}]})
  squad_file = str(tmp_path / "squad.json")
  (tmp_path / "squad.json").write_text(json.dumps(data))
  task, outputs = _predict_both_ways("squad_v2", tokenizer, train_file=squad_file,
                                     dev_file=squad_file, doc_stride=32)
  dev = task.dev["dev"]
  assert len(dev.windows) > len(dev.examples) == 7  # some questions have several windows
  bucketed, fixed = outputs["buckets"]["dev"], outputs["fixed"]["dev"]
  _assert_real_positions_close(dev.features, bucketed, fixed, ("start_logits", "end_logits"))
  (_, ours), (_, theirs) = task.score(dev, bucketed), task.score(dev, fixed)
  assert ours["predictions"] == theirs["predictions"] and len(ours["predictions"]) == 7
  assert ours["nbest"].keys() == theirs["nbest"].keys()
  for qid, nbest in theirs["nbest"].items():
    assert [e["text"] for e in ours["nbest"][qid]] == [e["text"] for e in nbest], qid
    for mine, reference in zip(ours["nbest"][qid], nbest):
      for field in ("start_logit", "end_logit", "probability"):
        assert abs(mine[field] - reference[field]) < 1e-5, (qid, field)
  assert ours["null_odds"].keys() == theirs["null_odds"].keys()
  assert all(abs(ours["null_odds"][q] - v) < 1e-5 for q, v in theirs["null_odds"].items())


@pytest.mark.slow  # featurises 68 sentences, then an eval program per shape, twice
@pytest.mark.parametrize("name", ["peoples_daily_pos", "peoples_daily_ner"])
def test_tagging_and_ner_predictions_do_not_depend_on_buckets(name, chinese_vocab):
  """Tagging (People's Daily POS) and NER (People's Daily PER/LOC/ORG) on 60 dev
  sentences of many lengths. Would fail if bucket padding changed a real position's
  label logit by 1e-5 or more, one predicted label id, or one word's predicted tag."""
  tokenizer = tokenization.load_word_tokenizer(str(chinese_vocab), "", True)
  task, outputs = _predict_both_ways(name, tokenizer, max_train_examples=8,
                                     max_dev_examples=60)
  dev = task.dev["dev"]
  bucketed, fixed = outputs["buckets"]["dev"], outputs["fixed"]["dev"]
  _assert_real_positions_close(dev.features, bucketed, fixed, ("logits",))
  real = dev.features["input_mask"].astype(bool)
  np.testing.assert_array_equal(bucketed["pred_ids"][real], fixed["pred_ids"][real])
  (_, ours), (_, theirs) = task.score(dev, bucketed), task.score(dev, fixed)
  assert [r["prediction"] for r in ours] == [r["prediction"] for r in theirs]
  assert len(ours) == 60
  rows = buckets_lib.bucket_of(buckets_lib.row_lengths(dev.features),
                               buckets_lib.bucket_lengths(MAX_LENGTH, BUCKET, "buckets"))
  assert len(set(rows.tolist())) >= 2, rows
