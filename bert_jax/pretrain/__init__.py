"""Pretraining: the trainer, its pure steps, its losses, its phases and what a run costs.

trainer (train_and_evaluate, in labelled sections), steps (the one builder of the
step the trainer, preflight and benchmarks share, and the pure train and eval steps,
no TensorFlow), losses (one function per objective), phases (the run's phases,
made once, and which one a step is in) and cost (model FLOPs and
time on given devices: `python -m bert_jax.pretrain.cost`). Imports:
bert_jax.model, bert_jax.training, bert_jax.run, bert_jax.convert (an init
checkpoint) and data_pipeline's prepare and specs; never bert_jax.finetune.
"""
