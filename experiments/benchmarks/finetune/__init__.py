"""Fine-tuning benchmarks: our trainer against transformers, and what padding costs.

  finetune_vs_transformers  all-MiniLM-L6-v2 fine-tuned by both, several seeds; timed runs
  finetune_sides            that comparison's two sides, one run each
  sweep_report              its sweep report and the reading of a sweep run in pieces
  common_masks              one dropout-mask stream for both sides (the same-masks check)
  seed_comparison           what the two comparisons share: the reference optimizer, the report
  tagging_vs_transformers   People's Daily POS tagging: our tagging kind against transformers
  padding_accuracy          what fine-tuning learns under fixed padding, buckets, grouping
"""
