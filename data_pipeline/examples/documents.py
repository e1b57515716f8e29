"""Objective "documents": whole documents packed into rows, each attending only to itself.

The MLM-only objective of ModernBERT and the encoders after it. Each document (all its
sentences, in order) becomes [CLS] document [SEP]; a document longer than a row is cut
into pieces of max_seq_length - 2 tokens, each wrapped so. The pieces of a block of
documents (the shuffle block of pretraining.py, in its order) are packed by best fit
over a bounded window, as ModernBERT's greedy best-fit packer does (its
src/sequence_packer.py; here rows, not its flattened micro-batches): a piece goes into
the open row it leaves least room in; when none has room, a new row opens, and when
`window` rows are open the oldest is closed first. A row with no room for any piece
closes at once; the rows still open close at the block's end. Everything is a pure
function of the block's documents, so a pipeline restored at a block boundary (and
`offset` rows into it) yields exactly the uninterrupted rows.

Each row carries per token its document's number (1, 2, ... in the row; 0 for padding)
and the position within the document (restarting at 0 at each [CLS]): the model keeps
attention inside a document and restarts its positions there (bert_jax.model:
`documents`, `positions`). Padding is only at a row's tail.

Filled rows (data.pack_fill): best fit leaves each row's unfillable room as padding, and
closes up to `window` half-full rows at every block's end (0.8-1.3% of the tokens on the
embedded corpus; experiments/results/packing.md). With pack_fill, a block is not a count
of documents but a fixed span of the epoch's token stream ([CLS] doc [SEP], document after
document in the epoch's order), shuffle_buffer rows' worth, cut wherever the span ends.
Inside it the pieces are packed by the same best fit, except that no row closes with
room: when the window is full and no row has room for a piece, the oldest row is topped
off with the piece's head; at the block's end the older open rows take the tails of the
newest. A block's span holds exactly its rows' tokens, so every row is full; only the
epoch's last row has padding (pretraining.py keeps it last after the block's shuffle, so
the padding is the tail of the epoch's last sequence). The price is a cut where a top-off
or a block's span ends (a piece restarts its positions and attends only to itself, as a
long document's pieces do): counted by experiments/benchmarks/pretrain/packing.py. Each
block is still a pure function of (corpus, seed, epoch, block), so resume stays exact.
"""

import dataclasses

import numpy as np

from data_pipeline.store.tokenized_corpus import TokenizedCorpus  # pylint: disable=g-importing-member

DOCUMENT_IDS = "document_ids"
POSITION_IDS = "position_ids"


@dataclasses.dataclass(eq=False)  # rows are told apart by identity, not by their arrays
class Row:
  """One packed row before masking: its documents' tokens, without [CLS] and [SEP]."""
  pieces: list
  used: int = 0  # tokens the pieces take with their [CLS] and [SEP]


def document_tokens(corpus: TokenizedCorpus, doc_index: int) -> np.ndarray:
  """All of the document's tokens (its sentences, in order), a view of corpus.ids."""
  first, last = corpus.document_starts[doc_index], corpus.document_starts[doc_index + 1]
  return corpus.ids[corpus.sentence_starts[first]:corpus.sentence_starts[last]]


def pieces_of(corpus: TokenizedCorpus, doc_index: int, max_seq_length: int):
  """The document's tokens cut into pieces of at most max_seq_length - 2 tokens."""
  tokens = document_tokens(corpus, doc_index)
  budget = max_seq_length - 2
  return [tokens[start:start + budget] for start in range(0, len(tokens), budget)]


def packed_rows(corpus: TokenizedCorpus, doc_indices, *, max_seq_length: int,
                window: int) -> list[Row]:
  """Best-fit packing of the documents' pieces, in order, over `window` open rows."""
  rows, open_rows = [], []
  for doc_index in doc_indices:
    for piece in pieces_of(corpus, int(doc_index), max_seq_length):
      need = len(piece) + 2
      fits = [r for r in open_rows if max_seq_length - r.used >= need]
      if fits:
        best = max(fits, key=lambda r: r.used)  # the least room left; the oldest on a tie
      else:
        if len(open_rows) == window:
          rows.append(open_rows.pop(0))
        best = Row([])
        open_rows.append(best)
      best.pieces.append(piece)
      best.used += need
      if max_seq_length - best.used < 3:  # not even a one-token document fits
        open_rows.remove(best)
        rows.append(best)
  return rows + open_rows


