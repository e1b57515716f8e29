"""The name and shape table behind checkpoint conversion, and the strict assembler that uses it.

One table (`layout`) lists every tensor of our parameter tree together with its name and
storage shape in each external format: Hugging Face PyTorch names ("hf": the bert, roberta
or roberta-prelayernorm family, as config.hf_model_type says; HF_FAMILIES), original
google-research/bert TF variable names ("tf") and our own flattened tree ("own"). Import
and export both read the same table, so the two directions cannot drift apart, and
`assemble` turns a flat {name: array} dict into our tree, refusing any missing, unused or
wrongly shaped tensor by name.

Our tree is the one documented in the model contract: per-layer layout
(`encoder/layer_{i}/...`), attention projections as [H, A, D] / [A, D, H] kernels, and for
pretraining {"bert": ..., "mlm_head": ..., "nsp_head": ...}.
"""

import dataclasses
import math
from typing import Callable, Mapping

from absl import logging
import jax
import numpy as np

import bert_jax.convert.modernbert as convert_modernbert  # (not via the package: its __init__)

# Groups of tensors. A checkpoint may legitimately lack the non-encoder groups: a BertModel
# export has no heads, a BertForMaskedLM export has no pooler and no NSP head.
ENCODER = "encoder"
POOLER = "pooler"
MLM_HEAD = "mlm_head"
NSP_HEAD = "nsp_head"
HEAD_GROUPS = (MLM_HEAD, NSP_HEAD)
OPTIONAL_GROUPS = (POOLER, MLM_HEAD, NSP_HEAD)

FORMATS = ("hf", "tf", "own")
TARGETS = ("pretraining", "encoder", "auto")


@dataclasses.dataclass(frozen=True)
class HfFamily:
  """How one Hugging Face model family names a checkpoint's tensors and classes.

  Attributes:
    prefix: the encoder's key prefix in a checkpoint with heads ("bert", "roberta", ...).
    encoder_class: the architecture written for an encoder-only export.
    mlm_head: the MLM head's module name ("cls.predictions" or "lm_head").
    mlm_transform: its dense and LayerNorm names under mlm_head.
    mlm_bias: its output bias name under mlm_head.
    has_nsp: the family's pretraining model has the NSP head (cls.seq_relationship).
  """
  prefix: str
  encoder_class: str
  mlm_head: str
  mlm_transform: tuple[str, str]
  mlm_bias: str
  has_nsp: bool


HF_FAMILIES = {
    "bert": HfFamily("bert", "BertModel", "cls.predictions",
                     ("transform.dense", "transform.LayerNorm"), "bias", True),
    "roberta": HfFamily("roberta", "RobertaModel", "lm_head", ("dense", "layer_norm"), "bias",
                        False),
    "roberta-prelayernorm": HfFamily("roberta_prelayernorm", "RobertaPreLayerNormModel",
                                     "lm_head", ("dense", "layer_norm"), "bias", False),
    # Its names are the modernbert module's; the head's bias is the decoder's, at the top.
    "modernbert": HfFamily(convert_modernbert.PREFIX, convert_modernbert.ENCODER_CLASS,
                           "head", ("dense", "norm"), "decoder.bias", False),
}


