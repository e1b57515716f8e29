"""--dry_run and --print_commands: what the suite will run, and what it costs on the devices at hand.

Per member: its train and dev examples (read by the task kind, no tokenizing; the
record's counts when the suite has run before), its runs (rates x seeds), steps per
run ((train // batch) x epochs; SQuAD and long tagged sentences train on windows, a
few more rows than examples, so theirs are marked as lower bounds), model FLOPs per step (bert_jax.pretrain.cost.step_flops
of the checkpoint's encoder at the member's max_seq_length: an upper bound, length
buckets pad less) and a time. The time is measured when it can be: the finished
members of this workdir give seconds per model FLOP (their wall time, compiles and
evaluation included, over their FLOPs), applied to the rest; otherwise it is
cost.hours at --mfu of the devices' peak (bert_jax.pretrain.cost), and unknown on
devices without a known peak (a CPU) unless --peak_tflops gives one. The output says
which.
"""

import shlex
from typing import Any

from bert_jax.run import workdir as workdir_lib
from experiments.configs import finetune as finetune_configs
from experiments.evaluate import execute
from experiments.evaluate import plan
from host import paths

# Kinds that train on windows (a long context or sentence gives several rows): their steps
# counted on examples are a lower bound.
WINDOWED = ("squad", "ner", "tagging")


def _flag_value(value: Any) -> str:
  """A value as ml_collections' --config.X parser reads it back (tuples as literals)."""
  if isinstance(value, (list, tuple)):
    return "(" + "".join(f"{v!r}," for v in value) + ")"
  return value if isinstance(value, str) else repr(value)


def commands(members: list[plan.Member], workdir: str, suite_flags: list[str]) -> list[str]:
  """Shell commands doing what the suite does: the record, one bert_jax.main per member
  (independent: one machine each if you like), then the report."""
  this = shlex.join(["python", "-m", "experiments.evaluate", *suite_flags,
                     f"--workdir={workdir}"])
  lines = ["# 1. once: the plan (DIR/suite.json: every member's config, checked and counted)",
           f"{this} --stage=plan", "# 2. the members, cheapest first; each resumes on re-run"]
  for m in members:
    base = workdir_lib.flatten(finetune_configs.get_config(m.config.task.name))
    want = workdir_lib.flatten(m.config)
    lines.append(shlex.join(
        ["python", "-m", "bert_jax.main", f"--config=experiments/configs/finetune.py:"
         f"{m.config.task.name}", f"--workdir={m.workdir}"]
        + [f"--config.{k}={_flag_value(v)}" for k, v in sorted(want.items())
           if base.get(k) != v]))
  lines += ["# 3. the table, the plots and the leaderboard zip, from DIR alone",
            shlex.join(["python", "-m", "experiments.evaluate", f"--workdir={workdir}",
                        "--stage=report"])]
  return lines


def _step_flops(members: list[plan.Member]) -> tuple[str, dict[str, float]]:
  """(the model, {member: model FLOPs of one train step at its full length})."""
  # pylint: disable=g-import-not-at-top  # the checkpoint and JAX only for a dry run
  from bert_jax import convert
  from bert_jax.pretrain import cost
  bert_config, params, _, _ = convert.load_for_finetuning(members[0].config.init_checkpoint,
                                                          task_heads=())
  model = (f"L={bert_config.num_hidden_layers} H={bert_config.hidden_size} "
           f"A={bert_config.num_attention_heads}")
  return model, {m.name: cost.step_flops(bert_config, params, sequences=m.config.batch_size,
                                         seq_len=m.config.max_seq_length, predictions=0)
                 for m in members}


def dry_run(members: list[plan.Member], workdir: str, record: dict[str, Any], suite: str, *,
            mfu: float, peak_tflops: float) -> str:
  """The table of the module docstring (nothing is written)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain import cost  # pylint: disable=g-import-not-at-top
  recorded = record.get("members", {})
  counts = {m.name: recorded[m.name]["counts"] if m.name in recorded else plan.counts(m)
            for m in members}
  order = record.get("order", [])  # the recorded order, else cheapest first as the run orders
  members = sorted(members, key=lambda m: (order.index(m.name) if m.name in order else len(order),
                                           plan.cost(m, counts[m.name])))
  model, per_step = _step_flops(members)
  rows, total = [], {}
  for m in members:
    c = m.config
    steps = counts[m.name]["train"] // c.batch_size * c.num_epochs
    runs = len(c.learning_rates) * len(c.seeds)
    total[m.name] = steps * runs * per_step[m.name]
    rows.append((m, steps, runs))
  times = execute.read_times(workdir)
  done = [m.name for m in members if m.name in recorded and m.name in times
          and execute.finished(m, recorded[m.name])]
  kind, n = jax.devices()[0].device_kind, jax.device_count()
  if done:
    per_flop = sum(times[d]["seconds"] for d in done) / sum(total[d] for d in done)
    how = (f"time measured: {per_flop * 1e15:.3g} s per PFLOP on this workdir's finished "
           f"members ({', '.join(done)}), wall time over model FLOPs")
    hours = {name: f * per_flop / 3600 for name, f in total.items()}
  else:
    how = (f"time at {mfu:.0%} MFU of the devices' peak (bert_jax.pretrain.cost; "
           "--mfu, --peak_tflops)")
    hours = {name: cost.hours(f, kind, n, mfu, peak_tflops) for name, f in total.items()}
  lines = [f"suite {suite} from {members[0].config.init_checkpoint} ({model}) "
           f"on {n} x {kind}; {how}",
           "| order | member | train / dev examples | runs | steps/run | FLOPs/step | FLOPs "
           "| time | status |", "|---|---|---|---|---|---|---|---|---|"]
  for i, (m, steps, runs) in enumerate(rows, 1):
    h = hours[m.name]
    status = ("done" if m.name in done else "started" if paths.exists(m.workdir)
              else "to run")
    windows = "≥ " if m.config.task.kind in WINDOWED else ""
    lines.append(f"| {i} | {m.name} | {counts[m.name]['train']:,} / "
                 f"{sum(counts[m.name]['dev'].values()):,} | {runs} | {windows}{steps:,} | "
                 f"{per_step[m.name]:.3g} | {total[m.name]:.3g} | "
                 f"{'unknown' if h is None else _hours(h)} | {status} |")
  left = [hours[m.name] for m in members if m.name not in done]
  lines.append("to run: " + ("unknown (no peak known for these devices: give --peak_tflops, "
                              "or run one member and ask again)" if None in left
                              else _hours(sum(left))))
  return "\n".join(lines)


def _hours(h: float) -> str:
  return f"{h * 60:.1f} min" if h < 1 else f"{h:.1f} h"
