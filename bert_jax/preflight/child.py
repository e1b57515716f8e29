"""The child process in which bert_jax.preflight compiles (see bert_jax.preflight.isolation).

  python -m bert_jax.preflight.child RESULT_FD < request.pickle

Reads {"config", "tpu", "phases"} (a pickle) from stdin, compiles each phase
with bert_jax.preflight.compile.compile_phase for the Target's devices (without the
trainer's config checks, which the parent ran: they import TensorFlow), and writes one
pickle per phase, ("measurement", Measurement), to file descriptor RESULT_FD as
soon as it is done. A refusal (PreflightError) is sent as ("refused", line) and
a bug as ("error", traceback), each ending the child. If libtpu kills the
process, the parent sees the pipe close early and reports the phase as crashed
(no core file is written: the child sets its core size limit to 0).
"""

import os
import pickle
import resource
import sys
import traceback
from typing import Any, Callable, Sequence


def serve(request: dict[str, Any], send: Callable[[str, Any], None]) -> None:
  """Compiles the request's phases in order, sending each result (or the refusal, or the bug)."""
  # pylint: disable=g-import-not-at-top  # JAX, libtpu: in the child only
  from bert_jax.preflight import compile as compile_lib
  from bert_jax.preflight import targets
  try:
    slice_devices = targets.devices(request["tpu"])
    for phase in request["phases"]:
      # check=False: the parent ran the trainer's checks (bert_jax.preflight.compile.measure).
      send("measurement", compile_lib.compile_phase(request["config"], request["tpu"],
                                                    slice_devices, phase, check=False))
  except targets.PreflightError as e:
    send("refused", str(e))
  except Exception:  # pylint: disable=broad-except  # a bug: the parent raises it with this text
    send("error", traceback.format_exc())


def main(argv: Sequence[str]) -> int:
  """Entry point: argv[1] is the inherited file descriptor to send results to."""
  if len(argv) != 2 or not argv[1].isdigit():  # run by hand: say what it is
    print("usage: python -m bert_jax.preflight.child RESULT_FD < request.pickle\n\n"
          + __doc__.strip(), file=sys.stdout if argv[1:] in (["--help"], ["-h"]) else sys.stderr)
    return 0 if argv[1:] in (["--help"], ["-h"]) else 2
  # A crash is reported by the parent; a core of a compiler holding BERT-Large's
  # program (GiBs, in the working directory where core_pattern says "core") is not wanted.
  _, hard = resource.getrlimit(resource.RLIMIT_CORE)
  resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
  request = pickle.load(sys.stdin.buffer)
  with os.fdopen(int(argv[1]), "wb") as results:
    def send(kind: str, value: Any) -> None:
      pickle.dump((kind, value), results)
      results.flush()  # the parent shows each phase as it is done
    serve(request, send)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
