"""A matplotlib figure written as a PNG through the path layer (local disk or gs://).

The one way the ablation's and the evaluation's reports save their plots: rendered in
memory, then written atomically (host.paths.write_atomic), so a kill never leaves half
a PNG and a gs:// workdir needs no local copy. Imports matplotlib only through the
figure it is handed.
"""

import io

from host import paths


def write_png(fig, target: str, dpi: int) -> None:
  """Lays `fig` out, writes it to `target` as a PNG at `dpi`, and closes it."""
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top  # a figure exists
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=dpi)
  plt.close(fig)
  paths.write_atomic(target, buffer.getvalue())
