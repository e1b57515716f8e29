"""Orbax checkpoints of a run: layout, save, restore past corrupt steps, import hook.

A workdir (see bert_jax.run.workdir for its record, lock and run files) holds
  checkpoints/<step>/state       {"params", "opt_state", "step"} (orbax PyTree)
  checkpoints/<step>/data_state  every process's input pipeline position (JSON)
  corrupt_checkpoints/<step>.<time>   steps that failed to restore, moved aside
Orbax writes each step into a temporary directory and renames it when complete
(on GCS: writes a commit marker last), so a process killed at any moment leaves
only complete steps visible; `latest_step` never returns a half-written one.
A complete step can still be damaged later (a truncated file, a deleted
metadata file): `restore_latest` then reports it in one line, moves it aside
(never deletes it) and resumes from the newest step that restores. A failure is
retried before it is believed (storage hiccups pass), and on several hosts all
processes agree on each step before any resumes from it or moves it aside.
"""

import dataclasses
import datetime
import json
import os
import re
import sys
import time
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from bert_jax import errors
from bert_jax.model import encoder as model_lib
from bert_jax.run import lock as workdir_lock
from bert_jax.run import workdir as workdir_lib
from host import paths

CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "corrupt_checkpoints"
_STATE_BYTES = 4096  # room for one process's pipeline position as JSON


class CheckpointError(errors.UsageError, RuntimeError):
  """No checkpoint of a workdir restores (each step's cause is in the message); a refusal
  (bert_jax.jobs prints it as one line), and a RuntimeError as before."""


def make_manager(workdir: str, ckpt_config: Any, barrier_prefix: str | None = None
                 ) -> ocp.CheckpointManager:
  """CheckpointManager in workdir/checkpoints keeping the last N plus every K-th step.

  `barrier_prefix`: names this manager's cross-process barriers. Two managers that can
  save the same step at once (a fine-tuning run's and its best/'s, after an evaluation)
  need different ones: orbax names a barrier by the step alone, and on several processes
  the second save of a step then fails ("Barrier _async_write_complete.32 is already
  ongoing") and the run hangs at exit.
  """
  policies = [checkpoint_managers.LatestN(ckpt_config.keep)]
  if ckpt_config.keep_period:
    policies.append(checkpoint_managers.EveryNSteps(ckpt_config.keep_period))
  options = ocp.CheckpointManagerOptions(
      preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
      enable_async_checkpointing=ckpt_config.async_save,
      # Leftover tmp dirs of a killed save are removed on start; they are never read.
      cleanup_tmp_directories=True,
      create=True,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          barrier_sync_key_prefix=barrier_prefix))
  return ocp.CheckpointManager(paths.join(workdir, CHECKPOINT_DIR), options=options,
                               item_names=("state", "data_state"))


def save(manager: ocp.CheckpointManager, step: int, state: dict[str, Any],
         data_state: dict[str, Any], *, force: bool = False) -> bool:
  """Saves {"params", "opt_state", "step"} and this process's pipeline position (async).

  Every process calls it at the same step. The JSON item is written by process
  0 only, so each process's position is gathered into it first: on restore
  every host gets its own back (each host of a multi-host run reads its own
  part of the corpus).

  Raises:
    WorkdirError: the run's workdir lock was taken by another run (read now,
      not from the last heartbeat): a lost holder never saves. Only process 0
      holds the lock; on several processes its finding is gathered first, so
      every process raises here together (none is left in orbax's save barrier).
  """
  workdir_lock.check_held(verify=True, everywhere=True)  # every process saves at this step
  gathered = {"process_count": jax.process_count(), "processes": _gather(data_state)}
  return manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data_state=ocp.args.JsonSave(gathered)), force=force)


def _gather(local: dict[str, Any]) -> list[dict[str, Any]]:
  """Every process's `local` (a small JSON-able dict), in process order."""
  if jax.process_count() == 1:
    return [local]
  raw = json.dumps(local).encode("utf-8")
  if len(raw) > _STATE_BYTES:
    raise ValueError(f"pipeline state of {len(raw)} bytes exceeds {_STATE_BYTES}: {local}")
  row = np.zeros([_STATE_BYTES], np.uint8)
  row[:len(raw)] = np.frombuffer(raw, np.uint8)
  rows = np.asarray(multihost_utils.process_allgather(row))
  return [json.loads(bytes(r[r != 0].tolist()).decode("utf-8")) for r in rows]


