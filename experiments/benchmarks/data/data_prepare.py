r"""The tokenized store: a first preparation's time and a later start's, on real text.

  python -m experiments.benchmarks.data.data_prepare --size_mb=200 --workers=2 \
      [--results=experiments/results/data_prepare.json] [--work_dir=/tmp/bert_jax_data_prepare]
  python -m experiments.benchmarks.data.data_prepare --table   # the table of what is recorded

One size x one worker count per invocation (so a shared machine can take the
pieces in turns); each adds its row to --results (JSON), keyed by both.

The corpus: --size_mb of the embedded corpus (the docstrings of the installed
packages, data_pipeline.sources.corpora; real English prose), repeated and cut at a
document boundary, BERT format, in --work_dir; the vocabulary: the tiny variant's
8,192-entry WordPiece vocab learnt on it (experiments/configs/pretrain.py:tiny,
cached beside the corpus); the config: :tiny on that file.

Measured:
* first preparation: data_pipeline.store.prepare_corpus.prepare_store into an empty
  store with --workers worker processes: seconds, tokens (every document, all
  splits), tokens/s and tokens/s per worker (a worker is one process on one core:
  tokenize_sentences(parallel=False), one TensorFlow thread);
  --workers=0 instead times today's in-memory path, what
  PretrainingData.prepare did at every start before the store: the training split
  and the held-out set read and tokenized (tokenized_corpus.read_tokenized_corpus,
  a parallel tf.data map over all cores);
* later start: a fresh interpreter that imports the pipeline, prepares the run's
  data (PretrainingData.prepare: the store found, the training split and held-out
  set selected from it) and takes the first training batch: its wall time from
  the interpreter's start, the part after the imports, and its peak RSS
  (ru_maxrss), beside the store's bytes.
"""

import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("size_mb", 24, "corpus size in MB (10^6 bytes)")
flags.DEFINE_integer("workers", 1, "worker processes of the first preparation; 0: today's "
                     "in-memory path instead")
flags.DEFINE_string("results", "experiments/results/data_prepare.json", "JSON file of rows")
flags.DEFINE_string("work_dir", "/tmp/bert_jax_data_prepare", "corpora and stores go here")
flags.DEFINE_bool("table", False, "print the recorded rows as a markdown table and exit")

EMBEDDED = pathlib.Path("~/.cache/bert_jax/embedded_corpus").expanduser()

# The later start, in a fresh interpreter: argv[1] is the config as JSON.
_LATER_START = r"""
import time
start = time.perf_counter()
import json, resource, sys
import ml_collections
from data_pipeline import prepare
imported = time.perf_counter()
config = ml_collections.ConfigDict(json.loads(sys.argv[1]))
data = prepare.PretrainingData.prepare(prepare.one_phase(config.data, config.total_steps),
                                       batch_size=config.batch_size,
                                       eval_batch_size=config.eval_batch_size,
                                       total_steps=config.total_steps)
prepared = time.perf_counter()
source = data.train_input()
batch = next(source)
first = time.perf_counter()
print(json.dumps({"imports_s": imported - start, "prepare_s": prepared - imported,
                  "first_batch_s": first - start, "after_imports_s": first - imported,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_tokens": int(sum(c.num_tokens for c in data.tokenized.values()))}))
source.close()
"""


def make_corpus(size_mb: int, work_dir: pathlib.Path) -> pathlib.Path:
  """work_dir/corpus_<size>MB/corpus.txt: the embedded corpus repeated to size, cut after a
  document (made once)."""
  path = work_dir / f"corpus_{size_mb}MB" / "corpus.txt"
  if path.exists():
    return path
  text = (EMBEDDED / "corpus.txt").read_bytes()
  size = size_mb * 10**6
  path.parent.mkdir(parents=True, exist_ok=True)
  temp = path.with_suffix(".tmp")
  with open(temp, "wb") as f:
    written = 0
    while written < size:
      piece = text[:size - written]
      if len(piece) < len(text):
        piece = piece[:piece.rfind(b"\n\n") + 2]
      f.write(piece)
      written += len(piece)
      if len(piece) < len(text):
        break
  os.replace(temp, path)
  return path


def bench_config(corpus: pathlib.Path, store: pathlib.Path):
  """The tiny variant on `corpus`, its 8k vocab, the store under `store`."""
  from experiments.configs import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config("tiny")
  vocab = EMBEDDED / (f"vocab_{config.data.embedded_vocab_size}_uncased_"
                      f"{config.data.embedded_vocab_max_lines}lines.txt")
  if not vocab.exists():
    raise SystemExit(f"{vocab} is missing: run the tiny job once (python -m bert_jax.main "
                     "--config=experiments/configs/pretrain.py:tiny ...) to learn it")
  config.data.corpus, config.data.vocab_file = str(corpus), str(vocab)
  config.data.tokenized_dir = str(store)
  return config


