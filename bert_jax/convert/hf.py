"""Hugging Face BERT and RoBERTa directories: read and write config.json + model.safetensors.

The safetensors format is small enough to read and write here, which keeps the library
free of the `safetensors` package (a test-only dependency): an 8-byte little-endian header
length, a JSON header {name: {"dtype", "shape", "data_offsets": [begin, end]}} (plus an
optional "__metadata__"), then the raw little-endian tensor bytes.

Accepted key layouts: BertModel (no prefix) and BertForPreTraining / BertForMaskedLM
("bert." prefix, "cls.predictions.*", "cls.seq_relationship.*"), with or without the prefix,
and old LayerNorm names (gamma/beta); for model_type "roberta" and "roberta-prelayernorm"
(RobertaPreLayerNorm, the pre-LN port of fairseq's RoBERTa) their Model and ForMaskedLM
layouts ("roberta." / "roberta_prelayernorm." prefix, "lm_head.*"). The family's names
are layout.HF_FAMILIES'; which family a directory is comes from config.json's model_type.
"""

import io
import json
import math
import struct

from absl import logging
import ml_dtypes
import numpy as np

from bert_jax.model import encoder as model_lib
from host import paths
import bert_jax.convert.layout as convert_layout  # (not via the package: its __init__ imports this)
import bert_jax.convert.modernbert as convert_modernbert

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
VOCAB_NAME = "vocab.txt"  # every format here (HF, google-research TF, our own) names it so
# A byte-level BPE vocabulary (RoBERTa's) is two files, side by side, named as HF names them.
BPE_VOCAB_NAME = "vocab.json"
BPE_MERGES_NAME = "merges.txt"
# A whole tokenizer in the `tokenizers` library's format (ModernBERT ships its BPE so).
TOKENIZER_NAME = "tokenizer.json"

