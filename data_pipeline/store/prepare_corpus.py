r"""Tokenizes a corpus once into its store (token_store.py), in parallel; and the offline command.

  python -m data_pipeline.store.prepare_corpus --config=experiments/configs/pretrain.py:tiny \
      [--config.data.corpus=... --config.data.tokenized_dir=gs://bucket/tokenized] \
      --num_workers=8

prepares, on any CPU machine and before a slice is paid for, the store a training
run's first start would otherwise make (data_pipeline.prepare.PretrainingData calls
`prepare_store` too), with a progress bar and ETA, then prints the tokens/s and the
store's path and size. --process_index/--process_count prepare one host's share. A
complete store is "already prepared" only once every shard's checksums are read right;
a shard that fails is named and rebuilt.

Over cores: `num_workers` workers, each tokenizing whole units on one core with
tokenized_corpus's own code and writing their shards: this process, which starts
at once, and num_workers - 1 fresh interpreters (TensorFlow after a fork is unsafe),
which take a few seconds to start. num_workers 0: one per core, but at most one per
AUTO_WORKER_BYTES of this host's share, so a small corpus is not slower for them.

Over hosts: process i of N prepares the units u with u % N == i, then waits for the
others' shards. When none of the others has shown itself in the store within
GRACE_S of this one finishing (each host keeps its own store on its own disk), or
no new shard has come for STALL_S (a host died), it prepares what is missing
itself: a shard is written whole and is the same bytes whoever writes it, so two
writers never conflict. Every process then writes the same manifest.

A killed preparation resumes shard by shard: a shard found on disk is kept when its
header, size and checksums are right, rebuilt otherwise.
"""

import collections
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import traceback

import ml_collections

from data_pipeline.store import corpus_units
from data_pipeline.store import token_store
from data_pipeline.store import tokenized_corpus
from data_pipeline.vocab import tokenizers
from host import paths

# With num_workers 0, at most one worker per this many bytes of a host's share: a worker's
# start (an interpreter, TensorFlow, the vocabulary) costs about what 20 MB of text takes.
AUTO_WORKER_BYTES = 64 << 20
GRACE_S = 60.0  # after its own share, how long a process waits for any sign of the others
STALL_S = 600.0  # how long it waits for the next shard of the others once they have shown
_POLL_S = 2.0


# ------------------------------------------------------------------- one unit


def _make_shard(job: dict, data_config, tokenizer, unit: dict) -> dict:
  """Tokenizes one unit and writes its shard whole; what it counted, with its time."""
  start = time.perf_counter()
  arrays, info = corpus_units.tokenize_unit(data_config, tokenizer, unit, job["kind"],
                                            job["files"], job["process_count"])
  data = token_store.encode_shard(job["key"], unit, arrays, info)
  token_store.write_file(paths.join(job["directory"], token_store.shard_name(unit["index"])),
                         data, job["directory"])
  return {**info, "bytes": len(data), "seconds": time.perf_counter() - start}


def worker_main() -> None:
  """A worker process: a job line, then one unit per line on stdin; one JSON reply per
  unit on the original stdout (everything else the libraries print goes to stderr)."""
  replies = os.fdopen(os.dup(1), "w", buffering=1)
  os.dup2(2, 1)
  job = json.loads(sys.stdin.readline())
  data_config = ml_collections.ConfigDict(json.loads(job["config"]))
  tokenizer = tokenizers.load_tokenizer(job["vocab_file"], job["spm_model_file"],
                                        data_config.do_lower_case)
  replies.write(json.dumps({"ready": True}) + "\n")
  for line in sys.stdin:
    try:
      reply = {"done": _make_shard(job, data_config, tokenizer, json.loads(line))}
    except ValueError as e:  # bad input: the parent refuses with this very message
      reply = {"refusal": str(e)}
    except Exception:  # pylint: disable=broad-except  # a bug: the parent shows the traceback
      reply = {"error": traceback.format_exc()}
    replies.write(json.dumps(reply) + "\n")


