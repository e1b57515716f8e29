"""A workdir is a contract: one writer, a record written once, every later run checked against it.

What a workdir holds beside its checkpoints (local disk or gs:// alike):
  record.json        written once, when the workdir is created: the flattened
                     config, the network (bert_config), the vocabulary's or
                     SentencePiece model's SHA-256, the corpus fingerprint
                     (file names and sizes) and the code version
  config.json        the same config, human-readable (written with the record)
  bert_config.json   the network's fields (checkpoint readers rebuild the model from it)
  vocab.txt / spm.model   a copy of the vocabulary the run tokenizes with (a byte-level
                     BPE: vocab.json + merges.txt)
  .lock              the one process allowed to write here (host, pid, job,
                     heartbeat): bert_jax.run.lock

Every run on an existing workdir is compared with record.json before anything
is written. A difference that would make the checkpoints mean something else
(another model size, masking ratio, vocabulary, corpus, optimizer...) is
refused with one line naming the field, the recorded value and the new one.
Fields in RESUMABLE may change on resume (how long, how often to log, evaluate
and save, how to shard, how to launch); they are listed in one place below.
The order of a start: check_before_data (reads only: the lock and the record,
so a busy workdir or a contradicting config is refused before the corpus is
read), then the data, then open_workdir (the lock taken, everything judged
again, then the first write).

The lock (bert_jax.run.lock) is taken by process 0 of the run; every
change to it is a compare-and-swap (GCS generation preconditions), so of any
number of contenders exactly one holds it, and a holder whose lock was taken
stops within one heartbeat. A second run is refused at once (LockHeld) with the
holder's host and pid; a holder known gone (a later attempt of the same job, a
dead pid on this host, a heartbeat older than STALE_AFTER_S) frees it.
"""

import dataclasses
import datetime
import hashlib
import importlib.metadata
import json
import os
import socket
import subprocess
from typing import Any

from absl import logging
import jax
from jax.experimental import multihost_utils
import numpy as np

from bert_jax.model import encoder as model_lib
from bert_jax.run import lock as workdir_lock
from host import paths

# The lock and its errors, as callers know them (workdir.Lock, workdir.WorkdirError, ...).
Lock, LockHeld, WorkdirError = workdir_lock.Lock, workdir_lock.LockHeld, workdir_lock.WorkdirError
LOCK_FILE = workdir_lock.LOCK_FILE

RECORD_FILE = "record.json"
CONFIG_FILE = "config.json"
BERT_CONFIG_FILE = "bert_config.json"
VOCAB_FILE = "vocab.txt"
BPE_VOCAB_FILE, BPE_MERGES_FILE = "vocab.json", "merges.txt"  # RoBERTa's BPE, as HF names it
TOKENIZER_FILE = "tokenizer.json"  # a whole tokenizer in the `tokenizers` format (ModernBERT's)
SPM_FILE = "spm.model"

