"""The GLUE leaderboard submission: one zip of the test-split files, from the best run per task.

The fine-tuning trainer already writes each GLUE task's leaderboard files (CoLA.tsv,
MNLI-m.tsv, MNLI-mm.tsv, AX.tsv, ...: bert_jax/finetune/readers/glue.py names and labels them)
into a run's best/predictions/ when the task has predict_test. Here the file of each
task's best run (collect: at the chosen rate, the seed with the best dev score, whose
best/ checkpoint wrote them) is checked -- the header, one row per test example, every
prediction a label the leaderboard accepts (STS-B a score in [0, 5]) -- and put at
the top level of DIR/glue_submission.zip, as the GLUE server reads it. The zip's
bytes depend on the files only (fixed timestamps), so a re-render writes the same zip.
"""

import io
import zipfile
from typing import Any

from bert_jax.finetune.readers import glue
from experiments.evaluate import collect
from host import paths

ZIP_FILE = "glue_submission.zip"
HEADER = "index\tprediction"


def expected(task: str) -> dict[str, str]:
  """{test split: file name} the leaderboard wants of a GLUE task."""
  return {split: f"{stem}.tsv" for split, stem in glue.TASKS[task].leaderboard.items()}


def check_file(text: str, task: str, split: str, rows: int, where: str) -> None:
  """Refuses a leaderboard file the server would reject (ValueError naming it and the line)."""
  spec = glue.TASKS[task]
  lines = text.splitlines()
  if not lines or lines[0] != HEADER:
    raise ValueError(f"{where}: the first line must be {HEADER!r}")
  if len(lines) - 1 != rows:
    raise ValueError(f"{where}: {len(lines) - 1} predictions for {rows} {split} examples")
  for n, line in enumerate(lines[1:], 2):
    fields = line.split("\t")
    if len(fields) != 2 or not fields[0]:
      raise ValueError(f"{where}:{n}: expected 'index<TAB>prediction', got {line!r}")
    if spec.regression:
      low, high = spec.score_range
      if not low <= float(fields[1]) <= high:
        raise ValueError(f"{where}:{n}: score {fields[1]} outside [{low}, {high}]")
    elif fields[1] not in spec.labels:
      raise ValueError(f"{where}:{n}: {fields[1]!r} is not one of {spec.labels}")


def write_zip(workdir: str, rows: list[dict[str, Any]]) -> str:
  """Writes DIR/glue_submission.zip from the done GLUE members; returns table.md's note."""
  if not any(r["task"] in collect.GLUE for r in rows):
    return ""
  found = {}
  for row in rows:
    if row["task"] not in collect.GLUE or not row["done"]:
      continue
    for split, name in expected(row["task"]).items():
      path = paths.join(workdir, row["best_run"], "best", "predictions", name)
      if not paths.exists(path):
        continue  # no predict_test, no test split, or AX without its diagnostic file
      text = paths.read_text(path)
      check_file(text, row["task"], split, row["counts"]["test"][split], path)
      found[name] = (text, row["best_run"])
  wanted = [n for t in collect.GLUE for n in expected(t).values()]
  missing = [n for n in wanted if n not in found]
  if not found:
    return ("GLUE leaderboard zip: none written (no GLUE member has finished with "
            "predict_test and a test split).")
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
    for name in sorted(found):
      z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)),
                 found[name][0].encode("utf-8"))
  paths.write_atomic(paths.join(workdir, ZIP_FILE), buffer.getvalue())
  files = ", ".join(f"{n} ({found[n][1]})" for n in sorted(found))
  note = (f"GLUE leaderboard zip: `{ZIP_FILE}` holds {len(found)} of the {len(wanted)} files "
          f"the server expects, each from its task's best run at the chosen rate: {files}.")
  if missing:
    note += f" Not in it: {', '.join(missing)}."
  return note
