"""Pretraining batches made on the fly: documents -> sentence pairs -> masking -> batches.

Stages, and where each runs:
1. This process's documents, tokenized once into flat id arrays
   (tokenized_corpus.py; data_pipeline.prepare.PretrainingData holds a run's).
2. Build sentence pairs (pairs.py: NSP / SOP / RoBERTa packing) in a Python
   generator feeding ``tf.data.Dataset.from_generator``. Pair building needs
   random access to *other* documents (NSP's random B) and data-dependent
   loops over sentence lengths, which are exact and simple in numpy and awkward
   as graph ops; it is cheap next to masking (see the benchmark). The generator
   yields whole blocks of padded examples, so the Python <-> TF crossing is paid
   per block, not per example.
3. Mask each example in-graph (masking.py ``mask_tokens``) in a parallel,
   order-preserving ``map``, with the stateless seed
   ``example_seed(seed, epoch, index in epoch)``. Whole-word and span masking
   read each example's word starts: the "##" rule of the vocabulary, or with
   data.masking.word_segmentation the segmentation's, which ride from
   tokenization to here inside the ids (tokenized_corpus.WORD_START) and are taken off
   after assembly, so the ids, pairs and fingerprints are those of the "##" rule.
4. Batch per host (``batch_size`` = global batch / process count), prefetch.

Masking-ratio schedules (masking.py ``MaskingSpec.ratio_at``): every example
carries the ratio of the training step its batch belongs to, step =
``first_step`` + (examples the stream produced before it) // ``batch_size``,
so the ratio is a pure function of the position like everything else.

What a step read, independently of its masks: each batch's unmasked ids,
segment ids and NSP labels are hashed before masking (``batch_fingerprint``);
``PretrainingInput.last_fingerprint`` is that of the batch last returned. The
trainer logs it per step, and experiments/ablation/ refuses to compare runs
whose fingerprints differ.

Order and randomness: epoch e visits this process's documents in the order
``permutation(rng(seed, e))``, cut into blocks of ``shuffle_buffer``
documents (filled packing: spans of ``shuffle_buffer`` rows' tokens); a
block's examples are shuffled by ``rng(seed, e, block)``; the pairs of document d use ``rng(seed, e, d)``. Nothing of this depends on the
masking configuration, so runs that differ only in masking see exactly the same
pairs in the same order (and the same mask seeds), and every epoch has new
pairs. The block shuffle replaces a tf.data shuffle buffer because it is a pure
function of (seed, epoch, block).

Exact resume: the stream is a pure function of (corpus, seed, position), and
every example carries its position (epoch, block, offset in block, index in
epoch) through the pipeline, so ``get_state()`` after a batch is exactly the
position after its last example, however much was prefetched. ``set_state``
restarts the generator at that block and skips ``offset`` examples of it --
before tokenization-free pair assembly and before masking, so a restore costs
one block of pair building, not a replay of the epoch. The state is tied to
the corpus and the pair settings (a fingerprint); a change of
max_seq_length (phase 2) starts a new stream at its own position 0.

What a data config asks for, judged without data (validation, masking specs,
max predictions), is specs.py.
"""

import atexit
import functools
import hashlib
import json
import threading
from typing import Iterator
import weakref

import numpy as np
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

from data_pipeline.examples import documents
from data_pipeline.examples import masking
from data_pipeline.examples import masking_spec
from data_pipeline.examples import pairs
from data_pipeline import specs
from data_pipeline.store import tokenized_corpus

_POSITION = "position"  # per-example (epoch, block, offset, index, example); stripped from batches
_RATIO = "mask_ratio"  # per-example masking ratio (float64), consumed by the masking map
_UNMASKED = "unmasked_ids"  # input ids before masking; hashed into last_fingerprint, then dropped
# [T] bool per example: word starts for whole-word/span masking, from the corpus's segmentation
# or else the "##" rule; consumed by the masking map, never fingerprinted.
_WORD_STARTS = "word_starts"


