"""Sentence-pair construction on tokenized documents: NSP, SOP and full-sentence packing.

Pure numpy, no TensorFlow: pretraining.py runs this inside a Python generator
feeding tf.data (tokenization before it and masking after it stay in-graph).
Every random draw comes from a ``numpy.random.Generator`` seeded by
(seed, epoch, document index), so the pairs of an epoch are a pure function of
the corpus and the seed -- never of the masking configuration -- and every epoch
draws new pairs (no dupe_factor copies).

NSP follows google-research/bert's ``create_instances_from_document``: one
target length per document (``max_num_tokens``, or with probability
``short_seq_prob`` a uniform length in [2, max_num_tokens]); sentences are
accumulated into a chunk until it reaches the target; A is the chunk's first
``a_end`` sentences (``a_end`` uniform in [1, len(chunk) - 1]); B is the rest of
the chunk (IsNext, label 0) or, half of the time and always for a one-sentence
chunk, a run of sentences from a random point of another document (label 1),
the chunk's unused sentences going back to be read again; then the longer side
is truncated one token at a time, from the front or the back at random.
Deviations, deliberate:
* a chunk of a single sentence (the leftover of a put-back, or one sentence
  longer than the target) is cut at a random token into two parts that play
  the role of two sentences; google-research instead always gives such a chunk
  a random B, which skews the labels towards "random" -- 64% on documents of a
  few short sentences like the embedded docstring corpus. With the cut every
  instance gets the fair 50% coin, so labels are balanced in expectation;
* the random document is drawn uniformly from the *other* documents (google
  retries 10 times and may end up with the same document);
* documents of one sentence are not used as an A source (they cannot give an
  A/B split) but remain available as random-B sources;
* a sentence is cut to ``max_num_tokens`` tokens before use, which bounds the
  work of truncation (only the part that could ever fit is kept).

SOP follows ALBERT: A and B are always consecutive chunk parts, swapped half of
the time (label 1 when swapped); single-sentence chunks are cut as above.

"none" follows RoBERTa's FULL-SENTENCES: contiguous sentences are packed up to
``max_seq_length`` crossing document boundaries, with a [SEP] between
documents; a sentence longer than a whole sequence is cut into pieces.
"""

import dataclasses

import numpy as np

from data_pipeline.store.tokenized_corpus import TokenizedCorpus  # pylint: disable=g-importing-member

@dataclasses.dataclass(frozen=True)
class Instance:
  """One training sequence before masking: two segments and a label (B empty for "none")."""
  tokens_a: np.ndarray
  tokens_b: np.ndarray
  label: int


def rng_for(*key: int) -> np.random.Generator:
  """A numpy Generator that is a pure function of the integer key."""
  return np.random.default_rng([int(k) & 0xFFFFFFFF for k in key])


