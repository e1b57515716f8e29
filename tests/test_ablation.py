"""Tests of the masking ablation: experiments/ablation/ (stages, report), configs/ablation.py.

The grid is the `smoke` variant (2 settings: ratio 0.15 and a cosine schedule
0.40 -> 0.15, 1 seed) moved onto the tiny generated corpus of
conftest.pretrain_test_config and a toy downstream task that is learnable only
by reading the text (a sentence is "pos" when it contains "river").
"""

import csv
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time

from absl import flags
import numpy as np
import pytest

from bert_jax.pretrain import trainer as pretrain_lib
from data_pipeline import specs
from experiments.ablation import report as ablation_report
from experiments.ablation import plan as ablation_plan
from experiments.ablation import stages as ablation
from experiments.configs import ablation as ablation_configs
from experiments.configs import finetune as finetune_configs

REPO = pathlib.Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_RUNNER = """
import json, sys
from absl import logging
import ml_collections
from experiments.ablation import stages as ablation
logging.set_verbosity(logging.INFO)
config = ml_collections.ConfigDict(json.loads(open(sys.argv[1]).read()))
sys.exit(ablation.run_ablation(config, sys.argv[2]))
"""


@pytest.fixture(scope="module")
def toy_task(pretrain_test_config, tmp_path_factory) -> dict[str, pathlib.Path]:
  """train.tsv (64 rows) and dev.tsv (32 rows) over the test corpus's words."""
  vocab = pathlib.Path(pretrain_test_config().data.vocab_file)
  words = [w for w in vocab.read_text().split("\n")
           if w and not w.startswith("[") and w not in (".", "river")]
  rng = np.random.default_rng(0)
  root = tmp_path_factory.mktemp("toy_task")
  for name, n in (("train.tsv", 64), ("dev.tsv", 32)):
    rows = ["sentence\tlabel"]
    for i in range(n):
      sentence = list(rng.choice(words, size=int(rng.integers(4, 10))))
      if i % 2:
        sentence.insert(int(rng.integers(0, len(sentence))), "river")
      rows.append(" ".join(sentence) + f"\t{['neg', 'pos'][i % 2]}")
    (root / name).write_text("\n".join(rows) + "\n")
  return {"train": root / "train.tsv", "dev": root / "dev.tsv", "vocab": vocab}


def smoke_config(pretrain_test_config, toy_task, **pretrain_overrides):
  """ablation.py:smoke on the test corpus (4 steps) and the toy task (1 lr, 1 seed, 1 epoch)."""
  config = ablation_configs.get_config("smoke")
  config.prepare_corpus = ""
  config.pretrain = pretrain_test_config(**{
      "total_steps": 4, "data.masking.max_predictions_per_seq": 0,
      "data.eval.own_masking": True, "eval_every_steps": 2, "log_every_steps": 1,
      "checkpoint.every_steps": 2, **pretrain_overrides})
  task = finetune_configs.get_config("custom")
  task.task.train_file = str(toy_task["train"])
  task.task.dev_file = str(toy_task["dev"])
  task.task.labels = "neg,pos"
  task.task.positive_label = "pos"
  task.max_seq_length = 16
  task.batch_size = 16
  task.eval_batch_size = 16
  task.num_epochs = 1
  task.learning_rates = (1e-3,)
  task.log_every_steps = 2
  task.checkpoint.every_steps = 1000  # saves after its one evaluation (4 steps)
  config.downstream = {"toy": task}
  return config


def _csv_rows(path) -> list[dict[str, str]]:
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _png_size(path: pathlib.Path) -> tuple[int, int]:
  """(width, height) from a PNG's IHDR chunk, after checking the signature."""
  data = path.read_bytes()
  assert data[:8] == PNG_SIGNATURE, path
  assert data[12:16] == b"IHDR"
  return struct.unpack(">II", data[16:24])


