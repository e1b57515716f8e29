"""Checkpoint import and export: Hugging Face BERT, RoBERTa and ModernBERT, original TF BERT,
our own format.

Import (`load_pretrained`) recognises, in this order:
  * our own export (`params/` orbax checkpoint + `bert_config.json` + `vocab.txt`);
  * a Hugging Face directory (`config.json` + `model.safetensors`; model_type bert, roberta,
    roberta-prelayernorm or modernbert);
  * a training workdir (has `checkpoints/`; or that directory, or one step in it): handed
    to bert_jax.run.checkpoint.load_params_from_workdir;
  * an original google-research/bert TF checkpoint (a directory holding `bert_config.json`
    and `model.ckpt-*`, or the checkpoint prefix itself).
Every tensor the model needs must be there with the right shape and every tensor there
must be used (optimizer slots, the position-id buffer and tied decoder copies are skipped
knowingly); otherwise one ValueError names all offenders.

Export: `export_hf` (a directory transformers loads: BertForPreTraining, RobertaForMaskedLM,
RobertaPreLayerNormForMaskedLM or ModernBertForMaskedLM, as the network's config says) and
`export_own`. The vocabulary (vocab.txt, RoBERTa's vocab.json + merges.txt, or a
tokenizer.json) travels with every converted checkpoint.

Command line:
  python -m bert_jax.convert --input=PATH --output=DIR --format=hf|own [--vocab_file=V]

This package face only names the public functions; the work is in load.py
(detect and assemble), own.py / hf.py / tf.py (one format each), modernbert.py (the
modernbert config.json both ways) and layout.py (the name and shape table).
"""

# pylint: disable=g-importing-member  # the package's public names, defined in its modules
from bert_jax.convert.hf import export_hf
from bert_jax.convert.hf import VOCAB_NAME
from bert_jax.convert.load import checkpoint_spm
from bert_jax.convert.load import checkpoint_vocab
from bert_jax.convert.load import load_checkpoint
from bert_jax.convert.load import load_for_finetuning
from bert_jax.convert.load import load_pretrained
from bert_jax.convert.own import export_own
from bert_jax.convert.own import is_own_dir
from bert_jax.convert.own import OWN_CONFIG
from bert_jax.convert.own import OWN_PARAMS
from bert_jax.convert.own import read_own_config
