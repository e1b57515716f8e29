"""bert_jax: pretraining and fine-tuning BERT-family encoders with JAX/Flax.

  main, jobs        the entry point (`python -m bert_jax.main`) and a job's run and exit codes
  errors            the one-line refusal of a user's input (UsageError, judging_input)
  exit_codes        a job's exit codes and its state file's name
  accelerators      the table of accelerator facts (TPU generations, GPUs, peaks)
  extract_features  `python -m bert_jax.extract_features`: features of any checkpoint
  model             the network (imports nothing else of the project)
  training          what both trainers share: the sharded state, the loop, meshes, optimizers
  pretrain          pretraining: the step's builder, the trainer, losses, phases, cost
  finetune          fine-tuning: kinds, readers, features, the sweep and the run
  run               a run's record on disk (imports neither trainer)
  convert           checkpoints in and out (Hugging Face, TF, our own)
  preflight         the real step compiled for a TPU slice here, before paying for it
  launch            Cloud TPU slices, jobs detached, watched, relaunched (never imports JAX)

Layers: `host` under `data_pipeline` under `bert_jax` (docs/architecture.md).
"""

# libtpu's flags that compiling this project's steps needs, set before any libtpu starts
# (host/libtpu_flags.py says which and why); here, so that every process has them.
from host import libtpu_flags as _libtpu_flags  # pylint: disable=g-import-not-at-top

_libtpu_flags.apply()
