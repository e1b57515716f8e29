"""Benchmarks: scripts that print figures, by what they measure (`python -m
experiments.benchmarks.<group>.<name> --help`): `pretrain/` (the step's speed, memory and
fit), `finetune/` (our trainer against transformers), `data/` (the input path). Their dated
figures live under experiments/results/.
"""
