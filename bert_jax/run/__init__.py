"""A run's record on disk: the workdir contract, its lock, checkpoints, logs and the job state.

workdir (record.json written once, every later run checked against it), layouts
(the mesh / remat / accumulation tested for the run's slice, chosen before it starts), lock
(one writer per workdir), checkpoint (orbax: save, restore past a damaged
step), preemption (SIGTERM -> save at an agreed step), job_state
(WORKDIR/job_state.json for a detached job's launcher), metrics_io
(metrics.jsonl, TensorBoard, progress, MFU), batch_log (what each step read)
and jsonl (the one reading of both logs). Checkpoint and record paths are the
same for every trainer. Imports: bert_jax.model (the BertConfig a checkpoint
holds), bert_jax.errors, bert_jax.exit_codes, bert_jax.accelerators and host;
never a trainer (bert_jax.pretrain, bert_jax.finetune). This file stays a
docstring: the launcher imports run.job_state without JAX or orbax.
"""
