"""ModernBERT's pretraining recipe as variants of experiments/configs/pretrain.py.

modernbert-base and modernbert-large take ModernBERT's published values: the yamls of
AnswerDotAI/ModernBERT (branch pretraining_documentation, 0e9dbe6d,
yamls/modernbert/modernbert-{base,large}-{pretrain,context-extension,learning-rate-decay}.yaml;
"L<n>" below is a line there) and its main.py. Their durations are tokens; a run here
counts steps, so each phase's steps are its tokens over its batch's tokens, and the
batch-size warmup's steps the warmup's tokens over its sizes' (bert_jax/pretrain/phases.py).

  pretraining      1024 tokens, 1.719T tokens (L115), masking 30% (L6; eval 15%, L90),
                   RoPE theta 10k global and local (L52: the 160k of the released config
                   comes with the extension), learning-rate warmup then held (L98-102)
  extension        8192 tokens, 250B tokens (L118), global theta 160k (L56), a lower rate
                   held (L109), batch 576 / 616 sequences (L120): the same tokens per step
  decay            8192 tokens, 50B tokens (L119), 1-sqrt to 0.001 x the rate (L102-106)

Optimizer (every phase, main.py L243-258): StableAdamW, betas (0.9, 0.98), eps 1e-6,
weight decay 1e-5 fully decoupled (decouple_lr=True; norms and biases spared), no
gradient clipping (main.py L421-428: StableAdamW's update clipping replaces it).
Not carried over: large's extension and decay lower the weight decay to 1e-6 (L114; a
phase here sets no weight decay, so the run keeps 1e-5), and its pretraining was rolled
back and restarted at 5e-5 after 900B tokens (the yaml's comment at L106; the paper).

`modern` is the same recipe at CPU scale on the embedded corpus (modernbert-tiny,
experiments/results/modern_tiny.md).
"""

import ml_collections

# The model fields every modern size shares (bert_jax.model.config.MODERN_SIZES), written
# into config.model so that a workdir records every value its run uses.
MODERN_MODEL = dict(architecture="modernbert", use_bias=False, norm_bias=False,
                    layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0, global_attn_every_n_layers=3,
                    rope_theta=160000.0, local_rope_theta=10000.0, type_vocab_size=1)

PUBLISHED = {
    # size: peak rate (L106), its warmup tokens (L98-102), batch (L117), batch warmup
    # tokens (L77-78) from its smallest size (one micro-batch per GPU on 8 GPUs: 96 x 8,
    # 56 x 8), the extension's batch (L120) and rate (L109).
    "modernbert-base": dict(rate=8e-4, warmup_tokens=3e9, batch=4608,
                            batch_warmup_tokens=50e9, min_batch=768, long_batch=576,
                            long_rate=3e-4),
    "modernbert-large": dict(rate=5e-4, warmup_tokens=2e9, batch=4928,
                             batch_warmup_tokens=10e9, min_batch=448, long_batch=616,
                             long_rate=5e-5),
}
TOKENS = (1_719e9, 250e9, 50e9)  # pretraining, extension, decay (L115, L118, L119)
LENGTHS = (1024, 8192)
VOCAB_SIZE = 50368  # ModernBERT's tokenizer (its config.json), a multiple of 64


def _steps(tokens: float, batch: int, length: int) -> int:
  return round(tokens / (batch * length))


def pack_documents(data: ml_collections.ConfigDict) -> None:
  """Documents packed by best fit over 64 open rows, each piece attending only to itself,
  every row filled to its end (pack_fill), so a shuffle block is 1,024 rows' tokens.
  With pack_fill=False rows close with room and a block is 1,024 documents, for at least
  98% of the tokens real (the data default's 256 fill 97.1-97.6% at 128 to 2,048 tokens
  on the embedded corpus, 1,024 with 64 open rows 98.7-99.2%:
  experiments/results/packing.md)."""
  data.objective = "documents"
  data.pack_window = 64
  data.pack_fill = True
  data.shuffle_buffer = 1024


