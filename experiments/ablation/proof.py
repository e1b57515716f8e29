"""The ablation's identical-data proof: runs of one seed read the same batches, step by step.

What is proven, per pretraining seed, over that seed's FINISHED runs:
  config     the recorded configs agree outside data.masking and runtime fields
             (in FLOP mode also outside the step counts the budget sets), and their
             network, vocabulary and corpus agree
  coverage   every process's batch log of every run is present (batch_log.jsonl, or
             batch_log.<i>-of-<n>.jsonl for every i < n) and logs steps 1..N with no
             gap and no repeat, N = the run's total_steps
  batches    at every step 1..N the unmasked-batch fingerprints agree, process by
             process; N is the same for every run in step mode and the common prefix
             (the shortest run's N) in FLOP mode, where runs train different step counts
  lines      a malformed line anywhere but a torn last line is an error
             (bert_jax.run.batch_log.parse_strict)

A run that started but has not finished (no evaluation at its total_steps) is not
compared: it is named in Proof.unfinished, and the report lists it as unfinished
and keeps it out of every comparison.
"""

import collections
import dataclasses
import json
import re
from typing import Any

from bert_jax import errors
from bert_jax.run import batch_log
from bert_jax.run import metrics_io
from bert_jax.run import workdir as workdir_lib
from host import paths

# Fields runs of one seed may differ in besides data.masking: placement, cadence and
# storage, never what a step computes (a prefix ending in "." covers a block).
RUNTIME_FIELDS = ("checkpoint.", "mesh.", "distributed.", "log_every_steps", "eval_every_steps",
                  "peak_tflops_per_device", "grad_accum_steps", "model.remat",
                  "model.remat_policy", "model.attention_impl", "data.prefetch_batches",
                  "data.embedded_cache_dir",
                  # the layout chooser's (bert_jax.run.layouts): it sets only the mesh, remat
                  # and accumulation above, never what a step computes
                  "layout", "layouts", "slice")
# What a FLOP-matched plan sets per setting (plan.stretch): the steps, and the schedule's
# warm-up and WSD decay scaled with them. Nothing else may differ between a seed's runs.
BUDGET_FIELDS = ("total_steps", "optimizer.warmup_steps", "optimizer.decay_steps")
_PROCESS_FILE = re.compile(r"^batch_log\.(\d+)-of-(\d+)\.jsonl$")


class AblationError(errors.UsageError):
  """A grid that must not be run or reported (bad settings, runs that differ in more than
  masks): a refusal, one line (a ValueError, as it was)."""


@dataclasses.dataclass
class Proof:
  """What the check established: run names by state, and the steps compared per seed."""
  finished: list[str] = dataclasses.field(default_factory=list)
  unfinished: list[str] = dataclasses.field(default_factory=list)  # started, not at total_steps
  not_started: list[str] = dataclasses.field(default_factory=list)
  compared_steps: dict[int, int] = dataclasses.field(default_factory=dict)  # seed -> steps 1..N


def _record(workdir: str, run_dir: str) -> dict | None:
  """A run's record.json, None before the run has started."""
  path = paths.join(workdir, run_dir, workdir_lib.RECORD_FILE)
  return json.loads(paths.read_text(path)) if paths.exists(path) else None


def finished(run_dir: str, total_steps: int) -> bool:
  """Whether the run in `run_dir` reached total_steps and evaluated there (its last act)."""
  path = paths.join(run_dir, metrics_io.METRICS_FILE)
  if not paths.exists(path):
    return False
  return any(r.get("step") == total_steps and "eval/mlm_loss" in r
             for r in metrics_io.read_metrics(path))


def _field_allowed(key: str, flop_mode: bool) -> bool:
  if key.startswith("data.masking.") or (flop_mode and key in BUDGET_FIELDS):
    return True
  return any(key == f or (f.endswith(".") and key.startswith(f)) for f in RUNTIME_FIELDS)


