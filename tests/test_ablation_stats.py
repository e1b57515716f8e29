"""The ablation's statistics and the words report.md draws from them (synthetic results, no runs).

Fails if the bootstrap is not reproducible, if pairing by seed is lost, if the
wording does not change when an interval comes to exclude zero, if random init is
not named as the floor, or if a learning rate at its grid's edge goes unmentioned.
"""

import pytest

from experiments.ablation import stats as ablation_stats


def _rows(r40_minus_r15, ri=None, *, seeds=(0, 1, 2)):
  """Finished-run rows: r15 and r40 over `seeds`; r40 = r15 + the given per-seed differences."""
  rows = []
  for i, seed in enumerate(seeds):
    base = 0.14 + 0.01 * seed  # the seed's own luck, shared by both settings
    for setting, acc in (("r15", base), ("r40", base + r40_minus_r15[i])):
      rows.append({"run": f"{setting}_seed{seed}", "setting": setting, "seed": seed,
                   "eval_mlm_accuracy": acc,
                   "downstream": {"sentiment": {"values": [0.70 + acc, 0.71 + acc],
                                                "learning_rate": 1e-3,
                                                "learning_rates": [3e-4, 1e-3]}}})
  return rows


def test_bootstrap_is_reproducible_and_covers_the_mean():
  """Fails if bootstrap_interval gives another interval when called again on the same values, its
  bounds do not contain its mean, that mean is not the values' (0.01), or one value is not its own
  interval."""
  values = [0.01, 0.02, -0.005, 0.015]
  a = ablation_stats.bootstrap_interval(values)
  assert a == ablation_stats.bootstrap_interval(values)  # fixed seed
  assert a[1] <= a[0] <= a[2] and a[0] == pytest.approx(0.01)
  assert ablation_stats.bootstrap_interval([0.3]) == (0.3, 0.3, 0.3)


def test_pairing_by_seed_removes_the_seeds_luck():
  """Fails if difference_rows, for r40 = r15 + 0.002 on seeds whose scores differ by 0.01, does not
  give a mean and lower bound of 0.002 (the seeds' spread not paired away) and "r40 beats r15"."""
  # Seeds differ by 0.01 each; r40 is r15 + 0.002 on every seed: paired, that is certain.
  rows = ablation_stats.difference_rows({"r15": {0: 0.14, 1: 0.15, 2: 0.16},
                                         "r40": {0: 0.142, 1: 0.152, 2: 0.162}}, "r15")
  assert rows[0]["mean"] == pytest.approx(0.002) and rows[0]["low"] == pytest.approx(0.002)
  assert rows[0]["verdict"] == "r40 beats r15"


def test_report_wording_changes_when_the_interval_excludes_zero():
  """Fails if comparison_markdown says r40 beats r15 on differences of mixed sign, cannot separate
  them when all are positive, does not call r40 worse when all are negative, or separates on one
  seed."""
  noise = ablation_stats.comparison_markdown(
      _rows([0.004, -0.003, 0.001]), ["sentiment"], "r15", {})
  assert "cannot separate r40 from r15 at this budget" in noise
  assert "r40 beats r15" not in noise
  clear = ablation_stats.comparison_markdown(
      _rows([0.004, 0.005, 0.006]), ["sentiment"], "r15", {})
  assert "r40 beats r15" in clear
  assert "cannot separate r40 from r15" not in clear
  worse = ablation_stats.comparison_markdown(
      _rows([-0.004, -0.005, -0.006]), ["sentiment"], "r15", {})
  assert "r40 is worse than r15" in worse
  # One seed: never separated, however large the difference.
  single = ablation_stats.comparison_markdown(_rows([0.05], seeds=(0,)), [], "r15", {})
  assert "cannot separate r40 from r15 at this budget" in single