# Config fields a resumed run may change: none of them changes what the checkpoints
# mean. A prefix ending in "." covers a whole block. Everything else must match.
RESUMABLE = (
    # Train longer or shorter: the learning-rate, phase-2 and masking schedules follow the new end.
    "total_steps", "num_epochs",
    "learning_rates", "seeds",  # which runs a fine-tuning sweep holds, not what one run is
    "eval_every_steps", "log_every_steps", "eval_at_start",  # cadence of reports
    "checkpoint.",  # save period, retention, async writes
    "mesh.", "distributed.", "logical_axis_rules",  # placement and launch: restore
                                                    # reshards onto any mesh
    "require_accelerator",  # a launch check (the SLURM template turns it on)
    "grad_accum_steps",  # the same update in more micro-batches (fits memory)
    "peak_tflops_per_device",  # only the MFU report
    "model.remat", "model.remat_policy",  # recomputation: the same numbers, less memory
    "model.attention_impl",  # which kernel computes the same attention
    "data.prefetch_batches", "data.embedded_cache_dir",  # where and how far ahead
    # Where the tokenized store is, how it is made and sharded: its selections are the
    # in-memory path's documents, bit for bit (tests/test_token_store.py).
    "data.tokenized_dir", "data.prepare_workers", "data.shard_bytes",
    "init_checkpoint",  # read only when the workdir starts empty
    "skip_nonfinite_steps",  # what to do on a NaN step, not what a step is
    # The slice a run is on and the layouts tested for slices (bert_jax.run.layouts): they
    # choose mesh / remat / accumulation fields, themselves resumable.
    "layout", "slice", "layouts",
)
# Paths whose content is compared (by hash, in the record), not their spelling.
CONTENT_FIELDS = ("data.vocab_file", "data.spm_model_file", "vocab_file", "spm_model_file")
# Config fields added later whose default does NOT keep what an older record's runs did:
# for a record without the field, the value the code that wrote it ran with, from that
# record's config. It is compared as if recorded, so a resume cannot silently change
# what the run means (every other missing field keeps the old meaning by its default).
# Each is called with (the old record's config, the new one).
IMPLIED_WHEN_MISSING = {
    # Before this field, fine-tuning's padding="buckets" grouped train rows by length
    # whenever there was more than one bucket (bucket_multiple < max_seq_length).
    "group_by_length": lambda old, new: (
        old.get("padding") == "buckets" and
        old.get("bucket_multiple", 0) < old.get("max_seq_length", 0)),
    # Before this field, running text was split by the regex (data_pipeline/sources/sentences.py's
    # LEGACY_SPLITTER). BERT-format files and the embedded corpus are never split, so there
    # the splitter changes nothing and the new value stands.
    "data.sentence_splitter": lambda old, new: (
        "regex" if str(old.get("data.corpus", "")).startswith(_SPLIT_CORPORA)
        else new.get("data.sentence_splitter")),
    # Before this field, packed documents closed rows with room (blocks of documents). It
    # changes nothing for the other objectives, so there the new value stands.
    "data.pack_fill": lambda old, new: (
        False if old.get("data.objective") == "documents" else new.get("data.pack_fill")),
}
# Fields whose value in a shipped variant changed after workdirs were made with the old one,
# and for which the old value, given by flag, is the whole fix: "base" scans its layers
# since 2026-12-07 (compile time; its checkpoints store the layers stacked); fine-tuning
# packs by default since 2026-12-07 (it was "buckets": the same batches, other dropout
# shapes, so a resume keeps the padding it started with).
RESTORED_BY_FLAG = ("model.scan_layers", "padding")
# The corpus kinds whose text a sentence splitter cuts (data_pipeline/sources/corpora.py).
_SPLIT_CORPORA = ("raw:", "jsonl:", "parquet:", "tfds:")


def flatten(config: Any) -> dict[str, Any]:
  """A ConfigDict (or dict) as {"a.b.c": value} with JSON-normal values (tuples as lists)."""
  tree = json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort") \
      else json.loads(json.dumps(config))
  flat = {}

  def walk(prefix, node):
    if isinstance(node, dict):
      for k, v in node.items():
        walk(f"{prefix}{k}.", v)
    else:
      flat[prefix[:-1]] = node
  walk("", tree)
  return flat


def sha256_of(path: str | None) -> str | None:
  """SHA-256 of a file's bytes (None for no file)."""
  return hashlib.sha256(paths.read_bytes(path)).hexdigest() if path else None


def code_version() -> str:
  """The package version, plus the git commit when running from a checkout."""
  try:
    version = importlib.metadata.version("bert_jax")
  except importlib.metadata.PackageNotFoundError:
    version = "unknown"
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, timeout=5, check=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return f"{version}+{commit}"
  except (OSError, subprocess.SubprocessError):
    return version


def make_record(config: Any, bert_config: Any, *, vocab_file: str | None = None,
                spm_model_file: str | None = None, data: dict | None = None) -> dict:
  """What a workdir is: compared field by field by every later run."""
  return {
      "config": flatten(config),
      "bert_config": dataclasses.asdict(bert_config),
      "vocab_sha256": sha256_of(vocab_file),
      "spm_sha256": sha256_of(spm_model_file),
      "data": data or {},
      "code_version": code_version(),
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "created_by": f"{socket.gethostname()}:{os.getpid()}",
  }


