"""What a fine-tuning config runs with, judged and read once: the checks and `Prepared`.

`check_config(config, mesh)` refuses, before any data is read, a config that cannot run;
`prepare(config)` reads the checkpoint (if any) and its tokenizer, checks the
vocabulary against the checkpoint's, and reads the task data into features (the kind's
`build`): the `Prepared` every (learning rate, seed) run of a sweep shares.
"""

import dataclasses
from typing import Any

import jax
import ml_collections

from bert_jax import errors
from bert_jax.finetune.features import buckets as buckets_lib
from bert_jax.finetune.features import tokenization
from bert_jax.finetune.kinds import registry
from bert_jax.finetune.kinds import task_kind
from bert_jax.model import encoder as model_lib
from bert_jax.training import sharding
from host import fields
from host import paths

_VOCAB_CHANGE_FIX = "set config.allow_vocab_change=True if the change is intended"


# The domain of each fine-tuning field checked here, declared once as data (host/fields.py):
# a field's domain is a row, its refusal worded like every other's (`says` keeps the words
# these refusals have always had). What depends on the mesh, the process count or another
# field is code in check_config, right after.
RULES = {
    "num_epochs": fields.greater_than(0),
    "warmup_fraction": fields.in_range(0, 1, "[)", says="not in [0, 1)"),
    "grad_accum_steps": fields.at_least(1),
    "max_seq_length": fields.at_least(8, says="is too short"),
    "bucket_window_batches": fields.at_least(1),
    "loss_normalizer": fields.one_of(("batch", "train_mean"),
                                     says="must be 'batch' or 'train_mean'"),
}


def check_config(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
  """Refuses, before reading data or compiling, a config that cannot run."""
  fields.check(config, RULES, prefix="config.")
  dp = sharding.data_parallel_size(mesh)
  for name in ("batch_size", "eval_batch_size"):
    size = config[name]
    per = dp * (config.grad_accum_steps if name == "batch_size" else 1)
    if size <= 0 or size % per or size % jax.process_count():
      raise ValueError(f"config.{name}={size} must be a positive multiple of the data-parallel "
                       f"size {dp}" + (f" x grad_accum_steps {config.grad_accum_steps}"
                                       if name == "batch_size" else "")
                       + f" and divide over {jax.process_count()} processes")
  buckets_lib.bucket_lengths(config.max_seq_length, config.bucket_multiple, config.padding)
  if config.padding == "packed" and config.group_by_length:
    # Grouping would change what a batch holds; packing keeps fixed padding's batches.
    raise ValueError("config.group_by_length=True regroups batches, which config.padding="
                     "'packed' (the default) keeps as fixed padding's; add "
                     "--config.padding=buckets to group by length")
  if config.padding == "packed" and dp % jax.process_count():
    # Each process fills the rows of its own devices (features/packed.py).
    raise ValueError(f"config.padding='packed' needs the data-parallel size {dp} to be a "
                     f"multiple of the {jax.process_count()} processes; use padding "
                     "'buckets' with this mesh")
  if not config.init_checkpoint and not (config.vocab_file or config.spm_model_file):
    raise ValueError("fine-tuning from random initialisation needs config.vocab_file "
                     "(or spm_model_file); with config.init_checkpoint it comes from the "
                     "checkpoint")
  if config.init_checkpoint and not paths.exists(config.init_checkpoint):
    raise ValueError(f"config.init_checkpoint={config.init_checkpoint!r} does not exist")


@dataclasses.dataclass
class Prepared:
  """What every (learning rate, seed) run of a config shares: read and featurised once."""
  tokenizer: tokenization.WordTokenizer
  bert_config: model_lib.BertConfig
  loaded: tuple | None   # convert.load_for_finetuning's result, None for a random start
  task: task_kind.Task
  spm_model_file: str  # the SentencePiece model it tokenizes with (config's or checkpoint's), or ""
  # Compiled programs shared by the sweep's runs (steps.build), by what they depend on.
  programs: dict = dataclasses.field(default_factory=dict)


def check_vocab(config: ml_collections.ConfigDict, own_vocab: Any, own_spm: Any = None) -> None:
  """Refuses a config.vocab_file or config.spm_model_file that is not what the checkpoint
  was trained with (`own_vocab`, the vocab.txt beside it; `own_spm`, its spm.model; our
  workdirs and exports keep theirs there), or is a tokenizer of the other kind: the same
  ids would mean other words. config.allow_vocab_change=True says it is intended (the
  run's record keeps that field and the hash of the tokenizer it ran with)."""
  if config.allow_vocab_change:
    return
  for field, own, other in (("vocab_file", own_vocab, own_spm),
                            ("spm_model_file", own_spm, own_vocab)):
    if config[field] and own is None and other is not None:
      raise errors.UsageError(
          f"config.{field}={config[field]!r} is another kind of tokenizer than "
          f"config.init_checkpoint={config.init_checkpoint!r} was trained with ({other}); "
          f"drop config.{field} to use the checkpoint's, or {_VOCAB_CHANGE_FIX}")
  if config.spm_model_file and own_spm is not None:
    _check_spm(config, own_spm)
  if not config.vocab_file or own_vocab is None:
    return
  if not paths.exists(config.vocab_file):
    raise errors.UsageError(f"config.vocab_file={config.vocab_file!r} does not exist")
  ours = paths.read_text(config.vocab_file).splitlines()
  theirs = paths.read_text(str(own_vocab)).splitlines()
  if ours != theirs:
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                 min(len(ours), len(theirs)))
    raise errors.UsageError(
        f"config.vocab_file={config.vocab_file!r} is not the vocabulary of "
        f"config.init_checkpoint={config.init_checkpoint!r} ({own_vocab}): {len(ours)} vs "
        f"{len(theirs)} entries, first difference at id {first}; drop config.vocab_file to "
        f"use the checkpoint's, or {_VOCAB_CHANGE_FIX}")


