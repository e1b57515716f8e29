"""experiments.evaluate end to end: a suite fine-tuned from real MiniLM weights, killed and resumed.

The suite (a config file of the test's own, as a user would write one) has three tiny
generated GLUE-format tasks -- CoLA (single sentence, MCC, its headerless files),
MRPC (a pair, F1 / accuracy) and STS-B (regression, Pearson / Spearman), each with a
test.tsv for the leaderboard files -- and SQuAD v1.1 on allennlp 0.9.0's fixture
(EM / F1), fine-tuned from all-MiniLM-L6-v2's first 2 layers (conftest.minilm_2_layers: the
suite's stages are the subject, not the encoder) with 2 learning rates x 1 seed, batch 8,
1 epoch (4 steps a run). The command runs in a fresh process on one CPU device, as a
user starts it; a second suite of one `custom` member reads CSV files.
"""

import csv
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from bert_jax.finetune.readers import glue
from experiments.evaluate import leaderboard
from experiments.evaluate import table

REPO = pathlib.Path(__file__).resolve().parents[1]
WORDS = ("the a cat dog bird river house car tree city man woman child book road sun rain "
         "green red small big old new fast slow runs sits eats sees walks reads sings "
         "near under over with from into happy sad quiet loud").split()
SUITE_FILE = """
import ml_collections
from experiments.configs import suites

def get_config(arg):
  config = suites.get_config("glue")
  config.name = "tiny"
  members = {{name: config.members[name] for name in ("cola", "mrpc", "stsb")}}
  members["squad_v1"] = suites.member("squad_v1", data="", settings={{
      "max_seq_length": 64, "bucket_multiple": 64,
      "task": {{"train_file": "{squad}", "dev_file": "{squad}", "doc_stride": 32,
               "max_query_length": 16}}}})
  if arg == "custom":
    members = {{"reviews": suites.member("custom", settings={{"task": {{
        "train_file": "{csv_dir}/train.csv", "dev_file": "{csv_dir}/dev.csv",
        "text_a": "review", "label": "stars", "labels": "low,high",
        "positive_label": "high"}}}})}}
  config.members = ml_collections.ConfigDict(members)
  return config
"""


def _sentence(rng, n: int) -> str:
  return " ".join(rng.choice(WORDS, size=n))


def write_glue(root: pathlib.Path, seed: int = 0, train: int = 32, dev: int = 16,
               test: int = 12) -> pathlib.Path:
  """CoLA, MRPC and STS-B directories laid out as the GLUE download has them."""
  rng = np.random.default_rng(seed)
  for name in ("CoLA", "MRPC", "STS-B"):
    (root / name).mkdir(parents=True, exist_ok=True)
  mrpc_head = "\t#1 ID\t#2 ID\t#1 String\t#2 String"
  sts_head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
  for split, n in (("train", train), ("dev", dev), ("test", test)):
    labelled = split != "test"
    cola = ["index\tsentence"] if not labelled else []
    mrpc = ["index" + mrpc_head] if not labelled else ["Quality" + mrpc_head]
    sts = [sts_head + ("\tscore" if labelled else "")]
    for i in range(n):
      a = _sentence(rng, int(rng.integers(4, 9)))
      ok = i % 2
      cola.append(f"{i}\t{a}" if not labelled else f"src\t{ok}\t{'' if ok else '*'}\t"
                  f"{a if ok else a + ' the the'}")
      b = a if ok else _sentence(rng, int(rng.integers(4, 9)))
      mrpc.append(f"{i if not labelled else ok}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}")
      score = f"\t{5.0 * (i % 5) / 4:.2f}" if labelled else ""
      sts.append(f"{i}\tmain\tf\t2012\t{i}\tn\tn\t{a}\t{_sentence(rng, 1 + i % 5)} {a}{score}")
    for name, rows in (("CoLA", cola), ("MRPC", mrpc), ("STS-B", sts)):
      (root / name / f"{split}.tsv").write_text("\n".join(rows) + "\n")
  return root