def _resumable(key: str) -> bool:
  return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


# Network fields that change runtime only (memory, speed), never what the weights are.
_RUNTIME_BERT_FIELDS = ("remat", "remat_policy", "attention_impl")
# A network field missing from a record was added after it was written; the code that
# wrote it ran with the field's default (a new field's default keeps the old meaning), so
# a resume is compared against that default (e.g. attention_dropout_shared reads False).
_BERT_DEFAULTS = {f.name: f.default for f in dataclasses.fields(model_lib.BertConfig)}


def differences(recorded: dict, new: dict, quiet: bool = False) -> list[tuple[str, Any, Any]]:
  """(field, recorded value, new value) for every change that is not allowed on resume.

  A vocabulary hash absent from `new` is not compared (check_before_data: not known
  yet); `quiet` logs nothing (the same comparison is made again, and logged, later).
  """
  diffs = []
  old_config, new_config = recorded.get("config", {}), new["config"]
  for key in sorted(set(old_config) | set(new_config)):
    if _resumable(key) or key in CONTENT_FIELDS:
      continue
    if key not in old_config and key in IMPLIED_WHEN_MISSING:
      old_config = {**old_config, key: IMPLIED_WHEN_MISSING[key](old_config, new_config)}
    if key not in old_config or key not in new_config:
      # A field only one code version knows: a newer version added (or an older one
      # dropped) it; its default keeps the old meaning, so it is logged, not refused.
      if not quiet:
        logging.warning("config field %s is %s the workdir's record", key,
                        "new to" if key not in old_config else "missing from this run, but in")
      continue
    if old_config[key] != new_config[key]:
      diffs.append((f"config.{key}", old_config[key], new_config[key]))
  for field in ("vocab_sha256", "spm_sha256"):
    if field in new and recorded.get(field) != new[field]:
      name = "vocabulary" if field == "vocab_sha256" else "SentencePiece model"
      diffs.append((f"{name} (SHA-256)", recorded.get(field), new[field]))
  recorded_bert = recorded.get("bert_config")
  for key, value in new["bert_config"].items():
    if recorded_bert is None or key in _RUNTIME_BERT_FIELDS:
      continue
    old = recorded_bert.get(key, _BERT_DEFAULTS.get(key, value))
    if old != value:
      diffs.append((f"network {key}", old, value))
  for key, value in new["data"].items():
    if recorded.get("data", {}).get(key, value) != value:
      diffs.append((f"corpus {key}", recorded["data"][key], value))
  return diffs


def read_record(workdir: str, new: dict) -> dict | None:
  """The workdir's record; for a workdir made before records existed (or whose creation
  was cut short before record.json) what its config.json, bert_config.json and vocab.txt
  say; None for a new workdir."""
  record_file = paths.join(workdir, RECORD_FILE)
  if paths.exists(record_file):
    return json.loads(paths.read_text(record_file))
  config_file = paths.join(workdir, CONFIG_FILE)
  if not paths.exists(config_file):
    return None
  legacy = {"config": flatten(json.loads(paths.read_text(config_file))),
            "vocab_sha256": new["vocab_sha256"], "spm_sha256": new["spm_sha256"],
            "code_version": "unknown (no record.json)"}
  vocab = paths.join(workdir, VOCAB_FILE)
  if paths.exists(vocab):
    legacy["vocab_sha256"] = sha256_of(vocab)
  if paths.exists(paths.join(workdir, BERT_CONFIG_FILE)):
    legacy["bert_config"] = json.loads(paths.read_text(paths.join(workdir, BERT_CONFIG_FILE)))
  return legacy


_JOB_NAMES = {"pretrain": "pretraining", "finetune": "fine-tuning"}


