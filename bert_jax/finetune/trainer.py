"""Fine-tuning: one run of one task, any checkpoint, the pretraining trainer's machinery.

A sweep of runs is bert_jax.finetune.sweep's; what a run reads is prepared once by
bert_jax.finetune.prepare. `finetune_run(config, workdir)` is one run, top to bottom in sections: mesh,
checkpoint and tokenizer, task data, model and optimizer, shardings, step,
restore, eval, loop. Mesh set-up, parameter/optimizer sharding, gradient
accumulation, the update and where a run starts (resume > init_checkpoint >
random) are bert_jax.training.state's, shared with pretraining; checkpoints are
bert_jax.run.checkpoint's; metrics.jsonl and TensorBoard are bert_jax.run.metrics_io's.
Everything about the task -- its head, reader, features, loss and the weight
it is averaged over, kept outputs, metrics and prediction files -- comes from
its kind (kinds/task_kind.TaskKind, found by config.task.kind in kinds/registry.py): no
kind is named here.

Speed (issues 20, 50): a batch's examples, those of fixed padding, are packed into as few
rows as hold them (config.padding "packed", features/packed.py), or the batch is padded to
a length bucket ("buckets", features/buckets.py; config.group_by_length sorts its rows by
length; "fixed" keeps max_seq_length); the optimizer, shardings and
jitted steps are built once per sweep (steps.build), with the learning rate a
leaf of the optimizer state and the seed an argument, so each bucket compiles
once for all of a sweep's runs; the data is featurised once (prepare.py); saves
happen only where config.checkpoint asks, at the end and to best/, in the
background.

A run's workdir holds, beside pretraining's layout (config.json,
bert_config.json, vocab.txt, checkpoints/, metrics.jsonl):
  predictions/<step>/     dev predictions of every evaluation (and, for a new
                          best one, the unlabelled test splits' files, e.g.
                          GLUE's leaderboard TSVs)
  best/                   the best evaluation by the task's main dev metric: its
                          params (a workdir bert_jax.convert loads), metrics.json
                          and predictions
  result.json             final and best dev metrics
"""

import contextlib
import copy
import functools
import json
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from bert_jax.finetune.features import buckets as buckets_lib
from bert_jax.finetune.readers import splits
from bert_jax.finetune import prepare as prepare_lib
from bert_jax.finetune import steps
from bert_jax.model import encoder as model_lib
from bert_jax.run import checkpoint
from bert_jax.run import workdir as workdir_lib
from bert_jax.training import loop as train_loop
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from host import paths

TrainState = state_lib.TrainState
BEST_DIR = "best"
RESULT_FILE = "result.json"