class _Workers:
  """`n` worker processes, and this process too when given `local` (data config, tokenizer),
  tokenizing units handed out one at a time (the next to whoever is free). This process
  works while the others start (an interpreter and TensorFlow each: seconds)."""

  def __init__(self, n: int, job: dict, local: tuple | None = None):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # One core each (tokenize_sentences(parallel=False) runs one op at a time): N workers
    # on N cores, not N thread pools the size of the machine.
    env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    command = [sys.executable, "-c",
               "from data_pipeline.store import prepare_corpus; prepare_corpus.worker_main()"]
    self.job, self.local, self.started = job, local, time.perf_counter()
    self.processes = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       env=env, text=True) for _ in range(n)]
    for process in self.processes:
      process.stdin.write(json.dumps(job) + "\n")
      process.stdin.flush()
    self.startup_s = 0.0  # until the slowest worker had its tokenizer

  def run(self, units: list[dict], on_done) -> None:
    """Tokenizes `units`, calling on_done(unit, info) in this thread as each finishes."""
    todo, done = queue.Queue(), queue.Queue()
    for unit in units:
      todo.put(unit)

    def serve(process):
      if not process.stdout.readline():  # its "ready"
        done.put((None, {"error": f"a worker process exited at its start (code "
                                  f"{process.wait()}); its error is above"}))
        return
      self.startup_s = max(self.startup_s, time.perf_counter() - self.started)
      while True:
        try:
          unit = todo.get_nowait()
          process.stdin.write(json.dumps(unit) + "\n")
          process.stdin.flush()
        except (queue.Empty, OSError, ValueError):  # nothing left, or the pool is closing
          return
        line = process.stdout.readline()
        done.put((unit, json.loads(line) if line else
                  {"error": f"worker process exited (code {process.poll()})"}))

    def serve_here():
      while True:
        try:
          unit = todo.get_nowait()
        except queue.Empty:
          return
        try:
          reply = {"done": _make_shard(self.job, *self.local, unit)}
        except ValueError as e:
          reply = {"refusal": str(e)}
        except Exception:  # pylint: disable=broad-except  # shown with its traceback below
          reply = {"error": traceback.format_exc()}
        done.put((unit, reply))

    threads = [threading.Thread(target=serve, args=(p,), daemon=True) for p in self.processes]
    if self.local is not None:
      threads.append(threading.Thread(target=serve_here, daemon=True))
    for thread in threads:
      thread.start()
    finished = 0
    while finished < len(units):
      unit, reply = done.get()
      if "done" not in reply:
        try:  # hand out nothing more
          while True:
            todo.get_nowait()
        except queue.Empty:
          pass
        if "refusal" in reply:
          raise ValueError(reply["refusal"])
        where = f"tokenizing unit {unit['index']}" if unit else "starting a worker"
        raise RuntimeError(f"{where} failed:\n{reply['error']}")
      on_done(unit, reply["done"])
      finished += 1

  def close(self) -> None:
    """Ends the workers (each finishes the unit it is on, if any)."""
    for process in self.processes:
      try:
        process.stdin.close()
      except OSError:
        pass
    for process in self.processes:
      try:
        process.wait(timeout=60)
      except subprocess.TimeoutExpired:
        process.kill()