@dataclasses.dataclass(frozen=True)
class Entry:
  """One tensor: where it lives in our tree and how one external format stores it.

  Attributes:
    path: path in our tree; relative to the encoder for ENCODER/POOLER entries, absolute
      ("mlm_head"/"nsp_head", ...) for head entries.
    group: ENCODER, POOLER, MLM_HEAD or NSP_HEAD.
    name: the tensor's name in the external format.
    shape: our shape.
    source_shape: the external format's shape (PyTorch Linear weights are [out, in],
      attention kernels are 2-D there).
    transpose: the stored matrix is [out, in] and must be transposed into our [in, out].
    pad_rows: vocabulary padding (BertConfig.vocab_multiple): rows our array has beyond
      the stored tensor's; zero on import, dropped on export.
  """
  path: tuple[str, ...]
  group: str
  name: str
  shape: tuple[int, ...]
  source_shape: tuple[int, ...]
  transpose: bool = False
  pad_rows: int = 0

  def to_ours(self, array: np.ndarray) -> np.ndarray:
    """Stored tensor -> our float32 array (shape already checked against source_shape)."""
    array = np.asarray(array, dtype=np.float32)
    if self.transpose:
      array = array.T
    stored = (self.shape[0] - self.pad_rows,) + self.shape[1:]
    array = array.reshape(stored)
    if self.pad_rows:  # no token has these ids: their logits are masked, their rows unused
      array = np.concatenate([array, np.zeros((self.pad_rows,) + stored[1:], np.float32)])
    return np.ascontiguousarray(array)

  def from_ours(self, array: np.ndarray) -> np.ndarray:
    """Our array -> the external format's float32 tensor."""
    array = np.asarray(array, dtype=np.float32)
    if self.pad_rows:
      array = array[:self.shape[0] - self.pad_rows]
    if self.transpose:
      return np.ascontiguousarray(array.reshape(self.source_shape[::-1]).T)
    return np.ascontiguousarray(array.reshape(self.source_shape))


def _check_external(config, fmt: str) -> None:
  """HF and TF layouts cannot hold ALBERT's switches; TF's is post-LN BERT only."""
  if config.architecture == "modernbert" and fmt == "tf":
    raise ValueError("architecture 'modernbert' has no google-research/bert TF layout; use "
                     "the 'hf' or 'own' format")
  if fmt == "hf":
    config.hf_model_type  # pylint: disable=pointless-statement  # refuses what HF cannot hold
    return
  if config.embedding_size not in (None, config.hidden_size) or config.share_layers:
    raise ValueError(
        f"embedding_size={config.embedding_size}, share_layers={config.share_layers}: the "
        f"{fmt!r} BERT layout has no factorised embedding projection and one set of weights "
        "per layer; use the 'own' format")
  if config.pre_layer_norm or config.position_offset:
    raise ValueError(
        f"pre_layer_norm={config.pre_layer_norm}, position_offset={config.position_offset}: "
        f"the {fmt!r} layout is google-research/bert's post-LN BERT; use the 'hf' or 'own' "
        "format")


def hf_family(config) -> HfFamily:
  """The Hugging Face naming of config's family (config.hf_model_type refuses the rest)."""
  return HF_FAMILIES[config.hf_model_type]


class Table:
  """The entries of one format being listed: `add` one tensor, `dense` a kernel/bias pair,
  `layer_norm` a scale/bias pair, each under its names in HF and TF."""

  def __init__(self, fmt: str):
    self.fmt, self.entries = fmt, []

  def add(self, path, group, shape, *, hf, tf, kernel_in_ndim=0, tf_transposed=False,
          table=False, pad_rows=0):
    """Adds one tensor. Kernels (kernel_in_ndim > 0) are 2-D [in, out] in TF, [out, in] in HF;
    embedding tables are stored as they are; everything else is a flat vector there. Our
    own format keeps `pad_rows` (vocabulary padding); the others store vocab_size rows."""
    shape = tuple(shape)
    if self.fmt == "own":
      self.entries.append(Entry(path, group, "/".join(path), shape, shape))
      return
    if kernel_in_ndim:
      n_in = math.prod(shape[:kernel_in_ndim])
      n_out = math.prod(shape[kernel_in_ndim:])
      transpose = True if self.fmt == "hf" else tf_transposed
      source_shape = (n_out, n_in) if transpose else (n_in, n_out)
    else:
      transpose = False
      stored = (shape[0] - pad_rows,) + shape[1:]
      source_shape = stored if table else (math.prod(stored),)
    self.entries.append(Entry(path, group, hf if self.fmt == "hf" else tf, shape, source_shape,
                              transpose, pad_rows))

  def dense(self, path, group, shape, hf, tf, in_ndim=1):
    """A kernel/bias pair: HF `<hf>.weight/.bias`, TF `<tf>/kernel`, `<tf>/bias`."""
    self.add(path + ("kernel",), group, shape, hf=f"{hf}.weight", tf=f"{tf}/kernel",
             kernel_in_ndim=in_ndim)
    self.add(path + ("bias",), group, shape[in_ndim:], hf=f"{hf}.bias", tf=f"{tf}/bias")

  def layer_norm(self, path, group, size, hf, tf):
    """HF LayerNorm.weight/.bias (older files: gamma/beta), TF LayerNorm/gamma and /beta."""
    self.add(path + ("scale",), group, (size,), hf=f"{hf}.weight", tf=f"{tf}/gamma")
    self.add(path + ("bias",), group, (size,), hf=f"{hf}.bias", tf=f"{tf}/beta")


