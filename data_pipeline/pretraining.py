"""Pretraining batches made on the fly: documents -> sentence pairs -> masking -> batches.

Stages, and where each runs:
1. Read this process's documents (corpora.py) and tokenize every sentence once,
   in-graph (a batched tf.data map over the tokenizer ops of tokenizers.py),
   into flat id arrays kept in host memory (2 bytes per token for vocabularies
   < 65,536 ids). Tokenization is deterministic, so doing it once per process
   instead of once per epoch loses nothing; the result is memoised per process.
2. Build sentence pairs (pairs.py: NSP / SOP / RoBERTa packing) in a Python
   generator feeding ``tf.data.Dataset.from_generator``. Pair building needs
   random access to *other* documents (NSP's random B) and data-dependent
   loops over sentence lengths, which are exact and simple in numpy and awkward
   as graph ops; it is cheap next to masking (see the benchmark). The generator
   yields whole blocks of padded examples, so the Python <-> TF crossing is paid
   per block, not per example.
3. Mask each example in-graph (masking.py ``mask_tokens``) in a parallel,
   order-preserving ``map``, with the stateless seed
   ``example_seed(seed, epoch, index in epoch)``.
4. Batch per host (``batch_size`` = global batch / process count), prefetch.

Masking-ratio schedules (masking.py ``MaskingSpec.ratio_at``): every example
carries the ratio of the training step its batch belongs to, step =
``first_step`` + (examples the stream produced before it) // ``batch_size``,
so the ratio is a pure function of the position like everything else.

What a step read, independently of its masks: each batch's unmasked ids,
segment ids and NSP labels are hashed before masking (``batch_fingerprint``);
``PretrainingInput.last_fingerprint`` is that of the batch last returned. The
trainer logs it per step, and experiments/ablation.py refuses to compare runs
whose fingerprints differ.

Order and randomness: epoch e visits this process's documents in the order
``permutation(rng(seed, e))``, cut into blocks of ``shuffle_buffer``
documents; a block's examples are shuffled by ``rng(seed, e, block)``; the
pairs of document d use ``rng(seed, e, d)``. Nothing of this depends on the
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

Vocabulary: ``vocab_file`` (WordPiece) or ``spm_model_file``; with neither
and the embedded corpus, a WordPiece vocab of ``embedded_vocab_size`` is
learnt once from the embedded corpus (vocab_training.py) and cached beside it,
so the default job needs no download; other corpora require a vocab.
"""

import atexit
import collections
import hashlib
import itertools
import json
import logging
import os
import threading
from typing import Iterator
import weakref

import numpy as np
from data_pipeline.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

from bert_jax import paths
from data_pipeline import corpora
from data_pipeline import masking
from data_pipeline import pairs
from data_pipeline import tokenizers

OBJECTIVES = ("nsp", "sop", "none")
_POSITION = "position"  # per-example (epoch, block, offset, index, example); stripped from batches
_RATIO = "mask_ratio"  # per-example masking ratio (float64), consumed by the masking map
_UNMASKED = "unmasked_ids"  # input ids before masking; hashed into last_fingerprint, then dropped


def masking_spec(data_config) -> masking.MaskingSpec:
  """The training MaskingSpec of a data config (validated for its max_seq_length)."""
  return masking.MaskingSpec.from_config(data_config.masking, data_config.max_seq_length)


def eval_masking_spec(data_config) -> masking.MaskingSpec:
  """Eval masks: BERT's masking (masking.bert_masking) at eval.masking_ratio, whatever
  training uses, so they are identical across ablations."""
  spec = masking.bert_masking(data_config.eval.masking_ratio)
  spec.max_predictions(data_config.max_seq_length)  # validated like a training spec
  return spec


def own_eval_masking_spec(data_config) -> masking.MaskingSpec:
  """The run's own masking for eval_own/*: the training knobs at the ratio training ends at."""
  spec = masking_spec(data_config)
  return spec.at_ratio(spec.end_ratio)


