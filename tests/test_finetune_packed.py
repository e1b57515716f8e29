"""config.padding="packed" (bert_jax/finetune/features/packed.py): each batch's examples, the
ones fixed padding batches, packed into as few rows as hold them, each attending only to
itself. With dropout off the per-step losses equal fixed padding's within 1e-5 and the
dev predictions are the same, for classification and SQuAD here and tagging in
tests/test_finetune_padding.py; and for classification on 2 processes with gradient
accumulation, each device's examples packed into rows of its own."""

import json
import pathlib

import numpy as np
import pytest

import ports

from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.finetune.features import packed
from experiments.configs import finetune as finetune_configs
from test_finetune_trainer import toy_config
from test_finetune_trainer import toy_files  # noqa: F401  (the fixture, by name)


def test_examples_are_packed_first_fit_decreasing_and_read_back():
  """Fails if the examples are not packed into the fewest rows first fit decreasing, a
  token lands elsewhere than pack_index says, positions do not restart, document ids do
  not number the examples of a row, or the labels stop being one per example."""
  lengths = [5, 9, 3, 7, 0]  # the last an empty (padding) example
  features = {"input_ids": np.zeros((5, 10), np.int32), "input_mask": np.zeros((5, 10), np.int32),
              "segment_ids": np.zeros((5, 10), np.int32), "label_ids": np.arange(5)}
  for i, n in enumerate(lengths):
    features["input_ids"][i, :n] = 100 * (i + 1) + np.arange(n)
    features["input_mask"][i, :n] = 1
  out = packed.pack(features, ("label_ids",), np.arange(5), 10)
  # 9 | 7 3 | 5 -> three rows (5 and 3 would fit too, but 3 went first, by length).
  assert out["input_ids"].shape == (3, 10)
  flat = out["input_ids"].reshape(-1)
  for i, n in enumerate(lengths):
    index = out["pack_index"][i]
    assert (index[n:] == -1).all()
    np.testing.assert_array_equal(flat[index[:n]], features["input_ids"][i, :n])
    np.testing.assert_array_equal(out["position_ids"].reshape(-1)[index[:n]], np.arange(n))
  # Numbered in batch order: example 2 (3 tokens) before example 3 (7 tokens) in their row.
  np.testing.assert_array_equal(out["document_ids"][1], [2] * 7 + [1] * 3)
  np.testing.assert_array_equal(out["label_ids"], features["label_ids"])