def _check_spm(config: ml_collections.ConfigDict, own_spm: Any) -> None:
  """check_vocab for SentencePiece: the same model file, byte for byte (its pieces, scores
  and normalisation all decide the ids); the refusal says where the pieces differ."""
  import sentencepiece  # pylint: disable=g-import-not-at-top  # only to name the difference
  if not paths.exists(config.spm_model_file):
    raise errors.UsageError(f"config.spm_model_file={config.spm_model_file!r} does not exist")
  ours, theirs = paths.read_bytes(config.spm_model_file), paths.read_bytes(str(own_spm))
  if ours == theirs:
    return
  pieces = []
  for proto in (ours, theirs):
    processor = sentencepiece.SentencePieceProcessor()
    try:
      processor.LoadFromSerializedProto(proto)
    except Exception:  # pylint: disable=broad-except  # a bare RuntimeError: not a model
      pieces.append(None)
      continue
    pieces.append([processor.IdToPiece(i) for i in range(processor.GetPieceSize())])
  if None in pieces:
    how = "is not a SentencePiece model" if pieces[0] is None else "differs"
  elif pieces[0] == pieces[1]:
    how = f"has the same {len(pieces[0])} pieces but other scores or normalisation"
  else:
    first = next((i for i, (a, b) in enumerate(zip(*pieces)) if a != b),
                 min(map(len, pieces)))
    how = (f"differs: {len(pieces[0])} vs {len(pieces[1])} pieces, first difference at "
           f"id {first}")
  raise errors.UsageError(
      f"config.spm_model_file={config.spm_model_file!r} is not the SentencePiece model of "
      f"config.init_checkpoint={config.init_checkpoint!r} ({own_spm}): it {how}; drop "
      f"config.spm_model_file to use the checkpoint's, or {_VOCAB_CHANGE_FIX}")


def prepare(config: ml_collections.ConfigDict) -> Prepared:
  """Reads the checkpoint (if any) and its vocabulary, then the task data into features."""
  kind = registry.get_kind(config.task.kind)  # an unknown kind fails before any reading
  loaded = None
  spm_model_file = config.spm_model_file
  if config.init_checkpoint:
    from bert_jax import convert  # pylint: disable=g-import-not-at-top  # only needed here
    loaded = convert.load_for_finetuning(
        config.init_checkpoint, task_heads=(kind.head_name,),
        vocab_file=config.vocab_file or None)
    loaded_config, _, _, vocab_path = loaded
    own_vocab = convert.checkpoint_vocab(config.init_checkpoint)
    own_spm = convert.checkpoint_spm(config.init_checkpoint)
    check_vocab(config, own_vocab, own_spm)
    if not (config.vocab_file or spm_model_file) and own_vocab is None and own_spm is not None:
      spm_model_file = str(own_spm)  # a SentencePiece checkpoint's own, as vocab.txt is used
    if vocab_path is None and not spm_model_file:
      raise ValueError(f"{config.init_checkpoint} has no vocab.txt or spm.model; give "
                       "config.vocab_file (or config.spm_model_file)")
    tokenizer = tokenization.load_word_tokenizer(
        "" if spm_model_file else str(vocab_path), spm_model_file, config.do_lower_case)
    bert_config = loaded_config.replace(**config.model.to_dict())
  else:
    tokenizer = tokenization.load_word_tokenizer(config.vocab_file, config.spm_model_file,
                                                 config.do_lower_case)
    bert_config = model_lib.BertConfig.from_size(
        config.model_size, vocab_size=len(tokenizer.vocab), **config.model.to_dict())
  if len(tokenizer.vocab) > bert_config.vocab_size:
    raise ValueError(f"the vocabulary has {len(tokenizer.vocab)} entries but the model "
                     f"only {bert_config.vocab_size} embeddings")
  if config.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"config.max_seq_length={config.max_seq_length} exceeds the model's "
                     f"max_position_embeddings={bert_config.max_position_embeddings}")
  task = kind.build(config.task, bert_config, tokenizer, config.max_seq_length)
  return Prepared(tokenizer, bert_config, loaded, task, spm_model_file)