def complete_logs(run_dir: str, name: str, total_steps: int) -> dict[str, list[dict]]:
  """A finished run's batch logs, refused unless every process logged steps 1..total_steps."""
  try:
    logs = batch_log.read(run_dir)
  except batch_log.BatchLogError as e:
    raise AblationError(f"run {name}: {e}") from None
  if not logs:
    raise AblationError(f"run {name}: {run_dir} has no {batch_log.FILE_NAME} (trained by a "
                        "trainer without batch logs?), so identical data cannot be checked")
  names = sorted(logs)
  if names != [batch_log.FILE_NAME]:
    counts = {int(m.group(2)) for m in map(_PROCESS_FILE.match, names) if m}
    expected = sorted(batch_log.file_name(i, n) for n in counts for i in range(n))
    if len(counts) != 1 or names != expected:
      raise AblationError(f"run {name}: batch logs {names} are not one complete set of "
                          f"processes (expected {expected or [batch_log.FILE_NAME]}): every "
                          "process's log is needed to prove its part of the batches")
  for file, rows in logs.items():
    steps = [r["step"] for r in rows]
    if steps != list(range(1, total_steps + 1)):
      missing = sorted(set(range(1, total_steps + 1)) - set(steps))
      counts = collections.Counter(steps)
      extra = sorted(s for s, n in counts.items() if n > 1 or s > total_steps)
      raise AblationError(
          f"run {name}: {paths.join(run_dir, file)} does not log steps 1..{total_steps} once "
          f"each ({len(steps)} rows; missing {_steps(missing)}; repeated or beyond "
          f"{_steps(extra)}), so its data cannot be proven identical")
  return logs


def _steps(steps: list[int]) -> str:
  if not steps:
    return "none"
  return ", ".join(map(str, steps[:5])) + (f" and {len(steps) - 5} more" if len(steps) > 5 else "")


def check(workdir: str, runs: list[dict[str, Any]], *, flop_mode: bool = False) -> Proof:
  """Proves the finished runs of every seed read identical data; raises AblationError if not.

  `runs` are plan.json's entries. Unfinished runs are returned by name, not compared.
  """
  proof = Proof()
  by_seed: dict[int, list[tuple[dict, dict, dict]]] = {}
  for run in runs:
    record = _record(workdir, run["pretrain"])
    if record is None:
      proof.not_started.append(run["name"])
      continue
    run_dir = paths.join(workdir, run["pretrain"])
    total = int(record["config"]["total_steps"])
    if not finished(run_dir, total):
      proof.unfinished.append(run["name"])
      continue
    proof.finished.append(run["name"])
    logs = complete_logs(run_dir, run["name"], total)
    by_seed.setdefault(run["seed"], []).append((run, record, logs))
  for seed, group in by_seed.items():
    totals = {int(r["config"]["total_steps"]) for _, r, _ in group}
    if len(totals) > 1 and not flop_mode:
      raise AblationError(f"runs of pretraining seed {seed} trained different step counts "
                          f"{sorted(totals)} in step mode; an ablation's runs may differ only "
                          "in data.masking, so nothing is reported")
    prefix = min(totals)
    proof.compared_steps[seed] = prefix
    first, first_record, first_logs = group[0]
    for other, record, logs in group[1:]:
      where = f"runs {first['name']} and {other['name']} (pretraining seed {seed})"
      a, b = first_record["config"], record["config"]
      for key in sorted(set(a) | set(b)):
        if _field_allowed(key, flop_mode) or a.get(key) == b.get(key):
          continue
        raise AblationError(f"{where} differ in config.{key}: {a.get(key)!r} vs "
                            f"{b.get(key)!r}; an ablation's runs may differ only in "
                            "data.masking, so nothing is reported")
      for field in ("bert_config", "vocab_sha256", "spm_sha256", "data"):
        if first_record.get(field) != record.get(field):
          raise AblationError(f"{where} differ in their {field} ({first_record.get(field)!r} vs "
                              f"{record.get(field)!r}), so nothing is reported")
      if sorted(first_logs) != sorted(logs):
        raise AblationError(f"{where} ran with different process counts ({sorted(first_logs)} "
                            f"vs {sorted(logs)}): each process reads other documents")
      for file in sorted(first_logs):
        for row_a, row_b in zip(first_logs[file][:prefix], logs[file][:prefix]):
          if row_a["batch"] != row_b["batch"]:
            raise AblationError(
                f"{where} read different data: their unmasked batches first differ at step "
                f"{row_a['step']} ({paths.join(workdir, first['pretrain'], file)}: "
                f"{row_a['batch']}, {paths.join(workdir, other['pretrain'], file)}: "
                f"{row_b['batch']}); they differ in more than the masks, so nothing is reported")
  return proof
