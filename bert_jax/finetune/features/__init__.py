"""Features: records turned into the model's padded rows.

  tokenization    our tokenizers as word -> wordpieces
  bpe             RoBERTa's byte-level BPE through `tokenizers` (an optional extra)
  packing         [CLS] A [SEP] (B [SEP]) rows, truncation, classification features
  token_features  first-sub-token features of tagged words, per-word predictions
  windows         overlapping windows over long piece sequences, max-context scoring
  buckets         length buckets, batches of fixed padding's rows, eval batches
  packed          a batch's examples packed into as few rows as hold them (padding "packed")

Imports: `host`, data_pipeline's tokenizers, bert_jax.finetune.readers (records).
"""