def layout(config, fmt: str) -> list[Entry]:
  """Every tensor of BertForPreTraining(config) (encoder, pooler, both heads) in format `fmt`.

  Args:
    config: a bert_jax.model.config.BertConfig.
    fmt: "hf" (PyTorch names without the family's "bert." / "roberta." / ... prefix), "tf"
      (google-research/bert variable names) or "own" (our tree, "/"-joined, encoder entries
      without "bert/"). The roberta families have no NSP head: none is listed for them.

  Returns:
    The entries, in a stable order (embeddings, layers, pooler, heads).
  """
  if fmt not in FORMATS:
    raise ValueError(f"unknown checkpoint format {fmt!r}; expected one of {FORMATS}")
  if fmt != "own":
    _check_external(config, fmt)
  table = Table(fmt)
  if config.architecture == "modernbert":
    convert_modernbert.entries(table, config, (ENCODER, MLM_HEAD))
    return table.entries
  _embeddings(table, config)
  _layers(table, config)
  table.dense(("pooler", "dense"), POOLER, (config.hidden_size, config.hidden_size),
              "pooler.dense", "bert/pooler/dense")
  _heads(table, config, hf_family(config) if fmt == "hf" else None)
  return table.entries


def _embeddings(t: Table, config) -> None:
  """The word, position and segment tables, their LayerNorm, ALBERT's projection."""
  h, e = config.hidden_size, config.embedding_size or config.hidden_size
  vocab_pad = config.padded_vocab_size - config.vocab_size
  for ours, rows, pad in (("word_embeddings", config.padded_vocab_size, vocab_pad),
                          ("position_embeddings", config.max_position_embeddings, 0),
                          ("token_type_embeddings", config.type_vocab_size, 0)):
    t.add(("embeddings", ours, "embedding"), ENCODER, (rows, e),
          hf=f"embeddings.{ours}.weight", tf=f"bert/embeddings/{ours}", table=True,
          pad_rows=pad)
  t.layer_norm(("embeddings", "layer_norm"), ENCODER, e, "embeddings.LayerNorm",
               "bert/embeddings/LayerNorm")
  if e != h:  # ALBERT projection E -> H; only the own format reaches here (checked above).
    t.dense(("embeddings", "projection"), ENCODER, (e, h), "", "")