class ProcessCountError(CheckpointError):
  """A checkpoint written by another number of processes than this run has."""


def local_data_state(saved: dict[str, Any]) -> dict[str, Any]:
  """This process's pipeline position out of a saved data_state.

  Raises:
    ProcessCountError: the checkpoint was written by another number of
      processes; each read its own part of the corpus, so the positions cannot
      be carried over exactly.
  """
  if "processes" not in saved:  # written before positions were kept per process
    saved = {"process_count": 1, "processes": [saved]}
  if saved["process_count"] != jax.process_count():
    raise ProcessCountError(
        f"the checkpoint was written by {saved['process_count']} processes and this run has "
        f"{jax.process_count()}: each process reads its own part of the corpus, so the input "
        f"position cannot resume exactly. Resume with {saved['process_count']} processes, or "
        "start a new workdir from these weights with --config.init_checkpoint=<this workdir>")
  return saved["processes"][jax.process_index()]


def restore(manager: ocp.CheckpointManager, abstract_state: Any,
            step: int | None = None) -> tuple[Any, dict[str, Any]]:
  """Restores (state, this process's data_state) at `step` (default latest).

  `abstract_state` is a tree of jax.ShapeDtypeStruct carrying NamedShardings,
  so every host reads only the shards it owns, on whatever mesh this run uses.
  """
  step = manager.latest_step() if step is None else step
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), data_state=ocp.args.JsonRestore()))
  return restored.state, local_data_state(restored.data_state)


# A step that fails to restore is tried RESTORE_ATTEMPTS times, waiting
# RESTORE_BACKOFF_S, then twice that, ... in between: storage hiccups (a GCS 503, a
# timeout) pass. Only a step whose every attempt failed with the same cause (the
# same file, the same byte range) on some process is judged damaged and moved aside.
RESTORE_ATTEMPTS = 3
RESTORE_BACKOFF_S = 1.0
# What each process found for a step, gathered so that all decide alike.
_RESTORED, _DAMAGED, _UNREADABLE = 0, 1, 2
# Causes that say "the storage did not answer", never "the file is bad".
_TRANSIENT = re.compile(r"UNAVAILABLE|DEADLINE_EXCEEDED|ABORTED|RESOURCE_EXHAUSTED|"
                        r"(HTTP|status|code)\D{0,3}(429|5\d\d)\b|timed? ?out|Connection|temporar",
                        re.IGNORECASE)


# Which array of an OCDBT database tensorstore reads first, and so the array name, byte
# range and value size in its error, varies between attempts (reads run in parallel; a
# truncated file gave "value of size 360409" once and "of size 3" twice); the damaged
# file and the kind of error do not. Those are what must repeat to judge a step damaged.
_OCDBT_ARRAY = re.compile(r'Error reading "[^"]*" in OCDBT')
_BYTE_RANGE = re.compile(r"\[\d+, \d+\)")
_VALUE_SIZE = re.compile(r"value of size \d+")


def _damage_site(cause: str) -> str:
  """A failure's cause without what varies between attempts on the same damaged file."""
  cause = _OCDBT_ARRAY.sub("Error reading <array> in OCDBT", cause)
  return _VALUE_SIZE.sub("value of size N", _BYTE_RANGE.sub("[...)", cause))


def _agree(manager: ocp.CheckpointManager, step: int, status: int) -> list[int]:
  """Every process's status for `step`, in process order (the same list on all)."""
  if jax.process_count() == 1:
    return [status]
  rows = np.asarray(multihost_utils.process_allgather(np.array([step, status], np.int64)))
  if len(set(rows[:, 0].tolist())) != 1:
    raise CheckpointError(f"the processes see different checkpoint steps in {manager.directory} "
                          f"({rows[:, 0].tolist()}): is another run still writing there?")
  return rows[:, 1].tolist()