def finetune_run(config: ml_collections.ConfigDict, workdir: str,
                 prepared: "prepare_lib.Prepared | None" = None, *,
                 locked: bool = False) -> dict[str, dict]:
  """Fine-tunes one (learning rate, seed); resumes when the workdir has checkpoints.

  `prepared` (from prepare.prepare(config)) saves re-reading the checkpoint and
  re-featurising the data when a sweep runs several seeds or learning rates;
  `locked`: the caller (a sweep) holds the lock of a workdir containing this one.

  Returns {"final": dev metrics of the last evaluation, "best": of the best one,
  "preempted": whether SIGTERM stopped it (after saving), "padding": its train tokens
  (buckets.padding_stats), "compiled": the sweep's programs so far (counts and shapes)}.
  """
  # ----------------------------------------------------------------- mesh
  mesh, rules = state_lib.setup_mesh(config)
  prepare_lib.check_config(config, mesh)

  # ------------------------------------- checkpoint, tokenizer, task data
  prepared = prepared or prepare_lib.prepare(config)
  task, bert_config, loaded = prepared.task, prepared.bert_config, prepared.loaded
  num_train = len(task.train.features["input_ids"])
  steps_per_epoch = num_train // config.batch_size
  if steps_per_epoch == 0:
    raise ValueError(f"{num_train} training features are fewer than one batch "
                     f"(config.batch_size={config.batch_size})")
  total_steps = steps_per_epoch * config.num_epochs
  logging.info("%s: %d train features, %d steps/epoch, %d steps; dev %s", task.name, num_train,
               steps_per_epoch, total_steps,
               {s: len(d.features["input_ids"]) for s, d in task.dev.items()})

  # ----------------------------------------------------- model and optimizer
  # The optimizer, shardings and jitted steps are the sweep's (steps.build): the seed
  # is an argument and the learning rate a leaf of the optimizer state, set below.
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(config.seed))
  model = task.model

  # ------------------------------------------------------------- workdir
  spm_model_file = prepared.spm_model_file or None
  vocab_file = None if spm_model_file else prepared.tokenizer.vocab_file
  lock = workdir_lib.open_workdir(workdir, config, bert_config, vocab_file=vocab_file,
                                  spm_model_file=spm_model_file, take_lock=not locked)
  with contextlib.ExitStack() as cleanup:  # run in reverse order, whatever fails
    if lock is not None:
      cleanup.callback(lock.release)

    # ------------------------------------------------- shardings and steps
    # Built before the mesh is active: make_layout places arrays on the concrete mesh.
    programs = steps.build(config, task, prepared.programs, mesh, rules, total_steps)
    cleanup.enter_context(sharding.activate(mesh, rules))
    layout, tx = programs.layout, programs.tx
    batches = buckets_lib.TrainBatches(
        task.train.features, seed=config.seed, batch_size=config.batch_size,
        buckets=programs.buckets, grouped=config.group_by_length,
        window_batches=config.bucket_window_batches,
        pack=((sharding.data_parallel_size(mesh), config.grad_accum_steps) if programs.packed
              else None))
    padding = batches.padding(total_steps)
    logging.info("padding %s to %s%s: %.1f%% of train tokens are padding (fixed padding: "
                 "%.1f%%)", config.padding, programs.buckets,
                 ", grouped by length" if config.group_by_length else "",
                 100 * padding["pad_fraction"], 100 * padding["fixed_pad_fraction"])

    # ------------------------------------------------------------- restore
    manager = train_loop.open_manager(cleanup, workdir, config.checkpoint)
    load_init = None
    if loaded is not None:
      load_init = functools.partial(_merge_pretrained, loaded, bert_config, task.head_name,
                                    config.init_checkpoint)
    state, _ = state_lib.start(manager, layout, model, tx, init_rng, load_init,
                               config.init_checkpoint)
    # Set on a resumed state too: it is this run's rate whatever the checkpoint held.
    state = steps.with_learning_rate(state, config.optimizer.learning_rate, layout)
    step = int(state.step)
    best = _Best(workdir, config, bert_config, vocab_file, spm_model_file)
    cleanup.callback(best.close)

    # ---------------------------------------------------------------- eval
    loop = train_loop.Loop(cleanup, workdir, manager, start_step=step, total_steps=total_steps,
                           log_every=config.log_every_steps,
                           save_every=config.checkpoint.every_steps,
                           skip_nonfinite=config.skip_nonfinite_steps)

    def evaluate(at_step: int) -> dict[str, float]:
      result, predictions = {}, {}
      for split, dev in task.dev.items():
        outputs = steps.predict(programs, state.params, dev.features, config.eval_batch_size, mesh)
        metrics, predictions[split] = task.score(dev, outputs)
        prefix = "dev" if len(task.dev) == 1 else split  # MNLI: dev_matched, dev_mismatched
        result.update({f"{prefix}/{k}": float(v) for k, v in metrics.items()})
      loop.writer.write(at_step, result)
      logging.info("dev at step %d: %s", at_step,
                   " ".join(f"{k} {v:.4f}" for k, v in result.items()))
      out = paths.join(workdir, "predictions", str(at_step))
      if jax.process_index() == 0:
        for split, rows in predictions.items():
          task.write_predictions(out, split, rows)
      score = result[main_key(result, task.main_metric)]
      if task.test and best.improves(score):
        # Unlabelled test splits (GLUE's leaderboard files) are predicted only by a new best
        # evaluation, so best/predictions always holds those of the best checkpoint.
        for split, test in task.test.items():
          outputs = steps.predict(programs, state.params, test.features,
                                  config.eval_batch_size, mesh)
          if jax.process_index() == 0:
            task.write_test(test, outputs, out)
      best.update(at_step, score, result, state.params, out)
      return result

    # ---------------------------------------------------------------- loop
    eval_every = config.eval_every_steps or steps_per_epoch
    result = None
    stop = False
    if step == 0 and config.eval_at_start:
      result = evaluate(step)
    while step < total_steps:
      local = batches.batch(step, task.train_features, jax.process_index(), jax.process_count())
      programs.train_lengths.add(local["input_ids"].shape[1])
      if programs.packed:  # one program per packed row count
        programs.train_rows.add(local["input_ids"].shape[0])
      state, metrics = programs.train_step(state, sharding.global_batch(local, mesh), dropout_rng)
      step += 1
      # Saved only where the config asks (every_steps, the end, a stop) and to best/: a run
      # resumed from before an evaluation redoes it exactly (same steps, deterministic eval).
      due = loop.after_step(
          step, metrics, tokens=local["input_ids"].size * jax.process_count(),
          learning_rate=lambda: config.optimizer.learning_rate * float(
              programs.schedule(step - 1)))
      stop = due.stop
      evaluated = step % eval_every == 0 or step == total_steps
      if evaluated:
        result = evaluate(step)
      if due.save:
        train_loop.save(manager, step, state, {"step": step}, logs=(loop.writer,))
        if evaluated and jax.process_index() == 0:
          # Written after the evaluation it reports; on resume it is re-read.
          write_json(paths.join(workdir, RESULT_FILE),
                      {"final": result, "best": best.metrics, "step": step})
      if due.stop:
        train_loop.preempted(step)
        break
    if result is None and not stop:
      # Resumed after the last step: its evaluation may not have reached result.json.
      result = _read_json(paths.join(workdir, RESULT_FILE)).get("final") or evaluate(step)
    compiled = {**programs.compiled(), "train_lengths": sorted(programs.train_lengths),
                "train_rows": sorted(programs.train_rows),
                "eval_shapes": sorted(programs.eval_shapes)}
    logging.info("compiled so far in this sweep: %d train programs (lengths %s), %d eval "
                 "programs ((batch, length) %s)", compiled["train"], compiled["train_lengths"],
                 compiled["eval"], compiled["eval_shapes"])
  return {"final": result or {}, "best": best.metrics, "preempted": stop, "padding": padding,
          "compiled": compiled}


