"""The phases of a pretraining run, decided once: which steps read which data, at which
batch size, with which network settings and learning-rate segment.

A run is a list of phases (config.phases; experiments/configs/pretrain.py's `phase()`
makes an entry). Each entry starts at int(start_fraction x total_steps) and sets any of:
sequence length (and prediction slots), masking ratio, global batch size, the modern
encoder's RoPE thetas, and (optimizer.schedule "phases") the learning rate it holds or
decays. A field at 0 ("" for decay) keeps the previous phase's value. The paper's 90% at
128 tokens then 10% at 512 is the empty list with config.phase2, its shorthand: the same
two phases, the same batches and checkpoints, as before the list existed.

Batch-size warmup (config.batch_warmup, ModernBERT's): the first phase's first tokens are
trained at min_batch_size, 2 x min_batch_size, ... up to (not including) the phase's batch
size, each size for the same number of steps (so each takes tokens in proportion to its
size, as ModernBERT's thresholds do), `tokens` in all. Each size is a phase of its own,
so its step compiles once for its shape (a recompile per size, not gradient accumulation:
every size runs at the full-speed shape, and a compile is paid a few times per run, not
at every step); consecutive phases reading the same data continue one stream, so no batch
is read twice.

`of(config)` returns the run's phases (numbered 1.. in order, batch-warmup stages
included) and `at(phases, step)` is the one rule for which phase a step is in: the
trainer, its data, the cost estimate (bert_jax.pretrain.cost), the preflight and the
ablation's report all read them from here. `check(config)` refuses a list that cannot
mean what it says, in one line naming the entry.
"""

import copy
from typing import Any, Sequence

import ml_collections

from data_pipeline import specs


# One phase: steps [start, end) and the data config they read (defined with the data
# configs, data_pipeline.specs, which the data preparation reads too and which may not
# import this package).
Phase = specs.Phase

# BertConfig fields a phase may change (the parameters stay the same arrays).
NETWORK_FIELDS = ("rope_theta", "local_rope_theta")
DECAYS = ("", "linear", "1-sqrt", "cosine")


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


def _paper(config: ml_collections.ConfigDict) -> tuple[Phase, ...]:
  """config.phase2's one or two phases (config.phases empty)."""
  start2 = phase2_start(config)
  candidates = ((1, 0, start2, config.data),
                (2, start2, config.total_steps, _phase2_data(config) if start2 < config.total_steps
                 else None))
  return tuple(Phase(index, first, last, data, batch_size=config.batch_size)
               for index, first, last, data in candidates if last > first)


