r"""Is a v4 core's 16 MiB of VMEM a limit libtpu's flag can raise, or the memory itself?

  python -m experiments.benchmarks.pretrain.vmem_limit

Compiles (libtpu's compile-only client, for one v4 chip, on this CPU) a Pallas kernel
whose input and output blocks both live in VMEM, at block sizes from 2 to 32 MiB, with
`xla_tpu_scoped_vmem_limit_kib` unset, lowered, and raised (MaxText sets it per
generation), and prints what libtpu says of each. A lowered limit that refuses what the
default accepts shows the option is applied; a raised one that still refuses at 16 MiB
shows that 16 MiB is the core's VMEM, which no option enlarges. Why it matters:
experiments/results/preflight.md (BERT-Base's unrolled step at 512 tokens on a v4-32).
"""

import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top

# (MiB per block, limit in KiB or None for libtpu's default)
CASES = ((2, 4096), (8, None), (8, 4096), (8, 32768), (16, None), (16, 32768), (16, 65536),
         (32, 131072))


def _double(x_ref, o_ref):
  o_ref[...] = x_ref[...] * 2


def outcome(block_mib: int, limit_kib: int | None, device) -> str:
  """libtpu's verdict on the kernel (one line)."""
  shape = (block_mib * 256, 1024)  # float32 rows of 4 KiB
  spec = jax.ShapeDtypeStruct(shape, jnp.float32,
                              sharding=NamedSharding(Mesh([device], ("x",)), PartitionSpec()))
  kernel = jax.jit(lambda x: pl.pallas_call(
      _double, out_shape=jax.ShapeDtypeStruct(shape, jnp.float32))(x))
  options = {} if limit_kib is None else {"xla_tpu_scoped_vmem_limit_kib": limit_kib}
  try:
    kernel.lower(spec).compile(compiler_options=options)
    return "compiles"
  except Exception as e:  # pylint: disable=broad-except
    text = " ".join(str(e).split())
    said = re.search(r"Used [0-9.]+\w of [0-9.]+\w vmem\. Exceeded vmem capacity by [0-9.]+\w"
                     r"|Scoped allocation with size [0-9.]+\w and limit [0-9.]+\w"
                     r"|would exceed memory \(size=\d+\)", text)
    return "refused: " + (said.group(0) if said else text[:160])


def main() -> None:
  topology = topologies.get_topology_desc(platform="tpu", topology_name="v4:2x2x1",
                                          chip_config_name="megacore")
  print(f"jax {jax.__version__}; one v4 chip; a kernel with its input and output blocks in VMEM")
  print("| block (MiB, x2 in VMEM) | xla_tpu_scoped_vmem_limit_kib | libtpu |\n|---|---|---|")
  for block_mib, limit_kib in CASES:
    print(f"| {block_mib} | {limit_kib if limit_kib else 'default'} | "
          f"{outcome(block_mib, limit_kib, topology.devices[0])} |", flush=True)


if __name__ == "__main__":
  main()