class _Progress:
  """A progress line with ETA: redrawn in place on a terminal, else every ~10% or minute."""

  def __init__(self, units: list[dict], sizes: dict[int, int], stream=None):
    self.total, self.units, self.sizes = sum(sizes[u["index"]] for u in units), len(units), sizes
    self.done_bytes = self.done_units = self.tokens = 0
    self.start = self.shown = time.monotonic()
    self.stream = stream if stream is not None else sys.stderr
    self.tty, self.step = self.stream.isatty(), 0

  def update(self, unit: dict, info: dict) -> None:
    """One unit done."""
    self.done_units += 1
    self.done_bytes += self.sizes[unit["index"]]
    self.tokens += info["tokens"]
    now = time.monotonic()
    fraction = self.done_bytes / max(self.total, 1)
    if not (self.tty or now - self.shown > 60 or int(fraction * 10) > self.step
            or self.done_units == self.units):
      return
    self.shown, self.step = now, int(fraction * 10)
    elapsed = now - self.start
    eta = elapsed * (1 - fraction) / fraction if fraction else 0
    bar = "#" * int(fraction * 30)
    line = (f"tokenizing: {self.done_units}/{self.units} shards [{bar:<30}] {fraction:4.0%}, "
            f"{self.tokens / max(elapsed, 1e-9) / 1e6:.2f} M tokens/s, ETA "
            f"{int(eta // 60)}m{int(eta % 60):02d}s")
    self.stream.write(("\r" + line + ("\n" if self.done_units == self.units else ""))
                      if self.tty else line + "\n")
    self.stream.flush()


# -------------------------------------------------------------- the preparation


def _existing_shards(directory: str) -> set[str]:
  return {os.path.basename(p) for p in paths.glob(paths.join(directory, token_store.SHARDS,
                                                              "*.tok"))}


def _bad_shard(directory: str, key_hex: str, unit_index: int, full: bool) -> str | None:
  """Why a unit's shard cannot be kept (None: it can); `full` reads every array."""
  try:
    shard = token_store.Shard(paths.join(directory, token_store.shard_name(unit_index)),
                              key_hex, unit_index)
    if full:
      for name in shard.header["arrays"]:
        shard.array(name)
  except token_store.ShardError as e:
    return str(e)
  return None


def _missing_directories(directory: str) -> list[str]:
  """`directory` and those of its parents that do not exist, innermost first (local only)."""
  missing = []
  while not paths.is_remote(directory) and not paths.exists(directory):
    missing.append(directory)
    parent = os.path.dirname(directory)
    if parent == directory:
      break
    directory = parent
  return missing


def _remove_dead_writers_temporaries(directory: str) -> None:
  """Temporary shards left by this host's killed writers (paths.write_atomic's names)."""
  if paths.is_remote(directory):
    return
  host = socket.gethostname()
  for path in paths.glob(paths.join(directory, token_store.SHARDS, f".*.tmp-{host}-*")):
    try:
      os.kill(int(path.rsplit("-", 1)[1]), 0)
    except (ValueError, ProcessLookupError):
      paths.remove(path)
    except PermissionError:
      pass  # alive, another user's


