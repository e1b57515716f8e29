"""experiments.ablation --launch: every pretraining run of the grid as its own Cloud TPU job.

What `run` does, in order (docs/ablation.md, "On Cloud TPU"):
  1. takes DIR/.lock (bert_jax.run.lock): one orchestrator per grid; a second one is
     refused (exit 75) while the first lives; a killed one's lock is taken over at once
     on the same host (else after its heartbeat went stale);
  2. the prepare stage, here (the corpus, DIR/plan.json: stages.prepare);
  3. the runs into DIR/grid.json (grid.py), each run's job reading one tokenized store,
     DIR/tokenized unless the config names one (data.tokenized_dir);
  4. bert_jax.preflight once per distinct shape, before any slice is created (a child
     process; a pass is remembered, so a re-run compiles nothing);
  5. each run not done as one bert_jax.launch Launcher, in a thread of its own: at most
     --max_slices slices at once, slice PREFIX-<grid index>, deleted once its job is
     done; or --one_slice, slice PREFIX, the runs in turn, deleted at the end. Runs the
     grid says are running are attached to first, whatever the bound (Launcher.run
     adopts a job whose record says running, and only deletes the slice of one whose
     record says done). A failed attempt (the job failed, or its launch did) is
     retried up to --max_attempts, unless its job died before its first record (an
     import error, a refusal: the same start would end the same way, StartFailed);
     then the run is failed: its slice deleted, the
     later stages leave it out of fine-tuning and name it unfinished;
  6. back in stages.run_ablation: the check, fine-tuning here, the report.
gcloud out of reach (LostContact, NotAuthorized), Ctrl-C or kill -9 leave every job
running and delete nothing: the same command attaches. `status` prints the grid's table.
"""

import collections
import dataclasses
import json
import queue
import re
import threading
import time
from typing import Any

import ml_collections

from bert_jax import accelerators
from bert_jax import exit_codes
from bert_jax.launch import launcher as launcher_lib
from bert_jax.launch import plan as launch_plan
from bert_jax.launch import state as launch_state
from bert_jax.launch.state import LaunchError, LostContact, StartFailed, say
from bert_jax.pretrain import phases
from bert_jax.run import lock as workdir_lock
from experiments.ablation import grid as ablation_grid
from experiments.ablation import report as ablation_report
from experiments.ablation import plan as ablation_plan
from experiments.ablation import stages
from host import paths

TOKENIZED_DIR = "tokenized"  # DIR/tokenized: the one store every launched run reads
# Flags that change no compiled shape: the seeds, the masks (their prediction slots are
# keyed apart, shape_key) and a FLOP budget's step counts.
_NOT_SHAPE = ("--config.seed=", "--config.data.seed=", "--config.data.masking.",
              "--config.total_steps=", "--config.optimizer.warmup_steps=")
# A queued resource's name: lowercase letters, digits and hyphens, from a letter (the TPU
# API's rule), short enough to leave room for "-<grid index>".
_SLICE_NAME = re.compile(r"^[a-z][-a-z0-9]{0,50}$")


class GridStopped(ablation_grid.GridError):
  """The orchestrator stopped before the grid's end; every job keeps running (re-run to attach)."""


@dataclasses.dataclass(frozen=True)
class Options:
  """The launch flags of experiments.ablation (its __main__ defines each, with its default)."""
  name: str  # slices are NAME-<grid index>, or NAME with one_slice
  project: str
  zone: str
  accelerator_type: str
  spot: bool
  max_slices: int
  one_slice: bool
  max_attempts: int
  max_relaunches: int
  skip_preflight: bool
  logdir: str  # local: preflight passes, each slice's upload staging
  poll_s: float
  retry_s: float
  preemption_window_s: float
  stale_after_s: float
  start_timeout_s: float
  create_timeout_s: float


def check(workdir: str, options: Options) -> None:
  """Refuses, before anything is read or written, a launch that cannot run: one line."""
  if not workdir.startswith("gs://"):
    raise ablation_grid.GridError(
        f"--launch needs a gs:// --workdir (got {workdir}): every worker writes its run there "
        "and this machine reads them back for the report")
  missing = [f"--{k}" for k in ("name", "project", "zone", "accelerator_type")
             if not getattr(options, k)]
  if missing:
    raise ablation_grid.GridError(f"--launch needs {', '.join(missing)}")
  if not _SLICE_NAME.match(options.name):
    raise ablation_grid.GridError(
        f"--name={options.name!r}: a slice name starts with a lowercase letter and holds "
        "lowercase letters, digits and '-' (slices are NAME-0, NAME-1, ...)")
  if options.max_slices < 1 or options.max_attempts < 1:
    raise ablation_grid.GridError("--max_slices and --max_attempts must be at least 1")
  if options.one_slice and options.max_slices > 1:
    raise ablation_grid.GridError("--one_slice runs the runs in turn on one slice; "
                                  f"--max_slices={options.max_slices} asks for several: give one")
  slice_for(options, options.name)  # an accelerator type the table knows


