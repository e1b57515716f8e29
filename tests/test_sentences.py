"""Tests of data_pipeline/sources/sentences.py: the splitters, on the reference set and on hard input.

The reference set is tests/data/sentence_cases.jsonl (267 cases from real prose;
experiments/benchmarks/data/sentence_splitting.py prints the full table).
"""

import json
import pathlib

import pytest

from data_pipeline.sources import corpora
from data_pipeline.sources import sentences
from data_pipeline import specs
from data_pipeline.sources import word_segmentation
from experiments.benchmarks.data import sentence_splitting
from experiments.configs import data as data_configs

CASES = [json.loads(line) for line in
         (pathlib.Path(__file__).parent / "data" / "sentence_cases.jsonl").read_text(
             encoding="utf-8").splitlines() if line]
ISSUE_EXAMPLE = ("Dr. Smith went to Washington, D.C. in Jan. 1999. He met Mr. J. R. Jones, e.g. "
                 "at 5 p.m. on Monday.")


def _non_space(text: str) -> str:
  return "".join(text.split())


def test_the_reference_set_is_hard_and_each_case_spells_its_text():
  """Fails if the set shrinks under 200 cases, loses a kind, or a case's expected sentences
  are not its text cut in pieces (a typo in the file)."""
  assert len(CASES) >= 200
  kinds = {c["kind"] for c in CASES}
  assert {"abbreviation", "abbreviation_end", "initials", "numbers", "time_date", "ellipsis",
          "quote_bracket", "url_code", "list", "question_exclamation", "cjk",
          "abbreviation_after_end"} <= kinds
  for case in CASES:
    assert _non_space("".join(case["sentences"])) == _non_space(case["text"]), case
    assert all(s == " ".join(s.split()) and s for s in case["sentences"]), case


def test_blingfire_splits_the_reference_set_far_better_than_the_regex():
  """Fails if the default splitter's exact-match share drops under 93%, its boundary
  precision under 0.98 or F1 under 0.95 (94%, 0.995 and 0.96 measured), or if the regex
  (kept for old workdirs) stops splitting as it always did."""
  blingfire = sentence_splitting.score(sentences.splitter("blingfire"), CASES)
  regex = sentence_splitting.score(sentences.splitter("regex"), CASES)
  assert blingfire["exact"] >= 0.93 and blingfire["precision"] >= 0.98, blingfire
  assert blingfire["f1"] >= 0.95, blingfire
  assert blingfire["altered"] == 0
  assert regex["exact"] < 0.65 and regex["precision"] < 0.6, regex  # splits every "Dr."


def test_the_issue_example_is_two_sentences_not_ten():
  """Fails if blingfire cuts after an abbreviation or an initial, or if the regex changed."""
  assert sentences.splitter("blingfire")(ISSUE_EXAMPLE) == [
      "Dr. Smith went to Washington, D.C. in Jan. 1999.",
      "He met Mr. J. R. Jones, e.g. at 5 p.m. on Monday."]
  assert len(sentences.splitter("regex")(ISSUE_EXAMPLE)) == 10
  assert corpora.split_sentences is sentences.split_sentences  # still importable from corpora


def test_gold_word_marks_never_move_a_boundary_and_are_kept():
  """Fails if marking every word (as chinese_data.write_corpus does) changes where blingfire
  cuts, or a mark is lost or lands in the sentence before its word."""
  mark = word_segmentation.WORD_MARK
  split = sentences.splitter("blingfire")
  for case in CASES:
    text = case["text"]
    if case["kind"] == "cjk":  # a mark before every character (a one-character word)
      marked = "".join(c if c.isspace() else mark + c for c in text)
    else:  # a mark before every word
      marked = " ".join(mark + w for w in text.split(" "))
    got = split(marked)
    assert [s.replace(mark, "") for s in got] == split(text), case
    assert "".join(got).count(mark) == marked.count(mark)
    assert all(not s.endswith(mark) for s in got)


