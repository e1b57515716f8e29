r"""Runs bert_jax.main on a Cloud TPU VM slice, detached: create, install, start, watch, delete.

  python -m bert_jax.launch --name=bert-base --project=my-project --zone=us-central2-b \
    --accelerator_type=v4-32 --spot --config=experiments/configs/pretrain.py:base \
    --workdir=gs://my-bucket/bert-base --config.total_steps=100000

`--action=run` (the default):
  0. before any gcloud call, check the configuration compiles and fits the
     slice (bert_jax.preflight, unless --skip_preflight): a config that cannot
     run is refused before anything is read, created or paid for. A pass is
     remembered in the preflight's cache (bert_jax.preflight.cache) under a key
     of the config, its overrides, the accelerator type, the source tree, the
     jax/libtpu versions and compiler flags, so re-running the same command to
     attach (or launching what `python -m bert_jax.preflight` passed) does not
     compile again;
  1. look at the workdir's job record (WORKDIR/job_state.json, written by the
     job: bert_jax.run.job_state) and the queued resource: if the record says
     this launch's job is 'running', ATTACH to it (steps 5-6) and start nothing,
     whatever this one read of the slice says: that first look is judged with
     the later ones as in step 5, so a slice reading FAILED or SUSPENDING once,
     or a heartbeat older than --stale_after_s, is deleted, re-created or
     restarted only once it lasted --preemption_window_s (and two reads);
     if the record says 'done', only delete the slice;
  2. otherwise (no record, or the job's own last word: preempted, failed)
     create the slice as a queued resource (reused if ACTIVE;
     `v5e-N` is sent as `v5litepod-N`; --autocheckpoint uses gcloud's alpha
     track for --autocheckpoint-enabled);
  3. build this source tree's sdist (bert_jax.launch.artifact: what setup.cfg declares),
     upload it to every worker, unpack it into ~/bert_jax and install it into a
     Python 3.11 virtual environment (~/bert_jax_venv; Ubuntu 22.04's python3.11
     package), printing each worker's Python, JAX version and devices;
  4. start `bert_jax.main --config=... --workdir=gs://... --config.distributed.enabled=True
     <every --config.X flag given here>` on every worker under `setsid nohup`, its
     output in ~/bert_jax_job.log there, with BERT_JAX_JOB_ID (tpu:PROJECT/ZONE/NAME,
     the same for every relaunch) and BERT_JAX_JOB_ATTEMPT (the start's Unix time,
     growing) in its environment. A worker whose previous job still runs keeps it
     (the launcher adopts it): one job at a time;
  5. watch: every --poll_s read the queued resource's state and the job record
     (each read retried with backoff), streaming worker 0's log meanwhile. A job
     that looks lost (slice not ACTIVE, record 'preempted', heartbeat stale, or no
     record after --start_timeout_s) is judged lost only when that lasts
     --preemption_window_s (and two reads): then restart it on the same slice if
     that is ACTIVE, else delete and re-create the slice, reinstall and start
     again; at most --max_relaunches times. Each start resumes from the workdir;
  6. delete the slice when the record says 'done' (not with --keep).
The launcher only starts, watches and restarts: losing contact (ssh exit 255, a
sleeping laptop, gcloud failing, the launcher killed or stopped with Ctrl-C)
never deletes anything. It exits saying how to re-attach: run the same command
(or, when it stopped before creating or starting anything, that it did not). gcloud
not logged in, or an account without permission, stops it at once in one line
with gcloud's own hint (`gcloud auth login`), without the retries a transient
failure gets.
A failed job (record 'failed') stops the launcher with the log's last lines and
leaves the slice for inspection (`--action=logs`, then `--action=delete`). A job that
ends before its first record (an import error, a refused flag: worker 0's
~/bert_jax_job.exit, asked at every look until a record exists) stops it within a
poll with the log's last lines, is never relaunched, and its slice is deleted unless
--keep.

`--job=evaluate` runs `python -m experiments.evaluate --workdir=WORKDIR <the flags after
--> ` instead of bert_jax.main (the paper's tables from a checkpoint, docs/evaluation.md),
on a one-host slice, with no preflight or store check: the same create, start, watch,
relaunch and delete, on the suite's own WORKDIR/job_state.json.

`--action=status` prints the queued resource's state and the job record,
`--action=logs --worker=N` prints and follows worker N's job log,
`--action=delete` deletes the slice, `--dry_run` prints the gcloud commands of
the action and runs nothing (the preflight neither, as it says on stderr). A
failure stops with one line naming the step and the tail of gcloud's stderr.
Pieces: the driver in bert_jax/launch/launcher.py,
the commands in plan.py, state reads and the judgement in state.py, starting
and watching in attach.py; the preflight is `python -m bert_jax.preflight`, run
as a child process (the launcher imports no JAX).
"""