def batch_fingerprint(input_ids: np.ndarray, segment_ids: np.ndarray,
                      next_sentence_labels: np.ndarray) -> str:
  """16 hex digits identifying a batch's unmasked content (ids, segments, NSP labels, order)."""
  digest = hashlib.blake2b(digest_size=8)
  for array in (input_ids, segment_ids, next_sentence_labels):
    array = np.ascontiguousarray(array, np.int32)
    digest.update(repr(array.shape).encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def max_predictions(data_config) -> int:
  """Static size of masked_lm_*: explicit max_predictions_per_seq or derived from the ratio."""
  return masking_spec(data_config).max_predictions(data_config.max_seq_length)


def check_data_config(data_config) -> None:
  """Every check the pipeline would make on this config, without reading data: ValueErrors
  naming the field (the trainer calls it for every phase before the first step)."""
  _validate(data_config)
  masking_spec(data_config)
  eval_masking_spec(data_config)


def _validate(data_config) -> None:
  """ValueErrors naming the field for settings the pipeline cannot honour."""
  if data_config.objective not in OBJECTIVES:
    raise ValueError(f"data.objective must be one of {OBJECTIVES}, got {data_config.objective!r}")
  if not 8 <= data_config.max_seq_length:
    raise ValueError(f"data.max_seq_length must be >= 8, got {data_config.max_seq_length}")
  if not 0.0 <= data_config.short_seq_prob <= 1.0:
    raise ValueError(f"data.short_seq_prob must be in [0, 1], got {data_config.short_seq_prob}")
  if data_config.shuffle_buffer < 1 or data_config.heldout_modulus < 2:
    raise ValueError("data.shuffle_buffer must be >= 1 and data.heldout_modulus >= 2, got "
                     f"{data_config.shuffle_buffer}, {data_config.heldout_modulus}")


# --------------------------------------------------------------------------
# Tokenizer and tokenized corpus.
# --------------------------------------------------------------------------


def resolve_vocab(data_config) -> tuple[str, str]:
  """(vocab_file, spm_model_file) to use; trains and caches a vocab for the embedded corpus."""
  if data_config.vocab_file or data_config.spm_model_file:
    return data_config.vocab_file, data_config.spm_model_file
  if data_config.corpus != "embedded":
    raise ValueError("data.vocab_file (or data.spm_model_file) is required for corpus "
                     f"{data_config.corpus!r}; only the embedded corpus has a default vocab")
  corpus = corpora.embedded_corpus_path(data_config.embedded_cache_dir or None)
  case = "uncased" if data_config.do_lower_case else "cased"
  lines = data_config.embedded_vocab_max_lines
  vocab = corpus.with_name(f"vocab_{data_config.embedded_vocab_size}_{case}"
                           + (f"_{lines}lines" if lines else "") + ".txt")
  if not vocab.exists():
    temp = vocab.with_name(f".{vocab.name}.tmp-{os.getpid()}")
    try:
      # Deferred import: only this default path trains a vocabulary.
      from data_pipeline import vocab_training  # pylint: disable=g-import-not-at-top
      logging.info("training a %d-token WordPiece vocab on %s (once; cached)",
                   data_config.embedded_vocab_size, corpus)
      vocab_training.train_wordpiece_vocab(
          str(corpus), str(temp), data_config.embedded_vocab_size,
          do_lower_case=data_config.do_lower_case, max_lines=lines or None)
      os.replace(temp, vocab)  # atomic, like the corpus itself
    finally:
      if temp.exists():
        temp.unlink()
  return str(vocab), ""


def make_tokenizer(data_config):
  """The in-graph tokenizer of a data config (WordPiece or SentencePiece).

  Built once per process and file (the trainer, every input and the eval set
  share it); a file rewritten in place (another size or time) is read again.
  """
  vocab_file, spm_model_file = resolve_vocab(data_config)
  path = vocab_file or spm_model_file
  stamp = paths.path(path).stat() if path else None
  key = (vocab_file, spm_model_file, data_config.do_lower_case,
         (stamp.length, stamp.mtime) if stamp else None)
  if key not in _TOKENIZERS:
    _TOKENIZERS[key] = tokenizers.load_tokenizer(vocab_file, spm_model_file,
                                                 data_config.do_lower_case)
  return _TOKENIZERS[key]


_TOKENIZERS: dict[tuple, object] = {}


def word_start_table(tokenizer) -> np.ndarray:
  """[vocab] bool: whether a piece id starts a word ("##" / missing "\u2581" continue one)."""
  specials = set(tokenizers.SPECIAL_TOKENS.values())
  if isinstance(tokenizer, tokenizers.SentencePieceTokenizer):
    return np.array([p.startswith("\u2581") or p in specials or (p.startswith("<") and p.endswith(">"))
                     for p in tokenizer.vocab])
  return np.array([not p.startswith("##") for p in tokenizer.vocab])


def tokenize_documents(documents, tokenizer, *, batch_size: int = 2048) -> pairs.TokenizedCorpus:
  """Tokenizes every sentence in-graph into a TokenizedCorpus.

  Special tokens written literally in the text ("[CLS]" in a docstring about
  BERT) are dropped so that they never look like structure; sentences and
  documents left empty are dropped.
  """
  sentence_counts, errors = [], []

  def sentence_batches():
    batch = []
    try:
      for document in documents:
        sentence_counts.append(len(document))
        for sentence in document:
          batch.append(sentence)
          if len(batch) == batch_size:
            yield np.array(batch, dtype=object)
            batch = []
    except Exception as e:  # pylint: disable=broad-except  (re-raised below, unwrapped by TF)
      errors.append(e)
      return
    if batch:
      yield np.array(batch, dtype=object)

  def tokenize(strings):
    ragged = tokenizer.tokenize(strings)
    return ragged.flat_values, ragged.row_lengths()

  ds = tf.data.Dataset.from_generator(
      sentence_batches, output_signature=tf.TensorSpec([None], tf.string))
  ds = ds.map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
  specials = np.array(sorted(set(tokenizer.special_ids.values()) - {tokenizer.special_ids["unk"]}))
  ids, lengths = [], []
  for flat, row_lengths in ds.as_numpy_iterator():
    keep = ~np.isin(flat, specials)
    if not keep.all():
      sentence_of = np.repeat(np.arange(len(row_lengths)), row_lengths)
      row_lengths = np.bincount(sentence_of[keep], minlength=len(row_lengths))
      flat = flat[keep]
    ids.append(flat.astype(dtype))
    lengths.append(row_lengths)
  if errors:
    raise errors[0]
  lengths = np.concatenate(lengths) if lengths else np.zeros([0], np.int64)
  counts = np.asarray(sentence_counts, np.int64)
  # Drop empty sentences, then documents left without sentences.
  doc_of = np.repeat(np.arange(len(counts)), counts)
  nonempty = lengths > 0
  counts = np.bincount(doc_of[nonempty], minlength=len(counts))
  counts = counts[counts > 0]
  return pairs.TokenizedCorpus(
      ids=np.concatenate(ids) if ids else np.zeros([0], dtype),
      sentence_starts=np.concatenate([[0], np.cumsum(lengths[nonempty])]),
      document_starts=np.concatenate([[0], np.cumsum(counts)]))


# Per-process memo: tokenizing a corpus once serves every PretrainingInput built
# on it (training, restarts in tests, previews).
_CORPUS_CACHE: "collections.OrderedDict[tuple, pairs.TokenizedCorpus]" = collections.OrderedDict()


def load_tokenized_corpus(data_config, tokenizer, *, split: str, process_index: int,
                          process_count: int, max_documents: int = 0) -> pairs.TokenizedCorpus:
  """This process's documents of ``split``, tokenized (memoised per process)."""
  c = data_config
  key = (c.corpus, c.embedded_cache_dir, c.tfds_data_dir, c.tfds_split, c.text_field,
         c.heldout_modulus, c.max_line_bytes, c.max_sentences_per_document,
         c.max_undecodable_fraction,
         tokenizer.__class__.__name__, getattr(tokenizer, "vocab_file", ""),
         getattr(tokenizer, "model_file", ""), c.do_lower_case, split, process_index,
         process_count, max_documents)
  if key not in _CORPUS_CACHE:
    stats = corpora.CorpusStats()
    documents = corpora.read_documents(
        c.corpus, split=split, process_index=process_index, process_count=process_count,
        heldout_modulus=c.heldout_modulus, tfds_data_dir=c.tfds_data_dir,
        tfds_split=c.tfds_split, text_field=c.text_field, max_line_bytes=c.max_line_bytes,
        max_sentences_per_document=c.max_sentences_per_document,
        embedded_cache_dir=c.embedded_cache_dir,
        max_undecodable_fraction=c.max_undecodable_fraction, stats=stats)
    if max_documents:
      documents = itertools.islice(documents, max_documents)
    _CORPUS_CACHE[key] = tokenize_documents(documents, tokenizer)
    stats.log(f"{c.corpus} ({split}, process {process_index}/{process_count})")
    while len(_CORPUS_CACHE) > 4:
      _CORPUS_CACHE.popitem(last=False)
  return _CORPUS_CACHE[key]


def check_corpus(data_config, *, process_index: int = 0, process_count: int = 1) -> None:
  """Refuses (ValueError naming the corpus and what to do) data a run cannot train or
  evaluate on: a glob matching nothing, unreadable or undecodable files (corpora.py), no
  document with the 2 sentences NSP/SOP pairs need, an empty held-out split.

  It reads and tokenizes what the run reads first -- this process's training
  documents and the held-out set -- through load_tokenized_corpus, so the
  PretrainingInput and eval set built afterwards take them from its memo: the
  trainer calls this before writing its workdir, at no extra cost.
  """
  tokenizer = make_tokenizer(data_config)
  for split, index, count, limit in (("train", process_index, process_count, 0),
                                     ("eval", 0, 1, data_config.eval.max_documents)):
    corpus = load_tokenized_corpus(data_config, tokenizer, split=split, process_index=index,
                                   process_count=count, max_documents=limit)
    sentences = np.diff(corpus.document_starts)
    if data_config.objective != "none" and not (sentences >= 2).any():
      raise ValueError(
          f"corpus {data_config.corpus!r} ({split} split): objective "
          f"{data_config.objective!r} needs documents of at least 2 sentences and none has "
          f"({corpus.num_documents} documents); BERT format is one sentence per line with a "
          "blank line between documents (raw:<glob> splits one document per line), or set "
          "config.data.objective='none'")


# --------------------------------------------------------------------------
# The example stream (pure function of corpus, seed and position).
# --------------------------------------------------------------------------


class ExampleStream:
  """Unmasked examples of one process, in blocks, from a given position on."""

  def __init__(self, corpus: pairs.TokenizedCorpus, *, objective: str, max_seq_length: int,
               short_seq_prob: float, seed: int, shuffle_buffer: int, special_ids: dict):
    self.corpus, self.objective = corpus, objective
    self.max_seq_length, self.short_seq_prob = max_seq_length, short_seq_prob
    self.seed, self.shuffle_buffer, self.special_ids = seed, shuffle_buffer, special_ids
    sentences_per_doc = np.diff(corpus.document_starts)
    if objective != "none" and not (sentences_per_doc >= 2).any():
      raise ValueError(f"objective {objective!r} needs documents of >= 2 sentences; "
                       "this corpus part has none")
    if corpus.num_documents < 1:
      raise ValueError("the corpus part has no non-empty document")

  def num_blocks(self) -> int:
    """Blocks per epoch."""
    return -(-self.corpus.num_documents // self.shuffle_buffer)

  def block_instances(self, epoch: int, block: int) -> list[pairs.Instance]:
    """The examples of one block, shuffled."""
    order = pairs.rng_for(self.seed, epoch, 0).permutation(self.corpus.num_documents)
    docs = order[block * self.shuffle_buffer:(block + 1) * self.shuffle_buffer]
    if self.objective == "none":
      instances = pairs.packed_instances(self.corpus, docs, max_seq_length=self.max_seq_length,
                                         sep_id=self.special_ids["sep"])
    else:
      instances = []
      for doc in docs:
        instances.extend(pairs.pair_instances(
            self.corpus, int(doc), objective=self.objective, max_seq_length=self.max_seq_length,
            short_seq_prob=self.short_seq_prob, rng=pairs.rng_for(self.seed, epoch, 1, doc)))
    shuffle = pairs.rng_for(self.seed, epoch, 2, block).permutation(len(instances))
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
          arrays = pairs.assemble(instances, max_seq_length=self.max_seq_length,
                                  cls_id=self.special_ids["cls"], sep_id=self.special_ids["sep"],
                                  pad_id=self.special_ids["pad"])
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


def _masked_dataset(stream: ExampleStream, start: dict, spec: masking.MaskingSpec, *,
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
               _RATIO: tf.TensorSpec([None], tf.float64)}

  def blocks():
    for block in stream.blocks(**start):
      if stop is not None and stop.is_set():
        return
      steps = first_step + block[_POSITION][:, 4] // batch_size
      # ratio_at itself (Python floats) once per step of the block: the one definition.
      unique, inverse = np.unique(steps, return_inverse=True)
      block[_RATIO] = np.array([spec.ratio_at(int(s), schedule_steps) for s in unique],
                               np.float64)[inverse.reshape(-1)]
      yield block

  ds = tf.data.Dataset.from_generator(blocks, output_signature=signature)
  ds = ds.unbatch()
  specials = tokenizer.special_ids
  starts = tf.constant(word_start_table(tokenizer))
  num_predictions = spec.max_predictions(t)

  def mask(example):
    ids = example["input_ids"]
    input_mask = ids != specials["pad"]  # literal specials were removed from the text
    maskable = input_mask & (ids != specials["cls"]) & (ids != specials["sep"])
    position = example[_POSITION]
    masked = masking.mask_tokens(
        ids, maskable, tf.gather(starts, ids), masking.example_seed(seed, position[0], position[3]),
        spec, mask_id=specials["mask"], vocab_size=tokenizer.vocab_size,
        special_ids=list(specials.values()), max_predictions=num_predictions,
        ratio=example[_RATIO])
    return {"input_ids": masked["input_ids"], "input_mask": tf.cast(input_mask, tf.int32),
            "segment_ids": example["segment_ids"],
            "masked_lm_positions": masked["masked_lm_positions"],
            "masked_lm_ids": masked["masked_lm_ids"],
            "masked_lm_weights": masked["masked_lm_weights"],
            "next_sentence_labels": example["next_sentence_labels"], _POSITION: position,
            _UNMASKED: ids}

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
  """

  def __init__(self, data_config, *, batch_size: int, process_index: int = 0,
               process_count: int = 1, split: str = "train", first_step: int = 0,
               schedule_steps: int = 0):
    _validate(data_config)
    if batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    self.config, self.batch_size = data_config, batch_size
    self.spec = masking_spec(data_config)
    self.spec.ratio_at(first_step, schedule_steps)  # a schedule without its length fails now
    self.first_step, self.schedule_steps = first_step, schedule_steps
    self.last_fingerprint = ""  # batch_fingerprint of the batch last returned
    self.tokenizer = make_tokenizer(data_config)
    corpus = load_tokenized_corpus(data_config, self.tokenizer, split=split,
                                   process_index=process_index, process_count=process_count)
    self.stream = ExampleStream(
        corpus, objective=data_config.objective, max_seq_length=data_config.max_seq_length,
        short_seq_prob=data_config.short_seq_prob, seed=data_config.seed,
        shuffle_buffer=data_config.shuffle_buffer, special_ids=self.tokenizer.special_ids)
    fields = [data_config.corpus, split, process_index, process_count, corpus.num_documents,
              corpus.num_tokens, data_config.objective, data_config.max_seq_length,
              data_config.short_seq_prob, data_config.seed, data_config.shuffle_buffer]
    self._fingerprint = hashlib.md5(json.dumps(fields).encode()).hexdigest()[:16]
    self._position = {"epoch": 0, "block": 0, "offset": 0, "index": 0, "example": 0}
    self._iterator = None
    self._stop = threading.Event()
    _LIVE_INPUTS.add(self)

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


# Inputs whose pipelines must be drained before the interpreter tears TF down.
_LIVE_INPUTS = weakref.WeakSet()
atexit.register(lambda: [source.close() for source in list(_LIVE_INPUTS)])


def make_eval_batches(data_config, *, batch_size: int, process_index: int = 0,
                      process_count: int = 1, own_masking: bool = False) -> list[dict]:
  """The fixed held-out eval set: this host's numpy batches, deterministic masks.

  The set is built identically on every host (the first eval.max_documents
  held-out documents of the whole corpus, pairs and masks from eval.seed, masks
  at eval.masking_ratio with default knobs), cut into global batches of
  ``batch_size * process_count`` examples; this host gets its slice of each.
  It therefore depends neither on the training masking config nor on the
  process count. `own_masking`: the same pairs masked with the training masking
  knobs at the ratio training ends at (own_eval_masking_spec), for eval_own/*.
  """
  _validate(data_config)
  global_batch = batch_size * process_count
  num_batches = data_config.eval.num_examples // global_batch
  if num_batches < 1:
    raise ValueError(f"data.eval.num_examples={data_config.eval.num_examples} is smaller "
                     f"than one global batch ({global_batch})")
  tokenizer = make_tokenizer(data_config)
  corpus = load_tokenized_corpus(data_config, tokenizer, split="eval", process_index=0,
                                 process_count=1, max_documents=data_config.eval.max_documents)
  stream = ExampleStream(
      corpus, objective=data_config.objective, max_seq_length=data_config.max_seq_length,
      short_seq_prob=data_config.short_seq_prob, seed=data_config.eval.seed,
      shuffle_buffer=data_config.shuffle_buffer, special_ids=tokenizer.special_ids)
  spec = own_eval_masking_spec(data_config) if own_masking else eval_masking_spec(data_config)
  ds = _masked_dataset(stream, {}, spec, tokenizer=tokenizer, seed=data_config.eval.seed,
                       batch_size=global_batch, prefetch=1)
  batches = []
  for batch in ds.take(num_batches).as_numpy_iterator():
    batch.pop(_POSITION)
    batch.pop(_UNMASKED)
    lo = process_index * batch_size
    batches.append({k: v[lo:lo + batch_size] for k, v in batch.items()})
  return batches