def test_random_init_is_the_floor_every_setting_must_beat():
  """Fails if comparison_markdown does not say that no setting beats a random-init floor above them,
  that r15 and r40 beat one below them, or, without one, that the random-init row is not fine-tuned
  yet."""
  high_floor = {"sentiment": {"values": [0.95, 0.96, 0.955], "learning_rate": 1e-3,
                              "learning_rates": [3e-4, 1e-3]}}
  md = ablation_stats.comparison_markdown(_rows([0.004, 0.005, 0.006]), ["sentiment"], "r15",
                                          high_floor)
  assert "**sentiment: no setting beats random init.**" in md
  low_floor = {"sentiment": {"values": [0.80, 0.81, 0.805], "learning_rate": 1e-3,
                             "learning_rates": [3e-4, 1e-3]}}
  md = ablation_stats.comparison_markdown(_rows([0.004, 0.005, 0.006]), ["sentiment"], "r15",
                                          low_floor)
  assert "**sentiment: r15, r40 beat random init.**" in md
  missing = ablation_stats.comparison_markdown(_rows([0.0, 0.0, 0.0]), ["sentiment"], "r15", {})
  assert "random-init row has not been fine-tuned yet" in missing


def test_a_learning_rate_at_the_grid_edge_is_warned_about():
  """Fails if lr_edge_warnings does not give exactly 3 warnings (a pick at the grid's largest or
  smallest rate, a one-rate grid; an interior pick spared), or comparison_markdown omits a run's."""
  warnings = ablation_stats.lr_edge_warnings({"a": (1e-3, [3e-4, 1e-3]),
                                              "b": (1e-4, [1e-4, 3e-4, 1e-3]),
                                              "c": (3e-4, [1e-4, 3e-4, 1e-3]),
                                              "d": (1e-3, [1e-3])})
  assert len(warnings) == 3
  assert "largest of the grid" in warnings[0] and "smallest of the grid" in warnings[1]
  assert "nothing was swept" in warnings[2]
  md = ablation_stats.comparison_markdown(_rows([0.0, 0.0, 0.0]), ["sentiment"], "r15", {})
  assert "r15_seed0 / sentiment: the chosen learning rate 0.001 is the largest" in md


def _report_row(setting, seed, acc, *, finished=True, flops_per_step=1e9, steps=4):
  curve = [(s, s * flops_per_step, acc * s / steps) for s in range(1, steps + 1)]
  return {"run": f"{setting}_seed{seed}", "setting": setting, "seed": seed,
          "finished": finished, "ratio": "0.15", "schedule": "constant", "mix": "80/10/10",
          "unit": "token", "prediction_slots": "5", "steps": steps, "total_steps": steps,
          "tokens": 100, "predictions": 10, "model_flops": steps * flops_per_step,
          "wall_time_s": 1.0, "achieved_tflops": "", "mfu": "", "eval_mlm_loss": 1.0,
          "eval_mlm_accuracy": acc, "eval_own_mlm_accuracy": acc, "mean_ratio": 0.15,
          "curve": curve, "downstream": {}}


def test_report_names_unfinished_runs_and_compares_at_equal_steps_and_flops():
  """Fails if report_markdown does not list an unfinished run, or one given up on, as left out (an
  unlaunched one as not started), lets r60 into a comparison or table, or loses r40 beating r15 or
  the equal-FLOPs reading at r15's 4e9 total (r40 at its step 2)."""
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  rows = [_report_row("r15", s, 0.14 + 0.001 * s) for s in (0, 1, 2)]
  rows += [_report_row("r40", s, 0.15 + 0.001 * s, flops_per_step=2e9) for s in (0, 1, 2)]
  # Unfinished, and far better: it must not enter the comparison.
  rows.append(_report_row("r60", 0, 0.9, finished=False))
  plan = {"variant": "synthetic", "settings": {"r15": {}, "r40": {}, "r60": {}},
          "pretrain_seeds": [0, 1, 2], "tasks": {}, "baseline": "r15",
          "runs": [{"name": r["run"]} for r in rows]}
  md = ablation_report.report_markdown(plan, rows, [], [])
  assert "Unfinished (left out of every comparison below): r60_seed0." in md
  # A launched run given up on before it wrote anything is unfinished, not "not started".
  given_up = dict(plan, runs=plan["runs"] + [{"name": "r60_seed1"}])
  md_given_up = ablation_report.report_markdown(given_up, rows, [], [], given_up=("r60_seed1",))
  assert "Unfinished (left out of every comparison below): r60_seed0, r60_seed1." in md_given_up
  assert "Not started yet" not in md_given_up
  assert "Not started yet: r60_seed1." in ablation_report.report_markdown(given_up, rows, [], [])
  assert "r60 beats" not in md and "| r60 |" not in md.split("## Runs")[1].split("## At")[1]
  assert "r40 beats r15" in md
  # Equal FLOPs is the smallest finished run's total (r15: 4e9): r40 is read at step 2.
  assert "equal model FLOPs (4e-06 PFLOP" in md
  assert "| r40 | 0 | 4 | 0.1500 | 2 | 4e-06 | 0.0750 |" in md


