"""Tests of length bucketing (bert_jax/finetune/features/buckets.py): numpy only, no model.

The trainer's end-to-end checks (bucketed logits equal fixed padding, a sweep
compiles each bucket once, a bucketed run resumes exactly after kill -9) are
in test_finetune_trainer.py, beside the toy task they train.
"""

import numpy as np
import pytest

from bert_jax.finetune.features import buckets


def _lengths(n=1000, seed=0, low=4, high=128):
  return np.random.default_rng(seed).integers(low, high + 1, size=n)


def test_bucket_lengths():
  """Fails if a max length and bucket step give other bucket lengths than listed (the max always
  last, "fixed" one length), padding='none' is accepted, or a length maps to another bucket than the
  smallest holding it."""
  assert buckets.bucket_lengths(128, 32, "buckets") == (32, 64, 96, 128)
  assert buckets.bucket_lengths(100, 32, "buckets") == (32, 64, 96, 100)
  assert buckets.bucket_lengths(128, 32, "fixed") == (128,)
  assert buckets.bucket_lengths(16, 32, "buckets") == (16,)
  with pytest.raises(ValueError, match="config.padding='none' must be one of"):
    buckets.bucket_lengths(128, 32, "none")
  np.testing.assert_array_equal(buckets.bucket_of(np.array([1, 32, 33, 128]), (32, 64, 96, 128)),
                                [32, 32, 64, 128])


def test_grouping_keeps_every_row_once_per_epoch_in_a_seed_determined_order():
  """Would fail if a row were dropped or repeated within an epoch, if the order
  depended on anything but (seed, epoch), or if grouping did not cut padding."""
  lengths = _lengths(1024)
  orders = {}
  for seed in (0, 1):
    for epoch in (0, 1):
      order = buckets.train_order(lengths, seed, epoch, 32, window_batches=8, grouped=True)
      assert order.shape == (32, 32)
      np.testing.assert_array_equal(np.sort(order.ravel()), np.arange(1024))
      again = buckets.train_order(lengths, seed, epoch, 32, window_batches=8, grouped=True)
      np.testing.assert_array_equal(order, again)
      orders[seed, epoch] = order
  assert not np.array_equal(orders[0, 0], orders[1, 0])
  assert not np.array_equal(orders[0, 0], orders[0, 1])

  grouped = orders[0, 0]
  plain = buckets.train_order(lengths, 0, 0, 32, window_batches=8, grouped=False)
  # Ungrouped is the trainer's historical order: batch i = rows 32i.. of the permutation.
  np.testing.assert_array_equal(
      plain.ravel(), np.random.default_rng([0, 0]).permutation(1024))
  padded = lambda order: buckets.bucket_of(lengths[order].max(axis=1), (32, 64, 96, 128)).sum()
  assert padded(grouped) < 0.85 * padded(plain)
  # Random order of batches: their lengths are not sorted over the epoch.
  maxima = lengths[grouped].max(axis=1)
  assert not np.all(np.diff(maxima) >= 0)


def test_grouping_drops_the_same_tail_as_fixed_padding():
  """1000 rows in batches of 32: 31 batches; the 8 rows left out are the permutation's tail."""
  lengths = _lengths(1000)
  grouped = buckets.train_order(lengths, 3, 0, 32, window_batches=5, grouped=True)
  plain = buckets.train_order(lengths, 3, 0, 32, window_batches=5, grouped=False)
  assert grouped.shape == plain.shape == (31, 32)
  assert set(grouped.ravel()) == set(plain.ravel())
  assert len(set(grouped.ravel())) == 992


