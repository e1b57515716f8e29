"""The tokenized-corpus store: a corpus tokenized once, in shards, that later starts read.

Stage 1 of the pipeline (tokenized_corpus.py) grows with the corpus (87 s for 194 MB
on this machine, one process) and depends only on the corpus files, the vocabulary
and a few options, so it is done once and kept (ARCHITECTURE.md, 18). A store is the
directory ``<root>/<key digest>/``:

  key.json            what the key is made of (written first: a half-made store says
                      what it is for)
  shards/NNNNN.tok    one per unit of work: an input file, or a byte range of a large
                      plain-text file cut at a document boundary (corpus_units.py)
  manifest.json       written last, once every shard is there: the files (with their
                      line counts), the units and their shards' sizes

A shard holds every document piece of its unit (a source document cut at
max_sentences_per_document, corpora.document_pieces), in corpus order, whatever split
or process it belongs to: the token ids (the dtype the in-memory path uses), each
non-empty sentence's length, and per piece its count of non-empty sentences (0: it
tokenized to nothing), its corpora.heldout_hash (so any heldout_modulus is served),
its index among its unit's source documents (processes share documents round-robin
by it when there are fewer files than processes) and how many of its sentences a
gold segmentation set. Any (split, process, process count, max documents) is then a
selection (`TokenStore.select`): the very TokenizedCorpus
tokenized_corpus.read_tokenized_corpus builds, so batches, pairs, masks and resume
positions are those of the in-memory path (data.tokenized_dir="none") and a workdir
resumes across the change.

The key (`store_key`) is everything the shards depend on: each corpus file's name,
size and content digest (SHA-256, cached by size and mtime for local files; the
object store's checksum for gs://), the vocabulary's or SentencePiece model's
SHA-256, every data option but those listed in NOT_IN_KEY (a field added later is
in the key by default: a miss is only slow, a stale hit would be a bug), and
FORMAT_VERSION. tfds corpora are split into units per process (tfds' even_splits),
so their key holds the process count too.

Safety: every shard is written whole (host/paths.write_atomic: a renamed temporary
file, or one object upload on gs://) and says in its header which key and unit it
belongs to and how long each array is, with a CRC-32 of each. A shard that is
truncated, damaged or of another store is refused by name (ShardError) wherever it
is read; the preparation (prepare_corpus.py) rebuilds it. A write the store root's
storage refuses (full, read-only) is a one-line refusal naming the file and the fix
(`write_file`). Nothing in a store
depends on who made it or when: a preparation killed at any point and run again
ends with the same bytes.

Reading: local shards are memory-mapped (only a selection's pages are touched, and
a shard is unmapped once its part is copied out); gs:// shards are read with ranged
requests, several at once. Nothing here imports TensorFlow, so the launcher can ask
whether a store exists (`describe`).
"""

import collections
import dataclasses
import errno
import hashlib
import json
import os
import zlib
from concurrent import futures

import numpy as np

from data_pipeline.sources import corpora
from data_pipeline.store import tokenized_corpus
from host import paths

FORMAT_VERSION = 1
_MAGIC = b"BJTOKS01"
_ALIGN = 64
MANIFEST = "manifest.json"
KEY_FILE = "key.json"
SHARDS = "shards"
NONE = "none"  # data.tokenized_dir: no store, tokenize in memory at every start

# Data fields that do not change what a store holds, and why. Everything else is in the key.
NOT_IN_KEY = (
    # Replaced by what they name: the files' digests and the vocabulary's.
    "corpus", "embedded_cache_dir", "tfds_data_dir", "vocab_file", "spm_model_file",
    "embedded_vocab_size", "embedded_vocab_max_lines",  # they make the vocabulary (digested)
    "heldout_modulus",  # the store keeps each piece's heldout_hash
    "max_undecodable_fraction",  # judged at every start from the store's per-file counts
    "tokenized_dir", "prepare_workers",  # where the store is, how fast it is made
    # Stages 2-4 (pairs, masking, batches, the eval set's size and seeds):
    "max_seq_length", "objective", "pack_window", "pack_fill", "short_seq_prob", "seed",
    "shuffle_buffer", "prefetch_batches", "masking.", "eval.",
)
_IN_KEY_DESPITE_PREFIX = ("masking.word_segmentation",)  # word starts ride in the ids


