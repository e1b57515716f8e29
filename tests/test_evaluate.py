"""experiments.evaluate without training: the paper's figures, the averages, the plan, the record,
the figures chosen from summaries, the table and the leaderboard zip (fast; the suite end to end
is tests/test_evaluate_suite.py)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from bert_jax import errors
from bert_jax.finetune import sweep as finetune_sweep
from experiments.configs import suites
from experiments.evaluate import collect
from experiments.evaluate import leaderboard
from experiments.evaluate import plan
from experiments.evaluate import table
from test_evaluate_suite import write_glue  # the tiny GLUE-format tasks

REPO = pathlib.Path(__file__).resolve().parents[1]


def _row(task: str, values: dict[str, float]) -> dict:
  spec = suites.member(task)
  return {"task": task, "name": task, "done": True, "metrics": list(spec.metrics),
          "headline": list(spec.headline), "values": {k: {"value": v} for k, v in values.items()}}


# ------------------------------------------------------------------ the paper's figures


@pytest.mark.parametrize("model,average", [("base", 79.6), ("large", 82.1)])
def test_table1_average_of_the_papers_own_figures_is_its_average(model, average):
  """Table 1's rule (its headline figure per task, MNLI-m and -mm as two, no WNLI) applied to
  the figures written in suites.PAPER gives the paper's Average: fails if a figure is
  mistyped by more than rounding allows or the rule averages the wrong figures."""
  rows = []
  for task in collect.GLUE:
    spec = suites.member(task)
    figures = {f["metric"]: f["value"] for f in spec.paper
               if f["model"] == model and f["table"] == "Table 1"}
    rows.append(_row(task, {m: figures.get(m, 0.0) for m in spec.metrics}))
  assert round(collect.averages(rows)["table1"]["value"], 1) == average
  [figure] = [f for f in suites.PAPER_AVERAGES["table1"] if f["model"] == model]
  assert figure["value"] == average and figure["split"] == "test"


def test_glue_score_is_the_mean_of_task_means():
  """The leaderboard's rule: two-metric tasks (and MNLI's two sections) first averaged, then
  the tasks; hand-computed. Fails if metrics are pooled across tasks or MNLI counts twice."""
  values = {t: {m: 80.0 for m in suites.METRICS[t]} for t in collect.GLUE}
  values["mrpc"] = {"dev/f1": 90.0, "dev/accuracy": 70.0}  # task score 80
  values["stsb"] = {"dev/pearson": 84.0, "dev/spearman": 86.0}  # 85
  values["qqp"] = {"dev/f1": 70.0, "dev/accuracy": 90.0}  # 80
  values["mnli"] = {"dev_matched/accuracy": 84.0, "dev_mismatched/accuracy": 82.0}  # 83
  values["wnli"] = {"dev/accuracy": 50.0}
  rows = [_row(t, v) for t, v in values.items()]
  out = collect.averages(rows)
  assert out["glue_score"]["value"] == pytest.approx((80 * 5 + 85 + 83 + 80 + 50) / 9)
  assert out["glue_score_no_wnli"]["value"] == pytest.approx((80 * 5 + 85 + 83 + 80) / 8)
  # Table 1: cola sst2 qnli rte 80, mrpc F1 90, stsb Spearman 86, qqp F1 70, mnli 84 and 82.
  assert out["table1"]["value"] == pytest.approx((80 * 4 + 90 + 86 + 70 + 84 + 82) / 9)
  rows = [r for r in rows if r["task"] != "mnli"]
  assert all(a["value"] is None and a["missing"] == ["mnli"] for a in collect.averages(rows)
             .values())


def test_every_paper_figure_has_its_source_and_a_metric_of_ours():
  """Fails if a figure lacks its paper, table, row or split, or stands beside a metric the
  task does not report (it would never be printed)."""
  assert set(suites.PAPER) <= set(suites.METRICS)
  for task, figures in suites.PAPER.items():
    for f in figures:
      assert f["paper"] == suites.BERT_PAPER and f["table"] and f["row"], f
      assert f["metric"] in suites.METRICS[task] and f["split"] in ("dev", "test"), (task, f)
      assert f["split"] == "test" or f["table"] != "Table 1", f  # Table 1: the test server
  cell = table.paper_cell(list(suites.PAPER["mrpc"]), "dev/accuracy", "large")
  assert cell == "87.8 dev (Table 6, #L=24 #H=1024 #A=16)"


@pytest.mark.parametrize("task,version", [("squad_v1", "1.1"), ("squad_v2", "2.0")])
def test_squad_metrics_are_the_names_the_scorer_reports(task, version):
  """Fails if a SQuAD member's metrics (or the paper's figures beside them) name a key the
  official scoring does not return for that version (v2.0 says "exact", v1.1
  "exact_match"): the report would stop with a KeyError after every run had trained."""
  from bert_jax.finetune import metrics  # pylint: disable=g-import-not-at-top
  scored = metrics.squad_evaluate({"q1": ["Denver Broncos"], "q2": ["Carolina"]},
                                  {"q1": "Denver Broncos", "q2": "Panthers"}, version=version)
  reported = {f"dev/{k}" for k in scored}
  assert set(suites.METRICS[task]) <= reported, (suites.METRICS[task], sorted(reported))
  assert {f["metric"] for f in suites.PAPER[task]} <= reported


# ------------------------------------------------------------------------------ the plan


@pytest.fixture
def glue_dir(tmp_path) -> pathlib.Path:
  root = write_glue(tmp_path / "glue")
  train = (root / "MRPC" / "train.tsv").read_text().splitlines()
  (root / "MRPC" / "train.tsv").write_text("\n".join(train[:9]) + "\n")  # 8 examples
  return root


def _flags(minilm_dir, glue_dir, **kw) -> plan.Flags:
  return plan.Flags(init_checkpoint=str(minilm_dir), glue_dir=str(glue_dir),
                    **{"only": ("cola", "mrpc", "stsb"), **kw})


def test_members_get_the_protocol_their_own_fields_then_the_flags(minilm_dir, glue_dir, tmp_path,
                                                                 allennlp_fixtures):
  """Fails if a layer of the precedence (task config < protocol < member < flags) is lost."""
  planned = plan.members(suites.get_config("glue"), _flags(minilm_dir, glue_dir), str(tmp_path))
  cola = {m.name: m for m in planned}["cola"].config
  assert (cola.batch_size, cola.num_epochs, cola.learning_rates, cola.seeds) == (
      32, 3, (5e-5, 3e-5, 2e-5), (0, 1, 2, 3, 4))
  assert cola.task.data_dir == str(glue_dir / "CoLA") and cola.task.predict_test
  assert cola.init_checkpoint == str(minilm_dir) and cola.max_seq_length == 128
  assert {m.rule for m in planned} == {"median"}
  planned = plan.members(suites.get_config("glue"), _flags(
      minilm_dir, glue_dir, epochs=1, seeds=(7,), learning_rates=(1e-4,), restarts="small",
      max_train_examples=4), str(tmp_path))
  c = planned[0].config
  assert (c.num_epochs, c.seeds, c.learning_rates, c.task.max_train_examples) == (1, (7,),
                                                                                 (1e-4,), 4)
  assert {m.rule for m in planned} == {"best"}  # CoLA, MRPC and STS-B are small sets
  squad = tmp_path / "squad"
  squad.mkdir()
  for split in ("train", "dev"):
    shutil.copy(allennlp_fixtures / "squad.json", squad / f"{split}-v1.1.json")
  flags = plan.Flags(init_checkpoint=str(minilm_dir), squad_dir=str(squad), only=("squad_v1",))
  [member] = plan.members(suites.get_config("squad"), flags, str(tmp_path))
  assert (member.config.num_epochs, member.config.max_seq_length) == (2, 384)
  assert member.config.task.train_file == str(squad / "train-v1.1.json")
  flags.epochs = 1  # the flag wins over SQuAD's own 2
  assert plan.members(suites.get_config("squad"), flags, str(tmp_path))[0].config.num_epochs == 1


def test_bad_suites_and_flags_are_refused_in_one_line(minilm_dir, glue_dir, tmp_path):
  """Each refusal names what to fix; fails if one passes or writes anything."""
  suite = suites.get_config("glue")
  cases = [(plan.Flags(init_checkpoint=str(minilm_dir), only=("cola",)), "give --glue_dir=DIR"),
           (plan.Flags(glue_dir=str(glue_dir), only=("cola",)), "--init_checkpoint is required"),
           (_flags(minilm_dir, glue_dir, restarts="cola,nope"), r"--restarts names \['nope'\]"),
           (plan.Flags(init_checkpoint=str(minilm_dir), glue_dir=str(glue_dir), only=("qqp",)),
            r"QQP does not exist \(--glue_dir\)"),
           (_flags(minilm_dir, glue_dir, only=("cola", "x")), r"--members names \['x'\]")]
  for flags, message in cases:
    with pytest.raises(errors.UsageError, match=message):
      plan.members(suite, flags, str(tmp_path / "w"))
  with suite.unlocked():
    suite.members.cola.bogus = 1
  with pytest.raises(errors.UsageError, match=r"member 'cola': unknown fields \['bogus'\]"):
    plan.members(suite, _flags(minilm_dir, glue_dir), str(tmp_path / "w"))
  suite = suites.get_config("glue")
  suite.members.cola.task = "nope"
  with pytest.raises(errors.UsageError, match="task 'nope' is not a finetune.py task"):
    plan.members(suite, _flags(minilm_dir, glue_dir), str(tmp_path / "w"))
  with pytest.raises(ValueError, match="unknown suite 'nope'"):
    suites.get_config("nope")
  assert not (tmp_path / "w").exists()


def test_the_record_orders_cheap_first_and_refuses_a_changed_protocol(minilm_dir, glue_dir,
                                                                      tmp_path):
  """MRPC (8 examples) before CoLA and STS-B (32); a re-run with another checkpoint or more
  epochs is refused naming the field, more seeds is not. Fails if the order is by name or a
  changed protocol would be mixed into finished runs."""
  suite, workdir = suites.get_config("glue"), str(tmp_path / "w")
  planned = plan.members(suite, _flags(minilm_dir, glue_dir), workdir)
  content, changed = plan.make_record(workdir, suite, planned)
  assert changed and not (tmp_path / "w").exists()  # nothing written until asked
  assert content["order"] == ["mrpc", "cola", "stsb"]
  assert content["members"]["mrpc"]["counts"] == {"train": 8, "dev": {"dev": 16},
                                                  "test": {"test": 12}}
  plan.write_record(workdir, content)
  assert plan.make_record(workdir, suite, planned) == (content, False)
  more = plan.members(suite, _flags(minilm_dir, glue_dir, seeds=tuple(range(7))), workdir)
  assert plan.make_record(workdir, suite, more)[1]
  other = tmp_path / "other_checkpoint"  # a second checkpoint: MiniLM's files, linked
  other.mkdir()
  for f in pathlib.Path(minilm_dir).iterdir():
    (other / f.name).symlink_to(f)
  # Nothing has run yet (a start that failed after writing the record): another checkpoint
  # is planned afresh, not refused.
  moved = plan.members(suite, plan.Flags(init_checkpoint=str(other), glue_dir=str(glue_dir),
                                         only=("cola",)), workdir)
  assert plan.make_record(workdir, suite, moved)[0]["members"]["cola"]["config"][
      "init_checkpoint"] == str(other)
  for name, run in (("cola", "lr2e-05_seed0"), ("mrpc", "")):  # finished runs bind it
    (tmp_path / "w" / name / run).mkdir(parents=True, exist_ok=True)
    (tmp_path / "w" / name / run / "result.json").write_text("{}")
  for flags, field in ((plan.Flags(init_checkpoint=str(other), glue_dir=str(glue_dir),
                                   only=("cola",)), "init_checkpoint"),
                       (_flags(minilm_dir, glue_dir, epochs=2), "num_epochs")):
    with pytest.raises(errors.UsageError, match=f"member '(cola|mrpc)' was run with {field}="):
      plan.make_record(workdir, suite, plan.members(suite, flags, workdir))
  single = plan.members(suite, _flags(minilm_dir, glue_dir, seeds=(0,), learning_rates=(1e-4,)),
                        workdir)
  with pytest.raises(errors.UsageError, match="holds 15 run"):
    plan.make_record(workdir, suite, single)


# --------------------------------------------------------------------- summaries -> figures


def _sweep(tmp_path, by_lr: dict[str, list[float]], best_scores: dict[str, list[float]],
           rule: str = "median") -> tuple[str, dict]:
  """A member workdir with a real summary.json (finetune_sweep.summarize) and each run's best/."""
  workdir = tmp_path / "suite"
  runs = {lr: {s: {"dev/f1": v, "dev/accuracy": v / 2} for s, v in enumerate(values)}
          for lr, values in by_lr.items()}
  (workdir / "mrpc").mkdir(parents=True)
  (workdir / "mrpc" / "summary.json").write_text(json.dumps(finetune_sweep.summarize(runs, "f1")))
  for lr, scores in best_scores.items():
    for seed, score in enumerate(scores):
      best = workdir / "mrpc" / f"lr{lr}_seed{seed}" / "best"
      best.mkdir(parents=True)
      (best / "metrics.json").write_text(json.dumps({"score": score, "step": 4}))
      (best.parent / "result.json").write_text(json.dumps({"step": 4}))
  spec = suites.member("mrpc")
  entry = {"task": "mrpc", "kind": "classification", "rule": rule, "counts": {"train": 8},
           "spec": json.loads(spec.to_json_best_effort()),
           "config": {"learning_rates": [float(lr) for lr in by_lr], "seeds": [0, 1, 2],
                      "num_epochs": 3, "batch_size": 32, "task.max_train_examples": 0,
                      "task.max_dev_examples": 0}}
  return str(workdir), entry


