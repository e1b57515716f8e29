"""The vocabulary, the tokenizer and the tokenized corpus of a pretraining data config.

Stage 1 of the pipeline (see pretraining.py for the rest): read this process's
documents (corpora.py) and tokenize every sentence once, in-graph (a batched
tf.data map over the tokenizer ops of tokenizers.py), into flat id arrays kept
in host memory (2 bytes per token for vocabularies < 65,536 ids). Tokenization
is deterministic, so doing it once per process instead of once per epoch loses
nothing.

Vocabulary: ``vocab_file`` (WordPiece) or ``spm_model_file``; with neither and
the embedded corpus, a WordPiece vocab of ``embedded_vocab_size`` is learnt once
from the embedded corpus (vocab_training.py) and cached beside it, so the
default job needs no download; other corpora require a vocab.

Nothing here is memoised: data_pipeline.prepare.PretrainingData reads a run's
corpus once and holds it; a PretrainingInput built on its own (tests, the
preview) reads its own.
"""

import dataclasses
import functools
import itertools
import logging
import os

import numpy as np
from host.tf_cpu import tf  # TensorFlow with the accelerators hidden from it

from data_pipeline import specs
from data_pipeline.sources import corpora
from data_pipeline.sources import embedded
from data_pipeline.vocab import tokenizers
from data_pipeline.sources import word_segmentation


# Set on an id (int32) that starts a segmented word. Carried inside the ids, not beside
# them, so every cut, truncation and shuffle above moves a token's word start with it
# and none of this module knows about words; pretraining.ExampleStream takes it off.
WORD_START = 1 << 30


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
  """Token ids of every sentence of a list of documents, in flat arrays.

  Attributes:
    ids: token ids of all sentences, concatenated.
    sentence_starts: [num_sentences + 1] offsets of each sentence into ``ids``.
    document_starts: [num_documents + 1] offsets of each document into the
      sentences.
    word_starts: whether ``ids`` (then int32) carry WORD_START on the first piece of
      each word of a word segmentation (data.masking.word_segmentation).
  """
  ids: np.ndarray
  sentence_starts: np.ndarray
  document_starts: np.ndarray
  word_starts: bool = False

  @property
  def num_documents(self) -> int:
    """Number of documents."""
    return len(self.document_starts) - 1

  @property
  def num_tokens(self) -> int:
    """Number of tokens of all sentences."""
    return len(self.ids)

  def document(self, index: int, max_tokens: int) -> list[np.ndarray]:
    """Sentences of a document as id arrays (views), each cut to ``max_tokens``."""
    first, last = self.document_starts[index], self.document_starts[index + 1]
    starts = self.sentence_starts
    return [self.ids[starts[s]:min(starts[s + 1], starts[s] + max_tokens)]
            for s in range(first, last)]


def word_start_table(tokenizer) -> np.ndarray:
  """[vocab] bool: whether a piece id starts a word ("##" / missing "\u2581" continue one):
  the "##" rule, used wherever no word segmentation says otherwise."""
  specials = set(tokenizers.SPECIAL_TOKENS.values())
  if hasattr(tokenizer, "word_starts"):  # a tokenizer.json: its own marker of a word start
    return tokenizer.word_starts()
  if isinstance(tokenizer, tokenizers.SentencePieceTokenizer):
    return np.array([p.startswith("\u2581") or p in specials or (p.startswith("<") and p.endswith(">"))
                     for p in tokenizer.vocab])
  return np.array([not p.startswith("##") for p in tokenizer.vocab])


