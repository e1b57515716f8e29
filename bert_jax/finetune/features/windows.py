"""Overlapping windows over a piece sequence longer than the model's rows.

SQuAD contexts (squad.py) and long tagged sentences (token_features.py) are
cut the way google-research/bert's run_squad cuts contexts: windows of at
most `max_len` pieces, `stride` apart, the last ending on the last piece; a
piece in several windows is scored only in the one that gives it the most
context on both sides.
"""


def doc_spans(num_pieces: int, max_len: int, stride: int) -> list[tuple[int, int]]:
  """(start, length) windows over the pieces, `stride` apart ([] for no pieces)."""
  spans, start = [], 0
  while start < num_pieces:
    length = min(num_pieces - start, max_len)
    spans.append((start, length))
    if start + length == num_pieces:
      break
    start += min(length, stride)
  return spans


def is_max_context(spans, span_index: int, position: int) -> bool:
  """Whether window `span_index` gives piece `position` the most context.

  Score: the smaller of left and right context, plus a tiny bonus for longer
  windows to break ties, so each piece is scored by exactly one window.
  """
  best_score, best_index = None, None
  for i, (start, length) in enumerate(spans):
    end = start + length - 1
    if start <= position <= end:
      score = min(position - start, end - position) + 0.01 * length
      if best_score is None or score > best_score:
        best_score, best_index = score, i
  return best_index == span_index