def test_the_rate_is_the_best_median_and_restarts_take_the_best_run(tmp_path):
  """5e-5 has the best median F1 (0.8) though 2e-5 holds the single best run (0.95): the
  median rule reports 5e-5's median and its seed with the best best/ score; the restarts
  rule reports the 0.95 run. Fails if either rule picks by the other's criterion."""
  by_lr = {"5e-05": [0.8, 0.7, 0.85], "2e-05": [0.95, 0.5, 0.6]}
  workdir, entry = _sweep(tmp_path, by_lr, {"5e-05": [0.8, 0.9, 0.85], "2e-05": [0.95, 0.5, 0.6]})
  row = collect.member(workdir, "mrpc", entry)
  assert (row["done"], row["learning_rate"], row["best_seed"]) == (True, "5e-05", "1")
  assert row["values"]["dev/f1"] == pytest.approx({"value": 80.0, "min": 70.0, "max": 85.0,
                                                   "std": row["values"]["dev/f1"]["std"]})
  assert row["best_run"] == "mrpc/lr5e-05_seed1" and row["steps"] == 4
  entry["rule"] = "best"
  row = collect.member(workdir, "mrpc", entry)
  assert (row["learning_rate"], row["best_seed"]) == ("2e-05", "0")
  assert row["values"]["dev/f1"]["value"] == pytest.approx(95.0)
  assert row["values"]["dev/accuracy"]["value"] == pytest.approx(47.5)  # the same run's
  entry["config"]["seeds"] = [0, 1, 2, 3]  # grown since: not done until the sweep re-ran
  assert not collect.member(workdir, "mrpc", entry)["done"]