def check_family(workdir: str, config: Any) -> None:
  """Refuses, reading only, a workdir made by another kind of job (fine-tuning into a
  pretraining workdir), before that job reads any data."""
  previous = previous_config(workdir)
  family = previous and previous.get("family")
  if family and family != config.family:
    raise WorkdirError(
        f"workdir {workdir} is a {_JOB_NAMES.get(family, family)} workdir; a "
        f"{_JOB_NAMES.get(config.family, config.family)} run needs its own "
        f"--workdir (to start from its weights: --config.init_checkpoint={workdir})")


# Where a run's committed checkpoints live (bert_jax.run.checkpoint.CHECKPOINT_DIR, which
# imports this module): a step directory there is work a record speaks for.
_CHECKPOINTS = "checkpoints"


def holds_work(workdir: str) -> bool:
  """Whether the workdir holds a committed checkpoint (a step directory): completed work
  that its record speaks for. A record without any (a start that failed before its first
  save) never blocks a corrected command."""
  # paths.glob lists files: a committed step directory holds some (orbax's metadata).
  return any(p.split("/")[-2].isdigit()
             for p in paths.glob(paths.join(workdir, _CHECKPOINTS, "*", "*")))


def check_record(workdir: str, old: dict, new: dict, quiet: bool = False) -> bool:
  """Refuses, in one message, a run whose record differs from the workdir's (`quiet`:
  nothing logged, see differences); returns True when it differs but the workdir holds
  no completed work (holds_work), so that the new run's record replaces it."""
  if not quiet and old.get("code_version") != new["code_version"]:
    logging.info("workdir %s was created by bert_jax %s; this is %s", workdir,
                 old.get("code_version"), new["code_version"])
  diffs = differences(old, new, quiet)
  if not diffs:
    return False
  if not holds_work(workdir):
    if not quiet:
      logging.warning("workdir %s was created with %s=%r but holds no checkpoint: its record "
                      "is replaced by this run's (%d field(s) differ)", workdir, diffs[0][0],
                      diffs[0][1], len(diffs))
    return True
  field, was_value, value = diffs[0]
  more = f" (and {len(diffs) - 1} more: {', '.join(d[0] for d in diffs[1:4])})" if diffs[1:] else ""
  variant = old["config"].get("variant") or old["config"].get("task.name")
  was = f" as {variant!r}" if variant else ""
  key = field[len("config."):]
  # A field newer than the record: the record ran with its implied value, which resumes it.
  # A field whose shipped value changed under a workdir (RESTORED_BY_FLAG): its old value,
  # by flag, resumes it as it ran.
  resume = (f"to resume it as it ran, --{field}={was_value!r}; "
            if (key in IMPLIED_WHEN_MISSING and key not in old.get("config", {}))
            or key in RESTORED_BY_FLAG else "")
  raise WorkdirError(
      f"workdir {workdir} was created{was} with {field}={was_value!r}; this run has "
      f"{value!r}{more}. "
      f"Its checkpoints mean what {paths.join(workdir, RECORD_FILE)} says: {resume}use a new "
      f"--workdir for the new setting, or start one from these weights with "
      f"--config.init_checkpoint={workdir}")


def write_run_files(workdir: str, config: Any, bert_config: Any, *, record: dict | None = None,
                    vocab_file: str | None = None, spm_model_file: str | None = None) -> None:
  """Writes a workdir's description; record.json, when given, goes last (it commits the rest).

  Without a record this makes a directory that checkpoint readers load
  (fine-tuning's best/ snapshot).
  """
  copies = {vocab_file: VOCAB_FILE} if vocab_file else {}
  if vocab_file and str(vocab_file).endswith(TOKENIZER_FILE):  # a whole tokenizer (ModernBERT's)
    copies = {vocab_file: TOKENIZER_FILE}
  elif vocab_file and str(vocab_file).endswith(".json"):  # a byte-level BPE: its merges travel too
    merges = paths.join(str(paths.path(vocab_file).parent), BPE_MERGES_FILE)
    copies = {vocab_file: BPE_VOCAB_FILE, merges: BPE_MERGES_FILE}
  for source, name in copies.items():
    if paths.path(source) != paths.path(paths.join(workdir, name)):
      paths.copy_file(source, paths.join(workdir, name))
  if spm_model_file:
    paths.copy_file(spm_model_file, paths.join(workdir, SPM_FILE))
  paths.write_atomic(paths.join(workdir, BERT_CONFIG_FILE),
                     json.dumps(dataclasses.asdict(bert_config), indent=2, sort_keys=True))
  paths.write_atomic(paths.join(workdir, CONFIG_FILE),
                     config.to_json_best_effort(indent=2, sort_keys=True))
  if record is not None:
    paths.write_atomic(paths.join(workdir, RECORD_FILE),
                       json.dumps(record, indent=2, sort_keys=True))