class ShardError(ValueError):
  """A shard that is missing, truncated, damaged or of another store (its path named)."""


# ------------------------------------------------------------------ where and which


def cache_root() -> str:
  """$BERT_JAX_CACHE, else ~/.cache/bert_jax (where embedded.py keeps the embedded corpus)."""
  return os.environ.get("BERT_JAX_CACHE") or os.path.expanduser("~/.cache/bert_jax")


def store_root(data_config) -> str:
  """The directory stores live under: data.tokenized_dir, "" -> <cache_root>/tokenized."""
  return data_config.tokenized_dir or paths.join(cache_root(), "tokenized")


def _flat_options(data_config) -> dict:
  flat = {}

  def walk(prefix, node):
    for k, v in node.items():
      if isinstance(v, dict):
        walk(f"{prefix}{k}.", v)
      else:
        flat[prefix + k] = v
  walk("", data_config.to_dict() if hasattr(data_config, "to_dict") else dict(data_config))
  return {k: v for k, v in flat.items() if k in _IN_KEY_DESPITE_PREFIX or not any(
      k == n or (n.endswith(".") and k.startswith(n)) for n in NOT_IN_KEY)}


def file_digest(path: str, text: bool = False) -> str:
  """A digest of a file's content: SHA-256 for a local file, kept under
  <cache_root>/file_digests by (path, size, mtime, inode) so a later start only stats it;
  the object store's own checksum for a remote one (host.paths.remote_checksum).

  `text` (a plain local text file): the digest is marked when the file holds a lone
  "\r", which ends a line since text_lines (issue 51; before, it stayed inside its
  line), so that a store made before from such a file is not reused; a file without
  one keeps the digest, and the store, it had. (A compressed or remote file is not
  looked into: a store made before from one with lone "\r"s must be deleted by hand.)
  """
  if paths.is_remote(path):
    return paths.remote_checksum(path)
  path = os.fspath(paths.path(path))
  stat = os.stat(path)
  stamp = [path, stat.st_size, stat.st_mtime_ns, stat.st_ino]
  memo = os.path.join(cache_root(), "file_digests",
                      hashlib.sha256(path.encode()).hexdigest()[:32] + ".json")
  try:
    with open(memo, encoding="utf-8") as f:
      cached = json.load(f)
    if cached["stamp"] == stamp:
      return cached["digest"] + (";lone-cr" if text and cached["lone_cr"] else "")
  except (OSError, ValueError, KeyError):  # KeyError: a memo from before "lone_cr"
    pass
  digest, ends, last = hashlib.sha256(), 0, b""
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 24), b""):
      digest.update(block)
      # "\r"s that are not the first half of a "\r\n" (one may span two blocks)
      ends += (block.count(b"\r") - block.count(b"\r\n")
               - (last == b"\r" and block.startswith(b"\n")))
      last = block[-1:]
  value = "sha256:" + digest.hexdigest()
  try:
    paths.write_atomic(memo, json.dumps({"stamp": stamp, "digest": value, "lone_cr": ends > 0}))
  except OSError:
    pass  # only a memo: an unwritable cache costs this read again at the next start
  return value + (";lone-cr" if text and ends > 0 else "")


def source_files(data_config) -> tuple[str, list[str]]:
  """(kind, sorted files) of a file corpus (corpora.corpus_files); refuses a glob matching
  nothing."""
  return corpora.corpus_files(data_config.corpus, data_config.embedded_cache_dir)


def _source_key(data_config, process_count: int) -> dict:
  """What the corpus is, by content."""
  if data_config.corpus.startswith("tfds:"):
    # Deferred: only tfds corpora need tfds (and TensorFlow).
    from data_pipeline.store import corpus_units  # pylint: disable=g-import-not-at-top
    return corpus_units.tfds_source_key(data_config, process_count)
  kind, files = source_files(data_config)
  return {"kind": kind, "files": [[os.path.basename(f), paths.size(f), file_digest(
      f, text=kind != "parquet" and not corpora.is_compressed(f))] for f in files]}


