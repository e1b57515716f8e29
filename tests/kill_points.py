"""Test-only fault injection: a training subprocess kills itself (SIGKILL) at a chosen moment.

A spec "PHASE:STEP" names the moment; `install(spec, workdir)` patches, in the
process it runs in (the trainer's subprocess, never the test's), the seam where
that moment happens, so the kill lands there every time instead of at a random
instant. Before dying the process writes `marker(workdir)` (JSON: phase, step and
what it saw), the test's proof of where it was:

  step       the jitted train step of update STEP was dispatched (its outputs are
             not fetched; "outputs_ready" says whether XLA had finished it: false
             in the runs seen, recorded not asserted, as it depends on timing);
             nothing of it is logged or saved
  save       orbax is committing checkpoint STEP of workdir/checkpoints: every
             file is written in its temporary directory (orbax's
             "<step>.orbax-checkpoint-tmp"), which is not yet renamed to <step>
  metrics    metrics.jsonl holds half of STEP's training row (no newline)
  batch_log  batch_log.jsonl holds, after the rows before it, half of STEP's row
             (the log is flushed at a save: the rows since the last one are written
             together, and the kill cuts that write)

Nothing here is in the library: the seams are bert_jax.training.state.jit_steps
(both trainers jit their step through it), orbax's AtomicRenameTemporaryPath.finalize
(the commit of a local checkpoint), and the open files of MetricWriter and BatchLog.

A gs:// workdir has the step and save moments. There orbax commits a checkpoint by
writing workdir/checkpoints/<step>/commit_success.txt once its files are in place
(CommitFileTemporaryPath.finalize), so at a save kill the step's directory holds its
files without that one. Its marker cannot sit beside it: `install` takes a local
marker path.

A spec whose moment never comes leaves the run to finish (exit 0): the tests
require the SIGKILL exit and the marker.

The offline preparation (data_pipeline.store.prepare_corpus with one worker, which writes
its shards in order in its own process) has two moments, "PHASE:UNIT" with the
shard's unit index (`install_preparation`), both at the rename host/paths.write_atomic
makes of a shard's whole temporary file: `shard_temp` dies before it (the temporary
is left, as a kill mid-write leaves it), `shard` right after it.

Checkpoints are saved in the background, and on these tiny runs a save can still be
in flight several steps later, so which ones a kill leaves would depend on timing.
Before a step, metrics or batch_log moment the run's earlier saves are let finish
(the workdir's CheckpointManager.wait_until_finished, what the trainer itself calls
before each save; orbax's save waits so too before a save moment): the checkpoints
a kill leaves are the same every time.
"""

import json
import os
import pathlib
import signal
from typing import Any

from host import paths

PHASES = ("step", "save", "metrics", "batch_log")
PREPARATION_PHASES = ("shard_temp", "shard")


def marker(workdir) -> pathlib.Path:
  """Where a run in `workdir` records the moment it killed itself (beside the workdir)."""
  workdir = pathlib.Path(workdir)
  return workdir.parent / f"{workdir.name}.kill.json"


def parse(spec: str, phases: tuple[str, ...] = PHASES) -> tuple[str, int]:
  """(phase, step or unit) from "PHASE:N", PHASE one of `phases`."""
  phase, _, step = spec.partition(":")
  if phase not in phases or not step.isdigit():
    raise ValueError(f"kill spec {spec!r}: want PHASE:N with PHASE one of {phases}")
  return phase, int(step)


_managers = []  # the CheckpointManagers of workdir/checkpoints made in this process


def _settle() -> None:
  """Lets the run's pending checkpoint saves commit (see the module docstring)."""
  for manager in _managers:
    manager.wait_until_finished()


def _die(marker_file: pathlib.Path, evidence: dict[str, Any]) -> None:
  """Records `evidence` in the marker, then SIGKILL: no handler, no cleanup, no flush."""
  marker_file.write_text(json.dumps(evidence))
  os.kill(os.getpid(), signal.SIGKILL)


