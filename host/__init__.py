"""The floor under both packages: what `bert_jax` and `data_pipeline` both need from the host.

`paths` (every file the project reads or writes, on local disks and gs://),
`tf_cpu` (TensorFlow imported once, kept off the accelerators), `libtpu_flags`
(libtpu's compiler flags, set before it starts) and `fields` (the
rules a config field's value must satisfy, declared as data by the modules that own
the fields: bert_jax's trainers and data_pipeline's specs alike). Modules here
import neither `bert_jax` nor `data_pipeline`; docs/architecture.md states the
layering and tests/test_architecture.py checks it.
"""
