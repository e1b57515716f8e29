"""A checkpoint's own tokenizer.json (ModernBERT ships a byte-level BPE so), through the
`tokenizers` library, against transformers' AutoTokenizer on about 1 MB of real text; and
a ModernBERT directory as save_pretrained writes it (config.json, model.safetensors,
tokenizer.json) through extract_features and fine-tuning's feature builders.

No hub works here: the BPE is trained in the test on real prose with BERT's special
tokens and ModernBERT's [CLS] A [SEP] B [SEP] post-processor; the model is random.
"""

import json
import pathlib

import numpy as np
import pytest
import tokenizers
import torch
import transformers

from bert_jax import extract_features
from bert_jax.finetune.features import packing
from bert_jax.finetune.features import tokenization
from bert_jax.finetune.readers import records
from data_pipeline.store import tokenized_corpus
from data_pipeline.vocab import tokenizers as pipeline_tokenizers

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
VOCAB = 3000


@pytest.fixture(scope="module")
def text(megabyte_of_text) -> list[str]:
  """About 1 MB of real text (conftest's megabyte_of_text)."""
  return megabyte_of_text


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, text) -> pathlib.Path:
  """A random ModernBertForMaskedLM (window 8) and its tokenizer.json, as save_pretrained
  writes them: a byte-level BPE trained on the text, BERT's specials, ModernBERT's template."""
  bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="[UNK]"))
  bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  bpe.decoder = tokenizers.decoders.ByteLevel()
  bpe.train_from_iterator(text, tokenizers.trainers.BpeTrainer(
      vocab_size=VOCAB, special_tokens=SPECIALS,
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
  cls, sep = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
  bpe.post_processor = tokenizers.processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=bpe, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
      pad_token="[PAD]", mask_token="[MASK]")
  directory = tmp_path_factory.mktemp("modernbert")
  config = transformers.ModernBertConfig(
      vocab_size=bpe.get_vocab_size(), hidden_size=32, intermediate_size=48,
      num_hidden_layers=4, num_attention_heads=2, local_attention=8,
      max_position_embeddings=128, pad_token_id=bpe.token_to_id("[PAD]"), cls_token_id=cls,
      bos_token_id=cls, sep_token_id=sep, eos_token_id=sep, attn_implementation="eager")
  torch.manual_seed(0)
  transformers.ModernBertForMaskedLM(config).eval().save_pretrained(directory)
  fast.save_pretrained(directory)
  return directory


def test_ids_equal_autotokenizer_on_real_text_specials_included(checkpoint, text):
  """Fails if our tokenizer.json tokenizer gives other ids than AutoTokenizer for any line
  of the real text (its literal specials kept whole), or if [CLS] line [SEP] as our
  pipelines pack it is not what AutoTokenizer writes with its special tokens."""
  reference = transformers.AutoTokenizer.from_pretrained(checkpoint)
  ours = pipeline_tokenizers.load_tokenizer(vocab_file=str(checkpoint / "tokenizer.json"),
                                            do_lower_case=False)
  lines = text + ["a literal [MASK] and [SEP] in text", "tab\tand  spaces  ", "é ü 中文 ☃"]
  got = ours.tokenize(np.array(lines, dtype=object)).to_list()
  want = reference(lines, add_special_tokens=False)["input_ids"]
  differ = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
  assert not differ, f"{len(differ)} lines differ, first: {lines[differ[0]]!r}"
  assert sum(map(len, got)) > 200_000  # the comparison covered real work
  specials = ours.special_ids
  assert specials == {r: reference.convert_tokens_to_ids(t) for r, t in
                      pipeline_tokenizers.SPECIAL_TOKENS.items()}
  for line, ids in zip(lines[:200], got):
    assert [specials["cls"], *ids, specials["sep"]] == reference(line)["input_ids"]
  # The whole-word table reads the BPE's own mark of a word start.
  starts = tokenized_corpus.word_start_table(ours)
  assert starts[reference.convert_tokens_to_ids("\u0120the")] and starts[specials["cls"]]


def test_fine_tuning_rows_are_the_checkpoints_tokenizers(checkpoint, text):
  """Fails if fine-tuning's classification rows of a ModernBERT checkpoint differ from
  AutoTokenizer's `[CLS] A [SEP] B [SEP]` (its own pair template), or if a word's pieces
  for the per-word kinds are not what it gives for pre-split words with a prefix space."""
  plain = transformers.AutoTokenizer.from_pretrained(checkpoint)
  # transformers' word-level mode with a prefix space on every word (add_prefix_space=True,
  # which a generic fast tokenizer takes on its pre-tokenizer).
  reference = transformers.AutoTokenizer.from_pretrained(checkpoint)
  reference.backend_tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=True)
  ours = tokenization.load_word_tokenizer(str(checkpoint / "tokenizer.json"),
                                          do_lower_case=True)  # said not to apply, ignored
  assert not ours.do_lower_case and ours.pair_separators == 1
  examples = [records.Example(f"g{i}", text[i], text[i + 1], "x") for i in range(0, 200, 2)]
  features = packing.classification_features(examples, tokenize_word=ours, vocab=ours.vocab,
                                             max_seq_length=4096, labels=["x"],
                                             pair_separators=ours.pair_separators)
  for row, ex in zip(features["input_ids"], examples):
    want = plain(ex.text_a, ex.text_b)["input_ids"]
    assert row[:len(want)].tolist() == want and not row[len(want):].any()
  words = text[5].split()
  ours.prime(text[:50])
  pieces = [ours.vocab[p] for w in words for p in ours(w)]
  assert pieces == reference(words, is_split_into_words=True, add_special_tokens=False)[
      "input_ids"]


