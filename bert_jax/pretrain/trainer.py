"""BERT-family pretraining: one straight-through function in labelled sections.

`train_and_evaluate(config, workdir)` reads top to bottom: mesh, data, model
and optimizer, shardings, step, restore, eval, loop. The per-step math is the
pure module-level `train_step`; everything about placement lives in
bert_jax.training.sharding, checkpoint layout in bert_jax.run.checkpoint.

Where a run starts, decided once (in "restore"):
  1. the latest complete checkpoint in workdir/checkpoints (auto-resume), else
  2. config.init_checkpoint through bert_jax.convert.load_pretrained, else
  3. random initialisation from config.seed.

Validate everything, then write: the "validate" section judges the whole
config without data first (so a typo is refused at once, before any corpus
work) and asks the workdir, reading only, whether it would refuse the run (a
live run's lock, a record this config contradicts: workdir.check_before_data),
then prepares the run's data as one object
(data_pipeline.prepare.PretrainingData: vocabulary, every phase's corpus read
and checked, kept for the inputs and eval sets, which talk to it only), checks
the network against the vocabulary and reads a new run's init checkpoint, all
inside errors.judging_input(): any refusal there is one line and leaves the
workdir untouched, so the corrected command on the same --workdir just works.
"""

import contextlib
import functools
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from bert_jax import errors
from bert_jax.model import encoder as model_lib
from bert_jax.pretrain import cost
from bert_jax.pretrain import losses
from bert_jax.pretrain import phases
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.run import batch_log
from bert_jax.run import checkpoint
from bert_jax.run import metrics_io
from bert_jax.run import workdir as workdir_lib
from bert_jax.training import loop as train_loop
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from data_pipeline import prepare as prepare_lib
from data_pipeline import specs
from host import paths


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains (resuming when the workdir has checkpoints) and returns the final eval metrics.

  A run stopped by SIGTERM or a pod preemption saves its step and returns;
  bert_jax.run.preemption.was_preempted() then tells bert_jax.main to exit with 143.
  """
  # ------------------------------------------------------------- validate
  with errors.judging_input():  # every ValueError here is a refusal of the input
    mesh, _ = state_lib.setup_mesh(config)
    # Everything that needs no data first: a typo must not wait for the embedded corpus's
    # harvest. The phases are decided once, here.
    pretrain_steps.check_config(config, mesh)
    run_phases = phases.of(config)
    # Nor may a busy workdir, or one whose record this config contradicts (read only; the
    # lock is taken below, after the data, before the first write).
    workdir_lib.check_before_data(workdir, config, pretrain_steps.network(config, None),
                                  vocab_file=config.data.vocab_file or None,
                                  spm_model_file=config.data.spm_model_file or None)
    # The run's data, once: the vocabulary (for the embedded corpus, made on first use),
    # every phase's corpus read and checked, kept for the inputs and eval sets.
    pretraining_data = prepare_lib.PretrainingData.prepare(
        run_phases, jax.process_index(), jax.process_count(), batch_size=config.batch_size,
        eval_batch_size=config.eval_batch_size, total_steps=config.total_steps)
    bert_config = pretrain_steps.network(config, pretraining_data.vocab_size)
    init = None
    if config.init_checkpoint and not paths.exists(paths.join(workdir, checkpoint.CHECKPOINT_DIR)):
      init = _read_init_checkpoint(config, bert_config)  # a new run's start, read before writing

  # -------------------------------------------------------------- workdir
  previous = workdir_lib.previous_config(workdir)  # read only: the total a resume changes
  lock = workdir_lib.open_workdir(
      workdir, config, bert_config, vocab_file=pretraining_data.vocab_file or None,
      spm_model_file=pretraining_data.spm_model_file or None,
      data=pretraining_data.fingerprint)
  with contextlib.ExitStack() as cleanup:  # run in reverse order, whatever fails
    if lock is not None:
      cleanup.callback(lock.release)

    # --------------------------------------------------------------- data
    def make_input(phase: phases.Phase, data_state: dict[str, Any] | None):
      """`phase`'s input at `data_state`'s position when of that phase, or of the phase
      before when it read the same data (phases.continues), else at its start; on the devices."""
      before = [p for p in run_phases if p.index == phase.index - 1]
      if (data_state is not None and before and data_state.get("phase") == before[0].index
          and phases.continues(before[0], phase)):
        data_state = {"continue": True, "input": data_state["input"]}
      return sharding.DevicePrefetch(pretraining_data.train_input(phase.index, data_state), mesh)

    # ------------------------------------ model, optimizer, shardings, step
    first = run_phases[0]
    built: dict[tuple, pretrain_steps.Programs] = {}

    def programs_for(phase: phases.Phase) -> pretrain_steps.Programs:
      """The steps of `phase`'s network (the run's, or with the phase's RoPE thetas: the
      same parameters), built once per distinct network."""
      key = tuple(sorted(phase.network.items()))
      if key not in built:
        built[key] = pretrain_steps.build(
            config, pretrain_steps.phase_network(bert_config, phase), mesh,
            seq_len=first.data.max_seq_length,
            predictions=pretraining_data.max_predictions(first.index))
      return built[key]

    for phase in run_phases:  # every network the run trains, before the mesh is activated
      programs_for(phase)
    programs = programs_for(first)
    model, tx, layout = programs.model, programs.tx, programs.layout
    init_rng, dropout_rng = pretrain_steps.keys(config)
    logging.info("%s", cost.describe(cost.run_flops(config, bert_config, layout.abstract_params),
                                     jax.devices()[0].device_kind, jax.device_count(), 0.4,
                                     config.peak_tflops_per_device))
    cleanup.enter_context(sharding.activate(mesh, programs.rules))

    # ------------------------------------------------------------- restore
    manager = train_loop.open_manager(cleanup, workdir, config.checkpoint)
    load_init = (functools.partial(_load_init_checkpoint, config, bert_config, init)
                 if config.init_checkpoint else None)
    state, data_state = state_lib.start(manager, layout, model, tx, init_rng, load_init,
                                        config.init_checkpoint)
    step = int(state.step)
    programs = programs_for(phases.at(run_phases, step))  # a resume in a later phase
    state = state.replace(apply_fn=programs.model.apply, tx=programs.tx)  # its static fields
    if previous and step and previous.get("total_steps", config.total_steps) != config.total_steps:
      _announce_new_total(config, previous["total_steps"], step, programs.lr_schedule)
    # What each step read (unmasked-batch fingerprints): ablations check runs against it.
    batches = batch_log.BatchLog(workdir, step, process_index=jax.process_index(),
                                 process_count=jax.process_count())
    cleanup.callback(batches.close)

    # ---------------------------------------------------------------- eval
    # eval/*: the fixed 15% held-out masks; eval_own/*: the same pairs masked like training.
    eval_kinds = ("eval", "eval_own") if config.data.eval.own_masking else ("eval",)

    def evaluate(at_step: int) -> dict[str, float]:
      """Held-out metrics at `at_step`; a step metrics.jsonl already has is not redone."""
      done = loop.writer.recorded(at_step)
      if "eval/mlm_loss" in done:
        return {k: v for k, v in done.items() if k.split("/")[0] in eval_kinds}
      at_phase = phases.at(run_phases, min(at_step, config.total_steps - 1))
      at = at_phase.index
      result = {}
      for kind in eval_kinds:
        totals: dict[str, float] = {}
        eval_step = programs_for(at_phase).eval_step
        for local in pretraining_data.eval_batches(kind, at):
          sums = jax.device_get(eval_step(state.params, sharding.global_batch(local, mesh)))
          for k, v in sums.items():
            totals[k] = totals.get(k, 0.0) + float(v)
        result.update({f"{kind}/{k}": float(v) for k, v in
                       losses.pretraining_metrics(totals).items() if k != "nsp_loss"})
      loop.writer.write(at_step, result)
      logging.info("held-out at step %d: %s", at_step,
                   " ".join(f"{k.removeprefix('eval/')} {v:.4f}" for k, v in result.items()))
      return result

    # ---------------------------------------------------------------- loop
    loop = train_loop.Loop(cleanup, workdir, manager, start_step=step,
                           total_steps=config.total_steps, log_every=config.log_every_steps,
                           save_every=config.checkpoint.every_steps,
                           skip_nonfinite=config.skip_nonfinite_steps)
    phase = phases.at(run_phases, step)
    data = make_input(phase, data_state)
    cleanup.callback(lambda: data.close())  # the input of the phase running at the end
    peak = metrics_io.peak_flops(config.peak_tflops_per_device)
    result = evaluate(step)

    while step < config.total_steps:
      if step >= phase.end:  # the next phase: longer sequences, another batch size, ...
        handover = {"phase": phase.index, "input": data.get_state()}
        data.close()
        phase = phases.at(run_phases, step)
        data = make_input(phase, handover)
        programs = programs_for(phase)
        state = state.replace(apply_fn=programs.model.apply, tx=programs.tx)  # its static fields
        logging.info("step %d: %s", step, phases.describe(phase))
      local, batch = next(data)
      tokens = local["input_ids"].size * jax.process_count()
      state, metrics = programs.train_step(state, batch, dropout_rng)
      if step + 1 < phase.end:
        data.fetch_next()  # batch n+1 is read and placed while step n computes
      loop.step_metrics.settle()  # the previous step's, fetched while this one computes
      step += 1
      batches.add(step, data.last_fingerprint, local)
      # MFU from the logged step's real predictions (this process's share, scaled to the
      # global batch): it counts predictions made, not the prediction slots P.
      due = loop.after_step(
          step, metrics, tokens=tokens,
          learning_rate=lambda: float(programs.lr_schedule(step - 1)),
          flops=lambda: cost.step_flops(
              bert_config, layout.abstract_params, sequences=phase.batch_size,
              seq_len=local["input_ids"].shape[1],
              predictions=float(np.sum(local["masked_lm_weights"])) * jax.process_count()),
          peak=peak)
      if due.save:
        train_loop.save(manager, step, state, {"phase": phase.index, "input": data.get_state()},
                        logs=(batches, loop.writer))
      if due.stop:
        train_loop.preempted(step)
        break
      if step % config.eval_every_steps == 0 and step < config.total_steps:
        result = evaluate(step)
    loop.step_metrics.settle()
    if step >= config.total_steps:
      result = evaluate(step)
  return result


def _announce_new_total(config: ml_collections.ConfigDict, old_total: int, step: int,
                        lr_schedule: Any) -> None:
  """One line: what a resume's new total_steps does to the schedules at the resume step
  (they follow the new end: the learning rate, the masking ratio and phase 2's start jump)."""
  _, old_schedule = pretrain_steps.optimizer(config, old_total)
  spec = specs.masking_spec(config.data)
  masking = ""
  if spec.schedule != "constant":
    masking = (f"; masking ratio {spec.ratio_at(step, old_total):.4g} -> "
               f"{spec.ratio_at(step, config.total_steps):.4g}")
  logging.warning("total_steps %d -> %d, resuming at step %d: learning rate %.3g -> %.3g%s",
                  old_total, config.total_steps, step, float(old_schedule(step)),
                  float(lr_schedule(step)), masking)


def _read_init_checkpoint(config: ml_collections.ConfigDict,
                          bert_config: model_lib.BertConfig) -> Any:
  """config.init_checkpoint's params, checked against this run's network."""
  from bert_jax import convert  # pylint: disable=g-import-not-at-top  # only needed here
  # Padded like this model's table (an HF or TF checkpoint holds the true vocabulary).
  loaded_config, loaded, _ = convert.load_pretrained(
      config.init_checkpoint, target="pretraining", allow_missing_heads=True,
      vocab_multiple=bert_config.vocab_multiple)
  state_lib.check_architecture(loaded_config, bert_config,
                               f"config.init_checkpoint={config.init_checkpoint!r}")
  return dict(loaded, bert=state_lib.stack_if_scanned(loaded["bert"], bert_config))


def _load_init_checkpoint(config: ml_collections.ConfigDict, bert_config: model_lib.BertConfig,
                          init: Any, fresh: Any) -> Any:
  """`fresh` params with everything config.init_checkpoint holds (`init`, read by the
  validation, or read now) loaded over them."""
  loaded = init if init is not None else _read_init_checkpoint(config, bert_config)
  return state_lib.merge_params(fresh, loaded)  # heads absent from it keep their init
