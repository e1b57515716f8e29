"""bert_jax.pretrain.steps: the one builder of the pretraining step.

The trainer, the preflight and the benchmarks build the step with `steps.build`; these
tests hold the trainer's and the preflight's programs to be one program, and the
config's checks to run once, before any data.
"""

import jax

from bert_jax.preflight import compile as preflight_compile
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.pretrain import trainer as pretrain_lib
from bert_jax.training import sharding
from data_pipeline import prepare as prepare_lib


def test_preflight_lowers_the_very_step_the_trainer_runs(pretrain_test_config, tmp_path,
                                                         monkeypatch):
  """Fails if the trainer does not build its step with steps.build, or if the preflight's
  lowered step (bert_jax.preflight.compile.lower_train_step) differs in any way from the
  trainer's own jitted step lowered at the same shapes (a keyword, a sharding, donation,
  the dropout key's type: the HLO texts must be equal)."""
  built = []
  real = pretrain_steps.build

  def recording(*args, **kwargs):
    built.append((args, kwargs, real(*args, **kwargs)))
    return built[-1][2]

  monkeypatch.setattr(pretrain_steps, "build", recording)
  config = pretrain_test_config(total_steps=1, batch_size=16, **{"grad_accum_steps": 2,
                                                  "skip_nonfinite_steps": True})
  pretrain_lib.train_and_evaluate(config, str(tmp_path / "run"))
  ((_, bert_config, mesh), kwargs, programs), = built
  seq_len, predictions = kwargs["seq_len"], kwargs["predictions"]
  batch = pretrain_steps.abstract_batch(config.batch_size, seq_len, predictions,
                                        programs.layout.batch)
  key = jax.eval_shape(lambda: pretrain_steps.keys(config)[1])
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=programs.layout.replicated)
  with sharding.activate(mesh, programs.rules):
    trainers = programs.train_step.lower(programs.abstract_state(), batch, rng).as_text()
  preflights = preflight_compile.lower_train_step(config, bert_config, mesh, seq_len,
                                                  predictions).lowered.as_text()
  assert len(built) == 2  # the preflight built its step with steps.build too
  assert "donated" in trainers or "tf.aliasing_output" in trainers  # the state is donated
  assert trainers == preflights


def test_the_config_is_checked_once_before_the_data(pretrain_test_config, tmp_path,
                                                    monkeypatch):
  """Fails if the trainer judges its config more than once, or after the data is prepared."""
  order = []
  check, prepare = pretrain_steps.check_config, prepare_lib.PretrainingData.prepare
  monkeypatch.setattr(pretrain_steps, "check_config",
                      lambda *a, **k: order.append("check") or check(*a, **k))
  monkeypatch.setattr(prepare_lib.PretrainingData, "prepare", classmethod(
      lambda cls, *a, **k: order.append("prepare") or prepare.__func__(cls, *a, **k)))
  pretrain_lib.train_and_evaluate(pretrain_test_config(total_steps=1), str(tmp_path / "run"))
  assert order == ["check", "prepare"]
