r"""Preflight: compile the real pretraining step for a TPU slice here, before paying for it.

  python -m bert_jax.preflight --config=experiments/configs/pretrain.py:large \
      --topology=v5litepod-16 [--config.X=V ...]

compiles bert_jax.pretrain.steps.train_step exactly as the pretraining trainer
jits it (model, optimizer, parameter/optimizer/batch shardings from
bert_jax.training.state.make_layout, the config's mesh and logical axis rules)
for every phase of the run (128 and 512 tokens in the paper recipe), for the
slice's devices as libtpu's compile-only client describes them, on this CPU
machine, as MaxText's train_compile.py does. Nothing is materialised: the
state and batches are ShapeDtypeStructs, no corpus is read and nothing is
written (the vocabulary size comes from the config: see compile.vocab_size).

Per device and phase it prints arguments, temporaries and total HBM against
the chip's (bert_jax.accelerators), XLA's FLOPs per step and the collectives
of the compiled program (compile.collective_stats). XLA's cost analysis counts
a loop's body once: with gradient accumulation or config.model.scan_layers its
FLOPs are one micro-batch's or one layer's, so bert_jax.pretrain.cost's model
FLOPs are printed beside them. A phase that does not fit is refused with one
line naming the phase, the GiB needed and available, and the cheapest knob
setting that fits: bert_jax.preflight.knobs tries them in order of extra
compute (compiling each). Each compile runs in a child process
(bert_jax.preflight.isolation), so that a crash of libtpu is reported for that
phase or knob setting, never as a fit.

A pass is remembered (bert_jax.preflight.cache: keyed by the config and its
file, the flags, the slice, the source tree, the jax/libtpu versions and the
compiler flags in the environment) in --cache_dir, and the same command again
prints it in seconds without importing JAX; --no_cache compiles anyway.

Exit code 0 when every phase fits (a config of another family compiles
nothing and passes), 1 with the refusal as the last line on stderr otherwise.
bert_jax.launch runs this command in a child process before it creates a
slice. The table of recipes and slices (experiments/results/README.md#preflight-recipes)
is printed by experiments/benchmarks/pretrain/preflight_table.py.
"""

import argparse
import sys
from typing import Sequence

from bert_jax.preflight import cache


def main(argv: Sequence[str] | None = None) -> int:
  """CLI: --config=FILE[:variant] --topology=TYPE [--config.X=V ...]; exit 1 when it does not fit."""
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = [a for a in argv if a.startswith("--config.")]
  parser = argparse.ArgumentParser(prog="python -m bert_jax.preflight",
                                   description=__doc__.split("\n", 1)[0])
  parser.add_argument("--config", required=True, help="pretraining config file[:variant]")
  parser.add_argument("--topology", required=True,
                      help="gcloud accelerator type: v4-8, v4-32, v5litepod-16 (or v5e-16), v6e-8")
  parser.add_argument("--no_search", action="store_true",
                      help="only report; do not try the knobs when a phase does not fit")
  parser.add_argument("--cache_dir", default=cache.default_dir(),
                      help="where passes are remembered (default: %(default)s)")
  parser.add_argument("--no_cache", action="store_true",
                      help="compile even when this command passed before; remember nothing")
  args = parser.parse_args([a for a in argv if not a.startswith("--config.")])
  digest = cache.key(args.config, overrides, args.topology)
  remembered = None if args.no_cache else cache.lookup(args.cache_dir, digest)
  if remembered is not None:
    print(f"preflight: {cache.remembered(args.config, args.topology, args.cache_dir, digest)}"
          " (--no_cache compiles)", file=sys.stderr, flush=True)
    print(remembered, flush=True)
    return 0
  # JAX, libtpu and the model only past the cache: a remembered pass answers in a second.
  from bert_jax.preflight import check  # pylint: disable=g-import-not-at-top
  from bert_jax.preflight.targets import PreflightError  # pylint: disable=g-import-not-at-top
  from bert_jax.run import layouts  # pylint: disable=g-import-not-at-top
  try:
    config = check.load_config(args.config, overrides)
    if config.get("family", "pretrain") != "pretrain":
      print(f"preflight: {args.config} is not a pretraining config; nothing compiled")
      return 0
    # What a run on this slice would train: its tested layout (bert_jax.run.layouts), unless
    # a flag sets a field of it.
    if "slice" in config and not config.slice:
      config.slice = args.topology
    line = layouts.choose(config, layouts.explicit_fields(overrides))
    if line:
      print(f"preflight: {line}", file=sys.stderr, flush=True)
    report = check.run(config, args.topology, name=args.config, search=not args.no_search,
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
  except PreflightError as e:
    print(f"preflight: {e}" if not str(e).startswith("preflight") else str(e), file=sys.stderr)
    return 1
  print(report.summary, flush=True)
  if report.refusal:
    print(report.refusal, file=sys.stderr)
    return 1
  if not args.no_cache:
    try:
      cache.remember(args.cache_dir, digest, report.summary)
    except OSError as e:  # the verdict stands; only its memory is lost
      print(f"preflight: could not remember this pass in {args.cache_dir}: {e}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