def truncate_pair(a: np.ndarray, b: np.ndarray, max_num_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """google-research's truncate_seq_pair: trims the longer side from front or back at random."""
  a_lo, a_hi, b_lo, b_hi = 0, len(a), 0, len(b)
  excess = len(a) + len(b) - max_num_tokens
  if excess <= 0:
    return a, b
  draws = rng.random(excess)  # one draw per removed token, as the reference does
  for draw in draws:
    if a_hi - a_lo > b_hi - b_lo:
      if draw < 0.5:
        a_lo += 1
      else:
        a_hi -= 1
    elif draw < 0.5:
      b_lo += 1
    else:
      b_hi -= 1
  return a[a_lo:a_hi], b[b_lo:b_hi]


def _concat(sentences: list[np.ndarray]) -> np.ndarray:
  return np.concatenate(sentences) if sentences else np.zeros([0], np.int32)


def pair_instances(corpus: TokenizedCorpus, doc_index: int, *, objective: str,
                   max_seq_length: int, short_seq_prob: float,
                   rng: np.random.Generator) -> list[Instance]:
  """NSP or SOP instances of one document (see the module docstring)."""
  max_num_tokens = max_seq_length - 3  # [CLS] A [SEP] B [SEP]
  document = corpus.document(doc_index, max_num_tokens)
  if len(document) < 2:
    return []  # one-sentence documents are only random-B sources
  target = max_num_tokens
  if rng.random() < short_seq_prob:
    target = int(rng.integers(2, max_num_tokens + 1))
  instances, chunk, chunk_length, i = [], [], 0, 0
  while i < len(document):
    chunk.append(document[i])
    chunk_length += len(document[i])
    if i == len(document) - 1 or chunk_length >= target:
      split_sentence = len(chunk) == 1 and len(chunk[0]) >= 2
      if split_sentence:  # cut a lone sentence in two so the label coin applies (module doc)
        cut = int(rng.integers(1, len(chunk[0])))
        chunk = [chunk[0][:cut], chunk[0][cut:]]
      a_end = 1 if len(chunk) < 2 else int(rng.integers(1, len(chunk)))
      tokens_a = _concat(chunk[:a_end])
      if objective == "nsp" and (len(chunk) == 1 or rng.random() < 0.5):
        label = 1
        tokens_b = _random_segment(corpus, doc_index, target - len(tokens_a),
                                   max_num_tokens, rng)
        if not split_sentence:
          i -= len(chunk) - a_end  # put the unused sentences back
      elif objective == "nsp":
        label, tokens_b = 0, _concat(chunk[a_end:])
      elif len(chunk) == 1:
        label = None  # a one-token sentence alone: SOP has no pair to make
      else:
        tokens_b = _concat(chunk[a_end:])
        label = int(rng.random() < 0.5)
        if label:
          tokens_a, tokens_b = tokens_b, tokens_a
      if label is not None:
        tokens_a, tokens_b = truncate_pair(tokens_a, tokens_b, max_num_tokens, rng)
        if len(tokens_a) and len(tokens_b):
          instances.append(Instance(tokens_a, tokens_b, label))
      chunk, chunk_length = [], 0
    i += 1
  return instances


def _random_segment(corpus, doc_index, target_b_length, max_num_tokens, rng):
  """Sentences from a random point of a random other document, up to the target length."""
  other = int(rng.integers(0, max(corpus.num_documents - 1, 1)))
  if other >= doc_index and corpus.num_documents > 1:
    other += 1  # uniform over the other documents
  document = corpus.document(other, max_num_tokens)
  start = int(rng.integers(0, len(document)))
  pieces, length = [], 0
  for sentence in document[start:]:
    pieces.append(sentence)
    length += len(sentence)
    if length >= target_b_length:
      break
  return _concat(pieces)


def packed_instances(corpus: TokenizedCorpus, doc_indices, *, max_seq_length: int,
                     sep_id: int) -> list[Instance]:
  """RoBERTa FULL-SENTENCES packing of the given documents, in order (label 0)."""
  budget = max_seq_length - 2  # [CLS] ... [SEP]
  sep = np.array([sep_id], np.int32)
  instances, current, length, pending_sep = [], [], 0, False

  def flush():
    nonlocal current, length
    if current:
      instances.append(Instance(_concat(current), np.zeros([0], np.int32), 0))
    current, length = [], 0

  for doc_index in doc_indices:
    first, last = corpus.document_starts[doc_index], corpus.document_starts[doc_index + 1]
    for s in range(first, last):
      sentence = corpus.ids[corpus.sentence_starts[s]:corpus.sentence_starts[s + 1]]
      for start in range(0, len(sentence), budget):
        piece = sentence[start:start + budget]
        need = len(piece) + pending_sep
        if length and length + need > budget:
          flush()
          pending_sep, need = False, len(piece)
        if pending_sep:
          current.append(sep)
        current.append(piece)
        length += need
        pending_sep = False
    pending_sep = length > 0  # a document boundary inside a sequence gets a [SEP]
  flush()
  return instances


def assemble(instances: list[Instance], *, max_seq_length: int, cls_id: int,
             sep_id: int, pad_id: int) -> dict[str, np.ndarray]:
  """[CLS] A [SEP] B [SEP] (or [CLS] A [SEP]), padded: input_ids, segment_ids, labels."""
  n = len(instances)
  input_ids = np.full([n, max_seq_length], pad_id, np.int32)
  segment_ids = np.zeros([n, max_seq_length], np.int32)
  labels = np.zeros([n], np.int32)
  for row, instance in enumerate(instances):
    a, b = instance.tokens_a, instance.tokens_b
    end_a = len(a) + 2
    input_ids[row, 0] = cls_id
    input_ids[row, 1:end_a - 1] = a
    input_ids[row, end_a - 1] = sep_id
    if len(b):
      end_b = end_a + len(b) + 1
      input_ids[row, end_a:end_b - 1] = b
      input_ids[row, end_b - 1] = sep_id
      segment_ids[row, end_a:end_b] = 1
    labels[row] = instance.label
  return {"input_ids": input_ids, "segment_ids": segment_ids,
          "next_sentence_labels": labels}