def test_train_batches_cut_sequences_to_the_bucket():
  """Would fail if the default (ungrouped) batches were not fixed padding's rows in fixed
  padding's order, if a batch were cut shorter than its longest row or not to the smallest
  bucket holding it, or if grouping (group_by_length) did not reorder them."""
  lengths = np.array([5, 9, 3, 16, 7, 2, 11, 4])
  mask = (np.arange(16)[None] < lengths[:, None]).astype(np.int32)
  features = {"input_ids": mask * 7, "input_mask": mask, "segment_ids": mask * 0,
              "label_ids": np.arange(8), "label_weights": mask.astype(np.float32)}
  make = lambda grouped, bucket_lengths=(4, 8, 12, 16): buckets.TrainBatches(
      features, seed=0, batch_size=2, buckets=bucket_lengths, grouped=grouped,
      window_batches=4)
  batches, fixed, grouped = make(False), make(False, (16,)), make(True)
  for step in range(8):
    np.testing.assert_array_equal(batches.rows(step)[0], fixed.rows(step)[0])
    epoch, index = divmod(step, 4)
    np.testing.assert_array_equal(batches.rows(step)[0], np.random.default_rng(
        [0, epoch]).permutation(8)[2 * index:2 * index + 2])
  assert fixed.rows(0)[1] == 16
  assert any(not np.array_equal(batches.rows(s)[0], grouped.rows(s)[0]) for s in range(4))
  # Grouped: the window of 4 batches holds the whole epoch, so each batch is two neighbours
  # in length order.
  order = np.argsort(lengths, kind="stable")
  assert sorted(tuple(sorted(grouped.rows(s)[0])) for s in range(4)) == sorted(
      tuple(sorted(order[i:i + 2])) for i in range(0, 8, 2))
  seen = []
  for step in range(8):  # two epochs
    rows, length = batches.rows(step)
    batch = batches.batch(step, ("input_ids", "input_mask", "label_ids", "label_weights"))
    assert length == min(b for b in (4, 8, 12, 16) if b >= lengths[rows].max())
    assert batch["input_ids"].shape == batch["label_weights"].shape == (2, length)
    np.testing.assert_array_equal(batch["label_ids"], rows)  # per-row arrays stay whole
    # Nothing real is cut: every row's tokens are all inside the batch's length.
    np.testing.assert_array_equal(batch["input_mask"].sum(1), lengths[rows])
    seen.append(rows)
  assert sorted(np.concatenate(seen[:4])) == list(range(8))
  # Two processes each get their half of the same global batch.
  halves = [batches.batch(5, ("label_ids",), p, 2)["label_ids"] for p in (0, 1)]
  np.testing.assert_array_equal(np.concatenate(halves), batches.rows(5)[0])


def test_eval_batches_cover_every_row_within_the_token_budget():
  """Fails if eval batches miss or repeat a row, a batch exceeds a full batch's tokens, holds a row
  longer than its length or a size not a multiple of 8, length-32 batches do not reach 256 rows, or
  fixed padding's batch sizes differ from the listed ones."""
  lengths = _lengths(2000, seed=2)
  plan = buckets.eval_batches(lengths, (32, 64, 96, 128), 64, unit=8)
  rows = np.concatenate([b.rows for b in plan])
  np.testing.assert_array_equal(np.sort(rows), np.arange(2000))
  for b in plan:
    assert b.size % 8 == 0 and len(b.rows) <= b.size
    assert b.size * b.length <= 64 * 128  # never more tokens than a full-length batch
    assert lengths[b.rows].max() <= b.length
  # Short rows go in big batches: length 32 takes 4x the rows of a full batch.
  assert max(b.size for b in plan if b.length == 32) == 256
  # Fixed padding: batches of eval_batch_size (one shape; the last holds 16 rows), and a
  # dev set smaller than a batch takes a batch of its own size rounded up to `unit`.
  fixed = buckets.eval_batches(lengths, (128,), 64, unit=8)
  assert [b.size for b in fixed] == [64] * 32 and len(fixed[-1].rows) == 16
  assert [b.size for b in buckets.eval_batches(lengths[:13], (128,), 64, unit=8)] == [16]


def test_padding_stats():
  """Fails if padding_stats reports other real or padded token counts, or other bucketed and fixed
  pad fractions, than those of two rows of 10 and 30 tokens in 32-token buckets."""
  stats = buckets.padding_stats(np.array([10, 30]), np.array([32, 32]), 128)
  assert stats["real_tokens"] == 40 and stats["padded_tokens"] == 64
  assert stats["pad_fraction"] == pytest.approx(1 - 40 / 64)
  assert stats["fixed_pad_fraction"] == pytest.approx(1 - 40 / 256)


