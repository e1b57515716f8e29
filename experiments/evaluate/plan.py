"""The suite's plan: every member's complete fine-tuning config, checked, counted, ordered, recorded.

`members()` turns a suite config (experiments/configs/suites.py) and the command's
flags into one finetune.py config per member, in this order of precedence: the
task's own config, the suite's protocol, the member's fields (SQuAD's 2 epochs, its
data, its `settings`), then the flags (--seeds, --epochs, ...), which override all.
Everything is checked before anything is written: the suite's fields, each member's
data and the checkpoint; a bad one is one line naming the field.

DIR/suite.json is the record: per member its config, what the report needs (metrics,
paper figures, how seeds are combined) and its data counts; it is written once per
member and every later run is checked against it (`record`), since the trainer lets a
resumed run change init_checkpoint or num_epochs and would otherwise mix two
protocols in one summary. Adding learning rates or seeds is allowed: the trainer
resumes the finished runs and adds the rest.
"""

import dataclasses
import json
import re
from typing import Any

import ml_collections

from bert_jax import errors
from bert_jax.convert import load as convert_load
from bert_jax.finetune.kinds import registry
from bert_jax.run import workdir as workdir_lib
from experiments.configs import finetune as finetune_configs
from experiments.configs import suites
from host import paths

RECORD_FILE = "suite.json"
FORMAT = 1  # of suite.json
# What a recorded member may change on a later run: which runs its sweep holds.
GROWS = ("learning_rates", "seeds")
RESERVED = ("plots",)  # names of the report's own outputs in DIR
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_FIGURE_KEYS = {"model", "metric", "value", "split", "paper", "table", "row"}


@dataclasses.dataclass
class Flags:
  """The command's overrides of the suite (None / empty: the suite's)."""
  init_checkpoint: str = ""
  glue_dir: str = ""
  squad_dir: str = ""
  seeds: tuple[int, ...] | None = None
  learning_rates: tuple[float, ...] | None = None
  epochs: int | None = None
  batch_size: int | None = None
  max_train_examples: int | None = None
  max_dev_examples: int | None = None
  restarts: str | None = None
  only: tuple[str, ...] = ()  # run these members only (the report shows every recorded one)


@dataclasses.dataclass
class Member:
  """One member of the suite: its name, the suite's entry, its complete config and workdir."""
  name: str
  spec: ml_collections.ConfigDict  # the suite's member entry (suites.member fields)
  config: ml_collections.ConfigDict  # a complete finetune.py config
  workdir: str  # DIR/<name>: the trainer's sweep workdir
  rule: str  # "median": the rate by the median over seeds; "best": the best (rate, seed)


def _refuse(message: str) -> errors.UsageError:
  return errors.UsageError(message)


def check_suite(suite: ml_collections.ConfigDict) -> None:
  """Refuses a suite config that is not one (fields, member names, figures), before anything."""
  if suite.get("family") != "suite":
    raise _refuse(f"--suite: config.family={suite.get('family')!r}, expected 'suite' (an "
                  "experiments/configs/suites.py config)")
  if not suite.members:
    raise _refuse(f"suite {suite.name!r} has no members")
  known = set(suites.member("custom").keys())
  for name, spec in suite.members.items():
    where = f"suite {suite.name!r} member {name!r}"
    if not _NAME.match(name) or name in RESERVED:
      raise _refuse(f"{where}: a member name is lower-case letters, digits, '_', '-', '.' "
                    f"and not one of {RESERVED} (it names a workdir)")
    unknown = sorted(set(spec.keys()) - known)
    if unknown:
      raise _refuse(f"{where}: unknown fields {unknown}; a member has {sorted(known)}")
    if spec.task not in finetune_configs.TASKS:
      raise _refuse(f"{where}: task {spec.task!r} is not a finetune.py task "
                    f"({', '.join(finetune_configs.TASKS)})")
    for figure in spec.paper:
      if set(figure) != _FIGURE_KEYS or figure["split"] not in ("dev", "test"):
        raise _refuse(f"{where}: paper figure {figure} needs exactly {sorted(_FIGURE_KEYS)} "
                      "with split 'dev' or 'test' (suites._figure makes one)")


def restart_members(suite: ml_collections.ConfigDict, restarts: str) -> set[str]:
  """The members reported as their best (rate, seed): protocol.restarts resolved."""
  if restarts in ("", "none"):
    return set()
  if restarts == "all":
    return set(suite.members)
  if restarts == "small":
    return {n for n, s in suite.members.items() if s.small}
  names = {n.strip() for n in restarts.split(",") if n.strip()}
  unknown = sorted(names - set(suite.members))
  if unknown:
    raise _refuse(f"--restarts names {unknown}, which are not members of suite "
                  f"{suite.name!r} ({', '.join(suite.members)}); or use 'small' or 'all'")
  return names


