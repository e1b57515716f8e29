"""What both trainers share: the sharded state, the loop around the step, meshes, optimizers.

state (layout, resume > init checkpoint > random, accumulation, the update),
loop (the checkpoint manager's lifetime, metrics writer, stop request,
log/save cadence), sharding (meshes, logical-axis rules, global batches,
device prefetch), optim (AdamW / Adam / LAMB / StableAdamW) and schedules (warmup +
polynomial decay, warmup-stable-decay).
Imports: bert_jax.model, bert_jax.run and bert_jax.errors; never a trainer
(bert_jax.pretrain, bert_jax.finetune) nor data_pipeline.
"""
