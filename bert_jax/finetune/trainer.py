"""Fine-tuning: one task, any checkpoint, the pretraining trainer's machinery.

`finetune(config, workdir)` runs every (learning rate, seed) of the config
(each in its own workdir when there are several) and writes summary.json:
per learning rate the median, min, max and standard deviation over seeds of
every dev metric, and the learning rate with the best median main metric.
With config.task.test_fraction a labelled test split is carved out of train
and scored beside dev (test/*): the learning rate is still picked on dev and
the summary reports test at it (summarize).

`finetune_run(config, workdir)` is one run, top to bottom in sections: mesh,
checkpoint and tokenizer, task data, model and optimizer, shardings, step,
restore, eval, loop. Mesh set-up, parameter/optimizer sharding, gradient
accumulation, the update and where a run starts (resume > init_checkpoint >
random) are bert_jax.training.state's, shared with pretraining; checkpoints are
bert_jax.run.checkpoint's; metrics.jsonl and TensorBoard are bert_jax.run.metrics_io's.
Everything about the task -- its head, reader, features, loss and the weight
it is averaged over, kept outputs, metrics and prediction files -- comes from
its kind (task_kind.TaskKind, found by config.task.kind in registry.py): no
kind is named here.

Speed (issue 20): batches are padded to length buckets (finetune/buckets.py;
config.padding "fixed" keeps max_seq_length), the rows of each batch those of
fixed padding (config.group_by_length sorts them by length); the optimizer, shardings and
jitted steps are built once per sweep (steps.build), with the learning rate a
leaf of the optimizer state and the seed an argument, so each bucket compiles
once for all of a sweep's runs; the data is featurised once (prepare); saves
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
import dataclasses
import functools
import json
import statistics
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np

from bert_jax import errors
from bert_jax.finetune import buckets as buckets_lib
from bert_jax.finetune import registry
from bert_jax.finetune import splits
from bert_jax.finetune import steps
from bert_jax.finetune import task_kind
from bert_jax.finetune import tokenization
from bert_jax.model import encoder as model_lib
from bert_jax.run import checkpoint
from bert_jax.run import workdir as workdir_lib
from bert_jax.training import loop as train_loop
from bert_jax.training import optim
from bert_jax.training import sharding
from bert_jax.training import state as state_lib
from host import paths

TrainState = state_lib.TrainState
BEST_DIR = "best"
RESULT_FILE = "result.json"
SUMMARY_FILE = "summary.json"
_VOCAB_CHANGE_FIX = "set config.allow_vocab_change=True if the change is intended"


def finetune(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Every (learning rate, seed) run of `config`; returns and writes the summary.

  The summary's top-level "dev/..." entries are the medians over seeds of the
  final dev metrics at the best learning rate; "per_seed" holds that learning
  rate's runs, "spread" their min/max/std, "by_learning_rate" all of them; "speed"
  each run's train padding and the programs the sweep compiled.
  """
  learning_rates = list(config.learning_rates) or [config.optimizer.learning_rate]
  seeds = list(config.seeds)
  runs = _runs(config, workdir, learning_rates, seeds)
  steps.use_compilation_cache()  # before any compile: a later sweep loads what this one compiles
  with errors.judging_input():  # every ValueError here is a refusal of the input
    if not seeds:
      raise ValueError("config.seeds is empty: give at least one seed")
    workdir_lib.check_family(workdir, config)  # not another job's workdir (reads only)
    mesh, _ = state_lib.setup_mesh(config)
    check_config(config, mesh)  # before any data is read
    for lr in learning_rates:  # every run's optimizer values, before anything is written
      run_optimizer = copy.deepcopy(config.optimizer)
      with run_optimizer.unlocked():
        run_optimizer.learning_rate = lr
      optim.check_config(run_optimizer)
    for _, _, run_config, run_dir in runs:  # a busy workdir, a contradicting record: no data yet
      workdir_lib.check_before_data(run_dir, run_config, None,
                                    vocab_file=config.vocab_file or None,
                                    spm_model_file=config.spm_model_file or None,
                                    lock_dir=workdir)
    prepared = prepare(config)  # every input read and checked before anything is written
  lock = workdir_lib.lock(workdir)  # one sweep per workdir; its runs share the lock
  by_lr, speed = {}, {}
  try:
    for lr, seed, run_config, run_dir in runs:
      run = finetune_run(run_config, run_dir, prepared, locked=True)
      if run["preempted"]:  # SIGTERM: the run saved; the same command resumes the sweep
        return {"preempted": True}
      by_lr.setdefault(f"{lr:g}", {})[seed] = run["final"]
      speed[f"lr{lr:g}_seed{seed}"] = run["padding"]
      speed["compiled"] = run["compiled"]  # the sweep's so far: the last run's is the total
  finally:
    if lock is not None:
      lock.release()
  summary = summarize(by_lr, registry.get_kind(config.task.kind).main_metric(config.task))
  summary["speed"] = speed
  if jax.process_index() == 0:
    _write_json(paths.join(workdir, SUMMARY_FILE), summary)
  main, reported = summary["main_metric"], summary["reported_metric"]
  logging.info("%s: %s median %.4f over seeds %s (lr %s picked on %s)", config.task.name,
               reported, summary[reported], seeds, summary["learning_rate"], main)
  return summary