def _data(config: ml_collections.ConfigDict, spec: ml_collections.ConfigDict, flags: Flags,
          name: str) -> None:
  """Points the member's config at its data ("glue:DIR", "squad:VERSION" or its own)."""
  source, _, where = spec.data.partition(":")
  if source == "glue":
    if not flags.glue_dir:
      raise _refuse(f"member {name!r} reads GLUE ({where}/): give --glue_dir=DIR (the GLUE "
                    "download, with CoLA/, SST-2/, ...) or --glue_dir=tfds:DIR")
    tfds = flags.glue_dir.startswith("tfds:")
    config.task.data_dir = flags.glue_dir if tfds else paths.join(flags.glue_dir, where)
    if not tfds and not paths.exists(config.task.data_dir):
      raise _refuse(f"member {name!r}: {config.task.data_dir} does not exist (--glue_dir)")
  elif source == "squad":
    if not flags.squad_dir or flags.squad_dir.startswith("tfds:"):
      raise _refuse(f"member {name!r} reads SQuAD {where}: give --squad_dir=DIR holding "
                    f"train-{where}.json and dev-{where}.json (tfds is not read for SQuAD)")
    for split in ("train", "dev"):
      path = paths.join(flags.squad_dir, f"{split}-{where}.json")
      if not paths.exists(path):
        raise _refuse(f"member {name!r}: {path} does not exist (--squad_dir)")
      config.task[f"{split}_file"] = path
  elif source:
    raise _refuse(f"member {name!r}: data={spec.data!r}; expected 'glue:DIR', "
                  "'squad:VERSION' or ''")


def finetune_config(name: str, spec: ml_collections.ConfigDict,
                    protocol: ml_collections.ConfigDict, flags: Flags
                    ) -> ml_collections.ConfigDict:
  """The member's complete finetune.py config (precedence: the module docstring's)."""
  config = finetune_configs.get_config(spec.task)
  p = protocol
  config.batch_size = p.batch_size
  config.num_epochs = spec.num_epochs or p.num_epochs
  config.learning_rates = tuple(float(lr) for lr in p.learning_rates)
  config.seeds = tuple(int(s) for s in p.seeds)
  config.task.max_train_examples = p.max_train_examples
  config.task.max_dev_examples = p.max_dev_examples
  if p.max_seq_length:
    config.max_seq_length = p.max_seq_length
  if spec.data.startswith("glue:"):
    config.task.predict_test = p.predict_test
  _data(config, spec, flags, name)
  try:
    config.update_from_flattened_dict(workdir_lib.flatten(spec.settings))
  except (KeyError, AttributeError, TypeError) as e:
    raise _refuse(f"member {name!r}: settings {spec.settings.to_dict()} do not fit a "
                  f"finetune.py config: {e}") from None
  for field, value in (("batch_size", flags.batch_size), ("num_epochs", flags.epochs),
                       ("task.max_train_examples", flags.max_train_examples),
                       ("task.max_dev_examples", flags.max_dev_examples)):
    if value is not None:
      config.update_from_flattened_dict({field: value})
  if flags.learning_rates is not None:
    config.learning_rates = tuple(flags.learning_rates)
  if flags.seeds is not None:
    config.seeds = tuple(flags.seeds)
  config.init_checkpoint = flags.init_checkpoint
  return config


def members(suite: ml_collections.ConfigDict, flags: Flags, workdir: str) -> list[Member]:
  """Every member's complete config, checked (nothing is read but file existence)."""
  check_suite(suite)
  if not flags.init_checkpoint:
    raise _refuse("--init_checkpoint is required: the checkpoint every member fine-tunes from")
  if not paths.exists(flags.init_checkpoint):
    raise _refuse(f"--init_checkpoint={flags.init_checkpoint!r} does not exist")
  try:  # its kind, by its files, before suite.json is written (no tensor is read)
    convert_load.checkpoint_kind(flags.init_checkpoint)
  except ValueError as e:
    raise _refuse(f"--init_checkpoint: {e}") from None
  unknown = sorted(set(flags.only) - set(suite.members))
  if unknown:
    raise _refuse(f"--members names {unknown}, not members of suite {suite.name!r} "
                  f"({', '.join(suite.members)})")
  best = restart_members(suite, suite.protocol.restarts if flags.restarts is None
                         else flags.restarts)
  out = []
  for name, spec in suite.members.items():
    if flags.only and name not in flags.only:
      continue
    config = finetune_config(name, spec, suite.protocol, flags)
    if not config.seeds or not config.learning_rates:
      raise _refuse(f"member {name!r}: no seeds or no learning rates to run")
    out.append(Member(name, spec, config, paths.join(workdir, name),
                      "best" if name in best else "median"))
  return out


