"""extract_features on the real all-MiniLM-L6-v2 checkpoint: the tool's file against
transformers' tokenizer (ids, pairs) and our model applied directly.

The model itself is compared with transformers once, in tests/test_minilm_parity.py
(1e-5, and the published sentence embedding); this file checks what the tool adds:
reading lines and " ||| " pairs, tokenizing as BERT does, batching, padding, and the
pooled / mean-pooled outputs it writes.
"""

import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax import convert
from bert_jax import extract_features
from bert_jax.model import encoder as model_lib

LINES = [
    "This is an example sentence",
    "The quick brown fox jumps over the lazy dog.",
    "Who wrote the paper? ||| Devlin et al. wrote it in 2018, at Google AI Language.",
    "Naïve café déjà vu — accents and punctuation!",
]


def test_matches_the_model_on_transformers_token_ids(tmp_path, minilm_dir):
  """Fails if the tool tokenizes differently from BertTokenizerFast (pairs, accents,
  padding), mixes up rows across batches (batch 3 over 4 lines), or writes outputs
  other than the model's on those ids: 1e-5 as in the parity test (the tool runs the
  same model; only batch composition differs)."""
  from transformers import BertTokenizerFast  # pylint: disable=g-import-not-at-top
  hf_tokenizer = BertTokenizerFast.from_pretrained(str(minilm_dir))
  input_file = tmp_path / "in.txt"
  input_file.write_text("\n".join(LINES) + "\n", encoding="utf-8")
  out = extract_features.run(str(input_file), str(tmp_path / "out.npz"), str(minilm_dir),
                             vocab_file=None, do_lower_case=True, max_seq_length=32,
                             batch_size=3)
  saved = np.load(tmp_path / "out.npz")
  assert sorted(saved.files) == ["input_ids", "mean_pooled", "pooled_output", "sequence_output"]
  assert saved["sequence_output"].shape == (len(LINES), 32, 384)
  np.testing.assert_array_equal(out["input_ids"], saved["input_ids"])

  firsts = [line.split(" ||| ")[0] for line in LINES]
  seconds = [line.split(" ||| ")[1] if " ||| " in line else None for line in LINES]
  config, params, _ = convert.load_pretrained(minilm_dir, target="encoder")
  # Jitted: every line has the same (1, 32) shape, so one compile, not one per primitive.
  apply = jax.jit(model_lib.BertModel(config).apply)
  for i, (a, b) in enumerate(zip(firsts, seconds)):
    enc = hf_tokenizer(a, b, padding="max_length", max_length=32, truncation=True,
                       return_tensors="np")
    np.testing.assert_array_equal(saved["input_ids"][i], enc["input_ids"][0])
    sequence, pooled = apply(
        {"params": params}, *(enc[k].astype(np.int32)
                              for k in ("input_ids", "attention_mask", "token_type_ids")))
    n = int(enc["attention_mask"].sum())
    np.testing.assert_allclose(saved["sequence_output"][i, :n], sequence[0, :n], atol=1e-5)
    np.testing.assert_allclose(saved["pooled_output"][i], pooled[0], atol=1e-5)
    np.testing.assert_allclose(saved["mean_pooled"][i], np.asarray(sequence[0, :n]).mean(0),
                               atol=1e-5)


@pytest.mark.parametrize("content,message", [
    (b"fine\n\xff\xfe broken\n", "2: not valid UTF-8"),
    (b"fine\n\n", "2: empty line"),
    (b"", "no input lines"),
])
def test_bad_input_names_the_line(tmp_path, content, message):
  """Fails if an undecodable line or an empty line is not refused by its line number, or an empty
  file is not refused as having no input lines."""
  path = tmp_path / "in.txt"
  path.write_bytes(content)
  with pytest.raises(ValueError, match=message):
    extract_features.read_inputs(str(path))


def test_refuses_too_long_sequence_before_writing(tmp_path, minilm_dir):
  """Fails if a max_seq_length past the checkpoint's positions is accepted or writes a file."""
  (tmp_path / "in.txt").write_text("hello\n")
  with pytest.raises(ValueError, match="max_position_embeddings=512"):
    extract_features.run(str(tmp_path / "in.txt"), str(tmp_path / "o.npz"), str(minilm_dir),
                         vocab_file=None, do_lower_case=True, max_seq_length=1024, batch_size=3)
  assert not (tmp_path / "o.npz").exists()


@pytest.mark.slow  # a fresh interpreter imports jax and the tool: the command line end to end
def test_cli_refuses_too_long_sequence(tmp_path, minilm_dir):
  """Fails if the command exits 0 on the refusal, or its stderr does not name the limit."""
  (tmp_path / "in.txt").write_text("hello\n")
  result = subprocess.run(
      [sys.executable, "-m", "bert_jax.extract_features", f"--input_file={tmp_path / 'in.txt'}",
       f"--output_file={tmp_path / 'o.npz'}", f"--init_checkpoint={minilm_dir}",
       "--max_seq_length=1024"], capture_output=True, text=True)
  assert result.returncode != 0
  assert "max_position_embeddings=512" in result.stderr
  assert not (tmp_path / "o.npz").exists()