def _runs(config: ml_collections.ConfigDict, workdir: str, learning_rates: list[float],
          seeds: list[int]) -> list[tuple[float, int, ml_collections.ConfigDict, str]]:
  """(learning rate, seed, its config, its workdir) of every run of a sweep, in run order:
  each in its own lr<rate>_seed<seed>/ when there are several, else `workdir` itself."""
  several = len(learning_rates) * len(seeds) > 1
  runs = []
  for lr in learning_rates:
    for seed in seeds:
      run_config = copy.deepcopy(config)
      with run_config.unlocked():
        run_config.optimizer.learning_rate = lr
        run_config.seed = seed
      runs.append((lr, seed, run_config,
                   paths.join(workdir, f"lr{lr:g}_seed{seed}") if several else workdir))
  return runs


def summarize(by_lr: dict[str, dict[Any, dict[str, float]]], main_metric: str) -> dict[str, Any]:
  """The sweep's summary from {learning rate: {seed: final metrics}}.

  The learning rate is the one with the best median main dev metric
  ("main_metric"). "reported_metric" is the figure to report: with a carved test
  split (config.task.test_fraction) the same metric on test at that learning
  rate -- picked on dev, reported on test, so the pick does not inflate it --
  else the dev metric itself. Top-level "dev/..." and "test/..." entries are
  medians over seeds at the chosen rate, "per_seed" its runs, "spread" their
  min/max/std; "by_learning_rate" has every rate's medians and every (seed) run's
  metrics, dev and test.
  """
  first = next(iter(next(iter(by_lr.values())).values()))
  main = _main_key(first, main_metric)
  test_main = f"{splits.TEST_SPLIT}/{main_metric}"
  reported = test_main if test_main in first else main
  best_lr = max(by_lr, key=lambda lr: statistics.median(r[main] for r in by_lr[lr].values()))
  runs = by_lr[best_lr]
  keys = [k for k in first if k.startswith(("dev", splits.TEST_SPLIT + "/"))]
  summary = {k: statistics.median(r[k] for r in runs.values()) for k in keys}
  summary.update(
      learning_rate=float(best_lr), main_metric=main, reported_metric=reported, per_seed=runs,
      spread={k: {"min": min(r[k] for r in runs.values()), "max": max(r[k] for r in runs.values()),
                  "std": statistics.pstdev([r[k] for r in runs.values()])} for k in keys},
      by_learning_rate={
          lr: {**{"median_" + k: statistics.median(r[k] for r in rs.values())
                  for k in dict.fromkeys((main, reported))},
               "per_seed": rs}
          for lr, rs in by_lr.items()})
  return summary


def _main_key(metrics: dict[str, float], main_metric: str) -> str:
  """The key of the main dev metric: "dev/<metric>", or the first dev split's (MNLI
  matched); never the carved test split's, which only reports."""
  return next(k for k in metrics if k.endswith("/" + main_metric)
              and not k.startswith(splits.TEST_SPLIT + "/"))