_DTYPES = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype("<i8"), "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"), "I8": np.dtype("i1"), "U8": np.dtype("u1"), "BOOL": np.dtype("?"),
}
# A header beyond this is not a real checkpoint's (the reference library uses the same bound).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def read_safetensors(path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
  """Reads every tensor of a .safetensors file.

  Returns:
    ({name: numpy array in the stored dtype}, metadata dict).

  Raises:
    ValueError: naming the file and what is wrong with it (truncated file, bad header JSON,
      unknown dtype, offsets that do not match the shape).
  """
  path = paths.path(path)

  def corrupt(why):
    return ValueError(f"corrupt safetensors file {path}: {why}")

  # One read of the whole file (local or gs://): the tensors are all needed anyway.
  with io.BytesIO(paths.read_bytes(path)) as f:
    size = len(f.getbuffer())
    if size < 8:
      raise corrupt(f"only {size} bytes, no header")
    (header_len,) = struct.unpack("<Q", f.read(8))
    if header_len > min(size - 8, _MAX_HEADER_BYTES):
      raise corrupt(f"header length {header_len} does not fit in a {size}-byte file")
    try:
      header = json.loads(f.read(header_len).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise corrupt(f"header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
      raise corrupt("header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_len
    data_size = size - data_start
    tensors = {}
    for name, info in header.items():
      try:
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(int(n) for n in info["shape"])
        begin, end = (int(n) for n in info["data_offsets"])
      except (KeyError, TypeError, ValueError) as e:
        raise corrupt(f"tensor {name!r} has a malformed entry {info!r} ({e!r})") from None
      if not 0 <= begin <= end <= data_size:
        raise corrupt(f"tensor {name!r} offsets [{begin}, {end}] lie outside the "
                      f"{data_size}-byte data section")
      if end - begin != math.prod(shape) * dtype.itemsize:
        raise corrupt(f"tensor {name!r} has {end - begin} bytes, its shape {shape} and dtype "
                      f"{info['dtype']} need {math.prod(shape) * dtype.itemsize}")
      start = data_start + begin
      # A copy, so the arrays own their memory rather than pinning the whole file's bytes.
      tensors[name] = np.frombuffer(f.getbuffer()[start:data_start + end], dtype).reshape(
          shape).copy()
  return tensors, metadata


def write_safetensors(path, tensors: dict[str, np.ndarray], metadata=None) -> None:
  """Writes float32 (or other numpy-dtype) tensors as a .safetensors file, in name order."""
  names = {v: k for k, v in _DTYPES.items()}
  header, offset, arrays = {}, 0, []
  for name in sorted(tensors):
    array = np.ascontiguousarray(tensors[name])
    array = array.astype(array.dtype.newbyteorder("<"), copy=False)
    if array.dtype not in names:
      raise ValueError(f"tensor {name!r}: dtype {array.dtype} has no safetensors name")
    header[name] = {"dtype": names[array.dtype], "shape": list(array.shape),
                    "data_offsets": [offset, offset + array.nbytes]}
    offset += array.nbytes
    arrays.append(array)
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
  blob += b" " * (-len(blob) % 8)  # the format pads the header so the data is 8-byte aligned.
  paths.write_atomic(path, b"".join([struct.pack("<Q", len(blob)), blob]
                                    + [array.tobytes() for array in arrays]))


def read_json(path) -> dict:
  """A JSON object from a file (local or gs://); a broken file is a ValueError naming it."""
  try:
    value = json.loads(paths.read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON: {e}") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} does not hold a JSON object")
  return value


def _canonical_name(key: str, family: convert_layout.HfFamily) -> str:
  """HF key -> the canonical name of convert_layout (no family prefix, weight/bias names)."""
  if key.startswith(family.prefix + "."):
    key = key[len(family.prefix) + 1:]
  if key.endswith(".gamma"):  # LayerNorm names of checkpoints older than transformers 4.
    key = key[:-len(".gamma")] + ".weight"
  elif key.endswith(".beta"):
    key = key[:-len(".beta")] + ".bias"
  if key == f"{family.mlm_head}.decoder.bias":  # HF ties it to the head's output bias.
    key = f"{family.mlm_head}.{family.mlm_bias}"
  return key


def is_hf_dir(path) -> bool:
  """A directory with config.json and model.safetensors."""
  return (path / CONFIG_NAME).is_file() and (path / WEIGHTS_NAME).is_file()


def read_hf_dir(path):
  """Reads a Hugging Face BERT directory.

  Returns:
    (config, tensors under canonical names, display: canonical -> file name,
     ignored: {file name: reason}, vocab path or None).
  """
  hf_config = read_json(path / CONFIG_NAME)
  config = (convert_modernbert.config_from_hf(hf_config)
            if hf_config.get("model_type") == convert_modernbert.MODEL_TYPE
            else model_lib.BertConfig.from_hf_dict(hf_config))
  family = convert_layout.hf_family(config)
  modern = config.architecture == "modernbert"
  output_bias = family.mlm_bias if modern else f"{family.mlm_head}.{family.mlm_bias}"
  tied_decoder = ("decoder.weight" if modern else f"{family.mlm_head}.decoder.weight")
  words = ("embeddings.tok_embeddings.weight" if modern
           else "embeddings.word_embeddings.weight")
  raw, _ = read_safetensors(path / WEIGHTS_NAME)
  tensors, display, ignored = {}, {}, {}
  decoder_weight = None
  for key, array in raw.items():
    if key.endswith(("embeddings.position_ids", "embeddings.token_type_ids")):
      # Constant buffers PyTorch may save beside the weights; positions are implicit here.
      ignored[key] = "position/token-type id buffer, not a weight"
      continue
    if key.endswith(tied_decoder) and config.tie_word_embeddings:
      decoder_weight = (key, array)  # tied to the word embeddings; checked below.
      continue
    name = _canonical_name(key, family)
    if name in tensors:
      if name == output_bias and np.array_equal(tensors[name], array):
        ignored[key] = "tied copy of the MLM output bias"
        continue
      raise ValueError(f"{path / WEIGHTS_NAME}: {display[name]!r} and {key!r} both give "
                       f"{name!r}" + (" with different values" if "bias" in name else ""))
    tensors[name] = array
    display[name] = key
  if decoder_weight is not None:
    key, array = decoder_weight
    table = tensors.get(words)
    if table is None or table.shape != array.shape or not np.array_equal(table, array):
      raise ValueError(
          f"{path / WEIGHTS_NAME}: {key} differs from the word embeddings; this model ties the "
          "MLM decoder to the word embeddings and cannot hold an untied decoder"
          + ("; config.json tie_word_embeddings=false reads it as a decoder of its own"
             if modern else ""))
    ignored[key] = "tied to the word embeddings"
  return config, tensors, display, ignored, find_vocab(path)


def find_vocab(directory):
  """The vocabulary beside a checkpoint: vocab.txt, else a tokenizer.json, else a BPE
  vocab.json with its merges.txt.

  None when there is none (a vocab.json without merges.txt is no vocabulary).
  """
  directory = paths.path(directory)
  if (directory / VOCAB_NAME).is_file():
    return directory / VOCAB_NAME
  if (directory / TOKENIZER_NAME).is_file():
    return directory / TOKENIZER_NAME
  bpe = directory / BPE_VOCAB_NAME
  return bpe if bpe.is_file() and (directory / BPE_MERGES_NAME).is_file() else None


def display_name(display: dict[str, str], *, prefixed: bool, config):
  """Name in messages: as in the file when present, else with the file's own prefix style."""
  family = convert_layout.hf_family(config)
  heads = ("cls.", f"{family.mlm_head}.")

  def name(canonical: str) -> str:
    if canonical in display:
      return display[canonical]
    return (f"{family.prefix}.{canonical}" if prefixed and not canonical.startswith(heads)
            else canonical)
  return name


def export_hf(params, config, out_dir, vocab_file=None):
  """Writes a Hugging Face directory that transformers loads, in config's family.

  BERT (BertForPreTraining / BertModel), RoBERTa (position_offset > 0: RobertaForMaskedLM /
  RobertaModel) or RobertaPreLayerNorm (pre_layer_norm); BertConfig.hf_model_type says which.

  Args:
    params: plain nested dict, per-layer layout: the pretraining tree {"bert", "mlm_head",
      "nsp_head"} (the family's pretraining class, encoder keys under its prefix; the roberta
      families have no NSP head) or the BertModel tree (the family's Model, no prefix).
    config: the model's BertConfig (no factorised embedding, no sharing).
    out_dir: directory to create or fill.
    vocab_file: vocabulary copied beside the weights (vocab.txt; a BPE vocab.json travels
      with its merges.txt); None only warns.

  Returns:
    out_dir as a Path.
  """
  out_dir = paths.path(out_dir)
  family = convert_layout.hf_family(config)
  modern = config.architecture == "modernbert"
  tensors = convert_layout.to_external(params, config, "hf")
  pretraining = "mlm_head" in params
  if pretraining:
    heads = ("cls.", f"{family.mlm_head}.") + (("decoder.",) if modern else ())
    tensors = {(k if k.startswith(heads) else f"{family.prefix}.{k}"): v
               for k, v in tensors.items()}
  out_dir.mkdir(parents=True, exist_ok=True)
  write_safetensors(out_dir / WEIGHTS_NAME, tensors, metadata={"format": "pt"})
  if modern:
    hf_config = convert_modernbert.config_to_hf(config, token_ids_of(vocab_file),
                                                encoder_only=not pretraining)
  else:
    hf_config = dict(config.to_hf_dict())
    if not pretraining:
      hf_config["architectures"] = [family.encoder_class]
  paths.write_atomic(out_dir / CONFIG_NAME, json.dumps(hf_config, indent=2, sort_keys=True))
  copy_vocab(vocab_file, out_dir)
  return out_dir


def token_ids_of(vocab_file) -> dict | None:
  """The special tokens' ids a modernbert config.json names, from a tokenizer.json's added
  tokens ([PAD], [CLS], [SEP]); None for any other vocabulary, or without one."""
  if vocab_file is None or paths.path(vocab_file).name != TOKENIZER_NAME:
    return None
  added = {t.get("content"): t.get("id") for t in read_json(vocab_file).get("added_tokens", [])}
  if not all(added.get(k) is not None for k in ("[PAD]", "[CLS]", "[SEP]")):
    return None
  return {"pad_token_id": added["[PAD]"], "bos_token_id": added["[CLS]"],
          "cls_token_id": added["[CLS]"], "eos_token_id": added["[SEP]"],
          "sep_token_id": added["[SEP]"]}


def copy_vocab(vocab_file, out_dir) -> None:
  """Copies the vocabulary (vocab.txt, or a BPE vocab.json + merges.txt) beside a converted
  checkpoint; a checkpoint without one only warns."""
  if vocab_file is None:
    logging.warning("%s: no vocabulary given; the checkpoint is written without one", out_dir)
    return
  vocab_file = paths.path(vocab_file)
  if not vocab_file.is_file():
    raise ValueError(f"vocab_file {vocab_file} does not exist")
  copies = {vocab_file: VOCAB_NAME}
  if vocab_file.name == TOKENIZER_NAME:  # a whole tokenizer (ModernBERT's byte-level BPE)
    copies = {vocab_file: TOKENIZER_NAME}
  elif vocab_file.suffix == ".json":  # BPE: the merges travel with the vocabulary
    merges = vocab_file.parent / BPE_MERGES_NAME
    if not merges.is_file():
      raise ValueError(f"BPE vocab_file {vocab_file} has no {BPE_MERGES_NAME} beside it")
    copies = {vocab_file: BPE_VOCAB_NAME, merges: BPE_MERGES_NAME}
  for source, name in copies.items():
    if source != paths.path(out_dir) / name:
      paths.copy_file(source, paths.path(out_dir) / name)