def _start(config, workdir: pathlib.Path) -> subprocess.Popen:
  """The ablation in a fresh process (its own session, so kill -9 reaches only it)."""
  config_file = workdir.parent / f"{workdir.name}.config.json"
  config_file.write_text(config.to_json())
  log = open(workdir.parent / f"{workdir.name}.log", "ab")
  # One CPU device: eight simulated ones would only share the same two cores.
  env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
  return subprocess.Popen([sys.executable, "-c", _RUNNER, str(config_file), str(workdir)],
                          cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
                          start_new_session=True)


def _finish(process: subprocess.Popen, workdir: pathlib.Path, timeout: float = 600) -> None:
  code = process.wait(timeout=timeout)
  assert code == 0, (workdir.parent / f"{workdir.name}.log").read_text()[-4000:]


@pytest.fixture(scope="module")
def reference(pretrain_test_config, toy_task, tmp_path_factory):
  """(workdir, seconds) of one uninterrupted smoke ablation, run in a fresh process."""
  workdir = tmp_path_factory.mktemp("ablation") / "reference"
  started = time.monotonic()
  _finish(_start(smoke_config(pretrain_test_config, toy_task), workdir), workdir)
  return workdir, time.monotonic() - started


# ------------------------------------------------------------------- configs


@pytest.mark.parametrize("variant", ablation_configs.VARIANTS)
def test_every_variant_plans_runs_that_differ_only_in_masking(variant, tmp_path):
  """Fails if a variant plans other than one run per setting and seed (zh_tiny: ratios 0.15/0.4/0.6
  and a schedule), a run's seeds or prediction slots are off, or one seed's runs differ in nothing
  or outside data.masking (FLOP mode: also steps and warm-up)."""
  config = ablation_configs.get_config(variant)
  runs = ablation_plan.grid_runs(config, str(tmp_path))
  assert len(runs) == len(config.settings) * len(config.pretrain_seeds)
  if variant == "zh_tiny":
    ratios = {r.config.data.masking.ratio for r in runs}
    assert {0.15, 0.4, 0.6} <= ratios
    assert any(r.config.data.masking.schedule != "constant" for r in runs)
  for run in runs:
    if config.prepare_corpus:  # the Chinese grids write theirs; the pod grids' is given by flag
      assert run.config.data.corpus == f"raw:{tmp_path}/corpus.txt"
    assert (run.config.seed, run.config.data.seed) == (run.seed, run.seed)
    # The static number of predictions follows the largest ratio a run masks at (per
    # token, "bernoulli": every position, so a draw is never cut).
    spec = specs.masking_spec(run.config.data)
    length = run.config.data.max_seq_length
    assert specs.max_predictions(run.config.data) == (
        length if spec.strategy == "bernoulli" else int(np.ceil(spec.max_ratio * length - 1e-9)))
  flat = [ablation.workdir_lib.flatten(r.config) for r in runs if r.seed == runs[0].seed]
  differing = {k for f in flat[1:] for k in f if f[k] != flat[0][k]}
  # Under a FLOP budget each setting also gets its own steps and stretched warm-up.
  budgeted = ({"total_steps", "optimizer.warmup_steps", "optimizer.decay_steps"}
              if config.budget.mode == "flops" else set())
  assert differing and all(k.startswith("data.masking.") or k in budgeted
                           for k in differing), differing


def test_settings_may_only_set_masking_fields(tmp_path):
  """Fails if a setting's ratio does not reach its run's config, or plan accepts a setting that sets
  a non-masking field (learning_rate) or a final_ratio under a constant schedule."""
  config = ablation_configs.get_config("smoke")
  config.settings.r15.ratio = 0.2
  runs = {r.setting: r for r in ablation_plan.grid_runs(config, str(tmp_path))}
  assert runs["r15"].config.data.masking.ratio == 0.2
  with config.settings.r15.unlocked():
    config.settings.r15.learning_rate = 0.1
  with pytest.raises(ablation.AblationError, match="learning_rate.*not fields of"):
    ablation_plan.grid_runs(config, str(tmp_path))
  config = ablation_configs.get_config("smoke")
  config.settings.r15.final_ratio = 0.3  # with a constant schedule
  with pytest.raises(ablation.AblationError, match="final_ratio"):
    ablation_plan.grid_runs(config, str(tmp_path))


