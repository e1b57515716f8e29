r"""The preflight table: which pretraining recipes fit which TPU slices as shipped, and how fast.

  nice -n 10 python -m experiments.benchmarks.pretrain.preflight_table \
      --variants=base,base_fast,large,large_fast,efficient \
      --slices=v4-8,v4-32,v5litepod-16,v6e-8

For every (variant, slice) it runs `python -m bert_jax.preflight` as a user would (the
variant's tested layout for the slice applied, the real train step compiled for the
slice with libtpu's compile-only client, every phase, the knob search where a phase
does not fit), into a fresh pass cache, and times it; then, for a pass, the same command
again, timed: answered from bert_jax.preflight.cache (a refusal is not remembered). One
markdown row per cell as soon as it is done, then the whole table with the versions.
Per-device GiB is arguments + outputs - donated + temporaries; ">=" marks a figure from
libtpu's refusal (its temporaries alone exceeded the chip, so the compile stopped there).
"""

import argparse
import dataclasses
import datetime
import os
import re
import subprocess
import sys
import tempfile
import time

HEADER = ("| model | recipe | slice | layout applied | phase 1 GiB/chip | phase 2 GiB/chip "
          "| verdict | compile (s) | cached re-run (s) |\n"
          "|---|---|---|---|---|---|---|---|---|")
MODELS = {"base": ("BERT-Base", "paper"), "base_fast": ("BERT-Base", "fast"),
          "large": ("BERT-Large", "paper"), "large_fast": ("BERT-Large", "fast"),
          "efficient": ("RoBERTa-large pre-LN", "efficient")}
# bert_jax.preflight.compile.Measurement.line, the figures of a phase.
_PHASE = re.compile(r"^\s*phase (\d+) \((\d+) tokens.*?(?:= (>= )?([0-9.]+) GiB of ([0-9.]+) GiB"
                    r"|refused by libtpu: (.*?) per device)")
_LAYOUT = re.compile(r"^preflight: (layout.*)$", re.M)


@dataclasses.dataclass
class Cell:
  line: str
  compile_s: float
  cached_s: float


def _preflight(variant: str, accelerator_type: str, cache_dir: str, search: bool,
               overrides: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, float]:
  started = time.time()
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.preflight",
       f"--config=experiments/configs/pretrain.py:{variant}", f"--topology={accelerator_type}",
       f"--cache_dir={cache_dir}", *([] if search else ["--no_search"]), *overrides],
      capture_output=True, text=True, check=False, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  return result, time.time() - started


def row(variant: str, accelerator_type: str, search: bool = True,
        overrides: tuple[str, ...] = ()) -> Cell:
  """One markdown row for `variant` on `accelerator_type`, with the first and cached seconds."""
  with tempfile.TemporaryDirectory() as cache_dir:
    first, compile_s = _preflight(variant, accelerator_type, cache_dir, search, overrides)
    # A refusal is not remembered: its re-run would be the same compile again.
    again, cached_s = (_preflight(variant, accelerator_type, cache_dir, search, overrides)
                       if first.returncode == 0 else (first, float("nan")))
  phases = {}
  for line in first.stdout.splitlines() or first.stderr.splitlines():
    m = _PHASE.match(line.removeprefix("preflight: "))
    if m and m.group(1) not in phases:
      phases[m.group(1)] = (f"{m.group(2)} tok: " + (
          f"{m.group(3) or ''}{float(m.group(4)):.1f} of {float(m.group(5)):g}" if m.group(4)
          else m.group(6)))
  layout = _LAYOUT.search(first.stderr)
  layout = layout.group(1) if layout else "none tested: as configured"
  if first.returncode == 0:
    verdict = "fits"
  else:
    lines = first.stderr.strip().splitlines()
    verdict = "refused: " + (lines[-1].removeprefix("preflight: ") if lines else
                             f"exit {first.returncode}")
  if again.returncode != first.returncode or (first.returncode == 0 and "not compiled again"
                                               not in again.stderr):
    verdict += f" (the re-run exited {again.returncode}, not from the cache)"
  model, recipe = MODELS.get(variant, (variant, ""))
  cells = [phases.get(p, "-") for p in ("1", "2")]
  line = (f"| {model} | {recipe} | {accelerator_type} | {layout} | {cells[0]} | {cells[1]} | "
          f"{verdict} | {compile_s:.0f} | {'-' if first.returncode else f'{cached_s:.1f}'} |")
  return Cell(line, compile_s, cached_s)


def main(argv=None) -> None:
  """Prints the table (rows as they finish, then all of it with the versions and the date)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  parser.add_argument("--variants", default="base,base_fast,large,large_fast,efficient")
  parser.add_argument("--slices", default="v4-8,v4-32,v5litepod-16,v6e-8")
  parser.add_argument("--no_search", action="store_true",
                      help="as shipped only: no knob search where a cell does not fit")
  argv = sys.argv[1:] if argv is None else argv
  overrides = tuple(a for a in argv if a.startswith("--config."))
  args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
  rows = []
  for variant in args.variants.split(","):
    for accelerator_type in args.slices.split(","):
      cell = row(variant, accelerator_type, search=not args.no_search, overrides=overrides)
      rows.append(cell.line)
      print(cell.line, flush=True)
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  print(f"\n{datetime.date.today().isoformat()}, jax {metadata.version('jax')}, "
        f"libtpu {metadata.version('libtpu')}; `python -m experiments.benchmarks.pretrain.preflight_table "
        f"--variants={args.variants} --slices={args.slices}"
        f"{' --no_search' if args.no_search else ''}{''.join(' ' + o for o in overrides)}`\n")
  print(HEADER)
  print("\n".join(rows))


if __name__ == "__main__":
  main(sys.argv[1:])
