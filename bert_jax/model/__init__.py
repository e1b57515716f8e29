"""The network: BertConfig and its size table, the encoder, attention kernels, the heads.

encoder (embeddings, post-LN layers, pooler), attention (the kernels
`config.model.attention_impl` names) and heads (MLM, NSP/SOP, the fine-tuning
heads and task models) are Flax modules and pure functions of their inputs.
Imports: jax and flax only -- nothing else of the project's, so a benchmark,
a converter or another trainer can build the model with nothing else loaded
(tests/test_architecture.py checks it). Losses live with their trainers.
"""