def _try_restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int
                 ) -> tuple[tuple[Any, dict[str, Any]] | None, list[int], str]:
  """(restored or None, every process's _RESTORED/_DAMAGED/_UNREADABLE, this one's cause).

  The attempts are collective: orbax's restore holds barriers and broadcasts, so
  every process calls it equally often, and after each attempt all agree whether
  every one restored; if not, all try again (after a wait). A process whose
  read fails inside orbax leaves the others at orbax's closing barrier until its
  timeout, so they fail that attempt too: still one decision, never a split run.
  """
  causes = []
  for attempt in range(RESTORE_ATTEMPTS):
    if attempt:
      time.sleep(RESTORE_BACKOFF_S * 2 ** (attempt - 1))
    try:
      restored = restore(manager, abstract_state, step)
    except ProcessCountError:
      raise  # a refusal about this run (the same on every process), not damage
    except Exception as e:  # pylint: disable=broad-except  # tensorstore/orbax raise many kinds
      restored = None
      _drop_abandoned_reads()
      causes.append(_missing_file(manager, step) or _one_line(e))
      logging.warning("checkpoint step %d: restore attempt %d of %d failed: %s", step,
                      attempt + 1, RESTORE_ATTEMPTS, causes[-1])
    if all(s == _RESTORED for s in _agree(manager, step, _RESTORED if restored else _UNREADABLE)):
      return restored, [_RESTORED] * jax.process_count(), ""
  if len(causes) < RESTORE_ATTEMPTS:  # restored here at least once: nothing wrong on this side
    verdict = _RESTORED
  elif len({_damage_site(c) for c in causes}) == 1 and not _TRANSIENT.search(causes[0]):
    verdict = _DAMAGED  # the same file, the same way, every time
  else:
    verdict = _UNREADABLE
  return None, _agree(manager, step, verdict), causes[-1] if causes else ""


def _from_orbax(unraisable) -> bool:
  """Whether an unraisable exception is one of orbax's array reads, abandoned when a
  restore failed: a coroutine of orbax's whose finalisation raised the read error again."""
  code = getattr(unraisable.object, "cr_code", None)
  return code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename


def _drop_abandoned_reads() -> None:
  """Once a restore has failed, orbax's other reads of that step are left as coroutines
  that raise the read error again when the garbage collector finalises them, at some
  later moment: each printed as 'Exception ignored in: <coroutine ...>' with tensorstore's
  whole spec, about 60 lines per array (3,400 lines for BERT-tiny), long after the one
  line that said why the step does not restore. From the first failure on, this process
  drops those (and only those; any other unraisable exception passes), saying so once.
  BERT_JAX_VERBOSE=1 keeps them all."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_abandoned_reads", False) or os.environ.get(errors.VERBOSE_ENV) == "1":
    return

  def hook(unraisable):
    if not _from_orbax(unraisable):
      previous(unraisable)
    elif not hook.said:
      hook.said = True
      logging.info("orbax's abandoned reads of a checkpoint that did not restore are not "
                   "printed (%s=1 prints them)", errors.VERBOSE_ENV)

  hook.drops_abandoned_reads, hook.said = True, False
  sys.unraisablehook = hook


def restore_latest(manager: ocp.CheckpointManager, abstract_state: Any
                   ) -> tuple[int, Any, dict[str, Any]]:
  """(step, state, data_state) of the newest step that restores on every process.

  Every process tries the steps newest first (retrying each, see
  RESTORE_ATTEMPTS) and all agree on each one (an allgather of their
  outcomes) before any resumes: one host that cannot read its shards of a step
  sends every host to an earlier one, never a split run. A step that fails is
  reported in one line (step, directory, cause). Once an older step restores
  everywhere, the newer ones judged damaged (the same cause on every attempt)
  are moved to corrupt_checkpoints/ by process 0 (kept, never deleted), so the
  run goes on from there and saves its next steps.

  Raises:
    CheckpointError: no step restores (nothing is moved, so nothing is lost); or
      a newer step could not be read but was not judged damaged (the errors
      varied, or said the storage did not answer): nothing is moved and the run
      stops rather than go back past a step that may be fine; run it again.
  """
  failures = []  # (step, cause, judged damaged)
  for step in sorted(manager.all_steps(), reverse=True):
    restored, statuses, cause = _try_restore(manager, abstract_state, step)
    if restored is not None:
      unreadable = [(s, c) for s, c, damaged in failures if not damaged]
      if unreadable:
        raise CheckpointError(
            f"checkpoint step {unreadable[0][0]} in {manager.directory} could not be read "
            f"({unreadable[0][1]}) but was not judged damaged (its errors varied between "
            f"{RESTORE_ATTEMPTS} attempts, or said the storage did not answer); nothing was "
            f"moved, and step {step} restores. Run the same command again once the storage "
            "answers")
      for bad, _, _ in failures:
        _move_aside(manager, bad)
      if failures:
        manager.reload()
      return (step,) + restored
    others = [i for i, s in enumerate(statuses) if s != _RESTORED and i != jax.process_index()]
    if not cause:
      cause = f"process(es) {others} could not restore it (their logs say why)"
    elif others:
      cause += f" (process(es) {others} could not restore it either)"
    failures.append((step, cause, _DAMAGED in statuses))
    logging.error("checkpoint step %d (%s) does not restore: %s", step,
                  paths.join(str(manager.directory), str(step)), cause)
  raise CheckpointError(
      f"no checkpoint in {manager.directory} restores ("
      + "; ".join(f"step {s}: {c}" for s, c, _ in failures)
      + "). Nothing was moved or deleted; a new --workdir starts afresh, and "
      "--config.init_checkpoint can start one from another run's weights")


# tensorstore (orbax's array writer) reports file-system failures as ValueErrors whose
# text carries the path and the OS error, e.g. 'Failed writing: "<path>": ... No space
# left on device [os_error_code=28]'. Errors from opening an array nest several quoted
# names ('Error opening "zarr" driver: Error writing "<array>/.zarray" ... "<file>": ...')
# and put a [tensorstore_spec='...'] before the code; the innermost file is the last
# quoted path, and the cause is what follows the last colon.
_TENSORSTORE_SPEC = re.compile(r"\s*\[tensorstore_spec='[^']*'\]")
_QUOTED_PATH = re.compile(r'"([^"]*/[^"]*)"')


def _tensorstore_io(text: str) -> str | None:
  """"<path>: <cause>" from a tensorstore I/O error's text, else None."""
  if "[os_error_code" not in text:
    return None
  head = _TENSORSTORE_SPEC.sub("", text.split("[os_error_code", 1)[0]).strip()
  quoted = _QUOTED_PATH.findall(head)
  cause = head.rsplit(":", 1)[-1].strip()
  if not quoted or not cause or head.endswith(quoted[-1] + '"'):
    return None
  return f"{quoted[-1]}: {cause}"


def describe_storage_error(error: BaseException) -> str | None:
  """"<path>: <cause>" when `error` comes from storage (a full disk, a lost bucket, a
  permission), looked for along its chain of causes; None for any other error."""
  seen = error
  while seen is not None:
    if isinstance(seen, OSError) and (seen.filename or seen.errno):
      return f"{seen.filename or '?'}: {seen.strerror or seen}"
    described = _tensorstore_io(str(seen))
    if described:
      return described
    seen = seen.__cause__ or seen.__context__
  return None


# Files every complete step has; orbax reports a missing one as a tree-structure mismatch.
_REQUIRED_FILES = ("_CHECKPOINT_METADATA", "state/_METADATA", "state/manifest.ocdbt",
                   "data_state/metadata")


def _missing_file(manager: ocp.CheckpointManager, step: int) -> str | None:
  """'missing <path>' when a file every complete step has is gone, else None."""
  for name in _REQUIRED_FILES:
    path = paths.join(str(manager.directory), str(step), name)
    if not paths.exists(path):
      return f"missing {path}"
  return None