def _layers(t: Table, config) -> None:
  """The encoder's blocks, one shared or one per layer, post-LN or pre-LN."""
  h, a = config.hidden_size, config.num_attention_heads
  d = h // a
  layer_names = (["layer"] if config.share_layers
                 else [f"layer_{i}" for i in range(config.num_hidden_layers)])
  for i, layer in enumerate(layer_names):
    p = ("encoder", layer)
    hf = f"encoder.layer.{i}"
    tf = f"bert/encoder/layer_{i}"
    for qkv in ("query", "key", "value"):
      t.dense(p + ("attention", qkv), ENCODER, (h, a, d), f"{hf}.attention.self.{qkv}",
              f"{tf}/attention/self/{qkv}")
    t.dense(p + ("attention", "output"), ENCODER, (a, d, h), f"{hf}.attention.output.dense",
            f"{tf}/attention/output/dense", in_ndim=2)
    if config.pre_layer_norm:  # RobertaPreLayerNorm normalises the inputs of both blocks
      t.layer_norm(p + ("attention_layer_norm",), ENCODER, h, f"{hf}.attention.LayerNorm", "")
      t.layer_norm(p + ("intermediate_layer_norm",), ENCODER, h,
                   f"{hf}.intermediate.LayerNorm", "")
    else:
      t.layer_norm(p + ("attention_layer_norm",), ENCODER, h,
                   f"{hf}.attention.output.LayerNorm", f"{tf}/attention/output/LayerNorm")
    t.dense(p + ("intermediate",), ENCODER, (h, config.intermediate_size),
            f"{hf}.intermediate.dense", f"{tf}/intermediate/dense")
    t.dense(p + ("output",), ENCODER, (config.intermediate_size, h), f"{hf}.output.dense",
            f"{tf}/output/dense")
    if not config.pre_layer_norm:
      t.layer_norm(p + ("output_layer_norm",), ENCODER, h, f"{hf}.output.LayerNorm",
                   f"{tf}/output/LayerNorm")
  if config.pre_layer_norm:  # after the last layer; HF keeps it beside the encoder
    t.layer_norm(("encoder", "final_layer_norm"), ENCODER, h, "LayerNorm", "")


def _heads(t: Table, config, family) -> None:
  """The MLM head (its decoder tied to the word embeddings: only the bias is stored) and
  the NSP head, which the roberta families do not have."""
  h, e = config.hidden_size, config.embedding_size or config.hidden_size
  vocab_pad = config.padded_vocab_size - config.vocab_size
  mlm = family.mlm_head if family else "cls.predictions"
  transform, transform_norm = family.mlm_transform if family else ("", "")
  bias = family.mlm_bias if family else ""
  t.dense((MLM_HEAD, "transform"), MLM_HEAD, (h, e), f"{mlm}.{transform}",
          "cls/predictions/transform/dense")
  t.layer_norm((MLM_HEAD, "layer_norm"), MLM_HEAD, e, f"{mlm}.{transform_norm}",
               "cls/predictions/transform/LayerNorm")
  t.add((MLM_HEAD, "output_bias"), MLM_HEAD, (config.padded_vocab_size,), hf=f"{mlm}.{bias}",
        tf="cls/predictions/output_bias", pad_rows=vocab_pad)
  if family is None or family.has_nsp:
    # google-research/bert stores the NSP matrix as output_weights [2, H], i.e. [out, in].
    t.add((NSP_HEAD, "kernel"), NSP_HEAD, (h, 2), hf="cls.seq_relationship.weight",
          tf="cls/seq_relationship/output_weights", kernel_in_ndim=1, tf_transposed=True)
    t.add((NSP_HEAD, "bias"), NSP_HEAD, (2,), hf="cls.seq_relationship.bias",
          tf="cls/seq_relationship/output_bias")


def _fresh(entry: Entry, config, seed: int) -> np.ndarray:
  """BERT's initialisation for a head the checkpoint lacks: N(0, initializer_range) kernels
  truncated at two standard deviations, zero biases, unit LayerNorm scales."""
  leaf = entry.path[-1]
  if leaf == "kernel":
    init = jax.nn.initializers.truncated_normal(config.initializer_range)
    return np.asarray(init(jax.random.PRNGKey(seed), entry.shape, np.float32))
  if leaf == "scale":
    return np.ones(entry.shape, np.float32)
  return np.zeros(entry.shape, np.float32)


