r"""BERT-family pretraining: one config file, variants by argument.

Launch (the README main job; its output and its measured time are in README.md,
"What the main job does"):

  python -m bert_jax.main --config=experiments/configs/pretrain.py:tiny \
      --workdir=/tmp/bert_tiny

metrics.jsonl and TensorBoard events land in the workdir; re-running the command
resumes there.

Other variants:
  base     BERT-Base paper recipe: 1M steps, batch 256, 90% at seq 128 (20
           predictions) then 10% at seq 512 (77: 15% of 512), Adam lr 1e-4,
           warmup 10k, weight decay 0.01 (published BERT-Base runs end near MLM acc 0.7).
  large    the same with BERT-Large (L=24, H=1024, A=16).
  roberta  no NSP, full-sentence packing (objective "none"), dynamic masking.
  albert   SOP objective, factorised embeddings E=128, cross-layer sharing, LAMB.
  modernbert-base, modernbert-large
           ModernBERT's recipe with its published values: packed documents (objective
           "documents"), 30% masking, StableAdamW, batch-size warmup, 1,024 tokens then
           8,192 with the global RoPE theta raised, then a 1-sqrt decay
           (experiments/configs/modern_recipe.py holds each value's source).
  modern   the same recipe at CPU scale (modernbert-tiny on the embedded corpus);
           experiments/results/modern_tiny.md.
  efficient  Wettig et al. 2023 ("Should You Mask 15% in Masked Language Modeling?"),
           as princeton-nlp/DinkyTrain's run_efficient_mlm_recipe.sh sets it: pre-LN
           RoBERTa-large, no NSP, mask-only at 40%, batch 4096, lr 2e-3, 23k steps at
           length 128 (each value's source in the branch below; cost and preflight
           lines in docs/pretraining.md and docs/pods.md).
  tiny_fast, base_fast, large_fast
           the fast recipe: the variant with attention_probs_dropout_prob 0 (as
           MosaicBERT and Cramming train), so that attention "auto" trains through
           a fused kernel (cuDNN flash attention on NVIDIA GPUs, Pallas splash on
           TPUs) instead of the einsum path that materialises [B,N,T,T] logits and a
           dropout mask; base_fast and large_fast also draw dropout bits with "rbg".
           The paper variants keep attention dropout 0.1 and so the exact einsum path.

What the fast recipe costs in accuracy: experiments/results/fast_recipe.md (result
and command; experiments/benchmarks/pretrain/fast_recipe.py) and docs/speed.md. The longer
check on real text (tiny vs tiny_fast, 1500 steps, several seeds) is not yet run.

Remat policies (config.model.remat_policy): the same gradients, strictly less kept
from none to full (tests/test_remat.py). What each keeps and costs, with the
commands: docs/speed.md ("Memory and compile knobs").

Single fields by flag, e.g. `--config.total_steps=1000 --config.mesh.fsdp=4`.
On a TPU pod slice: `--config.distributed.enabled=True` on every host (the
coordinator is discovered from the environment); nothing else changes.
"""

import ml_collections

from experiments.configs import data as data_configs
from experiments.configs import modern_recipe
from experiments.configs import optim_and_mesh

VARIANTS = ("tiny", "base", "large", "roberta", "albert", "efficient", "modern",
            "modernbert-base", "modernbert-large", "tiny_fast", "base_fast", "large_fast")