def counts(member: Member) -> dict[str, Any]:
  """Examples of the member's train and dev splits, read by its task kind (no tokenizing)."""
  with errors.judging_input():
    data = registry.get_kind(member.config.task.kind).read(member.config.task)
  return {"train": len(data.train), "dev": {s: len(e) for s, e in data.dev.items()},
          "test": {s: len(e) for s, e in data.test.items()}}


def cost(member: Member, count: dict[str, Any]) -> float:
  """What orders the members, cheapest first: train tokens over all runs (an upper bound)."""
  c = member.config
  return (count["train"] * c.num_epochs * c.max_seq_length * len(c.learning_rates)
          * len(c.seeds))


def read_record(workdir: str) -> dict[str, Any]:
  """DIR/suite.json ({} when there is none)."""
  path = paths.join(workdir, RECORD_FILE)
  return json.loads(paths.read_text(path)) if paths.exists(path) else {}


def _entry(member: Member, count: dict[str, Any], suite: ml_collections.ConfigDict) -> dict:
  return {"task": member.spec.task, "kind": member.config.task.kind,
          "config": workdir_lib.flatten(member.config), "counts": count, "rule": member.rule,
          "spec": json.loads(member.spec.to_json_best_effort()),
          "protocol": json.loads(suite.protocol.to_json_best_effort())}


def _check_same(name: str, recorded: dict[str, Any], config: ml_collections.ConfigDict,
                workdir: str) -> None:
  """Refuses a member config that differs from the recorded one beyond GROWS."""
  now = workdir_lib.flatten(config)
  for key in sorted(set(recorded) | set(now)):
    if key in GROWS or recorded.get(key) == now.get(key):
      continue
    raise _refuse(f"{paths.join(workdir, RECORD_FILE)}: member {name!r} was run with {key}="
                  f"{recorded.get(key)!r}, now {now.get(key)!r}; its finished runs would mix "
                  "two protocols: use another --workdir, or the recorded value")
  runs = lambda c: len(c["learning_rates"]) * len(c["seeds"])
  if (runs(recorded) == 1) != (runs(now) == 1):
    raise _refuse(f"member {name!r}: its workdir holds {runs(recorded)} run(s) and now "
                  f"{runs(now)} are asked; one run sits in the member's workdir itself and a "
                  "sweep in lr*_seed*/ subdirectories: use another --workdir")


def has_finished_runs(workdir: str, name: str) -> bool:
  """Whether member `name` has a finished run (its result.json, in the member's directory
  or a sweep's lr*_seed*/): what a recorded protocol binds. A member recorded by a start
  that failed before any run finished is planned afresh."""
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top  # only when recorded
  member = paths.join(workdir, name)
  return bool(paths.glob(paths.join(member, trainer.RESULT_FILE))
              or paths.glob(paths.join(member, "*", trainer.RESULT_FILE)))


def make_record(workdir: str, suite: ml_collections.ConfigDict, planned: list[Member]
                ) -> tuple[dict[str, Any], bool]:
  """(the record, whether it changed): `planned` checked against DIR/suite.json, the new
  members' data counted, the members ordered cheapest first. Nothing is written: a
  refusal here leaves DIR as it was. A member already recorded keeps its counts and its
  place, so a re-run runs the members in the same order."""
  before = read_record(workdir)
  entries = dict(before.get("members", {}))
  fresh = {}
  for m in planned:
    if m.name in entries and has_finished_runs(workdir, m.name):
      _check_same(m.name, entries[m.name]["config"], m.config, workdir)
      count = entries[m.name]["counts"]
    elif m.name in entries and workdir_lib.flatten(m.config) == entries[m.name]["config"]:
      count = entries[m.name]["counts"]  # recorded, nothing run yet, the same protocol
    else:
      count = counts(m)
      fresh[m.name] = cost(m, count)
    entries[m.name] = _entry(m, count, suite)
  order = [n for n in before.get("order", []) if n in entries]
  order += sorted(fresh, key=lambda n: (fresh[n], list(suite.members).index(n)))
  content = {"format": FORMAT, "suite": before.get("suite", suite.name), "order": order,
             "members": {n: entries[n] for n in order},
             "paper_averages": json.loads(suite.paper_averages.to_json_best_effort())}
  return content, content != before


def write_record(workdir: str, content: dict[str, Any]) -> None:
  """Writes DIR/suite.json (atomically: a kill leaves the old record or the new one)."""
  paths.write_atomic(paths.join(workdir, RECORD_FILE),
                     json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def ordered(planned: list[Member], content: dict[str, Any]) -> list[Member]:
  """`planned` in the record's order (cheapest first)."""
  rank = {n: i for i, n in enumerate(content["order"])}
  return sorted(planned, key=lambda m: rank[m.name])