def set_path(tree: dict, path: tuple[str, ...], value) -> None:
  """tree[path[0]][path[1]]... = value, creating dicts on the way."""
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def flatten(tree: Mapping, prefix: str = "") -> dict[str, np.ndarray]:
  """{"a": {"b": x}} -> {"a/b": x}; leaves are whatever is not a Mapping."""
  flat = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, Mapping):
      flat.update(flatten(value, name + "/"))
    else:
      flat[name] = value
  return flat


# Tensors with one row per vocabulary id (own-format names, as flatten() writes them).
_VOCAB_ROWS = ("embeddings/word_embeddings/embedding", f"{MLM_HEAD}/output_bias")


def pad_vocab(params: Mapping, config, vocab_multiple: int) -> tuple[dict, object]:
  """(params, config) with the vocabulary rows padded to a multiple of `vocab_multiple`.

  The word table and the MLM output bias keep their config.vocab_size real rows and
  get zero rows up to the new padded size (any padding they had is dropped first);
  works on the pretraining tree and on the encoder tree.
  """
  new = config.replace(vocab_multiple=vocab_multiple)
  pad = new.padded_vocab_size - config.vocab_size
  out = {}
  for name, value in flatten(params).items():
    if name.endswith(_VOCAB_ROWS):
      value = np.asarray(value)[:config.vocab_size]
      value = np.concatenate([value, np.zeros((pad,) + value.shape[1:], value.dtype)])
    set_path(out, tuple(name.split("/")), value)
  return out, new


def assemble(tensors: Mapping[str, np.ndarray], config, fmt: str, *, target: str,
             allow_missing_heads: bool = False, source: str = "checkpoint",
             display: Callable[[str], str] = str, ignored: Mapping[str, str] | None = None,
             omittable: tuple[str, ...] = ()) -> tuple[dict, str]:
  """Builds our parameter tree from a flat {name: array} dict, strictly.

  Args:
    tensors: the checkpoint's tensors under the canonical names of `layout(config, fmt)`.
    config: the model's BertConfig.
    fmt: "hf", "tf" or "own".
    target: "pretraining" ({"bert", "mlm_head", "nsp_head"}), "encoder" (the BertModel tree;
      the checkpoint's heads are dropped, and logged) or "auto" (pretraining when the
      checkpoint holds an MLM head).
    allow_missing_heads: initialise freshly (BERT init) a pooler, MLM head or NSP head the
      checkpoint lacks completely, instead of refusing.
    source: what to call the checkpoint in messages (a path).
    display: canonical name -> name as written in the file, for messages.
    ignored: tensors the reader skipped knowingly, {name: reason}; only logged.
    omittable: groups that may be absent entirely and are then left out of the tree
      (export of a pretraining tree without NSP head).

  Returns:
    (params, target): plain nested dict of float32 numpy arrays, and the target resolved.

  Raises:
    ValueError: naming every missing, unused and wrongly shaped tensor at once.
  """
  if target not in TARGETS:
    raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
  entries = layout(config, fmt)
  if target == "auto":
    has_mlm = any(e.name in tensors for e in entries if e.group == MLM_HEAD)
    target = "pretraining" if has_mlm else "encoder"
  by_reason = {}
  for name, reason in (ignored or {}).items():
    by_reason.setdefault(reason, []).append(display(name))
  for reason, names in by_reason.items():
    logging.info("%s: ignoring %d tensors (%s): %s", source, len(names), reason,
                 ", ".join(names[:5]) + (", ..." if len(names) > 5 else ""))

  missing, wrong_shape, dropped = [], [], []
  by_group = {}
  for entry in entries:
    by_group.setdefault(entry.group, []).append(entry)
  fresh_groups, skipped_groups, heads_missing = [], [], False
  for group, group_entries in by_group.items():
    present = [e for e in group_entries if e.name in tensors]
    if target == "encoder" and group in HEAD_GROUPS:
      dropped.extend(e.name for e in present)  # a BertModel has no heads: drop, knowingly.
      continue
    if not present and group in omittable:
      skipped_groups.append(group)
      continue
    if not present and group in OPTIONAL_GROUPS and allow_missing_heads:
      fresh_groups.append(group)
      continue
    absent = [display(e.name) for e in group_entries if e.name not in tensors]
    missing.extend(absent)
    heads_missing |= bool(absent) and not present and group in OPTIONAL_GROUPS
    for e in present:
      got = tuple(np.shape(tensors[e.name]))
      if got != e.source_shape:
        wrong_shape.append(f"{display(e.name)}: has shape {got}, expected {e.source_shape}")
  known = {e.name for e in entries}
  unused = sorted(display(n) for n in tensors if n not in known)
  if missing or unused or wrong_shape:
    lines = [f"cannot load {source} into the {target} model "
             f"(L={config.num_hidden_layers}, H={config.hidden_size}, "
             f"A={config.num_attention_heads}, V={config.vocab_size}):"]
    if missing:
      hint = ("; allow_missing_heads=True initialises an absent pooler/head freshly"
              if heads_missing else "")
      lines.append(f"  missing tensors ({len(missing)}{hint}): " + ", ".join(missing))
    if unused:
      lines.append(f"  unused tensors ({len(unused)}): " + ", ".join(unused))
    if wrong_shape:
      lines.append(f"  wrongly shaped tensors ({len(wrong_shape)}): " + "; ".join(wrong_shape))
    raise ValueError("\n".join(lines))
  if dropped:
    logging.warning("%s: loading into an encoder-only model, dropping %d head tensors: %s",
                    source, len(dropped), ", ".join(display(n) for n in dropped))

  params = {}
  for seed, entry in enumerate(entries):
    if (target == "encoder" and entry.group in HEAD_GROUPS) or entry.group in skipped_groups:
      continue
    if entry.group in fresh_groups:
      value = _fresh(entry, config, seed)
    else:
      value = entry.to_ours(tensors[entry.name])
    path = entry.path
    if target == "pretraining" and entry.group in (ENCODER, POOLER):
      path = ("bert",) + path
    set_path(params, path, value)
  if fresh_groups:
    logging.warning("%s: the checkpoint has no %s; initialised freshly", source,
                    " / ".join(fresh_groups))
  return params, target


