"""The floor under both packages: what `bert_jax` and `data_pipeline` both need from the host.

`paths` (every file the project reads or writes, on local disks and gs://) and
`tf_cpu` (TensorFlow imported once, kept off the accelerators). Modules here
import neither `bert_jax` nor `data_pipeline`; docs/architecture.md states the
layering and tests/test_architecture.py checks it.
"""
