"""The paper's downstream tables from any checkpoint, as one resumable command.

  python -m experiments.evaluate --suite=glue|squad|paper|zh|FILE.py:ARG \
      --init_checkpoint=CKPT --workdir=DIR [--glue_dir=...] [--squad_dir=...]

A suite (experiments/configs/suites.py) names its members (any task the fine-tuning
configs know, `custom` CSV/TSV/JSONL sets included), the paper's protocol, and the
paper's figures with their sources. This package only plans, orders, resumes and
collects; every run is the fine-tuning trainer's (bert_jax.finetune.trainer, through
bert_jax.jobs.run), one sweep workdir per member.

  plan.py         the members' complete configs, checked; DIR/suite.json, the record
  execute.py      the members in turn (cheapest first), timed; the report after each
  collect.py      summary.json -> our figures; the GLUE averages, two ways
  table.py        table.md (nothing in it changes on re-render), results.csv, times.md
  leaderboard.py  the GLUE submission zip from each task's best run
  plot.py         our seeds beside the paper's figures, per task
  estimate.py     --dry_run (examples, steps, FLOPs, time) and --print_commands
  __main__.py     the flags

It may import bert_jax (the trainer, its jobs and run record, the cost model) and
experiments/configs; nothing in bert_jax imports it.
"""
