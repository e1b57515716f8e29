"""The one exception type for "the user's input is wrong", and how the validation code raises it.

A refusal is one line -- what is wrong, where (file, line, field), what to do --
printed once by bert_jax.jobs (exit code 1); a traceback is for bugs, and
`--verbose` (or BERT_JAX_VERBOSE=1) shows it for a refusal too. Code that judges
an input raises UsageError (or a subclass: workdir.WorkdirError,
checkpoint.CheckpointError, NonFiniteLoss). The validation sections of the
trainers (config checks, reading and checking every input before the workdir
is written) run inside `judging_input()`, where the ValueErrors of the
libraries they call (a malformed file, a bad optimizer value, a missing
column) are input judgments by construction and become UsageErrors with the
same message: no try/except in every reader.

UsageError is a ValueError, so code and tests that expect the ValueErrors these
checks raised before still see one. flag_message words a command-line flag that
does not parse the same way, for every entry point (bert_jax.jobs.parse_flags).
"""

import contextlib
import re
from typing import Iterator

from absl import flags

VERBOSE_ENV = "BERT_JAX_VERBOSE"  # "1": refusals print their traceback (bert_jax.main --verbose)


class UsageError(ValueError):
  """The user's input (config, flag, data file, checkpoint, workdir) is wrong; the message
  says what, where, and what to do."""


class NonFiniteLoss(UsageError, FloatingPointError):
  """A training step's loss or gradient went non-finite (the data or the optimizer values
  diverge): the run stops without saving it; a FloatingPointError as before."""


def one_line(text: str) -> str:
  """A message as one line: its lines joined, surrounding blanks dropped."""
  return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


@contextlib.contextmanager
def judging_input() -> Iterator[None]:
  """Inside it, a ValueError (UnicodeDecodeError included) or a missing file is a refusal:
  re-raised as UsageError with its message (the original stays as __cause__)."""
  try:
    yield
  except UsageError:
    raise
  except (ValueError, FileNotFoundError) as e:
    message = str(e)
    if isinstance(e, FileNotFoundError) and e.filename:
      message = f"{e.filename}: {e.strerror or 'no such file'}"
    raise UsageError(one_line(message) or repr(e)) from e


def _innermost(error: BaseException) -> str:
  """The message under the wrappers: ConfigDict wraps a KeyError's text in an AttributeError."""
  while error.args and isinstance(error.args[0], BaseException):
    error = error.args[0]
  text = error.args[0] if len(error.args) == 1 and isinstance(error.args[0], str) else str(error)
  return ". ".join(l.strip() for l in text.splitlines() if l.strip())


def flag_message(error: BaseException, argv: list[str]) -> str:
  """One line for a flag that did not parse: the flag as typed, then the cause.

  absl quotes a config file's traceback (a variant get_config refuses, a data
  package it cannot find): its last line is the cause. A --config.a.b override of
  a field the config lacks arrives as a KeyError inside an AttributeError.
  """
  text = str(error)
  if isinstance(error, flags.Error) and "Traceback" in text:
    head = re.match(r"(flag \S+): ", text)
    last = [l.strip() for l in text.splitlines() if l.strip()][-1]
    cause = re.sub(r"^\w+(Error|Exception): ", "", last)
    return f"{head.group(1)}: {cause}" if head else cause
  if isinstance(error, flags.Error):
    return one_line(text)
  cause = _innermost(error)
  name = re.match(r"'([^']+)'", cause)
  typed = [a for a in argv[1:] if a.startswith("--config.") and name
           and name.group(1) in re.split(r"[.=]", a[2:])]
  where = f"flag {typed[0]}" if typed else "a --config.* flag"
  return f"{where}: the config has no field {cause}"
