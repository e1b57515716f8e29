"""Tests of host/libtpu_flags.py: libtpu's compiler flags, added once, the user's winning."""

import os
import subprocess
import sys

from host import libtpu_flags

FLAG = "fibers_default_thread_stack_size"


def test_flags_are_added_and_a_users_own_setting_wins():
  """Fails if a flag is not added, added twice, drops a user's other flags, or overrides
  the user's own value of it."""
  env = {}
  libtpu_flags.apply(env)
  assert env["LIBTPU_INIT_ARGS"] == f"--{FLAG}={256 << 20}"
  libtpu_flags.apply(env)  # idempotent: a second import of the package adds nothing
  assert env["LIBTPU_INIT_ARGS"].count(FLAG) == 1

  env = {"LIBTPU_INIT_ARGS": "--xla_tpu_scoped_vmem_limit_kib=8192"}
  libtpu_flags.apply(env)
  assert env["LIBTPU_INIT_ARGS"].split() == ["--xla_tpu_scoped_vmem_limit_kib=8192",
                                             f"--{FLAG}={256 << 20}"]

  for own in (f"--{FLAG}=1048576", f"-{FLAG}=1048576", f"{FLAG}=1048576"):
    env = {"LIBTPU_INIT_ARGS": own}
    libtpu_flags.apply(env)
    assert env["LIBTPU_INIT_ARGS"] == own

  # Off (for a libtpu that would refuse the flag): nothing added, the user's args kept.
  for env in ({"BERT_JAX_LIBTPU_FLAGS": "off"},
              {"BERT_JAX_LIBTPU_FLAGS": "OFF", "LIBTPU_INIT_ARGS": "--a=1"}):
    before = dict(env)
    libtpu_flags.apply(env)
    assert env == before


def test_every_process_that_imports_bert_jax_has_the_flags():
  """Fails if bert_jax's package init stops applying the flags: an entry point (a run on a
  TPU VM, the preflight's compile child) would then start libtpu without them."""
  env = {k: v for k, v in os.environ.items() if k != "LIBTPU_INIT_ARGS"}
  code = "import os, bert_jax.errors; print(os.environ.get('LIBTPU_INIT_ARGS', ''))"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout
  assert f"--{FLAG}={256 << 20}" in out.split()
