"""Tests of parquet:<glob> corpora (data_pipeline/sources/parquet_files.py through corpora.py).

The files are written here with pyarrow, as Hugging Face datasets distributes
Wikipedia: a "text" column (with nulls and empty texts), other columns beside it.
"""

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipeline.sources import corpora
from data_pipeline.sources import parquet_files
from data_pipeline import prepare
from data_pipeline.examples import pretraining
from data_pipeline.store import prepare_corpus
from experiments.configs import data as data_configs
from host import paths


def _write(path, texts, *, column="text", row_group_size=None):
  table = pa.table({"id": list(range(len(texts))), column: pa.array(texts, pa.string())})
  pq.write_table(table, str(path), row_group_size=row_group_size)


def _texts(prefix, n):
  return [f"{prefix} article {i} opens here. Dr. Lee wrote it in 3.5 days.\n\n"
          f"A second paragraph of {prefix} {i}! It ends." for i in range(n)]


def test_rows_are_documents_and_null_or_empty_texts_are_counted_and_skipped(tmp_path):
  """Fails if a row is not one paragraph- and sentence-split document, or a null or empty
  text is yielded or goes uncounted."""
  _write(tmp_path / "wiki.parquet", ["It opens. Dr. Lee came at 5 p.m. today? Yes.\n\nNew para.",
                                     None, "", "  ", "Last row."])
  stats = corpora.CorpusStats()
  docs = list(corpora.read_documents(f"parquet:{tmp_path}/*.parquet", split="all", stats=stats,
                                     sentence_splitter="blingfire"))
  assert docs == [["It opens.", "Dr. Lee came at 5 p.m. today?", "Yes.", "New para."],
                  ["Last row."]]
  assert (stats.rows, stats.null_texts, stats.empty_documents, stats.documents) == (5, 1, 2, 2)


def test_a_missing_or_non_text_column_is_one_refusal_line_listing_the_columns(tmp_path):
  """Fails if a wrong data.text_field reads nothing silently, or its refusal is not one line
  naming the file, the field and the file's columns."""
  _write(tmp_path / "a.parquet", ["Some text."], column="content")
  with pytest.raises(ValueError) as refusal:
    list(corpora.read_documents(f"parquet:{tmp_path}/a.parquet", split="all"))
  message = str(refusal.value)
  assert "a.parquet" in message and "'text'" in message and "id, content" in message
  assert "config.data.text_field" in message and "\n" not in message
  with pytest.raises(ValueError, match=r"column 'id' .*is int64, not text"):
    list(corpora.read_documents(f"parquet:{tmp_path}/a.parquet", split="all", text_field="id"))
  (tmp_path / "b.parquet").write_text("not parquet at all\n")
  with pytest.raises(ValueError, match=r"b.parquet: not a readable Parquet file"):
    list(corpora.read_documents(f"parquet:{tmp_path}/b.parquet", split="all"))


def test_files_in_sorted_order_and_two_processes_read_disjoint_shares(tmp_path):
  """Fails if several files are not read in sorted order, or 2 processes' shares overlap or
  miss a document -- by file with >= 2 files, by document with one file."""
  for name in ("b", "a", "c"):
    _write(tmp_path / f"{name}.parquet", _texts(name, 5), row_group_size=2)
  pattern = f"parquet:{tmp_path}/*.parquet"
  everything = list(corpora.read_documents(pattern, split="all"))
  assert [d[0].split()[0] for d in everything] == ["a"] * 5 + ["b"] * 5 + ["c"] * 5
  for corpus in (pattern, f"parquet:{tmp_path}/a.parquet"):
    whole = list(corpora.read_documents(corpus, split="all"))
    shares = [list(corpora.read_documents(corpus, split="all", process_index=p,
                                          process_count=2)) for p in range(2)]
    assert all(shares) and sorted(shares[0] + shares[1]) == sorted(whole)
    assert not {json.dumps(d) for d in shares[0]} & {json.dumps(d) for d in shares[1]}