def check_config(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
  """Refuses, before reading data or compiling, a config that cannot run."""
  dp = sharding.data_parallel_size(mesh)
  if config.num_epochs <= 0:
    raise ValueError(f"config.num_epochs={config.num_epochs} must be positive")
  if not 0.0 <= config.warmup_fraction < 1.0:
    raise ValueError(f"config.warmup_fraction={config.warmup_fraction} not in [0, 1)")
  if config.grad_accum_steps < 1:
    raise ValueError(f"config.grad_accum_steps={config.grad_accum_steps} must be >= 1")
  for name in ("batch_size", "eval_batch_size"):
    size = config[name]
    per = dp * (config.grad_accum_steps if name == "batch_size" else 1)
    if size <= 0 or size % per or size % jax.process_count():
      raise ValueError(f"config.{name}={size} must be a positive multiple of the data-parallel "
                       f"size {dp}" + (f" x grad_accum_steps {config.grad_accum_steps}"
                                       if name == "batch_size" else "")
                       + f" and divide over {jax.process_count()} processes")
  if config.max_seq_length < 8:
    raise ValueError(f"config.max_seq_length={config.max_seq_length} is too short")
  buckets_lib.bucket_lengths(config.max_seq_length, config.bucket_multiple, config.padding)
  if config.bucket_window_batches < 1:
    raise ValueError(f"config.bucket_window_batches={config.bucket_window_batches} must be >= 1")
  if config.loss_normalizer not in ("batch", "train_mean"):
    raise ValueError(f"config.loss_normalizer={config.loss_normalizer!r} must be 'batch' or "
                     "'train_mean'")
  if not config.init_checkpoint and not (config.vocab_file or config.spm_model_file):
    raise ValueError("fine-tuning from random initialisation needs config.vocab_file "
                     "(or spm_model_file); with config.init_checkpoint it comes from the "
                     "checkpoint")
  if config.init_checkpoint and not paths.exists(config.init_checkpoint):
    raise ValueError(f"config.init_checkpoint={config.init_checkpoint!r} does not exist")


@dataclasses.dataclass
class Prepared:
  """What every (learning rate, seed) run of a config shares: read and featurised once."""
  tokenizer: tokenization.WordTokenizer
  bert_config: model_lib.BertConfig
  loaded: tuple | None   # convert.load_for_finetuning's result, None for a random start
  task: task_kind.Task
  spm_model_file: str  # the SentencePiece model it tokenizes with (config's or checkpoint's), or ""
  # Compiled programs shared by the sweep's runs (steps.build), by what they depend on.
  programs: dict = dataclasses.field(default_factory=dict)


def check_vocab(config: ml_collections.ConfigDict, own_vocab: Any, own_spm: Any = None) -> None:
  """Refuses a config.vocab_file or config.spm_model_file that is not what the checkpoint
  was trained with (`own_vocab`, the vocab.txt beside it; `own_spm`, its spm.model; our
  workdirs and exports keep theirs there), or is a tokenizer of the other kind: the same
  ids would mean other words. config.allow_vocab_change=True says it is intended (the
  run's record keeps that field and the hash of the tokenizer it ran with)."""
  if config.allow_vocab_change:
    return
  for field, own, other in (("vocab_file", own_vocab, own_spm),
                            ("spm_model_file", own_spm, own_vocab)):
    if config[field] and own is None and other is not None:
      raise errors.UsageError(
          f"config.{field}={config[field]!r} is another kind of tokenizer than "
          f"config.init_checkpoint={config.init_checkpoint!r} was trained with ({other}); "
          f"drop config.{field} to use the checkpoint's, or {_VOCAB_CHANGE_FIX}")
  if config.spm_model_file and own_spm is not None:
    _check_spm(config, own_spm)
  if not config.vocab_file or own_vocab is None:
    return
  if not paths.exists(config.vocab_file):
    raise errors.UsageError(f"config.vocab_file={config.vocab_file!r} does not exist")
  ours = paths.read_text(config.vocab_file).splitlines()
  theirs = paths.read_text(str(own_vocab)).splitlines()
  if ours != theirs:
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                 min(len(ours), len(theirs)))
    raise errors.UsageError(
        f"config.vocab_file={config.vocab_file!r} is not the vocabulary of "
        f"config.init_checkpoint={config.init_checkpoint!r} ({own_vocab}): {len(ours)} vs "
        f"{len(theirs)} entries, first difference at id {first}; drop config.vocab_file to "
        f"use the checkpoint's, or {_VOCAB_CHANGE_FIX}")


def _check_spm(config: ml_collections.ConfigDict, own_spm: Any) -> None:
  """check_vocab for SentencePiece: the same model file, byte for byte (its pieces, scores
  and normalisation all decide the ids); the refusal says where the pieces differ."""
  import sentencepiece  # pylint: disable=g-import-not-at-top  # only to name the difference
  if not paths.exists(config.spm_model_file):
    raise errors.UsageError(f"config.spm_model_file={config.spm_model_file!r} does not exist")
  ours, theirs = paths.read_bytes(config.spm_model_file), paths.read_bytes(str(own_spm))
  if ours == theirs:
    return
  pieces = []
  for proto in (ours, theirs):
    processor = sentencepiece.SentencePieceProcessor()
    try:
      processor.LoadFromSerializedProto(proto)
    except Exception:  # pylint: disable=broad-except  # a bare RuntimeError: not a model
      pieces.append(None)
      continue
    pieces.append([processor.IdToPiece(i) for i in range(processor.GetPieceSize())])
  if None in pieces:
    how = "is not a SentencePiece model" if pieces[0] is None else "differs"
  elif pieces[0] == pieces[1]:
    how = f"has the same {len(pieces[0])} pieces but other scores or normalisation"
  else:
    first = next((i for i, (a, b) in enumerate(zip(*pieces)) if a != b),
                 min(map(len, pieces)))
    how = (f"differs: {len(pieces[0])} vs {len(pieces[1])} pieces, first difference at "
           f"id {first}")
  raise errors.UsageError(
      f"config.spm_model_file={config.spm_model_file!r} is not the SentencePiece model of "
      f"config.init_checkpoint={config.init_checkpoint!r} ({own_spm}): it {how}; drop "
      f"config.spm_model_file to use the checkpoint's, or {_VOCAB_CHANGE_FIX}")


