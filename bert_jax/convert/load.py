"""Loading any supported checkpoint into our parameter tree (bert_jax.convert's import half).

The kind is detected from what the path holds (_read, in the order the package
docstring gives); each format module reads its own files (own.py, hf.py, tf.py)
into layout names, and layout.assemble builds the tree, refusing any missing,
unused or wrongly shaped tensor in one message.
"""

from absl import logging
import numpy as np

from bert_jax.run import checkpoint
from bert_jax.run import workdir as workdir_lib
from host import paths
# Siblings by module path, not via the package: its __init__ imports this module.
import bert_jax.convert.hf as convert_hf
import bert_jax.convert.layout as convert_layout
import bert_jax.convert.own as convert_own
import bert_jax.convert.tf as convert_tf

_WORKDIR_CHECKPOINTS = checkpoint.CHECKPOINT_DIR


def _per_layer_config(config):
  """Imported params are always per-layer; say so in the config returned with them."""
  if config.scan_layers:
    logging.info("returning per-layer params and scan_layers=False; model.stack_layers and "
                 "config.replace(scan_layers=True) restore the scanned layout")
    config = config.replace(scan_layers=False)
  return config


def _is_workdir(path: paths.Path) -> bool:
  """A training workdir, its checkpoints/ directory, or one step directory in it."""
  return ((path / _WORKDIR_CHECKPOINTS).is_dir() or path.name == _WORKDIR_CHECKPOINTS
          or (path.name.isdigit() and path.parent.name == _WORKDIR_CHECKPOINTS))


def _read_workdir(path: paths.Path):
  # bert_jax.run.checkpoint knows the CheckpointManager layout under workdir/checkpoints/; the
  # vocabulary sits in the workdir itself.
  config, params = checkpoint.load_params_from_workdir(str(path))
  tensors, display = convert_own.own_tensors(params)
  return config, tensors, display, {}, convert_hf.find_vocab(_workdir_of(path))


def _workdir_of(path: paths.Path) -> paths.Path:
  """The workdir of a path _is_workdir accepts (it, its checkpoints/, or a step in it)."""
  return path if (path / _WORKDIR_CHECKPOINTS).is_dir() else (
      path.parent if path.name == _WORKDIR_CHECKPOINTS else path.parent.parent)


def checkpoint_kind(path) -> str:
  """What kind of checkpoint `path` is ("own", "hf", "workdir" or "tf"), judged by its files
  alone, no tensor read: a command checks its checkpoint with it before it writes anything.
  Raises ValueError naming the path and what was expected."""
  path = paths.Path(path)
  # Exports first: a directory that merely sits under a folder named "checkpoints" is still
  # an export when it holds one.
  if convert_own.is_own_dir(path):
    return "own"
  if convert_hf.is_hf_dir(path):
    return "hf"
  if _is_workdir(path):
    checkpoint.complete_step(str(path))  # a workdir that holds no complete step is refused
    return "workdir"
  if convert_tf.find_checkpoint(path) is not None:
    return "tf"
  if (path / convert_hf.CONFIG_NAME).is_file():
    found = sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".json", ".msgpack",
                                                                  ".h5", ".safetensors"))
    raise ValueError(
        f"{path} has {convert_hf.CONFIG_NAME} but no single-file {convert_hf.WEIGHTS_NAME} "
        f"(found {found}); only that weight file is read here: re-save the model with "
        "transformers' save_pretrained(..., safe_serialization=True, max_shard_size='20GB')")
  if not path.exists():  # (a TF prefix is not a file itself, but was found above)
    raise ValueError(f"checkpoint path {path} does not exist")
  raise ValueError(
      f"{path} is not a checkpoint this converter knows: expected a training workdir "
      f"(checkpoints/), a bert_jax export ({convert_own.OWN_PARAMS}/ + "
      f"{convert_own.OWN_CONFIG}), a Hugging Face "
      f"directory ({convert_hf.CONFIG_NAME} + {convert_hf.WEIGHTS_NAME}) or a TF checkpoint "
      f"({convert_tf.CONFIG_NAME} + model.ckpt-*.index)")