def test_row_groups_read_as_pieces_of_the_whole_file(tmp_path):
  """Fails if a store's row-group shards do not add up to the whole-file pass, in order."""
  _write(tmp_path / "a.parquet", _texts("a", 7), row_group_size=3)
  path = str(tmp_path / "a.parquet")
  assert parquet_files.row_group_count(path) == 3
  stats = corpora.CorpusStats()
  whole = list(corpora.file_documents("parquet", path, max_line_bytes=1 << 20, stats=stats))
  pieces = [d for g in range(3) for d in corpora.file_documents(
      "parquet", path, max_line_bytes=1 << 20, stats=corpora.CorpusStats(),
      row_groups=range(g, g + 1))]
  assert pieces == whole and len(whole) == 7
  with pytest.raises(ValueError, match="row groups, not a byte range"):
    corpora.file_documents("parquet", path, max_line_bytes=1 << 20, stats=stats,
                           byte_range=(0, 10))


def test_an_overlong_text_is_skipped_and_the_fingerprint_covers_the_files(tmp_path):
  """Fails if a text over max_line_bytes is read (a JSONL line that long is not), or the
  corpus fingerprint a workdir records misses a changed Parquet file."""
  _write(tmp_path / "a.parquet", ["Short. Text.", "x" * 5000 + ". Long."])
  corpus = f"parquet:{tmp_path}/*.parquet"
  stats = corpora.CorpusStats()
  assert list(corpora.read_documents(corpus, split="all", max_line_bytes=4096, stats=stats)) == [
      ["Short.", "Text."]]
  assert stats.overlong_lines == 1
  before = corpora.fingerprint(corpus)
  assert before["files"] == 1 and before["bytes"] == (tmp_path / "a.parquet").stat().st_size
  _write(tmp_path / "a.parquet", ["Short. Text. More text here."])
  assert corpora.fingerprint(corpus) != before


def test_a_parquet_file_in_a_bucket_reads_like_a_local_one(gcs_emulator, tmp_path):
  """Fails if a gs:// Parquet file is not read through the path layer as the local one is."""
  _write(tmp_path / "a.parquet", _texts("gcs", 4), row_group_size=2)
  bucket = gcs_emulator.bucket("parquet-corpus")
  paths.copy_file(str(tmp_path / "a.parquet"), f"{bucket}/wiki/a.parquet")
  local = list(corpora.read_documents(f"parquet:{tmp_path}/a.parquet", split="all"))
  remote = list(corpora.read_documents(f"parquet:{bucket}/wiki/*.parquet", split="all"))
  assert remote == local and len(local) == 4


def test_pretraining_batches_over_parquet_equal_those_over_the_same_jsonl(tmp_path, uncased_vocab):
  """Fails if a parquet: corpus does not feed pretraining exactly as the same texts in a
  jsonl: corpus do (same documents, sentences, pairs and masks), read in memory or from a
  tokenized store whose shards are the file's row groups."""
  words = [w for w in uncased_vocab.read_text().split("\n") if w.isalpha() and w.isascii()][:4000]
  rng = np.random.default_rng(0)
  texts = [" ".join(" ".join(rng.choice(words, rng.integers(4, 12))).capitalize() + "."
                    for _ in range(rng.integers(2, 8))) for _ in range(120)]
  texts[5] = None
  _write(tmp_path / "corpus.parquet", texts, row_group_size=50)
  (tmp_path / "corpus.jsonl").write_text(
      "".join(json.dumps({"text": t}) + "\n" for t in texts if t is not None))
  batches = {}
  for kind in ("parquet", "jsonl", "parquet_store"):
    config = data_configs.data_config()
    config.corpus = f"{kind.split('_')[0]}:{tmp_path}/corpus.{kind.split('_')[0]}"
    config.vocab_file = str(uncased_vocab)
    config.max_seq_length = 64
    config.heldout_modulus = 10
    if kind == "parquet_store":
      config.tokenized_dir = str(tmp_path / "store")
      config.shard_bytes = 4096  # the ~29 KB file in shards of whole row groups
      data = prepare.PretrainingData.prepare(prepare.one_phase(config, 3), batch_size=16,
                                             eval_batch_size=16, total_steps=3)
      source = data.train_input()
    else:
      source = pretraining.PretrainingInput(config, batch_size=16)
    batches[kind] = [next(source) for _ in range(3)]
  shards = list((tmp_path / "store").rglob("*.tok"))
  assert len(shards) == 3  # 120 rows in row groups of 50: one shard each
  for other in ("jsonl", "parquet_store"):
    for got, want in zip(batches["parquet"], batches[other]):
      assert got.keys() == want.keys()
      for key in got:
        np.testing.assert_array_equal(got[key], want[key], err_msg=f"{other}: {key}")
  assert batches["parquet"][0]["input_mask"].sum() > 16 * 32  # real text, not padding


