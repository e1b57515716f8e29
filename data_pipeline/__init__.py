"""The pretraining input: text to batches of masked pairs, in tf.data, on the host.

  sources   where documents come from: files, Parquet, JSONL, tfds, the embedded corpus
  vocab     tokenizers and learning a vocabulary
  store     the tokenized corpus and its on-disk store, tokenized once and shared
  examples  pairs, masking and the resumable tf.data input
  specs     what a data config asks for, judged without data; a run's Phase
  prepare   PretrainingData: a run's data prepared once (bert_jax's way in)
  preview   a few batches written and printed with their masks visible

Imports `host` only, never bert_jax; bert_jax reaches it through prepare, specs and
vocab.tokenizers (tests/test_architecture.py).
"""