import os
import shlex
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

from bert_jax import accelerators
from bert_jax.launch import launcher as launcher_lib
from bert_jax.launch import plan as launch_plan
from bert_jax.launch import state as launch_state
from bert_jax.launch.state import LaunchError, LostContact

_ACTION = flags.DEFINE_enum("action", "run", ["run", "status", "logs", "delete"],
                            "What to do with the slice.")
_JOB = flags.DEFINE_enum(
    "job", "main", ["main", "evaluate"], "main: bert_jax.main --config=... (pretraining or one "
    "fine-tuning sweep); evaluate: python -m experiments.evaluate with the flags after `--` "
    "(--suite, --init_checkpoint, --glue_dir, ...), the paper's tables on a one-host slice.")
_NAME = flags.DEFINE_string("name", None, "Queued resource and TPU node name.")
_PROJECT = flags.DEFINE_string("project", None, "Google Cloud project.")
_ZONE = flags.DEFINE_string("zone", None, "Zone of the slice, e.g. us-central2-b.")
_ACCELERATOR_TYPE = flags.DEFINE_string("accelerator_type", None,
                                        "e.g. v4-32, v5litepod-16 (v5e-16 is accepted), v6e-64.")
_RUNTIME_VERSION = flags.DEFINE_string("runtime_version", "",
                                       "TPU VM image; '' -> the generation's default.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 0,
                                    "VMs in the slice; 0 -> from the accelerator type.")
_SPOT = flags.DEFINE_bool("spot", False, "Ask for spot capacity (cheaper, preemptible).")
_AUTOCHECKPOINT = flags.DEFINE_bool(
    "autocheckpoint", False, "Create with --autocheckpoint-enabled (gcloud alpha track): the "
    "job is signalled to save before a maintenance event.")
_CONFIG = flags.DEFINE_string("config", None, "bert_jax.main's --config, e.g. "
                              "experiments/configs/pretrain.py:base (a path in this source tree).")
_WORKDIR = flags.DEFINE_string("workdir", None, "bert_jax.main's --workdir: a gs:// directory "
                               "(every worker and every relaunch must see it).")
_MAX_RELAUNCHES = flags.DEFINE_integer("max_relaunches", launcher_lib.MAX_RELAUNCHES,
                                       "Restarts after the job was lost (preemption, maintenance).")
_KEEP = flags.DEFINE_bool("keep", False, "Leave the slice running when the job is done.")
_SKIP_PREFLIGHT = flags.DEFINE_bool("skip_preflight", False, "Create the slice without first "
                                    "compiling the train step for it (bert_jax.preflight).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the gcloud commands; run nothing.")
_LOGDIR = flags.DEFINE_string("logdir", "", "Local directory for worker_0.log and the upload "
                              "staging; '' -> $TMPDIR/bert_jax_launch/NAME.")