def prepare(config: ml_collections.ConfigDict) -> Prepared:
  """Reads the checkpoint (if any) and its vocabulary, then the task data into features."""
  kind = registry.get_kind(config.task.kind)  # an unknown kind fails before any reading
  loaded = None
  spm_model_file = config.spm_model_file
  if config.init_checkpoint:
    from bert_jax import convert  # pylint: disable=g-import-not-at-top  # only needed here
    loaded = convert.load_for_finetuning(
        config.init_checkpoint, task_heads=(kind.head_name,),
        vocab_file=config.vocab_file or None)
    loaded_config, _, _, vocab_path = loaded
    own_vocab = convert.checkpoint_vocab(config.init_checkpoint)
    own_spm = convert.checkpoint_spm(config.init_checkpoint)
    check_vocab(config, own_vocab, own_spm)
    if not (config.vocab_file or spm_model_file) and own_vocab is None and own_spm is not None:
      spm_model_file = str(own_spm)  # a SentencePiece checkpoint's own, as vocab.txt is used
    if vocab_path is None and not spm_model_file:
      raise ValueError(f"{config.init_checkpoint} has no vocab.txt or spm.model; give "
                       "config.vocab_file (or config.spm_model_file)")
    tokenizer = tokenization.load_word_tokenizer(
        "" if spm_model_file else str(vocab_path), spm_model_file, config.do_lower_case)
    bert_config = loaded_config.replace(**config.model.to_dict())
  else:
    tokenizer = tokenization.load_word_tokenizer(config.vocab_file, config.spm_model_file,
                                                 config.do_lower_case)
    bert_config = model_lib.BertConfig.from_size(
        config.model_size, vocab_size=len(tokenizer.vocab), **config.model.to_dict())
  if len(tokenizer.vocab) > bert_config.vocab_size:
    raise ValueError(f"the vocabulary has {len(tokenizer.vocab)} entries but the model "
                     f"only {bert_config.vocab_size} embeddings")
  if config.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"config.max_seq_length={config.max_seq_length} exceeds the model's "
                     f"max_position_embeddings={bert_config.max_position_embeddings}")
  task = kind.build(config.task, bert_config, tokenizer, config.max_seq_length)
  return Prepared(tokenizer, bert_config, loaded, task, spm_model_file)


def finetune_run(config: ml_collections.ConfigDict, workdir: str,
                 prepared: "Prepared | None" = None, *, locked: bool = False) -> dict[str, dict]:
  """Fine-tunes one (learning rate, seed); resumes when the workdir has checkpoints.

  `prepared` (from prepare(config)) saves re-reading the checkpoint and
  re-featurising the data when a sweep runs several seeds or learning rates;
  `locked`: the caller (a sweep) holds the lock of a workdir containing this one.

  Returns {"final": dev metrics of the last evaluation, "best": of the best one,
  "preempted": whether SIGTERM stopped it (after saving), "padding": its train tokens
  (buckets.padding_stats), "compiled": the sweep's programs so far (counts and shapes)}.
  """
  # ----------------------------------------------------------------- mesh
  mesh, rules = state_lib.setup_mesh(config)
  check_config(config, mesh)

  # ------------------------------------- checkpoint, tokenizer, task data
  prepared = prepared or prepare(config)
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
        window_batches=config.bucket_window_batches)
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
      score = result[_main_key(result, task.main_metric)]
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
          _write_json(paths.join(workdir, RESULT_FILE),
                      {"final": result, "best": best.metrics, "step": step})
      if due.stop:
        train_loop.preempted(step)
        break
    if result is None and not stop:
      # Resumed after the last step: its evaluation may not have reached result.json.
      result = _read_json(paths.join(workdir, RESULT_FILE)).get("final") or evaluate(step)
    compiled = {**programs.compiled(), "train_lengths": sorted(programs.train_lengths),
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
    self.manager = checkpoint.make_manager(self.dir, best_ckpt)
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
      _write_json(paths.join(self.dir, "metrics.json"),
                  {"step": step, "score": score, "metrics": self.metrics})

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def _write_json(path: str, content: Any) -> None:
  """Writes JSON atomically: a kill leaves the old file or the new one, never half."""
  paths.write_atomic(path, json.dumps(content, indent=2, ensure_ascii=False))


def _read_json(path: str) -> dict:
  return json.loads(paths.read_text(path)) if paths.exists(path) else {}
