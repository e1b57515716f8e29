"""RoBERTa's byte-level BPE for fine-tuning (bert_jax/finetune/features/bpe.py) against the reference,
transformers' RobertaTokenizerFast, on about 1 MB of real text.

No hub download works here, so a small byte-level BPE is trained on the text with the
`tokenizers` library, saved as vocab.json + merges.txt, and both sides load those files.
"""

import pathlib
import sys

import numpy as np
import pytest
import tokenizers
import transformers

from bert_jax import errors
from bert_jax.finetune.features import packing
from bert_jax.finetune.readers import records
from bert_jax.finetune.features import tokenization

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # RoBERTa's ids 0..3, then <mask>


@pytest.fixture(scope="module")
def text(megabyte_of_text) -> list[str]:
  """About 1 MB of real text (conftest's megabyte_of_text)."""
  return megabyte_of_text


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory, text) -> pathlib.Path:
  """A 4,000-entry byte-level BPE trained on the text, saved as vocab.json + merges.txt."""
  trainer = tokenizers.ByteLevelBPETokenizer()
  trainer.train_from_iterator(text, vocab_size=4000, special_tokens=SPECIALS)
  out = tmp_path_factory.mktemp("bpe")
  trainer.save_model(str(out))
  return out


@pytest.fixture(scope="module")
def ours(bpe_dir):
  return tokenization.load_word_tokenizer(str(bpe_dir / "vocab.json"), do_lower_case=False)


@pytest.fixture(scope="module")
def reference(bpe_dir):
  return transformers.RobertaTokenizerFast(str(bpe_dir / "vocab.json"), str(bpe_dir / "merges.txt"),
                                           add_prefix_space=True)


def test_ids_equal_roberta_tokenizer_fast_on_real_text(ours, reference, text):
  """Every line's ids equal RobertaTokenizerFast's for the line's words (is_split_into_words,
  the word-level mode). Fails if a word lost its leading-space marker, a merge ran in
  another order or a byte (Chinese, symbols) was mapped otherwise."""
  ours.prime(text)
  got = [[ours.vocab[p] for p in packing.tokenize_text(line, ours)] for line in text]
  want = reference([line.split() for line in text], is_split_into_words=True,
                   add_special_tokens=False)["input_ids"]
  assert len(got) == len(want) == len(text)
  differ = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
  assert not differ, f"{len(differ)} lines differ, first: {text[differ[0]]!r}"
  assert sum(map(len, got)) > 200_000  # the comparison covered real work
  # Primed and unprimed words tokenize alike.
  fresh = tokenization.load_word_tokenizer(str(ours.vocab_file), do_lower_case=False)
  assert [fresh(w) for w in text[0].split()] == [ours(w) for w in text[0].split()]


def test_pairs_pack_as_roberta_does(ours, reference, text):
  """A sentence pair packs `<s> A </s></s> B </s>`, RoBERTa's layout, as the reference writes
  it; role names resolve to RoBERTa's specials and are not vocabulary entries."""
  examples = [records.Example(f"g{i}", text[i], text[i + 1], "x") for i in range(0, 400, 2)]
  features = packing.classification_features(examples, tokenize_word=ours, vocab=ours.vocab,
                                             max_seq_length=2048, labels=["x"],
                                             pair_separators=ours.pair_separators)
  for row, ex in zip(features["input_ids"], examples):
    want = reference(ex.text_a.split(), ex.text_b.split(), is_split_into_words=True)["input_ids"]
    assert row[:len(want)].tolist() == want and not row[len(want):].any()
  assert (ours.vocab["[CLS]"], ours.vocab["[SEP]"], ours.vocab["[PAD]"]) == (0, 2, 1)
  assert len(ours.vocab) == 4000 and "[CLS]" not in ours.vocab
  assert ours.pair_separators == 2 and not ours.do_lower_case