def _equal_flops_row(md, setting):
  line = next(l for l in md.split("## At equal steps")[1].splitlines()
              if l.startswith(f"| {setting} | 0 |"))
  return [c.strip() for c in line.strip("|").split("|")]


def test_a_run_a_hair_over_the_budget_is_read_at_its_evaluation_not_one_interval_earlier():
  """r40 ends 0.25% above r15's 4e9 FLOPs. Fails if it is read at its step 3 (25% short, the
  rule before: the last evaluation at or below the budget) instead of its final step 4."""
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  rows = [_report_row("r15", 0, 0.14), _report_row("r40", 0, 0.15, flops_per_step=1.0025e9)]
  md = "\n".join(ablation_report.matched_tables(rows))
  cells = _equal_flops_row(md, "r40")
  assert cells[4:] == ["4", "4.01e-06", "0.1500"]
  assert abs(float(cells[5]) - 4e-6) <= 0.01 * 4e-6
  assert "interpolated" not in md


def test_equal_flops_between_evaluations_is_interpolated_and_labelled():
  """r40 spends 1.5x r15's FLOPs a step: its evaluations sit at 3e9 and 4.5e9 around the 4e9
  budget, both over 1% off. Fails if the row is not at the budget, its accuracy is not linear
  in FLOPs between steps 2 and 3 (0.075 -> 0.1125: 0.1 at 4e9), it is not labelled, or a
  budget before a run's first evaluation is read as anything but '-'."""
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  rows = [_report_row("r15", 0, 0.14), _report_row("r40", 0, 0.15, flops_per_step=1.5e9)]
  md = "\n".join(ablation_report.matched_tables(rows))
  assert _equal_flops_row(md, "r40")[4:] == ["interpolated 2-3", "4e-06", "0.1000"]
  assert _equal_flops_row(md, "r15")[4:] == ["4", "4e-06", "0.1400"]
  assert '"interpolated a-b", not a measurement' in md
  early = ablation_report.read_at_flops(rows[1]["curve"], 1e9)  # before its step 1 (1.5e9)
  assert early == {"step": "-", "flops": 0.0, "accuracy": "-", "interpolated": False}


def test_downstream_figures_are_test_at_the_dev_picked_learning_rate(tmp_path):
  """A summary.json whose dev and test disagree: the report's values are test's (fails if
  the report reads dev, the main metric the rate was picked on), its lr the dev pick, and
  report.md says so; a summary without test keeps dev and the caveat."""
  import json  # pylint: disable=g-import-not-at-top
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  summary = {"main_metric": "dev/accuracy", "reported_metric": "test/accuracy",
             "learning_rate": 0.001,
             "per_seed": {"0": {"dev/accuracy": 0.9, "test/accuracy": 0.61},
                          "1": {"dev/accuracy": 0.8, "test/accuracy": 0.63}}}
  (tmp_path / "ri").mkdir()
  (tmp_path / "ri" / "summary.json").write_text(json.dumps(summary))
  plan = {"random_init": {"sentiment": "ri"},
          "tasks": {"sentiment": {"learning_rates": [3e-4, 1e-3]}}}
  floor = ablation_report.random_init_downstream(str(tmp_path), plan)["sentiment"]
  assert floor["values"] == [0.61, 0.63] and floor["metric"] == "test/accuracy"
  assert floor["learning_rate"] == 0.001
  rows = [{"downstream": {"sentiment": floor}}]
  assert "learning rate picked on dev, reported on test" in ablation_report.downstream_note(
      rows, ["sentiment"]).lower()
  del summary["reported_metric"]  # a summary from before test splits: dev, with the caveat
  (tmp_path / "ri" / "summary.json").write_text(json.dumps(summary))
  floor = ablation_report.random_init_downstream(str(tmp_path), plan)["sentiment"]
  assert floor["values"] == [0.9, 0.8]
  note = ablation_report.downstream_note([{"downstream": {"sentiment": floor}}], ["sentiment"])
  assert "reported on test" not in note and "optimistic" in note


