"""Tests for bert_jax/finetune/readers/squad.py: reading, windows, post-processing.

Real data: the SQuAD-format fixtures inside the allennlp 0.9.0 wheel (the
allennlp_fixtures fixture of conftest.py). Oracles: transformers' BertTokenizer
on the real bert-base-uncased vocabulary; hand-computed windows and scores (transformers
4's port of run_squad's write_predictions: peers/test_squad_oracles.py).
"""

import collections
import json
import logging
import pathlib

import numpy as np
import pytest

from bert_jax.finetune import metrics
from bert_jax.finetune.readers import squad


def _write(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text, encoding="utf-8")
  return path


# ---------------------------------------------------------------------------- SQuAD


def test_read_squad_fixture(allennlp_fixtures):
  """Fails if the SQuAD fixture reads as other ids, words or answers, a training span's words do not
  hold its answer, or the Quoref sample reads as other questions or answers."""
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
  """Fails if a window's ids, query prefix or segments differ from transformers' tokenizer, its
  max-context tokens together are not the whole context once, or a training target is not exactly
  the answer's wordpieces."""
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
  """Fails if logits peaked on the gold span do not give back every original answer text (EM and F1
  100), an n-best list's probabilities do not sum to 1, or predictions.json differs (or a
  null_odds.json appears) in v1.1."""
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
  """Fails if 10 pieces in 8-token windows, stride 2, give other windows, other max-context pieces
  or other answer targets than the hand-computed ones, or a window with no room for context is
  accepted."""
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
  """Fails if an answer inside a word ("1895" in "(1895-1943).") targets more pieces than its
  own."""
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
  """Fails if post-processing picks a span in the question or ending before its start, gives another
  null-odds score, ignores the null threshold or max_answer_length, or accepts a missing feature
  result."""
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
  """Fails if malformed JSON, a missing context, a non-int offset, a duplicate id or a training
  question with no answer is not refused by place, or answers missing their offsets are not skipped
  (with a warning) in training and kept in evaluation."""
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
  """Fails if an impossible v2.0 question is read with answers or a span, its windows do not target
  [CLS], an answerable one's span is off, or the gold answers differ."""
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
