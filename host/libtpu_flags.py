"""libtpu's compiler flags that this project's programs need, set before libtpu starts.

libtpu reads LIBTPU_INIT_ARGS once, when JAX first starts a TPU backend: a run's first
device query on a TPU VM, or the preflight's compile-only client here. Every process
of the project that can compile for a TPU imports `bert_jax`, whose package init calls
`apply()`; so no entry point can leave the flags out, as a list of entry points kept by
hand could.

--fibers_default_thread_stack_size: libtpu 0.0.42.1 lowers fusions on fibers whose
stacks are too small for the recursion of its convolution cost model
(FusedSpatialMajorConvolution::CalculateClassicConvWindowsCost and
SpatialMajorConvolution::CalculateClassicWindowCost calling each other, about 10 KiB a
level). BERT-Large's 512-token step for a v6e-8 died compiling, "SIGSEGV STACK OVERFLOW",
under data parallelism and FSDP with each remat policy. With 256 MiB fiber stacks it
compiles (experiments/results/preflight.md). Only the compiler's stacks change: the
program, its memory and its results are the same (the preflight table's other cells
gave the same figures with and without it).

A flag that the user's own LIBTPU_INIT_ARGS names wins over ours. libtpu exits at start on
a flag it does not know ("ERROR: Unknown command line flag", tried with a made-up one on
0.0.42.1), so a libtpu without this one would need them off: BERT_JAX_LIBTPU_FLAGS=off
leaves LIBTPU_INIT_ARGS as it is.
"""

import os
from typing import MutableMapping

FLAGS = {"fibers_default_thread_stack_size": str(256 << 20)}
OFF = "BERT_JAX_LIBTPU_FLAGS"  # set to "off": add none of FLAGS


def apply(environ: MutableMapping[str, str] = os.environ) -> None:
  """Adds each flag of FLAGS that LIBTPU_INIT_ARGS does not name already (none with
  BERT_JAX_LIBTPU_FLAGS=off)."""
  if environ.get(OFF, "").lower() == "off":
    return
  args = environ.get("LIBTPU_INIT_ARGS", "").split()
  named = {arg.lstrip("-").split("=", 1)[0] for arg in args}
  added = [f"--{name}={value}" for name, value in FLAGS.items() if name not in named]
  if added:
    environ["LIBTPU_INIT_ARGS"] = " ".join(args + added)
