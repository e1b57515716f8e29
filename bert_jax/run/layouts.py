"""Layouts chosen for the slice: a recipe plus a slice gives a run that fits.

A pretraining variant carries the layouts tested for it (config.layouts: lines
"SLICE: field=value field=value", each a mesh, remat policy or gradient accumulation the
preflight found to fit that slice; experiments/results/preflight.md and modern_recipe.md
hold the measurements). With config.layout "auto" (the default) and config.slice naming
the slice (the launcher passes its accelerator type; `python -m bert_jax.main` on a slice
by hand: --config.slice=v4-32), `choose` applies that slice's line before anything is
created, unless:

  - the user set a field of it explicitly (a --config flag): the user's value wins;
  - the workdir already records a run: its recorded values of those fields win, so a
    resumed run keeps the layout it started with even if the table changed since.

A layout changes memory and speed only: the fields it may set are RESUMABLE ones
(bert_jax.run.workdir): the mesh, the remat policy, gradient accumulation (the same
update; with dropout on, each micro-batch draws its own masks: the same rate, other
bits), never the batch, the model or the data (tests/test_layouts.py: the same losses). The chosen layout is printed in one line
and recorded with the rest of the config in the workdir's record. The table is chosen over
an automatic search at launch because the layout is then known before anything compiles,
the same for every launch of a recipe on a slice, and reviewable in the config (a search
costs minutes per cell even scanned, 20-80 unrolled); a tested table is what MaxText ships
per accelerator; the preflight still checks what runs.
"""

from typing import Any, Iterable

import ml_collections

from host import fields

LAYOUT_FIELDS = ("mesh.data", "mesh.fsdp", "mesh.tensor", "model.remat_policy",
                 "grad_accum_steps")
MODES = ("auto", "none")


def parse(lines: Iterable[str]) -> dict[str, dict[str, Any]]:
  """config.layouts -> {slice: {field: value}} (ValueError naming a bad line)."""
  out = {}
  for line in lines:
    name, _, fields = line.partition(":")
    if not fields.strip():
      raise ValueError(f"config.layouts line {line!r}: want 'SLICE: field=value ...'")
    knobs = {}
    for item in fields.split():
      field, _, value = item.partition("=")
      if field not in LAYOUT_FIELDS or not value:
        raise ValueError(f"config.layouts line {line!r}: {item!r} is not one of "
                         f"{LAYOUT_FIELDS}=VALUE (a layout changes memory and speed only)")
      knobs[field] = value
    out[name.strip()] = knobs
  return out


def _typed(config: ml_collections.ConfigDict, field: str, value: str) -> Any:
  """`value` (text) as the type of config's `field`."""
  current = fields.get(config, field)
  return type(current)(value) if not isinstance(current, str) else value


def _set(config, field: str, value: Any) -> None:
  """Sets an existing field (a locked ConfigDict takes new values, not new fields)."""
  section, _, leaf = field.rpartition(".")
  (fields.get(config, section) if section else config)[leaf] = value


def choose(config: ml_collections.ConfigDict, explicit: Iterable[str] = (),
           recorded: dict[str, Any] | None = None) -> str:
  """Applies config.slice's tested layout to `config` (module docstring) and returns the
  one line saying what was chosen ("" when the config has no layouts).

  `explicit`: the config fields the user set by flag ("mesh.fsdp", ...); `recorded`: the
  flattened config of the run the workdir holds (None for a new workdir).
  """
  if "layouts" not in config or not config.layouts:
    return ""
  mode, slice_name = config.get("layout", "auto"), config.get("slice", "")
  if mode not in MODES:
    raise ValueError(f"config.layout={mode!r}: expected one of {MODES}")
  table = parse(config.layouts)
  if mode == "none":
    return "layout: none (config.layout='none'): as configured"
  if not slice_name:
    return ("layout: no slice named (config.slice): as configured; tested for "
            f"{', '.join(sorted(table))}")
  knobs = table.get(slice_name)
  if knobs is None:
    return (f"layout: none tested for {slice_name} (tested: {', '.join(sorted(table))}): as "
            "configured; `python -m bert_jax.preflight` says whether it fits")
  applied, kept = [], []
  explicit = set(explicit)
  for field, value in knobs.items():
    if field in explicit:
      kept.append(f"{field}={fields.get(config, field)!r} (your flag)")
      continue
    if recorded is not None and field in recorded:
      value = recorded[field]
      if value != fields.get(config, field):
        _set(config, field, value)
      kept.append(f"{field}={value!r} (the workdir's)")
      continue
    _set(config, field, _typed(config, field, value))
    applied.append(f"--config.{field}={fields.get(config, field)}")
  line = f"layout for {slice_name}: " + (" ".join(applied) if applied else "nothing to apply")
  return line + (f"; kept {', '.join(kept)}" if kept else "")


def explicit_fields(argv: Iterable[str]) -> list[str]:
  """The config fields a command line sets: '--config.mesh.fsdp=4' -> 'mesh.fsdp'."""
  return [a.split("=", 1)[0].removeprefix("--config.") for a in argv
          if a.startswith("--config.")]
