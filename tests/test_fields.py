"""Tests of host/fields.py: each rule's domain and words, and the four tables that use them.

The tables (bert_jax.training.optim, bert_jax.pretrain.steps, bert_jax.finetune.prepare,
data_pipeline.specs) replaced `if` chains; a test per table shows it still covers every
field those chains checked, each refused by name through the module's own check.
"""

import math
import re

import jax
import pytest

from bert_jax.finetune import prepare as finetune_prepare
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.training import optim
from bert_jax.training import sharding
from data_pipeline import specs
from experiments.configs import data as data_configs
from experiments.configs import finetune as finetune_configs
from experiments.configs import pretrain
from host import fields


def _refused(rule, value, section=None, form="="):
  """The problem `rule` finds with `value` as field "x" (of `section`, else alone), or None."""
  section = dict(section or {}, x=value)
  found = fields.problems(section, {"x": rule}, form=form)
  return found[0] if found else None


def test_at_least_passes_its_bound_and_refuses_below_it_and_nan():
  """Fails if at_least(0) refuses 0 or accepts -1 or NaN, or words it otherwise."""
  rule = fields.at_least(0)
  assert _refused(rule, 0) is None and _refused(rule, 5) is None
  assert _refused(rule, -1) == "x=-1 must be >= 0"
  assert _refused(rule, math.nan) == "x=nan must be >= 0"
  assert _refused(fields.at_least(1 << 12), 4095) == "x=4095 must be >= 4096"


def test_greater_than_refuses_its_bound():
  """Fails if greater_than accepts its bound, refuses just above it, or greater_than(0) does
  not read "must be positive" (every existing refusal's words)."""
  assert _refused(fields.greater_than(0), 0) == "x=0 must be positive"
  assert _refused(fields.greater_than(0), 1e-9) is None
  assert _refused(fields.greater_than(2), 2) == "x=2 must be > 2"
  assert _refused(fields.greater_than(2), 3) is None


@pytest.mark.parametrize("ends,inside,outside", [
    ("[]", (0, 0.5, 1), (-0.001, 1.001)),
    ("[)", (0, 0.999), (-0.001, 1)),
    ("(]", (0.001, 1), (0, 1.001)),
    ("()", (0.001, 0.999), (0, 1)),
])
def test_in_range_takes_exactly_the_ends_it_names(ends, inside, outside):
  """Fails if in_range(0, 1, ends) refuses a value inside, or accepts one outside (an end it
  excludes included), or the refusal does not show the interval as written."""
  rule = fields.in_range(0, 1, ends)
  assert [_refused(rule, v) for v in inside] == [None] * len(inside)
  for value in outside:
    assert _refused(rule, value) == f"x={value} must be in {ends[0]}0, 1{ends[1]}"
  assert _refused(rule, math.nan) is not None


def test_in_range_refuses_unknown_ends():
  """Fails if a typo in `ends` is taken for some interval."""
  with pytest.raises(ValueError, match=re.escape("in_range ends='[0, 1]'")):
    fields.in_range(0, 1, "[0, 1]")


def test_a_bound_may_name_a_sibling_field():
  """Fails if a bound naming a sibling field is not that field's value, or the refusal does not
  name the sibling."""
  rule = fields.in_range(0, "peak")
  assert _refused(rule, 0.5, {"peak": 0.5}) is None
  assert _refused(rule, 0.6, {"peak": 0.5}) == "x=0.6 must be in [0, peak]"
  assert _refused(fields.at_least("low"), 1, {"low": 2}) == "x=1 must be >= low"


def test_one_of_and_known():
  """Fails if a member is refused, a non-member accepted, or the two wordings change: one_of's
  "must be one of (...)" and known's "='sgd': expected one of (...)" (unknown names)."""
  assert _refused(fields.one_of(("a", "b")), "a") is None
  assert _refused(fields.one_of(("a", "b")), "c") == "x='c' must be one of ('a', 'b')"
  assert _refused(fields.known(("a", "b")), "b") is None
  assert _refused(fields.known(("a", "b")), "sgd") == "x='sgd': expected one of ('a', 'b')"


def test_satisfies_optional_and_says():
  """Fails if a predicate's verdict is not the rule's, optional refuses None or accepts what its
  rule refuses, or `says` does not replace the wording."""
  rule = fields.satisfies(lambda v: v.startswith("gs://"), "must be a gs:// path")
  assert _refused(rule, "gs://b") is None
  assert _refused(rule, "/tmp") == "x='/tmp' must be a gs:// path"
  assert _refused(fields.optional(fields.at_least(0)), None) is None
  assert _refused(fields.optional(fields.at_least(0)), -1.0) == "x=-1.0 must be >= 0"
  assert _refused(fields.at_least(8, says="is too short"), 4) == "x=4 is too short"


def test_got_form_dotted_fields_and_check():
  """Fails if form "got" is not data_pipeline's wording, a dotted field does not read the nested
  section, or check does not raise every problem, in the table's order, in one line."""
  section = {"a": -1, "inner": {"b": 1.5}}
  rules = {"inner.b": fields.in_range(0, 1), "a": fields.at_least(0)}
  assert fields.problems(section, rules, "data.", form="got") == [
      "data.inner.b must be in [0, 1], got 1.5", "data.a must be >= 0, got -1"]
  with pytest.raises(ValueError) as refusal:
    fields.check(section, rules, "config.")
  assert str(refusal.value) == "config.inner.b=1.5 must be in [0, 1]; config.a=-1 must be >= 0"
  assert fields.check({"a": 0, "inner": {"b": 1}}, rules) is None