def _micro(x: np.ndarray, accum: int, j: int) -> np.ndarray:
  """Micro-batch j of x as training/state.accumulated_grads splits a batch."""
  return x.reshape((len(x) // accum, accum) + x.shape[1:])[:, j]


def test_each_device_and_micro_batch_packs_its_own_rows():
  """Fails if, split as gradient accumulation splits a batch, a micro-batch's pack_index
  does not find its examples' tokens in its own rows, an example's rows lie outside its
  device's shard, a group takes more rows than the fullest group needs, or the processes'
  shares do not make up the whole batch."""
  devices, accum, t, size = 2, 2, 12, 16
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, t + 1, size)
  lengths[5] = 0  # an empty example
  features = {k: np.zeros((size, t), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  features["label_ids"] = np.arange(size)
  for i, n in enumerate(lengths):
    features["input_ids"][i, :n] = 100 * (i + 1) + np.arange(n)
    features["input_mask"][i, :n] = 1
  order = rng.permutation(size)  # the batch's examples, not in feature order
  out = packed.pack(features, ("label_ids",), order, t, devices=devices, accum=accum)
  per_group = max(packed.assign(lengths[order][g], t)[2] for g in
                  (np.arange(d * size // devices + j, (d + 1) * size // devices, accum)
                   for d in range(devices) for j in range(accum)))
  assert len(out["input_ids"]) == devices * accum * per_group
  for j in range(accum):
    rows, index = _micro(out["input_ids"], accum, j), _micro(out["pack_index"], accum, j)
    examples = _micro(order, accum, j)
    flat = rows.reshape(-1)
    for e, (example, idx) in enumerate(zip(examples, index)):
      n = lengths[example]
      np.testing.assert_array_equal(flat[idx[:n]], features["input_ids"][example, :n])
      assert (idx[n:] == -1).all()
      # The micro-batch's examples and rows are split evenly over the devices.
      device = e // (len(examples) // devices)
      assert (idx[:n] // t // (len(rows) // devices) == device).all()
  np.testing.assert_array_equal(out["label_ids"], order)
  shares = [packed.pack(features, ("label_ids",), order, t, devices=devices, accum=accum,
                        process_index=p, process_count=2) for p in range(2)]
  for k, v in out.items():
    np.testing.assert_array_equal(np.concatenate([s[k] for s in shares]), v)


def _run(config, workdir: pathlib.Path):
  """(per-step losses, dev predictions file's text, the summary) of one run."""
  summary = finetune_sweep.finetune(config, str(workdir))
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  step = json.loads((workdir / "result.json").read_text())["step"]
  files = sorted((workdir / "predictions" / str(step)).glob("*"))
  return [r["loss"] for r in rows if "loss" in r], [f.read_text() for f in files], summary


def _no_dropout(config):
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_probs_dropout_prob = 0.0
  return config


@pytest.mark.slow  # two runs of the toy classification task
def test_packed_classification_trains_as_fixed_padding(toy_files, tmp_path):  # noqa: F811
  """Fails if packed classification's per-step losses differ from fixed padding's beyond
  1e-5 or its dev predictions differ, or no batch was packed into fewer rows."""
  runs = {p: _run(_no_dropout(toy_config(toy_files, padding=p, log_every_steps=1,
                                         max_seq_length=32)), tmp_path / p)
          for p in ("packed", "fixed")}
  (losses, predictions, summary), (fixed_losses, fixed_predictions, _) = (
      runs["packed"], runs["fixed"])
  assert len(losses) == len(fixed_losses) >= 20
  assert max(abs(a - b) for a, b in zip(losses, fixed_losses)) < 1e-5
  assert predictions == fixed_predictions and predictions
  assert max(summary["speed"]["compiled"]["train_rows"]) < 16, summary["speed"]


@pytest.mark.slow  # two SQuAD runs on the allennlp fixture
def test_packed_squad_trains_as_fixed_padding(allennlp_fixtures, uncased_vocab, tmp_path):
  """Fails if packed SQuAD windows' per-step losses differ from fixed padding's (its softmax
  over the real tokens, as packed rows train) beyond 1e-5, or the predictions (answers,
  n-best) differ."""
  def config(padding):
    c = finetune_configs.get_config("squad_v1")
    c.update_from_flattened_dict({
        "task.train_file": str(allennlp_fixtures / "squad.json"),
        "task.dev_file": str(allennlp_fixtures / "squad.json"), "max_seq_length": 128,
        "task.doc_stride": 32, "num_epochs": 3, "padding": padding, "log_every_steps": 1})
    c.vocab_file = str(uncased_vocab)
    c.model_size = "tiny"
    c.batch_size = c.eval_batch_size = 8
    c.optimizer.learning_rate = 2e-3
    c.eval_every_steps = 1000
    return _no_dropout(c)
  losses, predictions, _ = _run(config("packed"), tmp_path / "packed")
  # Packed trains SQuAD's softmax over the real tokens (it has no padding to include):
  # fixed padding with the same loss (task.mask_padding_logits).
  fixed = config("fixed")
  fixed.task.mask_padding_logits = True
  fixed_losses, fixed_predictions, _ = _run(fixed, tmp_path / "fixed")
  assert len(losses) == len(fixed_losses) > 0
  assert max(abs(a - b) for a, b in zip(losses, fixed_losses)) < 1e-5
  # The answers are the same; the n-best lists the same texts, their logits within float
  # rounding (the packed rows' sums run in another order).
  answers, fixed_answers = (json.loads(p[-1]) for p in (predictions, fixed_predictions))
  assert answers == fixed_answers and answers
  nbest, fixed_nbest = (json.loads(p[0]) for p in (predictions, fixed_predictions))
  assert nbest.keys() == fixed_nbest.keys()
  for qid, entries in nbest.items():
    assert [e["text"] for e in entries] == [e["text"] for e in fixed_nbest[qid]]
    np.testing.assert_allclose([e["start_logit"] for e in entries],
                               [e["start_logit"] for e in fixed_nbest[qid]], atol=1e-5)


@pytest.mark.slow  # a 2-process run and a fixed-padding run of the toy task
def test_packed_on_two_processes_with_accumulation_trains_as_fixed_padding(
    toy_files, pretrain_subprocess, tmp_path):  # noqa: F811
  """Two processes x 2 devices, gradient accumulation 2: fails if the packed run's per-step
  losses differ from one process's fixed padding (8 devices, no accumulation) beyond 1e-5,
  its dev predictions differ, or it does not finish."""
  def config(padding, **overrides):
    return _no_dropout(toy_config(toy_files, padding=padding, log_every_steps=1,
                                  max_seq_length=32, **overrides))
  port = ports.free_port()
  processes = []
  for i in range(2):
    c = config("packed", grad_accum_steps=2)
    c.distributed.update(enabled=True, coordinator_address=f"localhost:{port}",
                         num_processes=2, process_id=i)
    processes.append(pretrain_subprocess(c, tmp_path / "packed", devices=2, name=f"packed_{i}"))
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == 0, (tmp_path / f"packed_{i}.log").read_text()[-3000:]
  run = tmp_path / "packed"
  losses = [json.loads(l)["loss"] for l in (run / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(l)]
  step = json.loads((run / "result.json").read_text())["step"]
  predictions = [f.read_text() for f in sorted((run / "predictions" / str(step)).glob("*"))]
  fixed_losses, fixed_predictions, _ = _run(config("fixed"), tmp_path / "fixed")
  assert len(losses) == len(fixed_losses) >= 20
  assert max(abs(a - b) for a, b in zip(losses, fixed_losses)) < 1e-5
  assert predictions == fixed_predictions and predictions


def test_length_grouping_under_packing_is_refused_with_the_fix(toy_files):  # noqa: F811
  """Packing keeps fixed padding's batches; grouping would regroup them. Fails if the two
  together are not refused before any data is read, or the refusal does not say which
  flag groups by length."""
  from bert_jax.finetune import prepare as finetune_prepare  # pylint: disable=g-import-not-at-top
  from bert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  config = toy_config(toy_files, group_by_length=True)
  assert config.padding == "packed"  # the default
  mesh, _ = state_lib.setup_mesh(config)
  with pytest.raises(ValueError, match=r"group_by_length=True .* add --config.padding=buckets"):
    finetune_prepare.check_config(config, mesh)
  config.padding = "buckets"
  finetune_prepare.check_config(config, mesh)
