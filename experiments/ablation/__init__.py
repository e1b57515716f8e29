"""The masking ablation: a grid of pretraining runs that differ only in their masks, and the report.

`python -m experiments.ablation` (__main__: flags), stages (plan, prepare,
pretrain, check, fine-tune, report; each resumes), launch (--launch: each
pretraining run as its own Cloud TPU job through bert_jax.launch; --status) and
grid (a launched grid's state, DIR/grid.json), plan (compute matching under a
model-FLOP budget, --dry_run), proof (the runs of one seed read identical
batches), stats (paired differences, t intervals, detectable differences), power
(--plan_seeds) and report (report.md, results.csv, plots). Imports: anything of bert_jax,
data_pipeline and experiments; nothing imports it but the ours-against-transformers
benchmarks (experiments/benchmarks/seed_comparison), which judge their seeds with stats'
paired t interval.
"""
