"""The Cloud TPU launcher: a slice created, the job started detached, watched, relaunched, deleted.

`python -m bert_jax.launch` (__main__: flags and actions), launcher (the
driver, and the preflight run as `python -m bert_jax.preflight` in a child
process), plan (every gcloud command line, pure), artifact (the sdist it uploads),
state (the reads, retried, and the judgement of a lost job) and attach (start,
follow the log, watch, and a job that died at its start).
Imports: its own modules, bert_jax.run.job_state (the workdir's job record),
bert_jax.exit_codes and bert_jax.accelerators; never JAX, flax, orbax or
TensorFlow, not even through another module (tests/test_architecture.py checks
it), so the launcher starts in a second on any laptop.
"""
