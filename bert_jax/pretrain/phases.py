"""The phases of a pretraining run, decided once: which steps read which data config.

The paper trains 90% of its steps at length 128 and the rest at 512; a config says
so with config.phase2. `of(config)` turns that into the run's phases, each with
its steps and its data config (copied once), and `at(phases, step)` is the one
rule for which phase a step is in: the trainer, its data (data_pipeline.prepare
takes the phases it is given), the cost estimate (bert_jax.pretrain.cost), the
preflight and the ablation's report all read them from here.
"""

import copy
from typing import Any, Sequence

import ml_collections

from data_pipeline import specs


# One phase: steps [start, end) and the data config they read (defined with the data
# configs, data_pipeline.specs, which the data preparation reads too and which may not
# import this package).
Phase = specs.Phase


def phase2_start(config: ml_collections.ConfigDict) -> int:
  """First step of phase 2 (total_steps when there is none)."""
  if config.phase2.start_fraction >= 1.0:
    return config.total_steps
  return int(config.phase2.start_fraction * config.total_steps)


def _phase2_data(config: ml_collections.ConfigDict) -> Any:
  """Phase 2's data config: config.data with the long sequences.

  Phase 2's max_predictions_per_seq 0 derives it from the masking ratio at
  phase 2's length, as phase 1's 0 does, so a ratio ablation changes nothing else.
  """
  data = copy.deepcopy(config.data)
  data.max_seq_length = config.phase2.max_seq_length
  data.masking.max_predictions_per_seq = config.phase2.max_predictions_per_seq
  return data


def of(config: ml_collections.ConfigDict) -> tuple[Phase, ...]:
  """The run's phases that have steps, in order (one, or two with config.phase2)."""
  start2 = phase2_start(config)
  candidates = ((1, 0, start2, config.data),
                (2, start2, config.total_steps, _phase2_data(config) if start2 < config.total_steps
                 else None))
  return tuple(Phase(index, first, last, data) for index, first, last, data in candidates
               if last > first)


def at(phases: Sequence[Phase], step: int) -> Phase:
  """The phase whose data step `step` reads (the last phase from its start on)."""
  current = phases[0]
  for phase in phases[1:]:
    if step >= phase.start:
      current = phase
  return current


def shapes(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """[{"phase", "steps", "seq_len", "predictions"}] of a pretraining config's phases."""
  return [{"phase": p.index, "steps": p.steps, "seq_len": p.data.max_seq_length,
           "predictions": specs.max_predictions(p.data)} for p in of(config)]
