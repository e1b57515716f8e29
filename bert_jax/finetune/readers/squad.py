"""SQuAD v1.1 / v2.0 span question answering: reading, windowed features, post-processing.

Follows the procedure of google-research/bert's run_squad (which the paper's
numbers come from): contexts split on whitespace into words, answers mapped
from character offsets to words, long contexts cut into overlapping windows
of wordpieces (doc_stride), every wordpiece scored in the window where it has
the most context, and predictions chosen from the n best start/end pairs,
with a no-answer score for v2.0.

Tokenization is a parameter: `tokenize_word(str) -> list[str]` gives the
wordpieces of one whitespace-delimited word (lowercasing, punctuation
splitting and WordPiece included) and `vocab` maps them to ids, so nothing
here depends on TensorFlow.
"""

import dataclasses
import json
import logging
import os
from typing import Callable, Mapping, Sequence

import numpy as np

from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import text_files
from bert_jax.finetune.features import windows
from host import paths

TokenizeWord = Callable[[str], list[str]]


@dataclasses.dataclass
class SquadExample:
  """One question on one context, the context split into whitespace words."""
  qas_id: str
  question_text: str
  doc_tokens: list[str]
  answers: list[str]           # every gold answer text (what evaluation scores); [] if none
  is_impossible: bool          # v2.0 unanswerable question
  orig_answer_text: str = ""   # the answer the model is trained on ("" if none)
  start_position: int = -1     # its first and last word; -1 when there is none
  end_position: int = -1


def _is_whitespace(c: str) -> bool:
  # Exactly run_squad's set (U+202F occurs in SQuAD contexts): other Unicode
  # spaces such as U+00A0 stay inside words there, and word boundaries decide
  # the training targets, so we split where it splits.
  return c in " \t\r\n" or ord(c) == 0x202F


def split_words(text: str) -> tuple[list[str], list[int]]:
  """Whitespace words of a text and, for each character, the index of its word
  (whitespace maps to the word before it, -1 before the first)."""
  words, char_to_word = [], []
  prev_is_space = True
  for c in text:
    if _is_whitespace(c):
      prev_is_space = True
    else:
      if prev_is_space:
        words.append(c)
      else:
        words[-1] += c
      prev_is_space = False
    char_to_word.append(len(words) - 1)
  return words, char_to_word


def _require(obj, key: str, kind: type, where: str):
  """obj[key], checked to be a `kind`; a ValueError naming where it is otherwise."""
  if not isinstance(obj, dict) or key not in obj:
    raise ValueError(f"{where}: missing field {key!r}")
  value = obj[key]
  if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
    raise ValueError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
  return value


def read_squad(path, *, is_training: bool) -> list[SquadExample]:
  """Reads a SQuAD v1.1 or v2.0 JSON file.

  Training mode needs one answer per answerable question and uses the first
  when there are several. An answer whose offsets do not point at its text
  (checked as run_squad does: the answer's words must contain the whitespace-
  normalised answer text) cannot be trained on: the question is skipped and
  the skips are counted in a log warning. In evaluation mode every question is
  kept, since scoring compares texts only.

  Malformed JSON (or a byte that is not UTF-8) is an error naming the file and
  line; a missing or mistyped field, an error naming the file and the JSON path
  of the field. The file may be local or gs://.
  """
  path = os.fspath(path)
  text = text_files.decode_text(path, paths.read_bytes(path))
  if not text.strip():
    raise ValueError(f"{path}: the file is empty (expected SQuAD JSON)")
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}:{e.lineno}:{e.colno}: malformed JSON ({e.msg})") from None
  articles = _require(data, "data", list, str(path))
  examples, seen_ids, skipped = [], set(), []
  for a, article in enumerate(articles):
    paragraphs = _require(article, "paragraphs", list, f"{path}: data[{a}]")
    for p, paragraph in enumerate(paragraphs):
      where_p = f"{path}: data[{a}].paragraphs[{p}]"
      context = _require(paragraph, "context", str, where_p)
      doc_tokens, char_to_word = split_words(context)
      for q, qa in enumerate(_require(paragraph, "qas", list, where_p)):
        where = f"{where_p}.qas[{q}]"
        qas_id = _require(qa, "id", str, where)
        where = f"{where} (id {qas_id!r})"
        if qas_id in seen_ids:
          raise ValueError(f"{where}: duplicate question id")
        seen_ids.add(qas_id)
        question = _require(qa, "question", str, where)
        answers = _require(qa, "answers", list, where)
        is_impossible = qa.get("is_impossible", False)   # absent in v1.1 files
        if not isinstance(is_impossible, bool):
          raise ValueError(f"{where}.is_impossible: expected bool")
        texts, starts = [], []
        for i, answer in enumerate(answers):
          texts.append(_require(answer, "text", str, f"{where}.answers[{i}]"))
          starts.append(_require(answer, "answer_start", int, f"{where}.answers[{i}]"))
        if is_impossible:
          texts = []   # v2.0 keeps none; plausible_answers are not gold
        example = SquadExample(qas_id, question, doc_tokens, texts, is_impossible)
        if texts:
          span = _answer_span(context, doc_tokens, char_to_word, texts[0], starts[0])
          if span is None:
            skipped.append(qas_id)
            if is_training:
              continue
          else:
            example.orig_answer_text = texts[0]
            example.start_position, example.end_position = span
        elif is_training and not is_impossible:
          raise ValueError(f"{where}: an answerable training question needs an answer")
        examples.append(example)
  if skipped:
    logging.warning("%s: %d answers do not match their offsets in the context (%s), "
                    "e.g. question %s", path, len(skipped),
                    "questions skipped" if is_training else "kept for evaluation",
                    skipped[0])
  return examples


