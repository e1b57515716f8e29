"""Configs as pure data, one file per family (`get_config(arg)`; variants by argument):

  pretrain        pretraining variants (tiny, base, large, roberta, albert, efficient, modern,
                  modernbert-base/-large, fast)
  modern_recipe   ModernBERT's published recipe (and its CPU scale) as pretrain variants
  data            the data block: corpus, tokenizer, pairs, masking, held-out set
  optim_and_mesh  the optimizer and mesh/sharding blocks every family shares
  finetune        fine-tuning, the task by argument
  chinese         the Chinese research loop's pretraining and sentiment configs
  ablation        the masking ablation's grids
  suites          evaluation suites and the paper's figures
"""
