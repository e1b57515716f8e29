"""The ablation's plan: FLOP-matched step counts, seeds, the random-init row (no training).

Fails if a FLOP-mode setting's steps overspend the budget or leave more than one
of its steps unspent, if its schedule is not stretched with it, if a non-smoke
variant has fewer than three pretraining seeds, if random init is not planned (the
Chinese variants), or if the masking papers' grids are not their settings on
pretrain.py:efficient with a v4-32's costs.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from bert_jax import accelerators
from bert_jax.run import workdir as workdir_lib
from experiments.ablation import plan as ablation_plan
from experiments.ablation import stages as ablation
from experiments.configs import ablation as ablation_configs
from experiments.configs import pretrain as pretrain_configs


def test_flop_mode_gives_each_setting_the_steps_that_spend_the_budget(tmp_path):
  """Fails if the two smoke settings get equal steps under a 3e11 FLOP budget, a setting's steps
  overspend it or leave a whole step unspent, its per-step FLOPs are not step_flops_estimate's, its
  warm-up is not stretched with its steps, or plan.json does not record them."""
  config = ablation_configs.get_config("smoke")
  config.budget.mode = "flops"
  config.budget.flops = 3e11
  runs = ablation_plan.grid_runs(config, str(tmp_path))
  matched = ablation_plan.budget_steps(config, str(tmp_path))
  steps = {r.setting: r.config.total_steps for r in runs}
  assert len(set(steps.values())) == 2  # the cosine run's steps cost more: it gets fewer
  for setting, m in matched.items():
    # Within one step's FLOPs of the budget, never over it.
    assert m["steps"] * m["flops_per_step"] <= 3e11 < (m["steps"] + 1) * m["flops_per_step"]
    assert steps[setting] == m["steps"]
    # The per-step figure is the one FLOP function's, for this setting's own run config.
    run = next(r for r in runs if r.setting == setting)
    assert m["flops_per_step"] == ablation_plan.step_flops_estimate(run.config)
  base = ablation_configs.get_config("smoke").pretrain
  for r in runs:  # warm-up stretched with the run
    assert r.config.optimizer.warmup_steps == max(
        1, round(base.optimizer.warmup_steps * r.config.total_steps / base.total_steps))
  ablation_plan.write_plan(config, str(tmp_path), runs, matched)
  written = json.loads((tmp_path / "plan.json").read_text())
  assert written["budget"]["mode"] == "flops"
  assert written["budget"]["settings"]["r15"]["steps"] == steps["r15"]


def test_a_zero_budget_is_the_baselines_steps_and_step_mode_changes_nothing(tmp_path):
  """Fails if step mode gives a run other steps than pretrain.total_steps, the default FLOP budget
  (0: the baseline's FLOPs) gives the baseline r15 other steps, or a budget under one step is
  accepted."""
  config = ablation_configs.get_config("smoke")
  step_runs = ablation_plan.grid_runs(config, str(tmp_path))
  assert {r.config.total_steps for r in step_runs} == {config.pretrain.total_steps}
  config.budget.mode = "flops"
  config.budget.flops = 0.0  # said, not inherited: 0 is what this test is about
  matched = ablation_plan.budget_steps(config, str(tmp_path))
  assert matched["r15"]["steps"] == config.pretrain.total_steps
  config.budget.flops = 1.0
  with pytest.raises(ablation.AblationError, match="less than one step"):
    ablation_plan.grid_runs(config, str(tmp_path))


def test_seeds_baseline_and_random_init_are_planned(tmp_path):
  """Fails if a non-smoke variant has under 3 seeds, random init is planned for a pod variant (or
  not for another), the baseline is no setting or an unknown one is accepted, or the random-init
  fine-tune is not an untrained model of the pretraining size swept over the same learning rates."""
  for variant in ablation_configs.VARIANTS:
    config = ablation_configs.get_config(variant)
    if variant != "smoke":
      assert len(config.pretrain_seeds) >= 3, variant
    # The pod grids' RoBERTa-large is far above the floor (and has no vocab file for it).
    assert config.random_init == (variant not in ablation_configs.POD_VARIANTS), variant
    assert config.report.baseline in config.settings
  config = ablation_configs.get_config("smoke")
  task = next(iter(config.downstream))
  assert ablation_plan.random_init_dirs(config) == {task: f"finetune/random_init/{task}"}
  floor = ablation_plan.finetune_config(config, task, None, str(tmp_path))
  assert floor.init_checkpoint == "" and floor.model_size == config.pretrain.model_size
  assert floor.learning_rates == config.downstream[task].learning_rates  # the same sweep
  config.report.baseline = "r99"
  with pytest.raises(ablation.AblationError, match="config.report.baseline='r99'"):
    ablation_plan.grid_runs(config, str(tmp_path))


def test_zh_proof_is_the_compute_matched_three_seed_plan(tmp_path):
  """The committed result's variant: FLOP mode with r15's 500 steps as the budget, so r40
  and the cosine run train fewer steps (each within one step of the budget), three
  seeds, eval (and checkpoints) every 125 steps, and one downstream task whose
  learning rate is picked on dev and reported on a carved test split."""
  config = ablation_configs.get_config("zh_proof")
  assert config.budget.mode == "flops" and config.budget.flops == 0.0
  assert set(config.settings) == {"r15", "r40", "cos40to15"}
  assert tuple(config.pretrain_seeds) == (0, 1, 2) and config.random_init
  matched = ablation_plan.budget_steps(config, str(tmp_path))
  assert matched["r15"]["steps"] == 500
  assert matched["r40"]["steps"] < matched["cos40to15"]["steps"] < 500
  budget = matched["r15"]["flops"]
  for m in matched.values():
    assert m["flops"] <= budget < m["flops"] + m["flops_per_step"]
  assert config.pretrain.eval_every_steps == config.pretrain.checkpoint.every_steps == 125
  assert config.pretrain.data.eval.num_examples == 1024
  assert list(config.downstream) == ["sentiment_2k"]
  task = config.downstream.sentiment_2k
  assert task.task.test_fraction == 0.1 and task.task.max_train_examples == 2000
  assert tuple(task.learning_rates) == (3e-4, 1e-3) and tuple(task.seeds) == (0, 1, 2)
  assert task.num_epochs == 2


MASK_ONLY = {"mask_prob": 1.0, "random_prob": 0.0, "keep_prob": 0.0}
BERT_MIX = {"mask_prob": 0.8, "random_prob": 0.1, "keep_prob": 0.1}


def _masking(run, *fields):
  return {f: run.config.data.masking[f] for f in fields}


@pytest.mark.parametrize("variant", ablation_configs.PAPER_VARIANTS)
def test_the_masking_papers_grids_are_their_settings_on_the_efficient_recipe(variant, tmp_path):
  """wettig: the ratio axis 15..80% mask-only, 80/10/10 at 15 and 40, corrupt 15 / predict 40
  and corrupt 40 / predict 15; ankner: constant 15, constant 30, linear 30 -> 15. Fails if a
  setting is missing or other, if a run differs from pretrain.py:efficient in more than its
  masks, seeds, evaluation and checkpoint cadence, or if the dry run's target is not a v4-32."""
  config = ablation_configs.get_config(variant)
  runs = ablation_plan.grid_runs(config, str(tmp_path))
  by = {r.setting: r for r in runs if r.seed == 0}
  fields = ("ratio", "mask_prob", "random_prob", "keep_prob", "predict_ratio", "schedule",
            "final_ratio", "whole_word", "span")
  plain = {"predict_ratio": 0.0, "schedule": "constant", "final_ratio": 0.0,
           "whole_word": False, "span": False}
  if variant == "wettig":
    want = {f"r{round(100 * r):02d}": {"ratio": r, **MASK_ONLY, **plain}
            for r in (0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)}
    want["r15_801010"] = {"ratio": 0.15, **BERT_MIX, **plain}
    want["r40_801010"] = {"ratio": 0.4, **BERT_MIX, **plain}
    want["c15_p40"] = {"ratio": 0.15, **MASK_ONLY, **plain, "predict_ratio": 0.4}
    want["c40_p15"] = {"ratio": 0.4, **MASK_ONLY, **plain, "predict_ratio": 0.15}
  else:
    want = {"r15": {"ratio": 0.15, **MASK_ONLY, **plain},
            "r30": {"ratio": 0.3, **MASK_ONLY, **plain},
            "lin30to15": {"ratio": 0.3, **MASK_ONLY, **plain, "schedule": "linear",
                          "final_ratio": 0.15}}
  assert {s: _masking(r, *fields) for s, r in by.items()} == want
  assert len(runs) == 3 * len(want) and config.budget.mode == "steps"
  recipe = workdir_lib.flatten(pretrain_configs.get_config("efficient"))
  for run in runs:
    flat = workdir_lib.flatten(run.config)
    differing = {k for k in recipe if flat[k] != recipe[k]}
    assert set(flat) == set(recipe)
    assert all(k.startswith("data.masking.") or k in (
        "seed", "data.seed", "eval_every_steps", "data.eval.own_masking", "checkpoint.every_steps",
        "checkpoint.keep", "checkpoint.keep_period") for k in differing), differing
    assert run.config.total_steps == 23_000 and run.config.batch_size == 4096
  # --dry_run's costs are a v4-32's: 32 TensorCores, 16 chips (JAX devices).
  generation, number = accelerators.parse("v4-32")
  assert config.report.targets == (
      f"{generation.device_kind}:{round(number * generation.devices_per_unit)}",)
  assert config.report.targets == ("TPU v4:16",)
  assert list(config.downstream) == ["mnli"] and not config.budget.finetune_at_equal_flops


def test_predictions_estimate_follows_predict_ratio(tmp_path):
  """Fails if --dry_run's expected predictions for a corrupt 40% / predict 15% run are the
  corruption's (50 of 125 maskable tokens) rather than the predictions' (19)."""
  runs = {r.setting: r for r in ablation_plan.grid_runs(ablation_configs.get_config("wettig"),
                                              str(tmp_path)) if r.seed == 0}
  assert ablation_plan.expected_predictions(runs["c40_p15"].config) == 19 == \
      ablation_plan.expected_predictions(runs["r15"].config)
  assert ablation_plan.expected_predictions(runs["c15_p40"].config) == 50 == \
      ablation_plan.expected_predictions(runs["r40"].config)


def _smoke_runs(tmp_path):
  """The smoke variant's runs in step mode (20 steps, eval and checkpoints every 10)."""
  config = ablation_configs.get_config("smoke")
  assert config.budget.mode == "steps" and config.budget.finetune_at_equal_flops
  return config, {r.setting: r for r in ablation_plan.grid_runs(config, str(tmp_path))}


def test_step_mode_fine_tunes_the_checkpoint_at_the_smallest_runs_flops(tmp_path):
  """On the smoke plan: r15 is the cheapest run, so its final step (20) is the budget;
  the cosine run (26 slots, ~1.6x r15's step) overspends it at 20 and fits at its
  evaluation point 10, which the config keeps. Fails if the pick overshoots the
  budget, ignores which checkpoints exist, or the kept steps miss an eval point."""
  config, runs = _smoke_runs(tmp_path)
  p = config.pretrain
  assert p.checkpoint.every_steps == p.checkpoint.keep_period == p.eval_every_steps == 10
  per_step = {s: ablation_plan.step_flops_estimate(r.config) for s, r in runs.items()}
  assert 1.0 < per_step["cos40to15"] / per_step["r15"] < 2.0
  cumulative = {s: [f * step for step in range(p.total_steps + 1)] for s, f in per_step.items()}
  kept = {s: [10, 20] for s in runs}  # every eval point (keep_period) and the last
  seeds = {s: 0 for s in runs}
  picked = ablation_plan.match_equal_flops(cumulative, kept, seeds)
  budget = 20 * per_step["r15"]
  assert picked["r15"] == {"step": 20, "flops": budget, "budget": budget}
  assert picked["cos40to15"]["step"] == 10
  assert picked["cos40to15"]["flops"] == 10 * per_step["cos40to15"] <= budget
  # Only the steps a run holds count: without step 10 nothing fits, and it says so.
  with pytest.raises(ValueError, match="keeps no checkpoint within the equal-FLOPs budget"):
    ablation_plan.match_equal_flops(cumulative, {"r15": [20], "cos40to15": [20]}, seeds)
  # The budget is per pretraining seed: a seed-1 baseline that drew 0.1% more predictions
  # still ends at its own final step, not an earlier one.
  more = {"r15_seed1": [1.001 * f for f in cumulative["r15"]]}
  picked = ablation_plan.match_equal_flops(
      {**cumulative, **more}, {**kept, "r15_seed1": [10, 20]}, {**seeds, "r15_seed1": 1})
  assert picked["r15_seed1"]["step"] == 20 and picked["r15"]["step"] == 20
  # The fine-tuning starts from that step's directory in the run's workdir.
  task = next(iter(config.downstream))
  start = ablation_plan.finetune_config(config, task, runs["cos40to15"], str(tmp_path), 10)
  assert start.init_checkpoint == str(tmp_path / "pretrain" / "cos40to15_seed0" /
                                      ablation_plan.checkpoint.CHECKPOINT_DIR / "10")


def test_a_run_a_hair_over_the_budget_is_fine_tuned_from_its_final_checkpoint():
  """Fails if a run 0.3% over its seed's budget falls back to its checkpoint half a run
  earlier (the rule before: the last one at or below the budget), or if one 2% over is
  read at its final checkpoint (over 1% off) instead of its last one below."""
  seeds = {"r15": 0, "r40": 0}
  kept = {"r15": [10, 20], "r40": [10, 20]}
  for over, step in ((1.003, 20), (1.02, 10)):
    cumulative = {"r15": [1e9 * s for s in range(21)], "r40": [over * 1e9 * s for s in range(21)]}
    picked = ablation_plan.match_equal_flops(cumulative, kept, seeds)
    assert picked["r15"]["step"] == 20 and picked["r40"]["step"] == step, over


def test_checkpoints_that_would_miss_an_eval_point_are_refused_before_pretraining(tmp_path):
  """Fails if plan accepts checkpoints kept (keep 2, no keep_period, 30 steps) that miss an eval
  point equal-FLOPs fine-tuning may need, refuses them once that fine-tuning is off, or refuses any
  shipped variant."""
  config = ablation_configs.get_config("smoke")
  config.pretrain.checkpoint.keep_period = 0  # keep=2 of 3 saves (10, 20 and the last)
  config.pretrain.total_steps = 30
  with pytest.raises(ablation.AblationError, match="does not keep a checkpoint at every"):
    ablation_plan.grid_runs(config, str(tmp_path))
  config.budget.finetune_at_equal_flops = False  # the final checkpoint alone is then enough
  assert ablation_plan.grid_runs(config, str(tmp_path))
  for variant in ablation_configs.VARIANTS:  # every shipped variant passes
    assert ablation_plan.grid_runs(ablation_configs.get_config(variant), str(tmp_path))


def test_dry_run_lists_the_plans_flops_without_touching_the_corpus(tmp_path, monkeypatch):
  """--dry_run's FLOPs are the estimated plan's (expected predictions, one FLOP function)
  beside the all-slots upper bound. Fails if it reports other FLOPs than FLOP mode matches, if the
  bound were below the estimate, or if it built a tokenizer or read a corpus (a fresh
  cache stays empty)."""
  cache = tmp_path / "cache"
  monkeypatch.setenv("BERT_JAX_CACHE", str(cache))
  config = ablation_configs.get_config("smoke")
  config.budget.mode = "flops"
  config.budget.flops = 3e11
  workdir = str(tmp_path / "w")
  runs = ablation_plan.grid_runs(config, workdir)
  matched = ablation_plan.budget_steps(config, workdir)
  table = ablation_plan.dry_run(config, runs)
  for run in runs:
    line = next(l for l in table.splitlines() if l.startswith(f"| {run.name} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    m = matched[run.setting]
    assert cells[1] == f"{m['steps']:,}"
    expected = ablation_plan.expected_predictions(run.config)
    assert cells[2].startswith(f"{expected:g} of ")
    assert float(cells[3]) == round(m["flops_per_step"] / 1e9, 1)
    assert float(cells[4]) >= float(cells[3])  # every slot used: never less
  assert not cache.exists() and not (tmp_path / "w").exists()


def test_flop_mode_refuses_a_second_phase(tmp_path):
  """Fails if a two-phase grid were FLOP-matched on the one-length estimate."""
  config = ablation_configs.get_config("smoke")
  config.budget.mode = "flops"
  config.pretrain.phase2.start_fraction = 0.9
  with pytest.raises(ablation.AblationError, match="single-phase"):
    ablation_plan.grid_runs(config, str(tmp_path))


def _executed_flops(run_config) -> float:
  """Model FLOPs of `run_config` as its trainer will execute them on one host: every batch
  of its input stream counted (the trainer's batch_log counts the same weights)."""
  import numpy as np
  from bert_jax.pretrain import cost
  from data_pipeline.examples import pretraining
  source = pretraining.PretrainingInput(run_config.data, batch_size=run_config.batch_size,
                                        schedule_steps=run_config.total_steps)
  try:
    predictions = sum(float(np.sum(next(source)["masked_lm_weights"]))
                      for _ in range(run_config.total_steps))
  finally:
    source.close()
  bert_config, params = cost.abstract_model(
      run_config, ablation_plan.vocab_size(run_config.data, run_config.model))
  return cost.step_flops(bert_config, params,
                         sequences=run_config.batch_size * run_config.total_steps,
                         seq_len=run_config.data.max_seq_length, predictions=predictions)


@pytest.mark.slow
def test_prepare_plans_flop_mode_on_the_predictions_the_streams_make(pretrain_test_config,
                                                                     tmp_path):
  """The prepare stage's FLOP plan, executed, spends the baseline's budget within one step
  of each setting. Fails if the plan kept the full-sequence estimate (the test corpus's
  short sequences make it miss by more than a step), if a setting were measured on other
  steps than it is given, or if later stages planned other steps than the recorded ones."""
  config = ablation_configs.get_config("smoke")
  config.prepare_corpus = ""
  config.pretrain = pretrain_test_config(**{"total_steps": 200,
                                            "data.masking.max_predictions_per_seq": 0})
  config.budget.mode = "flops"
  workdir = str(tmp_path / "w")
  estimated = ablation_plan.grid_runs(config, workdir)
  runs = ablation.prepare(config, workdir, estimated)
  recorded = json.loads((tmp_path / "w" / "plan.json").read_text())["budget"]["settings"]
  assert all(m["measured"] for m in recorded.values())
  seed0 = {r.setting: r for r in runs if r.seed == 0}
  budget = _executed_flops(seed0["r15"].config)  # budget 0: the baseline's run
  for setting, run in seed0.items():
    assert run.config.total_steps == recorded[setting]["steps"]
    spent, per_step = _executed_flops(run.config), recorded[setting]["flops_per_step"]
    assert spent <= budget * (1 + 1e-9) and budget - spent < per_step * (1 + 1e-6), setting
  # The estimate would not have met that: at least one setting misses by over a step.
  misses = []
  for run in (r for r in estimated if r.seed == 0 and r.setting != "r15"):
    spent = _executed_flops(run.config)
    misses.append(abs(budget - spent) / recorded[run.setting]["flops_per_step"])
  assert max(misses) > 1, misses
  # Later stages (a re-run after a kill, --stage=pretrain) plan the recorded steps.
  again = ablation_plan.grid_runs(config, workdir)
  assert [r.config.total_steps for r in again] == [r.config.total_steps for r in runs]
  config.budget.flops = 1e12  # another budget: the record is not this grid's
  assert ablation_plan.recorded(config, str(tmp_path / "w" / "plan.json")) == {}


@pytest.mark.slow
def test_print_commands_in_flop_mode_waits_for_the_measured_plan(tmp_path):
  """Fails if FLOP mode printed per-run commands before the prepare stage measured their
  steps (they would carry the estimate's step counts), or refused with a traceback."""
  repo = pathlib.Path(__file__).resolve().parents[1]
  result = subprocess.run(
      [sys.executable, "-m", "experiments.ablation",
       "--config=experiments/configs/ablation.py:zh_proof", f"--workdir={tmp_path / 'w'}",
       "--print_commands"], cwd=repo, capture_output=True, text=True, timeout=300,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 1, result.stderr[-2000:]
  assert "needs the plan the prepare stage measures" in result.stderr
  assert "Traceback" not in result.stderr and "python -m bert_jax.main" not in result.stdout
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("variant", ["modern", "modern_pod"])
def test_the_modern_grids_are_their_settings_on_packed_documents(variant, tmp_path):
  """Fails if the modern grids lose a setting (constant 15/30/40% per sequence, ModernBERT's
  30% per token, mmBERT's 30 -> 15 -> 5% at its phases' token shares, 30 -> 15 linear), run
  on other than the modern encoder's packed documents with StableAdamW, or are not matched
  on FLOPs."""
  config = ablation_configs.get_config(variant)
  runs = {r.setting: r.config for r in ablation_plan.grid_runs(config, str(tmp_path))
          if r.seed == 0}
  masking = {name: (c.data.masking.ratio, c.data.masking.strategy, c.data.masking.schedule,
                    c.data.masking.final_ratio, c.data.masking.piecewise)
             for name, c in runs.items()}
  assert masking == {
      "r15": (0.15, "fixed", "constant", 0.0, ""), "r30": (0.3, "fixed", "constant", 0.0, ""),
      "r40": (0.4, "fixed", "constant", 0.0, ""),
      "modernbert30": (0.3, "bernoulli", "constant", 0.0, ""),
      "mmbert": (0.3, "fixed", "piecewise", 0.0, "0.767:0.15,0.967:0.05"),
      "lin30to15": (0.3, "fixed", "linear", 0.15, "")}
  for c in runs.values():
    assert c.model.architecture == "modernbert" and c.data.objective == "documents"
    assert c.optimizer.name == "stableadamw" and not c.phases
  assert config.budget.mode == "flops"
  assert runs["r15"].model_size == ("modernbert-tiny" if variant == "modern"
                                    else "modernbert-base")