# --------------------------------------------------------------------- table and zip


def test_the_table_renders_the_same_twice_and_names_each_source(tmp_path):
  """Fails if table.md holds anything that changes between renders of the same results, or a
  figure is printed without its table and row."""
  workdir, entry = _sweep(tmp_path, {"5e-05": [0.8, 0.7, 0.85]}, {"5e-05": [0.8, 0.9, 0.85]})
  record = {"suite": "glue", "order": ["mrpc"], "members": {"mrpc": entry},
            "paper_averages": json.loads(json.dumps(suites.PAPER_AVERAGES))}
  entry["counts"] = {"train": 8, "dev": {"dev": 16}}
  rows = collect.members(workdir, record)
  texts = [table.render_table(record, rows, collect.averages(rows), "CKPT", "") for _ in "ab"]
  assert texts[0] == texts[1]
  assert "| MRPC | F1 | 80.0 (70.0–85.0) | 5e-05 | 3 | 8 / 16 | 4 | 88.9 test (Table 1, BERT_BASE)" \
      in texts[0]
  assert "82.1 test (Table 1, BERT_LARGE, Average)" in texts[0]
  assert "— (needs cola, sst2, stsb, qqp, mnli, qnli, rte, wnli; 1 of 9" in texts[0]


def test_leaderboard_files_are_checked_and_zipped_the_same_each_time(tmp_path):
  """Fails if a wrong label, row count or header passes, or the zip's bytes depend on time."""
  check = leaderboard.check_file
  check("index\tprediction\n0\t1\n1\t0\n", "mrpc", "test", 2, "MRPC.tsv")
  check("index\tprediction\n0\t4.500\n", "stsb", "test", 1, "STS-B.tsv")
  for text, task, rows, message in (
      ("index\tprediction\n0\tyes\n", "mrpc", 1, r"MRPC.tsv:2: 'yes' is not one of"),
      ("index\tprediction\n0\t5.5\n", "stsb", 1, r"score 5.5 outside \[0.0, 5.0\]"),
      ("index\tprediction\n0\t1\n", "mrpc", 2, "1 predictions for 2 test examples"),
      ("id\tlabel\n0\t1\n", "mrpc", 1, "the first line must be")):
    with pytest.raises(ValueError, match=message):
      check(text, task, "test", rows, "MRPC.tsv")
  best = tmp_path / "mrpc" / "lr5e-05_seed1" / "best" / "predictions"
  best.mkdir(parents=True)
  (best / "MRPC.tsv").write_text("index\tprediction\n0\t1\n1\t0\n")
  rows = [{"task": "mrpc", "name": "mrpc", "done": True, "best_run": "mrpc/lr5e-05_seed1",
           "counts": {"test": {"test": 2}}}]
  note = leaderboard.write_zip(str(tmp_path), rows)
  first = (tmp_path / leaderboard.ZIP_FILE).read_bytes()
  assert "holds 1 of the 11 files" in note and "Not in it: CoLA.tsv, SST-2.tsv" in note
  assert leaderboard.write_zip(str(tmp_path), rows) == note
  assert (tmp_path / leaderboard.ZIP_FILE).read_bytes() == first
  with zipfile.ZipFile(tmp_path / leaderboard.ZIP_FILE) as z:
    assert z.namelist() == ["MRPC.tsv"]