def batch_fingerprint(input_ids: np.ndarray, segment_ids: np.ndarray,
                      next_sentence_labels: np.ndarray) -> str:
  """16 hex digits identifying a batch's unmasked content (ids, segments, NSP labels, order)."""
  digest = hashlib.blake2b(digest_size=8)
  for array in (input_ids, segment_ids, next_sentence_labels):
    array = np.ascontiguousarray(array, np.int32)
    digest.update(repr(array.shape).encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


# --------------------------------------------------------------------------
# Tokenizer facts and the example stream (pure function of corpus, seed and position).
# --------------------------------------------------------------------------


class ExampleStream:
  """Unmasked examples of one process, in blocks, from a given position on."""

  def __init__(self, corpus: tokenized_corpus.TokenizedCorpus, *, objective: str, max_seq_length: int,
               short_seq_prob: float, seed: int, shuffle_buffer: int, special_ids: dict,
               pack_window: int = 0, pack_fill: bool = False):
    self.corpus, self.objective = corpus, objective
    self.max_seq_length, self.short_seq_prob = max_seq_length, short_seq_prob
    self.seed, self.shuffle_buffer, self.special_ids = seed, shuffle_buffer, special_ids
    self.pack_window = pack_window  # objective "documents": rows open for best fit
    # Objective "documents" with every row filled: blocks are spans of shuffle_buffer
    # rows' tokens of the epoch's stream, not shuffle_buffer documents (documents.py).
    self.filled = objective == "documents" and pack_fill
    self._epoch = None  # (epoch, its order, its stream's ends): _epoch_order
    sentences_per_doc = np.diff(corpus.document_starts)
    if objective in specs.PAIR_OBJECTIVES and not (sentences_per_doc >= 2).any():
      raise ValueError(f"objective {objective!r} needs documents of >= 2 sentences; "
                       "this corpus part has none")
    if corpus.num_documents < 1:
      raise ValueError("the corpus part has no non-empty document")

  def num_blocks(self) -> int:
    """Blocks per epoch."""
    if self.filled:
      return -(-self._stream_tokens // self._block_tokens())
    return -(-self.corpus.num_documents // self.shuffle_buffer)

  def _block_tokens(self) -> int:
    return self.shuffle_buffer * self.max_seq_length

  @functools.cached_property
  def _stream_tokens(self) -> int:
    """Tokens of one epoch's stream of [CLS] doc [SEP] (the same in every order)."""
    return int(documents.stream_costs(self.corpus, np.arange(self.corpus.num_documents)).sum())

  def _epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(the epoch's document order, its stream's cumulative costs when filled), kept for
    the last epoch asked: both are O(documents) and every block of the epoch needs them."""
    if self._epoch is None or self._epoch[0] != epoch:
      order = pairs.rng_for(self.seed, epoch, 0).permutation(self.corpus.num_documents)
      ends = np.cumsum(documents.stream_costs(self.corpus, order)) if self.filled else None
      self._epoch = (epoch, order, ends)
    return self._epoch[1], self._epoch[2]

  def block_instances(self, epoch: int, block: int) -> list:
    """The examples of one block (pairs.Instance, or documents.Row), shuffled."""
    order, ends = self._epoch_order(epoch)
    docs = order[block * self.shuffle_buffer:(block + 1) * self.shuffle_buffer]
    if self.filled:
      span = (block * self._block_tokens(), (block + 1) * self._block_tokens())
      pieces = documents.block_pieces(self.corpus, order, span, cls_id=self.special_ids["cls"],
                                      sep_id=self.special_ids["sep"], ends=ends)
      instances = documents.filled_rows(pieces, max_seq_length=self.max_seq_length,
                                        window=self.pack_window)
    elif self.objective == "documents":
      instances = documents.packed_rows(self.corpus, docs, max_seq_length=self.max_seq_length,
                                        window=self.pack_window)
    elif self.objective == "none":
      instances = pairs.packed_instances(self.corpus, docs, max_seq_length=self.max_seq_length,
                                         sep_id=self.special_ids["sep"])
    else:
      instances = []
      for doc in docs:
        instances.extend(pairs.pair_instances(
            self.corpus, int(doc), objective=self.objective, max_seq_length=self.max_seq_length,
            short_seq_prob=self.short_seq_prob, rng=pairs.rng_for(self.seed, epoch, 1, doc)))
    shuffle = pairs.rng_for(self.seed, epoch, 2, block).permutation(len(instances))
    if self.filled and instances and instances[-1].used < self.max_seq_length:
      # The epoch's one row with room (filled_rows puts it last) stays last: the epoch's
      # only padding is then the tail of its last sequence.
      last = len(instances) - 1
      return [instances[i] for i in shuffle if i != last] + [instances[last]]
    return [instances[i] for i in shuffle]

  def blocks(self, epoch=0, block=0, offset=0, index=0, example=0) -> Iterator[dict]:
    """Padded example arrays per block, starting at a position; endless (epoch after epoch).

    `example` counts the examples produced before the position since the stream's
    start, across epochs (masking schedules derive the training step from it).
    """
    while True:
      produced = 0
      for b in range(block, self.num_blocks()):
        instances = self.block_instances(epoch, b)[offset:]
        if instances:
          if self.objective == "documents":
            assemble = functools.partial(documents.assemble, wrapped=not self.filled)
          else:
            assemble = pairs.assemble
          arrays = assemble(instances, max_seq_length=self.max_seq_length,
                            cls_id=self.special_ids["cls"], sep_id=self.special_ids["sep"],
                            pad_id=self.special_ids["pad"])
          if self.corpus.word_starts:  # the segmentation's word starts ride in the ids
            ids = arrays["input_ids"]
            arrays["input_ids"] = ids & ~tokenized_corpus.WORD_START
            arrays[_WORD_STARTS] = ((ids & tokenized_corpus.WORD_START) != 0) | np.isin(
                arrays["input_ids"], list(self.special_ids.values()))
          n = len(instances)
          arrays[_POSITION] = np.stack([np.full([n], epoch), np.full([n], b),
                                        offset + np.arange(n), index + np.arange(n),
                                        example + np.arange(n)], 1)
          index += n
          example += n
          produced += n
          yield arrays
        offset = 0
      if not produced and block == 0:
        raise ValueError(f"epoch {epoch} produced no example")  # degenerate corpus
      epoch, block, index = epoch + 1, 0, 0


# --------------------------------------------------------------------------
# tf.data pipeline, training iterator and eval set.
# --------------------------------------------------------------------------


def _masked_dataset(stream: ExampleStream, start: dict, spec: masking_spec.MaskingSpec, *,
                    tokenizer, seed: int, batch_size: int, prefetch: int,
                    stop: threading.Event | None = None, first_step: int = 0,
                    schedule_steps: int = 0) -> tf.data.Dataset:
  """from_generator(stream) -> per-example in-graph masking -> batches (with positions).

  Examples are masked at the ratio of their batch's training step (first_step +
  example count // batch_size) of `schedule_steps`. Batches keep the unmasked
  ids under _UNMASKED. Setting `stop` ends the generator at its next block, so
  the dataset runs out (see PretrainingInput.close for why that matters).
  """
  t = stream.max_seq_length
  signature = {"input_ids": tf.TensorSpec([None, t], tf.int32),
               "segment_ids": tf.TensorSpec([None, t], tf.int32),
               "next_sentence_labels": tf.TensorSpec([None], tf.int32),
               _POSITION: tf.TensorSpec([None, 5], tf.int64),
               _RATIO: tf.TensorSpec([None], tf.float64),
               _WORD_STARTS: tf.TensorSpec([None, t], tf.bool)}
  # Packed documents: which document each token is in, its position within it.
  packed = ((documents.DOCUMENT_IDS, documents.POSITION_IDS) if stream.objective == "documents"
            else ())
  signature.update({name: tf.TensorSpec([None, t], tf.int32) for name in packed})
  start_table = tokenized_corpus.word_start_table(tokenizer)

  def blocks():
    for block in stream.blocks(**start):
      if stop is not None and stop.is_set():
        return
      if _WORD_STARTS not in block:  # no segmentation: the "##" rule
        block[_WORD_STARTS] = start_table[block["input_ids"]]
      steps = first_step + block[_POSITION][:, 4] // batch_size
      # ratio_at itself (Python floats) once per step of the block: the one definition.
      unique, inverse = np.unique(steps, return_inverse=True)
      block[_RATIO] = np.array([spec.ratio_at(int(s), schedule_steps) for s in unique],
                               np.float64)[inverse.reshape(-1)]
      yield block

  ds = tf.data.Dataset.from_generator(blocks, output_signature=signature)
  ds = ds.unbatch()
  specials = tokenizer.special_ids
  num_predictions = spec.max_predictions(t)

  def mask(example):
    ids = example["input_ids"]
    input_mask = ids != specials["pad"]  # literal specials were removed from the text
    maskable = input_mask & (ids != specials["cls"]) & (ids != specials["sep"])
    position = example[_POSITION]
    masked = masking.mask_tokens(
        ids, maskable, example[_WORD_STARTS], masking.example_seed(seed, position[0], position[3]),
        spec, mask_id=specials["mask"], vocab_size=tokenizer.vocab_size,
        special_ids=list(specials.values()), max_predictions=num_predictions,
        ratio=example[_RATIO])
    return {"input_ids": masked["input_ids"], "input_mask": tf.cast(input_mask, tf.int32),
            "segment_ids": example["segment_ids"],
            "masked_lm_positions": masked["masked_lm_positions"],
            "masked_lm_ids": masked["masked_lm_ids"],
            "masked_lm_weights": masked["masked_lm_weights"],
            "next_sentence_labels": example["next_sentence_labels"], _POSITION: position,
            _UNMASKED: ids, **{name: example[name] for name in packed}}

  ds = ds.map(mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.batch(batch_size, drop_remainder=True).prefetch(prefetch)


class PretrainingInput:
  """Endless iterator of this host's numpy pretraining batches, with exact resume.

  Yields dicts with input_ids, input_mask, segment_ids [B, T] int32,
  masked_lm_positions, masked_lm_ids [B, P] int32, masked_lm_weights [B, P]
  float32 and next_sentence_labels [B] int32, B = ``batch_size`` (per host);
  ``last_fingerprint`` identifies the unmasked content of the last one.

  A masking schedule runs over ``schedule_steps`` (the run's total_steps); the
  stream's first batch is training step ``first_step`` (phase 2 starts a new
  stream mid-run).

  ``tokenizer`` and ``corpus`` (this process's tokenized ``split``) are those a
  PretrainingData holds; without them the input loads its own (tests, preview).
  """

  def __init__(self, data_config, *, batch_size: int, process_index: int = 0,
               process_count: int = 1, split: str = "train", first_step: int = 0,
               schedule_steps: int = 0, tokenizer=None,
               corpus: tokenized_corpus.TokenizedCorpus | None = None):
    specs.validate(data_config)
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    self.config, self.batch_size = data_config, batch_size
    self.spec = specs.masking_spec(data_config)
    self.spec.ratio_at(first_step, schedule_steps)  # a schedule without its length fails now
    self.first_step, self.schedule_steps = first_step, schedule_steps
    self.last_fingerprint = ""  # batch_fingerprint of the batch last returned
    self.tokenizer = (tokenizer if tokenizer is not None
                      else tokenized_corpus.load_tokenizer(data_config))
    if corpus is None:
      corpus = tokenized_corpus.read_tokenized_corpus(
          data_config, self.tokenizer, split=split, process_index=process_index,
          process_count=process_count)
    self.stream = ExampleStream(
        corpus, objective=data_config.objective, max_seq_length=data_config.max_seq_length,
        short_seq_prob=data_config.short_seq_prob, seed=data_config.seed,
        shuffle_buffer=data_config.shuffle_buffer, special_ids=self.tokenizer.special_ids,
        pack_window=data_config.get("pack_window", 0),
        pack_fill=data_config.get("pack_fill", False))
    fields = [data_config.corpus, split, process_index, process_count, corpus.num_documents,
              corpus.num_tokens, data_config.objective, data_config.max_seq_length,
              data_config.short_seq_prob, data_config.seed, data_config.shuffle_buffer]
    if data_config.objective == "documents":  # (the other objectives' fingerprints as before)
      fields.append(data_config.pack_window)
      if data_config.get("pack_fill", False):  # (unfilled packing's fingerprints as before)
        fields.append("filled")
    self._fingerprint = hashlib.md5(json.dumps(fields).encode()).hexdigest()[:16]
    self._position = {"epoch": 0, "block": 0, "offset": 0, "index": 0, "example": 0}
    self._iterator = None
    self._stop = threading.Event()
    # Drained before the interpreter tears TF down (see close); a weak reference, so
    # an input let go is not kept alive until exit.
    atexit.register(_close_if_alive, weakref.ref(self))

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._iterator is None:
      self._stop = threading.Event()
      self._iterator = _masked_dataset(
          self.stream, dict(self._position), self.spec, tokenizer=self.tokenizer,
          seed=self.config.seed, batch_size=self.batch_size,
          prefetch=self.config.prefetch_batches, stop=self._stop, first_step=self.first_step,
          schedule_steps=self.schedule_steps).as_numpy_iterator()
    batch = next(self._iterator)
    epoch, block, offset, index, example = (int(v) for v in batch.pop(_POSITION)[-1])
    self._position = {"epoch": epoch, "block": block, "offset": offset + 1, "index": index + 1,
                      "example": example + 1}
    self.last_fingerprint = batch_fingerprint(batch.pop(_UNMASKED), batch["segment_ids"],
                                              batch["next_sentence_labels"])
    return batch

  def get_state(self) -> dict:
    """JSON-serialisable position after the last batch returned (plus a corpus fingerprint)."""
    return {**self._position, "fingerprint": self._fingerprint}

  def set_state(self, state: dict) -> None:
    """Continues from ``state`` (from get_state): the next batches are exactly those that followed it.

    Raises:
      ValueError: the state is malformed or belongs to another corpus/config
        (a different fingerprint), where an exact resume is impossible.
    """
    try:
      position = {k: int(state[k]) for k in ("epoch", "block", "offset", "index")}
      # States saved before schedules existed lack the count; only a schedule needs it.
      position["example"] = int(state["example"] if "example" in state or
                                self.spec.schedule != "constant" else 0)
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"malformed pipeline state {state!r}: {e!r}") from None
    if state.get("fingerprint") != self._fingerprint:
      raise ValueError(
          f"pipeline state fingerprint {state.get('fingerprint')!r} does not match this "
          f"pipeline's {self._fingerprint!r}: corpus, seed, objective, max_seq_length, "
          "shuffle_buffer or process layout changed, so an exact resume is impossible")
    self.close()
    self._position = position

  def close(self) -> None:
    """Stops the background pipeline; the position is kept (next() restarts from it).

    Dropping a running iterator can deadlock: its destructor waits, holding the
    GIL, for a tf.data worker that waits for the GIL to call the Python
    generator. So the generator is told to stop and the pipeline is drained
    (next() releases the GIL) before the iterator is let go. Called on
    set_state, by the trainer when it is done with an input, and at exit.
    """
    if self._iterator is None:
      return
    self._stop.set()
    for _ in self._iterator:  # at most the few batches already in flight
      pass
    self._iterator = None


def _close_if_alive(source: "weakref.ref[PretrainingInput]") -> None:
  """At exit: drains the pipeline of an input still alive."""
  source = source()
  if source is not None:
    source.close()


def make_eval_batches(data_config, *, batch_size: int, process_index: int = 0,
                      process_count: int = 1, own_masking: bool = False, tokenizer=None,
                      corpus: tokenized_corpus.TokenizedCorpus | None = None) -> list[dict]:
  """The fixed held-out eval set: this host's numpy batches, deterministic masks.

  The set is built identically on every host (the first eval.max_documents
  held-out documents of the whole corpus, pairs and masks from eval.seed, masks
  at eval.masking_ratio with default knobs), cut into global batches of
  ``batch_size * process_count`` examples; this host gets its slice of each.
  It therefore depends neither on the training masking config nor on the
  process count. `own_masking`: the same pairs masked with the training masking
  knobs at the ratio training ends at (specs.own_eval_masking_spec), for eval_own/*.
  ``tokenizer`` and ``corpus`` (the held-out documents) are a PretrainingData's,
  else loaded here.
  """
  specs.validate(data_config)
  global_batch = batch_size * process_count
  num_batches = data_config.eval.num_examples // global_batch
  if num_batches < 1:
    raise ValueError(f"data.eval.num_examples={data_config.eval.num_examples} is smaller "
                     f"than one global batch ({global_batch})")
  if tokenizer is None:
    tokenizer = tokenized_corpus.load_tokenizer(data_config)
  if corpus is None:
    corpus = tokenized_corpus.read_tokenized_corpus(
        data_config, tokenizer, split="eval", process_index=0, process_count=1,
        max_documents=data_config.eval.max_documents)
  stream = ExampleStream(
      corpus, objective=data_config.objective, max_seq_length=data_config.max_seq_length,
      short_seq_prob=data_config.short_seq_prob, seed=data_config.eval.seed,
      shuffle_buffer=data_config.shuffle_buffer, special_ids=tokenizer.special_ids,
      pack_window=data_config.get("pack_window", 0),
      pack_fill=data_config.get("pack_fill", False))
  spec = (specs.own_eval_masking_spec(data_config) if own_masking
          else specs.eval_masking_spec(data_config))
  ds = _masked_dataset(stream, {}, spec, tokenizer=tokenizer, seed=data_config.eval.seed,
                       batch_size=global_batch, prefetch=1)
  batches = []
  for batch in ds.take(num_batches).as_numpy_iterator():
    batch.pop(_POSITION)
    batch.pop(_UNMASKED)
    lo = process_index * batch_size
    batches.append({k: v[lo:lo + batch_size] for k, v in batch.items()})
  return batches
