"""Seeds planned for power (experiments/ablation/power.py, stats.detectable_difference).

Fails if a planned seed count does not detect its difference about 80% of the time
under the report's own decision rule (simulated on synthetic paired results with a
known spread), if that rule's false-positive rate is not its nominal 5%, if
detectable_difference and seeds_needed stop being inverses, if report.md stops
saying per comparison which difference its seeds could not see, if --plan_seeds
misreads a pilot or refuses in more than one line, or if the docs quote other figures
than the committed zh_proof result's.
"""

import csv
import json
import pathlib

import numpy as np
import pytest

from bert_jax import errors
from experiments.ablation import power as ablation_power
from experiments.ablation import stats as ablation_stats

STUDIES = 2000  # simulated studies: the hit rate's standard error is ~0.009 at 80%


def _separated(diffs: np.ndarray) -> np.ndarray:
  """Per simulated study (a row of paired differences): did the report separate the
  setting from the baseline? The report's own path: t_interval, then verdict."""
  out = []
  for d in diffs:
    _, low, high = ablation_stats.t_interval(list(d))
    out.append(not ablation_stats.verdict("x", "base", low, high, len(d)).startswith("cannot"))
  return np.array(out)


@pytest.mark.parametrize("sd, planned_for", [(0.01, 4), (0.004, 7)])
def test_the_planned_seeds_detect_d_about_80_percent_of_the_time(sd, planned_for):
  """Fails if seeds_needed(detectable_difference(sd, n)) is not n, or the report's own rule, over
  2000 simulated studies of n paired differences of that mean, separates them outside 75-85% of the
  time, or with one seed fewer still reaches 75%."""
  d = ablation_stats.detectable_difference(sd, planned_for)
  n = ablation_stats.seeds_needed(d, sd)
  assert n == planned_for
  rng = np.random.default_rng(0)
  hits = _separated(rng.normal(d, sd, (STUDIES, n))).mean()
  assert 0.75 <= hits <= 0.85, hits
  # One seed fewer falls short: the plan is the smallest count, not a safe overshoot.
  assert _separated(rng.normal(d, sd, (STUDIES, n - 1))).mean() < 0.75


def test_a_round_difference_gets_at_least_80_percent():
  """Fails if the seeds planned for a difference equal to the spread are not the fewest whose
  power_at is 80% or more, or simulated studies with that many seeds separate outside 75-90%."""
  sd, d = 0.01, 0.01  # D equal to the spread: about ten seeds
  n = ablation_stats.seeds_needed(d, sd)
  assert ablation_stats.power_at(d, sd, n) >= 0.8 > ablation_stats.power_at(d, sd, n - 1)
  hits = _separated(np.random.default_rng(1).normal(d, sd, (STUDIES, n))).mean()
  assert 0.75 <= hits <= 0.9, (n, hits)


def test_the_rule_is_wrong_5_percent_of_the_time_when_nothing_differs():
  """Fails if, with no true difference, the report's rule separates 3-seed studies outside 3-7% of
  the time, or the old bootstrap rule stops separating over 15% of them (the reason for the t
  rule)."""
  null = np.random.default_rng(2).normal(0.0, 0.01, (STUDIES, 3))
  assert 0.03 <= _separated(null).mean() <= 0.07
  # The bootstrap rule the report used before: with 3 seeds it "separates" whenever the
  # three differences share a sign, a quarter of the time (why the report uses t).
  boot = [ablation_stats.excludes_zero(*ablation_stats.bootstrap_interval(
      list(d), resamples=1000)[1:], 3) for d in null[:400]]
  assert np.mean(boot) > 0.15


@pytest.mark.parametrize("sd", [0.003, 1.0, 42.0])
def test_detectable_difference_and_seeds_needed_are_inverses(sd):
  """Fails if, for 2 to 12 seeds, seeds_needed of detectable_difference (either sign) is not that
  count or 1% less does not need one more, seeds_needed for a given difference is not the fewest
  that detect it, or 3 seeds' detectable difference is not 3.264 sd."""
  for n in range(2, 13):
    d = ablation_stats.detectable_difference(sd, n)
    assert ablation_stats.seeds_needed(d, sd) == n
    assert ablation_stats.seeds_needed(-d, sd) == n  # either sign
    assert ablation_stats.seeds_needed(0.99 * d, sd) == n + 1
  for d in (0.5 * sd, 1.3 * sd, 3 * sd):
    n = ablation_stats.seeds_needed(d, sd)
    assert ablation_stats.detectable_difference(sd, n) <= d
    if n > 2:
      assert ablation_stats.detectable_difference(sd, n - 1) > d
  assert ablation_stats.detectable_difference(sd, 3) == pytest.approx(3.2640 * sd, rel=1e-4)


