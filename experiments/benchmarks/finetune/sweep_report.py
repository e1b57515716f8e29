"""A fine-tuning sweep's report, and a sweep run in pieces read back as one.

finetune_vs_transformers --sweep prints report_sweep's table (each run's dev accuracy and
F1, each side's wall, compile and padding figures, and per learning rate whether the
medians differ beyond the seed spread, with the paired test beside it); --report_from
reads the pieces' --json_out files through merge_pieces, which refuses pieces that ran
different recipes.
"""

import argparse
import json
import pathlib

from experiments.benchmarks.finetune import finetune_sides
from experiments.benchmarks.finetune import seed_comparison


def report_sweep(args, sides: dict[str, dict]) -> dict:
  """Per-run table, whole-sweep figures per side, and per learning rate whether the
  accuracy medians over seeds differ beyond the seed spread."""
  print(f"\nsweep {finetune_sides.TASK}: train {args.train_examples}, dev {args.dev_examples}, seq "
        f"{args.max_seq_length}, batch {args.batch_size}, {args.epochs} epochs, lr "
        f"{args.learning_rates} x seeds {args.seeds}; ours padding={args.padding}"
        f"{' grouped by length' if getattr(args, 'group_by_length', False) else ''}, "
        f"attention-dropout mask {getattr(args, 'attention_dropout_mask', 'per_example')}, "
        f"head init {getattr(args, 'ours_head_init', 'truncated_normal')}; "
        f"reference head init {getattr(args, 'reference_head_init', 'own')}, "
        f"reference order {getattr(args, 'reference_order', 'own')}")
  names = list(sides)
  print(f"{'lr':>8s} {'seed':>4s}" + "".join(f" {n + ' acc':>15s} {n + ' F1':>14s}"
                                             for n in names))
  for lr in args.learning_rates:
    for seed in args.seeds:
      print(f"{lr:8g} {seed:4d}" + "".join(
          f" {sides[n]['runs'][lr, seed]['accuracy']:15.4f} "
          f"{sides[n]['runs'][lr, seed]['f1']:14.4f}" for n in names))
  stats = {}
  for n, side in sides.items():
    real = sum(r["real_tokens"] for r in side["runs"].values())
    padded = sum(r["padded_tokens"] for r in side["runs"].values())
    stats[n] = {"seconds": side["seconds"], "backend_compiles": side["backend_compiles"],
                "compile_seconds": side["compile_seconds"],
                "step_programs": side["step_programs"], "real_tokens": real,
                "pad_fraction": 1 - real / padded, "real_tokens_per_s": real / side["seconds"]}
    print(f"{n:9s} sweep {side['seconds']:8.1f} s; {side['backend_compiles']} backend compiles "
          f"({side['compile_seconds']:.1f} s, {side.get('cache_hits', 0)} loaded from the "
          f"persistent cache); step programs {side['step_programs']} "
          f"({side['shapes']}); train padding {100 * stats[n]['pad_fraction']:.1f}% of "
          f"{padded:.0f} tokens; {stats[n]['real_tokens_per_s']:.0f} real train tokens/s")
  if len(sides) == 2:
    speedup = sides["reference"]["seconds"] / sides["ours"]["seconds"]
    stats["speedup"] = speedup
    print(f"whole sweep: reference / ours = {speedup:.2f}x")
    for lr in args.learning_rates:
      stats[f"lr{lr:g}"] = {}
      for metric in ("accuracy", "f1"):
        per = {n: seed_comparison.summarize(
            {s: sides[n]["runs"][lr, s] for s in args.seeds}, (metric,))[metric]
               for n in names}
        diff = per["ours"]["median"] - per["reference"]["median"]
        noise = max(per["ours"]["spread"], per["reference"]["spread"])
        # Within one standard deviation of the edge: the verdict could flip with more seeds.
        near = abs(abs(diff) - noise) <= max(per["ours"]["std"], per["reference"]["std"])
        lower = sum(sides["ours"]["runs"][lr, s][metric] < sides["reference"]["runs"][lr, s][
            metric] for s in args.seeds)
        verdict = "within seed noise" if abs(diff) <= noise else "OUTSIDE seed noise"
        print(f"lr {lr:g}: {metric} median ours {per['ours']['median']:.4f} - reference "
              f"{per['reference']['median']:.4f} = {diff:+.4f}; larger spread {noise:.4f}: "
              f"{verdict}{' (near the edge: more seeds)' if near else ''}; ours lower in "
              f"{lower} of {len(args.seeds)} seeds")
        test, text = seed_comparison.paired(
            {s: sides["ours"]["runs"][lr, s] for s in args.seeds},
            {s: sides["reference"]["runs"][lr, s] for s in args.seeds}, metric)
        print(f"lr {lr:g}: {text}")
        stats[f"lr{lr:g}"][metric] = {"diff": diff, "noise": noise, "within": abs(diff) <= noise,
                                      "near_edge": bool(near), "ours_lower": lower,
                                      "paired": test}
  return stats


