"""What the ours-against-transformers benchmarks share: the reference optimizer and the report.

finetune_vs_transformers (sentence classification from MiniLM) and
tagging_vs_transformers (People's Daily POS) train the same data with the
same recipe in our trainer and in a plain optax loop around a transformers
model, over several seeds. The reference's optimizer is written here, not
taken from bert_jax.training.optim, so the reference shares no code with the side it
checks. The report judges each metric twice: the difference of medians against the seed
spread, and the paired test the ablation's reports use (experiments/ablation/stats.py),
because a small gap of one sign on every seed passes the spread rule and only the paired
interval shows it.
"""

import argparse
import functools
import json
import pathlib
from typing import Callable, Sequence

import jax
import numpy as np
import optax

from experiments.ablation import stats as paired_stats


def flags(doc: str, *, examples: tuple[str, int, int], max_seq_length: int, epochs: int,
          learning_rate: float) -> argparse.ArgumentParser:
  """The benchmarks' shared flags (the recipe both sides read) with the task's defaults.

  Args:
    doc: the benchmark's module docstring (its first line describes the command).
    examples: (noun, train default, dev default): flags --train_<noun>, --dev_<noun>,
      the sizes of the fixed samples (splits.subset) both sides train and score on.
    max_seq_length, epochs, learning_rate: the task's defaults of those flags.
  """
  noun, train, dev = examples
  parser = argparse.ArgumentParser(description=doc.split("\n")[0])
  parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
  parser.add_argument("--only", choices=("ours", "reference"), default=None,
                      help="run one implementation only")
  parser.add_argument(f"--train_{noun}", type=int, default=train, help="splits.subset of train")
  parser.add_argument(f"--dev_{noun}", type=int, default=dev, help="splits.subset of dev")
  parser.add_argument("--max_seq_length", type=int, default=max_seq_length)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--eval_batch_size", type=int, default=128, help="dev batch (both sides)")
  parser.add_argument("--epochs", type=int, default=epochs)
  parser.add_argument("--learning_rate", type=float, default=learning_rate)
  parser.add_argument("--warmup_proportion", type=float, default=0.1)
  parser.add_argument("--weight_decay", type=float, default=0.01)
  parser.add_argument("--max_grad_norm", type=float, default=1.0)
  parser.add_argument("--dropout", type=float, default=0.1, help="hidden, attention and head")
  parser.add_argument("--json_out", default=None, help="also write all runs and stats here")
  return parser


def set_recipe(config, args: argparse.Namespace) -> None:
  """The recipe flags both benchmarks give our trainer's config (the rest is each task's)."""
  config.max_seq_length = args.max_seq_length
  config.batch_size = args.batch_size
  config.num_epochs = args.epochs
  config.optimizer.learning_rate = args.learning_rate
  config.model.dtype = "float32"
  config.model.hidden_dropout_prob = args.dropout
  config.model.attention_probs_dropout_prob = args.dropout


def run_seeds(args: argparse.Namespace, sides: Sequence[str], run: Callable[[int, str], dict],
              line: Callable[[dict], str], report: Callable[..., dict]) -> dict:
  """Runs `run(seed, side)` for every seed and side, printing `line(result)` after each;
  then the report, and the JSON file when --json_out asks. Returns the report's stats."""
  results = {s: {} for s in sides}
  for seed in args.seeds:
    for side in sides:
      r = run(seed, side)
      results[side][seed] = r
      print(f"seed {seed} {side:9s} {line(r)}  {r['seconds']:.1f} s", flush=True)
  stats = report(args, results)
  if args.json_out:
    write_json(args.json_out, args, results, stats)
  return stats


def write_json(path: str, args: argparse.Namespace, results: dict, stats: dict) -> None:
  """Every run, the flags and the statistics, for a script to read."""
  pathlib.Path(path).write_text(json.dumps(
      {"args": vars(args), "runs": {s: {str(k): v for k, v in r.items()}
                                    for s, r in results.items()},
       "stats": stats}, indent=2))


def decay_mask(params):
  """True where weight decay applies: not on biases or LayerNorm (run_flax_glue's rule)."""
  def decays(path, _):
    names = [str(getattr(k, "key", k)) for k in path]
    return names[-1] != "bias" and not any("layernorm" in n.lower() for n in names)
  return jax.tree_util.tree_map_with_path(decays, params)


def reference_optimizer(args, total_steps: int) -> optax.GradientTransformation:
  """Clip, then bias-corrected AdamW with decoupled decay, on warmup + linear decay.

  Reads args.learning_rate, warmup_proportion, weight_decay and max_grad_norm.
  """
  warmup = int(args.warmup_proportion * total_steps)
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, args.learning_rate, max(warmup, 1)),
       optax.linear_schedule(args.learning_rate, 0.0, max(total_steps - warmup, 1))],
      [warmup])
  return optax.chain(
      optax.clip_by_global_norm(args.max_grad_norm),
      optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=args.weight_decay,
                  mask=decay_mask))


