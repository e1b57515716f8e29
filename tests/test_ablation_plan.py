"""The ablation's plan: FLOP-matched step counts, seeds, the random-init row (no training).

Fails if a FLOP-mode setting's steps overspend the budget or leave more than one
of its steps unspent, if its schedule is not stretched with it, if a non-smoke
variant has fewer than three pretraining seeds, or if random init is not planned.
"""

import json

import pytest

from experiments import ablation
from experiments import ablation_plan
from experiments.configs import ablation as ablation_configs


def test_flop_mode_gives_each_setting_the_steps_that_spend_the_budget(tmp_path):
  config = ablation_configs.get_config("smoke")
  config.budget.mode = "flops"
  config.budget.flops = 3e11
  runs = ablation.plan(config, str(tmp_path))
  matched = ablation.budget_steps(config, str(tmp_path))
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
  ablation.write_plan(config, str(tmp_path), runs)
  written = json.loads((tmp_path / "plan.json").read_text())
  assert written["budget"]["mode"] == "flops"
  assert written["budget"]["settings"]["r15"]["steps"] == steps["r15"]


def test_a_zero_budget_is_the_baselines_steps_and_step_mode_changes_nothing(tmp_path):
  config = ablation_configs.get_config("smoke")
  step_runs = ablation.plan(config, str(tmp_path))
  assert {r.config.total_steps for r in step_runs} == {config.pretrain.total_steps}
  config.budget.mode = "flops"
  matched = ablation.budget_steps(config, str(tmp_path))
  assert matched["r15"]["steps"] == config.pretrain.total_steps
  config.budget.flops = 1.0
  with pytest.raises(ablation.AblationError, match="less than one step"):
    ablation.plan(config, str(tmp_path))


def test_seeds_baseline_and_random_init_are_planned(tmp_path):
  for variant in ablation_configs.VARIANTS:
    config = ablation_configs.get_config(variant)
    if variant != "smoke":
      assert len(config.pretrain_seeds) >= 3, variant
    assert config.random_init and config.report.baseline in config.settings
  config = ablation_configs.get_config("smoke")
  task = next(iter(config.downstream))
  assert ablation.random_init_dirs(config) == {task: f"finetune/random_init/{task}"}
  floor = ablation.finetune_config(config, task, None, str(tmp_path))
  assert floor.init_checkpoint == "" and floor.model_size == config.pretrain.model_size
  assert floor.learning_rates == config.downstream[task].learning_rates  # the same sweep
  config.report.baseline = "r99"
  with pytest.raises(ablation.AblationError, match="config.report.baseline='r99'"):
    ablation.plan(config, str(tmp_path))