@pytest.mark.slow  # a forward pass of the reference and ours over 40 rows (~10 s)
def test_extract_features_gives_the_references_hidden_states(checkpoint, text, tmp_path):
  """Fails if extract_features on the ModernBERT directory (window 8, inputs of tens of
  tokens, a third of them pairs) gives other input ids than the checkpoint's tokenizer, or last
  hidden states more than 2e-5 from transformers' on those ids, or no [CLS]/mean pooling."""
  lines = [text[i][:120] + (f" ||| {text[i + 1][:60]}" if i % 3 == 0 else "")
           for i in range(40)]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  result = extract_features.run(str(tmp_path / "in.txt"), str(tmp_path / "out.npz"),
                                str(checkpoint), None, False, 128, 8)
  tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
  model = transformers.ModernBertModel.from_pretrained(checkpoint).eval()
  for i, line in enumerate(lines):
    a, _, b = line.partition(" ||| ")
    encoded = tokenizer(a, b or None)["input_ids"]
    assert len(encoded) <= 128  # no truncation: its tie rule is google-research/bert's here
    ids = result["input_ids"][i]
    assert ids[:len(encoded)].tolist() == encoded, i
    with torch.no_grad():
      hidden = model(input_ids=torch.tensor([encoded])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(result["sequence_output"][i, :len(encoded)], hidden, atol=2e-5,
                               rtol=0, err_msg=str(i))
    np.testing.assert_allclose(result["pooled_output"][i], hidden[0], atol=2e-5, rtol=0)
  assert json.loads((checkpoint / "config.json").read_text())["local_attention"] == 8


@pytest.mark.slow  # three short fine-tuning runs of the random ModernBERT (~1 min)
@pytest.mark.parametrize("kind", ["classification", "ner", "squad"])
def test_every_task_kind_fine_tunes_from_the_modernbert_directory(checkpoint, tmp_path, kind,
                                                                 allennlp_fixtures):
  """Fails if fine-tuning refuses the ModernBERT directory (its tokenizer.json, its config),
  if its training loss does not fall, or if the classification head does not pool as the
  checkpoint's config says (mean here)."""
  from experiments.configs import finetune as finetune_configs  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import sweep  # pylint: disable=g-import-not-at-top
  source = tmp_path / "ckpt"
  source.mkdir()
  for f in checkpoint.iterdir():
    (source / f.name).write_bytes(f.read_bytes())
  hf_config = json.loads((source / "config.json").read_text())
  hf_config["classifier_pooling"] = "mean"
  (source / "config.json").write_text(json.dumps(hf_config))
  if kind == "classification":
    config = finetune_configs.get_config("custom")
    rows = ["sentence\tlabel"] + [
        f"{'the river runs' if i % 2 else 'the city sleeps'} at {i} o'clock\t{'pos' if i % 2 else 'neg'}"
        for i in range(96)]
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    config.task.train_file = config.task.dev_file = str(tmp_path / "train.tsv")
    config.task.labels, config.task.positive_label = "neg,pos", "pos"
    config.max_seq_length, config.num_epochs = 32, 6
  elif kind == "ner":
    config = finetune_configs.get_config("conll")
    train = tmp_path / "conll.txt"
    train.write_text(((allennlp_fixtures / "conll2003.txt").read_text().strip() + "\n\n") * 8)
    config.task.train_file, config.task.dev_file = str(train), str(train)
    config.task.scheme = "iob1"
    config.max_seq_length, config.task.doc_stride, config.num_epochs = 32, 8, 8
  else:
    config = finetune_configs.get_config("squad_v1")
    config.task.train_file = config.task.dev_file = str(allennlp_fixtures / "squad.json")
    config.max_seq_length, config.task.doc_stride, config.num_epochs = 128, 32, 8
  config.init_checkpoint = str(source)
  config.do_lower_case = False
  config.batch_size = config.eval_batch_size = 8
  config.optimizer.learning_rate = 2e-3
  config.log_every_steps = 1
  config.eval_every_steps = 1000
  workdir = tmp_path / "run"
  summary = sweep.finetune(config, str(workdir))
  losses = [json.loads(l)["loss"] for l in (workdir / "metrics.jsonl").read_text().splitlines()
            if "loss" in json.loads(l)]
  assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses
  assert any(k.startswith("dev/") for k in summary)
  bert_config = json.loads((workdir / "bert_config.json").read_text())
  assert (bert_config["architecture"], bert_config["classifier_pooling"]) == ("modernbert",
                                                                              "mean")
  assert (workdir / "tokenizer.json").is_file()