def summarize(runs: dict[int, dict], names: Sequence[str]) -> dict[str, dict[str, float]]:
  """name -> {median, min, max, std, spread} over seeds (std with ddof=1; 0 for one seed)."""
  out = {}
  for name in names:
    v = np.array([r[name] for r in runs.values()], np.float64)
    out[name] = {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max()),
                 "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                 "spread": float(v.max() - v.min())}
  return out


def paired(ours: dict[int, dict], reference: dict[int, dict], metric: str
           ) -> tuple[dict, str]:
  """The paired test of one metric over the seeds both sides ran: ({mean, low, high,
  separated}, the sentence the reports print). A difference is shown when the 95% Student
  t interval of (ours - reference) per seed excludes zero (paired_stats.t_interval)."""
  seeds = [s for s in ours if s in reference]
  diffs = [ours[s][metric] - reference[s][metric] for s in seeds]
  mean, low, high = paired_stats.t_interval(diffs)
  separated = paired_stats.excludes_zero(low, high, len(diffs))
  text = (f"{metric} paired by seed: mean ours - reference {mean:+.4f}, 95% t interval "
          f"[{low:+.4f}, {high:+.4f}]: {'a difference' if separated else 'no difference shown'}")
  return {"mean": mean, "low": low, "high": high, "separated": separated}, text


def report(title: str, seeds: Sequence[int], results: dict[str, dict[int, dict]],
           metrics: dict[str, str], reference_note: Callable[[dict], str] | None = None) -> dict:
  """Prints per-seed figures, per-side statistics and the verdict; returns the statistics.

  Args:
    title: the first line (task, sizes, recipe).
    seeds: the seeds, in order.
    results: side ("ours", "reference") -> seed -> run dict holding every metric and "seconds".
    metrics: metric key -> its column name (e.g. {"f1": "F1"}).
    reference_note: one line about a reference run (start check, losses), if any.

  The verdicts per metric: the difference of the medians is within seed noise when
  it is no larger than the larger max - min spread of the two sides (one seed has
  no spread, so it cannot pass that test honestly and says so); and the paired t
  test over the seeds (paired()).
  """
  sides = list(results)
  names = tuple(metrics) + ("seconds",)
  print(f"\n{title}")
  print(f"{'seed':>4s}" + "".join(f"  {s + ' ' + col:>{len(s) + len(col) + 4}s}"
                                  for s in sides for col in tuple(metrics.values()) + ("s",)))
  for seed in seeds:
    row = f"{seed:4d}"
    for s in sides:
      for key, col in tuple(metrics.items()) + (("seconds", "s"),):
        digits = 1 if key == "seconds" else 4
        row += f"  {results[s][seed][key]:{len(s) + len(col) + 4}.{digits}f}"
    print(row)
  stats = {s: summarize(results[s], names) for s in sides}
  print(f"\n{'':9s} {'metric':8s} {'median':>8s} {'min':>8s} {'max':>8s} {'std':>8s}")
  for s in sides:
    for name in names:
      st = stats[s][name]
      print(f"{s:9s} {name:8s} {st['median']:8.4f} {st['min']:8.4f} {st['max']:8.4f} "
            f"{st['std']:8.4f}")
  if reference_note is not None and "reference" in results:
    for seed in seeds:
      print(f"reference seed {seed}: {reference_note(results['reference'][seed])}")
  if len(sides) == 2:
    for name in metrics:
      diff = stats["ours"][name]["median"] - stats["reference"][name]["median"]
      noise = max(stats["ours"][name]["spread"], stats["reference"][name]["spread"])
      verdict = "within seed noise" if abs(diff) <= noise else "OUTSIDE seed noise"
      if len(seeds) < 2:
        verdict += " (one seed: no spread to judge by)"
      print(f"{name}: median ours - reference = {diff:+.4f}; larger spread {noise:.4f}: "
            f"{verdict}")
      test, text = paired(results["ours"], results["reference"], name)
      print(text)
      stats[f"diff/{name}"] = {"diff": diff, "noise": noise, "within": abs(diff) <= noise,
                               "paired": test}
  return stats


def reference_steps(model, tx: optax.GradientTransformation, loss_fn: Callable):
  """The reference side's jitted update and argmax prediction around a transformers
  Flax model: `loss_fn(params, batch, rng)` is the task's loss, the rest is plain optax."""

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def train_step(params, opt_state, batch, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def predict(params, batch):
    return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                 params=params, train=False).logits.argmax(-1)

  return train_step, predict
