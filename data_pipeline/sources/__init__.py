"""Text sources: where a corpus's documents come from, as text.

  corpora            corpus globs, Parquet, JSONL, tfds and the embedded corpus; decoding
                     checks, the held-out hash, the corpus fingerprint
  embedded           the embedded corpus: installed packages' docstrings, harvested once
  parquet_files      Parquet files read in record batches
  sentences          sentence splitting (blingfire, regex)
  text_lines         where a text file's lines end ("\n", "\r\n", a lone "\r")
  word_segmentation  gold or jieba word boundaries for whole-word masking

Imports: `host` only (and each other): nothing of the vocabulary, the store or the examples.
"""
