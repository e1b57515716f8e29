"""Pretraining benchmarks: the step's speed, memory and fit, and a recipe's accuracy.

  accelerator      the real step on this machine's accelerators: seq/s, MFU, memory, compile
  train_step       tokens/s and MFU of the trainer's step against transformers + optax
  model_throughput forward+backward throughput against transformers' Flax BERT
  sharding         per-device memory and collectives of the real step on simulated meshes
  preflight_table  which recipes fit which TPU slices as shipped (the preflight over a grid)
  vmem_limit       whether libtpu's scoped-VMEM flag gives a v4 core more than its 16 MiB
  fast_recipe      what the fast recipe costs in accuracy, on CPU
  packing          packed documents against padded rows; sliding against full attention
  modern_vs_transformers  the modern encoder's step against transformers' PyTorch ModernBERT
"""
