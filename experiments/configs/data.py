"""The data block of pretraining configs: corpus, tokenizer, pairs, masking, held-out set.

Every data and masking default is defined here, once, with a comment; the
pipeline (data_pipeline/examples/pretraining.py) reads these fields and defines none.
Pure data: only ml_collections is imported. experiments/configs/pretrain.py
puts this block at config.data and overrides fields per variant.
"""

import ml_collections


def data_config() -> ml_collections.ConfigDict:
  """The data fields with BERT's values (what config.data holds before a variant edits it)."""
  c = ml_collections.ConfigDict()
  c.corpus = "embedded"  # "embedded" | BERT-format glob | "raw:<glob>" | "jsonl:<glob>" | "parquet:<glob>" | "tfds:<name>"
  c.embedded_cache_dir = ""  # "" -> $BERT_JAX_CACHE/embedded_corpus, else ~/.cache/bert_jax/embedded_corpus
  c.tfds_data_dir = ""  # local tfds data_dir for "tfds:" corpora ("" -> tfds' default)
  c.tfds_split = "train"  # tfds split to read (held-out documents are carved out of it)
  c.text_field = "text"  # JSONL field / Parquet column / tfds feature holding a document's text
  # How raw:, jsonl:, parquet: and tfds: text is cut into sentences (BERT format is one per
  # line already): "blingfire" knows abbreviations, initials and decimals (94% of the hard
  # cases of tests/data/sentence_cases.jsonl split exactly, data_pipeline/sources/sentences.py);
  # "regex" (57%) is the splitter from before this field, which a workdir recorded without
  # it resumes with (bert_jax/run/workdir.py).
  c.sentence_splitter = "blingfire"
  c.vocab_file = ""  # WordPiece vocab; "" -> trained on the embedded corpus (corpus "embedded" only)
  c.embedded_vocab_size = 30522  # size of that trained vocab (BERT's)
  c.embedded_vocab_max_lines = 0  # learn it from the first N corpus lines (0: all; the learner is pure Python, ~1 s per 1k lines)
  c.do_lower_case = True  # uncased model: lowercase + strip accents
  c.spm_model_file = ""  # SentencePiece model instead of a WordPiece vocab
  c.max_seq_length = 128  # tokens per sequence incl. [CLS]/[SEP] (BERT: 128 for 90% of steps, then 512)
  # "nsp" (BERT) | "sop" (ALBERT) | "none" (RoBERTa full-sentences packing, across documents)
  # | "documents" (whole documents packed, each attending only to itself: ModernBERT's)
  c.objective = "nsp"
  c.pack_window = 16  # "documents": rows open at once for best-fit packing
  # "documents": every row filled to its end, a document cut where a row must close with
  # room; blocks are then spans of shuffle_buffer rows' tokens (data_pipeline/examples/
  # documents.py). False: rows close with room (padding), blocks of shuffle_buffer
  # documents -- what a workdir recorded before this field resumes with (workdir.py).
  c.pack_fill = True
  c.short_seq_prob = 0.1  # chance a document's target length is shorter (google-research value)
  c.seed = 0  # pair sampling, order and masks all derive from it
  # Documents per shuffle block (filled "documents": rows' tokens): its examples are
  # shuffled together.
  c.shuffle_buffer = 256
  c.heldout_modulus = 50  # one document in ~this many is held out for eval (MD5 of its text)
  c.max_line_bytes = 1 << 20  # longer lines are skipped (counted): minified code / binary, not prose
  # A corpus file with a larger share of lines that are not UTF-8 is refused by name: it is
  # binary or compressed in a format not read (.gz/.bz2/.xz are), not text with a stray byte.
  c.max_undecodable_fraction = 0.01
  c.max_sentences_per_document = 2048  # longer documents are cut into several (bounds memory)
  # The corpus tokenized once, kept and read by every later start (data_pipeline/store/token_store.py):
  # "" -> $BERT_JAX_CACHE/tokenized (else ~/.cache/bert_jax/tokenized), a gs:// path for pods,
  # "none": tokenize in memory at every start (the same batches, bit for bit).
  c.tokenized_dir = ""
  c.prepare_workers = 0  # processes tokenizing a new store on each host (0: a core each, one per 64 MiB)
  c.shard_bytes = 8 << 20  # a plain-text file larger than this is cut into shards of about it
  c.masking = ml_collections.ConfigDict()
  c.masking.ratio = 0.15  # fraction of maskable tokens predicted (BERT: 15%)
  c.masking.mask_prob = 0.8  # of the predicted tokens: replaced by [MASK]
  c.masking.random_prob = 0.1  # ... replaced by a random non-special token
  c.masking.keep_prob = 0.1  # ... left unchanged
  c.masking.strategy = "fixed"  # "fixed": round(ratio x maskable) per sequence | "bernoulli": per token
  c.masking.whole_word = False  # mask all pieces of a word together
  # Words for whole_word/span: "" the "##" rule (each CJK character a word), "gold" the
  # corpus's marked words (word_segmentation.py; unmarked sentences keep the "##" rule),
  # "snownlp" its segmenter's words, "gold_else_snownlp" marked words where a sentence
  # has them and the segmenter's elsewhere (People's Daily + unmarked review texts).
  c.masking.word_segmentation = ""
  c.masking.span = False  # SpanBERT geometric span masking
  c.masking.span_geometric_p = 0.2  # span-length geometric p (SpanBERT)
  c.masking.max_span_length = 10  # longest span in words (SpanBERT)
  c.masking.max_predictions_per_seq = 0  # 0 -> derived from the ratio (20 at 128 / 0.15; a schedule's largest)
  c.masking.schedule = "constant"  # "constant" | "linear" | "cosine" | "polynomial" | "warmup_decay" (masking.py)
  c.masking.final_ratio = 0.0  # where a schedule ends (0 with "constant")
  c.masking.schedule_power = 1.0  # "polynomial"'s exponent (1 elsewhere)
  c.masking.schedule_warmup = 0.0  # "warmup_decay": fraction of the run rising to ratio (0 elsewhere)
  # "piecewise": the later pieces "START:RATIO,..." (fractions of the run), e.g. mmBERT's
  # 30% -> 15% -> 5%: ratio 0.3, piecewise "0.767:0.15,0.967:0.05"
  c.masking.piecewise = ""
  c.masking.predict_ratio = 0.0  # 0: predict the corrupted tokens; else the share predicted (> ratio: uncorrupted ones too; < ratio: a subset)
  c.eval = ml_collections.ConfigDict()
  c.eval.num_examples = 1024  # size of the fixed held-out set (rounded down to whole global batches)
  c.eval.masking_ratio = 0.15  # eval masks: BERT's default masking at this ratio, whatever training uses
  c.eval.seed = 12345  # pairs and masks of the eval set
  c.eval.max_documents = 4096  # held-out documents read (first in corpus order), bounds eval set-up
  c.eval.own_masking = False  # also evaluate on the held-out pairs masked like training (eval_own/*)
  c.prefetch_batches = 2  # batches prepared ahead of the training step
  return c
