"""Fine-tuning's paddings train what fixed padding trains (issues 33 and 50).

Buckets (config.padding="buckets", config.group_by_length=False) batch the rows fixed
padding batches, in its order, and only cut each batch to the smallest bucket holding
its longest row; packed (the default since issue 50) packs the same batch's examples
into as few rows as hold them. Attention masks the padding and the other examples, so
with dropout off a run's per-step losses and its dev predictions are fixed padding's.
Length grouping is an option; a workdir recorded before the option existed trained
grouped, and a workdir recorded under buckets, the default before packing, keeps them:
their records say so on resume.
"""

import json
import pathlib

import pytest

from bert_jax.finetune import prepare as finetune_prepare

from bert_jax.finetune import sweep as finetune_sweep
from bert_jax.model import encoder as model_lib
from bert_jax.run import workdir as workdir_lib
from experiments.configs import finetune as finetune_configs


def _pos_config(chinese_vocab, **overrides):
  """peoples_daily_pos, tiny random model, dropout off: 100 sentences (about 100 rows of
  up to 128 pieces, in buckets of 32), batch 8, 2 epochs (24 steps), every step logged,
  dev (40 sentences) scored once at the end."""
  config = finetune_configs.get_config("peoples_daily_pos")
  config.vocab_file = str(chinese_vocab)
  config.model_size = "tiny"
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_probs_dropout_prob = 0.0
  config.task.max_train_examples = 100
  config.task.max_dev_examples = 40
  config.batch_size = config.eval_batch_size = 8
  config.num_epochs = 2
  config.optimizer.learning_rate = 1e-3
  config.log_every_steps = 1
  config.eval_every_steps = 10**6  # only at the end
  config.checkpoint.every_steps = 10**6
  config.update_from_flattened_dict(overrides)
  return config


def _run(config, workdir: pathlib.Path):
  """(per-step train losses, dev predictions, train lengths compiled) of one run."""
  summary = finetune_sweep.finetune(config, str(workdir))
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = [r["loss"] for r in rows if "loss" in r]
  step = json.loads((workdir / "result.json").read_text())["step"]
  predictions = [json.loads(l)["prediction"] for l in (
      workdir / "predictions" / str(step) / "dev_predictions.jsonl").read_text().splitlines()]
  return losses, predictions, summary["speed"]["compiled"]["train_lengths"]


@pytest.mark.slow  # three 24-step runs of a tiny model, 6 train programs in all
def test_buckets_train_as_fixed_padding_step_by_step(chinese_vocab, tmp_path):
  """A token task (tagging), dropout off: buckets' per-step losses equal fixed
  padding's within 1e-5 and its dev predictions are the same, though its batches ran at
  shorter lengths. Would fail if buckets reordered or regrouped rows (the grouped
  run shows such a change is visible), if a cut dropped a real token, or if padding
  leaked into the loss or the attention."""
  default = _run(_pos_config(chinese_vocab, padding="buckets"), tmp_path / "default")
  fixed = _run(_pos_config(chinese_vocab, padding="fixed"), tmp_path / "fixed")
  grouped = _run(_pos_config(chinese_vocab, padding="buckets", group_by_length=True),
                 tmp_path / "grouped")
  losses, predictions, lengths = default
  assert len(losses) == len(fixed[0]) >= 20
  assert fixed[2] == [128] and len(lengths) >= 2 and min(lengths) < 128, lengths
  assert max(abs(a - b) for a, b in zip(losses, fixed[0])) < 1e-5, (losses, fixed[0])
  assert predictions == fixed[1] and len(predictions) == 40
  # Learning happened (a loss that never moved would make the equality trivial).
  assert losses[-1] < 0.8 * losses[0]
  # The grouped order trains other batches: visibly other losses from the first step on.
  assert max(abs(a - b) for a, b in zip(grouped[0], fixed[0])) > 1e-3


def _record(config, chinese_vocab, workdir):
  bert_config = model_lib.BertConfig.from_size("tiny", vocab_size=21128)
  workdir_lib.open_workdir(str(workdir), config, bert_config,
                           vocab_file=str(chinese_vocab)).release()
  return bert_config


@pytest.mark.parametrize("padding,multiple,grouped", [
    ("buckets", 32, True), ("fixed", 32, False), ("buckets", 128, False)])
def test_a_record_from_before_group_by_length_resumes_as_it_trained(
    chinese_vocab, tmp_path, padding, multiple, grouped):
  """A workdir recorded before config.group_by_length existed trained grouped when its
  padding was "buckets" with more than one bucket: resuming it under the new default
  (ungrouped) is refused, naming the field, before anything is written, and resumes
  with --config.group_by_length=True; fixed padding (or a single bucket) resumes under
  the default. Would fail if the missing field were only logged (a silent change of
  the batches) or if an old fixed-padding run were refused."""
  workdir = tmp_path / "run"
  old = _pos_config(chinese_vocab, padding=padding, bucket_multiple=multiple)
  bert_config = _record(old, chinese_vocab, workdir)
  record_file = workdir / workdir_lib.RECORD_FILE
  record = json.loads(record_file.read_text())
  del record["config"]["group_by_length"]  # as the code before the field wrote it
  record_file.write_text(json.dumps(record))
  (workdir / "checkpoints" / "5").mkdir(parents=True)  # work the record speaks for
  (workdir / "checkpoints" / "5" / "_CHECKPOINT_METADATA").write_text("{}")
  before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}

  def resume(group_by_length):
    config = _pos_config(chinese_vocab, padding=padding, bucket_multiple=multiple,
                         group_by_length=group_by_length)
    workdir_lib.open_workdir(str(workdir), config, bert_config,
                             vocab_file=str(chinese_vocab)).release()

  with pytest.raises(workdir_lib.WorkdirError,
                     match=rf"with config.group_by_length={grouped}; this run has "
                           rf"{not grouped}"):
    resume(not grouped)
  assert {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()} == before
  resume(grouped)


