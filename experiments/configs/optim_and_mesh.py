"""Config blocks every experiment family shares (one definition of each default).

optimizer_config()   optax AdamW / LAMB fields read by bert_jax.training.optim
add_sharding(config) device mesh, logical-axis rules and multi-host fields read by
                     bert_jax.training.sharding and bert_jax.training.state
"""

import ml_collections


def optimizer_config() -> ml_collections.ConfigDict:
  """The optimizer fields; families set learning_rate and warmup for their recipe."""
  c = ml_collections.ConfigDict()
  # "adamw" | "lamb" | "stableadamw" (AdamW with per-tensor update clipping: optimi's,
  # ModernBERT's; bert_jax/training/optim.py)
  c.name = "adamw"
  c.learning_rate = 1e-4  # peak learning rate (BERT pretraining value)
  c.warmup_steps = 10_000  # linear warmup from 0 to the peak (BERT pretraining value)
  c.decay_power = 1.0  # polynomial decay from peak to end_learning_rate; 1 = linear
  c.end_learning_rate = 0.0  # learning rate at total_steps
  c.decay_from_step0 = False  # True: google-research/bert schedule (decay spans warmup too)
  # "polynomial": warmup, then the decay above over the rest (BERT's); "wsd": warmup, the
  # peak held, then decay_shape over the last decay_steps (bert_jax/training/schedules.py);
  # "phases": each of a pretraining run's config.phases holds or decays its learning_rate.
  c.schedule = "polynomial"
  c.decay_steps = 0  # wsd: length of the final decay
  c.decay_shape = "linear"  # wsd: "linear" | "1-sqrt" | "cosine"
  c.b1 = 0.9  # Adam beta1
  c.b2 = 0.999  # Adam beta2
  c.eps = 1e-6  # google-research/bert value
  c.weight_decay = 0.01  # decoupled; spared: LayerNorm and biases
  # True: each step decays by weight_decay x lr / peak lr (optimi's decouple_lr, ModernBERT's
  # 1e-5), not weight_decay x lr.
  c.fully_decoupled_weight_decay = False
  c.bias_correction = True  # False reproduces google-research/bert AdamWeightDecayOptimizer
  c.grad_clip_norm = 1.0  # global-norm clipping before the optimizer; 0 = no clipping
  return c


def add_sharding(config: ml_collections.ConfigDict) -> None:
  """Adds config.mesh, config.logical_axis_rules, config.distributed and config.require_accelerator."""
  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # data-parallel axis; -1 takes the devices left over
  config.mesh.fsdp = 1  # parameter/optimizer-state sharding axis (also splits the batch)
  config.mesh.tensor = 1  # tensor-parallel axis (heads, mlp, vocab)
  # Logical axis name -> mesh axes, in order of precedence: a mesh axis is used once
  # per array, so "embed" activations fall back to replicated when "batch" took fsdp.
  config.logical_axis_rules = [
      # Rows just looked up in an embedding table keep its split of E (as "embed")
      # with the batch over "data", then move to the batch layout; straight from the
      # lookup to it, GSPMD replicates the global batch when data and fsdp split it.
      ("table_embed", "fsdp"),
      ("batch", ("data", "fsdp")),
      ("batch", "data"),  # where table_embed took fsdp
      ("embed", "fsdp"),
      ("heads", "tensor"),
      ("mlp", "tensor"),
      ("vocab", "tensor"),  # the padded vocabulary (config.model.vocab_multiple) splits evenly
      ("kv", None),
      ("length", None),
      ("layers", None),
      ("pos", None),
      ("type", None),
  ]
  config.distributed = ml_collections.ConfigDict()
  config.distributed.enabled = False  # call jax.distributed.initialize (multi-host)
  config.distributed.coordinator_address = ""  # "host:port"; "" -> discovered from the environment
  config.distributed.num_processes = 0  # 0 -> discovered from the environment
  config.distributed.process_id = -1  # -1 -> discovered from the environment
  config.require_accelerator = False  # True: stop when JAX finds only CPUs (SLURM template sets it)