def test_printed_commands_rebuild_every_run_config(tmp_path):
  """Each printed bert_jax.main command, parsed by ml_collections, is the run's config."""
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config = ablation_configs.get_config("zh_tiny")
  config.pretrain.total_steps = 777  # an override given on the ablation's command line
  runs = ablation_plan.grid_runs(config, str(tmp_path))
  lines = ablation.commands(config, str(tmp_path), runs,
                            ["--config=experiments/configs/ablation.py:zh_tiny",
                             "--config.pretrain.total_steps=777"])
  mains = [l for l in lines if l.startswith("python -m bert_jax.main")]
  assert len(mains) == len(runs) * (1 + len(config.downstream))
  assert "--config.pretrain.total_steps=777" in lines[1]
  expected = [r.config for r in runs] + [
      ablation_plan.finetune_config(config, task, r, str(tmp_path))
      for r in runs for task in config.downstream]
  dirs = [tmp_path / r.pretrain_dir for r in runs] + [
      tmp_path / r.finetune_dirs[task] for r in runs for task in config.downstream]
  for line, want, workdir in zip(mains, expected, dirs):
    args = shlex.split(line)[3:]
    assert f"--workdir={workdir}" in args
    argv = ["prog"] + [a for a in args if not a.startswith("--workdir=")]
    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    assert ablation.workdir_lib.flatten(values.config) == ablation.workdir_lib.flatten(want), line


# ------------------------------------------------------------- the data check


def _train(pretrain_test_config, workdir, **overrides):
  config = pretrain_test_config(**{"total_steps": 2, "checkpoint.every_steps": 2,
                                   "data.masking.max_predictions_per_seq": 0, **overrides})
  pretrain_lib.train_and_evaluate(config, str(workdir))
  return {"name": workdir.name, "seed": 0, "pretrain": workdir.name}


@pytest.mark.slow
def test_identical_data_check_fails_on_other_data_or_config(pretrain_test_config, tmp_path):
  """Fails if check_identical_data refuses two runs that differ only in masking ratio, or does not
  refuse, naming the runs and the cause, another data.seed, batches differing from step 1, one batch
  altered at step 2, or another optimizer.learning_rate (with both values)."""
  base = _train(pretrain_test_config, tmp_path / "base")
  higher = _train(pretrain_test_config, tmp_path / "higher", **{"data.masking.ratio": 0.5})
  ablation.check_identical_data(str(tmp_path), [base, higher])  # differ only in masks: fine

  other_data = _train(pretrain_test_config, tmp_path / "other_data", **{"data.seed": 1})
  with pytest.raises(ablation.AblationError) as error:
    ablation.check_identical_data(str(tmp_path), [base, higher, other_data])
  message = str(error.value)
  assert "base and other_data" in message and "data.seed" in message

  # With the config made equal, the batches themselves give it away, at step 1.
  record = json.loads((tmp_path / "other_data" / "record.json").read_text())
  record["config"]["data.seed"] = 0
  (tmp_path / "other_data" / "record.json").write_text(json.dumps(record))
  with pytest.raises(ablation.AblationError, match=r"base and other_data .* first differ at "
                                                   r"step 1 "):
    ablation.check_identical_data(str(tmp_path), [base, other_data])

  # One altered batch is found at its own step.
  shutil.copytree(tmp_path / "higher", tmp_path / "tampered")
  log = tmp_path / "tampered" / "batch_log.jsonl"
  rows = [json.loads(l) for l in log.read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2]
  rows[1]["batch"] = "0" * 16
  log.write_text("".join(json.dumps(r) + "\n" for r in rows))
  tampered = {"name": "tampered", "seed": 0, "pretrain": "tampered"}
  with pytest.raises(ablation.AblationError, match="base and tampered .* at step 2 "):
    ablation.check_identical_data(str(tmp_path), [base, tampered])

  # Config outside data.masking: named, field and both values.
  record = json.loads((tmp_path / "higher" / "record.json").read_text())
  record["config"]["optimizer.learning_rate"] = 0.5
  (tmp_path / "tampered" / "record.json").write_text(json.dumps(record))
  with pytest.raises(ablation.AblationError, match=r"config.optimizer.learning_rate: 0.001 vs 0.5"):
    ablation.check_identical_data(str(tmp_path), [base, tampered])