def slice_for(options: Options, name: str) -> launch_plan.Slice:
  """The slice `name` of the launch flags (v5e-N sent as v5litepod-N, as bert_jax.launch)."""
  accelerator_type = accelerators.canonical(options.accelerator_type)
  try:
    return launch_plan.Slice(
        name=name, project=options.project, zone=options.zone,
        accelerator_type=accelerator_type, spot=options.spot,
        runtime_version=launch_plan.default_runtime_version(accelerator_type),
        num_workers=launch_plan.num_workers(accelerator_type))
  except ValueError as e:
    raise ablation_grid.GridError(f"--accelerator_type: {e}") from None


def share_store(runs: list[ablation_plan.Run], workdir: str) -> None:
  """Points every run at one tokenized store, DIR/tokenized, unless the config names one:
  the corpus is tokenized once for the grid, and runs of a seed read the very same store."""
  for run in runs:
    if not run.config.data.tokenized_dir:
      run.config.data.tokenized_dir = paths.join(workdir, TOKENIZED_DIR)


def job_args(run: ablation_plan.Run, workdir: str, accelerator_type: str = "") -> list[str]:
  """`run`'s job on every worker: python -m bert_jax.main with its flags (stages.pretrain_job),
  and the slice it runs on, whose tested layout it gets (bert_jax.run.layouts)."""
  config_arg, flags_ = stages.pretrain_job(run)
  return launch_plan.main_args(config_arg, paths.join(workdir, run.pretrain_dir), flags_,
                               accelerator_type)


def shape_key(run: ablation_plan.Run) -> str:
  """What a compiled step of `run` depends on: its config and flags less the seeds, the
  masks and the step counts, plus each phase's sequence length and prediction slots (which
  the masking ratio sets: the MLM head grows with it)."""
  config_arg, flags_ = stages.pretrain_job(run)
  slots = [(p["phase"], p["seq_len"], p["predictions"]) for p in phases.shapes(run.config)]
  return json.dumps([config_arg, [f for f in flags_ if not f.startswith(_NOT_SHAPE)], slots])


def preflight(runs: list[ablation_plan.Run], options: Options) -> None:
  """bert_jax.preflight for one run of each distinct shape (shape_key), before any slice;
  then the tokenized store's status, once (the runs share it). LaunchError when one does
  not fit."""
  shapes: dict[str, ablation_plan.Run] = {}
  for run in runs:
    shapes.setdefault(shape_key(run), run)
  tpu = slice_for(options, options.name)
  say(f"preflight: {len(shapes)} distinct shape(s) among {len(runs)} run(s) to launch")
  for run in shapes.values():
    config_arg, flags_ = stages.pretrain_job(run)
    say(f"preflight: {run.name} for its shape")
    launcher_lib.preflight(config_arg, flags_, tpu.accelerator_type, launcher_lib.SOURCE_ROOT)
  if shapes:
    config_arg, flags_ = stages.pretrain_job(runs[0])
    say(launcher_lib.store_status(config_arg, flags_, tpu.num_workers))