def block_pieces(corpus: TokenizedCorpus, order: np.ndarray, span: tuple[int, int], *,
                 cls_id: int, sep_id: int, ends: np.ndarray | None = None) -> list[np.ndarray]:
  """The pieces of the epoch's token stream in [span): each document in `order` as
  [CLS] doc [SEP], the first and the last cut where the span cuts them. `ends`: the
  stream's cumulative stream_costs in `order`, if the caller keeps them."""
  ends = np.cumsum(stream_costs(corpus, order)) if ends is None else ends
  lo, hi = span
  pieces = []
  for i in range(int(np.searchsorted(ends, lo, "right")), len(order)):
    start = int(ends[i - 1]) if i else 0
    if start >= hi:
      break
    tokens = document_tokens(corpus, int(order[i]))
    whole = np.concatenate([[cls_id], tokens, [sep_id]]).astype(tokens.dtype)
    pieces.append(whole[max(lo - start, 0):hi - start])
  return pieces


def stream_costs(corpus: TokenizedCorpus, order: np.ndarray) -> np.ndarray:
  """Tokens each document in `order` takes in the stream: its own and [CLS], [SEP]."""
  starts = corpus.sentence_starts[corpus.document_starts]
  return (np.diff(starts) + 2)[order].astype(np.int64)


def filled_rows(pieces: list[np.ndarray], *, max_seq_length: int, window: int) -> list[Row]:
  """Best fit of the pieces (ids with their [CLS]/[SEP]) over `window` open rows, every
  row filled to its end by cutting pieces; only the last row may have room left."""
  rows, open_rows = [], []

  def put(row, piece):
    row.pieces.append(piece)
    row.used += len(piece)
    if row.used == max_seq_length:
      open_rows.remove(row)
      rows.append(row)

  for piece in pieces:
    while len(piece):
      fits = [r for r in open_rows if max_seq_length - r.used >= len(piece)]
      if fits:  # the least room left; the oldest on a tie
        put(max(fits, key=lambda r: r.used), piece)
        break
      if len(open_rows) < window:
        row = Row([])
        open_rows.append(row)
      else:  # window full, no room anywhere: the oldest row takes the piece's head
        row = open_rows[0]
      room = max_seq_length - row.used
      put(row, piece[:room])
      piece = piece[room:]
  while len(open_rows) > 1:  # the block's end: the older rows take the newest's tails
    oldest, newest = open_rows[0], open_rows[-1]
    last = newest.pieces[-1]
    take = min(max_seq_length - oldest.used, len(last))
    newest.pieces[-1] = last[:len(last) - take]
    newest.used -= take
    if not len(newest.pieces[-1]):
      newest.pieces.pop()
    if not newest.pieces:
      open_rows.pop()
    put(oldest, last[len(last) - take:])
  return rows + open_rows


def assemble(rows: list[Row], *, max_seq_length: int, cls_id: int, sep_id: int,
             pad_id: int, wrapped: bool = True) -> dict[str, np.ndarray]:
  """The rows as the pipeline's arrays: input_ids, segment_ids (all 0), labels (all 0),
  document_ids and position_ids. `wrapped`: each piece is put between [CLS] and [SEP]
  (packed_rows); else the pieces hold theirs already (filled_rows)."""
  n = len(rows)
  extra = 2 if wrapped else 0
  input_ids = np.full([n, max_seq_length], pad_id, np.int32)
  documents = np.zeros([n, max_seq_length], np.int32)
  positions = np.zeros([n, max_seq_length], np.int32)
  for r, row in enumerate(rows):
    start = 0
    for d, piece in enumerate(row.pieces):
      end = start + len(piece) + extra
      if wrapped:
        input_ids[r, start] = cls_id
        input_ids[r, start + 1:end - 1] = piece
        input_ids[r, end - 1] = sep_id
      else:
        input_ids[r, start:end] = piece
      documents[r, start:end] = d + 1
      positions[r, start:end] = np.arange(end - start)
      start = end
  return {"input_ids": input_ids, "segment_ids": np.zeros_like(input_ids),
          "next_sentence_labels": np.zeros([n], np.int32), DOCUMENT_IDS: documents,
          POSITION_IDS: positions}


def efficiency(rows: list[Row], max_seq_length: int) -> float:
  """Real tokens (documents with their [CLS] and [SEP]) over the rows' tokens."""
  return sum(r.used for r in rows) / max(1, len(rows) * max_seq_length)
