r"""Sentence splitters on hard cases and on real prose: accuracy and speed.

  python -m experiments.benchmarks.data.sentence_splitting [--megabytes=4] [--by_kind]

Accuracy: every splitter on the reference set tests/data/sentence_cases.jsonl (267
cases from real prose, and written cases for what it lacks: abbreviations, initials,
decimals, times, ellipses, quotes and brackets after the end mark, URLs and code,
lists, ?/!, CJK 。！？). Per splitter:

* exact: the share of cases whose sentences are exactly the expected ones
  (whitespace inside a sentence collapsed, as the pipeline does);
* boundary precision / recall / F1, a boundary being the number of non-space
  characters before a sentence end (a splitter is judged on where it cuts only);
* altered: cases whose output does not spell the input's non-space characters.

Speed: sentences/s and MB/s of each splitter on --megabytes of running text from the
embedded corpus, one Python thread on one core; "pipeline:<name>" rows time
data_pipeline.sources.sentences.splitter(name), what the corpus readers call. "vs
tokenizer" is the splitter's MB/s over the tokenizer's (--tokenizer_tokens_per_s /
--tokens_per_byte): above 1, splitting is not stage 1's bottleneck; "100M sentences" is
one core's time for Wikipedia's ~100M sentences. Splitters not installed are listed as
such (pysbd, blingfire, sentencex, syntok, nupunkt, spaCy's sentencizer, nltk's punkt
when its model is found offline). On a shared machine run it once, not in a loop. The
method in full and the figures: experiments/results/data_prepare.md.
"""

import json
import pathlib
import time
from typing import Callable

from absl import app
from absl import flags

from data_pipeline.sources import sentences

CASES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "sentence_cases.jsonl"

_MEGABYTES = flags.DEFINE_float("megabytes", 4.0, "MB of embedded-corpus text to time on")
_SLOW_MEGABYTES = flags.DEFINE_float("slow_megabytes", 0.5,
                                     "MB for splitters under 1 MB/s (pysbd), so a run stays short")
_BY_KIND = flags.DEFINE_bool("by_kind", False, "also print exact-match per kind of case")
_TOKENIZER = flags.DEFINE_float("tokenizer_tokens_per_s", 6e5, "the tokenizer's tokens/s per core")
_TOKENS_PER_BYTE = flags.DEFINE_float("tokens_per_byte", 0.275, "tokens per byte of the corpus")
_ONLY = flags.DEFINE_list("only", [], "splitters to run (default: every installed one)")

WIKIPEDIA_SENTENCES = 100e6  # about English Wikipedia's (issue 28)