@pytest.fixture(scope="module")
def inputs(allennlp_fixtures, tmp_path_factory) -> dict[str, pathlib.Path]:
  """The GLUE directory, the suite file and a compilation cache shared by every process."""
  root = tmp_path_factory.mktemp("suite_inputs")
  csv_dir = root / "csv"
  csv_dir.mkdir()
  rng = np.random.default_rng(1)
  for split, n in (("train", 16), ("dev", 8)):
    with open(csv_dir / f"{split}.csv", "w", newline="") as f:
      writer = csv.writer(f)
      writer.writerow(["id", "review", "stars"])
      for i in range(n):
        writer.writerow([i, _sentence(rng, 5) + (" happy" if i % 2 else " sad"),
                         "high" if i % 2 else "low"])
  suite = root / "tiny_suite.py"
  suite.write_text(SUITE_FILE.format(squad=allennlp_fixtures / "squad.json", csv_dir=csv_dir))
  return {"glue": write_glue(root / "glue"), "suite": suite, "cache": root / "jax_cache"}


def _command(inputs, minilm_2_layers, workdir, *extra) -> list[str]:
  return [sys.executable, "-m", "experiments.evaluate", f"--suite={inputs['suite']}:glue",
          f"--init_checkpoint={minilm_2_layers}", f"--workdir={workdir}",
          f"--glue_dir={inputs['glue']}", "--learning_rates=1e-4,5e-5", "--seeds=0",
          "--epochs=1", "--batch_size=8", "--suite.protocol.max_seq_length=32", *extra]


def _start(command, workdir: pathlib.Path, cache: pathlib.Path) -> subprocess.Popen:
  """The command in a fresh process on one CPU device (its own session, for kill -9)."""
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
         "JAX_COMPILATION_CACHE_DIR": str(cache),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  log = open(workdir.parent / f"{workdir.name}.log", "ab")
  return subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                          start_new_session=True)


def _finish(process, workdir: pathlib.Path, timeout: float = 900) -> None:
  code = process.wait(timeout=timeout)
  assert code == 0, (workdir.parent / f"{workdir.name}.log").read_text()[-4000:]


def _csv(path: pathlib.Path) -> list[dict[str, str]]:
  with open(path, newline="") as f:
    return [{k: v for k, v in r.items() if k not in table.TIMING_COLUMNS}
            for r in csv.DictReader(f)]


@pytest.fixture(scope="module")
def reference(inputs, minilm_2_layers, tmp_path_factory) -> pathlib.Path:
  """The workdir of one uninterrupted run of the suite."""
  workdir = tmp_path_factory.mktemp("suite") / "reference"
  _finish(_start(_command(inputs, minilm_2_layers, workdir), workdir, inputs["cache"]), workdir)
  return workdir


@pytest.mark.slow  # 8 MiniLM fine-tuning runs in a fresh process (about 2 minutes)
def test_the_table_has_every_task_its_metrics_and_the_rate_chosen_on_dev(reference):
  """Fails if a task is missing, shows another metric, or reports a rate other than the one
  with the best median main dev metric in its summary.json."""
  text = (reference / "table.md").read_text()
  lines = text.splitlines()
  start = next(i for i, l in enumerate(lines) if l.startswith("| task | metric |"))
  end = lines.index("", start)
  by_task, task = {}, None
  for line in lines[start + 2:end]:
    cells = [c.strip() for c in line.strip("|").split("|")]
    task = cells[0] or task
    by_task.setdefault(task, []).append(cells[1])
  assert by_task == {"CoLA": ["MCC"], "MRPC": ["F1", "accuracy"], "STS-B": ["Pearson", "Spearman"],
                     "SQuAD v1.1": ["EM", "F1"]}, text
  results = _csv(reference / "results.csv")
  for member, main in (("cola", "dev/matthews_corr"), ("mrpc", "dev/f1"),
                       ("stsb", "dev/spearman"), ("squad_v1", "dev/f1")):
    summary = json.loads((reference / member / "summary.json").read_text())
    medians = {lr: v[f"median_{main}"] for lr, v in summary["by_learning_rate"].items()}
    best = max(medians, key=medians.get)
    chosen = {r["learning_rate"] for r in results if r["member"] == member}
    assert chosen == {best}, (member, medians, chosen)
    row = next(r for r in results if r["member"] == member and r["metric"] == main)
    scale = 1 if member.startswith("squad") else 100
    assert float(row["value"]) == pytest.approx(scale * summary[main], abs=1e-3)
  # The paper's figures beside ours, each with its source and split.
  assert "52.1 test (Table 1, BERT_BASE)" in text and "86.7 dev (Table 6, #L=12" in text
  assert "80.8 dev (Table 2, BERT_BASE (Single))" in text
  assert (reference / "plots" / "suite.png").read_bytes()[:4] == b"\x89PNG"
  assert {p.name for p in (reference / "plots").iterdir()} == {
      "cola.png", "mrpc.png", "stsb.png", "squad_v1.png", "suite.png"}