def _read(path: paths.Path):
  """Detects the checkpoint kind; returns (kind, fmt, config, tensors, display, ignored, vocab)."""
  kind = checkpoint_kind(path)
  if kind == "own":
    config, *rest = convert_own.read_own_dir(path)
    return ("bert_jax export", "own", _per_layer_config(config), *rest)
  if kind == "hf":
    config, tensors, display, ignored, vocab = convert_hf.read_hf_dir(path)
    prefix = convert_layout.hf_family(config).prefix + "."
    prefixed = any(v.startswith(prefix) for v in display.values())
    return ("Hugging Face directory", "hf", config, tensors,
            convert_hf.display_name(display, prefixed=prefixed, config=config), ignored, vocab)
  if kind == "workdir":
    config, *rest = _read_workdir(path)
    return ("training workdir", "own", _per_layer_config(config), *rest)
  return ("TF checkpoint", "tf") + convert_tf.read_tf_checkpoint(
      convert_tf.find_checkpoint(path))


def load_pretrained(path, *, target: str = "pretraining", allow_missing_heads: bool = False,
                    vocab_file=None, vocab_multiple: int | None = None):
  """Loads any supported checkpoint into our parameter tree.

  Args:
    path: a Hugging Face directory, a TF checkpoint (directory or prefix), a bert_jax export
      directory or a training workdir.
    target: "pretraining" -> the BertForPreTraining tree {"bert", "mlm_head", "nsp_head"};
      "encoder" -> the BertModel tree (the checkpoint's heads are dropped, and logged);
      "auto" -> "pretraining" when the checkpoint has an MLM head, else "encoder".
    allow_missing_heads: a pooler, MLM head or NSP head the checkpoint lacks entirely is
      initialised freshly (BERT init) instead of refused, e.g. MiniLM (encoder + pooler
      only) into BertForPreTraining, or a BertForMaskedLM export (no pooler, no NSP).
    vocab_file: overrides the vocabulary found beside the checkpoint.
    vocab_multiple: pads the vocabulary rows (word table, MLM output bias) with zeros to
      a multiple of this, as the model to load into is configured; the returned config
      says so. None keeps the checkpoint's (HF and TF checkpoints have no padding).

  Returns:
    (config, params, vocab_path): our BertConfig; a plain nested dict of float32 numpy
    arrays in the per-layer layout, so config.scan_layers is False (use model.stack_layers
    and config.replace(scan_layers=True) to scan); the vocabulary's path, or None (with a
    warning) when there is none.

  Raises:
    ValueError: unknown or corrupt checkpoint, or any missing / unused / wrongly shaped
      tensor (all named in one message).
  """
  if target not in convert_layout.TARGETS:
    raise ValueError(f"target must be one of {convert_layout.TARGETS}, got {target!r}")
  path = paths.path(path)
  params, config, vocab, _, _ = load_checkpoint(path, target, allow_missing_heads, vocab_file,
                                                vocab_multiple)
  return config, params, vocab