# ----------------------------------------------------------------- end to end


@pytest.mark.slow
def test_smoke_grid_end_to_end(reference):
  """Fails if the smoke grid's plan or results.csv (schedules, slots, 4 steps, equal tokens but more
  predictions and FLOPs for cosine) is off, its batches differ, report.md or a plot is missing, the
  equal-FLOPs fine-tune is not from cosine's step 2, or the report stage rebuilds another table."""
  workdir, _ = reference
  plan = json.loads((workdir / "plan.json").read_text())
  assert sorted(r["name"] for r in plan["runs"]) == ["cos40to15_seed0", "r15_seed0"]
  rows = {r["run"]: r for r in _csv_rows(workdir / "results.csv")}
  assert sorted(rows) == ["cos40to15_seed0", "r15_seed0"]
  r15, cos = rows["r15_seed0"], rows["cos40to15_seed0"]
  assert (r15["schedule"], cos["schedule"]) == ("constant", "cosine 0.40->0.15")
  assert (r15["prediction_slots"], cos["prediction_slots"]) == ("5", "13")  # ceil(r x 32)
  for row in (r15, cos):
    assert row["steps"] == row["total_steps"] == "4"
    assert 0.0 <= float(row["eval_mlm_accuracy"]) <= 1.0
    assert 0.0 <= float(row["toy_median"]) <= 1.0
    assert float(row["toy_min"]) <= float(row["toy_median"]) <= float(row["toy_max"])
  # Same tokens (identical batches), more predictions and FLOPs at the higher ratios.
  assert r15["tokens"] == cos["tokens"] and int(r15["tokens"]) > 4 * 8 * 10
  assert int(cos["predictions"]) > int(r15["predictions"]) > 0
  assert float(cos["model_flops"]) > float(r15["model_flops"]) > 0
  # r15 trains with exactly the held-out set's masking, so its own-ratio eval is that eval.
  assert float(r15["eval_own_mlm_accuracy"]) == pytest.approx(float(r15["eval_mlm_accuracy"]))
  logs = [[json.loads(l) for l in (workdir / "pretrain" / run / "batch_log.jsonl")
           .read_text().splitlines()] for run in ("r15_seed0", "cos40to15_seed0")]
  assert [r["batch"] for r in logs[0]] == [r["batch"] for r in logs[1]]
  assert sum(r["predictions"] for r in logs[0]) == int(r15["predictions"])

  report = (workdir / "report.md").read_text()
  assert report.count("| r15_seed0 |") == 1 and report.count("| cos40to15_seed0 |") == 1
  for name in ("mlm_accuracy_vs_step", "mlm_accuracy_vs_flops", "downstream_vs_ratio", "figure"):
    png = workdir / "plots" / f"{name}.png"
    width, height = _png_size(png)
    assert width > 100 and height > 100 and png.stat().st_size > 5000, name
    assert f"plots/{name}.png" in report

  # Step mode: the cosine run (more predictions, so more FLOPs per step) is fine-tuned
  # again from its checkpoint at r15's total FLOPs, the evaluation point at step 2.
  equal = json.loads((workdir / "equal_flops.json").read_text())
  assert equal["r15_seed0"]["step"] == 4
  assert equal["r15_seed0"]["finetune"] == {"toy": "finetune/r15_seed0/toy"}  # its final one
  assert equal["cos40to15_seed0"]["step"] == 2
  assert equal["cos40to15_seed0"]["flops"] <= equal["r15_seed0"]["flops"]
  assert equal["r15_seed0"]["flops"] == pytest.approx(float(r15["model_flops"]), rel=1e-5)
  matched_dir = workdir / "finetune" / "cos40to15_seed0" / "toy_equal_flops"
  assert (matched_dir / "summary.json").exists()
  assert json.loads((matched_dir / "config.json").read_text())["init_checkpoint"] == str(
      workdir / "pretrain" / "cos40to15_seed0" / "checkpoints" / "2")
  assert "## Downstream at equal model FLOPs" in report
  assert "| cos40to15 | 0 | 2 |" in report.split("## Downstream at equal model FLOPs")[1]

  # The report stage alone rebuilds the same table from the workdirs.
  (workdir / "results.csv").unlink()
  assert ablation.run_ablation(None, str(workdir), "report") == 0
  assert _without_timing(_csv_rows(workdir / "results.csv")) == _without_timing(rows.values())