def store_key(data_config, vocab_file: str, spm_model_file: str, process_count: int) -> dict:
  """Everything a store's shards depend on (see the module docstring)."""
  vocab = spm_model_file or vocab_file
  return {"format": FORMAT_VERSION, "source": _source_key(data_config, process_count),
          "tokenizer": {"kind": "sentencepiece" if spm_model_file else "wordpiece",
                        "sha256": hashlib.sha256(paths.read_bytes(vocab)).hexdigest(),
                        "do_lower_case": data_config.do_lower_case},
          "options": _flat_options(data_config)}


def key_digest(key: dict) -> str:
  """The store's directory name: 20 hex digits of the key's SHA-256."""
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def store_dir(data_config, key: dict) -> str:
  """Where the store of `key` lives."""
  return paths.join(store_root(data_config), key_digest(key))


def write_file(path: str, data: str | bytes, directory: str) -> None:
  """paths.write_atomic of a file of the store `directory`. A write its storage refuses (a
  full disk, a read-only or unwritable store root) is refused as one line (ValueError)
  naming the file, the root and what to do, not a traceback: the store root is the
  user's choice (data.tokenized_dir, or $BERT_JAX_CACHE), so this is their input."""
  try:
    paths.write_atomic(path, data)
  except OSError as e:
    root = os.path.dirname(directory.rstrip("/"))
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
      fix = f"free space on {root}"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
      fix = f"fix the permissions of {root}"
    else:
      fix = f"make {root} a writable directory"
    raise ValueError(
        f"cannot write the tokenized store: {path}: {e.strerror or e}; {fix}, or choose "
        "another store root with --config.data.tokenized_dir=DIR (or BERT_JAX_CACHE=DIR, "
        "whose tokenized/ is the default root)") from e


def shard_name(unit_index: int) -> str:
  """A unit's shard file, relative to its store."""
  return f"{SHARDS}/{unit_index:05d}.tok"


# ---------------------------------------------------------------------- shards


