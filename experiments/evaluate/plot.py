"""plots/<member>.png and plots/suite.png: our seeds as points beside the paper's figures.

Each panel is one metric of one task: at each learning rate of the sweep, one point
per fine-tuning seed (the chosen rate's in colour, ringed where the restarts rule
took one run), the reported figure as a bar, and every paper figure for that metric
as a horizontal line (solid: a dev figure, dashed: a test figure) labelled with its
source. plots/suite.png has one panel per finished member (its main dev metric, the one
that chose the rate).
"""

from typing import Any

from experiments import figures
from experiments.evaluate import table
from host import paths

PLOTS_DIR = "plots"
_MODEL_COLOURS = {"base": "tab:green", "large": "tab:purple"}


def _panel(ax, row: dict[str, Any], metric: str) -> None:
  lrs = sorted(row["per_lr"], key=float)
  for x, lr in enumerate(lrs):
    values = row["per_lr"][lr][metric]
    chosen = lr == row["learning_rate"]
    offsets = [(i - (len(values) - 1) / 2) * 0.06 for i in range(len(values))]
    ax.plot([x + o for o in offsets], values, "o", color="tab:blue" if chosen else "0.65",
            markersize=5, label="our seeds (chosen rate)" if chosen else None)
    if chosen:
      ours = row["values"][metric]["value"]
      ax.hlines(ours, x - 0.25, x + 0.25, color="tab:blue", linewidth=2.5,
                label="ours: best seed" if row["rule"] == "best" else "ours: median")
  for figure in row["paper"]:
    if figure["metric"] == metric:
      ax.axhline(figure["value"], color=_MODEL_COLOURS.get(figure["model"], "0.3"),
                 linestyle="-" if figure["split"] == "dev" else "--", linewidth=1,
                 label=f"{table.MODELS.get(figure['model'], figure['model'])} "
                       f"{table.figure_text(figure)}")
  ax.set_xticks(range(len(lrs)), lrs)
  ax.set_xlabel("learning rate")
  ax.set_ylabel(f"dev {table.metric_name(metric)} (%)")
  ax.set_title(table.task_name(row))
  ax.grid(alpha=0.3)
  ax.legend(fontsize=6)


def write_plots(workdir: str, rows: list[dict[str, Any]]) -> list[str]:
  """Writes the plots of the finished members (matplotlib, Agg); returns the files written."""
  import matplotlib  # pylint: disable=g-import-not-at-top  # only the report draws
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  done = [r for r in rows if r["done"]]
  written = []

  def save(fig, name):
    target = paths.join(workdir, PLOTS_DIR, f"{name}.png")
    figures.write_png(fig, target, dpi=110)
    written.append(target)

  for row in done:
    fig, axes = plt.subplots(1, len(row["metrics"]), figsize=(4.5 * len(row["metrics"]), 3.6),
                             squeeze=False)
    for ax, metric in zip(axes[0], row["metrics"]):
      _panel(ax, row, metric)
    save(fig, row["name"])
  if done:
    columns = min(len(done), 3)
    lines = -(-len(done) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.5 * columns, 3.6 * lines), squeeze=False)
    for i, row in enumerate(done):
      main = row["main_metric"] if row["main_metric"] in row["metrics"] else row["metrics"][0]
      _panel(axes[i // columns][i % columns], row, main)
    for j in range(len(done), lines * columns):
      axes[j // columns][j % columns].axis("off")
    save(fig, "suite")
  return written
