"""The one path layer: every file the project reads or writes, on local disks and gs:// alike.

Workdirs, checkpoints, metrics, TensorBoard events, config and vocab files,
corpora globs, init checkpoints, fine-tuning data, conversion inputs and
outputs all go through here (or through orbax, which uses the same etils.epath
underneath). Nothing else in the project calls open(), os.path or pathlib on
a path a user gives.

Remote paths (gs://, s3://) are served by fsspec (gcsfs for gs://): epath
otherwise prefers TensorFlow's own GCS client whenever TensorFlow is
installed, and that client can only talk to storage.googleapis.com, so it
could never be tested against an emulator (gcsfs honours
STORAGE_EMULATOR_HOST; orbax's array data goes through tensorstore, which
honours TENSORSTORE_GCS_HTTP_URL). On a TPU VM both find the VM's
credentials the usual way (Application Default Credentials).

Semantics users rely on:
  * write_atomic: a reader (or a resumed run) sees the old content or the new,
    never half a file -- a local temp file renamed over the target, or one GCS
    object upload (GCS objects appear whole or not at all).
  * local_file: libraries that insist on a local file name (TF checkpoint
    readers) get a downloaded temporary copy of a remote file.
  * read_versioned / create_if_absent / replace_if / remove_if: compare-and-swap
    on a small file (GCS generation preconditions; an fcntl-guarded content
    compare locally), so of several hosts racing to change it exactly one does
    (the workdir lock, bert_jax.run.lock).
"""

import contextlib
import fcntl
import hashlib
import io
import json
import os
import shutil
import socket
import tempfile
from typing import IO, Iterator

# Before etils decides on a backend (it caches the decision on first use): fsspec for gs://.
os.environ.setdefault("EPATH_USE_TF", "false")

from etils import epath  # pylint: disable=g-import-not-at-top,wrong-import-position
from etils.epath import backend as epath_backend  # pylint: disable=g-import-not-at-top,wrong-import-position

if os.environ.get("STORAGE_EMULATOR_HOST"):
  # Against an emulator there are no credentials, and gcsfs warns on every call
  # that it cannot look up the bucket's type; that means nothing there.
  import logging  # pylint: disable=g-import-not-at-top
  logging.getLogger("gcsfs").setLevel(logging.ERROR)

Path = epath.Path
REMOTE_PREFIXES = ("gs://", "s3://")


def is_remote(path: "str | os.PathLike") -> bool:
  """Whether `path` names object storage rather than a local file system."""
  return os.fspath(path).startswith(REMOTE_PREFIXES)


def _remote_fs(p: "str | os.PathLike"):
  """The fsspec file system epath itself uses for a remote path (one instance, one cache)."""
  return epath_backend.fsspec_backend.fs(os.fspath(p))


def _fresh(p: "str | os.PathLike") -> None:
  # gcsfs caches listings forever by default; files another process (or host)
  # writes -- a lock, a record, a checkpoint -- must be seen as they are now.
  if is_remote(p):
    _remote_fs(p).invalidate_cache(os.fspath(p))


def path(p: "str | os.PathLike") -> epath.Path:
  """An epath.Path for `p`; local paths are made absolute (and ~ expanded) once, here."""
  p = os.fspath(p)
  if is_remote(p):
    return epath.Path(p)
  return epath.Path(os.path.abspath(os.path.expanduser(p)))


def join(base: "str | os.PathLike", *parts: str) -> str:
  """`base`/parts as a string (keeps the gs:// form, which orbax and tf.data want as str)."""
  return os.fspath(path(base).joinpath(*parts))


def exists(p: "str | os.PathLike") -> bool:
  """Whether the file or directory exists."""
  _fresh(p)
  return path(p).exists()


def is_dir(p: "str | os.PathLike") -> bool:
  """Whether `p` is a directory (a prefix with objects under it, on GCS)."""
  return path(p).is_dir()


def size(p: "str | os.PathLike") -> int:
  """Size of a file in bytes."""
  _fresh(p)
  return path(p).stat().length


def remote_checksum(p: "str | os.PathLike") -> str:
  """The content checksum object storage keeps for a remote file (GCS's crc32c, else its
  MD5 or ETag), from its metadata: what the file holds, without reading it."""
  _fresh(p)
  info = _remote_fs(p).info(os.fspath(p))
  for field in ("crc32c", "md5Hash", "ETag", "etag"):
    if info.get(field):
      return f"{field}:{info[field]}"
  raise ValueError(f"{p}: the object store gives no checksum of it (fields: {sorted(info)})")


