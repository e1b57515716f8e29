"""Ports for the tests' jax.distributed coordinators, never handed to two tests of one run.

A free port is found by binding port 0 and closing the socket, so two tests that ask at
about the same time (one per pytest-xdist worker) can both be told the same port. Their
coordinators then both start on it: gRPC binds with SO_REUSEPORT, so neither fails,
and the kernel would spread the four processes' connections over the two services. Each
port given out is therefore claimed by a file created with O_EXCL in a directory that
every worker of the run shares (named by xdist's run id), so no other test of the run
gets it while it may be in use.
"""

import atexit
import os
import shutil
import socket
import tempfile

_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getppid())
CLAIMS = os.path.join(tempfile.gettempdir(), f"bert_jax_test_ports_{_RUN}")
# The claims only keep apart the ports of tests that run at once, so the first worker to end
# may remove them (a later claim makes the directory again, and goes at that worker's end).
atexit.register(shutil.rmtree, CLAIMS, ignore_errors=True)


def claim(port: int) -> bool:
  """True when this test now owns `port` for the run (nobody had claimed it)."""
  os.makedirs(CLAIMS, exist_ok=True)
  try:
    os.close(os.open(os.path.join(CLAIMS, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
  except FileExistsError:
    return False
  return True


def bindable(port: int) -> bool:
  """Whether nothing on this machine holds `port` now."""
  with socket.socket() as s:
    try:
      s.bind(("localhost", port))
    except OSError:
      return False
  return True


def free_port() -> int:
  """A port nothing holds now and no other test of this run was given."""
  for _ in range(1000):
    with socket.socket() as s:
      s.bind(("localhost", 0))
      port = s.getsockname()[1]
    if claim(port):
      return port
  raise RuntimeError(f"no unclaimed free port after 1000 tries ({CLAIMS})")