# ---- The tables. Each test lists the fields the module's `if` chain checked (a field
# dropped from the table, or added without a test, fails it) and refuses a bad value of
# each through the module's own check, by name.


def _each_refused(check, base, prefix, bad):
  """For each field of `bad`, `check(config)` on `base()` with that one field bad must raise
  a ValueError naming the field (with `prefix`) and its value."""
  for field, value in bad.items():
    config = base()
    config.update_from_flattened_dict({field: value})
    with pytest.raises(ValueError) as refusal:
      check(config)
    message = str(refusal.value)
    assert f"{prefix}{field}" in message and repr(value).strip("'") in message, (field, message)


def _with(config, **values):
  config.update(values)
  return config


def test_optimizer_table_covers_its_fields():
  """Fails if config.optimizer's table leaves out a field optim.check_config checked, refuses
  the tiny variant's defaults, or a bad value of a field is not refused by name; also if the
  one line stops listing problems in the table's order."""
  bad = {"name": "sgd", "learning_rate": -1.0, "end_learning_rate": -1.0, "warmup_steps": -1,
         "decay_power": -1.0, "b1": -1.0, "b2": -1.0, "eps": -1.0, "weight_decay": -1.0,
         "grad_clip_norm": -1.0, "schedule": "step"}
  wsd_bad = {"decay_shape": "step", "decay_steps": -1}
  assert list(optim.RULES) == list(bad) and list(optim.WSD_RULES) == list(wsd_bad)
  base = lambda: pretrain.get_config("tiny").optimizer
  optim.check_config(base())
  _each_refused(optim.check_config, base, "config.optimizer.", bad)

  def wsd():
    config = base()
    config.schedule = "wsd"
    return config
  optim.check_config(wsd())
  _each_refused(optim.check_config, wsd, "config.optimizer.", wsd_bad)
  config = base()
  config.update(b2=1.0, learning_rate=-1.0)
  with pytest.raises(ValueError, match=r"^config.optimizer.learning_rate=-1.0 must be >= 0; "
                     r"config.optimizer.end_learning_rate=.* must be in \[0, learning_rate\]; "
                     r"config.optimizer.b2=1.0 must be in \[0, 1\)$"):
    optim.check_config(config)


def test_pretraining_table_covers_its_fields():
  """Fails if the pretraining table leaves out a field pretrain.steps.check_config checked, or
  a bad value of one is not refused by name before anything else is judged."""
  bad = {"total_steps": -1, "grad_accum_steps": -1, "batch_size": -1, "eval_batch_size": -1,
         "log_every_steps": -1, "eval_every_steps": -1, "checkpoint.every_steps": -1,
         "checkpoint.keep": -1}
  assert list(pretrain_steps.RULES) == list(bad)
  base = lambda: pretrain.get_config("tiny")
  assert fields.problems(base(), pretrain_steps.RULES) == []
  mesh = sharding.make_mesh(base().mesh, jax.devices()[:1])
  _each_refused(lambda c: pretrain_steps.check_config(c, mesh), base, "config.", bad)


def test_finetuning_table_covers_its_fields():
  """Fails if the fine-tuning table leaves out a field finetune.prepare.check_config checked,
  or a bad value of one is not refused by name with the words its tests hold."""
  bad = {"num_epochs": -1, "warmup_fraction": -1.0, "grad_accum_steps": -1,
         "max_seq_length": -1, "bucket_window_batches": -1, "loss_normalizer": "tokens"}
  assert list(finetune_prepare.RULES) == list(bad)
  base = lambda: finetune_configs.get_config("custom")
  assert fields.problems(base(), finetune_prepare.RULES) == []
  mesh = sharding.make_mesh(base().mesh, jax.devices()[:1])
  check = lambda c: finetune_prepare.check_config(c, mesh)
  _each_refused(check, base, "config.", bad)
  with pytest.raises(ValueError, match=r"^config.warmup_fraction=1.0 not in \[0, 1\)$"):
    check(_with(base(), warmup_fraction=1.0))
  with pytest.raises(ValueError, match=r"^config.loss_normalizer='tokens' must be 'batch' or "
                     r"'train_mean'$"):
    check(_with(base(), loss_normalizer="tokens"))


def test_data_table_covers_its_fields():
  """Fails if the data table leaves out a field data_pipeline.specs.validate checked, refuses
  BERT's data defaults, or a bad value of one is not refused by name."""
  bad = {"objective": "mlm", "max_seq_length": -1, "short_seq_prob": -1.0,
         "shuffle_buffer": -1, "heldout_modulus": -1, "tokenized_dir": "http://x",
         "prepare_workers": -1, "shard_bytes": -1, "masking.word_segmentation": "jieba"}
  assert list(specs.RULES) == list(bad)
  assert fields.problems(data_configs.data_config(), specs.RULES) == []
  _each_refused(specs.validate, data_configs.data_config, "data.", bad)
  with pytest.raises(ValueError, match=r"^data.short_seq_prob must be in \[0, 1\], got 1.5$"):
    specs.validate(_with(data_configs.data_config(), short_seq_prob=1.5))