def first_preparation(config, workers: int) -> dict:
  """Times the first preparation (or, workers 0, today's in-memory reads)."""
  from data_pipeline.store import prepare_corpus  # pylint: disable=g-import-not-at-top
  from data_pipeline.store import tokenized_corpus  # pylint: disable=g-import-not-at-top
  tokenizer = tokenized_corpus.load_tokenizer(config.data)
  start = time.perf_counter()
  if not workers:
    tokens = 0
    for split, limit in (("train", 0), ("eval", config.data.eval.max_documents)):
      tokens += tokenized_corpus.read_tokenized_corpus(
          config.data, tokenizer, split=split, process_index=0, process_count=1,
          max_documents=limit).num_tokens
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "cores": os.cpu_count()}
  shutil.rmtree(config.data.tokenized_dir, ignore_errors=True)
  store = prepare_corpus.prepare_store(config.data, vocab_file=config.data.vocab_file,
                                       spm_model_file="", num_workers=workers,
                                       tokenizer=tokenizer)
  seconds = time.perf_counter() - start
  made = store.prepared
  return {"seconds": seconds, "tokens": made["tokens"], "tokens_per_s": made["tokens"] / seconds,
          "tokens_per_s_per_worker": made["tokens"] / seconds / made["workers"],
          "workers": made["workers"], "worker_start_s": made["worker_start_s"],
          "shards": len(store.units),
          "store_bytes": store.manifest["shard_bytes"], "store_dir": store.directory}


def later_start(config) -> dict:
  """A fresh interpreter's start on the prepared store, to its first batch."""
  started = time.perf_counter()
  run = subprocess.run([sys.executable, "-c", _LATER_START, config.to_json()],
                       capture_output=True, text=True, check=False,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
  if run.returncode:
    raise RuntimeError(run.stderr[-3000:])
  return {**json.loads(run.stdout.strip().splitlines()[-1]),
          "wall_s": time.perf_counter() - started}


def _table(rows: dict) -> str:
  lines = ["| corpus | workers | first preparation | tokens/s | per worker | store | "
           "later start (after imports) | its peak RSS |", "|---|---|---|---|---|---|---|---|"]
  for key in sorted(rows, key=lambda k: (int(k.split("MB")[0]), rows[k]["workers"])):
    r = rows[key]
    first = r["first"]
    if not r["workers"]:
      lines.append(f"| {r['size_mb']} MB | in memory | {first['seconds']:.1f} s | "
                   f"{first['tokens_per_s'] / 1e6:.2f} M | ({first['cores']} cores) | - | "
                   f"{first['seconds']:.1f} s, at every start | - |")
      continue
    later = r["later"]
    lines.append(
        f"| {r['size_mb']} MB | {r['workers']} | {first['seconds']:.1f} s | "
        f"{first['tokens_per_s'] / 1e6:.2f} M | {first['tokens_per_s_per_worker'] / 1e6:.2f} M | "
        f"{first['store_bytes'] / 2**20:.0f} MiB, {first['tokens'] / 1e6:.0f} M tokens | "
        f"{later['first_batch_s']:.1f} s ({later['after_imports_s']:.1f} s) | "
        f"{later['peak_rss_mib']:.0f} MiB |")
  return "\n".join(lines)


def main(argv):
  del argv
  results = pathlib.Path(FLAGS.results)
  rows = json.loads(results.read_text()) if results.exists() else {}
  if FLAGS.table:
    print(_table(rows))
    return
  work_dir = pathlib.Path(FLAGS.work_dir)
  corpus = make_corpus(FLAGS.size_mb, work_dir)
  config = bench_config(corpus, work_dir / f"store_{FLAGS.size_mb}MB_{FLAGS.workers}w")
  row = {"size_mb": FLAGS.size_mb, "corpus_bytes": corpus.stat().st_size,
         "workers": FLAGS.workers, "cpus": os.cpu_count(),
         "date": time.strftime("%Y-%m-%d"), "first": first_preparation(config, FLAGS.workers)}
  print(json.dumps(row["first"]))
  if FLAGS.workers:
    row["later"] = later_start(config)
    print(json.dumps(row["later"]))
    shutil.rmtree(config.data.tokenized_dir, ignore_errors=True)  # the disk back
  row["parent_peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  rows[f"{FLAGS.size_mb}MB/{FLAGS.workers}w"] = row
  results.parent.mkdir(parents=True, exist_ok=True)
  results.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
  print(_table(rows))


if __name__ == "__main__":
  app.run(main)
