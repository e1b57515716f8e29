"""Layouts chosen for the slice (bert_jax/run/layouts.py): a recipe plus a slice gets its tested
layout, a user's flag wins, a resumed run keeps its recorded layout, and the layouts the
chooser can pick train the same losses."""

import json
import pathlib
import re

import pytest

from bert_jax.run import layouts
from bert_jax.run import workdir as workdir_lib
from experiments.benchmarks.pretrain import preflight_table
from experiments.configs import pretrain


def test_a_recipe_on_a_slice_gets_its_tested_layout():
  """Fails if BERT-Large on a v4-8 (data parallel needs >= 105.8 GiB of 30.75 at 512 tokens)
  does not get the layout the preflight found, the line does not say what was applied, an
  accumulating layout (modernbert-base on a v6e-8) changes the recipe's batch, or
  BERT-Base on a v4-32 (it fits data parallel, scanned) is moved off data parallelism."""
  config = pretrain.get_config("large")
  config.slice = "v4-8"
  line = layouts.choose(config)
  assert (config.mesh.data, config.mesh.fsdp, config.model.remat_policy) == (
      1, -1, "dots_with_no_batch_dims_saveable")
  assert line == ("layout for v4-8: --config.mesh.data=1 --config.mesh.fsdp=-1 "
                  "--config.model.remat_policy=dots_with_no_batch_dims_saveable")
  # Accumulation splits the recipe's batch; it never changes it.
  modern = pretrain.get_config("modernbert-base")
  batch, modern.slice = modern.batch_size, "v6e-8"
  layouts.choose(modern)
  assert (modern.model.remat_policy, modern.grad_accum_steps, modern.batch_size) == (
      "full", 12, batch)
  base = pretrain.get_config("base")
  base.slice = "v4-32"
  assert layouts.choose(base).startswith("layout: none tested for v4-32 (tested: v4-8)")
  assert (base.mesh.data, base.mesh.fsdp, base.model.scan_layers) == (-1, 1, True)


def test_an_explicit_flag_wins_and_none_or_no_slice_changes_nothing():
  """Fails if a field the user set by flag is overridden, or the layout applies with
  config.layout 'none', without a slice, or on a slice no layout was tested for."""
  config = pretrain.get_config("large")
  config.slice, config.mesh.fsdp = "v4-8", 4
  line = layouts.choose(config, explicit=layouts.explicit_fields(
      ["--config.mesh.fsdp=4", "--workdir=w"]))
  assert (config.mesh.data, config.mesh.fsdp) == (1, 4)
  assert line.endswith("kept mesh.fsdp=4 (your flag)"), line
  for changes, says in (({"slice": "v4-8", "layout": "none"}, "none (config.layout"),
                        ({"slice": ""}, "no slice named"),
                        ({"slice": "v4-32"}, "none tested for v4-32")):
    config = pretrain.get_config("large")
    config.update(changes)
    before = config.to_dict()
    assert layouts.choose(config).startswith(f"layout: {says}"), changes
    assert config.to_dict() == before


def test_a_resumed_run_keeps_its_recorded_layout():
  """Fails if the workdir's recorded values of the layout's fields do not win over the
  table (a table changed since the run started must not move a running job)."""
  config = pretrain.get_config("large")
  config.slice = "v4-8"
  recorded = workdir_lib.flatten(pretrain.get_config("large"))  # a run started data-parallel
  line = layouts.choose(config, recorded=recorded)
  assert (config.mesh.data, config.mesh.fsdp, config.model.remat_policy) == (-1, 1, "none")
  assert "kept mesh.data=-1 (the workdir's), mesh.fsdp=1 (the workdir's)" in line


def test_every_shipped_layout_sets_only_what_a_resume_may_change():
  """Fails if a variant's layout line does not parse, names a slice twice, or sets a field
  that changes what is trained (only RESUMABLE fields: mesh, remat, accumulation)."""
  for variant in pretrain.VARIANTS:
    lines = pretrain.get_config(variant).layouts
    table = layouts.parse(lines)
    assert len(table) == len(lines), variant
    for knobs in table.values():
      for field in knobs:
        assert workdir_lib._resumable(field), (variant, field)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="'batch_size=8' is not one of"):
    layouts.parse(["v4-8: batch_size=8"])


