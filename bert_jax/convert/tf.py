"""Original google-research/bert TF checkpoints: bert_config.json + model.ckpt-* files.

Variables keep their TF1 names (`bert/embeddings/word_embeddings`,
`bert/encoder/layer_N/attention/self/query/kernel`, `cls/predictions/output_bias`, ...);
kernels are already [in, out]. TensorFlow is imported only when such a checkpoint is read,
so the rest of the converter does not pay for it.
"""

import os
import re

import numpy as np

from bert_jax.model import encoder as model_lib
from host import paths
import bert_jax.convert.hf as convert_hf  # (not via the package: its __init__ imports this)

CONFIG_NAME = "bert_config.json"
# Optimizer state and step counters written beside the weights; not part of the model.
_OPTIMIZER_SUFFIXES = ("/adam_m", "/adam_v")
_COUNTERS = ("global_step",)
# Task heads of google-research's fine-tuning scripts, as (our head, leaf). Their weights
# are [num_labels, H], used with transpose_b=True, as PyTorch's Linear stores them.
TASK_HEADS = {
    "output_weights": ("classifier", "weight"),  # run_classifier.py
    "output_bias": ("classifier", "bias"),
    "cls/squad/output_weights": ("qa_outputs", "weight"),  # run_squad.py
    "cls/squad/output_bias": ("qa_outputs", "bias"),
}


def find_checkpoint(path):
  """The checkpoint prefix for `path` (an epath.Path, local or gs://): a prefix itself, or
  the newest ckpt in a directory."""
  if paths.path(os.fspath(path) + ".index").is_file():
    return path
  if not path.is_dir():
    return None
  indexes = list(path.glob("*.index"))
  if not indexes:
    return None

  def step(index) -> int:
    match = re.search(r"-(\d+)$", index.stem)
    return int(match.group(1)) if match else -1
  # The TF `checkpoint` state file names the newest, but copied checkpoints often lack it.
  return max(indexes, key=lambda p: (step(p), p.name)).with_suffix("")


def read_tf_checkpoint(prefix, *, config_file=None):
  """Reads an original BERT TF checkpoint.

  Args:
    prefix: the checkpoint prefix (".../model.ckpt-1000000").
    config_file: bert_config.json; default: beside the checkpoint.

  Returns:
    (config, {variable name: float32 array}, display (identity), ignored {name: reason},
     vocab path or None).
  """
  # heavy; only for this format. From tf_cpu, so TensorFlow never claims an accelerator.
  from host.tf_cpu import tf  # pylint: disable=g-import-not-at-top

  directory = prefix.parent
  config_file = config_file or directory / CONFIG_NAME
  if not config_file.is_file():
    raise ValueError(f"TF checkpoint {prefix}: no {CONFIG_NAME} beside it ({config_file})")
  config = model_lib.BertConfig.from_tf_dict(convert_hf.read_json(config_file))
  # TF's reader opens files through TensorFlow's own file systems; a gs:// checkpoint
  # is downloaded first (host.paths says why TF never talks to GCS here).
  with paths.local_file(prefix, companions=(".index", ".data-*")) as local_prefix:
    try:
      reader = tf.train.load_checkpoint(local_prefix)
    except (tf.errors.OpError, ValueError) as e:
      raise ValueError(f"cannot read TF checkpoint {prefix}: {e}") from None
    tensors, ignored = {}, {}
    for name in sorted(reader.get_variable_to_shape_map()):
      if name.endswith(_OPTIMIZER_SUFFIXES) or name in _COUNTERS:
        ignored[name] = "optimizer state"
        continue
      tensors[name] = np.asarray(reader.get_tensor(name))
  vocab = directory / convert_hf.VOCAB_NAME  # google-research/bert names it as HF does
  return config, tensors, str, ignored, (vocab if vocab.is_file() else None)
