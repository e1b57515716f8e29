"""SQuAD against transformers 4's ports of the official scripts, which transformers 5 deleted
(transformers.data.metrics.squad_metrics and data.processors.squad): the v2.0 scores of
evaluate-v2.0, and run_squad's write_predictions. In the peers' environment, as
peers/conftest.py says; the main suite checks both against hand-computed cases
(tests/test_finetune_metrics.py, tests/test_finetune_squad.py).
"""

import json
import random
import types

import numpy as np
import pytest

from bert_jax.finetune import metrics
from bert_jax.finetune.readers import squad


def _fixture_features(allennlp_fixtures, hf_tokenizer, is_training=True):
  """tests/test_finetune_squad.py's windows of the fixture (64 tokens, stride 24)."""
  examples = squad.read_squad(allennlp_fixtures / "squad.json", is_training=is_training)
  features = squad.convert_examples_to_features(
      examples, tokenize_word=hf_tokenizer.tokenize, vocab=hf_tokenizer.vocab,
      max_seq_length=64, doc_stride=24, max_query_length=16, is_training=is_training)
  return examples, features


@pytest.mark.parametrize("with_na_probs", [False, True])
def test_squad_v20_matches_transformers_port_of_official_script(with_na_probs):
  """Fails if any v2.0 score, with or without na_probs, differs from transformers' port of the
  official script, or the set of keys differs."""
  from transformers.data.metrics import squad_metrics
  rng = random.Random(int(with_na_probs))
  pool = ["Paris", "the Paris", "river Seine", "the", "Seine", "a river", "France!", "", "an"]
  gold, preds, examples = {}, {}, []
  for i in range(80):
    answers = rng.sample(pool[:-1], rng.randint(0, 3)) if rng.random() < 0.7 else []
    gold[f"q{i}"] = answers
    preds[f"q{i}"] = rng.choice(pool)
    examples.append(types.SimpleNamespace(qas_id=f"q{i}",
                                          answers=[{"text": a} for a in answers]))
  na_probs = {q: rng.random() for q in gold} if with_na_probs else None
  ours = metrics.squad_evaluate(gold, preds, version="2.0", na_probs=na_probs,
                                na_prob_thresh=0.5 if with_na_probs else 1.0)
  ref = squad_metrics.squad_evaluate(examples, preds, no_answer_probs=na_probs,
                                     no_answer_probability_threshold=0.5 if with_na_probs
                                     else 1.0)
  if not with_na_probs:
    # The port always sweeps thresholds (over all-zero na_probs); the official
    # script, like ours, only with an na-prob file.
    ref = {k: v for k, v in ref.items() if not k.startswith("best_")}
  assert ours.keys() == ref.keys()
  for key, value in ref.items():
    assert ours[key] == pytest.approx(value), key


@pytest.mark.parametrize("version_2", [False, True])
def test_squad_postprocess_matches_transformers(allennlp_fixtures, hf_tokenizer, version_2,
                                                tmp_path):
  """Fails if predictions, n-best texts and probabilities, or (v2.0) null odds differ from
  transformers' port of run_squad's write_predictions, or v2.0 does not predict both kinds."""
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
