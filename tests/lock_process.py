"""A process that takes and releases workdir locks when told: the other side of tests/test_lock.py.

usage: python tests/lock_process.py WORKDIR

Locks between threads of one process share its memory, its pid and its fcntl
guards; between hosts they share only the storage. This process is a contender
of its own, driven by one JSON object per stdin line, answered by one JSON line
on stdout ("ready" first):

  {"op": "acquire", "name": N, "job": {...} | {}, "at": UNIX_TIME}
      waits until `at` (so that two processes start together), then
      bert_jax.run.lock.Lock(WORKDIR).acquire() as lock N: {"won", "token",
      "pid", "refusal", "cas_lost"} (cas_lost: conditional writes of this try
      that found the file changed, i.e. it raced someone and lost);
  {"op": "release", "name": N}: lock N's release();
  {"op": "paths", "fn": F, "args": [...]}: host.paths.F(*args) ->
      {"result": ...} (bytes as text), the conditional writes themselves.

EOF (the test closing stdin) ends it.
"""

import json
import os
import sys
import time


def main(workdir: str) -> None:
  """Answers the commands on stdin until it closes (see the module docstring)."""
  from bert_jax.run import lock as workdir_lock
  from host import paths
  lost_races = [0]
  replace_if = paths.replace_if

  def counted_replace_if(*args, **kwargs):
    generation = replace_if(*args, **kwargs)
    lost_races[0] += generation is None
    return generation

  workdir_lock.paths.replace_if = counted_replace_if  # the lock's own calls, counted
  locks = {}
  print("ready", flush=True)
  for line in sys.stdin:
    command = json.loads(line)
    if command["op"] == "acquire":
      lock = workdir_lock.Lock(workdir, stale_after_s=60, heartbeat_s=3600, job=command["job"])
      while time.time() < command["at"] - 0.002:
        time.sleep(0.001)
      while time.time() < command["at"]:
        pass  # the last 2 ms spinning: both processes leave within microseconds
      lost_races[0] = 0
      try:
        lock.acquire()
        locks[command["name"]] = lock
        answer = {"won": True, "token": lock.token, "pid": os.getpid()}
      except workdir_lock.LockHeld as e:
        answer = {"won": False, "refusal": str(e), "pid": os.getpid()}
      answer["cas_lost"] = lost_races[0]
    elif command["op"] == "release":
      locks.pop(command["name"]).release()
      answer = {"ok": True}
    else:
      result = getattr(paths, command["fn"])(*command["args"])
      if isinstance(result, tuple):
        result = [r.decode() if isinstance(r, bytes) else r for r in result]
      answer = {"result": result}
    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  main(sys.argv[1])
