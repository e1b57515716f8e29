"""A downstream stage that names an evaluation suite: its members as downstream tasks, and their average.

`config.downstream_suite.name` (a suite of experiments/configs/suites.py, e.g. "glue", with
`members` a subset of it) puts each member's complete fine-tuning config into
`config.downstream` under the member's name, built exactly as `python -m
experiments.evaluate` builds it (experiments/evaluate/plan.finetune_config: the task's
config, the paper's protocol, the member's own fields, then downstream_suite's
overrides), with no init_checkpoint: the ablation fills in each run's. The report then
has a column per member, as for any downstream task, and one more, SUITE_AVERAGE: per
pretraining run and fine-tuning seed, the mean over members of their reported metrics
(SQuAD's percentages divided by 100, so every member weighs the same), compared between
settings with the same paired intervals as the members.

`expand` is called once, where the command's flags have made the config whole
(experiments/ablation/__main__.py), so every stage, --print_commands and --dry_run
see the members as ordinary downstream tasks.
"""

import statistics
from typing import Any

import ml_collections

from experiments.ablation.proof import AblationError
from experiments.configs import suites
from experiments.evaluate import collect as evaluate_collect
from experiments.evaluate import plan as evaluate_plan

SUITE_AVERAGE = "suite_average"  # the report's column of the members' mean


def expand(config: ml_collections.ConfigDict | None) -> ml_collections.ConfigDict | None:
  """`config` with downstream_suite's members added to config.downstream (a copy; unchanged
  when no suite is named). Refuses an unknown suite or member, or a name clash, in one line."""
  if config is None or not config.get("downstream_suite") or not config.downstream_suite.name:
    return config
  spec = config.downstream_suite
  try:
    suite = suites.get_config(spec.name)
  except ValueError as e:
    raise AblationError(f"config.downstream_suite.name: {e}") from None
  members = list(spec.members) or list(suite.members)
  unknown = sorted(set(members) - set(suite.members))
  if unknown:
    raise AblationError(f"config.downstream_suite.members names {unknown}, not members of "
                        f"suite {spec.name!r} ({', '.join(suite.members)})")
  clash = sorted((set(members) | {SUITE_AVERAGE}) & set(config.downstream))
  if clash:
    raise AblationError(f"config.downstream already has {clash}: a suite's members are "
                        "downstream tasks of their own names; drop them from one of the two")
  flags = evaluate_plan.Flags(
      glue_dir=spec.glue_dir, squad_dir=spec.squad_dir,
      seeds=tuple(spec.seeds) or None, learning_rates=tuple(spec.learning_rates) or None,
      epochs=spec.epochs or None, max_train_examples=spec.max_train_examples or None,
      max_dev_examples=spec.max_dev_examples or None)
  config = ml_collections.ConfigDict(config.to_dict())  # the caller's config stays as it was
  with config.unlocked():
    for name in members:
      member = evaluate_plan.finetune_config(name, suite.members[name], suite.protocol, flags)
      with member.unlocked():
        member.task.predict_test = False  # no leaderboard files from an ablation's runs
      config.downstream[name] = member
  return config


def plan_entry(config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """What plan.json keeps of the suite (the report reads it from DIR alone), or None."""
  if not config.get("downstream_suite") or not config.downstream_suite.name:
    return None
  spec = config.downstream_suite
  suite = suites.get_config(spec.name)
  members = list(spec.members) or list(suite.members)
  return {"name": spec.name, "members": members,
          "percent": [m for m in members
                      if config.downstream[m].task.kind in evaluate_collect.PERCENT_KINDS]}


def average(downstream: dict[str, dict[str, Any]], entry: dict[str, Any]
            ) -> dict[str, Any] | None:
  """The members' mean per fine-tuning seed, as one more downstream task of a run (or of the
  random-init row); None until every member has its figures for the same seeds."""
  members = entry["members"]
  if not all(m in downstream for m in members):
    return None
  counts = {len(downstream[m]["values"]) for m in members}
  if len(counts) != 1:
    return None
  scaled = [[v / 100.0 if m in entry["percent"] else v for v in downstream[m]["values"]]
            for m in members]
  return {"metric": f"mean of {', '.join(members)}",
          "values": [statistics.fmean(column) for column in zip(*scaled)],
          # Each member chose its own rate: nothing to warn about at the average.
          "learning_rate": None, "learning_rates": []}