def test_report_has_downstream_at_equal_flops_in_step_mode():
  """Rows carrying the equal-FLOPs sweep (step mode): a table with each run's step,
  FLOPs and downstream there; none without (fails if the section is missing, or
  reads the final checkpoint's figures)."""
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  rows = [_report_row("r15", 0, 0.14), _report_row("r40", 0, 0.15, flops_per_step=2e9)]
  for r, step, flops, values, final in ((rows[0], 4, 4e9, [0.70, 0.72], [0.70, 0.72]),
                                         (rows[1], 2, 4e9, [0.60, 0.62], [0.90, 0.91])):
    d = {"metric": "test/accuracy", "learning_rate": 1e-3, "learning_rates": [1e-3]}
    r["downstream"] = {"toy": {**d, "values": final}}
    r["equal_flops"] = {"step": step, "flops": flops, "budget": 4e9,
                        "downstream": {"toy": {**d, "values": values}}}
  lines = "\n".join(ablation_report.equal_flops_downstream(rows, ["toy"]))
  assert "## Downstream at equal model FLOPs (4e-06 PFLOP" in lines
  assert "| r40 | 0 | 2 | 4e-06 | 0.6100 (0.6000-0.6200) |" in lines
  assert "| r15 | 0 | 4 | 4e-06 | 0.7100 (0.7000-0.7200) |" in lines
  for r in rows:
    del r["equal_flops"]
  assert ablation_report.equal_flops_downstream(rows, ["toy"]) == []


def test_report_states_what_the_data_support_at_equal_flops_too():
  """Step mode: at equal steps r40 beats r15 downstream on every seed, but at equal FLOPs
  (its earlier checkpoint) it is worse on every seed; the report must say both, each
  under its own heading (fails if the equal-FLOPs section reads the final figures)."""
  from experiments.ablation import report as ablation_report  # pylint: disable=g-import-not-at-top
  rows = []
  for seed in (0, 1, 2):
    for setting, final, matched, step in (("r15", 0.70, 0.70, 4), ("r40", 0.90, 0.60, 2)):
      r = _report_row(setting, seed, 0.14 + 0.01 * seed + (0.01 if setting == "r40" else 0),
                      flops_per_step=2e9 if setting == "r40" else 1e9)
      d = {"metric": "test/accuracy", "learning_rate": 1e-3, "learning_rates": [3e-4, 1e-3, 3e-3]}
      r["downstream"] = {"toy": {**d, "values": [final + 0.01 * seed]}}
      r["equal_flops"] = {"step": step, "flops": 4e9, "budget": 4e9,
                          "downstream": {"toy": {**d, "values": [matched + 0.01 * seed]}}}
      rows.append(r)
  plan = {"variant": "synthetic", "settings": {"r15": {}, "r40": {}},
          "pretrain_seeds": [0, 1, 2], "tasks": {"toy": {"name": "toy", "learning_rates": [1e-3],
                                                          "seeds": [0]}},
          "baseline": "r15", "runs": [{"name": r["run"]} for r in rows]}
  md = ablation_report.report_markdown(plan, rows, ["toy"], [])
  steps_part, flops_part = md.split("## What the data can support at equal model FLOPs")
  assert "toy (downstream): r40 beats r15" in steps_part
  assert "toy (downstream): r40 is worse than r15" in flops_part
  # Held-out MLM: r40 ends higher, but at equal FLOPs it is read at its step 2 (half its
  # final accuracy on these synthetic curves).
  assert "held-out MLM accuracy at 15%: r40 beats r15" in steps_part
  assert "held-out MLM accuracy at 15%: r40 is worse than r15" in flops_part