class Orchestrator:
  """Drives the grid's runs through bert_jax.launch Launchers; `pretrain` is the stage."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, options: Options,
               lock: workdir_lock.Lock):
    self.config, self.workdir, self.options, self.lock = config, workdir, options, lock
    self.grid: ablation_grid.Grid | None = None

  def pretrain(self, runs: list[ablation_plan.Run]) -> None:
    """The pretrain stage, launched: returns once every run is done or failed.

    Without DIR/plan.json (--stage=pretrain on a fresh workdir) the prepare stage runs
    first: a job must train the plan's step counts, never an estimate.

    Raises:
      GridStopped: gcloud out of reach, Ctrl-C, or a bug in a thread (re-raised): the
        jobs keep running, the same command attaches.
      GridError: a run launched before would now be another job; a shape does not fit.
    """
    if not paths.exists(paths.join(self.workdir, ablation_plan.PLAN_FILE)):
      runs = stages.prepare(self.config, self.workdir, runs)
    share_store(runs, self.workdir)
    # An orchestrator that lost the lock (its heartbeat stalled past STALE_AFTER_S, and
    # another took the grid over) stops at its next write instead of writing beside it.
    self.grid = ablation_grid.Grid(self.workdir, check=self.lock.check)
    by_name = {run.name: run for run in runs}
    entries = self.grid.merge([ablation_grid.Entry(
        name=run.name, setting=run.setting, seed=run.seed, index=0,
        workdir=paths.join(self.workdir, run.pretrain_dir),
        args=job_args(run, self.workdir, accelerators.canonical(self.options.accelerator_type)))
        for run in runs])
    retried = [e for e in entries
               if e.state == ablation_grid.FAILED and e.attempt < self.options.max_attempts]
    for e in retried:
      say(f"{e.name} failed {e.attempt} time(s), under --max_attempts="
          f"{self.options.max_attempts}: trying again")
      self.grid.update(e.name, state=ablation_grid.QUEUED)
    for e in entries:  # trained outside a launch (here, say): nothing to do
      if e.state == ablation_grid.QUEUED and stages.pretraining_done(by_name[e.name],
                                                                     self.workdir):
        self.grid.update(e.name, state=ablation_grid.DONE)
    running = [e for e in entries if e.state == ablation_grid.RUNNING]
    queued = [e for e in entries if e.state == ablation_grid.QUEUED]
    say(f"grid: {len(entries)} runs; " + ", ".join(
        f"{n} {s}" for s, n in collections.Counter(e.state for e in entries).items()))
    if not self.options.skip_preflight and (running or queued):
      try:
        preflight([by_name[e.name] for e in running + queued], self.options)
      except LaunchError as e:
        raise ablation_grid.GridError(str(e)) from None
    self._schedule(running, queued)
    failed = [e for e in entries if e.state == ablation_grid.FAILED]
    if self.options.one_slice:
      self._delete(slice_for(self.options, self.options.name))
    say(f"grid: {len(entries) - len(failed)} run(s) done"
        + (f"; given up on (unfinished): {', '.join(e.name for e in failed)}" if failed else ""))

  def _schedule(self, running: list[ablation_grid.Entry],
                queued: list[ablation_grid.Entry]) -> None:
    """Attaches to every running run at once, then starts queued ones while fewer than
    the bound's slices are busy; returns when all threads ended (GridStopped if one
    stopped: no further run is started then)."""
    bound = 1 if self.options.one_slice else self.options.max_slices
    ended: queue.Queue = queue.Queue()
    active: set[str] = set()
    pending = collections.deque(queued)
    stop: BaseException | None = None

    def begin(entry: ablation_grid.Entry) -> None:
      active.add(entry.name)
      threading.Thread(target=self._thread, args=(entry, ended), daemon=True,
                       name=f"ablation-{entry.name}").start()

    for entry in running:
      begin(entry)
    try:
      while active or (pending and stop is None):
        while pending and stop is None and len(active) < bound:
          begin(pending.popleft())
        try:
          name, error = ended.get(timeout=1.0)
        except queue.Empty:
          continue
        active.discard(name)
        stop = stop or error
    except KeyboardInterrupt:
      raise GridStopped("stopped (Ctrl-C); nothing was deleted and every started job keeps "
                        "running: re-run the same command to attach") from None
    if isinstance(stop, LostContact):
      raise GridStopped(f"{stop}; nothing was deleted and every started job keeps running: "
                        "re-run the same command to attach") from None
    if stop is not None:
      raise stop

  def _thread(self, entry: ablation_grid.Entry, ended: queue.Queue) -> None:
    launch_state.tag_thread(entry.name)
    try:
      self._drive(entry)
      ended.put((entry.name, None))
    except BaseException as e:  # pylint: disable=broad-except  # told to the main thread
      ended.put((entry.name, e))

  def _launcher(self, tpu: launch_plan.Slice, workdir: str) -> launcher_lib.Launcher:
    judge = launch_state.Judge(window_s=self.options.preemption_window_s,
                               stale_after_s=self.options.stale_after_s,
                               start_timeout_s=self.options.start_timeout_s)
    return launcher_lib.Launcher(
        tpu, workdir=workdir, logdir=paths.join(self.options.logdir, tpu.name),
        source_dir=launcher_lib.SOURCE_ROOT, poll_s=self.options.poll_s,
        retry_s=self.options.retry_s, create_timeout_s=self.options.create_timeout_s,
        judge=judge, follow_logs=False)

  def _drive(self, entry: ablation_grid.Entry) -> None:
    """One run to its end: attached to where it runs, or launched; retried when an attempt
    fails, up to --max_attempts; then failed and its slice deleted (not the shared one)."""
    while True:
      # A new attempt ends any process left on its slice (the failed attempt's, exiting or
      # hung; on a shared slice the previous run's): none of them is this attempt's job.
      new_attempt = not (entry.state == ablation_grid.RUNNING and entry.slice)
      if not new_attempt:
        tpu = launch_plan.Slice(**entry.slice)  # where it runs: attach there
      else:
        name = (self.options.name if self.options.one_slice
                else f"{self.options.name}-{entry.index}")
        tpu = slice_for(self.options, name)
        entry = self.grid.update(entry.name, state=ablation_grid.RUNNING,
                                 slice=dataclasses.asdict(tpu), attempt=entry.attempt + 1)
      # --one_slice's slice outlives each run (the next one takes it); any other is the run's.
      shared = self.options.one_slice and tpu.name == self.options.name
      say(f"attempt {entry.attempt} of at most {self.options.max_attempts} on {tpu.name} "
          f"({entry.workdir})")
      launcher = self._launcher(tpu, entry.workdir)
      try:
        launcher.run(entry.args, self.options.max_relaunches, keep=shared, replace=new_attempt)
      except LostContact:
        raise
      except LaunchError as e:
        # A job that died before its first record would die the same way again: no retry.
        if entry.attempt < self.options.max_attempts and not isinstance(e, StartFailed):
          say(f"attempt {entry.attempt} failed: {e}; trying again")
          entry = self.grid.update(entry.name, state=ablation_grid.QUEUED, error=str(e))
          continue
        say(f"attempt {entry.attempt} failed: {e}; given up on"
            + ("" if isinstance(e, StartFailed) else " (--max_attempts)"))
        self.grid.update(entry.name, state=ablation_grid.FAILED, error=str(e))
        if not shared and not isinstance(e, StartFailed):  # the launcher deleted that one
          self._delete(tpu)
        return
      self.grid.update(entry.name, state=ablation_grid.DONE)
      return

  def _delete(self, tpu: launch_plan.Slice) -> None:
    """Deletes a slice the grid no longer needs (a failure to is said, not raised)."""
    try:
      if self._launcher(tpu, "").delete(wait=False):
        say(f"{tpu.name} is being deleted")
    except LaunchError as e:
      say(f"{e}; delete it with `python -m bert_jax.launch --name={tpu.name} "
          f"--project={tpu.project} --zone={tpu.zone} --action=delete`")


def run(config: ml_collections.ConfigDict | None, workdir: str, stage: str,
        options: Options) -> int:
  """--launch: the ablation's stages with pretraining launched (the module docstring);
  returns the exit code (75 while another orchestrator holds the grid)."""
  check(workdir, options)
  lock = workdir_lock.Lock(workdir)
  try:
    lock.acquire()
  except workdir_lock.LockHeld as e:
    from bert_jax import jobs  # pylint: disable=g-import-not-at-top  # jax/tf only when running
    jobs.refuse(e)
    return exit_codes.LOCK_HELD
  try:
    return stages.run_ablation(config, workdir, stage,
                               launch=Orchestrator(config, workdir, options, lock).pretrain)
  finally:
    lock.release()


def status(workdir: str, retry_s: float = 5.0) -> str:
  """The launched grid's table: per run its setting, seed, state, slice, attempt and its
  job's record (read with gcloud, as the launcher reads it); then each failure's line."""
  entries = ablation_grid.read(workdir)
  if not entries:
    raise ablation_grid.GridError(f"{ablation_grid.grid_path(workdir)} does not exist: no grid "
                                  "was launched there (--launch)")
  gcloud, now = launch_state.Gcloud(retry_s), time.time()
  rows: list[list[Any]] = []
  for e in entries:
    job = "-"
    if e.slice:  # the record of the job launched on that slice (another's reads as none)
      reader = launch_state.Reader(gcloud, launch_plan.Slice(**e.slice), e.workdir)
      try:
        job = launch_state.describe_job(reader.job(), now)
      except LaunchError as error:
        job = f"unread ({error})"
    rows.append([e.name, e.setting, e.seed, e.state, e.slice["name"] if e.slice else "-",
                 e.attempt, job])
  counts = collections.Counter(e.state for e in entries)
  lines = [ablation_report.markdown_table(
      ["run", "setting", "seed", "state", "slice", "attempt", "job"], rows), "",
      ", ".join(f"{counts[s]} {s}" for s in (ablation_grid.QUEUED, ablation_grid.RUNNING,
                                              ablation_grid.DONE, ablation_grid.FAILED))]
  lines += [f"{e.name} failed after {e.attempt} attempt(s): {e.error}"
            for e in entries if e.state == ablation_grid.FAILED]
  return "\n".join(lines)
