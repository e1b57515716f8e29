"""The phases of a pretraining run: where phase 2 starts and what data config holds when.

The paper trains 90% of its steps at length 128 and the rest at 512; a config says
so with config.phase2. The trainer (bert_jax.pretrain.trainer), the cost estimate
(bert_jax.pretrain.cost) and the ablation report read the phases from here, so there is
one copy of the rule and no import circle between the trainer and the estimate
it logs.
"""

import copy
from typing import Any

import ml_collections


def phase2_start(config: ml_collections.ConfigDict) -> int:
  """First step of phase 2 (total_steps when there is none)."""
  if config.phase2.start_fraction >= 1.0:
    return config.total_steps
  return int(config.phase2.start_fraction * config.total_steps)


def phase_data_config(config: ml_collections.ConfigDict, step: int) -> tuple[int, Any]:
  """(phase, data config) in force at `step`: phase 2 swaps in the long sequences.

  Phase 2's max_predictions_per_seq 0 derives it from the masking ratio at
  phase 2's length, as phase 1's 0 does, so a ratio ablation changes nothing else.
  """
  if step < phase2_start(config):
    return 1, config.data
  data = copy.deepcopy(config.data)
  data.max_seq_length = config.phase2.max_seq_length
  data.masking.max_predictions_per_seq = config.phase2.max_predictions_per_seq
  return 2, data


def phase2(config: ml_collections.ConfigDict) -> tuple[int, Any] | None:
  """(first step, data config) of phase 2, or None for a run without one."""
  start = phase2_start(config)
  return (start, phase_data_config(config, start)[1]) if start < config.total_steps else None


def phases(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """[{"phase", "steps", "seq_len", "predictions"}] of a pretraining config."""
  from data_pipeline import specs  # pylint: disable=g-import-not-at-top  # TF: only here
  start2 = phase2_start(config)
  out = []
  for phase, first, last in ((1, 0, start2), (2, start2, config.total_steps)):
    if last > first:
      data = phase_data_config(config, first)[1]
      out.append({"phase": phase, "steps": last - first, "seq_len": data.max_seq_length,
                  "predictions": specs.max_predictions(data)})
  return out