def test_benchmark_sweep_report(capsys):
  """experiments/benchmarks/finetune/finetune_vs_transformers.py --sweep's report on made-up runs:
  the speed-up is reference / ours wall time, padding and real tokens/s come from the
  runs' token counts, and the verdict compares medians with the larger seed spread."""
  import argparse  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import sweep_report as bench  # pylint: disable=g-import-not-at-top
  args = argparse.Namespace(train_examples=2000, dev_examples=800, max_seq_length=128,
                            batch_size=32, epochs=2, learning_rates=[5e-5, 1e-4],
                            seeds=[0, 1, 2], padding="buckets")
  def side(seconds, padded, acc):
    return {"seconds": seconds, "backend_compiles": 7, "compile_seconds": 3.0,
            "step_programs": 5, "shapes": "x",
            "runs": {(lr, s): {"accuracy": acc + 0.01 * s, "f1": 0.5, "real_tokens": 100,
                               "padded_tokens": padded}
                     for lr in args.learning_rates for s in args.seeds}}
  stats = bench.report_sweep(args, {"ours": side(100.0, 200, 0.60),
                                    "reference": side(250.0, 400, 0.62)})
  assert stats["speedup"] == pytest.approx(2.5)
  assert stats["ours"]["pad_fraction"] == pytest.approx(0.5)
  assert stats["reference"]["pad_fraction"] == pytest.approx(0.75)
  assert stats["ours"]["real_tokens_per_s"] == pytest.approx(600 / 100.0)
  assert stats["lr5e-05"]["accuracy"]["within"]
  assert stats["lr5e-05"]["accuracy"]["diff"] == pytest.approx(-0.02)
  assert stats["lr5e-05"]["accuracy"]["ours_lower"] == 3
  # F1 is judged too: equal on every run here, so no difference and no seed lower.
  assert stats["lr0.0001"]["f1"] == {"diff": 0.0, "noise": 0.0, "within": True,
                                    "near_edge": True, "ours_lower": 0,
                                    "paired": {"mean": 0.0, "low": 0.0, "high": 0.0,
                                               "separated": False}}
  assert "reference / ours = 2.50x" in capsys.readouterr().out


def test_benchmark_sweep_report_pairs_the_seeds(capsys):
  """finetune_vs_transformers --sweep's paired verdict: fails if a gap of the same sign on
  every seed, smaller than the seed spread (so "within seed noise" by the spread rule), is
  not reported as a difference by the paired t interval, or if a gap that changes sign is."""
  import argparse  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import sweep_report as bench  # pylint: disable=g-import-not-at-top
  args = argparse.Namespace(train_examples=2000, dev_examples=800, max_seq_length=128,
                            batch_size=32, epochs=2, learning_rates=[5e-5], seeds=[0, 1, 2, 3, 4],
                            padding="buckets")
  # F1 shaped as issue 33's five seeds: ours lower on each, by 0.01-0.04, spread 0.03.
  ours_f1, reference_f1 = [0.592, 0.593, 0.616, 0.626, 0.622], [0.630, 0.614, 0.626, 0.641, 0.647]
  accuracy = [[0.666, 0.681, 0.676, 0.688, 0.653], [0.675, 0.671, 0.673, 0.676, 0.675]]
  def side(f1, acc):
    return {"seconds": 100.0, "backend_compiles": 1, "compile_seconds": 1.0,
            "step_programs": 1, "shapes": "x",
            "runs": {(5e-5, s): {"accuracy": acc[s], "f1": f1[s], "real_tokens": 1,
                                 "padded_tokens": 2} for s in args.seeds}}
  stats = bench.report_sweep(args, {"ours": side(ours_f1, accuracy[0]),
                                    "reference": side(reference_f1, accuracy[1])})
  f1, acc = stats["lr5e-05"]["f1"], stats["lr5e-05"]["accuracy"]
  assert f1["within"] and f1["ours_lower"] == 5  # the spread rule calls it noise
  assert f1["paired"]["separated"] and f1["paired"]["high"] < 0
  assert f1["paired"]["mean"] == pytest.approx(-0.0218)
  assert acc["within"] and not acc["paired"]["separated"]  # lower on 2 of 5: no difference
  assert acc["paired"]["low"] < 0 < acc["paired"]["high"]
  assert "f1 paired by seed: mean ours - reference -0.0218" in capsys.readouterr().out