@pytest.mark.slow  # four short runs on 8 simulated devices
def test_the_layouts_train_the_same_losses(pretrain_test_config, pretrain_subprocess, tmp_path):
  """Fails if the tiny model's per-step losses under each layout the chooser can pick (fsdp,
  a remat policy, gradient accumulation) differ from data parallelism's beyond float
  rounding (1e-5), dropout off, or a layout is not applied and recorded."""
  losses = {}
  choices = {"dp": "", "fsdp": "mesh.data=1 mesh.fsdp=-1",
             "remat": "model.remat_policy=full", "accum": "grad_accum_steps=2"}
  for name, knobs in choices.items():
    # 2 rows a device, in 2 parts under accumulation. Dropout off: accumulation draws each
    # micro-batch's masks apart (the same rate, other bits); everything else is the same.
    config = pretrain_test_config(total_steps=4, batch_size=16, **{
        "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0})
    config.slice = "test-slice"
    config.layouts = (f"test-slice: {knobs}",) if knobs else ()
    process = pretrain_subprocess(config, tmp_path / name, devices=8)
    assert process.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    rows = [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    losses[name] = [r["loss"] for r in rows if "loss" in r]
    recorded = json.loads((tmp_path / name / "record.json").read_text())["config"]
    for item in knobs.split():
      field, value = item.split("=")
      assert str(recorded[field]) == value, (name, field)
  for name in ("fsdp", "remat", "accum"):
    assert losses[name] == pytest.approx(losses["dp"], abs=1e-5), name


def _recorded_fits() -> set[tuple[str, str]]:
  """(variant, slice) the recorded preflight table says fit as shipped."""
  table = (pathlib.Path(__file__).resolve().parents[1] / "experiments" / "results" /
           "preflight.md").read_text()
  table = table[table.index("<!-- as shipped -->"):]  # the current table, not the history
  fits = set()
  names = {(model, recipe): variant for variant, (model, recipe) in
           preflight_table.MODELS.items()}
  for model, recipe, slice_name, rest in re.findall(
      r"^\| ([^|]+) \| ([^|]+) \| (\S+) \|(.*)$", table, re.M):
    if (model, recipe) in names and "| fits |" in rest:
      fits.add((names[model, recipe], slice_name))
  return fits


def _short(config) -> str:
  """A chosen layout as docs/pods.md's table words it."""
  parts = ["fsdp"] if config.mesh.fsdp != 1 else []
  if config.model.remat_policy != "none":
    parts.append(f"`{config.model.remat_policy}`")
  if config.grad_accum_steps > 1:
    parts.append(f"{config.grad_accum_steps} micro-batches")
  return " + ".join(parts) or "data parallel"


def test_the_docs_table_of_layouts_is_what_the_chooser_applies():
  """Fails if docs/pods.md's table of what each recipe runs with on each slice says
  another layout than config.layouts gives, or leaves out a cell of the preflight table."""
  text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "pods.md").read_text()
  header = re.search(r"^\| `pretrain\.py:` \|(.*)\|$", text, re.M)
  slices = [c.strip() for c in header.group(1).split("|")]
  cells = {}
  for variant, row in re.findall(r"^\| `([a-z_]+)` \|(.*)\|$", text[header.end():], re.M):
    for slice_name, cell in zip(slices, row.split("|")):
      cells[variant, slice_name] = cell.strip()
  assert set(cells) == {(v, s) for v in preflight_table.MODELS for s in slices}
  assert set(cells) >= _recorded_fits()  # every cell the preflight table says fits
  for (variant, slice_name), cell in cells.items():
    config = pretrain.get_config(variant)
    config.slice = slice_name
    layouts.choose(config)
    assert cell == _short(config), (variant, slice_name)


def test_every_documented_launch_runs_what_fits():
  """Fails if a launch or preflight command in the README or docs names a recipe and a slice
  where the recipe does not fit as shipped (the recorded preflight table, each slice's
  tested layout applied): the docs would launch what the preflight refuses."""
  root = pathlib.Path(__file__).resolve().parents[1]
  fits, checked = _recorded_fits(), []
  assert ("base", "v4-32") in fits and ("large", "v4-8") in fits  # the table was read
  for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
    for paragraph in re.split(r"\n\s*\n", doc.read_text()):
      variant = re.search(r"pretrain\.py:([a-z_-]+)", paragraph)
      slice_name = re.search(r"--(?:accelerator_type|topology)=([a-z0-9-]+)", paragraph)
      if not (variant and slice_name) or "--config.batch_size" in paragraph:
        continue  # no recipe and slice, or a batch of the user's (not the recipe's)
      variant, slice_name = variant.group(1), slice_name.group(1)
      if variant in preflight_table.MODELS:
        assert (variant, slice_name) in fits, (doc.name, variant, slice_name)
      else:  # a recipe outside the table (modernbert-base): a tested layout for the slice
        assert slice_name in layouts.parse(pretrain.get_config(variant).layouts), (
            doc.name, variant, slice_name)
      checked.append((doc.name, variant, slice_name))
  assert ("pods.md", "base", "v4-32") in checked, checked  # the step-by-step launch


def test_a_base_workdir_made_unscanned_is_told_the_flag_that_resumes_it(tmp_path):
  """`base` scans its layers since 2026-12-07 (compile time). Fails if a workdir made before,
  unscanned, with a checkpoint, is resumed silently in the new layout, if its refusal does
  not name --config.model.scan_layers=False, or if that flag does not resume it."""
  old = workdir_lib.flatten(pretrain.get_config("base"))
  old["model.scan_layers"] = False
  record = {"config": old, "bert_config": {"scan_layers": False}, "data": {}}

  def new(config):
    return {"config": workdir_lib.flatten(config), "data": {}, "code_version": "x",
            "bert_config": {"scan_layers": config.model.scan_layers}}

  done = tmp_path / "checkpoints" / "1"  # work the record speaks for (a committed step)
  done.mkdir(parents=True)
  (done / "_CHECKPOINT_METADATA").write_text("{}")
  with pytest.raises(workdir_lib.WorkdirError, match=(
      r"created as 'base' with config.model.scan_layers=False; this run has True \(and 1 more: "
      r"network scan_layers\)\. .*to resume it as it ran, --config.model.scan_layers=False; ")):
    workdir_lib.check_record(str(tmp_path), record, new(pretrain.get_config("base")), quiet=True)
  resumed = pretrain.get_config("base")
  resumed.model.scan_layers = False
  assert not workdir_lib.check_record(str(tmp_path), record, new(resumed), quiet=True)