@pytest.mark.slow
def test_the_zip_holds_every_leaderboard_file_with_valid_rows(reference, inputs):
  """Fails if a task's file is missing, misnamed, or has a row the GLUE server would refuse."""
  with zipfile.ZipFile(reference / leaderboard.ZIP_FILE) as z:
    assert sorted(z.namelist()) == ["CoLA.tsv", "MRPC.tsv", "STS-B.tsv"]
    for task, name in (("cola", "CoLA"), ("mrpc", "MRPC"), ("stsb", "STS-B")):
      lines = z.read(f"{name}.tsv").decode().splitlines()
      test = (inputs["glue"] / name / "test.tsv").read_text().splitlines()[1:]
      assert lines[0] == "index\tprediction" and len(lines) == 1 + len(test)
      assert [l.split("\t")[0] for l in lines[1:]] == [t.split("\t")[0] for t in test]
      spec = glue.TASKS[task]
      for line in lines[1:]:
        value = line.split("\t")[1]
        assert (0.0 <= float(value) <= 5.0) if spec.regression else value in spec.labels


def _moments(order: list[str]) -> tuple[str, ...]:
  """Moments to kill at, in the order the suite writes them, each file marking a stage of its
  own: the plan, a member's first run starting, a member just finished, a run mid-sweep, and
  the final report (the last member's plot is drawn only there). The later members' run
  starts, killed here before, repeat the first member's stage (each kill is a restart that
  imports TensorFlow again: 15-20 s of CI apiece)."""
  first, second, _, last = order
  return ("suite.json", f"{first}/lr0.0001_seed0/record.json", f"{first}/summary.json",
          f"{second}/lr5e-05_seed0/checkpoints", f"plots/{last}.png")


@pytest.mark.slow  # five kills and restarts of the suite above
def test_killed_at_every_stage_it_resumes_to_the_same_table(reference, inputs, minilm_2_layers,
                                                             tmp_path):
  """kill -9 as soon as each moment's file appears, then the same command: table.md equals the
  uninterrupted run's byte for byte and results.csv does but for wall times. Fails if a
  resumed run redoes, skips or changes a run, or if table.md holds anything run-dependent."""
  workdir = tmp_path / "killed"
  command = _command(inputs, minilm_2_layers, workdir)
  order = json.loads((reference / "suite.json").read_text())["order"]
  for moment in _moments(order):
    process = _start(command, workdir, inputs["cache"])
    deadline = time.monotonic() + 900
    while not (workdir / moment).exists() and process.poll() is None:
      assert time.monotonic() < deadline, moment
      time.sleep(0.01)
    assert process.poll() is None, f"the suite ended without writing {moment}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    if moment == f"{order[0]}/summary.json":
      finished_first = json.loads((workdir / "times.json").read_text())[order[0]]
  _finish(_start(command, workdir, inputs["cache"]), workdir)
  assert (workdir / "table.md").read_text() == (reference / "table.md").read_text()
  assert _csv(workdir / "results.csv") == _csv(reference / "results.csv")
  times = json.loads((workdir / "times.json").read_text())
  # The first member ran in two attempts or more (killed in its first run, then after it
  # finished) and was not started again once its summary was written.
  assert times[order[0]] == finished_first and finished_first["attempts"] >= 2, times


@pytest.mark.slow  # one member, 2 runs of MiniLM
def test_a_custom_member_reads_csv_files(inputs, minilm_2_layers, tmp_path):
  """A suite of one `custom` member: its CSV files, the task kind's main metric reported."""
  workdir = tmp_path / "custom"
  command = [a.replace(":glue", ":custom") for a in _command(inputs, minilm_2_layers, workdir)]
  command = [a for a in command if not a.startswith("--learning_rates")] + ["--learning_rates=1e-4"]
  _finish(_start(command, workdir, inputs["cache"]), workdir)
  rows = _csv(workdir / "results.csv")
  assert [(r["member"], r["task"], r["metric"], r["train_examples"], r["dev_examples"])
          for r in rows] == [("reviews", "custom", "dev/accuracy", "16", "8")]
  summary = json.loads((workdir / "reviews" / "summary.json").read_text())
  assert float(rows[0]["value"]) == pytest.approx(100 * summary["dev/accuracy"], abs=1e-3)
  text = (workdir / "table.md").read_text()
  assert "| reviews (custom) | accuracy |" in text and "zip" not in text