def makedirs(p: "str | os.PathLike") -> None:
  """Creates `p` and its parents (on GCS there is nothing to create; this is a no-op there)."""
  path(p).mkdir(parents=True, exist_ok=True)


def read_bytes(p: "str | os.PathLike") -> bytes:
  """The whole file, as one version of it even while another process replaces it."""
  if is_remote(p):
    # One GET of the whole object: opening it as a file would look up its size first
    # and then read ranges, so an object replaced in between comes back cut at the old
    # size (half a JSON document) or mixed.
    _fresh(p)
    return _remote_fs(p).cat_file(os.fspath(p))
  return path(p).read_bytes()


def read_text(p: "str | os.PathLike", encoding: str = "utf-8") -> str:
  """The whole file, decoded."""
  return read_bytes(p).decode(encoding)


def write_atomic(p: "str | os.PathLike", data: "str | bytes") -> None:
  """Writes the whole file so that readers see the old content or the new, never half."""
  data = data.encode("utf-8") if isinstance(data, str) else data
  target = path(p)
  if is_remote(p):
    target.write_bytes(data)  # one object upload: whole or nothing
    return
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = target.parent / f".{target.name}.tmp-{socket.gethostname()}-{os.getpid()}"
  try:
    tmp.write_bytes(data)
    os.replace(tmp, target)
  finally:
    if tmp.exists():
      tmp.unlink()


def create_exclusive(p: "str | os.PathLike", data: "str | bytes") -> bool:
  """Creates the file with `data` only if it does not exist; False when it already does.

  Atomic on both backends (O_CREAT|O_EXCL locally, an ifGenerationMatch=0
  upload on GCS), so of several processes racing for it exactly one wins.
  """
  data = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(p):
    try:
      _remote_fs(p).pipe(os.fspath(p), data, mode="create")
    except FileExistsError:
      return False
    return True
  target = os.fspath(path(p))
  os.makedirs(os.path.dirname(target), exist_ok=True)
  try:
    fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  return True


# ------------------------------------------------------- conditional writes
# A small file several processes (or hosts) race to change -- the workdir lock --
# needs compare-and-swap: "replace it, but only if it is still what I read". On
# GCS that is the object's generation with ifGenerationMatch preconditions (the
# server checks and writes in one step). A local disk (or NFS) has no
# generations, so there every read and conditional write of the file runs under
# an exclusive fcntl.flock of a sibling "<file>.guard" (never deleted, so every
# process locks the same inode), the generation is the SHA-256 of the content
# (callers whose every write differs -- the lock writes a token and a time --
# see every change), and the write itself is a temporary file renamed (or
# hard-linked, for a create) into place, so even a reader that takes no guard
# never sees half a file.


def _gcs_fs_and_object(p: "str | os.PathLike"):
  """(gcsfs file system, bucket, object name) of a gs:// path."""
  fs = _remote_fs(p)
  bucket, key, _ = fs.split_path(os.fspath(p))
  return fs, bucket, key


def _gcs_upload(p: "str | os.PathLike", data: bytes, if_generation_match: str) -> str | None:
  """One multipart upload with an ifGenerationMatch precondition ("0": only if absent);
  the new generation, or None when the precondition failed (HTTP 412)."""
  fs, bucket, key = _gcs_fs_and_object(p)
  # gcsfs's own upload knows only "create" (ifGenerationMatch=0); this is the same
  # request with any generation.
  body = (b"--==0==\nContent-Type: application/json; charset=UTF-8\n\n"
          + json.dumps({"name": key}).encode() + b"\n--==0==\n"
          b"Content-Type: application/octet-stream\n\n" + data + b"\n--==0==--")
  try:
    reply = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{bucket}/o",  # pylint: disable=protected-access
                    uploadType="multipart", data=body, json_out=True,
                    headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                    ifGenerationMatch=if_generation_match)
  except (FileExistsError, FileNotFoundError):  # 412 (gcsfs says "exists"), or no bucket
    return None
  finally:
    _fresh(p)
  return str(reply["generation"])


