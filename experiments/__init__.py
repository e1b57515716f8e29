"""Experiments: configs as data, research entry points, benchmarks and dated results.

  configs             one config file per family: pretrain, data, finetune, ablation, suites
  ablation            `python -m experiments.ablation`: the masking ablation as one command
  evaluate            `python -m experiments.evaluate`: the paper's tables from a checkpoint
  benchmarks          scripts that print figures (pretrain/, finetune/, data/)
  small_pretraining   the small run the tests and CPU benchmarks share
  chinese_data        the real Chinese corpus, vocabulary and sentiment set-up
  chinese_sentiment   the research loop end to end on real Chinese text
  figures             a matplotlib figure written as PNG through the path layer

Dated figures live under experiments/results/ (its README is the index).
"""
