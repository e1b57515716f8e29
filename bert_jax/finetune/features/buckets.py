"""Length buckets: fine-tuning batches padded to the shortest of a few lengths that holds them.

Sentence tasks are short (SST-2 averages under 25 pieces), so at
max_seq_length 128 most of a fixed-padded batch is padding. With
config.padding = "buckets" a batch is cut to the smallest bucket length
(multiples of config.bucket_multiple, and max_seq_length) that holds its
longest row; attention masks the padding, so a row's outputs do not depend on
how much padding follows it. The compiled shapes stay bounded: one train
program per bucket length, one eval program per (bucket length, batch).

Training order (train_order): the epoch's permutation from (seed, epoch), the
tail dropped, cut into batches in turn: fixed padding's order, so by default
buckets change only the padding (with dropout off, the same losses step by
step; with dropout on, masks are drawn per shape). With config.group_by_length,
rows are then sorted by length within windows of config.bucket_window_batches
batches and cut into batches, and the epoch's batches shuffled from (seed,
epoch) again (transformers' LengthGroupedSampler, windows of 50 batches): less
padding, but batches alike in length, which learns less (docs/finetuning.md).
Either way every kept row appears exactly once per epoch and the order is a
pure function of (seed, epoch), so resume is exact.

Evaluation (eval_batches): rows grouped by bucket, in their original order
within a bucket; a shorter bucket takes proportionally more rows per batch
(the same number of tokens as a full-length batch of eval_batch_size), so the
memory of a batch never exceeds the configured one. Outputs go back to their
rows' places, sequence outputs padded back to max_seq_length.

Functions here are numpy only: they decide rows and lengths, the trainer runs them.
"""

import dataclasses
import math

import numpy as np

from bert_jax.finetune.features import packed as packed_lib

PADDINGS = ("buckets", "fixed", "packed")  # packed: features/packed.py
# Filled into sequence outputs at every padded position (steps.predict): far below any
# real logit, so a padded position never ranks among SQuAD's n-best.
PAD_LOGIT = -1e9


def bucket_lengths(max_seq_length: int, multiple: int, padding: str) -> tuple[int, ...]:
  """The lengths batches are padded to: multiples of `multiple` below max_seq_length, and
  max_seq_length itself; ("fixed" padding, or multiple >= max_seq_length) only the latter."""
  if padding not in PADDINGS:
    raise ValueError(f"config.padding={padding!r} must be one of {PADDINGS}")
  if padding in ("fixed", "packed") or multiple >= max_seq_length:
    return (max_seq_length,)
  if multiple < 1:
    raise ValueError(f"config.bucket_multiple={multiple} must be >= 1")
  return tuple(range(multiple, max_seq_length, multiple)) + (max_seq_length,)


def row_lengths(features: dict[str, np.ndarray]) -> np.ndarray:
  """Real (unpadded) length of every row: the count of its input_mask."""
  return features["input_mask"].sum(axis=1).astype(np.int64)


def bucket_of(lengths: np.ndarray, buckets: tuple[int, ...]) -> np.ndarray:
  """The smallest bucket length holding each length (lengths never exceed the last)."""
  return np.asarray(buckets)[np.searchsorted(np.asarray(buckets), lengths)]


def train_order(lengths: np.ndarray, seed: int, epoch: int, batch_size: int,
                window_batches: int, grouped: bool) -> np.ndarray:
  """[steps_per_epoch, batch_size] row indices of one epoch's batches (see the module doc).

  Ungrouped (the default), this is the fixed-padding order the trainer always had:
  batch i is rows i*batch_size.. of the (seed, epoch) permutation, the tail dropped.
  """
  n = len(lengths)
  steps = n // batch_size
  perm = np.random.default_rng([seed, epoch]).permutation(n)[:steps * batch_size]
  if not grouped:
    return perm.reshape(steps, batch_size)
  window = max(window_batches, 1) * batch_size
  batches = []
  for start in range(0, len(perm), window):
    chunk = perm[start:start + window]
    # Stable, so equal lengths keep their random order.
    chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
    batches.append(chunk.reshape(-1, batch_size))
  batches = np.concatenate(batches)
  # A second stream of the same (seed, epoch): short and long batches interleave at random.
  return batches[np.random.default_rng([seed, epoch, 1]).permutation(len(batches))]


def cut(features: dict[str, np.ndarray], keys, rows: np.ndarray, length: int,
        max_seq_length: int) -> dict[str, np.ndarray]:
  """`keys` of `rows`, every sequence array ([N, max_seq_length, ...]) cut to `length`."""
  out = {}
  for k in keys:
    v = features[k][rows]
    out[k] = v[:, :length] if v.ndim >= 2 and v.shape[1] == max_seq_length else v
  return out