def _one_line(error: BaseException) -> str:
  """The root cause of an error, first line only (orbax wraps tensorstore's precise
  message, e.g. 'Error reading "<array>" ... byte range ... not valid', in a vague one)."""
  while (error.__cause__ or error.__context__) is not None:
    error = error.__cause__ or error.__context__
  text = str(error).strip()
  text = text.splitlines()[0] if text else ""
  return f"{type(error).__name__}: {text[:300]}"


def _move_aside(manager: ocp.CheckpointManager, step: int) -> None:
  """Moves a step that does not restore to workdir/corrupt_checkpoints/ (process 0 does)."""
  source = paths.join(str(manager.directory), str(step))
  stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
  workdir = os.fspath(paths.path(str(manager.directory)).parent)
  target = paths.join(workdir, CORRUPT_DIR, f"{step}.{stamp}")
  if jax.process_index() == 0:
    if paths.is_remote(source):  # object storage has no rename: copy, then delete
      paths.copy_tree(source, target)
      paths.rmtree(source)
    else:
      paths.makedirs(paths.join(workdir, CORRUPT_DIR))
      os.replace(source, target)
    logging.warning("moved checkpoint step %d aside to %s (kept for inspection)", step, target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"bert_jax_move_aside_{step}")


def read_bert_config(workdir: str) -> model_lib.BertConfig:
  """The BertConfig a workdir was trained with."""
  path = paths.join(workdir, workdir_lib.BERT_CONFIG_FILE)
  if not paths.exists(path):
    raise ValueError(f"{path} is missing: not a bert_jax pretraining workdir")
  return model_lib.BertConfig(**json.loads(paths.read_text(path)))


def _split_path(path: str) -> tuple[str, int | None]:
  """(workdir, step or None) for a workdir, its checkpoints dir or one step dir."""
  p = paths.path(path)
  if p.name.isdigit() and p.parent.name == CHECKPOINT_DIR:
    return os.fspath(p.parent.parent), int(p.name)
  if p.name == CHECKPOINT_DIR:
    return os.fspath(p.parent), None
  return os.fspath(p), None


def complete_step(path: str) -> tuple[str, int]:
  """(workdir, step) of the checkpoint a workdir (its latest complete step) or a step dir
  names, by its files alone; ValueError, naming the path, where there is none."""
  workdir, step = _split_path(path)
  ckpt_dir = paths.join(workdir, CHECKPOINT_DIR)
  if step is None:
    steps = ocp.utils.checkpoint_steps(paths.path(ckpt_dir)) if paths.exists(ckpt_dir) else []
    if not steps:
      raise ValueError(f"{ckpt_dir} holds no complete checkpoint")
    step = max(steps)
  state_dir = paths.path(paths.join(ckpt_dir, str(step), "state"))
  if not paths.exists(state_dir):
    raise ValueError(f"{state_dir} is missing: no complete checkpoint at step {step}")
  return workdir, step


def load_params_from_workdir(path: str) -> tuple[model_lib.BertConfig, dict[str, Any]]:
  """(BertConfig, params) from a workdir (latest step) or a step dir, as host numpy arrays.

  This is the hook bert_jax.convert uses to import this project's own
  checkpoints. The optimizer state is not read. Scanned-layer checkpoints are
  returned in the canonical per-layer layout (and a config saying so).
  """
  bert_config = read_bert_config(_split_path(path)[0])  # a directory without it: that first
  workdir, step = complete_step(path)
  state_dir = paths.path(paths.join(workdir, CHECKPOINT_DIR, str(step), "state"))
  with ocp.PyTreeCheckpointer() as checkpointer:
    metadata = checkpointer.metadata(state_dir).item_metadata
    # Only the params subtree is read; numpy restore avoids needing the saving mesh.
    params_meta = metadata["params"]
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), params_meta)
    restored = checkpointer.restore(state_dir, args=ocp.args.PyTreeRestore(
        item={"params": params_meta}, restore_args={"params": restore_args},
        partial_restore=True))
  params = restored["params"]
  if bert_config.scan_layers:
    params = dict(params)
    params["bert"] = model_lib.unstack_layers(params["bert"])
    bert_config = dataclasses.replace(bert_config, scan_layers=False)
  return bert_config, params