_SOURCE_DIR = flags.DEFINE_string("source_dir", "", "Source tree to install; '' -> this checkout.")
_WORKER = flags.DEFINE_integer("worker", 0, "--action=logs: whose log.")
_FOLLOW = flags.DEFINE_bool("follow", True, "--action=logs: keep printing new lines.")
_FOLLOW_LOGS = flags.DEFINE_bool("follow_logs", True, "While watching, stream worker 0's log.")
_POLL_S = flags.DEFINE_float("poll_s", launcher_lib.POLL_S,
                             "Seconds between looks at the slice and the job.")
_RETRY_S = flags.DEFINE_float("retry_s", launcher_lib.RETRY_S, "First backoff of a failed state "
                              "read (doubling, 5 tries; then the launcher exits, leaving the "
                              "job be).")
_PREEMPTION_WINDOW_S = flags.DEFINE_float(
    "preemption_window_s", launcher_lib.PREEMPTION_WINDOW_S,
    "How long a lost-looking job must stay so before a relaunch.")
_STALE_AFTER_S = flags.DEFINE_float(
    "stale_after_s", launcher_lib.STALE_AFTER_S, "A 'running' record whose heartbeat is older "
    "is a job that is gone (the job rewrites it every minute).")
_START_TIMEOUT_S = flags.DEFINE_float(
    "start_timeout_s", launcher_lib.START_TIMEOUT_S,
    "How long a started job may take to write its 'running' record.")
_CREATE_TIMEOUT_S = flags.DEFINE_float("create_timeout_s", launcher_lib.CREATE_TIMEOUT_S,
                                       "Give up if the slice is not ACTIVE after this long.")


def parse_flags(argv: list[str]) -> list[str]:
  """absl parsing that passes every --config.X=V (and whatever follows `--`) on to bert_jax.main."""
  passthrough = [a for a in argv[1:] if a.startswith("--config.")]
  try:
    rest = flags.FLAGS([a for a in argv if not a.startswith("--config.")])
  except flags.Error as e:
    sys.exit(f"error: {e}\nPass --help for the flags.")
  return rest[:1] + passthrough + rest[1:]


