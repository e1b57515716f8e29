"""The job a fake worker runs instead of bert_jax.main (tests/fake_gcloud.py installs it).

The fake install's venv python runs it in the job module's place, by the installed
upload's interpreter, so the launcher's start script (`setsid nohup
$HOME/bert_jax_venv/bin/python -c RUN_AND_RECORD bert_jax.main ...`) runs it in the
worker's unpacked upload and records its exit. Worker 0 (process 0) writes
WORKDIR/job_state.json with the installed upload's bert_jax.run.job_state.Tracker;
FAKE_JOB says how it ends (done, fail, preempt_first, preempt_always, suspend_first,
blip; import_error: it dies as at an import, before any record), a job whose workdir contains
FAKE_JOB_IMPORT_ERROR dies so, and a job whose workdir contains FAKE_JOB_FAIL
fails whatever FAKE_JOB says; FAKE_JOB_HOLD keeps it running until the test writes
the fake directory's `release` file (every job) or `release-<the workdir's last
part>` (that job), FAKE_JOB_HOLD_S seconds at most (60). Every start is logged to
starts.jsonl in its slice's directory (FAKE_SLICE_DIR, set by the fake ssh; the fake
directory itself for the harness's own slice).
"""

import json
import os
import sys
import time


def set_states(root, new):
  """Sets the fake queued resource's states to come (as tests/fake_gcloud.py keeps them)."""
  path = os.path.join(root, "states.json")
  with open(path + ".tmp", "w") as f:
    json.dump(new, f)
  os.replace(path + ".tmp", path)


def main() -> int:
  """Runs as one worker's job; returns its exit code."""
  root, worker = os.environ["FAKE_GCLOUD_DIR"], int(os.environ["FAKE_WORKER"])
  slice_root = os.environ.get("FAKE_SLICE_DIR", root)
  job_id, attempt = os.environ.get("BERT_JAX_JOB_ID"), int(os.environ["BERT_JAX_JOB_ATTEMPT"])
  workdir = next(a for a in sys.argv if a.startswith("--workdir=")).split("=", 1)[1]
  local = os.path.join(root, "gcs", workdir[len("gs://"):])
  starts = os.path.join(slice_root, "starts.jsonl")
  previous = sum(1 for line in open(starts) if json.loads(line)["worker"] == worker) \
      if os.path.exists(starts) else 0
  with open(starts, "a") as f:
    f.write(json.dumps({"worker": worker, "job_id": job_id, "attempt": attempt, "pid": os.getpid(),
                        "module": os.environ.get("FAKE_JOB_MODULE"), "argv": sys.argv[1:],
                        "time": time.time()}) + "\n")
  print(f"hello from worker {worker}, attempt {attempt}", flush=True)
  mode = os.environ.get("FAKE_JOB", "done")
  if os.environ.get("FAKE_JOB_FAIL") and os.environ["FAKE_JOB_FAIL"] in workdir:
    mode = "fail"  # this job fails for good
  if os.environ.get("FAKE_JOB_IMPORT_ERROR") and os.environ["FAKE_JOB_IMPORT_ERROR"] in workdir:
    mode = "import_error"
  if mode == "import_error":  # as every job did when the upload lacked host/: no record
    raise ModuleNotFoundError("No module named 'host'", name="host")
  first = previous == 0
  tracker = None
  if worker == 0:  # process 0 (the others skip the import: it costs a second of CPU each)
    # From the installed upload (the working directory is the worker's unpacked sdist).
    from bert_jax.run import job_state
    assert job_state.identity() == (job_id, attempt)
    job_state.HEARTBEAT_S = 0.2
    tracker = job_state.Tracker(local, False, job_id, attempt)
    tracker.start()
    time.sleep(0.3)  # the 'running' record is written
  code = 0
  if mode == "fail":
    print("ValueError: boom", flush=True)
    code = 1
  elif mode == "preempt_always" or (mode == "preempt_first" and first):
    print("SIGTERM: saved step 3, exiting", flush=True)
    code = 143
  elif mode == "suspend_first" and first:
    if worker == 0:
      set_states(slice_root, ["SUSPENDED"])
    os._exit(0)  # the VM is gone: no final record, the heartbeat stops
  else:
    if mode == "blip" and first and worker == 0:
      set_states(slice_root, ["FAILED", "ACTIVE"])  # one odd read of the queued resource
    holds = [os.path.join(root, "release"),
             os.path.join(root, f"release-{workdir.rstrip('/').rsplit('/', 1)[-1]}")]
    hold_s = float(os.environ.get("FAKE_JOB_HOLD_S", "60"))  # the longest hold
    deadline = time.time() + (hold_s if os.environ.get("FAKE_JOB_HOLD") else 0.6)
    while time.time() < deadline and not any(os.path.exists(h) for h in holds):
      time.sleep(0.05)
    print(f"worker {worker} finished", flush=True)
  if tracker:
    tracker.finish(code)
  return code


if __name__ == "__main__":
  sys.exit(main())
