"""An ablation whose downstream stage names an evaluation suite (experiments/ablation/suite.py)."""

import pytest

from experiments.ablation import report as ablation_report
from experiments.ablation import plan as ablation_plan
from experiments.ablation import stats as ablation_stats
from experiments.ablation import suite as ablation_suite
from experiments.ablation.proof import AblationError
from experiments.configs import ablation as ablation_configs
from test_evaluate_suite import write_glue  # the tiny GLUE-format tasks


@pytest.fixture
def suite_config(tmp_path):
  config = ablation_configs.get_config("smoke")
  config.downstream_suite.update(name="glue", members=("cola", "stsb"),
                                 glue_dir=str(write_glue(tmp_path / "glue")), seeds=(0, 1),
                                 learning_rates=(1e-4, 3e-5), epochs=1)
  return config


def test_a_suite_becomes_its_members_configured_as_experiments_evaluate_does(suite_config,
                                                                            tmp_path):
  """Fails if a member is not a downstream task with the suite's protocol and the overrides
  (seeds, rates, epochs, its GLUE directory) and no init_checkpoint, if the caller's config is
  changed, if the grid's runs do not fine-tune each member, or if plan.json would not say
  which members the average takes (SQuAD's percentages marked)."""
  expanded = ablation_suite.expand(suite_config)
  assert set(expanded.downstream) == {"sentiment", "cola", "stsb"}
  assert set(suite_config.downstream) == {"sentiment"}  # the caller's config as it was
  cola = expanded.downstream.cola
  assert (cola.task.name, cola.seeds, cola.learning_rates, cola.num_epochs, cola.batch_size) == (
      "cola", (0, 1), (1e-4, 3e-5), 1, 32)
  assert cola.init_checkpoint == "" and cola.task.data_dir.endswith("/CoLA")
  assert not cola.task.predict_test
  runs = ablation_plan.grid_runs(expanded, str(tmp_path / "ablation"))
  assert all({"cola", "stsb"} <= set(r.finetune_dirs) for r in runs)
  assert ablation_suite.plan_entry(expanded) == {"name": "glue", "members": ["cola", "stsb"],
                                                 "percent": []}
  assert set(ablation_suite.expand(ablation_configs.get_config("smoke")).downstream) == {
      "sentiment"}  # no suite named: nothing added


@pytest.mark.parametrize("field,value,message", [
    ("name", "nope", "unknown suite 'nope'"),
    ("members", ("cola", "wnli2"), r"names \['wnli2'\], not members of suite 'glue'"),
])
def test_a_wrong_suite_or_member_is_one_refusal(suite_config, field, value, message):
  """Fails if an unknown suite or member is accepted or refused as anything but AblationError."""
  suite_config.downstream_suite[field] = value
  with pytest.raises(AblationError, match=message):
    ablation_suite.expand(suite_config)


def test_a_member_named_like_a_downstream_task_is_refused(suite_config):
  """Fails if a member would silently replace a downstream task of the same name."""
  suite_config.downstream.cola = suite_config.downstream.sentiment
  with pytest.raises(AblationError, match=r"already has \['cola'\]"):
    ablation_suite.expand(suite_config)


def test_the_average_is_per_seed_over_members_and_compared_like_a_task():
  """Fails if the suite's average is not the per-seed mean of the members (SQuAD's percentages
  scaled to fractions), exists before every member has figures for the same seeds, or is not
  compared between settings with the paired intervals (nor kept out of the rate warnings)."""
  entry = {"members": ["cola", "squad_v1"], "percent": ["squad_v1"]}
  avg = ablation_suite.average({"cola": {"values": [0.5, 0.7]},
                                "squad_v1": {"values": [80.0, 90.0]}}, entry)
  assert avg["values"] == pytest.approx([0.65, 0.8]) and avg["learning_rate"] is None
  assert ablation_suite.average({"cola": {"values": [0.5, 0.7]}}, entry) is None
  assert ablation_suite.average({"cola": {"values": [0.5]},
                                 "squad_v1": {"values": [80.0, 90.0]}}, entry) is None
  rows = []
  for setting, shift in (("r15", 0.0), ("r40", 0.05)):
    for seed in (0, 1, 2):
      member = {"metric": "dev/accuracy", "values": [0.6 + shift + 0.01 * seed] * 2,
                "learning_rate": 1e-4, "learning_rates": [1e-4, 3e-5]}
      downstream = {"cola": member, "squad_v1": dict(member, values=[70.0 + 100 * shift] * 2)}
      downstream["suite_average"] = ablation_suite.average(downstream, entry)
      rows.append({"run": f"{setting}_seed{seed}", "setting": setting, "seed": seed,
                   "eval_mlm_accuracy": 0.1, "downstream": downstream})
  md = ablation_stats.comparison_markdown(rows, ["cola", "squad_v1", "suite_average"], "r15", {})
  assert "### suite_average (downstream)" in md
  assert "| r40 | 3 | +0.0500 [" in md.split("### suite_average (downstream)")[1]
  assert "suite_average: the chosen learning rate" not in md
  csv = ablation_report.results_csv([dict(r, **{"suite_average_median": 0.6}) for r in rows],
                                    ["suite_average"])
  assert "suite_average_median" in csv.splitlines()[0]
