"""Running a suite: each unfinished member through the fine-tuning trainer, timed, then the report.

Members run in the record's order (cheapest first), one after another, in this
process: each is `bert_jax.jobs.run(config, DIR/<member>)`, the very call
`python -m bert_jax.main` makes, so a member is an ordinary fine-tuning sweep whose
own resume (finished runs read back, the unfinished one from its last checkpoint)
the trainer does. In-process rather than a child per member: kill -9 then takes the
suite and its member down together, with no orphan left holding the member's lock,
and the same command resumes exactly. A member whose summary.json holds every
planned run is skipped without starting the trainer. The report (table.md,
results.csv, times.md, the plots, the leaderboard zip) is rewritten after every
member, so a partial table appears as soon as the cheapest member is done.

DIR/times.json: per member the wall time summed over attempts, with a heartbeat
every HEARTBEAT_S so that an attempt killed by -9 still counts (up to its last beat).
"""

import json
import threading
import time
from typing import Any

from absl import logging

from bert_jax import errors
from experiments.evaluate import collect
from experiments.evaluate import leaderboard
from experiments.evaluate import plan
from experiments.evaluate import plot
from experiments.evaluate import table
from host import paths

TIMES_JSON = "times.json"
HEARTBEAT_S = 5.0


def read_times(workdir: str) -> dict[str, Any]:
  path = paths.join(workdir, TIMES_JSON)
  return json.loads(paths.read_text(path)) if paths.exists(path) else {}


class Stopwatch:
  """Adds this attempt's wall time to DIR/times.json[name], every HEARTBEAT_S and at the end."""

  def __init__(self, workdir: str, name: str, devices: str):
    self.workdir, self.name, self.devices = workdir, name, devices
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, daemon=True, name="suite-stopwatch")

  def _write(self) -> None:
    times = read_times(self.workdir)
    times[self.name] = {"seconds": self.base + time.monotonic() - self.start,
                        "attempts": self.attempts, "devices": self.devices}
    paths.write_atomic(paths.join(self.workdir, TIMES_JSON), json.dumps(times, indent=2) + "\n")

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_S):
      self._write()

  def __enter__(self) -> "Stopwatch":
    before = read_times(self.workdir).get(self.name, {})
    self.base, self.attempts = before.get("seconds", 0.0), before.get("attempts", 0) + 1
    self.start = time.monotonic()
    self._write()
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self._write()


def finished(member: plan.Member, entry: dict[str, Any]) -> bool:
  """Whether the member's summary.json holds every run the record plans."""
  path = paths.join(member.workdir, collect.SUMMARY_FILE)
  return paths.exists(path) and collect.finished(json.loads(paths.read_text(path)), entry)


def devices() -> str:
  import jax  # pylint: disable=g-import-not-at-top  # only when running
  return f"{jax.device_count()} x {jax.devices()[0].device_kind}"


def run_members(members: list[plan.Member], workdir: str, record: dict[str, Any]) -> int:
  """Fine-tunes every unfinished member in turn, the report after each; the first non-zero
  exit code of a member (143 preempted, 130 Ctrl-C, 75 locked, 1 refused) stops the suite."""
  from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # JAX only when running
  where = devices()
  for i, m in enumerate(members, 1):
    if finished(m, record["members"][m.name]):
      logging.info("suite member %d/%d %s: done", i, len(members), m.name)
      continue
    c = m.config
    logging.info("suite member %d/%d %s: fine-tuning %s, lr %s x seeds %s, %d epochs", i,
                 len(members), m.name, c.task.name, list(c.learning_rates), list(c.seeds),
                 c.num_epochs)
    with Stopwatch(workdir, m.name, where):
      code = jobs.run(c, m.workdir)
    if code:
      return code
    report(workdir)
  return 0


def report(workdir: str) -> list[str]:
  """Writes the report from DIR alone (suite.json and the members' workdirs); returns the
  files written. table.md goes last: its presence means the rest is there."""
  record = plan.read_record(workdir)
  if not record:
    raise errors.UsageError(f"{paths.join(workdir, plan.RECORD_FILE)} is missing: this "
                                 "is not a suite's workdir (run the suite first)")
  rows = collect.members(workdir, record)
  averages = collect.averages(rows)
  times = read_times(workdir)
  written = plot.write_plots(workdir, rows)
  note = leaderboard.write_zip(workdir, rows)
  if note.startswith("GLUE leaderboard zip: `"):
    written.append(paths.join(workdir, leaderboard.ZIP_FILE))
  checkpoint = next(iter(record["members"].values()))["config"]["init_checkpoint"]
  for name, text in ((table.RESULTS_FILE, table.render_csv(rows, averages, times)),
                     (table.TIMES_FILE, table.render_times(rows, times)),
                     (table.TABLE_FILE, table.render_table(record, rows, averages, checkpoint,
                                                           note))):
    paths.write_atomic(paths.join(workdir, name), text)
    written.append(paths.join(workdir, name))
  return written
