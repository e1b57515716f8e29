"""TensorFlow for the input pipeline only: imported here, kept off GPUs and TPUs, quiet.

Every module of this project that uses TensorFlow takes it from here
(`from host.tf_cpu import tf`). tf.data and tensorflow-text run on the
host; left alone, TensorFlow would claim every GPU's memory at start (and probe
TPUs) before JAX gets them. Hiding the accelerators from it must happen before
TensorFlow first touches its devices, hence one module that imports it first.
"""

import contextlib
import os
import sys
import tempfile

# TensorFlow's C++ logging: 2 keeps errors only. A user's own setting wins (0 shows all,
# and also the start-up lines _quiet_start_up would hold back).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def _quiet_start_up():
  """Holds back what TensorFlow's C++ side writes to stderr while it starts.

  Those lines ("Could not find cuda drivers", "failed call to cuInit" on a machine
  without GPUs, CPU-feature notices) are written before its logging reads
  TF_CPP_MIN_LOG_LEVEL, so only redirecting the file descriptor keeps them off
  the terminal. If the start fails, they are written out after all.
  """
  if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") < "1":
    yield
    return
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    failed = True
    try:
      yield
      failed = False
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      if failed:
        held.seek(0)
        sys.stderr.write(held.read().decode("utf-8", "replace"))


with _quiet_start_up():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position


def hide_accelerators() -> list[str]:
  """Makes TensorFlow see no GPU or TPU; returns the device types it had to hide.

  A no-op once TensorFlow has initialised its devices (it then raises, which is
  caught): whoever initialised them first decided, and on a CPU-only machine there
  is nothing to hide.
  """
  hidden = []
  for kind in ("GPU", "TPU"):
    try:
      if tf.config.list_physical_devices(kind):
        tf.config.set_visible_devices([], kind)
        hidden.append(kind)
    except (RuntimeError, ValueError):
      pass
  return hidden


with _quiet_start_up():
  hide_accelerators()