def resolve_vocab(data_config) -> tuple[str, str]:
  """(vocab_file, spm_model_file) to use; trains and caches a vocab for the embedded corpus."""
  if data_config.vocab_file or data_config.spm_model_file:
    return data_config.vocab_file, data_config.spm_model_file
  if data_config.corpus != "embedded":
    raise ValueError("data.vocab_file (or data.spm_model_file) is required for corpus "
                     f"{data_config.corpus!r}; only the embedded corpus has a default vocab")
  corpus = embedded.embedded_corpus_path(data_config.embedded_cache_dir or None)
  case = "uncased" if data_config.do_lower_case else "cased"
  lines = data_config.embedded_vocab_max_lines
  vocab = corpus.with_name(f"vocab_{data_config.embedded_vocab_size}_{case}"
                           + (f"_{lines}lines" if lines else "") + ".txt")
  if not vocab.exists():
    temp = vocab.with_name(f".{vocab.name}.tmp-{os.getpid()}")
    try:
      # Deferred import: only this default path trains a vocabulary.
      from data_pipeline.vocab import vocab_training  # pylint: disable=g-import-not-at-top
      logging.info("training a %d-token WordPiece vocab on %s (once; cached)",
                   data_config.embedded_vocab_size, corpus)
      vocab_training.train_wordpiece_vocab(
          str(corpus), str(temp), data_config.embedded_vocab_size,
          do_lower_case=data_config.do_lower_case, max_lines=lines or None)
      os.replace(temp, vocab)  # atomic, like the corpus itself
    finally:
      if temp.exists():
        temp.unlink()
  return str(vocab), ""


def load_tokenizer(data_config):
  """The in-graph tokenizer of a data config (WordPiece or SentencePiece)."""
  vocab_file, spm_model_file = resolve_vocab(data_config)
  return tokenizers.load_tokenizer(vocab_file, spm_model_file, data_config.do_lower_case)


def tokenize_documents(documents, tokenizer, *, batch_size: int = 2048, segmentation: str = "",
                       stats: corpora.CorpusStats | None = None) -> TokenizedCorpus:
  """Tokenizes every sentence in-graph into a TokenizedCorpus (tokenize_sentences, then
  sentences and documents left empty are dropped)."""
  ids, lengths, counts, _ = tokenize_sentences(documents, tokenizer, batch_size=batch_size,
                                               segmentation=segmentation, stats=stats)
  # Drop empty sentences, then documents left without sentences.
  doc_of = np.repeat(np.arange(len(counts)), counts)
  nonempty = lengths > 0
  counts = np.bincount(doc_of[nonempty], minlength=len(counts))
  counts = counts[counts > 0]
  return TokenizedCorpus(
      ids=ids, sentence_starts=np.concatenate([[0], np.cumsum(lengths[nonempty])]),
      document_starts=np.concatenate([[0], np.cumsum(counts)]), word_starts=bool(segmentation))


