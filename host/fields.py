"""Config-field rules declared as data: one table `{field: rule}` per module that owns the
fields, checked by `check` (or `problems`), instead of `if` chains in every trainer.

  at_least(lo)          value >= lo            "must be >= 0"
  greater_than(lo)      value > lo             "must be positive" (lo 0) / "must be > 2"
  in_range(lo, hi, "[)")  lo <= value < hi     "must be in [0, 1)"; ends "[]", "(]", "()"
  one_of(choices)       value in choices       "must be one of ('a', 'b')"
  known(names)          value in names         "='sgd': expected one of ('adamw', ...)"
  satisfies(ok, says)   ok(value)              says
  optional(rule)        None, or what rule allows

A bound may name a sibling field of the same section (in_range(0, "learning_rate")): it
reads "[0, learning_rate]" and compares with that field's value. `says=` replaces a rule's
wording where a module's refusals have always read otherwise (the tests hold them).

A problem reads `{prefix}{field}={value} {says}` (form "=", e.g.
"config.optimizer.warmup_steps=-1 must be >= 0"; a `says` starting with ":" follows the
value directly: "config.optimizer.name='sgd': expected one of (...)") or
`{prefix}{field} {says}, got {value}` (form "got", data_pipeline's wording, e.g.
"data.short_seq_prob must be in [0, 1], got 1.5"). A value shows as repr for strings,
str otherwise. Comparisons are written so that NaN fails every bound.
"""

import dataclasses
from typing import Any, Callable, Literal, Mapping

Form = Literal["=", "got"]


@dataclasses.dataclass(frozen=True)
class Rule:
  """What a field's value must satisfy (`ok(value, section)`), and the words that say so."""
  ok: Callable[[Any, Any], bool]
  says: str


def _bound(bound: Any, section: Any) -> Any:
  """A number, or the value of the sibling field it names."""
  return get(section, bound) if isinstance(bound, str) else bound


def at_least(lo: Any, says: str | None = None) -> Rule:
  """value >= lo."""
  return Rule(lambda v, s: v >= _bound(lo, s), says or f"must be >= {lo}")


def greater_than(lo: Any, says: str | None = None) -> Rule:
  """value > lo; "must be positive" for lo 0 (the project's wording)."""
  return Rule(lambda v, s: v > _bound(lo, s),
              says or ("must be positive" if lo == 0 else f"must be > {lo}"))


def in_range(lo: Any, hi: Any, ends: str = "[]", says: str | None = None) -> Rule:
  """lo <= value <= hi, with `ends` ("[]", "[)", "(]", "()") saying which bounds are in."""
  if ends not in ("[]", "[)", "(]", "()"):
    raise ValueError(f"in_range ends={ends!r}: expected '[]', '[)', '(]' or '()'")

  def ok(v, s):
    low, high = _bound(lo, s), _bound(hi, s)
    return ((low <= v) if ends[0] == "[" else (low < v)) and (
        (v <= high) if ends[1] == "]" else (v < high))
  return Rule(ok, says or f"must be in {ends[0]}{lo}, {hi}{ends[1]}")


def one_of(choices: tuple, says: str | None = None) -> Rule:
  """value in choices."""
  return Rule(lambda v, s: v in choices, says or f"must be one of {choices}")


def known(names: tuple) -> Rule:
  """value in names, worded as the project refuses an unknown name (a task kind, a family,
  an optimizer): "config.optimizer.name='sgd': expected one of ('adamw', ...)"."""
  return one_of(names, says=f": expected one of {names}")


def satisfies(ok: Callable[[Any], bool], says: str) -> Rule:
  """ok(value): a domain no bound says (a path's allowed schemes, say)."""
  return Rule(lambda v, s: ok(v), says)


def optional(rule: Rule) -> Rule:
  """None (the field is off), or what `rule` allows."""
  return Rule(lambda v, s: v is None or rule.ok(v, s), rule.says)


def get(section: Any, field: str) -> Any:
  """section's `field`; a dotted name ("checkpoint.keep") reads a nested section."""
  for part in field.split("."):
    section = section[part]
  return section


def _shown(value: Any) -> str:
  return repr(value) if isinstance(value, str) else str(value)


def problems(section: Any, rules: Mapping[str, Rule], prefix: str = "",
             form: Form = "=") -> list[str]:
  """One line per field of `rules` whose value in `section` breaks its rule, in the
  table's order."""
  found = []
  for field, rule in rules.items():
    value = get(section, field)
    if rule.ok(value, section):
      continue
    if form == "got":
      found.append(f"{prefix}{field} {rule.says}, got {_shown(value)}")
    else:
      space = "" if rule.says.startswith(":") else " "
      found.append(f"{prefix}{field}={_shown(value)}{space}{rule.says}")
  return found


def check(section: Any, rules: Mapping[str, Rule], prefix: str = "", form: Form = "=") -> None:
  """Raises one ValueError naming every field that breaks its rule ("; " between them)."""
  found = problems(section, rules, prefix, form)
  if found:
    raise ValueError("; ".join(found))