# The slices where a variant does not fit as configured, with the knob that makes it fit:
# measured by the preflight (experiments/results/preflight.md: BERT-Base and -Large, paper
# and fast, v4-8 / v4-32 / v5litepod-16 / v6e-8; the efficient recipe; modern_recipe.md:
# modernbert-base on v5p-8 and v6e-8). A slice not named here fits as configured or was
# not measured: the preflight says which.
_FSDP = "mesh.data=1 mesh.fsdp=-1"
LAYOUTS = {
    # Scanned, 64 sequences of 512 tokens per chip need >= 39.6 GiB data parallel
    # (unrolled: 23.7; likely what the backward pass keeps, as stacked loop outputs that
    # XLA cannot recompute or free early as it can unrolled).
    "base": ("v4-8: " + _FSDP + " model.remat_policy=dots_saveable",),
    "large": ("v4-8: " + _FSDP + " model.remat_policy=dots_with_no_batch_dims_saveable",
              "v5litepod-16: " + _FSDP + " model.remat_policy=dots_saveable",
              # Before host/libtpu_flags.py's fiber stack, libtpu crashed compiling this
              # (stack overflow), and full remat + 8 micro-batches was what compiled.
              "v6e-8: " + _FSDP + " model.remat_policy=dots_saveable"),
    "large_fast": ("v4-8: " + _FSDP + " model.remat_policy=dots_saveable",
                   "v5litepod-16: " + _FSDP + " model.remat_policy=dots_saveable",
                   "v6e-8: " + _FSDP + " model.remat_policy=dots_saveable"),
    "efficient": ("v4-8: " + _FSDP + " model.remat_policy=full",
                  "v4-32: " + _FSDP + " model.remat_policy=dots_saveable",
                  "v5litepod-16: " + _FSDP + " model.remat_policy=save_qkv_out_proj",
                  "v6e-8: " + _FSDP + " model.remat_policy=save_qkv_out_proj"),
    "modernbert-base": ("v5p-8: grad_accum_steps=12",
                        "v6e-8: " + _FSDP + " model.remat_policy=full grad_accum_steps=12"),
}