def main(argv: list[str]) -> None:
  """Performs --action on the slice named by the flags."""
  extra = argv[1:]
  if stray := [a for a in extra if not a.startswith("--")]:
    sys.exit(f"error: unexpected arguments {stray}: give bert_jax.main's flags as --config.X=VALUE")
  missing = [f"--{f.name}" for f in (_NAME, _PROJECT, _ZONE) if not f.value]
  if _ACTION.value == "run":
    needed = (_ACCELERATOR_TYPE, _WORKDIR) + ((_CONFIG,) if _JOB.value == "main" else ())
    missing += [f"--{f.name}" for f in needed if not f.value]
  if missing:
    sys.exit(f"error: --action={_ACTION.value} needs {', '.join(missing)}")
  workdir = _WORKDIR.value or ""
  if workdir and not workdir.startswith("gs://"):
    sys.exit(f"error: --workdir={workdir} must be a gs:// directory: every worker "
             "writes to it and a relaunched slice resumes from it")
  # gcloud knows v5e slices as v5litepod-N only; translated before anything reaches it.
  accelerator_type = accelerators.canonical(_ACCELERATOR_TYPE.value or "")
  try:
    tpu = launch_plan.Slice(
        name=_NAME.value, project=_PROJECT.value, zone=_ZONE.value,
        accelerator_type=accelerator_type, spot=_SPOT.value, autocheckpoint=_AUTOCHECKPOINT.value,
        runtime_version=_RUNTIME_VERSION.value or (
            launch_plan.default_runtime_version(accelerator_type) if accelerator_type else ""),
        num_workers=_NUM_WORKERS.value or (
            launch_plan.num_workers(accelerator_type) if accelerator_type else 0))
  except ValueError as e:
    sys.exit(f"error: {e}")
  if _JOB.value == "evaluate":
    if _CONFIG.value or any(a.startswith("--config.") for a in extra):
      sys.exit("error: --job=evaluate takes experiments.evaluate's flags after `--` (--suite, "
               "--init_checkpoint, ...), not --config: each member's config comes from the suite")
    if tpu.num_workers > 1:
      # The suite's record, times and report are written by its one process; fine-tuning a
      # BERT-Large on GLUE needs one host's chips, not a pod.
      sys.exit(f"error: --job=evaluate runs on one host; {accelerator_type} has "
               f"{tpu.num_workers} workers: use a one-host slice of the generation (e.g. "
               f"{accelerators.one_host_type(accelerator_type)}), reading the same gs:// "
               "checkpoint")
  source_dir = _SOURCE_DIR.value or launcher_lib.SOURCE_ROOT
  judge = launch_state.Judge(window_s=_PREEMPTION_WINDOW_S.value,
                             stale_after_s=_STALE_AFTER_S.value,
                             start_timeout_s=_START_TIMEOUT_S.value)
  launcher = launcher_lib.Launcher(tpu, workdir=workdir, source_dir=source_dir, poll_s=_POLL_S.value,
                                   retry_s=_RETRY_S.value,
                                   create_timeout_s=_CREATE_TIMEOUT_S.value, judge=judge,
                                   follow_logs=_FOLLOW_LOGS.value,
                                   logdir=_LOGDIR.value or os.path.join(
                                       tempfile.gettempdir(), "bert_jax_launch", tpu.name))
  args = (launch_plan.main_args(_CONFIG.value, workdir, extra, accelerator_type)
          if _JOB.value == "main"
          else launch_plan.evaluate_args(workdir, extra))
  if _DRY_RUN.value:
    if _ACTION.value == "run" and not _SKIP_PREFLIGHT.value and _JOB.value == "main":
      # On stderr: stdout stays the commands alone, a script to read or run.
      print("[launch] --dry_run prints the gcloud commands only; it also skips the preflight "
            "that a real launch runs first: `python -m bert_jax.preflight "
            f"--config={_CONFIG.value} --topology={accelerator_type}` (with the same --config.X "
            "flags) checks the fit", file=sys.stderr)
    for command in launcher_lib.plan(_ACTION.value, tpu, launcher.logdir, workdir, args,
                                     _KEEP.value, _WORKER.value, _FOLLOW.value):
      print(shlex.join(command))
    return
  overrides = [a for a in extra if a.startswith("--config.")]
  # A suite compiles fine-tuning steps of its members' shapes, which pretraining's preflight
  # does not cover: it has none (its --dry_run prices it; a member that does not fit is its
  # first member's refusal, before the others run).
  preflight = None if _SKIP_PREFLIGHT.value or _JOB.value == "evaluate" else (
      lambda: launcher_lib.preflight(_CONFIG.value, overrides, accelerator_type, source_dir))
  try:
    if _ACTION.value == "status":
      print(f"{tpu.name}: {launcher.reader.slice_state() or 'not found'}")
      if workdir:
        print(f"job: {launch_state.describe_job(launcher.reader.job(), time.time())}")
    elif _ACTION.value == "logs":
      sys.exit(subprocess.call(launch_plan.logs_command(tpu, _WORKER.value, lines=200,
                                                        follow=_FOLLOW.value)))
    elif _ACTION.value == "delete":
      print(f"{tpu.name}: {'deleting' if launcher.delete(wait=False) else 'not found'}")
    else:
      if _JOB.value == "main":  # before a slice exists: whether its first start tokenizes
        launch_state.say(launcher_lib.store_status(_CONFIG.value, overrides, tpu.num_workers))
      launcher.run(args, _MAX_RELAUNCHES.value, _KEEP.value, preflight)
  except LostContact as e:  # NotAuthorized too: at once, nothing retried
    left = launcher.aftermath() if _ACTION.value == "run" else "nothing was changed"
    sys.exit(f"error: {e}. {left[0].upper()}{left[1:]}")
  except LaunchError as e:
    sys.exit(f"error: {e}")
  except KeyboardInterrupt:
    sys.exit(f"\n[launch] stopped; {launcher.aftermath()}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
