"""Preflight: the real pretraining step compiled for a TPU slice on this machine, before paying.

`python -m bert_jax.preflight` (__main__) prints each phase's HBM per chip
against the chip's and exits 1 when one does not fit; check (the verdict and
the knob search), compile (the step lowered and compiled, its memory, FLOPs
and collectives), knobs (the settings tried, cheapest first), targets (slices
as libtpu compile targets, libtpu's out-of-memory lines), isolation and child
(each compile in a child process, so a libtpu crash is one refused setting),
cache (remembered passes, JAX-free: bert_jax.launch reads it too).
Imports: bert_jax.model, bert_jax.training, bert_jax.pretrain and
bert_jax.accelerators; never bert_jax.launch, which runs it as a command.
"""
