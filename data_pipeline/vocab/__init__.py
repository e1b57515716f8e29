"""Vocabularies and tokenizers: WordPiece and SentencePiece in-graph, and learning a vocabulary.

  tokenizers      the in-graph tokenizers (tensorflow-text WordPiece, SentencePiece) that
                  pretraining, fine-tuning and feature extraction share
  vocab_training  learning a WordPiece vocabulary from a corpus
  vocab_cli       `python -m data_pipeline.vocab.vocab_cli`: learn one from files

Imports: `host`, data_pipeline.sources (the corpus a vocabulary is learnt from).
"""
