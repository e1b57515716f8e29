"""Fine-tuning on downstream tasks: task kinds, their readers and featurisers, the trainer.

The trainer never names a kind of task; it asks the kind's object.

  sweep                finetune(config, workdir): every (learning rate, seed) run, summary.json
  prepare              the config's checks and Prepared: the checkpoint and task read once
  trainer              finetune_run: one run in labelled sections
  steps                the pure train/eval steps, built once per sweep and shape
  metrics              accuracy / F1 / MCC / Pearson / Spearman, SQuAD EM/F1, entity F1

  kinds/               a kind of task as one object (classification, ner, squad, tagging)
                       and the registry that finds it by config.task.kind
  readers/             a format's files as records (GLUE, CSV/TSV/JSONL, tfds, CoNLL, SQuAD)
  features/            records to padded rows (tokenization, packing, windows, buckets)
"""