class TrainBatches:
  """Rows and padded length of every train step: a pure function of (seed, step).

  The epoch's order is computed once per epoch and kept, so a step costs only its gather.
  """

  def __init__(self, features: dict[str, np.ndarray], *, seed: int, batch_size: int,
               buckets: tuple[int, ...], grouped: bool, window_batches: int,
               pack: tuple[int, int] | None = None):
    self.features, self.seed, self.batch_size = features, seed, batch_size
    # config.padding "packed" (packed.py): (data-parallel devices, accumulation steps).
    self.pack = pack
    self.buckets, self.grouped, self.window_batches = buckets, grouped, window_batches
    self.max_seq_length = buckets[-1]
    self.lengths = row_lengths(features)
    self.steps_per_epoch = len(self.lengths) // batch_size
    self._epoch, self._order = None, None

  def rows(self, step: int) -> tuple[np.ndarray, int]:
    """(global batch rows, bucket length) of `step`."""
    epoch, index = divmod(step, self.steps_per_epoch)
    if epoch != self._epoch:
      self._order = train_order(self.lengths, self.seed, epoch, self.batch_size,
                                self.window_batches, grouped=self.grouped)
      self._epoch = epoch
    rows = self._order[index]
    return rows, int(bucket_of(self.lengths[rows].max(keepdims=True), self.buckets)[0])

  def batch(self, step: int, keys, process_index: int = 0,
            process_count: int = 1) -> dict[str, np.ndarray]:
    """This process's share of the global batch of `step`, cut to the batch's bucket."""
    rows, length = self.rows(step)
    if self.pack:  # every process lays out the global batch, then fills its own share
      devices, accum = self.pack
      return packed_lib.pack(self.features, keys, rows, self.max_seq_length, devices=devices,
                             accum=accum, process_index=process_index,
                             process_count=process_count)
    per_host = self.batch_size // process_count
    rows = rows[process_index * per_host:(process_index + 1) * per_host]
    return cut(self.features, keys, rows, length, self.max_seq_length)

  def padding(self, total_steps: int) -> dict[str, float]:
    """padding_stats of every train step of a run (a pure function of the seed)."""
    steps = [self.rows(step) for step in range(total_steps)]
    if self.pack:  # every step's rows at full length, as many as its packing takes
      packed_rows = [packed_lib.layout(self.lengths[rows], self.max_seq_length, *self.pack).rows
                     for rows, _ in steps]
      real = float(sum(self.lengths[rows].sum() for rows, _ in steps))
      padded = float(sum(packed_rows)) * self.max_seq_length
      fixed = float(sum(len(rows) for rows, _ in steps)) * self.max_seq_length
      return {"real_tokens": real, "padded_tokens": padded,
              "pad_fraction": 1.0 - real / padded if padded else 0.0,
              "fixed_pad_fraction": 1.0 - real / fixed if fixed else 0.0}
    return padding_stats(np.concatenate([self.lengths[rows] for rows, _ in steps]),
                         np.concatenate([np.full(len(rows), length) for rows, length in steps]),
                         self.max_seq_length)


@dataclasses.dataclass(frozen=True)
class EvalBatch:
  """One eval batch: which rows, the length they are cut to, the rows the batch is padded to."""
  rows: np.ndarray
  length: int
  size: int


def eval_batches(lengths: np.ndarray, buckets: tuple[int, ...], eval_batch_size: int,
                 unit: int) -> list[EvalBatch]:
  """Every row once, grouped by bucket; a bucket of length L takes
  eval_batch_size * max_seq_length // L rows a batch (the tokens of one full batch),
  rounded down to `unit` (the data-parallel size x processes), and never more than
  the bucket's rows rounded up to `unit` (a small dev set pads no empty rows)."""
  max_len = buckets[-1]
  of = bucket_of(lengths, buckets)
  out = []
  for length in buckets:
    rows = np.flatnonzero(of == length)
    if not len(rows):
      continue
    size = max(unit, eval_batch_size * max_len // length // unit * unit)
    size = min(size, math.ceil(len(rows) / unit) * unit)
    out.extend(EvalBatch(rows[i:i + size], length, size) for i in range(0, len(rows), size))
  return out


def padding_stats(lengths: np.ndarray, padded_lengths: np.ndarray,
                  max_seq_length: int) -> dict[str, float]:
  """Real tokens and the share of padding, bucketed and fixed, over the given rows."""
  real = float(lengths.sum())
  padded = float(padded_lengths.sum())
  fixed = float(len(lengths) * max_seq_length)
  return {"real_tokens": real, "padded_tokens": padded,
          "pad_fraction": 1.0 - real / padded if padded else 0.0,
          "fixed_pad_fraction": 1.0 - real / fixed if fixed else 0.0}