def entries(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """config.phases as dicts, each with its start step and every field resolved (a 0 or ""
  replaced by the previous entry's value; the first entry's by the run's)."""
  previous = {"max_seq_length": config.data.max_seq_length, "masking_ratio": 0.0,
              "batch_size": config.batch_size, "learning_rate": config.optimizer.learning_rate,
              "rope_theta": config.model.rope_theta,
              "local_rope_theta": config.model.local_rope_theta}
  out = []
  for i, entry in enumerate(config.phases):
    entry = dict(entry)
    resolved = {k: entry.get(k) or v for k, v in previous.items()}
    resolved.update(index=i, start=int(entry["start_fraction"] * config.total_steps),
                    start_fraction=entry["start_fraction"],
                    max_predictions_per_seq=entry.get("max_predictions_per_seq", 0),
                    decay=entry.get("decay", ""), raw=entry)
    out.append(resolved)
    previous = {k: resolved[k] for k in previous}
  return out


def check(config: ml_collections.ConfigDict) -> None:
  """Refuses a phase list that cannot mean what it says (ValueError naming the entry):
  a first start other than 0, starts not increasing, lengths going down, a RoPE theta on
  an encoder without RoPE, a learning-rate segment without schedule "phases", a batch
  warmup longer than its phase; and phase2 and phases both set."""
  if not config.phases:
    if not 0.0 < config.phase2.start_fraction <= 1.0:
      raise ValueError(f"config.phase2.start_fraction={config.phase2.start_fraction} "
                       "not in (0, 1]")
    _check_warmup(config, _paper(config)[0])
    return
  if config.phase2.start_fraction < 1.0:
    raise ValueError("config.phases and config.phase2 both set: phase2 is the paper's "
                     "shorthand for a two-entry list; set config.phase2.start_fraction=1.0")
  rows = entries(config)
  for row in rows:
    name = f"config.phases[{row['index']}]"
    unknown = set(row["raw"]) - set(PHASE_FIELDS)
    if unknown:
      raise ValueError(f"{name}: unknown field(s) {sorted(unknown)}; a phase sets "
                       f"{', '.join(PHASE_FIELDS)}")
    if row["index"] == 0 and row["start_fraction"] != 0.0:
      raise ValueError(f"{name}.start_fraction={row['start_fraction']}: the first phase "
                       "starts the run (0.0)")
    if row["decay"] not in DECAYS:
      raise ValueError(f"{name}.decay={row['decay']!r}: expected one of {DECAYS}")
    uses_schedule = row["raw"].get("learning_rate") or row["decay"]
    if uses_schedule and config.optimizer.schedule != "phases":
      raise ValueError(f"{name} sets a learning-rate segment, which only "
                       "config.optimizer.schedule='phases' reads (it is "
                       f"{config.optimizer.schedule!r})")
    if (any(row["raw"].get(f) for f in NETWORK_FIELDS)
        and config.model.architecture != "modernbert"):
      raise ValueError(f"{name} sets a RoPE theta, but config.model.architecture="
                       f"{config.model.architecture!r} has no rotary positions")
    if row["index"]:
      before = rows[row["index"] - 1]
      if not before["start"] < row["start"] < config.total_steps:
        raise ValueError(
            f"{name}.start_fraction={row['start_fraction']}: phases must start in increasing "
            f"order inside the run (step {row['start']} after phase {row['index'] - 1}'s "
            f"{before['start']}, before total_steps={config.total_steps})")
      if row["max_seq_length"] < before["max_seq_length"]:
        raise ValueError(f"{name}.max_seq_length={row['max_seq_length']} is shorter than the "
                         f"previous phase's {before['max_seq_length']}: lengths only grow "
                         "(context extension)")
  _check_warmup(config, of_list(config)[0] if rows else None)


def _check_warmup(config: ml_collections.ConfigDict, first: Phase | None) -> None:
  """Refuses a batch warmup that cannot fit the first phase (its sizes, its length)."""
  warmup = config.batch_warmup
  if not warmup.tokens:
    return
  if warmup.tokens < 0 or warmup.min_batch_size < 1:
    raise ValueError(f"config.batch_warmup.tokens={warmup.tokens} and min_batch_size="
                     f"{warmup.min_batch_size} must be positive")
  full = first.batch_size
  if full % warmup.min_batch_size or full <= warmup.min_batch_size:
    raise ValueError(f"config.batch_warmup.min_batch_size={warmup.min_batch_size} must divide "
                     f"the first phase's batch size {full} and be smaller")
  steps = warmup_steps_per_size(config, first) * (full // warmup.min_batch_size - 1)
  if steps >= first.steps:
    raise ValueError(
        f"config.batch_warmup.tokens={warmup.tokens:.3g} takes {steps} steps, the first phase "
        f"has {first.steps}: the batch warmup is longer than its phase (fewer tokens, or a "
        "longer run)")


def warmup_steps_per_size(config: ml_collections.ConfigDict, first: Phase) -> int:
  """Steps at each warmup size: tokens / (length x the sizes' sum), at least 1."""
  warmup = config.batch_warmup
  sizes = range(warmup.min_batch_size, first.batch_size, warmup.min_batch_size)
  return max(1, round(warmup.tokens / (first.data.max_seq_length * sum(sizes))))


def of_list(config: ml_collections.ConfigDict) -> tuple[Phase, ...]:
  """config.phases as phases (no batch warmup): one per entry that has steps."""
  rows = entries(config)
  out = []
  for row, end in zip(rows, [r["start"] for r in rows[1:]] + [config.total_steps]):
    data = copy.deepcopy(config.data)
    data.max_seq_length = row["max_seq_length"]
    # 0: the first phase keeps config.data's; a later one derives it at its length (as
    # phase2.max_predictions_per_seq does).
    if row["max_predictions_per_seq"] or row["index"]:
      data.masking.max_predictions_per_seq = row["max_predictions_per_seq"]
    if row["raw"].get("masking_ratio"):  # a constant ratio of its own
      data.masking.ratio = row["masking_ratio"]
      data.masking.schedule, data.masking.final_ratio = "constant", 0.0
    network = {f: row[f] for f in NETWORK_FIELDS if config.model.architecture == "modernbert"}
    out.append(Phase(row["index"] + 1, row["start"], end, data, batch_size=row["batch_size"],
                     network=network))
  return tuple(p for p in out if p.steps > 0)


def of(config: ml_collections.ConfigDict) -> tuple[Phase, ...]:
  """The run's phases that have steps, in order, numbered from 1, batch-warmup sizes
  included (module docstring)."""
  run = of_list(config) if config.phases else _paper(config)
  if not config.batch_warmup.tokens:
    return run
  first, per_size = run[0], warmup_steps_per_size(config, run[0])
  sizes = range(config.batch_warmup.min_batch_size, first.batch_size,
                config.batch_warmup.min_batch_size)
  stages = [Phase(0, first.start + i * per_size, first.start + (i + 1) * per_size, first.data,
                  batch_size=size, network=first.network) for i, size in enumerate(sizes)]
  rest = Phase(0, stages[-1].end, first.end, first.data, batch_size=first.batch_size,
               network=first.network)
  ordered = stages + [rest] + list(run[1:])
  return tuple(Phase(i + 1, p.start, p.end, p.data, batch_size=p.batch_size, network=p.network)
               for i, p in enumerate(ordered))


def at(phases: Sequence[Phase], step: int) -> Phase:
  """The phase whose data step `step` reads (the last phase from its start on)."""
  current = phases[0]
  for phase in phases[1:]:
    if step >= phase.start:
      current = phase
  return current


def continues(before: Phase, phase: Phase) -> bool:
  """Whether `phase` reads on from `before`'s stream (the same data: a batch-size change
  alone), rather than from its own start."""
  return before.data.to_dict() == phase.data.to_dict()


def lr_segments(config: ml_collections.ConfigDict) -> list[tuple[int, float, str]]:
  """(start step, learning rate, decay) of each config.phases entry with steps: what the
  optimizer's schedule "phases" is built from (bert_jax.training.schedules.segmented)."""
  rows = entries(config)
  ends = [r["start"] for r in rows[1:]] + [config.total_steps]
  return [(r["start"], r["learning_rate"], r["decay"]) for r, end in zip(rows, ends)
          if end > r["start"]]


def shapes(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """[{"phase", "steps", "seq_len", "predictions", "batch_size"}] of a pretraining config's
  phases."""
  return [{"phase": p.index, "steps": p.steps, "seq_len": p.data.max_seq_length,
           "predictions": specs.max_predictions(p.data), "batch_size": p.batch_size}
          for p in of(config)]


# The fields a config.phases entry may set (experiments/configs/pretrain.py's phase()).
PHASE_FIELDS = ("start_fraction", "max_seq_length", "max_predictions_per_seq", "masking_ratio",
                "batch_size", "rope_theta", "local_rope_theta", "learning_rate", "decay")


def tokens(phases: Sequence[Phase]) -> int:
  """Tokens the phases' batches hold (padding included): steps x batch x length."""
  return sum(p.steps * p.batch_size * p.data.max_seq_length for p in phases)


def describe(phase: Phase) -> str:
  """'phase 3 (steps 100-900): 1024 tokens, batch 4608, masking 0.3, rope_theta 10000'."""
  extra = "".join(f", {k} {v:g}" for k, v in sorted(phase.network.items()))
  return (f"phase {phase.index} (steps {phase.start}-{phase.end}): "
          f"{phase.data.max_seq_length} tokens, batch {phase.batch_size}, masking "
          f"{phase.data.masking.ratio:g}{extra}")