def phase(start_fraction: float, **fields) -> ml_collections.ConfigDict:
  """One config.phases entry: every field (bert_jax.pretrain.phases.PHASE_FIELDS), 0 or ""
  keeping the previous phase's value; flags reach them as --config.phases[1].masking_ratio=..."""
  entry = ml_collections.ConfigDict(dict(
      start_fraction=float(start_fraction), max_seq_length=0, max_predictions_per_seq=0,
      masking_ratio=0.0, batch_size=0, rope_theta=0.0, local_rope_theta=0.0,
      learning_rate=0.0, decay=""))
  unknown = set(fields) - set(entry.keys())
  if unknown:
    raise ValueError(f"phase(): unknown field(s) {sorted(unknown)}")
  entry.update(fields)
  return entry


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  """Returns the pretraining config for variant `arg` (one of VARIANTS)."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown pretrain variant {arg!r}; expected one of {VARIANTS}")
  fast = arg.endswith("_fast")
  arg = arg.removesuffix("_fast")
  config = ml_collections.ConfigDict()
  config.family = "pretrain"  # tells bert_jax.main which trainer runs this config
  config.variant = arg + ("_fast" if fast else "")  # recorded so a workdir says what it is

  # --- model ---
  config.model_size = "base"  # row of bert_jax.model.config.SIZES giving (L, H, A)
  config.model = ml_collections.ConfigDict()  # BertConfig fields overriding the size row
  config.model.vocab_size = 0  # 0 -> the size of the vocabulary the pipeline tokenizes with
  # Word table and MLM logits padded to a multiple of this (30,522 -> 30,592): splits
  # evenly over config.mesh.tensor and fills matrix units; losses are unchanged.
  config.model.vocab_multiple = 128
  config.model.dtype = "bfloat16"  # compute dtype; params and optimizer state stay float32
  config.model.embedding_size = ml_collections.FieldReference(None, field_type=int)  # ALBERT E; None -> H
  config.model.share_layers = False  # ALBERT cross-layer parameter sharing
  config.model.hidden_dropout_prob = 0.1  # paper value
  config.model.attention_probs_dropout_prob = 0.1  # paper value
  # True: one [T, T] attention-dropout mask shared by every example and head (transformers'
  # Flax BERT); False: one per example, head, query and key (the paper's, google-research/bert).
  config.model.attention_dropout_shared = False
  # Attention kernel (bert_jax/model/attention.py): auto takes the paper's einsum path wherever
  # attention probabilities are dropped in training, else cuDNN flash attention on NVIDIA
  # GPUs (bf16), Pallas splash on TPUs, XLA elsewhere; einsum|xla|cudnn|splash force one.
  # Runtime only: every kernel computes the same attention (tests/test_attention.py).
  config.model.attention_impl = "auto"
  # What each layer keeps for the backward pass (bert_jax.model.config.REMAT_POLICIES): "none"
  # keeps everything (fastest); "full" only layer inputs (least memory, ~1 extra forward,
  # i.e. ~+33% step FLOPs); "dots_saveable" / "dots_with_no_batch_dims_saveable" keep
  # matmul outputs (all / the dense projections only); "save_qkv_out_proj" keeps q, k, v
  # and the attention output. Same numbers whatever the policy (tests/test_remat.py).
  config.model.remat_policy = "none"
  config.model.scan_layers = False  # nn.scan over layers: faster compiles for deep models
  # Pre-LN blocks with a final LayerNorm (fairseq's --encoder-normalize-before, HF's
  # RobertaPreLayerNorm; Wettig et al.'s recipe below); False: BERT's post-LN.
  config.model.pre_layer_norm = False
  # First token's position: 0 BERT's; RoBERTa's 2 (pad id + 1; padding takes the row before),
  # which needs max_position_embeddings = max length + 2.
  config.model.position_offset = 0
  config.model.max_position_embeddings = 512  # rows of the position table (BERT's)
  config.model.type_vocab_size = 2  # segment types: BERT's A/B; 1 (RoBERTa) reads no segment ids
  config.model.layer_norm_eps = 1e-12  # google-research/bert's; fairseq's LayerNorm: 1e-5
  # The modern encoder (bert_jax/model/modern.py; the "modern" variant sets these). Each
  # default is BERT's, so these fields change nothing for the BERT-family variants.
  config.model.architecture = "bert"  # "modernbert": pre-norm, RoPE, GLU, local/global layers
  config.model.rope_theta = 160000.0  # modernbert: RoPE base of the global layers
  config.model.local_rope_theta = 10000.0  # modernbert: RoPE base of the sliding-window layers
  config.model.global_attn_every_n_layers = 1  # modernbert: layer i global when i % n == 0
  # modernbert: the sliding window in tokens (None: the size row's, 128 for ModernBERT's).
  config.model.local_attention = ml_collections.FieldReference(None, field_type=int)
  config.model.glu_activation = "gelu"  # modernbert: GeGLU ("gelu") or SwiGLU ("silu")
  config.model.use_bias = True  # modernbert: biases in the linear layers
  config.model.norm_bias = True  # modernbert: biases in the norms
  config.model.norm = "layernorm"  # modernbert: "layernorm" or "rmsnorm"
  config.model.tie_word_embeddings = True  # modernbert: MLM decoder is the word table

  # --- data (every field and its default: experiments/configs/data.py) ---
  config.data = data_configs.data_config()
  config.data.max_seq_length = 128  # phase-1 length (paper: 90% of steps at 128)
  # 0 derives the static number of predictions from the masking ratio (20 at length 128 and
  # 15%, the paper's), so an ablation changes the ratio and nothing else. Pin it only to cap.
  config.data.masking.max_predictions_per_seq = 0

  # Phase 2: from step int(start_fraction * total_steps) the pipeline is rebuilt
  # with the longer sequences; parameters, optimizer state and LR schedule carry on.
  config.phase2 = ml_collections.ConfigDict()
  config.phase2.start_fraction = 0.9  # 1.0 disables the second phase
  config.phase2.max_seq_length = 512  # paper value
  # 0: derived at phase 2's length (77 at 512 and 15%; the paper pads to 80, a cap
  # round(0.15 * 512) = 77 never reaches, so the masks are the same).
  config.phase2.max_predictions_per_seq = 0

  # A run as a list of phases (bert_jax/pretrain/phases.py), each made by phase() below:
  # from its start_fraction of total_steps on, its own length, masking ratio, batch size,
  # RoPE thetas and learning-rate segment. Empty: config.phase2 decides (the paper's).
  config.phases = []
  # Batch-size warmup (ModernBERT's): the first `tokens` of the first phase trained at
  # min_batch_size, 2x, ... below its batch size, each size for the same number of steps.
  config.batch_warmup = ml_collections.ConfigDict()
  config.batch_warmup.tokens = 0  # 0: none
  config.batch_warmup.min_batch_size = 0

  # --- optimization ---
  config.batch_size = 256  # global batch (all hosts, all micro-batches)
  config.grad_accum_steps = 1  # micro-batches per update; same update as the full batch
  config.total_steps = 1_000_000  # optimizer updates
  config.seed = 0  # parameter init and dropout
  # Dropout's random bits: "threefry" (the default generator: the same bits on every
  # backend and mesh), "rbg" / "unsafe_rbg" (XLA's RngBitGenerator: far cheaper on GPUs
  # and TPUs; the bits depend on the backend and the sharding, so a run resumed on
  # another mesh draws other masks). Each resumes bit-exactly on the same set-up.
  config.rng_impl = "threefry"
  config.optimizer = optim_and_mesh.optimizer_config()
  config.skip_nonfinite_steps = False  # True: skip NaN/Inf updates instead of stopping

  # --- sharding ---
  optim_and_mesh.add_sharding(config)
  # Layouts tested per slice (bert_jax/run/layouts.py): "SLICE: field=value ...", each the
  # cheapest knob the preflight found to fit (experiments/results/preflight.md); applied
  # when config.slice names that slice (the launcher passes its accelerator type), unless a
  # flag sets the field or the workdir records another value. "none": as configured.
  config.layout = "auto"
  config.slice = ""
  config.layouts = ()

  # --- checkpoints, evaluation, logging ---
  config.init_checkpoint = ""  # used only when the workdir has no checkpoint; see bert_jax.convert
  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 10_000  # save period
  config.checkpoint.keep = 3  # keep the last N checkpoints...
  config.checkpoint.keep_period = 100_000  # ...plus every K-th step forever (0: none)
  config.checkpoint.async_save = True  # write in the background while training continues
  config.eval_every_steps = 10_000  # periodic held-out evaluation (also at the end)
  config.eval_batch_size = 64  # global eval batch
  config.log_every_steps = 100  # progress line, TensorBoard and metrics.jsonl
  config.peak_tflops_per_device = 0.0  # for MFU; 0 -> look the device kind up in bert_jax.accelerators

  if arg == "tiny":
    config.model_size = "tiny"
    config.model.vocab_multiple = 1  # a CPU run: padding buys nothing
    config.model.dtype = "float32"  # bfloat16 matmuls are emulated, i.e. slow, on CPU
    config.data.max_seq_length = 64  # the embedded corpus has short documents
    # A small vocab learnt from part of the corpus: the learner is pure Python, so this
    # keeps the one-off set-up on a fresh machine to ~2 minutes (cached afterwards).
    config.data.embedded_vocab_size = 8192
    config.data.embedded_vocab_max_lines = 100_000
    config.phase2.start_fraction = 1.0
    config.batch_size = 32
    config.total_steps = 1500  # the main job; its measured time is in the README
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 150
    config.checkpoint.every_steps = 500
    config.checkpoint.keep_period = 0
    config.eval_every_steps = 500
    config.eval_batch_size = 32
    config.log_every_steps = 100
  elif arg == "base":
    # 12 layers compiled once: BERT-Base's preflight for a slice takes 2-4 minutes here, not
    # 15-25. Unrolled, libtpu also fuses layer 11's output projection into a reduction that
    # needs 16.5 MiB of a v4 core's 16 MiB of VMEM at 512 tokens on a v4-32 (the scanned
    # step fits data parallel there): experiments/results/preflight.md.
    config.model.scan_layers = True
  elif arg == "large":
    config.model_size = "large"  # the paper trains Large with the very recipe of Base
    # 24 layers compiled once: the whole train step compiles several times faster
    # (measured in docs/speed.md, "Memory and compile knobs").
    config.model.scan_layers = True
  elif arg == "roberta":
    config.data.objective = "none"  # no NSP: full sentences packed up to the length
    config.optimizer.learning_rate = 6e-4  # RoBERTa-base value (batch 8k in the paper)
    config.optimizer.b2 = 0.98  # RoBERTa value for stability at large batch
    config.optimizer.warmup_steps = 24_000  # RoBERTa-base value
    config.phase2.start_fraction = 1.0  # RoBERTa trains at full length throughout...
    config.data.max_seq_length = 512  # ...of 512 tokens
  elif arg == "albert":
    config.data.objective = "sop"
    config.model.embedding_size = 128  # ALBERT factorised embedding
    config.model.share_layers = True
    config.model.hidden_dropout_prob = 0.0  # ALBERT trains without dropout
    config.model.attention_probs_dropout_prob = 0.0
    config.optimizer.name = "lamb"  # ALBERT recipe: LAMB, lr 1.76e-3 at batch 4096
    config.optimizer.learning_rate = 1.76e-3
    config.optimizer.warmup_steps = 3_125
    config.batch_size = 4096
    config.total_steps = 125_000
    config.phase2.start_fraction = 1.0  # ALBERT samples length 512 throughout
    config.data.max_seq_length = 512
  elif arg == "efficient":
    # Wettig et al.'s efficient pretraining recipe. Values from DinkyTrain's
    # run_efficient_mlm_recipe.sh (fairseq-train flags named) unless said otherwise.
    config.model_size = "large"  # --arch roberta_large: L=24, H=1024, A=16, FFN 4096
    config.model.scan_layers = True  # compile speed only (as "large")
    config.model.pre_layer_norm = True  # --encoder-normalize-before (embedding LayerNorm kept:
                                        # roberta_large's layernorm_embedding=True)
    # fairseq's learned positions: padding_idx 1, --max-positions 512 -> 514 rows from 2.
    config.model.position_offset = 2
    config.model.max_position_embeddings = 514
    config.model.type_vocab_size = 1  # RoBERTa has no segment embedding to speak of
    config.model.layer_norm_eps = 1e-5  # fairseq's LayerNorm default
    config.model.hidden_dropout_prob = 0.1  # --dropout 0.1
    config.model.attention_probs_dropout_prob = 0.1  # --attention-dropout 0.1 (einsum path)
    # --fp16 in the script; bfloat16 here (TPUs), float32 params and optimizer state.
    config.data.objective = "none"  # --task masked_lm: no NSP; packed full sentences here,
    # where --sample-break-mode none cuts the token stream at any token.
    config.data.max_seq_length = 128  # TOKENS_PER_SAMPLE=128
    config.phase2.start_fraction = 1.0  # one length throughout
    config.data.masking.ratio = 0.4  # MASK_RATE=0.4 (--mask-prob)
    config.data.masking.mask_prob = 1.0  # SAME_RATE=0, RANDOM_RATE=0: every prediction [MASK]
    config.data.masking.random_prob = 0.0  # --random-token-prob 0
    config.data.masking.keep_prob = 0.0  # --leave-unmasked-prob 0
    config.batch_size = 4096  # BSZ=4096 (MAX_SENTENCES x GPUs x --update-freq)
    config.total_steps = 23_000  # TOTAL_UPDATES=23000 (--max-update, --total-num-update)
    config.seed = 1  # --seed 1
    config.optimizer.name = "adamw"  # --optimizer adam (fairseq's Adam decays decoupled)
    config.optimizer.learning_rate = 2e-3  # PEAK_LR=2e-3
    config.optimizer.warmup_steps = 1_380  # WARMUP_UPDATES=1380 (6%)
    config.optimizer.decay_power = 1.0  # --lr-scheduler polynomial_decay (power 1 by default)
    config.optimizer.end_learning_rate = 0.0  # its --end-learning-rate default
    config.optimizer.b1 = 0.9  # --adam-betas '(0.9,0.98)'
    config.optimizer.b2 = 0.98
    config.optimizer.eps = 1e-6  # --adam-eps 1e-6 (fairseq adds it to sqrt(v) before
                                 # bias correction: the same but for the first steps)
    # --weight-decay 0.01. fairseq decays every parameter; ours spares LayerNorm and biases
    # (optim.weight_decay_mask), a difference of no weight-decay on <0.1% of the weights.
    config.optimizer.weight_decay = 0.01
    config.optimizer.bias_correction = True  # fairseq's Adam corrects the moments
    config.optimizer.grad_clip_norm = 0.0  # --clip-norm 0.0: no clipping
    config.checkpoint.every_steps = 5_000  # SAVE_INTERVAL_UPDATES=5000
    config.checkpoint.keep_period = 5_000  # --keep-interval-updates 100 keeps every one
    config.eval_every_steps = 5_000  # --validate-interval-updates 5000
  elif arg == "modern":
    modern_recipe.apply_tiny(config, phase)  # ModernBERT's recipe at CPU scale
  elif arg in modern_recipe.PUBLISHED:
    modern_recipe.apply_published(config, arg, phase)  # ModernBERT's published values
  config.layouts = LAYOUTS.get(arg + ("_fast" if fast else ""), ())
  if fast:
    # The fast recipe: no dropout on the attention probabilities (MosaicBERT and Cramming
    # train so), so the fused kernels (cuDNN flash attention, splash) serve training.
    # Hidden dropout stays 0.1. The docstring holds what it costs in accuracy.
    config.model.attention_probs_dropout_prob = 0.0
    if arg != "tiny":  # tiny_fast differs from tiny in nothing else: the comparison
      config.rng_impl = "rbg"  # XLA's generator for the hidden-dropout masks
  return config