@contextlib.contextmanager
def _guard(p: str) -> Iterator[None]:
  """Exclusive flock of `p`'s guard file (blocks while another process holds it)."""
  os.makedirs(os.path.dirname(p), exist_ok=True)
  fd = os.open(p + ".guard", os.O_CREAT | os.O_RDWR, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)  # closing releases the flock


def _local_generation(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _local_read(p: str) -> tuple[bytes, str] | None:
  try:
    with open(p, "rb") as f:
      data = f.read()
  except FileNotFoundError:
    return None
  return data, _local_generation(data)


def _local_write(p: str, data: bytes, exclusive: bool) -> bool:
  """Writes a whole file via a temporary one: renamed over `p`, or (exclusive) hard-linked
  to `p`, which fails when `p` exists."""
  tmp = f"{p}.tmp-{socket.gethostname()}-{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(data)
  try:
    if not exclusive:
      os.replace(tmp, p)
      return True
    try:
      os.link(tmp, p)
    except FileExistsError:
      return False
    return True
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def read_versioned(p: "str | os.PathLike") -> tuple[bytes, str] | None:
  """(content, generation) of a small file read in one piece, or None when it is absent.

  The generation changes whenever the file is written (locally: whenever its
  content changes); pass it to replace_if / remove_if.
  """
  if is_remote(p):
    fs, bucket, key = _gcs_fs_and_object(p)
    try:
      headers, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media")
    except FileNotFoundError:
      return None
    generation = headers.get("X-Goog-Generation") or headers.get("x-goog-generation")
    if generation is None:  # not sent: ask for it, then read exactly that generation
      generation = str(fs.call("GET", "b/{}/o/{}", bucket, key, json_out=True)["generation"])
      try:
        _, data = fs.call("GET", "b/{}/o/{}", bucket, key, alt="media", generation=generation)
      except FileNotFoundError:
        return read_versioned(p)  # replaced between the two requests: read the new one
    return bytes(data), str(generation)
  target = os.fspath(path(p))
  with _guard(target):
    return _local_read(target)


def create_if_absent(p: "str | os.PathLike", data: "str | bytes") -> str | None:
  """Creates the file only if it does not exist: its generation, or None when it does.

  Of several processes racing for it exactly one wins (ifGenerationMatch=0 on
  GCS; a hard link under the guard locally), and it appears whole.
  """
  data = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(p):
    return _gcs_upload(p, data, "0")
  target = os.fspath(path(p))
  with _guard(target):
    return _local_generation(data) if _local_write(target, data, exclusive=True) else None


def replace_if(p: "str | os.PathLike", data: "str | bytes", generation: str) -> str | None:
  """Overwrites the file only if its generation is still `generation`: the new
  generation, or None when it changed or is gone.

  On GCS one ifGenerationMatch upload (the server compares and writes at once).
  gcsfs retries a request that failed on the network, so None can also mean a
  retried write whose first try landed: a caller that must know re-reads.
  """
  data = data.encode("utf-8") if isinstance(data, str) else data
  if is_remote(p):
    return _gcs_upload(p, data, str(generation))
  target = os.fspath(path(p))
  with _guard(target):
    current = _local_read(target)
    if current is None or current[1] != generation:
      return None
    _local_write(target, data, exclusive=False)
    return _local_generation(data)


def remove_if(p: "str | os.PathLike", generation: str) -> bool:
  """Deletes the file only if its generation is still `generation`; whether it did.

  On GCS a DELETE with ifGenerationMatch (note: the fake-gcs-server emulator
  the tests use ignores that precondition on deletes; real GCS honours it).
  """
  if is_remote(p):
    fs, bucket, key = _gcs_fs_and_object(p)
    try:
      fs.call("DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=str(generation))
    except (FileExistsError, FileNotFoundError):  # 412: changed meanwhile; 404: gone
      return False
    finally:
      _fresh(p)
    return True
  target = os.fspath(path(p))
  with _guard(target):
    current = _local_read(target)
    if current is None or current[1] != generation:
      return False
    os.unlink(target)
    return True


def remove(p: "str | os.PathLike") -> None:
  """Deletes a file if it exists."""
  target = path(p)
  if target.exists():
    target.unlink()


def open_binary(p: "str | os.PathLike", mode: str = "rb") -> IO[bytes]:
  """A binary file object; reading ones support readline(limit) on every backend."""
  if not is_remote(p):
    return open(os.fspath(path(p)), mode)  # pylint: disable=unspecified-encoding
  f = path(p).open(mode)
  # fsspec files have readinto but a readline without a size limit; the corpus
  # reader bounds its memory with readline(limit), which BufferedReader provides.
  return io.BufferedReader(f, buffer_size=1 << 20) if "r" in mode else f


def open_text(p: "str | os.PathLike", mode: str = "r", encoding: str = "utf-8",
              newline: "str | None" = None) -> IO[str]:
  """A text file object (decoding errors raise; callers name the file and line)."""
  if not is_remote(p):
    return open(os.fspath(path(p)), mode, encoding=encoding, newline=newline)
  return io.TextIOWrapper(open_binary(p, mode.replace("t", "") + "b" if "b" not in mode else mode),
                          encoding=encoding, newline=newline)


def glob(pattern: str) -> list[str]:
  """Sorted files (not directories) matching `pattern` (`*`, `?`, `[...]`, `**`)."""
  pattern = os.path.expanduser(pattern)
  if not is_remote(pattern):
    import glob as globlib  # pylint: disable=g-import-not-at-top
    return sorted(p for p in globlib.glob(os.path.abspath(pattern), recursive=True)
                  if os.path.isfile(p))
  _fresh(pattern.split("*")[0].rsplit("/", 1)[0])
  scheme, rest = pattern.split("://", 1)
  parts = rest.split("/")
  # The literal prefix (bucket and directories without wildcards) is listed; the rest matched.
  fixed = []
  for part in parts:
    if any(c in part for c in "*?["):
      break
    fixed.append(part)
  base = path(f"{scheme}://" + "/".join(fixed))
  if len(fixed) == len(parts):
    return [os.fspath(base)] if base.exists() and not base.is_dir() else []
  relative = "/".join(parts[len(fixed):])
  if "**" in relative:  # epath refuses it on object storage: one listing per directory
    raise ValueError(f"{pattern!r}: '**' is not supported on {scheme}://; use '*' per level")
  return sorted(os.fspath(m) for m in base.glob(relative) if not m.is_dir())


def copy_file(src: "str | os.PathLike", dst: "str | os.PathLike") -> None:
  """Copies one file across backends (local <-> gs://), atomically at the destination."""
  write_atomic(dst, read_bytes(src))


def copy_tree(src: "str | os.PathLike", dst: "str | os.PathLike") -> None:
  """Copies a directory tree across backends (file by file)."""
  # iterdir, not walk: epath's walk drops the gs:// scheme from the roots it yields.
  for child in path(src).iterdir():
    target = path(dst) / child.name
    if child.is_dir():
      copy_tree(child, target)
    else:
      copy_file(child, target)


def rmtree(p: "str | os.PathLike") -> None:
  """Removes a directory tree if it exists."""
  target = path(p)
  if target.exists():
    target.rmtree()


@contextlib.contextmanager
def local_file(p: "str | os.PathLike", companions: tuple[str, ...] = ()) -> Iterator[str]:
  """A local file name for `p`: itself when local, else a downloaded temporary copy.

  `companions` are suffixes of sibling files downloaded alongside (a TF
  checkpoint prefix needs `.index` and its `.data-*` shards); they are matched
  as glob suffixes of `p`'s name.
  """
  if not is_remote(p):
    yield os.fspath(path(p))
    return
  remote = path(p)
  with tempfile.TemporaryDirectory(prefix="bert_jax_remote_") as tmp:
    local = os.path.join(tmp, remote.name)
    names = [remote] if remote.exists() and not remote.is_dir() else []
    for suffix in companions:
      names += [path(m) for m in glob(os.fspath(remote) + suffix)]
    for name in names:
      with open(os.path.join(tmp, name.name), "wb") as out:
        shutil.copyfileobj(name.open("rb"), out)
    yield local


def local_dir(p: "str | os.PathLike"):
  """Context manager: a local directory holding `p`'s files (a downloaded copy when remote)."""
  if not is_remote(p):
    return contextlib.nullcontext(os.fspath(path(p)))
  return _downloaded_dir(p)


@contextlib.contextmanager
def _downloaded_dir(p: "str | os.PathLike") -> Iterator[str]:
  with tempfile.TemporaryDirectory(prefix="bert_jax_remote_") as tmp:
    copy_tree(p, tmp)
    yield tmp
