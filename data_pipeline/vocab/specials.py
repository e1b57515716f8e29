"""The special tokens every tokenizer here names by role: BERT's five, which ModernBERT's
byte-level BPE keeps too. A leaf module, so that the WordPiece/SentencePiece tokenizers
(tokenizers.py) and the tokenizer.json one (hf_tokenizer.py) share it without importing
each other."""

SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"}
