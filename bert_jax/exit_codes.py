"""A job's exit codes and its state file's name, in one place (imports nothing).

What bert_jax.main (bert_jax.jobs.run) exits with, what the launcher and
job_state read back, and what experiments/slurm/pretrain.sbatch requeues on
(its shell literals name this module; tests/test_slurm.py holds them equal):
"""

DONE = 0          # the run finished (re-running the command does nothing more)
REFUSED = 1       # the input was refused, or storage failed: one line on stderr
LOCK_HELD = 75    # EX_TEMPFAIL (sysexits.h): the workdir is another live run's; retry later
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, after saving the step
PREEMPTED = 143   # 128 + SIGTERM: preempted, after saving the step; re-run to resume
SSH_LOST = 255    # what gcloud's ssh exits with when the connection itself failed

# The detached job's record in its workdir (bert_jax.run.job_state writes it, the
# launcher reads it).
STATE_FILE = "job_state.json"
