"""config.padding="packed": each batch's examples packed into as few rows as hold them.

A batch keeps exactly fixed padding's examples, in its order (this is not length grouping,
which changes what a batch holds). Its examples' real tokens are packed, first fit in
decreasing length (ties in batch order), into rows of max_seq_length; each example
attends only to itself (its document id, bert_jax.model's `documents`), its positions
start at 0, and the model reads each example's outputs back through `pack_index` (the
flat index, row x max_seq_length + position, of each of its tokens; -1 past its end):
classification, tagging and SQuAD see the [B, T, ...] outputs fixed padding gives, so
their losses and predictions are computed as before.

Where the rows go (`Layout`): the examples are packed in groups, one per data-parallel
device and micro-batch, each group into rows of its own, so that
- a device's examples are read back from its own rows (the gather stays on the device);
- gradient accumulation's split (training/state.accumulated_grads: micro-batch j takes
  examples j, j+k, ... and rows j, j+k, ...) gives each micro-batch its examples and the
  rows they were packed into, `pack_index` counting within the micro-batch's rows;
- a process's examples (its consecutive share of the batch, sharding.global_batch) and
  their rows are its consecutive share of the rows: every process computes the same
  layout from the global batch and fills only its own part.
Every group takes as many rows as the fullest needs (arrays stack), so a batch has
devices x accum x that many rows: one compile per row count.

Functions here are numpy only.
"""

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where every example of a global batch goes (module docstring)."""
  row: np.ndarray      # [B] its packed row, in the global batch's rows
  offset: np.ndarray   # [B] where it starts in that row
  index_row: np.ndarray  # [B] that row's number within its micro-batch (pack_index's)
  rows: int            # the batch's packed rows: devices x accum x rows per group


def layout(lengths: np.ndarray, max_seq_length: int, devices: int = 1,
           accum: int = 1) -> Layout:
  """The Layout of a global batch whose examples have `lengths` (real tokens)."""
  size = len(lengths)
  if size % (devices * accum):
    raise ValueError(f"a batch of {size} examples does not split over {devices} devices x "
                     f"{accum} micro-batches")
  per_device = size // devices
  groups = [np.arange(d * per_device + j, (d + 1) * per_device, accum)
            for d in range(devices) for j in range(accum)]
  packed = [assign(lengths[g], max_seq_length) for g in groups]
  per_group = max([1] + [count for _, _, count in packed])
  row, offset, index_row = (np.zeros(size, np.int64) for _ in range(3))
  for k, (g, (r, o, _)) in enumerate(zip(groups, packed)):
    d, j = divmod(k, accum)                   # the order `groups` was built in
    index_row[g] = d * per_group + r          # its row among micro-batch j's rows
    row[g] = index_row[g] * accum + j         # micro-batch j holds rows j, j+accum, ...
    offset[g] = o
  return Layout(row, offset, index_row, devices * accum * per_group)


def pack(features: dict[str, np.ndarray], keys, rows: np.ndarray, max_seq_length: int, *,
         devices: int = 1, accum: int = 1, process_index: int = 0, process_count: int = 1,
         inputs=("input_ids", "input_mask", "segment_ids")) -> dict[str, np.ndarray]:
  """This process's share of the global batch `rows`: `keys` with the model inputs packed
  (module docstring); the other keys (labels, per-token label arrays) stay one per
  example, as fixed padding gives them. `devices` is the data-parallel size, `accum` the
  gradient accumulation steps."""
  lengths = features["input_mask"][rows].sum(axis=1).astype(np.int64)
  plan = layout(lengths, max_seq_length, devices, accum)
  if plan.rows % process_count or len(rows) % process_count:
    raise ValueError(f"{plan.rows} packed rows of {len(rows)} examples do not divide over "
                     f"{process_count} processes")
  per_rows, per_examples = plan.rows // process_count, len(rows) // process_count
  first_row, first = process_index * per_rows, process_index * per_examples
  t = max_seq_length
  out = {k: np.zeros((per_rows, t), features[k].dtype) for k in inputs}
  documents = np.zeros((per_rows, t), np.int32)
  positions = np.zeros((per_rows, t), np.int32)
  index = np.full((per_examples, t), -1, np.int32)
  number = np.zeros(per_rows, np.int32)
  for i in range(first, first + per_examples):
    n, r, o = int(lengths[i]), int(plan.row[i]) - first_row, int(plan.offset[i])
    if not n:
      continue  # an empty (padding) example: no tokens, all of its outputs unread
    for k in inputs:
      out[k][r, o:o + n] = features[k][rows[i], :n]
    number[r] += 1
    documents[r, o:o + n] = number[r]
    positions[r, o:o + n] = np.arange(n)
    index[i - first, :n] = int(plan.index_row[i]) * t + o + np.arange(n)
  out.update(position_ids=positions, document_ids=documents, pack_index=index)
  for k in keys:
    if k not in inputs:
      out[k] = features[k][rows[first:first + per_examples]]
  return out


def padded_examples(features: dict[str, np.ndarray], rows: np.ndarray, size: int
                    ) -> dict[str, np.ndarray]:
  """`features` of `rows` and `size - len(rows)` empty examples after them (eval batches)."""
  return {k: np.concatenate([v[rows], np.zeros((size - len(rows),) + v.shape[1:], v.dtype)])
          for k, v in features.items()}