def test_seed_comparison_report_pairs_the_seeds(capsys):
  """seed_comparison.report (the tagging benchmark's and the single-rate report): fails if a
  same-sign gap inside the seed spread is not called a difference by the paired t interval,
  or if a gap that changes sign is."""
  from experiments.benchmarks.finetune import seed_comparison  # pylint: disable=g-import-not-at-top
  ours = {s: {"accuracy": a, "f1": f, "seconds": 1.0} for s, (a, f) in
          enumerate(zip([0.70, 0.74, 0.72], [0.30, 0.34, 0.32]))}
  reference = {s: {"accuracy": a, "f1": f, "seconds": 1.0} for s, (a, f) in
               enumerate(zip([0.71, 0.75, 0.73], [0.33, 0.31, 0.32]))}
  stats = seed_comparison.report("t", [0, 1, 2], {"ours": ours, "reference": reference},
                                 {"accuracy": "acc", "f1": "F1"})
  accuracy, f1 = stats["diff/accuracy"], stats["diff/f1"]
  assert accuracy["within"] and accuracy["paired"]["separated"]  # -0.01 on every seed
  assert accuracy["paired"]["mean"] == pytest.approx(-0.01)
  assert f1["within"] and not f1["paired"]["separated"]  # -0.03, +0.03, 0: no difference
  out = capsys.readouterr().out
  assert "accuracy paired by seed: mean ours - reference -0.0100" in out
  assert "f1 paired by seed: mean ours - reference +0.0000" in out


def test_benchmark_sweep_pieces_report_as_one_sweep(tmp_path, capsys):
  """finetune_vs_transformers --report_from: a sweep run in pieces (a side, a learning rate
  each) is reported as the whole sweep, wall times summed; would fail if a piece's runs were
  lost or double-counted, or if pieces of different recipes (epochs; our head's init, a
  piece from before --ours_head_init counting as the shipped one) were merged without a
  word."""
  import json  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks.finetune import sweep_report as bench  # pylint: disable=g-import-not-at-top
  def piece(name, side, lr, seconds, acc, **args):
    runs = {f"{lr!r}|{s}": {"accuracy": acc + 0.01 * s, "f1": 0.5, "real_tokens": 100,
                            "padded_tokens": 200} for s in (0, 1, 2)}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"args": {"train_examples": 2000, "dev_examples": 800,
                                         "max_seq_length": 128, "batch_size": 32, "epochs": 2,
                                         "padding": "buckets", **args},
                                "sides": {side: {"seconds": seconds, "backend_compiles": 3,
                                                 "compile_seconds": 1.0, "cache_hits": 0,
                                                 "step_programs": 2 if side == "ours" else None,
                                                 "shapes": "x", "runs": runs}}}))
    return str(path)
  files = [piece("o1", "ours", 5e-5, 100.0, 0.6), piece("o2", "ours", 1e-4, 50.0, 0.6),
           piece("r1", "reference", 5e-5, 200.0, 0.7), piece("r2", "reference", 1e-4, 250.0, 0.6)]
  args, sides = bench.merge_pieces(files)
  assert args.learning_rates == [5e-5, 1e-4] and args.seeds == [0, 1, 2]
  assert sides["ours"]["seconds"] == 150.0 and sides["reference"]["seconds"] == 450.0
  assert len(sides["ours"]["runs"]) == len(sides["reference"]["runs"]) == 6
  stats = bench.report_sweep(args, sides)
  assert stats["speedup"] == pytest.approx(3.0)
  assert not stats["lr5e-05"]["accuracy"]["within"]  # 0.1 apart, spread 0.02
  assert stats["lr0.0001"]["accuracy"]["within"]
  assert "OUTSIDE seed noise" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="--epochs=3, other pieces 2"):
    bench.merge_pieces(files[:1] + [piece("o3", "ours", 1e-4, 50.0, 0.6, epochs=3)])
  # Our side under transformers' head init is another recipe: a piece from before the flag
  # (none given) ran the shipped truncated normal.
  normal = piece("o4", "ours", 1e-4, 50.0, 0.6, ours_head_init="normal")
  with pytest.raises(SystemExit, match="--ours_head_init='normal', other pieces 'truncated_"):
    bench.merge_pieces(files[:1] + [normal])
  args, _ = bench.merge_pieces(
      [normal, piece("o5", "ours", 5e-5, 50.0, 0.6, ours_head_init="normal")])
  assert args.ours_head_init == "normal"
  # A reference piece from before "own" was named wrote "normal" for the same init.
  args, sides = bench.merge_pieces(
      [files[2], piece("r3", "reference", 5e-5, 20.0, 0.7, reference_head_init="normal"),
       piece("r4", "reference", 5e-5, 20.0, 0.7, reference_head_init="own")])
  assert sides["reference"]["seconds"] == 240.0
  with pytest.raises(SystemExit, match="--reference_head_init='truncated_normal', other "
                                       "pieces 'own'"):
    bench.merge_pieces([files[2], piece("r5", "reference", 5e-5, 20.0, 0.7,
                                        reference_head_init="truncated_normal")])