class _TearingFile:
  """A log's open file that, given the text holding row `step`, writes only up to the
  middle of that row's line, flushes, and dies; every other call goes to `file`."""

  def __init__(self, file, marker_file, phase: str, step: int, is_target):
    self._file, self._marker, self._phase, self._step = file, marker_file, phase, step
    self._is_target = is_target  # row -> whether it is the row to tear

  def write(self, text: str) -> int:
    start = 0
    for line in text.splitlines(keepends=True):
      if self._is_target(json.loads(line)):
        _settle()
        torn = text[:start + len(line) // 2]
        self._file.write(torn)
        self._file.flush()  # in the page cache: it survives the process
        _die(self._marker, {"phase": self._phase, "step": self._step,
                             "torn": torn[start:], "rows_before": text[:start].count("\n")})
      start += len(line)
    return self._file.write(text)

  def __getattr__(self, name):
    return getattr(self._file, name)


class _DyingStep:
  """The jitted train step, which dies right after dispatching update `step` (the
  jitted function's other attributes, e.g. its compile cache, are its own)."""

  def __init__(self, train, marker_file, step: int):
    self._train, self._marker, self._step = train, marker_file, step
    self._dispatched = None  # the number of the update being dispatched

  def __call__(self, state, batch, rng):
    if self._dispatched is None:  # a resumed run starts past 0: read it once
      self._dispatched = int(state.step)
    self._dispatched += 1
    if self._dispatched != self._step:
      return self._train(state, batch, rng)
    _settle()
    out = self._train(state, batch, rng)  # dispatched: die before the host fetches any of it
    ready = all(v.is_ready() for v in out[1].values())  # the step's metrics
    _die(self._marker, {"phase": "step", "step": self._step, "outputs_ready": ready})
    return out  # never reached

  def __getattr__(self, name):
    return getattr(self._train, name)


def _normal(path: str) -> str:
  """A local path resolved (the trainer may name it otherwise); a bucket's as it is."""
  return path if paths.is_remote(path) else os.path.realpath(path)


def install(spec: str, workdir: str, marker_path: str | None = None) -> None:
  """Arms the kill at `spec` ("PHASE:STEP") for the run writing `workdir`; its marker
  goes to `marker_path`, by default marker(workdir) (a gs:// workdir needs one)."""
  phase, step = parse(spec)
  if paths.is_remote(workdir) and phase not in ("step", "save"):
    raise ValueError(f"kill spec {spec!r}: a gs:// workdir has the step and save moments")
  if paths.is_remote(workdir) and not marker_path:
    raise ValueError("a gs:// workdir's marker needs a local marker_path")
  workdir = _normal(workdir)
  marker_file = pathlib.Path(marker_path) if marker_path else marker(workdir)
  from bert_jax.run import checkpoint  # pylint: disable=g-import-not-at-top
  make_manager = checkpoint.make_manager

  def recording_make_manager(directory, *args, **kwargs):
    manager = make_manager(directory, *args, **kwargs)
    if _normal(os.fspath(directory)) == workdir:  # not fine-tuning's best/
      _managers.append(manager)
    return manager

  checkpoint.make_manager = recording_make_manager
  if phase == "step":
    from bert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
    jit_steps = state_lib.jit_steps

    def killing_jit_steps(*args, **kwargs):
      train, evaluate = jit_steps(*args, **kwargs)
      return _DyingStep(train, marker_file, step), evaluate

    state_lib.jit_steps = killing_jit_steps
  elif phase == "save":
    _arm_save(workdir, step, marker_file)
  elif phase == "metrics":
    from bert_jax.run import metrics_io  # pylint: disable=g-import-not-at-top
    init = metrics_io.MetricWriter.__init__

    def tearing_init(self, *args, **kwargs):
      init(self, *args, **kwargs)
      if getattr(self, "_jsonl", None) is not None:  # process 0, a local workdir
        self._jsonl = _TearingFile(self._jsonl, marker_file, phase, step,
                                   lambda row: row.get("step") == step and "loss" in row)

    metrics_io.MetricWriter.__init__ = tearing_init
  else:
    from bert_jax.run import batch_log  # pylint: disable=g-import-not-at-top
    init = batch_log.BatchLog.__init__

    def tearing_init(self, *args, **kwargs):
      init(self, *args, **kwargs)
      if self._file is not None:  # a local workdir
        self._file = _TearingFile(self._file, marker_file, phase, step,
                                  lambda row: row.get("step") == step)

    batch_log.BatchLog.__init__ = tearing_init


def _arm_save(workdir: str, step: int, marker_file: pathlib.Path) -> None:
  """Dies when orbax is about to commit checkpoint `step` of `workdir`: locally before
  the rename of its temporary directory, in a bucket before its commit_success.txt."""
  from orbax import checkpoint as ocp  # pylint: disable=g-import-not-at-top
  final = f"{workdir}/checkpoints/{step}"

  def evidence_local(self) -> dict[str, Any]:
    tmp = pathlib.Path(os.fspath(self.get()))
    return {"tmp_dir": tmp.name, "final_exists": os.path.exists(final),
            "files": sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_file())}

  def evidence_bucket(self) -> dict[str, Any]:
    return {"entries": sorted(p.name for p in self.get_final().iterdir())}

  for cls, evidence in ((ocp.path.atomicity.AtomicRenameTemporaryPath, evidence_local),
                        (ocp.path.atomicity.CommitFileTemporaryPath, evidence_bucket)):
    async def finalize_or_die(self, finalize=cls.finalize, evidence=evidence):
      if _normal(os.fspath(self.get_final())) == final:
        _die(marker_file, {"phase": "save", "step": step, **evidence(self)})
      return await finalize(self)

    cls.finalize = finalize_or_die


def install_preparation(spec: str, marker_path: str) -> None:
  """Arms the preparation's kill at `spec` ("shard_temp:UNIT" or "shard:UNIT"); the
  marker lists the shard directory's files at the moment of death."""
  phase, unit = parse(spec, PREPARATION_PHASES)
  from data_pipeline.store import token_store  # pylint: disable=g-import-not-at-top
  name = os.path.basename(token_store.shard_name(unit))
  replace = os.replace

  def dying_replace(src, dst, *args, **kwargs):
    if os.path.basename(os.fspath(dst)) != name:
      return replace(src, dst, *args, **kwargs)
    if phase == "shard":
      replace(src, dst, *args, **kwargs)
    shards = os.path.dirname(os.fspath(dst))
    pathlib.Path(marker_path).write_text(json.dumps(
        {"phase": phase, "unit": unit, "files": sorted(os.listdir(shards))}))
    os.kill(os.getpid(), signal.SIGKILL)
    return None  # never reached

  os.replace = dying_replace  # host/paths.write_atomic's rename of a local file