def test_sentences_are_pieces_of_the_input_whatever_the_library_drops():
  """Fails if a character Bling Fire drops (U+200B, NUL) is lost from the sentences, or a
  closing quote or a list label is left on its own."""
  split = sentences.splitter("blingfire")
  text = "A\u200bB is one. X\x00y is \u200btwo. Three\u200b."
  got = split(text)
  assert len(got) == 3 and _non_space("".join(got)) == _non_space(text), got
  assert split("他说：“好。”然后走了。") == ["他说：“好。”", "然后走了。"]
  assert split("Do two things. 1. Open it. 2. Close it.") == [
      "Do two things.", "1. Open it.", "2. Close it."]
  assert split("   \n ") == [] and split("no end mark") == ["no end mark"]
  assert split("Line one\nstill one. Two.") == ["Line one still one.", "Two."]


def test_an_unknown_or_unloadable_splitter_is_refused_in_one_line(monkeypatch):
  """Fails if a typo in data.sentence_splitter, or blingfire's library failing to load (an ARM
  host), is not a one-line ValueError naming the field -- or if it refuses a BERT-format
  corpus, which is never split."""
  config = data_configs.data_config()
  config.sentence_splitter = "spacy"
  with pytest.raises(ValueError, match=r"data.sentence_splitter must be one of"):
    specs.validate(config)

  def fails():
    raise OSError("wrong ELF class: ELFCLASS64")
  monkeypatch.setattr(sentences, "_blingfire", fails)
  config.sentence_splitter = "blingfire"
  specs.validate(config)  # the embedded corpus: BERT format, no splitter needed
  config.corpus = "raw:/data/*.txt"
  with pytest.raises(ValueError) as refusal:
    specs.validate(config)
  assert "data.sentence_splitter='regex'" in str(refusal.value)
  assert "\n" not in str(refusal.value)


def test_raw_documents_use_the_splitter_asked_for_and_the_regex_otherwise(tmp_path):
  """Fails if read_documents ignores sentence_splitter, or if its default stopped being the
  regex (what callers without the option always got)."""
  (tmp_path / "raw.txt").write_text(ISSUE_EXAMPLE + "\nShort one. Two.\n")
  corpus = f"raw:{tmp_path}/raw.txt"
  new = list(corpora.read_documents(corpus, split="all", sentence_splitter="blingfire"))
  old = list(corpora.read_documents(corpus, split="all"))
  assert [len(d) for d in new] == [2, 2]
  assert [len(d) for d in old] == [10, 2]


def test_a_record_from_before_the_splitter_resumes_only_with_the_regex(tmp_path):
  """A workdir recorded before data.sentence_splitter existed split raw/JSONL/Parquet/tfds text
  by the regex: resuming it with the new default would change its sentences, so the record
  compares as if it said "regex"; BERT-format and embedded corpora are never split, so there
  the new default resumes. Fails if the missing field is waved through or always refused."""
  from bert_jax.run import workdir

  def resume(corpus, splitter):
    old = {"config": {"data.corpus": corpus}}  # as the code before the field wrote it
    new = {"config": {"data.corpus": corpus, "data.sentence_splitter": splitter},
           "bert_config": {}, "data": {}}
    return workdir.differences(old, new, quiet=True)

  assert resume("raw:/data/*.txt", "blingfire") == [
      ("config.data.sentence_splitter", "regex", "blingfire")]
  assert resume("jsonl:/data/*.jsonl", "regex") == []
  assert resume("parquet:/data/*.parquet", "blingfire") != []
  assert resume("embedded", "blingfire") == []
  assert resume("/data/bert_format_*.txt", "blingfire") == []
  # The refusal names the flag that resumes it as it ran.
  with pytest.raises(workdir.WorkdirError,
                     match=r"to resume it as it ran, --config.data.sentence_splitter='regex'; "):
    done = tmp_path / "checkpoints" / "1"  # work the record speaks for (a committed step)
    done.mkdir(parents=True)
    (done / "_CHECKPOINT_METADATA").write_text("{}")
    workdir.check_record(str(tmp_path), {"config": {"data.corpus": "raw:/data/*.txt"}},
                         {"config": {"data.corpus": "raw:/data/*.txt",
                                     "data.sentence_splitter": "blingfire"},
                          "bert_config": {}, "data": {}, "code_version": "x"}, quiet=True)
