"""A pretraining run's data, prepared once: `PretrainingData.prepare(config.data, ...)`.

The pretraining trainer talks to its data through this one object, as the
fine-tuning trainer talks to its `Prepared` task. It is made once, right after
the whole config has been judged without data (specs.py and the trainer's own
checks), and before anything is written; it owns, as fields:

- the vocabulary and the tokenizer (for the embedded corpus, the vocabulary is
  trained on first use and cached on disk: tokenized_corpus.resolve_vocab);
- the corpus fingerprint a workdir records (corpora.fingerprint);
- the tokenized corpus -- this process's training documents and the held-out
  set -- read, checked and kept, so inputs and eval sets built later, for either
  phase, read nothing again; and the eval sets it has built.

The tokenized corpus comes from the corpus's tokenized store (token_store.py;
data.tokenized_dir, "" -> $BERT_JAX_CACHE/tokenized), tokenized into it on the
first start (prepare_corpus.prepare_store: over this host's cores, each host its
share of the shards) and read in seconds at every later one; both phases, every
split and every run on the same corpus and vocabulary share it. Its selections
are the very documents the in-memory path (data.tokenized_dir="none",
tokenized_corpus.read_tokenized_corpus) tokenizes, so the batches do not depend
on it. A damaged shard is rebuilt, never trained on.

Everything a refusal needs is read in `prepare`, so a corpus that cannot train
(no file, undecodable files, no 2-sentence document, an empty held-out split)
is refused there, before the workdir is touched.

Phases: the run's phases come from the caller (bert_jax.pretrain.phases, the one
rule for which phase a step is in), each with its first step, its number and its
data config; an input or eval set is asked for a given phase. A later phase's
stream starts at its own position 0, mid-schedule.
"""

import dataclasses
import logging
from typing import Any, Sequence

from data_pipeline.sources import corpora
from data_pipeline.store import prepare_corpus
from data_pipeline.examples import pretraining
from data_pipeline import specs
from data_pipeline.store import token_store
from data_pipeline.store import tokenized_corpus

EVAL_KINDS = ("eval", "eval_own")  # fixed 15% held-out masks; the same pairs masked like training


# A run's phase and the one-phase run (defined with the data configs they carry).
Phase = specs.Phase
one_phase = specs.one_phase


