"""Preflight's compiles, each in a child process, so that a crash of libtpu ends the child only.

libtpu can die with the process that compiles, with no exception reaching
Python: 0.0.42.1 does (SIGSEGV, a stack overflow in its convolution emitter)
compiling BERT-Large with fsdp + dots_saveable for a v6e-8. In one process that
killed the preflight, its knob search and the launcher's check without a word.
So bert_jax.preflight.compile.measure compiles in a child (`python -m
bert_jax.preflight.child`), one child per call (one knob setting's phases). The
child sends each phase's Measurement back as soon as it is compiled; a child
that dies (by a signal, or exiting without a result) leaves the phase it was
compiling reported as a `Crash`, and the phases after it are compiled in a
fresh child.

Cost per child: it imports JAX, flax and optax again and asks libtpu for the
topology (not TensorFlow: the parent runs the trainer's config checks, see
bert_jax.preflight.compile.check_for_slice): about 4 s per call, measured as the
wall time beyond the compile itself on the project's 2 cores at load 5 (tiny
model, v4-8), against the minutes a BERT-Base or -Large compile takes.
bert_jax.preflight.compile.measure(..., isolate=False) compiles in process
instead (for tests; a crash then ends the caller).

The child is told what to compile on its stdin (a pickle of the config, the
Target and the phases) and answers through an inherited pipe, one pickle
("measurement" | "refused" | "error", value) per record; its own stdout and
stderr (JAX's and libtpu's chatter, a crash's stack dump) go to a temporary
file whose last lines come with a Crash.
"""

import dataclasses
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from typing import Any, Iterator, Sequence

import ml_collections

from bert_jax.preflight.targets import PreflightError, Target

# The child's command; tests/test_preflight_isolation.py points it at a child that
# crashes for a chosen setting.
CHILD_COMMAND = (sys.executable, "-m", "bert_jax.preflight.child")
# Where bert_jax is imported from, put first on the child's path: the child must
# compile this source tree's step whatever its working directory.
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LOG_TAIL_LINES = 5
# libtpu's crash handler's own chatter after the crash (core dump hooks): not the cause.
_CRASH_HANDLER = re.compile(r"coredump_hook|Coroner|process_state\.cc")


@dataclasses.dataclass
class Crash:
  """A phase whose compiling child died before it sent a result."""
  phase: dict[str, Any]      # bert_jax.pretrain.phases.shapes' entry
  how: str                   # "signal 11, SIGSEGV" or "exit status 3"
  log_tail: str              # the child's last lines of output (libtpu's stack dump, often)


def how_it_ended(returncode: int) -> str:
  """'signal 11, SIGSEGV' for a child killed by a signal, else 'exit status N'."""
  if returncode < 0:
    try:
      name = signal.Signals(-returncode).name
    except ValueError:
      return f"signal {-returncode}"
    return f"signal {-returncode}, {name}"
  return f"exit status {returncode}"


def compile_phases(config: ml_collections.ConfigDict, tpu: Target,
                   phases: Sequence[dict[str, Any]]) -> Iterator[Any]:
  """bert_jax.preflight.compile.compile_phase of each phase, in children; yields each result in order.

  A result is the phase's Measurement, or a Crash where the child died compiling it.

  Raises:
    PreflightError: the child's refusal (the trainer's check_config, libtpu missing).
    RuntimeError: a Python exception in the child (a bug: its traceback is the message).
  """
  remaining = list(phases)
  while remaining:
    done = 0
    crash = None
    for result in _one_child(config, tpu, remaining):
      if isinstance(result, Crash):
        crash = result
      else:
        done += 1
      yield result
    # A crash took the phase after the ones done; the rest get a fresh child.
    remaining = remaining[done + (1 if crash else 0):]
    if not crash:
      assert not remaining, "a child ended cleanly without every phase"


def _one_child(config: ml_collections.ConfigDict, tpu: Target,
               phases: list[dict[str, Any]]) -> Iterator[Any]:
  """One child compiling `phases` in order: their Measurements, then a Crash if it died early."""
  request = pickle.dumps({"config": config, "tpu": tpu, "phases": phases})
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_SOURCE_ROOT, env.get("PYTHONPATH")) if p)
  read_fd, write_fd = os.pipe()
  with tempfile.TemporaryFile() as log:
    try:
      child = subprocess.Popen([*CHILD_COMMAND, str(write_fd)], stdin=subprocess.PIPE,
                               stdout=log, stderr=subprocess.STDOUT, pass_fds=(write_fd,),
                               env=env)
    finally:
      os.close(write_fd)  # the child holds its copy: EOF here once it ends
    try:
      with os.fdopen(read_fd, "rb") as results:
        try:
          child.stdin.write(request)
          child.stdin.close()
        except BrokenPipeError:  # it died before reading: reported below
          pass
        got = 0
        while True:
          try:
            kind, value = pickle.load(results)
          except (EOFError, pickle.UnpicklingError):  # ended (a record cut short by a crash too)
            break
          if kind == "refused":
            raise PreflightError(value)
          if kind == "error":
            raise RuntimeError(f"preflight's compile child failed:\n{value}")
          got += 1
          yield value
      returncode = child.wait()
    finally:
      if child.poll() is None:  # the caller stopped early, or was interrupted
        child.kill()
        child.wait()
    if got < len(phases):
      log.seek(0)
      lines = [l for l in log.read().decode("utf-8", "replace").splitlines()
               if l.strip() and not _CRASH_HANDLER.search(l)]
      yield Crash(phases[got], how_it_ended(returncode), "\n".join(lines[-_LOG_TAIL_LINES:]))