def load_for_finetuning(path, *, task_heads: tuple[str, ...], vocab_file=None,
                        vocab_multiple: int | None = None):
  """Loads a checkpoint's encoder (pretraining heads dropped) and any task heads it holds.

  A fine-tuned checkpoint (this project's, a Hugging Face
  BertFor{SequenceClassification,TokenClassification,QuestionAnswering}, or a TF
  checkpoint of google-research's run_classifier.py / run_squad.py) carries its task
  head beside the encoder; pretraining checkpoints carry none.

  Args:
    path: anything load_pretrained reads.
    task_heads: top-level head names of the task model ("classifier", "qa_outputs").
    vocab_file: overrides the vocabulary found beside the checkpoint.
    vocab_multiple: as for load_pretrained.

  Returns:
    (config, encoder params (the BertModel tree, pooler initialised freshly if
    absent), {head name: {"kernel" [H, n], "bias" [n]}} for the heads found,
    vocab path or None).
  """
  path = paths.path(path)
  read = _read(path)
  kind, fmt, _, tensors, display, _, _ = read
  heads = {}
  for name in list(tensors):
    head, sep, leaf = name.replace(".", "/", 1).partition("/")
    if fmt == "tf" and name in convert_tf.TASK_HEADS:
      (head, leaf), sep = convert_tf.TASK_HEADS[name], "/"
    if not sep or head not in task_heads:
      continue
    array = np.asarray(tensors.pop(name), np.float32)
    if leaf == "weight":  # PyTorch Linear, google-research TF heads: [out, in]
      leaf, array = "kernel", array.T
    if leaf not in ("kernel", "bias"):
      raise ValueError(f"{kind} {path}: task-head tensor {display(name)!r} is neither a "
                       "kernel nor a bias")
    heads.setdefault(head, {})[leaf] = array  # taken out of `read`'s tensors
  params, config, vocab, _ = _assemble(path, read, "encoder", True, vocab_file, vocab_multiple)
  return _per_layer_config(config), params, heads, vocab


def checkpoint_vocab(path) -> paths.Path | None:
  """The vocabulary a checkpoint was trained with (beside it: HF and TF directories, our
  exports, a training workdir): vocab.txt, or a BPE vocab.json (with merges.txt); or None.
  Reads no weights."""
  path = paths.path(path)
  if _is_workdir(path) and not convert_own.is_own_dir(path):
    path = _workdir_of(path)
  elif not path.is_dir():
    path = path.parent  # a TF checkpoint prefix
  return convert_hf.find_vocab(path)


def checkpoint_spm(path) -> paths.Path | None:
  """The SentencePiece model a checkpoint was trained with (spm.model, where
  checkpoint_vocab looks: a pretraining workdir keeps its own there), or None."""
  spm = _tokenizer_dir(path) / workdir_lib.SPM_FILE
  return spm if spm.is_file() else None


def _tokenizer_dir(path) -> paths.Path:
  """The directory holding a checkpoint's tokenizer files (checkpoint_vocab's): it, its
  workdir, or (a TF checkpoint prefix) its parent."""
  path = paths.path(path)
  if _is_workdir(path) and not convert_own.is_own_dir(path):
    return _workdir_of(path)
  return path if path.is_dir() else path.parent


def load_checkpoint(path, target, allow_missing_heads, vocab_file, vocab_multiple=None):
  """load_pretrained's work, also returning what was read: (params, config, vocab, kind, target)."""
  read = _read(path)
  params, config, vocab, target = _assemble(path, read, target, allow_missing_heads, vocab_file,
                                            vocab_multiple)
  if vocab is None:
    logging.warning("%s has no vocab.txt and no vocab_file was given", path)
  return params, config, vocab, read[0], target


def _assemble(path, read: tuple, target: str, allow_missing_heads: bool, vocab_file,
              vocab_multiple: int | None):
  """(params, config, vocab, target) from what _read returned: the tree assembled
  (layout.assemble's checks), padded to vocab_multiple, vocab_file in place of the
  vocabulary found (which must exist)."""
  kind, fmt, config, tensors, display, ignored, vocab = read
  # Our own exports of a run without NSP (RoBERTa's objective) hold none: it stays absent.
  params, target = convert_layout.assemble(
      tensors, config, fmt, target=target, allow_missing_heads=allow_missing_heads,
      source=f"{kind} {path}", display=display, ignored=ignored,
      omittable=(convert_layout.NSP_HEAD,) if fmt == "own" else ())
  if vocab_multiple is not None:
    params, config = convert_layout.pad_vocab(params, config, vocab_multiple)
  if vocab_file is not None:
    vocab = paths.path(vocab_file)
    if not vocab.is_file():
      raise ValueError(f"vocab_file {vocab} does not exist")
  return params, config, vocab, target