def _library_splitters() -> dict[str, tuple[str, Callable[[str], list[str]] | None]]:
  """name -> (version or why missing, split function or None)."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  out = {}

  def add(name, package, make):
    try:
      version = importlib.metadata.version(package)
      out[name] = (version, make())
    except Exception as e:  # pylint: disable=broad-except  (a missing or broken optional package)
      out[name] = (f"not available ({type(e).__name__})", None)

  def pysbd_split():
    import pysbd  # pylint: disable=g-import-not-at-top
    return pysbd.Segmenter(language="en", clean=False).segment

  def blingfire_split():
    import blingfire  # pylint: disable=g-import-not-at-top
    return lambda text: blingfire.text_to_sentences(text).split("\n")

  def sentencex_split():
    import sentencex  # pylint: disable=g-import-not-at-top
    return lambda text: list(sentencex.segment("en", text))

  def syntok_split():
    from syntok import segmenter  # pylint: disable=g-import-not-at-top
    return lambda text: ["".join(t.spacing + t.value for t in s)
                         for p in segmenter.analyze(text) for s in p]

  def nupunkt_split():
    import nupunkt  # pylint: disable=g-import-not-at-top
    return nupunkt.sent_tokenize

  def spacy_split():
    import spacy  # pylint: disable=g-import-not-at-top
    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    nlp.max_length = 1 << 24
    return lambda text: [s.text for s in nlp(text).sents]

  def punkt_split():
    import nltk  # pylint: disable=g-import-not-at-top
    nltk.data.find("tokenizers/punkt_tab/english/")  # LookupError offline without the model
    return nltk.sent_tokenize

  add("pysbd", "pysbd", pysbd_split)
  add("blingfire", "blingfire", blingfire_split)
  add("sentencex", "sentencex", sentencex_split)
  add("syntok", "syntok", syntok_split)
  add("nupunkt", "nupunkt", nupunkt_split)
  add("spacy sentencizer", "spacy", spacy_split)
  add("nltk punkt", "nltk", punkt_split)
  return out


def _boundaries(pieces: list[str]) -> tuple[set[int], str]:
  """(sentence ends but the last, as counts of non-space characters; the non-space text)."""
  ends, count = set(), 0
  for piece in pieces:
    count += sum(not c.isspace() for c in piece)
    ends.add(count)
  ends.discard(count)
  return ends, "".join(c for c in "".join(pieces) if not c.isspace())


def score(split: Callable[[str], list[str]], cases: list[dict]) -> dict:
  """Exact-match share, boundary precision/recall/F1 and altered cases of `split`."""
  exact = altered = true_positive = predicted = expected = 0
  by_kind = {}
  for case in cases:
    got = [s for s in (" ".join(p.split()) for p in split(case["text"])) if s]
    want = case["sentences"]
    got_ends, got_text = _boundaries(got)
    want_ends, want_text = _boundaries(want)
    altered += got_text != want_text
    hit = got == want
    exact += hit
    kind = by_kind.setdefault(case["kind"], [0, 0])
    kind[0] += hit
    kind[1] += 1
    true_positive += len(got_ends & want_ends)
    predicted += len(got_ends)
    expected += len(want_ends)
  precision = true_positive / predicted if predicted else 1.0
  recall = true_positive / expected if expected else 1.0
  return {"exact": exact / len(cases), "precision": precision, "recall": recall,
          "f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
          "altered": altered, "by_kind": {k: v[0] / v[1] for k, v in sorted(by_kind.items())}}


def prose(megabytes: float) -> list[str]:
  """About `megabytes` of running text: embedded-corpus documents, each one paragraph."""
  from data_pipeline.sources import embedded  # pylint: disable=g-import-not-at-top
  texts, size, document = [], 0, []
  with open(embedded.embedded_corpus_path(), encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if line:
        document.append(line)
        continue
      if document:
        texts.append(" ".join(document))
        size += len(texts[-1].encode("utf-8"))
        document = []
        if size >= megabytes * 1e6:
          break
  return texts


def speed(split: Callable[[str], list[str]], texts: list[str]) -> tuple[float, float]:
  """(sentences/s, MB/s) of `split` over `texts`, one thread."""
  size = sum(len(t.encode("utf-8")) for t in texts)
  start = time.perf_counter()
  count = sum(len(split(t)) for t in texts)
  seconds = time.perf_counter() - start
  return count / seconds, size / seconds / 1e6


def main(argv):
  del argv
  cases = [json.loads(line) for line in CASES.read_text(encoding="utf-8").splitlines() if line]
  rows = {"regex (today)": (sentences.LEGACY_SPLITTER, sentences.split_sentences)}
  rows.update(_library_splitters())
  for name in sentences.SPLITTERS:
    rows[f"pipeline:{name}"] = ("data_pipeline.sources.sentences", sentences.splitter(name))
  if _ONLY.value:
    rows = {k: v for k, v in rows.items() if any(o in k for o in _ONLY.value)}
  texts = prose(_MEGABYTES.value)
  tokenizer_mb_s = _TOKENIZER.value / _TOKENS_PER_BYTE.value / 1e6
  print(f"{len(cases)} cases, {sum(len(c['sentences']) - 1 for c in cases)} boundaries "
        f"({CASES.name}); speed on {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB of "
        f"embedded-corpus prose; tokenizer ~{tokenizer_mb_s:.1f} MB/s per core")
  print(f"{'splitter':24s} {'version':18s} {'exact':>6s} {'prec':>6s} {'recall':>6s} "
        f"{'F1':>6s} {'altered':>7s} {'sent/s':>9s} {'MB/s':>6s} {'vs tok':>6s} "
        f"{'100M sent':>9s}")
  kinds = {}
  for name, (version, split) in rows.items():
    if split is None:
      print(f"{name:24s} {version}")
      continue
    s = score(split, cases)
    kinds[name] = s["by_kind"]
    sample = texts
    rate, mb_s = speed(split, texts[:max(1, len(texts) // 20)])  # a quick probe first
    if mb_s < 1.0:
      sample = prose(min(_SLOW_MEGABYTES.value, _MEGABYTES.value))
    rate, mb_s = speed(split, sample)
    hours = WIKIPEDIA_SENTENCES / rate / 3600
    print(f"{name:24s} {version:18s} {s['exact']:6.1%} {s['precision']:6.3f} "
          f"{s['recall']:6.3f} {s['f1']:6.3f} {s['altered']:7d} {rate:9,.0f} {mb_s:6.2f} "
          f"{mb_s / tokenizer_mb_s:6.1f} {hours:7.1f} h")
  if _BY_KIND.value and kinds:
    names = list(kinds)
    print("\nexact-match per kind of case")
    print(f"{'kind':22s} " + " ".join(f"{n[:12]:>12s}" for n in names))
    for kind in next(iter(kinds.values())):
      print(f"{kind:22s} " + " ".join(f"{kinds[n][kind]:12.0%}" for n in names))


if __name__ == "__main__":
  app.run(main)