def _aligned(n: int) -> int:
  return -(-n // _ALIGN) * _ALIGN


def encode_shard(key_hex: str, unit: dict, arrays: dict[str, np.ndarray], info: dict) -> bytes:
  """A shard's bytes: magic, header length, JSON header (key, unit, info, each array's
  dtype, length, offset and CRC-32), then the arrays, each at a 64-byte boundary, the
  token ids last (a remote reader gets all the rest in one request)."""
  table, offset, blobs = {}, 0, []
  for name in sorted(arrays, key=lambda n: (n == "ids", n)):
    raw = np.ascontiguousarray(arrays[name]).tobytes()
    table[name] = {"dtype": arrays[name].dtype.str, "length": len(arrays[name]),
                   "offset": offset, "crc32": zlib.crc32(raw)}
    blobs.append(raw + b"\0" * (_aligned(len(raw)) - len(raw)))
    offset += _aligned(len(raw))
  header = json.dumps({"format": FORMAT_VERSION, "key": key_hex, "unit": unit, "info": info,
                       "arrays": table, "data_bytes": offset}, sort_keys=True).encode()
  start = _aligned(len(_MAGIC) + 8 + len(header))
  prefix = _MAGIC + len(header).to_bytes(8, "little") + header
  return prefix + b"\0" * (start - len(prefix)) + b"".join(blobs)


class Shard:
  """One shard, its header read and checked (ShardError names it otherwise); arrays on
  demand, each CRC-checked: memory-mapped when local (nothing is kept mapped), read by
  range when remote (all but the ids at once, here)."""

  def __init__(self, path: str, key_hex: str, unit_index: int):
    self.path, self.remote = path, paths.is_remote(path)
    try:
      with paths.open_binary(path) as f:
        head = f.read(1 << 16 if self.remote else len(_MAGIC) + 8)
        if len(head) < len(_MAGIC) + 8 or head[:len(_MAGIC)] != _MAGIC:
          raise ShardError(f"{path}: not a tokenized-store shard (no header)")
        length = int.from_bytes(head[len(_MAGIC):len(_MAGIC) + 8], "little")
        head = head[len(_MAGIC) + 8:]
        if len(head) < length:
          head += f.read(length - len(head))
        self.header = json.loads(head[:length])
        self.data_start = _aligned(len(_MAGIC) + 8 + length)
        self._small = b""
        if self.remote:  # every array before the ids, in one request
          f.seek(self.data_start)
          self._small = f.read(self.header["arrays"].get("ids", {}).get("offset", 0))
    except FileNotFoundError:
      raise ShardError(f"{path}: missing") from None
    except ShardError:
      raise
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as e:
      raise ShardError(f"{path}: unreadable header ({e!r})") from None
    if self.header.get("format") != FORMAT_VERSION or self.header.get("key") != key_hex:
      raise ShardError(f"{path}: belongs to another store (key {self.header.get('key')!r}, "
                       f"format {self.header.get('format')!r}, not {key_hex!r})")
    if self.header["unit"]["index"] != unit_index:
      raise ShardError(f"{path}: holds unit {self.header['unit']['index']}, not {unit_index}")
    self.size = self.data_start + self.header["data_bytes"]
    actual = paths.size(path)
    if actual != self.size:
      raise ShardError(f"{path}: {actual} bytes where its header says {self.size} "
                       "(truncated or overwritten)")

  @property
  def info(self) -> dict:
    """What the unit's preparation recorded (counts, CorpusStats, the byte range read)."""
    return self.header["info"]

  def array(self, name: str) -> np.ndarray:
    """One array, checked against its CRC-32 (locally a view of a read-only memory map,
    unmapped once the caller lets it go)."""
    spec = self.header["arrays"][name]
    dtype, length = np.dtype(spec["dtype"]), spec["length"]
    if not length:
      return np.zeros([0], dtype)
    nbytes = length * dtype.itemsize
    if not self.remote:
      data = np.memmap(os.fspath(paths.path(self.path)), dtype, "r",
                       self.data_start + spec["offset"], (length,))
    elif name != "ids":
      data = np.frombuffer(self._small, dtype, length, spec["offset"])
    else:
      with paths.open_binary(self.path) as f:
        f.seek(self.data_start + spec["offset"])
        raw = f.read(nbytes)
      if len(raw) != nbytes:
        raise ShardError(f"{self.path}: array {name!r} is cut short (truncated)")
      data = np.frombuffer(raw, dtype)
    if zlib.crc32(memoryview(data).cast("B")) != spec["crc32"]:
      raise ShardError(f"{self.path}: array {name!r} does not match its checksum (damaged)")
    return data


# ------------------------------------------------------------------ the manifest


def write_manifest(directory: str, key: dict, files: list[dict], units: list[dict],
                   **fields) -> dict:
  """Writes manifest.json (deterministic bytes: no time, no host); returns it."""
  manifest = {"format": FORMAT_VERSION, "key": key_digest(key), "files": files, "units": units,
              "tokens": sum(u["tokens"] for u in units),
              "shard_bytes": sum(u["bytes"] for u in units), **fields}
  write_file(paths.join(directory, MANIFEST),
             json.dumps(manifest, sort_keys=True, indent=1) + "\n", directory)
  return manifest


def read_manifest(directory: str) -> dict | None:
  """The store's manifest, or None while it is not complete (or is of another format)."""
  path = paths.join(directory, MANIFEST)
  if not paths.exists(path):
    return None
  try:
    manifest = json.loads(paths.read_text(path))
  except (json.JSONDecodeError, UnicodeDecodeError) as e:  # cut or overwritten by hand
    raise ValueError(f"{path} is damaged ({e}): delete it (the shards beside it are checked "
                     "and kept) and run again, which writes it anew") from None
  return manifest if manifest.get("format") == FORMAT_VERSION else None


# ------------------------------------------------------------------- selection


@dataclasses.dataclass
class Selection:
  """A TokenizedCorpus selected from a store, and what tokenized_corpus's checks need."""
  corpus: tokenized_corpus.TokenizedCorpus
  segmented_sentences: int  # of its sentences (before empties were dropped), gold-segmented
  pieces: int  # documents selected, empty ones included (what max_documents counts)


def _in_order(fn, items, window: int):
  """fn(item) for each item, in order, with up to `window` running at once (threads: the
  work is I/O and numpy, both outside the GIL)."""
  with futures.ThreadPoolExecutor(max(window, 1)) as pool:
    pending = collections.deque()
    for item in items:
      pending.append(pool.submit(fn, item))
      if len(pending) >= window:
        yield pending.popleft().result()
    while pending:
      yield pending.popleft().result()


class TokenStore:
  """A complete store: its manifest, and selections from its shards (see module docstring)."""

  def __init__(self, directory: str, manifest: dict, data_config, files: list[str]):
    self.directory, self.manifest, self.files = directory, manifest, files
    self.units = manifest["units"]
    self.num_files = len(manifest["files"])
    self.tfds_processes = manifest["tfds_processes"]  # 0, else the processes it is split for
    self.segmentation = data_config.masking.word_segmentation
    self.max_undecodable_fraction = data_config.max_undecodable_fraction
    self.max_line_bytes = data_config.max_line_bytes
    starts = np.cumsum([0] + [u["source_documents"] for u in self.units])
    self.raw_offsets = starts[:-1]  # each unit's first source document in the corpus stream

  def check_files(self) -> None:
    """corpora.check_decodable and corpora.warn_overlong on every file's counts (named by
    this run's paths): the in-memory path's refusal and warning, at every start, at this
    run's max_undecodable_fraction. (A manifest from before the counts of over-long lines
    has none: 0.)"""
    for path, f in zip(self.files, self.manifest["files"]):
      corpora.check_decodable(path, f["lines"], f["undecodable_lines"],
                              self.max_undecodable_fraction)
      corpora.warn_overlong(path, f.get("overlong_lines", 0), self.max_line_bytes)

  def skipped(self) -> str:
    """What the corpus report adds: ", N Parquet rows with a null text skipped", or ""."""
    nulls = sum(f.get("null_texts", 0) for f in self.manifest["files"])
    return f", {nulls:,} Parquet rows with a null text skipped" if nulls else ""

  def shard(self, index: int) -> Shard:
    """Unit `index`'s shard, its header checked."""
    return Shard(paths.join(self.directory, shard_name(index)), self.manifest["key"], index)

  def _needed(self, process_index: int, process_count: int) -> list[dict]:
    """The units holding any of a process's documents, in corpus order (corpora.py: whole
    files round-robin when there are at least as many files as processes, else documents;
    a tfds store: the process's own even split)."""
    if self.tfds_processes and process_count > 1:
      if process_count != self.tfds_processes:
        raise ValueError(f"the tfds store {self.directory} is split for "
                         f"{self.tfds_processes} processes, not {process_count}")
      return [u for u in self.units if u["part"][0] == process_index]
    if self.tfds_processes or self.num_files < process_count:
      return self.units
    return [u for u in self.units if u["file"] % process_count == process_index]

  def select(self, split: str, process_index: int, process_count: int, max_documents: int,
             heldout_modulus: int, parallel_reads: int = 16) -> Selection:
    """The TokenizedCorpus read_tokenized_corpus gives for these arguments (split "train",
    "eval" or "all"; max_documents 0: all)."""
    by_document = not self.tfds_processes and self.num_files < process_count
    window = parallel_reads if paths.is_remote(self.directory) else 1
    parts, taken, segmented = [], 0, 0
    for shard in _in_order(lambda u: self.shard(u["index"]),
                           self._needed(process_index, process_count), window):
      if max_documents and taken >= max_documents:
        break
      held = shard.array("piece_hash") % np.uint64(heldout_modulus) == 0
      chosen = held if split == "eval" else ~held if split == "train" else np.ones_like(held)
      if by_document:
        raw = self.raw_offsets[shard.header["unit"]["index"]] + shard.array("piece_source")
        chosen &= raw % process_count == process_index
      if max_documents:
        chosen &= np.cumsum(chosen) <= max_documents - taken
      if not chosen.any():
        continue
      taken += int(chosen.sum())
      segmented += int(shard.array("piece_segmented")[chosen].sum())
      counts = np.asarray(shard.array("piece_sentences"), np.int64)
      keep = chosen & (counts > 0)  # documents that tokenized to nothing are dropped
      sentence_keep = np.repeat(keep, counts)
      parts.append((shard, sentence_keep, shard.array("sentence_lengths")[sentence_keep],
                    counts[keep]))
    # Made once at their final size and filled part by part: no second copy of the corpus.
    sentence_starts = np.zeros([sum(len(p[2]) for p in parts) + 1], np.int64)
    position = 0
    for _, _, lengths, _ in parts:
      span = sentence_starts[position + 1:position + 1 + len(lengths)]
      np.cumsum(lengths, dtype=np.int64, out=span)
      span += sentence_starts[position]
      position += len(lengths)
    ids = np.empty([sentence_starts[-1]], np.dtype(self.manifest["dtype"]))

    def part_ids(part):
      shard, sentence_keep, _, _ = part
      return shard.array("ids")[np.repeat(sentence_keep, shard.array("sentence_lengths"))]

    position = 0
    for chunk in _in_order(part_ids, parts, window):  # pass 2: the tokens, one shard at a time
      ids[position:position + len(chunk)] = chunk
      position += len(chunk)
    documents = np.concatenate([p[3] for p in parts]) if parts else np.zeros([0], np.int64)
    corpus = tokenized_corpus.TokenizedCorpus(
        ids=ids, sentence_starts=sentence_starts,
        document_starts=np.concatenate([[0], np.cumsum(documents)]).astype(np.int64),
        word_starts=bool(self.segmentation))
    return Selection(corpus, segmented, taken)


def open_store(data_config, key: dict, files: list[str]) -> TokenStore | None:
  """The complete store of `key` (of the corpus `files`), or None when it is not (yet)
  complete."""
  directory = store_dir(data_config, key)
  manifest = read_manifest(directory)
  if manifest is None or manifest["key"] != key_digest(key):
    return None
  return TokenStore(directory, manifest, data_config, files)


def describe(data_config, vocab_file: str, spm_model_file: str, process_count: int = 1) -> str:
  """One line on the store a config would read: where, and whether it is complete (its
  tokens and size) or not yet made. Reads no corpus text (the launcher asks before a
  slice exists)."""
  if data_config.tokenized_dir == NONE:
    return "no tokenized store (data.tokenized_dir='none'): every start tokenizes the corpus"
  key = store_key(data_config, vocab_file, spm_model_file, process_count)
  directory = store_dir(data_config, key)
  manifest = read_manifest(directory)
  if manifest is None:
    return (f"tokenized store {directory}: not prepared yet; the first start tokenizes the "
            "corpus into it (or run python -m data_pipeline.store.prepare_corpus with this config "
            "first, on any CPU machine)")
  return (f"tokenized store {directory}: prepared ({manifest['tokens']:,} tokens, "
          f"{manifest['shard_bytes'] / 2**20:,.1f} MiB in {len(manifest['units'])} shards)")


def describe_for_slice(data_config, process_count: int) -> str:
  """describe() as seen from a machine that is not one of the run's hosts (the launcher):
  a store on the hosts' own disks, or a corpus or vocabulary on them, cannot be looked
  at from here."""
  if data_config.tokenized_dir != NONE and not paths.is_remote(store_root(data_config)):
    where = data_config.tokenized_dir or "$BERT_JAX_CACHE/tokenized"
    return (f"tokenized store: on each host's own disk ({where}), not visible from here; "
            "each host's first start "
            "tokenizes the whole corpus into it (a gs:// data.tokenized_dir is shared: "
            "prepared once, each host its share, or beforehand with "
            "python -m data_pipeline.store.prepare_corpus)")
  vocab_file, spm_model_file = data_config.vocab_file, data_config.spm_model_file
  if not (vocab_file or spm_model_file):
    return ("tokenized store: cannot be checked from here (the embedded corpus's vocabulary "
            "is made on the first start)")
  try:
    return describe(data_config, vocab_file, spm_model_file, process_count)
  except (ValueError, OSError) as e:  # a corpus or vocab only the hosts can read
    return f"tokenized store: cannot be checked from here ({e})"


if __name__ == "__main__":
  # python -m data_pipeline.store.token_store --config=FILE[:ARG] [--config.X=V] --process_count=N
  # prints describe_for_slice's line (the launcher runs it before it creates a slice).
  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", None, "experiment or data config file[:arg]")
  flags.DEFINE_integer("process_count", 1, "the run's processes (hosts)")
  app.run(lambda argv: print(describe_for_slice(
      flags.FLAGS.config.data if "data" in flags.FLAGS.config else flags.FLAGS.config,
      flags.FLAGS.process_count)))
