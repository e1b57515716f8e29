"""The masking ablation: a grid of pretraining runs that differ only in their masks, and the report.

`python -m experiments.ablation` (__main__: flags), plan (the grid: every run's config
and where its outputs go, and compute matching under a model-FLOP budget, --dry_run),
stages (prepare, pretrain, check, fine-tune, report; each resumes), launch (--launch:
each pretraining run as its own Cloud TPU job through bert_jax.launch; --status) and
grid (a launched grid's state, DIR/grid.json), proof (the runs of one seed read
identical batches), stats (paired differences, t intervals, detectable differences),
power (--plan_seeds), suite (a downstream evaluation suite's members and average) and
report (report.md, results.csv, plots). Imports: anything of bert_jax, data_pipeline
and experiments; nothing imports it but the ours-against-transformers benchmarks
(experiments/benchmarks/finetune/seed_comparison), which judge their seeds with stats'
paired t interval.
"""
