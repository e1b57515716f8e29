"""bert_jax's own checkpoint format: `params/` (orbax) + `bert_config.json` + the vocabulary.

Read (is_own_dir, read_own_dir; a training workdir's params come out of
bert_jax.run.checkpoint in the same tree, so own_tensors serves both) and written
(export_own). The tree is stored plain and per-layer, so any BertConfig's
export loads into any layout.
"""

import dataclasses
import json
from typing import Callable

import jax
import numpy as np

from bert_jax.model import encoder as model_lib
from host import paths
# Siblings by module path, not via the package: its __init__ imports this module.
import bert_jax.convert.hf as convert_hf
import bert_jax.convert.layout as convert_layout

OWN_PARAMS = "params"
OWN_CONFIG = "bert_config.json"


def canonical_tree(params):
  """Plain per-layer tree: unboxes logical-partitioning metadata, unstacks scanned layers."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  params = nn.unbox(params)
  return model_lib.unstack_layers(jax.tree.map(np.asarray, params))


def own_tensors(params) -> tuple[dict, Callable[[str], str]]:
  """(layout name -> tensor, display) of a tree in our format: layout names drop the
  pretraining tree's "bert/" prefix; display(name) gives back the name as stored."""
  tensors, stored = {}, {}
  for name, value in convert_layout.flatten(canonical_tree(params)).items():
    canonical = name[len("bert/"):] if name.startswith("bert/") else name
    tensors[canonical] = value
    stored[canonical] = name
  return tensors, lambda n: stored.get(n, n)


def is_own_dir(path: paths.Path) -> bool:
  """A directory written by export_own."""
  return (path / OWN_PARAMS).is_dir() and (path / OWN_CONFIG).is_file()


def read_own_config(path: paths.Path) -> model_lib.BertConfig:
  """Our BertConfig from the JSON export_own writes (all dataclass fields by name)."""
  fields = convert_hf.read_json(path)
  known = {f.name for f in dataclasses.fields(model_lib.BertConfig)}
  unknown = sorted(set(fields) - known)
  if unknown:
    raise ValueError(f"{path}: unknown BertConfig fields {unknown}")
  return model_lib.BertConfig(**fields)


def read_own_dir(path: paths.Path):
  """(config as stored, tensors, display, ignored {}, vocab path or None) of an export."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  config = read_own_config(path / OWN_CONFIG)
  tensors, display = own_tensors(ocp.StandardCheckpointer().restore(path / OWN_PARAMS))
  return config, tensors, display, {}, convert_hf.find_vocab(path)


def export_own(params, config, out_dir, vocab_file=None) -> paths.Path:
  """Writes our own checkpoint: out_dir/params (orbax), bert_config.json, vocab.txt.

  Args:
    params: BertForPreTraining or BertModel tree (boxed or plain, per-layer or scanned);
      stored plain and per-layer.
    config: its BertConfig (any, ALBERT switches included).
    out_dir: directory to create; out_dir/params must not exist yet.
    vocab_file: copied beside (vocab.txt, or vocab.json + merges.txt); None only warns.

  Returns:
    out_dir as a Path.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  out_dir = paths.path(out_dir)
  params = canonical_tree(params)
  convert_layout.to_external(params, config, "own")  # refuses a tree that is not config's.
  if (out_dir / OWN_PARAMS).exists():
    raise ValueError(f"{out_dir / OWN_PARAMS} already exists; choose a new output directory")
  out_dir.mkdir(parents=True, exist_ok=True)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(out_dir / OWN_PARAMS, params)
  checkpointer.wait_until_finished()
  paths.write_atomic(out_dir / OWN_CONFIG,
                     json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True))
  convert_hf.copy_vocab(vocab_file, out_dir)
  return out_dir