def check_writable(workdir: str) -> None:
  """Creates `workdir` and proves it writable, before any compile or training step.

  Raises:
    WorkdirError: naming the workdir and the cause.
  """
  # One probe per process: hosts of a multi-host run probe the same workdir at once.
  probe = paths.join(workdir, f".write_probe.{socket.gethostname()}.{os.getpid()}")
  try:
    paths.makedirs(workdir)
    paths.write_atomic(probe, "ok")
    paths.remove(probe)
  except (OSError, ValueError) as e:
    raise WorkdirError(f"workdir {workdir!r} is not writable: {e}") from e


def lock(workdir: str) -> Lock | None:
  """Makes `workdir` writable and this run's alone (see Lock); every process calls it.

  Process 0 takes the lock, the others learn whether it could. Returns the
  lock to release at the end (None on other processes).
  """
  return _on_process_zero(workdir, lambda held: None)


def check_before_data(workdir: str, config: Any, bert_config: Any | None, *,
                      vocab_file: str | None = None, spm_model_file: str | None = None,
                      lock_dir: str | None = None) -> None:
  """Refuses, reading only, a run `workdir` will refuse whatever its data: a lock a live run
  holds (LockHeld), or a record.json whose config, network (its vocabulary size aside:
  `bert_config` may be provisional; None when it comes from a checkpoint not read yet)
  or vocabulary differ -- the vocabulary only when the run names its file
  (`vocab_file` / `spm_model_file`; one made from the corpus is not known yet).

  Called before a run reads its corpus, which takes minutes on a real one: a busy
  workdir or a contradicting config is refused in seconds. It writes nothing and takes
  no lock: open_workdir, after the data, judges everything again with the lock held.
  `lock_dir`: the workdir whose lock covers this one (a fine-tuning sweep's, for its
  runs), default `workdir`. Every process calls it; process 0 judges, the others learn
  the outcome.
  """
  def judge():
    Lock(lock_dir or workdir).check_free()
    record_file = paths.join(workdir, RECORD_FILE)
    if not paths.exists(record_file):  # new, or made before records: open_workdir judges it
      return
    old = json.loads(paths.read_text(record_file))
    network = {k: v for k, v in dataclasses.asdict(bert_config).items()
               if k != "vocab_size"} if bert_config is not None else {}
    new = {"config": flatten(config), "bert_config": network, "data": {},
           "code_version": code_version()}
    if vocab_file or spm_model_file:
      new.update(vocab_sha256=sha256_of(vocab_file), spm_sha256=sha256_of(spm_model_file))
    check_record(workdir, old, new, quiet=True)
  error = ""
  if jax.process_index() == 0:
    try:
      judge()
    except WorkdirError as e:
      error = _as_text(e)
  _raise_everywhere(error)


def open_workdir(workdir: str, config: Any, bert_config: Any, *, vocab_file: str | None = None,
                 spm_model_file: str | None = None, data: dict | None = None,
                 take_lock: bool = True) -> Lock | None:
  """Makes `workdir` this run's: writable, locked, and created or checked against its record.

  Call after the config is fully validated (a refused config changes nothing on
  disk) and before anything else is written. Every process of a multi-host run
  calls it; process 0 decides, the others learn the outcome. `take_lock=False`
  when the caller already holds a lock covering it (a fine-tuning sweep's runs).
  Returns the lock to release at the end (None on other processes, or when not taken).
  """
  def create_or_check(_):
    record = make_record(config, bert_config, vocab_file=vocab_file,
                         spm_model_file=spm_model_file, data=data)
    old = read_record(workdir, record)
    replace = old is not None and check_record(workdir, old, record)
    if old is None or "created" not in old or replace:  # new, before records, or no work yet
      write_run_files(workdir, config, bert_config, record=record, vocab_file=vocab_file,
                      spm_model_file=spm_model_file)
    else:
      record_changes(workdir, old, record, config)
  return _on_process_zero(workdir, create_or_check, take_lock=take_lock)


