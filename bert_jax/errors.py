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
checks raised before still see one.
"""

import contextlib
from typing import Iterator

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