def merge_pieces(files: list[str]) -> tuple[argparse.Namespace, dict]:
  """(args, sides) of a sweep run in pieces (--sweep --json_out, one side, some rates and
  seeds each): their runs together, wall and compile figures summed. Refuses pieces whose
  recipes differ, or one side's pieces that our side ran under different options."""
  recipe = ("train_examples", "dev_examples", "max_seq_length", "batch_size", "epochs",
            "warmup_proportion", "weight_decay", "max_grad_norm", "dropout", "eval_batch_size")
  ours_options = {"padding": None, "group_by_length": None, "attention_dropout_mask": None,
                  "ours_head_init": "truncated_normal"}  # a default: pieces from before it
  reference_options = {"reference_head_init": "own", "reference_order": "own"}
  # Pieces from before 2026-12-05 wrote "normal" for transformers' own head init.
  legacy = {("reference_head_init", "normal"): "own"}
  first, sides, reference = None, {}, {}
  for f in files:
    piece = json.loads(pathlib.Path(f).read_text())
    if "sides" not in piece:
      raise SystemExit(f"{f} is not a --sweep --json_out file")
    a = piece["args"]
    first = first or a
    for key in recipe:
      if key in first and a.get(key) != first.get(key):
        raise SystemExit(f"{f}: --{key}={a.get(key)!r}, other pieces {first.get(key)!r}")
    for key, default in (ours_options.items() if "ours" in piece["sides"] else ()):
      if a.get(key, default) != first.get(key, default) and (key in first or default):
        raise SystemExit(f"{f}: --{key}={a.get(key, default)!r}, other pieces "
                         f"{first.get(key, default)!r}")
    if "reference" in piece["sides"]:  # pieces from before a flag ran its default
      for key, default in reference_options.items():
        value = a.get(key, default)
        value = legacy.get((key, value), value)
        if reference.setdefault(key, value) != value:
          raise SystemExit(f"{f}: --{key}={value!r}, other pieces {reference[key]!r}")
    for name, side in piece["sides"].items():
      into = sides.setdefault(name, {"seconds": 0.0, "backend_compiles": 0,
                                     "compile_seconds": 0.0, "cache_hits": 0,
                                     "step_programs": 0, "shapes": [], "runs": {}})
      for key in ("seconds", "backend_compiles", "compile_seconds", "cache_hits"):
        into[key] += side[key]
      into["step_programs"] = (None if side["step_programs"] is None
                               else into["step_programs"] + side["step_programs"])
      into["shapes"].append(side["shapes"])
      for key, run in side["runs"].items():
        lr, seed = key.split("|")
        into["runs"][float(lr), int(seed)] = run
    if "ours" in piece["sides"]:
      first.update({k: a.get(k, d) for k, d in ours_options.items() if k in a or d})
  for side in sides.values():
    side["shapes"] = "; ".join(dict.fromkeys(side["shapes"]))
  keys = {tuple(sorted(side["runs"])) for side in sides.values()}
  if len(keys) != 1:
    raise SystemExit(f"the pieces' sides hold different (lr, seed) runs: {sorted(keys)}")
  args = argparse.Namespace(**{**first, **reference_options, **reference})
  args.learning_rates = sorted({lr for lr, _ in next(iter(keys))})
  args.seeds = sorted({seed for _, seed in next(iter(keys))})
  return args, sides
