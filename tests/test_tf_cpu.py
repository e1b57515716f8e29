"""host/tf_cpu.py: TensorFlow kept off accelerators, quiet, and the only way in."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_pipeline_module_takes_tensorflow_from_tf_cpu():
  """Fails if a data_pipeline module (tf_cpu.py aside) or bert_jax/run/metrics_io.py has a line
  `import tensorflow`, `import tensorflow as ...` or `from tensorflow import ...`."""
  offenders = []
  for path in sorted((ROOT / "data_pipeline").glob("*.py")) + [ROOT / "bert_jax/run/metrics_io.py"]:
    if path.name == "tf_cpu.py":
      continue
    for line in path.read_text().splitlines():
      if re.match(r"\s*(import tensorflow( |$)|import tensorflow as|from tensorflow import)", line):
        offenders.append(f"{path.relative_to(ROOT)}: {line.strip()}")
  assert not offenders, offenders


def test_accelerators_are_hidden_from_tensorflow(monkeypatch):
  """hide_accelerators asks TensorFlow to hide every GPU it lists, and survives being late.

  What this cannot prove, on a CPU machine: that a real GPU or TPU ends up hidden, or
  that TensorFlow claims no accelerator memory before JAX. TensorFlow's device functions
  are monkeypatched here, so the test shows only the calls tf_cpu makes; it fails if
  tf_cpu stops calling set_visible_devices([], "GPU") for a listed GPU or crashes when
  TensorFlow was initialised first. The real check runs where a device exists:
  `python -m experiments.benchmarks.pretrain.accelerator` prints "TensorFlow check ok/FAILED"
  (TensorFlow's visible GPUs and TPUs after host.tf_cpu, beside JAX's devices).
  """
  from host import tf_cpu  # pylint: disable=g-import-not-at-top
  hidden = []
  monkeypatch.setattr(tf_cpu.tf.config, "list_physical_devices",
                      lambda kind: [f"/physical_device:{kind}:0"] if kind == "GPU" else [])
  monkeypatch.setattr(tf_cpu.tf.config, "set_visible_devices",
                      lambda devices, kind: hidden.append((list(devices), kind)))
  assert tf_cpu.hide_accelerators() == ["GPU"]
  assert hidden == [([], "GPU")]

  def too_late(devices, kind):
    raise RuntimeError("Visible devices cannot be modified after being initialized")
  monkeypatch.setattr(tf_cpu.tf.config, "set_visible_devices", too_late)
  assert tf_cpu.hide_accelerators() == []  # whoever initialised first decided; no crash


@pytest.mark.slow  # start-up noise is only seen in a fresh interpreter importing TensorFlow
def test_start_up_is_quiet_and_tensorflow_works():
  """Fails if importing host.tf_cpu prints CUDA or CPU-feature lines, or TF cannot compute."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  code = ("from host.tf_cpu import tf; "
          "print(int(tf.constant(2) + 1), tf.config.get_visible_devices('GPU'))")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert done.stdout.split() == ["3", "[]"]
  assert "cuda" not in done.stderr.lower() and "cpu_feature_guard" not in done.stderr, done.stderr