@pytest.mark.slow
def test_every_equal_flops_row_sits_within_one_percent_of_the_heading(reference):
  """The trained smoke grid's report.md, "at equal model FLOPs": the heading's budget is the
  smallest run's total model FLOPs as executed (recomputed here from the batch logs), and
  every row's FLOPs sit within 1% of it. A row read at an evaluation reads that step's
  executed FLOPs; the cosine run, whose every evaluation is over 1% from the budget, is
  interpolated between the evaluations just below and just above it, and says so. Fails
  if a run falls back to an evaluation an interval short (the rule before: cosine read at
  step 2), or a row's FLOPs are not the batch logs'."""
  workdir, _ = reference
  runs = ("r15_seed0", "cos40to15_seed0")
  executed = {run: ablation_report.cumulative_flops(str(workdir), f"pretrain/{run}")
              for run in runs}
  budget = min(flops[-1] for flops in executed.values())
  assert budget == executed["r15_seed0"][-1]
  report = (workdir / "report.md").read_text()
  section = report.split("## At equal steps")[1].split("\n## ")[0]
  heading = float(re.search(r"at equal model FLOPs \(([0-9.e+-]+) PFLOP", section).group(1))
  assert heading * 1e15 == pytest.approx(budget, rel=5e-4)  # printed to 4 significant digits
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip("|").split("|")]
    if line.startswith("| ") and cells[0] in ("r15", "cos40to15"):
      rows[cells[0]] = cells
  assert sorted(rows) == ["cos40to15", "r15"]
  evaluated = {run: {json.loads(l)["step"] for l in (workdir / "pretrain" / run / "metrics.jsonl")
                     .read_text().splitlines() if "eval/mlm_accuracy" in json.loads(l)}
               for run in runs}
  for setting, cells in rows.items():
    run, step, pflop = f"{setting}_seed0", cells[4], float(cells[5])
    assert abs(pflop * 1e15 - budget) <= 0.01 * budget, (setting, pflop)
    if step.startswith("interpolated "):
      low, high = (int(s) for s in step.split()[1].split("-"))
      assert {low, high} <= evaluated[run]
      assert executed[run][low] < budget < executed[run][high]
    else:
      assert int(step) in evaluated[run]
      assert pflop * 1e15 == pytest.approx(executed[run][int(step)], rel=5e-4)
  assert rows["r15"][4] == "4"  # the budget is its own final evaluation
  # The cosine run makes more predictions per step: no evaluation of it lies within 1%.
  assert all(abs(executed["cos40to15_seed0"][s] - budget) > 0.01 * budget
             for s in evaluated["cos40to15_seed0"])
  assert rows["cos40to15"][4] == "interpolated 2-4"
  assert "not a measurement" in section


def _without_timing(rows) -> list[dict[str, str]]:
  return sorted(({k: v for k, v in r.items() if k not in ablation_report.TIMING_COLUMNS}
                 for r in rows), key=lambda r: r["run"])