def to_external(params: Mapping, config, fmt: str, *, source: str = "params") -> dict:
  """Our tree (pretraining or encoder-only, per-layer layout) -> {external name: array}.

  The tree is checked against the layout first, so a wrong tree is refused by name rather
  than exported half. A pretraining tree without "nsp_head" (RoBERTa-style) exports without
  the NSP tensors; for the roberta families, one without "pooler" exports without it.
  """
  flat = flatten(params)
  if "bert" in params:  # pretraining tree: encoder under "bert/", heads at the top.
    flat = {(k[len("bert/"):] if k.startswith("bert/") else k): v for k, v in flat.items()}
  target = "pretraining" if MLM_HEAD in params else "encoder"
  # RoBERTa's masked-LM classes have no pooler: a tree without one exports as they are.
  roberta = fmt == "hf" and not hf_family(config).has_nsp
  assemble(flat, config, "own", target=target, source=source,
           omittable=(NSP_HEAD,) + ((POOLER,) if roberta else ()))
  ours = {e.path: e.name for e in layout(config, "own")}
  external = layout(config, fmt)
  if NSP_HEAD in params and not any(e.group == NSP_HEAD for e in external):
    raise ValueError(f"{source} has an NSP head and the Hugging Face {config.hf_model_type!r} "
                     "format has none: export it with --target=encoder, or in the 'own' format")
  return {entry.name: entry.from_ours(flat[ours[entry.path]])
          for entry in external if ours[entry.path] in flat
          and (target == "pretraining" or entry.group not in HEAD_GROUPS)}