def test_degenerate_inputs():
  """Fails if a zero spread does not give a zero detectable difference and 2 seeds needed, or one
  seed or a zero difference does not raise ValueError."""
  assert ablation_stats.detectable_difference(0.0, 3) == 0.0
  assert ablation_stats.seeds_needed(0.01, 0.0) == 2
  with pytest.raises(ValueError, match="n >= 2 paired seeds, got 1"):
    ablation_stats.detectable_difference(0.01, 1)
  with pytest.raises(ValueError, match="a difference of 0 is never detected"):
    ablation_stats.seeds_needed(0.0, 0.01)


def _rows(r40_minus_r15, seeds=(0, 1, 2)):
  """Finished-run rows as the report builds them; r40 = r15 + the given per-seed differences."""
  rows = []
  for seed, diff in zip(seeds, r40_minus_r15):
    base = 0.14 + 0.01 * seed  # the seed's own luck, shared by both settings
    for setting, acc in (("r15", base), ("r40", base + diff)):
      rows.append({"run": f"{setting}_seed{seed}", "setting": setting, "seed": seed,
                   "eval_mlm_accuracy": acc, "downstream": {}})
  return rows


def test_the_report_says_which_difference_its_seeds_could_not_see():
  """Fails if comparison_markdown, for 3 unseparated seeds, does not state in the row and the MLM
  line that a difference below 0.0115 would go unseen, lacks the detectable column or a separated
  row's value (0.00326), or does not say that one seed gives no spread."""
  # sd of (0.004, -0.003, 0.001) is 0.003512; 3 seeds detect 3.264 sd = 0.0115.
  md = ablation_stats.comparison_markdown(_rows([0.004, -0.003, 0.001]), [], "r15", {})
  line = ("cannot separate r40 from r15 at this budget; a difference below 0.0115 would go "
          "unseen with 3 seeds")
  assert f"| {line} |" in md and f"- {ablation_stats.MLM_LABEL}: {line}." in md
  assert "| detectable (80% power) |" in md
  # A separated comparison states it in its row too (here 3.264 x sd 0.001).
  md = ablation_stats.comparison_markdown(_rows([0.004, 0.005, 0.006]), [], "r15", {})
  assert "| r40 | 3 | +0.0050 [+0.0025, +0.0075] | 0.00326 | r40 beats r15 |" in md
  single = ablation_stats.comparison_markdown(_rows([0.05], seeds=(0,)), [], "r15", {})
  assert "one seed gives no spread" in single


def _pilot(tmp_path, diffs, *, finished=True):
  """A reported pilot: plan.json and results.csv with r15 and r40 over len(diffs) seeds."""
  (tmp_path / "plan.json").write_text(json.dumps({"baseline": "r15", "tasks": {"sent": {}}}))
  with open(tmp_path / "results.csv", "w", newline="") as f:
    w = csv.DictWriter(f, ["run", "setting", "seed", "steps", "total_steps",
                           "eval_mlm_accuracy", "sent_median"])
    w.writeheader()
    for seed, diff in enumerate(diffs):
      for setting, acc in (("r15", 0.14 + 0.01 * seed), ("r40", 0.14 + 0.01 * seed + diff)):
        w.writerow({"run": f"{setting}_seed{seed}", "setting": setting, "seed": seed,
                    "steps": 10 if finished else 5, "total_steps": 10,
                    "eval_mlm_accuracy": acc, "sent_median": 0.7 + 2 * acc})
  return str(tmp_path)


def test_plan_seeds_prints_the_pilots_spread_and_the_table(tmp_path):
  """Fails if plan_seeds lacks the MLM or the downstream task's section, misprints the pilot's sd of
  paired differences (0.00351) or what 3 seeds detect (0.0115), or its table's seed counts for 0.01
  and 0.001 are not seeds_needed's."""
  text = ablation_power.plan_seeds(_pilot(tmp_path, [0.004, -0.003, 0.001]))
  assert "## held-out MLM accuracy at 15%: r40 minus r15" in text
  assert "## sent (downstream): r40 minus r15" in text
  assert "sd of the paired differences 0.00351" in text
  assert "the smallest difference 3 seeds detect: 0.0115" in text
  sd = float(np.std([0.004, -0.003, 0.001], ddof=1))
  assert f"| 0.01 | {ablation_stats.seeds_needed(0.01, sd)} |" in text
  assert f"| 0.001 | {ablation_stats.seeds_needed(0.001, sd)} |" in text