def damage_page(path, row_group: int) -> None:
  """Flips 8 bytes in the middle of a row group's text page (of a file `paged` wrote): its
  snappy data no longer decodes (tests/test_refusals.py uses it too)."""
  column = pq.ParquetFile(str(path)).metadata.row_group(row_group).column(0)
  assert not column.has_dictionary_page  # the text is in the one page
  data = bytearray(path.read_bytes())
  middle = column.data_page_offset + column.total_compressed_size // 2
  for k in range(middle, middle + 8):
    data[k] ^= 0xFF
  path.write_bytes(bytes(data))


def paged(path, rows: int = 300):
  """A file of `rows` texts in row groups of 100, snappy pages without a dictionary; `path`."""
  texts = [" ".join(f"word{(7 * i + j) % 97}" for i in range(40)) + ". Another sentence."
           for j in range(rows)]
  pq.write_table(pa.table({"text": texts}), str(path), compression="snappy",
                 row_group_size=100, use_dictionary=False)
  return path


def _store_config(corpus: str, vocab, tokenized_dir):
  config = data_configs.data_config()
  config.corpus, config.vocab_file, config.tokenized_dir = corpus, str(vocab), str(tokenized_dir)
  config.prepare_workers = 1
  return config


def _prepare(config):
  return prepare_corpus.prepare_store(config, vocab_file=config.vocab_file, spm_model_file="",
                                      num_workers=1)


def test_a_corrupt_data_page_is_one_line_naming_the_file_and_row_group(tmp_path, uncased_vocab):
  """Fails if a page that does not decode comes out as pyarrow's bare OSError (a 68-line
  traceback ending "Corrupt snappy compressed data", no file named) rather than one line
  naming the file, its row group and what to do, read in memory or into a store; or if
  the refused preparation leaves anything in the store root."""
  paged(tmp_path / "wiki.parquet")
  damage_page(tmp_path / "wiki.parquet", 1)
  expected = (f"corpus file {tmp_path / 'wiki.parquet'}: row group 1 (of 0-2; 100 rows) cannot "
              "be read (Corrupt snappy compressed data.): the file is damaged; fetch or write it "
              "again, or remove it from the parquet: glob (config.data.corpus)")
  with pytest.raises(ValueError) as refusal:
    list(corpora.read_documents(f"parquet:{tmp_path}/*.parquet", split="all"))
  assert str(refusal.value) == expected
  with pytest.raises(ValueError) as refusal:
    _prepare(_store_config(f"parquet:{tmp_path}/*.parquet", uncased_vocab, tmp_path / "stores"))
  assert str(refusal.value) == expected
  assert not (tmp_path / "stores").exists()


def test_an_empty_parquet_file_is_refused_and_null_texts_are_counted(tmp_path, uncased_vocab,
                                                                      caplog):
  """A 0-byte .parquet is no Parquet file (its footer is mandatory): a failed download. Fails
  if it is dropped without a word (as it was) rather than refused by name, in memory or by
  the store, or leaves anything in the store root; or if the rows whose text is null go
  uncounted in the store's report of the corpus."""
  _write(tmp_path / "a.parquet", _texts("a", 6)[:3] + [None, None] + _texts("a", 6)[3:])
  (tmp_path / "b.parquet").write_bytes(b"")
  corpus = f"parquet:{tmp_path}/*.parquet"
  expected = (f"corpus file {tmp_path / 'b.parquet'} is empty (0 bytes), not a Parquet file: a "
              "download or copy that failed? Fetch it again, or remove it from the parquet: glob "
              "(config.data.corpus)")
  with pytest.raises(ValueError) as refusal:
    list(corpora.read_documents(corpus, split="all"))
  assert str(refusal.value) == expected
  with pytest.raises(ValueError) as refusal:
    _prepare(_store_config(corpus, uncased_vocab, tmp_path / "stores"))
  assert str(refusal.value) == expected
  assert not (tmp_path / "stores").exists()

  (tmp_path / "b.parquet").unlink()
  config = _store_config(corpus, uncased_vocab, tmp_path / "stores")
  store = _prepare(config)
  assert store.skipped() == ", 2 Parquet rows with a null text skipped"
  with caplog.at_level(logging.INFO):
    prepare_corpus.read_selection(store, config, split="all", process_index=0, process_count=1)
  assert any(r.getMessage().endswith("tokens, 2 Parquet rows with a null text skipped")
             for r in caplog.records), caplog.text