@dataclasses.dataclass
class PretrainingData:
  """The data of one pretraining run on one process (see the module docstring).

  Attributes:
    phases: {phase number: Phase} of the run's phases (those with steps).
    total_steps: the run's length, over which a masking schedule runs.
    batch_size, eval_batch_size: per process (the global sizes / process_count).
    process_index, process_count: this process's share of the training documents.
    tokenizer: the in-graph tokenizer (tokenizers.py) of the run's vocabulary.
    vocab_file, spm_model_file: the vocabulary it was built from ("" for the other).
    fingerprint: what the corpus is (corpora.fingerprint), for the workdir record.
    tokenized: the tokenized corpus parts read so far (tokenized_corpus.corpus_key -> corpus).
    eval_sets: the held-out sets built so far ((phase, kind) -> this process's batches).
  """
  phases: dict[int, Phase]
  total_steps: int
  batch_size: int
  eval_batch_size: int
  process_index: int
  process_count: int
  tokenizer: Any
  vocab_file: str
  spm_model_file: str
  fingerprint: dict
  tokenized: dict[tuple, tokenized_corpus.TokenizedCorpus] = dataclasses.field(default_factory=dict)
  eval_sets: dict[tuple[int, str], list[dict]] = dataclasses.field(default_factory=dict)

  @classmethod
  def prepare(cls, phases: Sequence[Phase], process_index: int = 0, process_count: int = 1, *,
              batch_size: int, eval_batch_size: int, total_steps: int) -> "PretrainingData":
    """Resolves the vocabulary, reads and checks every phase's data; ValueError on bad data.

    Args:
      phases: the run's phases with steps, in order (bert_jax.pretrain.phases.of, or
        one_phase); the first one's vocabulary and corpus are the run's.
      process_index, process_count: this process and how many share the run.
      batch_size, eval_batch_size: global batch sizes (divisible by process_count).
      total_steps: the run's length.
    """
    for phase in phases:
      specs.check_data_config(phase.data)
    data_config = phases[0].data
    vocab_file, spm_model_file = tokenized_corpus.resolve_vocab(data_config)
    data = cls(
        phases={phase.index: phase for phase in phases}, total_steps=total_steps,
        batch_size=batch_size // process_count,
        eval_batch_size=eval_batch_size // process_count, process_index=process_index,
        process_count=process_count, tokenizer=tokenized_corpus.load_tokenizer(data_config),
        vocab_file=vocab_file, spm_model_file=spm_model_file,
        fingerprint=corpora.fingerprint(data_config.corpus,
                                        embedded_cache_dir=data_config.embedded_cache_dir,
                                        tfds_data_dir=data_config.tfds_data_dir))
    for phase in phases:
      data.check_corpus(phase.index)
    return data

  @property
  def vocab_size(self) -> int:
    """Entries of the vocabulary (the model's true vocab_size)."""
    return len(self.tokenizer.vocab)

  def _phase(self, index: int | None) -> Phase:
    """Phase `index`, the first phase for None."""
    return self.phases[min(self.phases) if index is None else index]

  def max_predictions(self, phase: int | None = None) -> int:
    """Static size of a phase's masked_lm_* features (the first phase's by default)."""
    return specs.max_predictions(self._phase(phase).data)

  def masking_spec(self, phase: int | None = None):
    """A phase's training MaskingSpec (its ratio schedule runs over the whole run)."""
    return specs.masking_spec(self._phase(phase).data)

  def check_corpus(self, phase: int | None = None) -> None:
    """Refuses (ValueError naming the corpus and what to do) data a phase cannot train or
    evaluate on: a glob matching nothing, unreadable or undecodable files (corpora.py),
    no document with the 2 sentences NSP/SOP pairs need, an empty held-out split. What it
    reads is kept for the inputs and eval sets."""
    config = self._phase(phase).data
    for split in ("train", "eval"):
      tokenized_corpus.check_pairs(config, self._corpus(config, split), split)

  def train_input(self, phase: int | None = None,
                  state: dict | None = None) -> pretraining.PretrainingInput:
    """This process's training input for phase `phase` (the first by default), at its batch
    size, at the position `state` (a checkpoint's {"phase", "input"}) when it is of that
    phase, or with {"continue": True} that of the phase before (which read the same data),
    else at the phase's start."""
    found = self._phase(phase)
    # A masking schedule runs over the whole run; a later phase's stream starts mid-schedule.
    batch_size = found.batch_size // self.process_count if found.batch_size else self.batch_size
    source = pretraining.PretrainingInput(
        found.data, batch_size=batch_size, process_index=self.process_index,
        process_count=self.process_count, split="train", first_step=found.start,
        schedule_steps=self.total_steps, tokenizer=self.tokenizer,
        corpus=self._corpus(found.data, "train"))
    if state is not None and state.get("phase") == found.index:
      source.set_state(state["input"])
    elif state is not None and state.get("continue"):
      # The phase reads on from another phase's stream (the same data at another batch
      # size: bert_jax.pretrain.phases.continues); its examples count from its own start.
      source.set_state({**state["input"], "example": 0})
    return source

  def eval_batches(self, kind: str = "eval", phase: int | None = None) -> list[dict]:
    """This process's slice of the fixed held-out set of a phase, built once: `kind` "eval"
    masks at eval.masking_ratio with BERT's knobs, "eval_own" like training."""
    if kind not in EVAL_KINDS:
      raise ValueError(f"eval kind must be one of {EVAL_KINDS}, got {kind!r}")
    phase = self._phase(phase).index
    if (phase, kind) not in self.eval_sets:
      config = self.phases[phase].data
      self.eval_sets[phase, kind] = pretraining.make_eval_batches(
          config, batch_size=self.eval_batch_size, process_index=self.process_index,
          process_count=self.process_count, own_masking=kind == "eval_own",
          tokenizer=self.tokenizer, corpus=self._corpus(config, "eval"))
    return self.eval_sets[phase, kind]

  def _corpus(self, config, split: str) -> tokenized_corpus.TokenizedCorpus:
    """This process's tokenized training documents, or the whole held-out set (every
    process builds the same one), read once."""
    index, count, limit = ((self.process_index, self.process_count, 0) if split == "train"
                           else (0, 1, config.eval.max_documents))
    key = tokenized_corpus.corpus_key(config, self.tokenizer, split=split, process_index=index,
                                      process_count=count, max_documents=limit)
    if key not in self.tokenized:
      if config.tokenized_dir == token_store.NONE:
        self.tokenized[key] = tokenized_corpus.read_tokenized_corpus(
            config, self.tokenizer, split=split, process_index=index, process_count=count,
            max_documents=limit)
      else:
        self.tokenized[key] = self._stored(config, split, index, count, limit)
    return self.tokenized[key]

  def _stored(self, config, split: str, index: int, count: int,
              limit: int) -> tokenized_corpus.TokenizedCorpus:
    """A split's documents from the store (made first when absent); when a shard is found
    damaged, every shard is read whole, the damaged ones rebuilt, and the split read again."""
    try:
      return self._select(config, split, index, count, limit, check_shards=False)
    except token_store.ShardError as e:
      logging.warning("%s: reading every shard of the store whole to rebuild the damaged", e)
    return self._select(config, split, index, count, limit, check_shards=True)

  def _select(self, config, split, index, count, limit, *, check_shards):
    store = prepare_corpus.prepare_store(
        config, vocab_file=self.vocab_file, spm_model_file=self.spm_model_file,
        process_index=self.process_index, process_count=self.process_count,
        num_workers=config.prepare_workers, tokenizer=self.tokenizer, check_shards=check_shards)
    return prepare_corpus.read_selection(store, config, split=split, process_index=index,
                                         process_count=count, max_documents=limit)