def _merge_pretrained(loaded: tuple, bert_config: model_lib.BertConfig, head_name: str,
                      source: str, fresh: dict) -> dict:
  """`fresh` task-model params with the checkpoint's encoder (and task head, if any) in."""
  loaded_config, encoder, found_heads, _ = loaded
  state_lib.check_architecture(loaded_config, bert_config, f"config.init_checkpoint={source!r}")
  params = dict(fresh)
  params["bert"] = state_lib.merge_params(
      fresh["bert"], state_lib.stack_if_scanned(encoder, bert_config), "bert")
  if head_name in found_heads:
    head = found_heads[head_name]
    for leaf, value in sorted(fresh[head_name].items(), key=lambda kv: kv[0] != "kernel"):
      if leaf not in head or np.shape(head[leaf]) != np.shape(value):
        raise ValueError(
            f"config.init_checkpoint={source!r} holds a task head {head_name!r} whose {leaf} "
            f"has shape {np.shape(head.get(leaf))}, but this task's head needs "
            f"{np.shape(value)} (a different number of labels?); fine-tune from the "
            "pretrained checkpoint instead, or export the encoder alone")
    params[head_name] = jax.tree.map(lambda v: np.asarray(v, np.float32), head)
    logging.info("loaded the task head %r from %s", head_name, source)
  return params


class _Best:
  """The best evaluation so far by the main dev metric: params, metrics, predictions.

  Kept in workdir/best as a workdir of its own (bert_config.json, vocab.txt or spm.model,
  checkpoints/<step>), so bert_jax.convert and this trainer's init_checkpoint
  load it; metrics.json records the score, so a resumed run keeps comparing
  against it.
  """

  def __init__(self, workdir: str, config, bert_config, vocab_file: str | None,
               spm_model_file: str | None = None):
    self.dir = paths.join(workdir, BEST_DIR)
    best_ckpt = copy.deepcopy(config.checkpoint)
    with best_ckpt.unlocked():
      best_ckpt.keep, best_ckpt.keep_period = 1, 0
    # Its own barrier names: it saves the run's step while the run's manager may too.
    self.manager = checkpoint.make_manager(self.dir, best_ckpt, barrier_prefix="best")
    if jax.process_index() == 0:
      workdir_lib.write_run_files(self.dir, config, bert_config, vocab_file=vocab_file,
                                  spm_model_file=spm_model_file)
    record = _read_json(paths.join(self.dir, "metrics.json"))
    # Only trust a record whose checkpoint is complete (a kill can fall between the two).
    if record and record.get("step") == self.manager.latest_step():
      self.metrics, self.score = record["metrics"], record["score"]
    else:
      self.metrics, self.score = {}, None

  def improves(self, score: float) -> bool:
    """Whether `score` beats the best so far (the first evaluation always does)."""
    return self.score is None or score > self.score

  def update(self, step: int, score: float, metrics: dict, params: Any,
             predictions_dir: str) -> None:
    if not self.improves(score):
      return
    self.score, self.metrics = score, {**metrics, "step": step}
    # Written in the background (config.checkpoint.async_save): training goes on. A kill
    # before it commits leaves metrics.json naming a step the manager lacks: not trusted.
    checkpoint.save(self.manager, step, {"params": params}, {"step": step}, force=True)
    if jax.process_index() == 0:
      target = paths.join(self.dir, "predictions")
      paths.rmtree(target)
      if paths.exists(predictions_dir):
        paths.copy_tree(predictions_dir, target)
      write_json(paths.join(self.dir, "metrics.json"),
                  {"step": step, "score": score, "metrics": self.metrics})

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def write_json(path: str, content: Any) -> None:
  """Writes JSON atomically: a kill leaves the old file or the new one, never half."""
  paths.write_atomic(path, json.dumps(content, indent=2, ensure_ascii=False))


def _read_json(path: str) -> dict:
  return json.loads(paths.read_text(path)) if paths.exists(path) else {}


def main_key(metrics: dict[str, float], main_metric: str) -> str:
  """The key of the main dev metric: "dev/<metric>", or the first dev split's (MNLI
  matched); never the carved test split's, which only reports."""
  return next(k for k in metrics if k.endswith("/" + main_metric)
              and not k.startswith(splits.TEST_SPLIT + "/"))