def apply_published(config: ml_collections.ConfigDict, size: str, phase) -> None:
  """Sets config to ModernBERT's recipe for `size` (`phase`: pretrain.phase)."""
  p = PUBLISHED[size]
  config.model_size = size
  config.model.update(MODERN_MODEL)
  config.model.vocab_size = VOCAB_SIZE
  config.model.vocab_multiple = 64
  config.model.max_position_embeddings = ml_collections.FieldReference(None, field_type=int)
  pack_documents(config.data)
  config.data.masking.ratio = 0.3
  config.data.max_seq_length = LENGTHS[0]
  config.phase2.start_fraction = 1.0
  config.batch_size = p["batch"]
  config.batch_warmup.tokens = int(p["batch_warmup_tokens"])
  config.batch_warmup.min_batch_size = p["min_batch"]
  # Steps: the warmup's sizes (min, 2 min, ... below the batch) take equal steps, the
  # rest of pretraining the full batch, the extension and decay their own batch.
  sizes = sum(range(p["min_batch"], p["batch"], p["min_batch"]))
  warmup = _steps(p["batch_warmup_tokens"], 1, LENGTHS[0] * sizes) * len(
      range(p["min_batch"], p["batch"], p["min_batch"]))
  pretraining = warmup + _steps(TOKENS[0] - p["batch_warmup_tokens"], p["batch"], LENGTHS[0])
  extension = _steps(TOKENS[1], p["long_batch"], LENGTHS[1])
  decay = _steps(TOKENS[2], p["long_batch"], LENGTHS[1])
  config.total_steps = pretraining + extension + decay
  at = lambda step: step / config.total_steps
  config.phases = [
      phase(0.0, rope_theta=10000.0),
      phase(at(pretraining), max_seq_length=LENGTHS[1], batch_size=p["long_batch"],
            rope_theta=160000.0, learning_rate=p["long_rate"]),
      phase(at(pretraining + extension), decay="1-sqrt"),
  ]
  o = config.optimizer
  o.update(name="stableadamw", learning_rate=p["rate"], b1=0.9, b2=0.98, eps=1e-6,
           weight_decay=1e-5, fully_decoupled_weight_decay=True, grad_clip_norm=0.0,
           schedule="phases", end_learning_rate=p["long_rate"] * 1e-3,
           warmup_steps=_steps(p["warmup_tokens"], p["batch"], LENGTHS[0]))
  config.model.dtype = "bfloat16"
  config.model.attention_probs_dropout_prob = 0.0  # (MODERN_MODEL's) fused kernels train
  config.checkpoint.every_steps = 5_000
  config.eval_every_steps = 10_000


def apply_tiny(config: ml_collections.ConfigDict, phase) -> None:
  """The recipe at CPU scale: modernbert-tiny on the embedded corpus, 1,500 steps of 32
  sequences (after a batch warmup from 8), 128 tokens then 256 with the global theta
  raised, then a 1-sqrt decay; the same optimizer at the tiny BERT's peak rate."""
  config.model_size = "modernbert-tiny"
  config.model.update(MODERN_MODEL)
  # None: the size row's (1024 for modernbert-tiny): RoPE has no table, so this only
  # bounds the sequence length.
  config.model.max_position_embeddings = ml_collections.FieldReference(None, field_type=int)
  config.model.vocab_multiple = 1  # a CPU run, as "tiny"
  config.model.dtype = "float32"
  config.data.embedded_vocab_size = 8192  # tiny's vocabulary (the same cached file)
  config.data.embedded_vocab_max_lines = 100_000
  pack_documents(config.data)
  config.data.max_seq_length = 128  # twice modernbert-tiny's 64-token window
  config.data.masking.ratio = 0.3
  config.phase2.start_fraction = 1.0
  config.batch_size = 32
  config.batch_warmup.tokens = 128 * (8 + 16 + 24) * 20  # sizes 8, 16, 24: 20 steps each
  config.batch_warmup.min_batch_size = 8
  config.total_steps = 1500
  config.phases = [phase(0.0, rope_theta=10000.0),
                   phase(0.8, max_seq_length=256, batch_size=16, rope_theta=160000.0,
                         learning_rate=5e-4),
                   phase(0.9, decay="1-sqrt")]
  config.optimizer.update(name="stableadamw", learning_rate=1e-3, b1=0.9, b2=0.98, eps=1e-6,
                          weight_decay=1e-5, fully_decoupled_weight_decay=True,
                          grad_clip_norm=0.0, schedule="phases", warmup_steps=150,
                          end_learning_rate=5e-7)
  config.checkpoint.every_steps = 500
  config.checkpoint.keep_period = 0
  config.eval_every_steps = 500
  config.eval_batch_size = 32
  config.log_every_steps = 100
