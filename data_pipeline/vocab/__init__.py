"""Vocabularies and tokenizers: WordPiece and SentencePiece in-graph, a checkpoint's own
tokenizer.json, and learning a vocabulary.

  tokenizers      the in-graph tokenizers (tensorflow-text WordPiece, SentencePiece) that
                  pretraining, fine-tuning and feature extraction share; load_tokenizer
  hf_tokenizer    a tokenizer.json (ModernBERT's byte-level BPE) through the `tokenizers`
                  library (the `bpe` extra), with the same interface
  specials        the special tokens by role, shared by both
  vocab_training  learning a WordPiece vocabulary or SentencePiece model
  training_text   what one is learnt from: a glob's text lines, or a corpus spec's sentences
  vocab_cli       `python -m data_pipeline.vocab.vocab_cli`: learn one from files or a corpus

Imports: `host`, data_pipeline.sources (the corpus a vocabulary is learnt from).
"""