def test_refusals_are_one_line(bpe_dir, tmp_path, monkeypatch):
  """Lowercasing, a missing merges.txt, a vocabulary without RoBERTa's specials, and a
  missing `tokenizers` package are each refused in one line naming the fix."""
  vocab = str(bpe_dir / "vocab.json")
  with pytest.raises(errors.UsageError, match="do_lower_case=False"):
    tokenization.load_word_tokenizer(vocab)
  lone = tmp_path / "lone"
  lone.mkdir()
  (lone / "vocab.json").write_bytes((bpe_dir / "vocab.json").read_bytes())
  with pytest.raises(errors.UsageError, match="merges.txt"):
    tokenization.load_word_tokenizer(str(lone / "vocab.json"), do_lower_case=False)
  plain = tmp_path / "plain"
  trainer = tokenizers.ByteLevelBPETokenizer()
  trainer.train_from_iterator(["some text here"], vocab_size=300)
  plain.mkdir()
  trainer.save_model(str(plain))
  with pytest.raises(errors.UsageError, match="lacks RoBERTa's special token"):
    tokenization.load_word_tokenizer(str(plain / "vocab.json"), do_lower_case=False)
  monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the extra were not installed
  with pytest.raises(errors.UsageError) as error:
    tokenization.load_word_tokenizer(vocab, do_lower_case=False)
  assert "pip install 'bert_jax[bpe]'" in str(error.value)
  assert "\n" not in str(error.value)


@pytest.mark.slow  # a short fine-tuning run (compiles the train and eval steps)
def test_finetunes_a_roberta_prelayernorm_checkpoint_with_its_bpe(bpe_dir, text, tmp_path):
  """A RobertaPreLayerNorm directory with vocab.json + merges.txt fine-tunes a sentence-pair
  task through the ordinary trainer: the BPE is picked from the checkpoint, pairs are packed
  RoBERTa's way, and the best/ snapshot carries the BPE on. Fails if any of it fell back to
  WordPiece, BERT's pair layout or a post-LN network."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune.features import bpe  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import trainer  # pylint: disable=g-import-not-at-top
  from bert_jax.finetune import prepare as finetune_prepare  # pylint: disable=g-import-not-at-top
  from bert_jax.model import heads  # pylint: disable=g-import-not-at-top
  from bert_jax.model.config import BertConfig  # pylint: disable=g-import-not-at-top
  from experiments.configs import finetune as finetune_configs  # pylint: disable=g-import-not-at-top

  config = BertConfig(vocab_size=4000, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=66, position_offset=2,
                      type_vocab_size=1, pre_layer_norm=True, layer_norm_eps=1e-5)
  ids = np.zeros((1, 8), np.int32)
  params = nn.unbox(heads.BertForPreTraining(config, nsp_head=False).init(
      jax.random.key(0), ids, ids + 1, ids, ids[:, :2])["params"])
  del params["bert"]["pooler"]  # as RobertaPreLayerNormForMaskedLM has none
  checkpoint = convert.export_hf(params, config, tmp_path / "ckpt", bpe_dir / "vocab.json")
  assert {p.name for p in checkpoint.iterdir()} >= {"vocab.json", "merges.txt", "config.json"}

  rows = ["premise\thypothesis\tlabel"] + [
      f"{' '.join(text[i].split()[:12])}\t{' '.join(text[i + 1].split()[:12])}\t{i % 2}"
      for i in range(0, 192, 2)]
  (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
  ft = finetune_configs.get_config("custom")
  ft.task.update(train_file=str(tmp_path / "train.tsv"), dev_file=str(tmp_path / "train.tsv"),
                 text_a="premise", text_b="hypothesis", labels="0,1", positive_label="1")
  ft.update(init_checkpoint=str(checkpoint), do_lower_case=False, max_seq_length=64,
            batch_size=16, eval_batch_size=16, num_epochs=1)
  prepared = finetune_prepare.prepare(ft)
  assert isinstance(prepared.tokenizer, bpe.BpeWordTokenizer)
  assert prepared.bert_config.pre_layer_norm and prepared.bert_config.type_vocab_size == 1
  first = prepared.task.train.features["input_ids"][0].tolist()
  assert first[0] == 0 and [2, 2] == first[first.index(2):first.index(2) + 2]
  result = trainer.finetune_run(ft, str(tmp_path / "run"), prepared)
  assert 0 <= result["final"]["dev/accuracy"] <= 1
  _, encoder, _, vocab = convert.load_for_finetuning(tmp_path / "run" / "best",
                                                     task_heads=("classifier",))
  assert vocab.name == "vocab.json" and "final_layer_norm" in encoder["encoder"]