class _Preparation:
  """One process's part in preparing one store (see the module docstring)."""

  def __init__(self, data_config, key: dict, kind: str, files: list[str], *, vocab_file: str,
               spm_model_file: str, process_index: int, process_count: int, num_workers: int,
               tokenizer, stream):
    self.config, self.key, self.key_hex = data_config, key, token_store.key_digest(key)
    self.directory = token_store.store_dir(data_config, key)
    self.new = _missing_directories(self.directory)  # what remove_if_empty may remove
    self.kind, self.files = kind, files
    self.process_index, self.process_count = process_index, process_count
    self.units = corpus_units.plan_units(data_config, kind, files, process_count)
    self.job = {"config": data_config.to_json(), "vocab_file": vocab_file,
                "spm_model_file": spm_model_file, "directory": self.directory,
                "key": self.key_hex, "kind": kind, "files": files,
                "process_count": process_count}
    self.num_workers = num_workers  # 0: one per core, at most one per AUTO_WORKER_BYTES
    self.workers_used, self.worker_start_s = 0, 0.0
    self.tokenizer, self.stream = tokenizer, stream
    self.made = {}  # unit index -> what tokenizing it here counted
    self.seconds = 0.0

  def tokenize(self, units: list[dict]) -> None:
    """Makes the shards of `units` here, over the worker processes."""
    if not units:
      return
    start = time.perf_counter()
    sizes = {u["index"]: corpus_units.unit_bytes(u, self.config, self.files) for u in units}
    progress = _Progress(units, sizes, self.stream)

    def on_done(unit, info):
      self.made[unit["index"]] = info
      progress.update(unit, info)

    workers = self.num_workers or min(os.cpu_count() or 1,
                                      max(1, sum(sizes.values()) // AUTO_WORKER_BYTES))
    workers = min(workers, len(units))
    self.workers_used = max(self.workers_used, workers)
    tokenizer = self.tokenizer or tokenized_corpus.load_tokenizer(self.config)
    if workers <= 1:
      for unit in units:
        on_done(unit, _make_shard(self.job, self.config, tokenizer, unit))
    else:  # this process is one of the workers
      pool = _Workers(workers - 1, self.job, local=(self.config, tokenizer))
      try:
        pool.run(units, on_done)
      finally:
        pool.close()
      self.worker_start_s = max(self.worker_start_s, pool.startup_s)
    self.seconds += time.perf_counter() - start

  def run(self, check_shards: bool, grace_s: float, stall_s: float) -> dict:
    """Prepares this process's share, waits for (or takes over) the rest; the manifest."""
    token_store.write_file(paths.join(self.directory, token_store.KEY_FILE),
                           json.dumps(self.key, sort_keys=True, indent=1) + "\n",
                           self.directory)
    marker = paths.join(self.directory, "hosts", str(self.process_index))
    if self.process_count > 1:
      token_store.write_file(marker, "", self.directory)
    present = _existing_shards(self.directory)
    mine = [u for u in self.units if u["index"] % self.process_count == self.process_index]
    self.tokenize([u for u in mine if self._rebuild(u, present, full=True)])
    if self.process_count > 1:
      self._await_others(grace_s, stall_s)
    present = _existing_shards(self.directory)
    self.tokenize([u for u in self.units if u["index"] not in self.made and
                   self._rebuild(u, present, full=check_shards)])
    infos = []
    for unit in self.units:
      if unit["index"] in self.made:
        infos.append(self.made[unit["index"]])
      else:
        shard = token_store.Shard(paths.join(self.directory, token_store.shard_name(
            unit["index"])), self.key_hex, unit["index"])
        infos.append({**shard.info, "bytes": shard.size})
    manifest = self._write_manifest(infos)
    if self.process_count > 1:
      paths.remove(marker)
    _remove_dead_writers_temporaries(self.directory)
    return manifest

  def remove_if_empty(self) -> None:
    """After a refusal (bad input, a full or unwritable store root): the store directory
    (and root) this preparation created, when it holds no shard yet, so that a refused
    command leaves nothing behind. Shards made are kept: the same command resumes with
    them. Only empty directories go, so a peer's work is never removed."""
    if not self.new or _existing_shards(self.directory):
      return
    for name in (token_store.KEY_FILE, f"hosts/{self.process_index}"):
      try:
        os.remove(paths.join(self.directory, name))
      except OSError:
        pass  # never written
    for directory in (paths.join(self.directory, token_store.SHARDS),
                      paths.join(self.directory, "hosts"), *self.new):
      try:
        os.rmdir(directory)
      except OSError:
        pass  # not made, or not empty: someone else's

  def _rebuild(self, unit: dict, present: set[str], full: bool) -> bool:
    name = token_store.shard_name(unit["index"])
    if os.path.basename(name) not in present:
      return True
    why = _bad_shard(self.directory, self.key_hex, unit["index"], full)
    if why:
      logging.warning("tokenized store: rebuilding a shard that cannot be used: %s", why)
    return why is not None

  def _await_others(self, grace_s: float, stall_s: float) -> None:
    names = {os.path.basename(token_store.shard_name(u["index"])): u for u in self.units}
    last_count, last_change, peers = -1, time.monotonic(), False
    while True:
      present = _existing_shards(self.directory)
      missing = [u for name, u in names.items() if name not in present]
      if not missing:
        return
      if len(present) != last_count:
        last_count, last_change = len(present), time.monotonic()
      peers = peers or any(os.path.basename(p) != str(self.process_index) for p in paths.glob(
          paths.join(self.directory, "hosts", "*")))
      waited = time.monotonic() - last_change
      if waited > (stall_s if peers else grace_s):
        logging.warning(
            "tokenized store %s: %s; preparing the %d missing shards here", self.directory,
            f"no new shard from the other processes in {waited:.0f} s" if peers else
            f"no other process has shown itself in {waited:.0f} s (a store per host?)",
            len(missing))
        self.tokenize(missing)
        return
      time.sleep(_POLL_S)

  def _write_manifest(self, infos: list[dict]) -> dict:
    counted = ("lines", "undecodable_lines", "overlong_lines", "null_texts")  # per file
    per_file = collections.defaultdict(collections.Counter)
    for unit, info in zip(self.units, infos):
      if "file" in unit:
        per_file[unit["file"]].update({k: info["stats"][k] for k in counted})
    files = [{"name": os.path.basename(f), "size": paths.size(f),
              **{k: per_file[i][k] for k in counted}} for i, f in enumerate(self.files)]
    units = [{**unit, **{k: info[k] for k in ("range", "source_documents", "pieces",
                                              "sentences", "tokens", "bytes")}}
             for unit, info in zip(self.units, infos)]
    return token_store.write_manifest(
        self.directory, self.key, files, units,
        dtype=infos[0]["ids_dtype"] if infos else "<u2",  # tokenize_sentences's choice
        tfds_processes=self.process_count if self.kind == "tfds" else 0)


def prepare_store(data_config, *, vocab_file: str, spm_model_file: str, process_index: int = 0,
                  process_count: int = 1, num_workers: int = 0, tokenizer=None,
                  check_shards: bool = False, stream=None, grace_s: float | None = None,
                  stall_s: float | None = None) -> token_store.TokenStore:
  """The complete store of `data_config`'s corpus and vocabulary, made when absent (this
  process's share of it; see the module docstring); its files judged like the in-memory
  path judges them (corpora.check_decodable). `check_shards`: read every shard whole and
  rebuild the damaged ones even when the store is complete. The store's `prepared` says
  what was tokenized here: {"units", "tokens", "seconds", "workers", "worker_start_s"}.
  A complete store whose shards all pass that check is not written to."""
  if data_config.corpus.startswith("tfds:"):
    kind, files = "tfds", []
  else:
    kind, files = token_store.source_files(data_config)
  key = token_store.store_key(data_config, vocab_file, spm_model_file, process_count)
  store = token_store.open_store(data_config, key, files)
  if store is not None and check_shards and any(
      _bad_shard(store.directory, store.manifest["key"], u["index"], full=True)
      for u in store.units):
    store = None  # the preparation names each damaged shard as it rebuilds it
  prepared = {"units": 0, "tokens": 0, "seconds": 0.0, "workers": 0, "worker_start_s": 0.0}
  if store is None:
    preparation = _Preparation(
        data_config, key, kind, files, vocab_file=vocab_file, spm_model_file=spm_model_file,
        process_index=process_index, process_count=process_count, num_workers=num_workers,
        tokenizer=tokenizer, stream=stream)
    try:
      # The module's waits, read now (not bound as defaults) so that a caller several
      # layers up, such as a test of the prepared batches, can shorten them.
      preparation.run(check_shards, GRACE_S if grace_s is None else grace_s,
                      STALL_S if stall_s is None else stall_s)
    except ValueError:  # a refusal: of the corpus, or of the store root's storage
      preparation.remove_if_empty()
      raise
    made = preparation.made.values()
    prepared = {"units": len(made), "tokens": sum(i["tokens"] for i in made),
                "seconds": preparation.seconds,
                "workers": preparation.workers_used,
                "worker_start_s": preparation.worker_start_s}
    store = token_store.open_store(data_config, key, files)
    if prepared["units"]:  # beside the progress bar, which says the same while it runs
      (stream or sys.stderr).write(
          f"tokenized store {store.directory}: tokenized shards "
          f"{json.dumps(sorted(preparation.made))} here ({prepared['tokens']} tokens) in "
          f"{prepared['seconds']:.1f} s\n")
  store.prepared = prepared
  store.check_files()
  return store


def read_selection(store: token_store.TokenStore, data_config, *, split: str,
                   process_index: int, process_count: int, max_documents: int = 0):
  """What tokenized_corpus.read_tokenized_corpus returns, from the store: the same
  TokenizedCorpus, the same refusals."""
  selection = store.select(split, process_index, process_count, max_documents,
                           data_config.heldout_modulus)
  if not selection.pieces:
    hint = (f"; about one document in config.data.heldout_modulus="
            f"{data_config.heldout_modulus} is held out: give more documents or a smaller "
            "modulus" if split == "eval" else "")
    raise ValueError(f"corpus {data_config.corpus!r} (split {split!r}, process "
                     f"{process_index} of {process_count}) has no document{hint} (tokenized "
                     f"store {store.directory})")
  tokenized_corpus.check_segmented(data_config, selection.corpus,
                                   selection.segmented_sentences, split)
  logging.info("corpus %s (%s, process %d/%d) from %s: %d documents, %d tokens%s",
               data_config.corpus, split, process_index, process_count, store.directory,
               selection.corpus.num_documents, selection.corpus.num_tokens, store.skipped())
  return selection.corpus


# ------------------------------------------------------------------ the command


def _define_flags() -> None:
  # Only when run as a program: importing this module (the trainer, tests) claims no flag.
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "experiment or data config file[:arg]")
  flags.mark_flag_as_required("config")
  flags.DEFINE_integer("num_workers", 0, "worker processes (0: config.data.prepare_workers, "
                       "whose 0 is one per CPU core)")
  flags.DEFINE_integer("process_index", 0, "this host's share of the shards ...")
  flags.DEFINE_integer("process_count", 1, "... of this many (the training run's processes)")


def main(argv) -> None:
  """Prepares the store of --config's data and prints what it is."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from data_pipeline import specs  # pylint: disable=g-import-not-at-top
  if len(argv) > 1:
    sys.exit(f"error: unexpected arguments {argv[1:]}")
  fv = flags.FLAGS
  data_config = fv.config.data if "data" in fv.config else fv.config
  try:
    specs.check_data_config(data_config)
    if data_config.tokenized_dir == token_store.NONE:
      raise ValueError("config.data.tokenized_dir='none' keeps no store: give '' (the cache) "
                       "or a directory / gs:// path")
    vocab_file, spm_model_file = tokenized_corpus.resolve_vocab(data_config)
    start = time.perf_counter()
    # check_shards: a complete store is said to be prepared only once every shard's
    # header, size and checksums are verified (a damaged one is rebuilt, named).
    store = prepare_store(data_config, vocab_file=vocab_file, spm_model_file=spm_model_file,
                          process_index=fv.process_index, process_count=fv.process_count,
                          num_workers=fv.num_workers or data_config.prepare_workers,
                          stream=sys.stderr, check_shards=True)
  except ValueError as e:
    sys.exit(f"error: {' '.join(str(e).split())}")
  made, manifest = store.prepared, store.manifest
  if made["units"]:
    rate = made["tokens"] / max(made["seconds"], 1e-9)
    print(f"tokenized {made['units']} of {len(manifest['units'])} shards here: "
          f"{made['tokens']:,} tokens in {made['seconds']:.1f} s, {rate:,.0f} tokens/s "
          f"({rate / made['workers']:,.0f} per worker, {made['workers']} workers)")
  else:
    print(f"already prepared: every shard's checksums verified in "
          f"{time.perf_counter() - start:.1f} s")
  print(f"store: {store.directory}: {manifest['tokens']:,} tokens, "
        f"{manifest['shard_bytes'] / 2**20:,.1f} MiB in {len(manifest['units'])} shards "
        f"({manifest['shard_bytes'] / max(manifest['tokens'], 1):.2f} bytes per token)"
        f"{store.skipped()}")


if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top
  _define_flags()
  app.run(main)