def _answer_span(context, doc_tokens, char_to_word, text, start) -> tuple[int, int] | None:
  """(first word, last word) of an answer, or None if the offsets are wrong."""
  end = start + len(text) - 1
  if not text or start < 0 or end >= len(context):
    return None
  first, last = char_to_word[start], char_to_word[end]
  if first < 0:
    return None
  actual = " ".join(doc_tokens[first:last + 1])
  if " ".join(text.split()) not in actual:
    return None
  return first, last


def gold_answers(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
  """Question id -> gold answer texts, the `gold` argument of metrics.squad_evaluate."""
  return {e.qas_id: list(e.answers) for e in examples}


# ---------------------------------------------------------------------------- features


@dataclasses.dataclass
class SquadFeature:
  """One window of one example: `[CLS] question [SEP] context piece [SEP]`."""
  unique_id: int
  example_index: int
  doc_span_index: int
  tokens: list[str]
  token_to_orig_map: dict[int, int]       # token position -> word index in the context
  token_is_max_context: dict[int, bool]   # whether this window scores that token
  input_ids: list[int]
  input_mask: list[int]
  segment_ids: list[int]
  start_position: int = 0   # training target; 0 ([CLS]) = no answer in this window
  end_position: int = 0
  is_impossible: bool = False


def _improve_answer_span(doc_pieces, start, end, answer_text, tokenize_word):
  """The sub-span of [start, end] whose pieces equal the tokenized answer.

  Word-level offsets can overshoot: for the answer "1895" in the word
  "(1895-1943)." the word's pieces include brackets and the other year.
  """
  target = " ".join(packing.tokenize_text(answer_text, tokenize_word))
  for new_start in range(start, end + 1):
    for new_end in range(end, new_start - 1, -1):
      if " ".join(doc_pieces[new_start:new_end + 1]) == target:
        return new_start, new_end
  return start, end


def convert_examples_to_features(examples: Sequence[SquadExample], *,
                                 tokenize_word: TokenizeWord, vocab: Mapping[str, int],
                                 max_seq_length: int, doc_stride: int, max_query_length: int,
                                 is_training: bool,
                                 unique_id_start: int = 1000000000) -> list[SquadFeature]:
  """Windows of wordpieces, ready for the QA head.

  Args:
    examples: from read_squad.
    tokenize_word: wordpieces of one whitespace word.
    vocab: wordpiece -> id.
    max_seq_length: tokens per window, padding included (paper: 384).
    doc_stride: step between window starts, in pieces (paper: 128).
    max_query_length: the question is cut to this many pieces (paper: 64).
    is_training: set start/end targets (0 when the answer is not inside).
    unique_id_start: id of the first feature; results are keyed by it.
  """
  features = []
  unique_id = unique_id_start
  for example_index, example in enumerate(examples):
    query = packing.tokenize_text(example.question_text, tokenize_word)[:max_query_length]
    max_doc = max_seq_length - len(query) - 3
    if max_doc <= 0:
      raise ValueError(f"max_seq_length={max_seq_length} leaves no room for context after a "
                       f"{len(query)}-piece question (max_query_length={max_query_length})")
    piece_to_word, word_to_piece, pieces = [], [], []
    for w, word in enumerate(example.doc_tokens):
      word_to_piece.append(len(pieces))
      for piece in tokenize_word(word):
        piece_to_word.append(w)
        pieces.append(piece)
    target = None
    if is_training and not example.is_impossible and example.start_position >= 0:
      start = word_to_piece[example.start_position]
      end = (word_to_piece[example.end_position + 1] - 1
             if example.end_position + 1 < len(example.doc_tokens) else len(pieces) - 1)
      target = _improve_answer_span(pieces, start, end, example.orig_answer_text, tokenize_word)
    spans = windows.doc_spans(len(pieces), max_doc, doc_stride)
    if not spans:
      logging.warning("question %s: the context has no wordpieces; no features",
                      example.qas_id)
    for span_index, (span_start, span_len) in enumerate(spans):
      tokens, segment_ids = packing.pack(query, pieces[span_start:span_start + span_len])
      # Context piece i of the window sits after [CLS] query [SEP].
      offset = len(query) + 2 - span_start
      token_to_orig = {i + offset: piece_to_word[i]
                       for i in range(span_start, span_start + span_len)}
      is_max = {i + offset: windows.is_max_context(spans, span_index, i)
                for i in range(span_start, span_start + span_len)}
      try:
        input_ids = [vocab[t] for t in tokens]
      except KeyError as e:
        raise ValueError(f"question {example.qas_id}: token {e.args[0]!r} is not in the "
                         "vocabulary") from None
      pad = max_seq_length - len(tokens)
      feature = SquadFeature(
          unique_id=unique_id, example_index=example_index, doc_span_index=span_index,
          tokens=tokens, token_to_orig_map=token_to_orig, token_is_max_context=is_max,
          input_ids=input_ids + [0] * pad, input_mask=[1] * len(tokens) + [0] * pad,
          segment_ids=segment_ids + [0] * pad, is_impossible=example.is_impossible)
      if target is not None and span_start <= target[0] and target[1] < span_start + span_len:
        feature.start_position, feature.end_position = target[0] + offset, target[1] + offset
      features.append(feature)
      unique_id += 1
  return features


def features_to_arrays(features: Sequence[SquadFeature]) -> dict[str, np.ndarray]:
  """Stacks features into int32 arrays: input_ids, input_mask, segment_ids [N, T];
  start_positions, end_positions [N]; and unique_ids [N] (int64)."""
  return {
      "input_ids": np.asarray([f.input_ids for f in features], np.int32),
      "input_mask": np.asarray([f.input_mask for f in features], np.int32),
      "segment_ids": np.asarray([f.segment_ids for f in features], np.int32),
      "start_positions": np.asarray([f.start_position for f in features], np.int32),
      "end_positions": np.asarray([f.end_position for f in features], np.int32),
      "unique_ids": np.asarray([f.unique_id for f in features], np.int64),
  }


# ---------------------------------------------------------------------------- predictions


def _detokenize(pieces: Sequence[str]) -> str:
  """Joins wordpieces, gluing "##" continuations to the piece before."""
  text = " ".join(pieces).replace(" ##", "").replace("##", "")
  return " ".join(text.split())


def project_to_original(pred_text: str, orig_text: str, tokenize_word: TokenizeWord) -> str:
  """The span of `orig_text` (original casing and accents) that `pred_text`
  (normalised wordpiece text) covers; `orig_text` itself when they cannot be
  aligned character by character (e.g. [UNK] pieces).

  The prediction is built from whole wordpieces, so it can start or end inside
  an original word ("Nieuwl" of "Nieuwland"); this trims the original words to it.
  """
  tok_text = " ".join(_detokenize(tokenize_word(w)) for w in orig_text.split())
  start = tok_text.find(pred_text)
  if start < 0:
    return orig_text

  def non_space_positions(text):
    return [i for i, c in enumerate(text) if c != " "]

  orig_pos, tok_pos = non_space_positions(orig_text), non_space_positions(tok_text)
  if len(orig_pos) != len(tok_pos):
    return orig_text
  tok_to_ns = {p: i for i, p in enumerate(tok_pos)}
  end = start + len(pred_text) - 1
  if start not in tok_to_ns or end not in tok_to_ns:
    return orig_text
  return orig_text[orig_pos[tok_to_ns[start]]:orig_pos[tok_to_ns[end]] + 1]


# null_odds of a question whose context produced no window (finite, for JSON).
_NO_WINDOW_NULL_ODDS = 1e30


def _top_indexes(logits, n: int) -> list[int]:
  return [int(i) for i in np.argsort(-np.asarray(logits), kind="stable")[:n]]


def postprocess_predictions(examples: Sequence[SquadExample],
                            features: Sequence[SquadFeature],
                            results: Mapping[int, tuple[Sequence[float], Sequence[float]]], *,
                            tokenize_word: TokenizeWord, n_best_size: int,
                            max_answer_length: int, version_2_with_negative: bool,
                            null_score_diff_threshold: float):
  """Answer texts from start/end logits.

  Args:
    examples, features: as given to / returned by convert_examples_to_features.
    results: feature unique_id -> (start_logits, end_logits) over its tokens.
    tokenize_word: the tokenizer the features were made with.
    n_best_size: candidate starts and ends per window, and answers kept (paper: 20).
    max_answer_length: longest answer in wordpieces (paper: 30).
    version_2_with_negative: consider "no answer": the [CLS] score, lowest over
      the example's windows.
    null_score_diff_threshold: predict "" when null score minus best span
      score exceeds it (v2.0; tune it on dev, e.g. with best_f1_thresh).

  Returns:
    (predictions: id -> text, nbest: id -> [{text, probability, start_logit,
    end_logit}], null_odds: id -> null score minus best span score (v2.0 only)).
  """
  by_example = {}
  for f in features:
    by_example.setdefault(f.example_index, []).append(f)
  predictions, nbest_json, null_odds = {}, {}, {}
  for example_index, example in enumerate(examples):
    candidates = []   # (score, start logit, end logit, feature, start, end); start 0 = null
    null = None
    for f in by_example.get(example_index, []):
      if f.unique_id not in results:
        raise ValueError(f"question {example.qas_id}: no result for feature {f.unique_id}")
      start_logits, end_logits = (np.asarray(x, np.float64) for x in results[f.unique_id])
      if version_2_with_negative:
        score = start_logits[0] + end_logits[0]
        if null is None or score < null[0]:
          null = (score, start_logits[0], end_logits[0], f, 0, 0)
      for s in _top_indexes(start_logits, n_best_size):
        for e in _top_indexes(end_logits, n_best_size):
          # Only context pieces, in order, short enough, and scored by this window.
          if (s not in f.token_to_orig_map or e not in f.token_to_orig_map or e < s
              or e - s + 1 > max_answer_length or not f.token_is_max_context.get(s, False)):
            continue
          candidates.append((start_logits[s] + end_logits[e], start_logits[s], end_logits[e],
                             f, s, e))
    if null is not None:
      candidates.append(null)
    candidates.sort(key=lambda c: c[0], reverse=True)
    nbest, seen = [], set()
    for score, s_logit, e_logit, f, s, e in candidates:
      if len(nbest) >= n_best_size:
        break
      if s > 0:
        words = example.doc_tokens[f.token_to_orig_map[s]:f.token_to_orig_map[e] + 1]
        text = project_to_original(_detokenize(f.tokens[s:e + 1]), " ".join(words),
                                   tokenize_word)
      else:
        text = ""
      if text in seen:
        continue
      seen.add(text)
      nbest.append({"text": text, "start_logit": float(s_logit), "end_logit": float(e_logit)})
    if null is not None and "" not in seen:
      nbest.append({"text": "", "start_logit": float(null[1]), "end_logit": float(null[2])})
    if not nbest:
      # No window gave a valid span (e.g. an empty context). run_squad answers
      # "empty" so every question has a prediction; v2.0 can say "no answer".
      nbest.append({"text": "" if version_2_with_negative else "empty",
                    "start_logit": 0.0, "end_logit": 0.0})
    totals = np.array([x["start_logit"] + x["end_logit"] for x in nbest])
    probs = np.exp(totals - totals.max())
    probs /= probs.sum()
    for entry, prob in zip(nbest, probs):
      entry["probability"] = float(prob)
    nbest_json[example.qas_id] = nbest
    if not version_2_with_negative:
      predictions[example.qas_id] = nbest[0]["text"]
      continue
    best_span = next((x for x in nbest if x["text"]), None)
    # With no span candidate at all the answer is "no answer", whatever the
    # threshold; with no window at all the odds are set beyond any threshold.
    span_score = best_span["start_logit"] + best_span["end_logit"] if best_span else 0.0
    diff = float(null[0] - span_score) if null is not None else _NO_WINDOW_NULL_ODDS
    null_odds[example.qas_id] = diff
    if best_span is None or diff > null_score_diff_threshold:
      predictions[example.qas_id] = ""
    else:
      predictions[example.qas_id] = best_span["text"]
  return predictions, nbest_json, null_odds


def write_predictions(output_dir, predictions: Mapping[str, str],
                      nbest: Mapping[str, list] | None = None,
                      null_odds: Mapping[str, float] | None = None) -> None:
  """Writes predictions.json (the file the official evaluate scripts read) and,
  when given, nbest_predictions.json and null_odds.json (their --na-prob-file),
  each whole or not at all, into a local or gs:// directory."""
  paths.makedirs(output_dir)
  files = {"predictions.json": predictions, "nbest_predictions.json": nbest,
           "null_odds.json": null_odds}
  for name, content in files.items():
    if content is not None:
      paths.write_atomic(paths.join(output_dir, name),
                         json.dumps(content, indent=2, ensure_ascii=False))