@pytest.mark.slow  # eight fresh processes (each imports JAX and TensorFlow)
def test_the_command_refuses_in_one_line_and_writes_nothing(tmp_path, minilm_dir, glue_dir):
  """Fails if a bad --suite (unknown, a file that is not there or does not parse), a missing
  flag or an --init_checkpoint that is no checkpoint gives a traceback, any line beside its
  one, exit code != 1 or a workdir (suite.json included); or if the corrected checkpoint is
  then refused on the same workdir."""
  from test_refusals import _refusal_line  # pylint: disable=g-import-not-at-top
  broken = tmp_path / "broken_suite.py"
  broken.write_text("def get_config(\n")
  empty = tmp_path / "empty_dir"
  empty.mkdir()
  unfinished = tmp_path / "unfinished" / "checkpoints"  # a workdir that never saved a step
  unfinished.mkdir(parents=True)
  cola = ["--suite=glue", "--members=cola", f"--glue_dir={glue_dir}"]
  for args, message in (
      (["--suite=nope"], "unknown suite 'nope'"),
      ([f"--suite={tmp_path / 'missing.py'}:x"], "No such file or directory"),
      ([f"--suite={broken}:x"], "'(' was never closed (broken_suite.py, line 1)"),
      (["--suite=glue"], "--init_checkpoint is required"),
      (["--suite=glue", f"--init_checkpoint={minilm_dir}", "--seeds=a,b"],
       "flag --seeds=a,b: expected a comma-separated list of ints"),
      (cola + [f"--init_checkpoint={empty}"],
       f"--init_checkpoint: {empty} is not a checkpoint this converter knows"),
      (cola + [f"--init_checkpoint={unfinished.parent}"],
       f"--init_checkpoint: {unfinished} holds no complete checkpoint")):
    result = subprocess.run([sys.executable, "-m", "experiments.evaluate", *args,
                             f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    line = _refusal_line(result.stderr, result.returncode)
    assert message in line, (message, line)
    assert not (tmp_path / "w").exists(), args
  fixed = subprocess.run([sys.executable, "-m", "experiments.evaluate", *cola,
                          f"--init_checkpoint={minilm_dir}", "--stage=plan",
                          f"--workdir={tmp_path / 'w'}"], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
  assert fixed.returncode == 0, fixed.stderr[-2000:]
  assert (tmp_path / "w" / plan.RECORD_FILE).exists()


def test_dry_run_and_print_commands_say_what_will_run_and_write_nothing(minilm_dir, glue_dir,
                                                                       tmp_path):
  """Fails if --dry_run's table lacks a member, its examples, runs or steps per run
  ((train // batch) x epochs), or the FLOPs per step of the checkpoint's encoder; if
  --print_commands does not give one bert_jax.main per member carrying that member's
  protocol; or if either writes anything."""
  from experiments.evaluate import estimate  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "suite"
  planned = plan.members(suites.get_config("glue"), _flags(minilm_dir, glue_dir, epochs=2,
                                                           seeds=(0, 1)), str(workdir))
  text = estimate.dry_run(planned, str(workdir), {}, "glue", mfu=0.4, peak_tflops=0.0)
  rows = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines()
          if line.startswith("| ") and line.split(" | ")[1] in ("cola", "mrpc", "stsb")}
  assert set(rows) == {"cola", "mrpc", "stsb"}, text
  # write_glue's sets: 32 train examples (MRPC cut to 8 by the fixture), 16 dev; batch 32.
  assert rows["cola"][2:5] == ["32 / 16", "6", "2"], rows["cola"]  # 2 epochs x 1 batch
  assert rows["mrpc"][2:5] == ["8 / 16", "6", "0"], rows["mrpc"]
  assert float(rows["cola"][5]) > 1e9  # MiniLM (22M parameters) at 32 x 128 tokens
  assert "L=6 H=384 A=12" in text and "to run:" in text
  lines = estimate.commands(planned, str(workdir), ["--suite=glue"])
  mains = [l for l in lines if l.startswith("python -m bert_jax.main")]
  assert len(mains) == 3 and all("--config.num_epochs=2" in l and "--config.seeds=(0,1,)"
                                 in l for l in mains), mains
  assert any(f"--workdir={workdir / 'cola'}" in l for l in mains)
  assert not workdir.exists()


@pytest.mark.slow  # two fresh processes (each imports JAX and TensorFlow)
def test_under_a_launcher_the_suite_records_its_job_state(minilm_dir, glue_dir, tmp_path):
  """bert_jax.launch --job=evaluate watches DIR/job_state.json as it does a training job's:
  fails if a suite started with a launcher's job identity does not end with 'done' (exit 0)
  there, or a refused one with 'failed' (exit 1), each with its attempt."""
  env = dict(os.environ, BERT_JAX_JOB_ID="tpu:p/z/suite", BERT_JAX_JOB_ATTEMPT="7")
  args = [sys.executable, "-m", "experiments.evaluate", "--suite=glue", "--members=cola",
          f"--glue_dir={glue_dir}", "--stage=plan", f"--workdir={tmp_path / 'suite'}"]
  for extra, code, state in (([f"--init_checkpoint={minilm_dir}"], 0, "done"),
                             ([f"--init_checkpoint={tmp_path / 'nothing'}"], 1, "failed")):
    result = subprocess.run(args + extra, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == code, result.stderr[-2000:]
    record = json.loads((tmp_path / "suite" / "job_state.json").read_text())
    assert (record["state"], record["exit_code"], record["attempt"], record["job_id"]) == (
        state, code, 7, "tpu:p/z/suite")
  assert (tmp_path / "suite" / "suite.json").exists()