# The record's "history": one entry per resume that changed RESUMABLE fields,
# {"at": time, "by": host:pid, "fields": {"total_steps": [old, new], ...}}. The record's
# "config" stays what the workdir was created with; current_config applies the history.
HISTORY = "history"


def current_config(record: dict) -> dict[str, Any]:
  """The flattened config of the latest run on a workdir: its record's config with every
  recorded change applied."""
  config = dict(record.get("config", {}))
  for entry in record.get(HISTORY, []):
    config.update({key: new for key, (_, new) in entry["fields"].items()})
  return config


def previous_config(workdir: str) -> dict[str, Any] | None:
  """current_config of `workdir`'s record (read only), or None for a workdir without one."""
  record_file = paths.join(workdir, RECORD_FILE)
  if not paths.exists(record_file):
    return None
  return current_config(json.loads(paths.read_text(record_file)))


def record_changes(workdir: str, old: dict, new: dict, config: Any) -> None:
  """Logs one line per RESUMABLE field this run changes (old -> new) and appends them to
  the record's history; config.json is rewritten to say what now runs."""
  previous = current_config(old)
  fields = {key: [previous[key], value] for key, value in sorted(new["config"].items())
            if _resumable(key) and key in previous and previous[key] != value}
  if not fields:
    return
  for key, (was, now) in fields.items():
    logging.warning("workdir %s: config.%s changes %r -> %r on this resume (recorded in %s)",
                    workdir, key, was, now, RECORD_FILE)
  old = dict(old)
  old[HISTORY] = list(old.get(HISTORY, [])) + [{
      "at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "by": f"{socket.gethostname()}:{os.getpid()}", "fields": fields}]
  paths.write_atomic(paths.join(workdir, RECORD_FILE), json.dumps(old, indent=2, sort_keys=True))
  paths.write_atomic(paths.join(workdir, CONFIG_FILE),
                     config.to_json_best_effort(indent=2, sort_keys=True))


def _on_process_zero(workdir: str, action, take_lock: bool = True) -> Lock | None:
  """Checks `workdir` is writable, then on process 0 takes the lock and runs `action`;
  a WorkdirError there is raised on every process."""
  check_writable(workdir)
  error, held = "", None
  if jax.process_index() == 0:
    try:
      if take_lock:
        held = Lock(workdir)
        held.acquire()
      action(held)
    except WorkdirError as e:
      if held is not None:
        held.release()
        held = None
      error = _as_text(e)
    except BaseException:
      if held is not None:
        held.release()
      raise
  _raise_everywhere(error)
  return held


def _as_text(error: WorkdirError) -> str:
  """A refusal as text to broadcast: the kind travels with it (a live holder, LockHeld,
  means "retry later")."""
  return ("H" if isinstance(error, LockHeld) else "W") + str(error)


def _raise_everywhere(error: str) -> None:
  """Raises process 0's refusal (`error`, from _as_text; "" for none) on every process."""
  error = _broadcast_text(error)
  if error:
    raise (LockHeld if error[0] == "H" else WorkdirError)(error[1:])


def _broadcast_text(text: str) -> str:
  """Process 0's string on every process (multi-host); itself on one process."""
  if jax.process_count() == 1:
    return text
  data = np.zeros([4096], np.uint8)
  raw = text.encode("utf-8")[:4096]
  data[:len(raw)] = np.frombuffer(raw, np.uint8)
  data = np.asarray(multihost_utils.broadcast_one_to_all(data))
  return bytes(data[data != 0].tolist()).decode("utf-8", errors="replace")