# Moments to kill at, in the order the ablation writes them: each a file written at a
# different stage (a compiled program cache makes a second execution faster, so
# wall-clock times would not say where).
_MOMENTS = ("pretrain/cos40to15_seed0/record.json", "pretrain/cos40to15_seed0/checkpoints/2",
            "pretrain/r15_seed0/record.json", "pretrain/r15_seed0/checkpoints/2",
            "finetune/cos40to15_seed0/toy/record.json", "finetune/r15_seed0/toy/record.json",
            "plots")


@pytest.mark.slow
def test_killed_at_every_stage_resumes_to_the_same_results(reference, pretrain_test_config,
                                                           toy_task, tmp_path):
  """kill -9 at each moment in turn, as soon as its file appears, the same command re-run
  after every kill; the grid then ends with the reference's results.csv and batch logs.
  Deterministic: the same seven kills on every run (no random moment, no sleep). Fails if
  a restart loses or repeats a step, redoes or skips a stage so that a result changes,
  or a moment's file is no longer written (the run would finish unkilled)."""
  ref_dir, _ = reference
  workdir = tmp_path / "killed"
  config = smoke_config(pretrain_test_config, toy_task)
  for moment in _MOMENTS:
    assert not (workdir / moment).exists(), f"{moment} written before its turn"
    process = _start(config, workdir)
    deadline = time.monotonic() + 600
    while not (workdir / moment).exists() and process.poll() is None:
      assert time.monotonic() < deadline, moment
      time.sleep(0.01)
    assert process.poll() is None, f"the ablation ended without writing {moment}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (workdir / "results.csv").exists(), moment
  _finish(_start(config, workdir), workdir)
  assert _without_timing(_csv_rows(workdir / "results.csv")) == \
      _without_timing(_csv_rows(ref_dir / "results.csv"))
  for run in ("r15_seed0", "cos40to15_seed0"):  # every step once, as uninterrupted
    assert (workdir / "pretrain" / run / "batch_log.jsonl").read_text() == \
        (ref_dir / "pretrain" / run / "batch_log.jsonl").read_text(), run


def test_a_grid_that_would_run_a_run_twice_is_refused(tmp_path):
  """Fails if a grid with a repeated pretraining seed, or two settings that mask alike, plans
  its duplicate runs as independent ones instead of refusing, naming both."""
  config = ablation_configs.get_config("smoke")
  config.pretrain_seeds = (0, 0)
  with pytest.raises(ablation.AblationError, match=r"pretrain_seeds=\(0, 0\) repeats a seed"):
    ablation_plan.grid_runs(config, str(tmp_path))
  config = ablation_configs.get_config("smoke")
  with config.settings.unlocked():
    config.settings.r15_again = ablation_configs.masking_setting(0.15)
  with pytest.raises(ablation.AblationError,
                     match=r"config.settings.r15 and config.settings.r15_again mask alike"):
    ablation_plan.grid_runs(config, str(tmp_path))


@pytest.mark.slow  # a fresh process each (python -m experiments.ablation)
@pytest.mark.parametrize("flags, says", [
    (["--config.pretrain_seeds=(0,0)"], "config.pretrain_seeds=(0, 0) repeats a seed"),
    (["--config.settings.cos40to15.schedule=constant", "--config.settings.cos40to15.ratio=0.15",
      "--config.settings.cos40to15.final_ratio=0.0"],
     "config.settings.cos40to15 and config.settings.r15 mask alike"),
])
def test_the_command_refuses_duplicate_runs_in_one_line_and_writes_nothing(tmp_path, flags,
                                                                           says):
  """Fails if `python -m experiments.ablation` on a grid with a repeated seed or two settings
  that mask alike prints anything but its one line naming both, exits other than 1, or
  creates its workdir."""
  from test_refusals import _refusal_line  # pylint: disable=g-import-not-at-top
  result = subprocess.run(
      [sys.executable, "-m", "experiments.ablation",
       "--config=experiments/configs/ablation.py:smoke", *flags, f"--workdir={tmp_path / 'w'}",
       "--dry_run"], capture_output=True, text=True, timeout=300, cwd=REPO,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert says in _refusal_line(result.stderr, result.returncode), result.stderr
  assert not (tmp_path / "w").exists()
