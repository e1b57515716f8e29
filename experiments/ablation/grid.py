"""A launched grid's state (experiments.ablation --launch): DIR/grid.json, one entry per run.

Each pretraining run is one entry, in the order it was first planned (the runs a
grown grid adds are appended, so an entry's index, which names its slice, never
changes), in one of four states:
  queued    not launched yet
  running   launched: the slice it runs on (to attach to) and the attempt in progress
  done      its job's record said done (or its workdir holds the finished run)
  failed    --max_attempts attempts failed: left out of fine-tuning, named unfinished
            in the report, its slice deleted
with the job's argv and the last failed attempt's one line. One orchestrator
writes it (the holder of DIR/.lock), whole and atomically after every change
(host.paths.write_atomic); --status and the later stages read it. Imports no
JAX: --status reads it beside the launcher's gcloud calls.
"""

import dataclasses
import json
import threading
from typing import Any, Callable

from bert_jax import errors
from host import paths

GRID_FILE = "grid.json"
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"


class GridError(errors.UsageError):
  """A launched grid that must not go on as asked: a refusal, one line."""


@dataclasses.dataclass
class Entry:
  """One run of the grid (the module docstring says its states)."""
  name: str  # "<setting>_seed<k>", as the plan names it
  setting: str
  seed: int
  index: int  # its place in the grid: its slice is PREFIX-INDEX
  workdir: str  # the run's gs:// workdir (DIR/pretrain/<name>)
  args: list[str]  # its job's python argv on every worker (bert_jax.launch.plan.main_args)
  state: str = QUEUED
  slice: dict[str, Any] | None = None  # the bert_jax.launch.plan.Slice it runs or ran on
  attempt: int = 0  # attempts begun; the one in progress while running
  error: str = ""  # the last failed attempt's one line


def grid_path(workdir: str) -> str:
  """DIR/grid.json."""
  return paths.join(workdir, GRID_FILE)


def read(workdir: str) -> list[Entry]:
  """The entries of DIR/grid.json in grid order; [] when no grid was launched there."""
  path = grid_path(workdir)
  if not paths.exists(path):
    return []
  return [Entry(**e) for e in json.loads(paths.read_text(path))["runs"]]


def given_up(workdir: str) -> list[str]:
  """The runs the launched grid in `workdir` gave up on (state failed); [] without a grid."""
  return [e.name for e in read(workdir) if e.state == FAILED]


class Grid:
  """DIR/grid.json held in memory by its one writer; every change is written at once.

  Thread-safe: the orchestrator's threads (one per slice) update their own entries.
  `check` runs before every write and raises when this writer may no longer write (the
  orchestrator lost DIR/.lock to another: bert_jax.run.lock.Lock.check).
  """

  def __init__(self, workdir: str, check: Callable[[], None] | None = None):
    self.workdir, self._check = workdir, check
    self.entries = {e.name: e for e in read(workdir)}
    self._guard = threading.Lock()

  def merge(self, planned: list[Entry]) -> list[Entry]:
    """Adds the planned runs the grid lacks (queued, at the end); returns the planned runs'
    entries in plan order.

    A run launched before (running or done) must be the same job: a different argv is
    refused, naming the run and the first flag that differs (its workdir holds the other
    job's steps). A queued or failed one takes the new argv (a fixed config, retried).
    """
    with self._guard:
      for new in planned:
        old = self.entries.get(new.name)
        if old is None:
          new.index = len(self.entries)
          self.entries[new.name] = new
        elif old.args != new.args:
          if old.state in (RUNNING, DONE):
            now = sorted(set(new.args) - set(old.args)) or ["(no such flag)"]
            was = sorted(set(old.args) - set(new.args)) or ["(no such flag)"]
            raise GridError(
                f"{grid_path(self.workdir)}: run {new.name} was launched as another job "
                f"(now {now[0]}, launched with {was[0]}; it is {old.state}): a launched "
                "grid's runs cannot change; give the flags it was launched with, or another "
                "--workdir")
          old.args = new.args
      self._save()
      return [self.entries[e.name] for e in planned]

  def update(self, name: str, **changes: Any) -> Entry:
    """Changes fields of run `name`'s entry and writes the grid; returns the entry."""
    with self._guard:
      entry = self.entries[name]
      for key, value in changes.items():
        setattr(entry, key, value)
      self._save()
      return entry

  def _save(self) -> None:
    if self._check is not None:
      self._check()
    content = {"runs": [dataclasses.asdict(e) for e in self.entries.values()]}
    paths.write_atomic(grid_path(self.workdir), json.dumps(content, indent=2) + "\n")
