"""The small pretraining run the test suite and the CPU benchmarks share, defined once.

A generated corpus over a fixed word list, a WordPiece vocabulary holding
exactly those words (padded to 96 entries, so a tensor axis of 2 divides it),
and a tiny config on them: L=2, H=64, A=2, sequences of 32 tokens, 5
predictions. tests/conftest.py (pretrain_test_config) and
experiments/benchmarks/pretrain/fast_recipe.py start from here and set only what is
theirs (batch, steps, checkpoints).
"""

import pathlib

import ml_collections
import numpy as np

from experiments.configs import pretrain

WORDS = ("the a of to and in is was for on with as by at from that this it he she they "
         "we you not but or an be are were has had have will would can could model data "
         "train test layer token word text sentence river mountain city music paper "
         "light water stone bird tree house road field night morning winter summer "
         "red green blue small large old new quick slow").split()


def write_vocab(root: pathlib.Path) -> pathlib.Path:
  """root/vocab.txt: the specials, ".", the words, padded with [unusedN] to 96 entries."""
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "."] + sorted(set(WORDS))
  vocab += [f"[unused{i}]" for i in range(96 - len(vocab))]
  path = root / "vocab.txt"
  path.write_text("\n".join(vocab) + "\n")
  return path


def write_corpus(root: pathlib.Path, follow: float | None = None) -> pathlib.Path:
  """root/corpus.txt in BERT format (a sentence per line, blank line between documents),
  300 documents of 3-7 sentences of 4-11 words and ".", from a fixed seed.

  follow None: independent random words (the tests' corpus). A number: each word
  is followed by its fixed successor with that probability, structure a model can
  only use by attending to its neighbours (the fast-recipe benchmark's corpus).
  """
  rng = np.random.default_rng(0)
  lines = []
  if follow is None:
    for _ in range(300):
      for _ in range(int(rng.integers(3, 8))):
        lines.append(" ".join(rng.choice(WORDS, size=int(rng.integers(4, 12)))) + " .")
      lines.append("")
  else:
    words = sorted(set(WORDS))
    successor = rng.permutation(len(words))
    for _ in range(300):
      for _ in range(int(rng.integers(3, 8))):
        word, sentence = int(rng.integers(len(words))), []
        for _ in range(int(rng.integers(4, 12))):
          sentence.append(words[word])
          word = int(successor[word]) if rng.random() < follow else int(rng.integers(len(words)))
        lines.append(" ".join(sentence) + " .")
      lines.append("")
  path = root / "corpus.txt"
  path.write_text("\n".join(lines) + "\n")
  return path


def config(corpus: pathlib.Path, vocab: pathlib.Path) -> ml_collections.ConfigDict:
  """The tiny pretraining config on `corpus` and `vocab` (experiments/configs/pretrain.py:tiny
  with the small model and data shapes); batch, steps and checkpoints are the caller's."""
  cfg = pretrain.get_config("tiny")
  cfg.model.hidden_size = 64
  cfg.model.num_attention_heads = 2
  cfg.model.intermediate_size = 128
  cfg.model.max_position_embeddings = 64
  cfg.data.corpus = str(corpus)
  cfg.data.vocab_file = str(vocab)
  cfg.data.max_seq_length = 32
  cfg.data.masking.max_predictions_per_seq = 5
  cfg.data.shuffle_buffer = 32
  cfg.data.heldout_modulus = 10
  cfg.data.prefetch_batches = 1
  return cfg
