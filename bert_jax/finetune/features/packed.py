"""config.padding="packed": each batch's examples packed into as few rows as hold them.

A batch keeps exactly fixed padding's examples, in its order (this is not length grouping,
which changes what a batch holds). Its examples' real tokens are packed, first fit in
decreasing length (ties in batch order), into rows of max_seq_length; each example
attends only to itself (its document id, bert_jax.model's `documents`), its positions
start at 0, and the model reads each example's outputs back through `pack_index` (the
flat index, row x max_seq_length + position, of each of its tokens; -1 past its end):
classification, tagging and SQuAD see the [B, T, ...] outputs fixed padding gives, so
their losses and predictions are computed as before. The number of rows is rounded up
to a multiple of `unit` (the data-parallel size): one compile per row count.

Functions here are numpy only.
"""

import numpy as np

# The packed batch's extra arrays and the model arguments they are (bert_jax.model.heads).
PACKING = {"position_ids": "positions", "document_ids": "documents",
           "pack_index": "pack_index"}


def assign(lengths: np.ndarray, max_seq_length: int) -> tuple[np.ndarray, np.ndarray, int]:
  """(row, offset) of each example and the number of rows: first fit decreasing."""
  order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
  used: list[int] = []
  row, offset = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
  for i in order:
    need = int(lengths[i])
    target = next((r for r, u in enumerate(used) if u + need <= max_seq_length), None)
    if target is None:
      target = len(used)
      used.append(0)
    row[i], offset[i] = target, used[target]
    used[target] += need
  return row, offset, len(used)


def pack(features: dict[str, np.ndarray], keys, rows: np.ndarray, max_seq_length: int,
         unit: int = 1, inputs=("input_ids", "input_mask", "segment_ids")
         ) -> dict[str, np.ndarray]:
  """`keys` of `rows` with the model inputs packed (module docstring); the other keys (labels,
  per-token label arrays) stay one per example, as fixed padding gives them."""
  lengths = features["input_mask"][rows].sum(axis=1).astype(np.int64)
  row, offset, count = assign(lengths, max_seq_length)
  count = max(unit, -(-count // unit) * unit)
  t = max_seq_length
  out = {k: np.zeros((count, t), features[k].dtype) for k in inputs}
  documents = np.zeros((count, t), np.int32)
  positions = np.zeros((count, t), np.int32)
  index = np.full((len(rows), t), -1, np.int32)
  number = np.zeros(count, np.int32)
  for i, example in enumerate(rows):
    n, r, o = int(lengths[i]), int(row[i]), int(offset[i])
    if not n:
      continue  # an empty (padding) example: no tokens, all of its outputs unread
    for k in inputs:
      out[k][r, o:o + n] = features[k][example, :n]
    number[r] += 1
    documents[r, o:o + n] = number[r]
    positions[r, o:o + n] = np.arange(n)
    index[i, :n] = r * t + o + np.arange(n)
  out.update(position_ids=positions, document_ids=documents, pack_index=index)
  for k in keys:
    if k not in inputs:
      out[k] = features[k][rows]
  return out


def padded_examples(features: dict[str, np.ndarray], rows: np.ndarray, size: int
                    ) -> dict[str, np.ndarray]:
  """`features` of `rows` and `size - len(rows)` empty examples after them (eval batches)."""
  return {k: np.concatenate([v[rows], np.zeros((size - len(rows),) + v.shape[1:], v.dtype)])
          for k, v in features.items()}
