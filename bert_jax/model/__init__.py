"""The network: BertConfig and its size table, the encoder, attention kernels, the heads.

config (BertConfig, the BERT and modern size tables), encoder (embeddings, post-LN or
pre-LN layers, pooler), modern (the modern encoder, architecture "modernbert": pre-norm,
RoPE, GLU, local/global layers), attention (the kernels `config.model.attention_impl`
names, with sliding windows), dropout (flax's, its mask behind an optimization barrier)
and heads (MLM, NSP/SOP, the fine-tuning heads and task models) are Flax modules and
pure functions of their inputs.
Imports: jax and flax only -- nothing else of the project's, so a benchmark,
a converter or another trainer can build the model with nothing else loaded
(tests/test_architecture.py checks it). Losses live with their trainers.
"""
