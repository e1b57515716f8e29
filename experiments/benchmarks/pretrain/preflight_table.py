r"""The preflight table: which pretraining recipes fit which TPU slices, and the fix.

  nice -n 10 python -m experiments.benchmarks.pretrain.preflight_table \
      --variants=base,base_fast,large,large_fast --slices=v4-8,v4-32,v5litepod-16,v6e-8

For every (variant, slice) it runs bert_jax.preflight (the real train step compiled for the
slice with libtpu's compile-only client, every phase, the knob search where a phase does
not fit) and prints one markdown row as soon as it is done, then the whole table. Global
batch as the config says (256). Per-device GiB is arguments + outputs - donated +
temporaries; ">=" marks a figure from libtpu's refusal (its temporaries alone exceeded the
chip, so the compile stopped there).
"""

import argparse
import datetime
import sys
import time

import jax

from bert_jax.preflight import check as preflight_check
from bert_jax.preflight import compile as preflight_compile

HEADER = ("| model | recipe | slice | phase 1 (128 tok) GiB/chip | phase 2 (512 tok) GiB/chip "
          "| as configured | cheapest knob that fits (worst phase after) |\n"
          "|---|---|---|---|---|---|---|")
MODELS = {"base": ("BERT-Base", "paper"), "base_fast": ("BERT-Base", "fast"),
          "large": ("BERT-Large", "paper"), "large_fast": ("BERT-Large", "fast")}


def _gib(m: preflight_compile.Measurement) -> str:
  if m.crash:  # the compiling child died: no figure (bert_jax.preflight.isolation)
    return f"libtpu crashed ({m.crash})"
  return f"{'>=' if m.refused else ''}{m.total_bytes / preflight_compile.GIB:.1f}"


def row(variant: str, accelerator_type: str, search: bool = True,
        overrides: tuple[str, ...] = ()) -> tuple[str, float]:
  """One markdown row for `variant` on `accelerator_type`, and the seconds it took."""
  started = time.time()
  config = preflight_check.load_config(f"experiments/configs/pretrain.py:{variant}", overrides)
  report = preflight_check.run(config, accelerator_type, name=variant, search=search,
                               progress=lambda line: print(
                                   f"  {variant} on {accelerator_type}: {line}",
                                   file=sys.stderr, flush=True))
  by_phase = {m.phase: m for m in report.measurements}
  hbm = report.measurements[0].available_bytes / preflight_compile.GIB if report.measurements else 0
  cells = [_gib(by_phase[p]) if p in by_phase else "-" for p in (1, 2)]
  if not report.refusal:
    verdict, fix = f"fits ({hbm:g} GiB)", "-"
  elif report.fix is not None:
    verdict = "does not fit"
    fix = f"`{report.fix.flags}` ({report.fix.worst_gib:.1f})"
  elif not search:
    verdict, fix = "does not fit", "(not searched: --no_search)"
  else:
    verdict, fix = "does not fit", "none tried fits"
  model, recipe = MODELS.get(variant, (variant, ""))
  line = f"| {model} | {recipe} | {accelerator_type} | {cells[0]} | {cells[1]} | {verdict} | {fix} |"
  return line, time.time() - started


def main(argv=None) -> None:
  """Prints the table (rows as they finish, then all of it with the versions and the date)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--variants", default="base,base_fast,large,large_fast")
  parser.add_argument("--slices", default="v4-8,v4-32,v5litepod-16,v6e-8")
  parser.add_argument("--no_search", action="store_true",
                      help="as configured only: no knob search (far fewer compiles)")
  argv = sys.argv[1:] if argv is None else argv
  overrides = tuple(a for a in argv if a.startswith("--config."))
  args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
  rows = []
  for variant in args.variants.split(","):
    for accelerator_type in args.slices.split(","):
      line, seconds = row(variant, accelerator_type, search=not args.no_search,
                          overrides=overrides)
      rows.append(line)
      print(f"{line}  <!-- {seconds:.0f} s -->", flush=True)
  print(f"\n{datetime.date.today().isoformat()}, jax {jax.__version__}, "
        f"libtpu {preflight_check.libtpu_version()}; `python -m experiments.benchmarks.pretrain.preflight_table "
        f"--variants={args.variants} --slices={args.slices}"
        f"{' --no_search' if args.no_search else ''}{''.join(' ' + o for o in overrides)}`\n")
  print(HEADER)
  print("\n".join(rows))


if __name__ == "__main__":
  import os  # pylint: disable=g-import-not-at-top
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  main(sys.argv[1:])
