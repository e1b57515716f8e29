"""Orbax checkpoints of a pretraining run: layout, save, restore, import hook.

A workdir holds
  config.json        the full experiment config (ml_collections JSON)
  bert_config.json   the BertConfig fields, enough to rebuild the network
  vocab.txt          the vocabulary the run tokenizes with (when it has a file)
  checkpoints/<step>/state       {"params", "opt_state", "step"} (orbax PyTree)
  checkpoints/<step>/data_state  the input pipeline position (JSON)
Orbax writes each step into a temporary directory and renames it when
complete, so a process killed at any moment leaves only complete steps
visible; `latest_step` never returns a half-written one.
"""

import dataclasses
import json
import os
import pathlib
import shutil
import socket
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from bert_jax import model as model_lib

CHECKPOINT_DIR = "checkpoints"
BERT_CONFIG_FILE = "bert_config.json"
CONFIG_FILE = "config.json"
VOCAB_FILE = "vocab.txt"


def check_writable(workdir: str) -> None:
  """Creates `workdir` and proves it writable, before any compile or training step.

  Raises:
    ValueError: naming the workdir and the OS error.
  """
  # One probe per process: hosts of a multi-host run probe the same workdir at once.
  probe = pathlib.Path(workdir) / f".write_probe.{socket.gethostname()}.{os.getpid()}"
  try:
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise ValueError(f"workdir {workdir!r} is not writable: {e}") from e


def make_manager(workdir: str, ckpt_config: Any) -> ocp.CheckpointManager:
  """CheckpointManager in workdir/checkpoints keeping the last N plus every K-th step."""
  policies = [checkpoint_managers.LatestN(ckpt_config.keep)]
  if ckpt_config.keep_period:
    policies.append(checkpoint_managers.EveryNSteps(ckpt_config.keep_period))
  options = ocp.CheckpointManagerOptions(
      preservation_policy=checkpoint_managers.AnyPreservationPolicy(policies),
      enable_async_checkpointing=ckpt_config.async_save,
      # Leftover tmp dirs of a killed save are removed on start; they are never read.
      cleanup_tmp_directories=True,
      create=True)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR),
                               options=options, item_names=("state", "data_state"))


def save(manager: ocp.CheckpointManager, step: int, state: dict[str, Any],
         data_state: dict[str, Any], *, force: bool = False) -> bool:
  """Saves {"params", "opt_state", "step"} and the pipeline position at `step` (async)."""
  return manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data_state=ocp.args.JsonSave(data_state)), force=force)


def restore(manager: ocp.CheckpointManager, abstract_state: Any,
            step: int | None = None) -> tuple[Any, dict[str, Any]]:
  """Restores (state, data_state) at `step` (default latest) onto the shardings in `abstract_state`.

  `abstract_state` is a tree of jax.ShapeDtypeStruct carrying NamedShardings,
  so every host reads only the shards it owns, on whatever mesh this run uses.
  """
  step = manager.latest_step() if step is None else step
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), data_state=ocp.args.JsonRestore()))
  return restored.state, restored.data_state


def write_run_files(workdir: str, config: Any, bert_config: model_lib.BertConfig,
                    vocab_path: str | None) -> None:
  """Writes config.json, bert_config.json and vocab.txt beside the checkpoints (process 0 only)."""
  if jax.process_index() != 0:
    return
  workdir = pathlib.Path(workdir)
  (workdir / CONFIG_FILE).write_text(config.to_json_best_effort(indent=2, sort_keys=True))
  (workdir / BERT_CONFIG_FILE).write_text(
      json.dumps(dataclasses.asdict(bert_config), indent=2, sort_keys=True))
  if vocab_path and os.path.abspath(vocab_path) != os.path.abspath(workdir / VOCAB_FILE):
    shutil.copyfile(vocab_path, workdir / VOCAB_FILE)


def read_bert_config(workdir: str) -> model_lib.BertConfig:
  """The BertConfig a workdir was trained with."""
  path = pathlib.Path(workdir) / BERT_CONFIG_FILE
  if not path.exists():
    raise ValueError(f"{path} is missing: not a bert_jax pretraining workdir")
  return model_lib.BertConfig(**json.loads(path.read_text()))


def _split_path(path: str) -> tuple[pathlib.Path, int | None]:
  """(workdir, step or None) for a workdir, its checkpoints dir or one step dir."""
  path = pathlib.Path(path).absolute()
  if path.name.isdigit() and path.parent.name == CHECKPOINT_DIR:
    return path.parent.parent, int(path.name)
  if path.name == CHECKPOINT_DIR:
    return path.parent, None
  return path, None


def load_params_from_workdir(path: str) -> tuple[model_lib.BertConfig, dict[str, Any]]:
  """(BertConfig, params) from a workdir (latest step) or a step dir, as host numpy arrays.

  This is the hook bert_jax.convert uses to import this project's own
  checkpoints. The optimizer state is not read. Scanned-layer checkpoints are
  returned in the canonical per-layer layout (and a config saying so).
  """
  workdir, step = _split_path(path)
  bert_config = read_bert_config(str(workdir))
  ckpt_dir = workdir / CHECKPOINT_DIR
  if step is None:
    steps = ocp.utils.checkpoint_steps(ckpt_dir) if ckpt_dir.exists() else []
    if not steps:
      raise ValueError(f"{ckpt_dir} holds no complete checkpoint")
    step = max(steps)
  state_dir = ckpt_dir / str(step) / "state"
  if not state_dir.exists():
    raise ValueError(f"{state_dir} is missing: no complete checkpoint at step {step}")
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