def _damaged(tmp_path, how: str) -> str:
  """A pilot whose results.csv or plan.json is damaged as `how` says."""
  _pilot(tmp_path, [0.004, 0.001])
  results = tmp_path / "results.csv"
  if how == "n/a":  # the first run's downstream median
    lines = results.read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ",n/a"
    results.write_text("\n".join(lines) + "\n")
  elif how == "no seed":
    results.write_text("\n".join(",".join(c for i, c in enumerate(line.split(",")) if i != 2)
                                 for line in results.read_text().splitlines()) + "\n")
  elif how == "binary":
    results.write_bytes(b"run,setting\n\xff\xfe\x00\x81")
  else:  # a cut plan.json
    (tmp_path / "plan.json").write_text('{"baseline": "r15", "tas')
  return str(tmp_path)


@pytest.mark.parametrize("make, says", [
    (lambda p: str(p), "results.csv is missing"),
    (lambda p: _pilot(p, [0.004, 0.001], finished=False), "has no finished run"),
    (lambda p: _pilot(p, [0.004]), "no setting has 2 pretraining seeds"),
    (lambda p: _damaged(p, "n/a"), "has sent_median='n/a', not a number"),
    (lambda p: _damaged(p, "no seed"), "has seed=None, not a number (or no such column)"),
    (lambda p: _damaged(p, "binary"), "results.csv is not the CSV the report writes"),
    (lambda p: _damaged(p, "cut plan"), "plan.json is not the JSON the ablation writes"),
])
def test_plan_seeds_refuses_in_one_line(tmp_path, make, says):
  """Fails if plan_seeds, on a pilot without results.csv, without a finished run, with one seed,
  with an n/a cell, without a seed column, with binary bytes for results.csv or with a cut
  plan.json, does not raise a UsageError that says so in a single line."""
  with pytest.raises(errors.UsageError) as e:
    ablation_power.plan_seeds(make(tmp_path))
  assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # a fresh process each (python -m experiments.ablation)
@pytest.mark.parametrize("how, says", [
    ("n/a", "has sent_median='n/a', not a number"),
    ("no seed", "has seed=None, not a number (or no such column)"),
    ("binary", "results.csv is not the CSV the report writes"),
    ("cut plan", "plan.json is not the JSON the ablation writes"),
])
def test_the_plan_seeds_command_refuses_a_damaged_pilot_in_one_line(tmp_path, how, says):
  """Fails if `python -m experiments.ablation --plan_seeds` on a damaged pilot prints anything
  but its one line (a traceback, a second line), exits other than 1, or changes the pilot."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from test_refusals import _listing, _refusal_line  # pylint: disable=g-import-not-at-top
  pilot = pathlib.Path(_damaged(tmp_path, how))
  # Every file's (size, mtime) and bytes: what "the pilot is unchanged" means here.
  snapshot = lambda: (_listing(pilot), {q: q.read_bytes() for q in pilot.rglob("*")
                                        if q.is_file()})
  before = snapshot()
  result = subprocess.run([sys.executable, "-m", "experiments.ablation", f"--workdir={pilot}",
                           "--plan_seeds"], capture_output=True, text=True, timeout=300,
                          cwd=pathlib.Path(__file__).resolve().parents[1])
  assert says in _refusal_line(result.stderr, result.returncode), result.stderr
  assert snapshot() == before


def test_the_docs_quote_the_committed_zh_proof_result():
  """Fails if docs/ablation.md's --plan_seeds example is not what plan_seeds prints for the
  committed zh_proof pilot, or the held-out MLM intervals its summary quotes
  (experiments/results/ablation_zh_proof/summary.md) are not its report.md's rounded (a
  re-run of zh_proof committed without its summary, or a summary edited by hand)."""
  root = pathlib.Path(__file__).resolve().parents[1]
  pilot = root / "experiments" / "results" / "ablation_zh_proof"
  text = ablation_power.plan_seeds(str(pilot))
  doc = (root / "docs" / "ablation.md").read_text()
  example = doc.split("labels, cosine minus r15:\n\n```\n", 1)[1].split("```", 1)[0]
  assert f"## sentiment_2k (downstream): cos40to15 minus r15\n{example}" in f"{text}\n"
  report = (pilot / "report.md").read_text()
  readme = (pilot / "summary.md").read_text()
  for setting, quoted in (("r40", "r40 minus r15: {}, paired t 95% interval [{}, {}]"),
                          ("cos40to15", "cosine {} [{}, {}]")):
    row = next(l for l in report.splitlines() if l.startswith(f"| {setting} | 3 | "))
    mean, low, high = (float(x) for x in
                       row.split(" | ")[2].replace("[", "").replace("]", "").replace(",", "").split())
    figures = [f"{x:+.3f}".replace("+", "") for x in (mean, low, high)]
    assert quoted.format(*figures) in " ".join(readme.split()), (setting, figures)
