"""The identical-data proof refuses every hole the old check let through (synthetic workdirs).

Each run directory is written by hand: record.json (the config), metrics.jsonl (the
final evaluation that marks a run finished) and batch_log*.jsonl. The old check
compared only the steps both runs logged and skipped malformed lines, so a run that
logged only step 1, an empty log, disjoint step ranges, a dropped middle line, a
missing process log and an unfinished run all passed; each test below fails there.
"""

import json

import pytest

from bert_jax.run import batch_log
from experiments.ablation import proof as ablation_proof
from experiments.ablation import stages as ablation


def _write_run(root, name, *, steps=4, logged=None, total=None, finished=True, files=None,
               fingerprint=lambda step: f"fp{step}", raw=None):
  """A fake finished (or not) run `name` under `root`; returns its plan.json entry."""
  run_dir = root / name
  run_dir.mkdir()
  total = steps if total is None else total
  config = {"total_steps": total, "data.seed": 0, "data.masking.ratio": 0.15}
  (run_dir / "record.json").write_text(json.dumps({"config": config, "bert_config": {},
                                                   "vocab_sha256": "v", "spm_sha256": None,
                                                   "data": {}}))
  rows = [{"step": s, "loss": 1.0} for s in range(1, total + 1)]
  if finished:
    rows.append({"step": total, "eval/mlm_loss": 2.0, "eval/mlm_accuracy": 0.1})
  (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  logged = range(1, total + 1) if logged is None else logged
  for file in files or [batch_log.FILE_NAME]:
    text = raw if raw is not None else "".join(
        json.dumps({"step": s, "batch": fingerprint(s), "tokens": 10, "predictions": 2}) + "\n"
        for s in logged)
    (run_dir / file).write_text(text)
  return {"name": name, "seed": 0, "pretrain": name}


def test_identical_complete_runs_pass_and_report_the_compared_steps(tmp_path):
  """Fails if two finished runs with identical batch logs are refused, are not both listed as
  finished, or the proof does not report 4 steps compared for seed 0."""
  runs = [_write_run(tmp_path, "a"), _write_run(tmp_path, "b")]
  proof = ablation.check_identical_data(str(tmp_path), runs)
  assert proof.finished == ["a", "b"] and proof.compared_steps == {0: 4}


@pytest.mark.parametrize("logged", [[1], [], [3, 4], [1, 2, 4], [1, 2, 3, 4, 4]],
                         ids=["only_step_1", "empty", "late_start", "gap", "repeat"])
def test_a_log_that_does_not_cover_every_step_is_refused(tmp_path, logged):
  """Fails if a run whose batch log holds only step 1, nothing, steps 3-4, a gap or a repeated step
  is accepted instead of refused, naming the run and that it does not log steps 1..4 (or has
  none)."""
  runs = [_write_run(tmp_path, "a"), _write_run(tmp_path, "b", logged=logged)]
  with pytest.raises(ablation.AblationError, match=r"run b: .* (does not log steps 1..4|has no)"):
    ablation.check_identical_data(str(tmp_path), runs)


def test_disjoint_step_ranges_are_refused(tmp_path):
  """Fails if two runs that log disjoint halves of steps 1..4 (1-2 and 3-4) are accepted instead of
  refused, naming the first run as not logging steps 1..4."""
  runs = [_write_run(tmp_path, "a", logged=[1, 2]), _write_run(tmp_path, "b", logged=[3, 4])]
  with pytest.raises(ablation.AblationError, match="run a: .* does not log steps 1..4"):
    ablation.check_identical_data(str(tmp_path), runs)


def test_a_malformed_middle_line_is_an_error_but_a_torn_last_line_is_not(tmp_path):
  """Fails if a torn last line (no newline: a kill mid-write) stops a 4-step comparison, or a
  malformed middle line, or a malformed complete last line, is skipped instead of refused with its
  file and line number."""
  good = "".join(json.dumps({"step": s, "batch": f"fp{s}", "tokens": 1, "predictions": 1}) + "\n"
                 for s in range(1, 5))
  torn = good + '{"step": 5, "bat'  # a kill mid-write: no newline after it
  a = _write_run(tmp_path, "a")
  b = _write_run(tmp_path, "b", raw=torn)
  assert ablation.check_identical_data(str(tmp_path), [a, b]).compared_steps == {0: 4}
  lines = good.splitlines(keepends=True)
  c = _write_run(tmp_path, "c", raw="".join(lines[:2] + ["garbage\n"] + lines[2:]))
  with pytest.raises(ablation.AblationError, match=r"run c: .*batch_log.jsonl:3: malformed"):
    ablation.check_identical_data(str(tmp_path), [a, c])
  # A complete last line that is malformed is not torn (it ends in a newline).
  d = _write_run(tmp_path, "d", raw=good + '{"step": 5}\n')
  with pytest.raises(ablation.AblationError, match=r"batch_log.jsonl:5: malformed"):
    ablation.check_identical_data(str(tmp_path), [a, d])


def test_every_process_log_is_needed(tmp_path):
  """Fails if a run missing one of its two per-process batch logs is accepted, or a batch differing
  only in process 1's log is not reported as first differing at step 3, naming that log."""
  both = ["batch_log.0-of-2.jsonl", "batch_log.1-of-2.jsonl"]
  a = _write_run(tmp_path, "a", files=both)
  b = _write_run(tmp_path, "b", files=both[:1])  # process 1's log lost
  with pytest.raises(ablation.AblationError, match="run b: .* not one complete set of processes"):
    ablation.check_identical_data(str(tmp_path), [a, b])
  c = _write_run(tmp_path, "c", files=both)
  (tmp_path / "c" / both[1]).write_text(
      "".join(json.dumps({"step": s, "batch": "x" if s == 3 else f"fp{s}", "tokens": 1,
                          "predictions": 1}) + "\n" for s in range(1, 5)))
  with pytest.raises(ablation.AblationError, match=r"runs a and c .* first differ at step 3 "
                                                   r".*batch_log.1-of-2.jsonl"):
    ablation.check_identical_data(str(tmp_path), [a, c])


def test_an_unfinished_run_is_named_and_not_compared(tmp_path):
  """Fails if a run without its final evaluation (and with other batches) is compared, and so
  raises, instead of being listed as unfinished, or a run never started is not listed as not
  started."""
  a = _write_run(tmp_path, "a")
  # Unfinished and with other batches: comparing it would raise; it must be set aside instead.
  b = _write_run(tmp_path, "b", finished=False, logged=[1, 2], fingerprint=lambda s: "other")
  c = {"name": "c", "seed": 0, "pretrain": "c"}  # never started
  proof = ablation.check_identical_data(str(tmp_path), [a, b, c])
  assert (proof.finished, proof.unfinished, proof.not_started) == (["a"], ["b"], ["c"])


def test_step_counts_must_agree_in_step_mode_and_the_prefix_is_compared_in_flop_mode(tmp_path):
  """Fails if runs of 4 and 6 steps pass in step mode, or in FLOP mode their shared 4 steps are not
  compared (a difference at step 4 passes) or a difference beyond them (step 5) is refused."""
  a = _write_run(tmp_path, "a", steps=4)
  b = _write_run(tmp_path, "b", steps=6)
  with pytest.raises(ablation.AblationError, match="different step counts"):
    ablation.check_identical_data(str(tmp_path), [a, b])
  assert ablation.check_identical_data(str(tmp_path), [a, b],
                                       flop_mode=True).compared_steps == {0: 4}
  # The prefix is really compared: a difference inside it is found.
  c = _write_run(tmp_path, "c", steps=6, fingerprint=lambda s: "x" if s == 4 else f"fp{s}")
  with pytest.raises(ablation.AblationError, match="first differ at step 4 "):
    ablation.check_identical_data(str(tmp_path), [a, c], flop_mode=True)
  # ... and one beyond it is not a difference (the shorter run never read step 5).
  d = _write_run(tmp_path, "d", steps=6, fingerprint=lambda s: "x" if s == 5 else f"fp{s}")
  ablation.check_identical_data(str(tmp_path), [a, d], flop_mode=True)


def test_flop_mode_still_refuses_other_config_fields(tmp_path):
  """Fails if FLOP mode accepts two runs whose records differ in data.seed, or refuses them without
  naming the field and both values."""
  a = _write_run(tmp_path, "a")
  b = _write_run(tmp_path, "b")
  record = json.loads((tmp_path / "b" / "record.json").read_text())
  record["config"]["data.seed"] = 1
  (tmp_path / "b" / "record.json").write_text(json.dumps(record))
  with pytest.raises(ablation_proof.AblationError, match="config.data.seed: 0 vs 1"):
    ablation.check_identical_data(str(tmp_path), [a, b], flop_mode=True)


def test_flop_mode_accepts_every_field_the_plan_stretches(tmp_path):
  """Fails if a field plan.stretch changes (the steps, the warm-up, a WSD schedule's decay) or the
  layout chooser's placement fields are refused as a difference between a seed's runs: the
  modern grid's FLOP-matched runs, stretched to 250 and 235 steps, were refused at the report
  for decay_steps 50 vs 47, then for layout None vs 'auto' (a run made before the chooser)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from experiments.ablation import plan as ablation_plan  # pylint: disable=g-import-not-at-top
  run = ml_collections.ConfigDict({"total_steps": 300, "optimizer": {
      "schedule": "wsd", "warmup_steps": 30, "decay_steps": 60}})
  flat = lambda c: {f"{k}.{kk}" if isinstance(v, dict) else k: vv
                    for k, v in c.to_dict().items()
                    for kk, vv in (v.items() if isinstance(v, dict) else [(None, v)])}
  before, after = flat(run), flat(ablation_plan.stretch(run, 235))
  changed = {k for k in before if before[k] != after[k]}
  assert changed == {"total_steps", "optimizer.warmup_steps", "optimizer.decay_steps"}
  a = _write_run(tmp_path, "a")
  b = _write_run(tmp_path, "b")
  record = json.loads((tmp_path / "b" / "record.json").read_text())
  record["config"].update({k: after[k] for k in changed if k != "total_steps"})
  # ... and the layout chooser's fields, which a run made before them does not record.
  record["config"].update({"layout": "auto", "layouts": [], "slice": ""})
  (tmp_path / "b" / "record.json").write_text(json.dumps(record))
  assert ablation.check_identical_data(str(tmp_path), [a, b], flop_mode=True).finished == ["a", "b"]