def test_a_buckets_workdir_resumes_with_its_padding_under_the_packed_default(
    chinese_vocab, tmp_path):
  """A workdir that trained under buckets, the default before packing: resuming it with
  the default config is refused before anything is written, naming the flag that
  resumes it as it ran, and that flag resumes it; SQuAD's default stays buckets. Would
  fail if the new default silently took over an old run's batches' shapes."""
  assert _pos_config(chinese_vocab).padding == "packed"
  assert finetune_configs.get_config("squad_v1").padding == "buckets"
  workdir = tmp_path / "run"
  bert_config = _record(_pos_config(chinese_vocab, padding="buckets"), chinese_vocab, workdir)
  (workdir / "checkpoints" / "5").mkdir(parents=True)  # work the record speaks for
  (workdir / "checkpoints" / "5" / "_CHECKPOINT_METADATA").write_text("{}")
  before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}

  def resume(**overrides):
    workdir_lib.open_workdir(str(workdir), _pos_config(chinese_vocab, **overrides),
                             bert_config, vocab_file=str(chinese_vocab)).release()

  with pytest.raises(workdir_lib.WorkdirError,
                     match=r"with config.padding='buckets'; this run has 'packed'.*"
                           r"to resume it as it ran, --config.padding='buckets'"):
    resume()
  assert {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()} == before
  resume(padding="buckets")


@pytest.mark.slow  # two 12-step runs of a tiny model
def test_train_mean_divides_every_step_by_one_number(chinese_vocab, tmp_path):
  """config.loss_normalizer="train_mean": a step's summed token loss is divided by the
  train set's mean labelled tokens per batch, not by its own batch's count. The first
  step (the same parameters under both) shows it: its loss is the "batch" loss times the
  batch's labelled tokens over that fixed number. Would fail if the option divided by
  anything else, or did nothing; an unknown value is refused before any data is read."""
  from bert_jax.finetune.features import buckets  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import steps  # pylint: disable=g-import-not-at-top
  config = _pos_config(chinese_vocab, num_epochs=1)
  prepared = finetune_prepare.prepare(config)
  features = prepared.task.train.features
  fixed = steps.fixed_loss_weight(_pos_config(chinese_vocab, loss_normalizer="train_mean"),
                                  prepared.task)
  per_row = features["label_weights"].sum() / len(features["input_ids"])
  assert fixed == pytest.approx(8 * per_row) and steps.fixed_loss_weight(config, None) is None
  rows, _ = buckets.TrainBatches(features, seed=0, batch_size=8, buckets=(128,), grouped=False,
                                 window_batches=50).rows(0)
  first_weight = features["label_weights"][rows].sum()
  assert abs(first_weight - fixed) > 1  # else the check below could not tell them apart
  by_batch = _run(config, tmp_path / "batch")[0]
  by_mean = _run(_pos_config(chinese_vocab, num_epochs=1, loss_normalizer="train_mean"),
                 tmp_path / "mean")[0]
  assert by_mean[0] == pytest.approx(by_batch[0] * first_weight / fixed, rel=1e-5)
  with pytest.raises(ValueError, match="config.loss_normalizer='tokens' must be 'batch' or"):
    finetune_sweep.finetune(_pos_config(chinese_vocab, loss_normalizer="tokens"), str(tmp_path / "x"))
  assert not (tmp_path / "x").exists()


@pytest.mark.slow  # two 24-step runs of a tiny model
def test_packed_batches_train_as_fixed_padding_step_by_step(chinese_vocab, tmp_path):
  """A token task (tagging), dropout off: packing each batch's examples into as few rows as
  hold them gives fixed padding's per-step losses within 1e-5 and its dev predictions, on
  fewer rows than examples. Would fail if an example attended to another packed beside it,
  its positions did not restart, or its outputs were read back from the wrong tokens."""
  packed = _run(_pos_config(chinese_vocab, padding="packed"), tmp_path / "packed")
  fixed = _run(_pos_config(chinese_vocab, padding="fixed"), tmp_path / "fixed")
  assert len(packed[0]) == len(fixed[0]) >= 20
  assert max(abs(a - b) for a, b in zip(packed[0], fixed[0])) < 1e-5, (packed[0], fixed[0])
  assert packed[1] == fixed[1] and len(packed[1]) == 40
  summary = json.loads((tmp_path / "packed" / "result.json").read_text())
  assert summary["final"], summary