def tokenize_sentences(documents, tokenizer, *, batch_size: int = 2048, segmentation: str = "",
                       stats: corpora.CorpusStats | None = None, parallel: bool = True
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
  """Tokenizes every sentence in-graph: (ids of all sentences concatenated, each sentence's
  length (0: empty), each document's sentence count, each sentence's whether its gold
  words set its word starts (None without `segmentation`)).

  Special tokens written literally in the text ("[CLS]" in a docstring about
  BERT) are dropped so that they never look like structure (a sentence left
  empty keeps its place, of length 0). Gold word marks (word_segmentation.WORD_MARK)
  are stripped whatever `segmentation` is, so the ids never depend on it;
  `segmentation` "gold" / "snownlp" / "gold_else_snownlp"
  (word_segmentation.sentence_words) flags each word's first piece
  (WORD_START), the "##" rule where a sentence has no words or they do not
  line up with its pieces (counted in `stats`). Segmenting needs a WordPiece
  tokenizer: its [UNK]s are placed by their words' lengths. `parallel` False: one
  batch at a time, on one core (a store's worker processes are the parallelism).
  """
  if segmentation and not isinstance(tokenizer, tokenizers.WordPieceTokenizer):
    raise ValueError("a word segmentation needs a WordPiece tokenizer (data.vocab_file): "
                     "SentencePiece pieces are not aligned to a segmentation")
  sentence_counts, errors, sentence_words = [], [], []

  def sentence_batches():
    batch = []
    try:
      for document in documents:
        sentence_counts.append(len(document))
        for sentence in document:
          sentence, words = word_segmentation.sentence_words(sentence, segmentation)
          if segmentation:
            sentence_words.append(words)
          batch.append(sentence)
          if len(batch) == batch_size:
            yield np.array(batch, dtype=object)
            batch = []
    except Exception as e:  # pylint: disable=broad-except  (re-raised below, unwrapped by TF)
      errors.append(e)
      return
    if batch:
      yield np.array(batch, dtype=object)

  if parallel:
    ds = tf.data.Dataset.from_generator(
        sentence_batches, output_signature=tf.TensorSpec([None], tf.string))
    ds = ds.map(functools.partial(_tokenize_batch, tokenizer, bool(segmentation)),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = ds.as_numpy_iterator()
  else:  # the same ops, one batch at a time: no pipeline to build for each of many units
    traced = _traced_tokenize(tokenizer, bool(segmentation))
    batches = (tuple(t.numpy() for t in traced(tf.constant(b))) for b in sentence_batches())
  dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 and not segmentation else np.int32
  specials = np.array(sorted(set(tokenizer.special_ids.values()) - {tokenizer.special_ids["unk"]}))
  ids, lengths = [], []
  aligner = _WordStarts(tokenizer, stats) if segmentation else None
  for flat, row_lengths, word_lengths in batches:
    keep = ~np.isin(flat, specials)
    if not keep.all():
      sentence_of = np.repeat(np.arange(len(row_lengths)), row_lengths)
      row_lengths = np.bincount(sentence_of[keep], minlength=len(row_lengths))
      flat = flat[keep]
      if aligner is not None:
        word_lengths = word_lengths[keep]
    if aligner is not None:
      words, sentence_words[:len(row_lengths)] = sentence_words[:len(row_lengths)], []
      flat = aligner.flag(flat, word_lengths, row_lengths, words)
    ids.append(flat.astype(dtype))
    lengths.append(row_lengths)
  if errors:
    raise errors[0]
  return (np.concatenate(ids) if ids else np.zeros([0], dtype),
          np.concatenate(lengths) if lengths else np.zeros([0], np.int64),
          np.asarray(sentence_counts, np.int64),
          np.asarray(aligner.segmented, bool) if aligner is not None else None)


def _tokenize_batch(tokenizer, segmented: bool, strings):
  """(flat ids, ids per sentence, each id's word's length in characters if `segmented`)."""
  if not segmented:
    ragged = tokenizer.tokenize(strings)
    return ragged.flat_values, ragged.row_lengths(), tf.zeros([0], tf.int32)
  ragged, word_lengths = tokenizer.tokenize_with_word_lengths(strings)
  return ragged.flat_values, ragged.row_lengths(), word_lengths.flat_values


@functools.lru_cache(maxsize=8)
def _traced_tokenize(tokenizer, segmented: bool):
  """_tokenize_batch traced once per tokenizer (a store tokenizes unit after unit with it)."""
  return tf.function(functools.partial(_tokenize_batch, tokenizer, segmented),
                     input_signature=[tf.TensorSpec([None], tf.string)])


class _WordStarts:
  """Flags the first piece of each segmented word on a batch of tokenized sentences."""

  def __init__(self, tokenizer, stats: corpora.CorpusStats | None):
    self.pieces, self.table = tokenizer.vocab, word_start_table(tokenizer)
    self.do_lower_case, self.stats = tokenizer.do_lower_case, stats
    self.segmented = []  # per sentence flagged so far: whether its words set its starts

  def flag(self, flat: np.ndarray, word_lengths: np.ndarray, row_lengths: np.ndarray,
           words: list) -> np.ndarray:
    """int32 ids with WORD_START on word starts (the "##" rule where none line up);
    `word_lengths`: each piece's word's length in characters (places the [UNK]s)."""
    starts = self.table[flat]
    offsets = np.concatenate([[0], np.cumsum(row_lengths)])
    for k, sentence_words in enumerate(words):
      lo, hi = offsets[k], offsets[k + 1]
      self.segmented.append(False)
      if hi == lo:
        continue
      outcome = "unsegmented_sentences"
      if sentence_words is not None:
        try:
          starts[lo:hi] = word_segmentation.segmented_word_starts(
              [self.pieces[i] for i in flat[lo:hi]],
              word_segmentation.normalized_words(sentence_words, self.do_lower_case),
              word_lengths[lo:hi])
          outcome = "segmented_sentences"
          self.segmented[-1] = True
        except ValueError:  # a dropped literal special, normalisation: keep the "##" rule
          outcome = "misaligned_sentences"
      if self.stats is not None:
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
    return flat.astype(np.int32) | np.where(starts, WORD_START, 0).astype(np.int32)


def corpus_key(data_config, tokenizer, *, split: str, process_index: int, process_count: int,
               max_documents: int = 0) -> tuple:
  """Everything read_tokenized_corpus's result depends on (a memo's key)."""
  c = data_config
  return (c.corpus, c.embedded_cache_dir, c.tfds_data_dir, c.tfds_split, c.text_field,
          c.sentence_splitter,
          c.heldout_modulus, c.max_line_bytes, c.max_sentences_per_document,
          c.max_undecodable_fraction, c.masking.word_segmentation,
          tokenizer.__class__.__name__, getattr(tokenizer, "vocab_file", ""),
          getattr(tokenizer, "model_file", ""), c.do_lower_case, split, process_index,
          process_count, max_documents)


def read_tokenized_corpus(data_config, tokenizer, *, split: str, process_index: int,
                          process_count: int, max_documents: int = 0) -> TokenizedCorpus:
  """This process's documents of ``split``, read and tokenized."""
  c = data_config
  stats = corpora.CorpusStats()
  documents = corpora.read_documents(
      c.corpus, split=split, process_index=process_index, process_count=process_count,
      heldout_modulus=c.heldout_modulus, tfds_data_dir=c.tfds_data_dir,
      tfds_split=c.tfds_split, text_field=c.text_field, max_line_bytes=c.max_line_bytes,
      max_sentences_per_document=c.max_sentences_per_document,
      embedded_cache_dir=c.embedded_cache_dir,
      max_undecodable_fraction=c.max_undecodable_fraction,
      sentence_splitter=c.sentence_splitter, stats=stats)
  if max_documents:
    documents = itertools.islice(documents, max_documents)
  corpus = tokenize_documents(documents, tokenizer, segmentation=c.masking.word_segmentation,
                              stats=stats)
  stats.log(f"{c.corpus} ({split}, process {process_index}/{process_count})")
  check_segmented(c, corpus, stats.segmented_sentences, split)
  return corpus


def check_segmented(data_config, corpus: TokenizedCorpus, segmented_sentences: int,
                    split: str) -> None:
  """Refuses gold whole-word masking on a corpus part none of whose sentences' gold words
  line up (`segmented_sentences` of its sentences did)."""
  if (data_config.masking.word_segmentation == "gold" and corpus.num_tokens
      and not segmented_sentences):
    # Else whole-word masking would silently be character masking again.
    raise ValueError(
        f"data.masking.word_segmentation='gold' but corpus {data_config.corpus!r} ({split} "
        "split) has no sentence whose gold words line up (a mark U+2063 before each word, as "
        "experiments/chinese_data.write_corpus writes them): rewrite the corpus with its "
        "words, or use 'snownlp' or 'gold_else_snownlp'")


def check_pairs(data_config, corpus: TokenizedCorpus, split: str) -> None:
  """Refuses (ValueError naming the corpus and what to do) a corpus part without a
  document of the 2 sentences NSP/SOP pairs need."""
  sentences = np.diff(corpus.document_starts)
  if data_config.objective in specs.PAIR_OBJECTIVES and not (sentences >= 2).any():
    raise ValueError(
        f"corpus {data_config.corpus!r} ({split} split): objective "
        f"{data_config.objective!r} needs documents of at least 2 sentences and none has "
        f"({corpus.num_documents} documents); BERT format is one sentence per line with a "
        "blank line between documents (raw:<glob> splits one document per line), or set "
        "config.data.objective='none'")
