"""A preflight compile child that crashes for real for one setting: for tests only.

tests/test_preflight_isolation.py points bert_jax.preflight.isolation.CHILD_COMMAND at
this file and sets PREFLIGHT_TEST_CRASH_ON to a JSON object of config fields
({"model.remat_policy": "none"}). Asked to compile a config whose fields all have
those values, this child kills itself with SIGSEGV as compile_phase starts, as
libtpu 0.0.42.1 killed the preflight compiling BERT-Large at fsdp + dots_saveable
for v6e-8; any other config is compiled by the real bert_jax.preflight.child.
"""

import functools
import json
import os
import signal
import sys

from bert_jax.preflight import child as preflight_child
from bert_jax.preflight import compile as preflight_compile


def _crashing(compile_phase):
  """compile_phase, except that it dies by SIGSEGV for a config PREFLIGHT_TEST_CRASH_ON names."""
  crash_on = json.loads(os.environ["PREFLIGHT_TEST_CRASH_ON"])

  @functools.wraps(compile_phase)
  def compile_or_crash(config, *args, **kwargs):
    if all(functools.reduce(getattr, field.split("."), config) == value
           for field, value in crash_on.items()):
      os.kill(os.getpid(), signal.SIGSEGV)
    return compile_phase(config, *args, **kwargs)
  return compile_or_crash


if __name__ == "__main__":
  preflight_compile.compile_phase = _crashing(preflight_compile.compile_phase)
  sys.exit(preflight_child.main(sys.argv))
