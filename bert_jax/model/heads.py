"""Output heads and the task models that put them on the BERT encoder.

Heads: masked-LM (dense + GELU + LayerNorm, decoder tied to the word embeddings,
output bias) evaluated only at the gathered `masked_lm_positions`, so its cost
follows the number of predictions rather than the sequence length; NSP/SOP (2-way
on the pooled output); sequence classification/regression; token classification;
span QA. Every head returns float32 logits whatever the compute dtype.

The task models wrap the encoder as submodule "bert"; their parameter names are a
contract with bert_jax/convert/__init__.py and the trainer.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import dropout as dropout_lib
from bert_jax.model import encoder as model_lib
from bert_jax.model import modern
from bert_jax.model.config import BertConfig


def encoder_for(config: BertConfig, name: str = "bert") -> nn.Module:
  """The encoder of config.architecture: BERT's (encoder.py) or the modern one (modern.py),
  the same call for both: (ids, mask, segments) -> (sequence, pooled)."""
  if config.architecture == "modernbert":
    return modern.ModernBertModel(config, name=name)
  return model_lib.BertModel(config, name=name)


def _modern_head(config: BertConfig, x: jax.Array, name: str = "head") -> jax.Array:
  """The modern encoder's prediction head, which its task heads read: dense, GELU, norm."""
  x = model_lib.dense(config, config.hidden_size, ("embed", None), f"{name}_dense",
                      use_bias=config.use_bias)(x)
  return modern.norm(config, f"{name}_norm")(model_lib.gelu(x))


def encode(config: BertConfig, input_ids, input_mask, segment_ids, *, deterministic: bool,
           pooled_only: bool = False, positions=None, documents=None, pack_index=None):
  """(sequence [B,T,H], pooled [B,H]) of a task head's examples. Packed (`pack_index`, with
  `positions` and `documents`: bert_jax/finetune/features/packed.py): the encoder runs on
  the packed rows and each example's vectors are read back to [B,T,H], zero past its end,
  then pooled as an unpacked row is."""
  bert = encoder_for(config)
  if pack_index is None:
    return bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                pooled_only=pooled_only, positions=positions, documents=documents)
  if pooled_only and config.architecture != "modernbert":
    # Only each example's [CLS] is read: BERT's last layer computes those rows alone, as
    # it does unpacked (an empty example's -1 reads row 0's first token, never read).
    return bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                pooled_only=True, positions=positions, documents=documents,
                queries=jnp.maximum(pack_index[:, 0], 0))
  packed, _ = bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                   positions=positions, documents=documents)
  flat = packed.reshape((-1,) + packed.shape[2:])
  real = pack_index >= 0
  sequence = jnp.where(real[..., None], flat[jnp.maximum(pack_index, 0)], 0).astype(
      packed.dtype)
  return sequence, bert.pool(sequence, real)


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
  """[B,T,H] sequence, int [B,P] positions -> [B,P,H] vectors at those positions."""
  return jnp.take_along_axis(sequence, positions[:, :, None].astype(jnp.int32), axis=1)


class MaskedLMHead(nn.Module):
  """MLM head: transform (H -> E, GELU, LayerNorm), tied decoder (E -> V) + output bias."""

  config: BertConfig

  @nn.compact
  def __call__(self, sequence, positions, embedding_table) -> jax.Array:
    """sequence [B,T,H], positions [B,P] (None: every position), table [V',E] -> [B,P,V'] float32.

    V' is config.padded_vocab_size; the logits of the padding ids (>= vocab_size) are the
    float32 minimum, so they take no probability, no gradient and never win an argmax.
    """
    cfg = self.config
    # Gather first: the transform and the V-wide decoder then cost B*P rows, not B*T.
    x = sequence if positions is None else gather_positions(sequence, positions)
    x = model_lib.dense(cfg, cfg.embed_size, ("embed", None), "transform",
                        use_bias=cfg.use_bias)(x)
    norm = (modern.norm(cfg, "layer_norm") if cfg.architecture == "modernbert"
            else model_lib.layer_norm(cfg, "layer_norm"))
    x = norm(model_lib.gelu(x))
    bias = self.param("output_bias", nn.with_logical_partitioning(
        nn.initializers.zeros_init(), ("vocab",)), (cfg.padded_vocab_size,), jnp.float32)
    if not cfg.tie_word_embeddings:  # a decoder of its own (untied checkpoints)
      embedding_table = self.param("decoder", model_lib.param_init(cfg, ("vocab", "embed")),
                                   (cfg.padded_vocab_size, cfg.embed_size), jnp.float32)
    if cfg.padded_vocab_size != cfg.vocab_size:
      # Masked through the [V] bias, not the [B,P,V] logits: no logits-sized temporary.
      real = jnp.arange(cfg.padded_vocab_size) < cfg.vocab_size
      bias = jnp.where(real, bias, jnp.finfo(jnp.float32).min)
    table = embedding_table.astype(cfg.compute_dtype)
    # Products in the compute dtype, accumulation and logits in float32.
    logits = jnp.einsum("bpe,ve->bpv", x.astype(cfg.compute_dtype), table,
                        preferred_element_type=jnp.float32)
    return logits + bias


def _classifier(config: BertConfig, num_outputs: int, name: str) -> nn.Module:
  # Tiny output layers run in float32: their cost is negligible and logits stay exact.
  return model_lib.dense(config, num_outputs, ("embed", None), name, dtype=jnp.float32)


class BertForPreTraining(nn.Module):
  """BERT with the masked-LM head and (unless nsp_head=False) the NSP/SOP head."""

  config: BertConfig
  nsp_head: bool = True  # False for objectives without a sentence-pair task (RoBERTa-style)

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
               deterministic: bool = True, positions=None, documents=None) -> dict:
    """Returns {"mlm_logits": [B,P,V] f32, "nsp_logits": [B,2] f32 (if nsp_head)}.

    masked_lm_positions=None evaluates the MLM head on every position (P = T). Packed
    rows: `positions` and `documents` [B,T] (the encoder's).
    """
    bert = encoder_for(self.config)
    sequence, pooled = bert(input_ids, input_mask, segment_ids, deterministic=deterministic,
                            positions=positions, documents=documents)
    out = {"mlm_logits": MaskedLMHead(self.config, name="mlm_head")(
        sequence, masked_lm_positions, bert.word_embedding_table())}
    if self.nsp_head:
      out["nsp_logits"] = _classifier(self.config, 2, "nsp_head")(pooled.astype(jnp.float32))
    return out


class BertForSequenceClassification(nn.Module):
  """Sentence(-pair) classification from the pooled [CLS]; num_labels=1 is regression."""

  config: BertConfig
  num_labels: int = 2  # 1 -> a single regression output

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True,
               **packing):
    """-> logits [B,num_labels] float32 (`packing`: encode()'s packed rows)."""
    # Only the pooled [CLS] is read: the last layer computes that row alone.
    _, pooled = encode(self.config, input_ids, input_mask, segment_ids,
                       deterministic=deterministic, pooled_only=True, **packing)
    if self.config.architecture == "modernbert":
      pooled = _modern_head(self.config, pooled)
    pooled = dropout_lib.Dropout(self.config.hidden_dropout_prob)(
        pooled, deterministic=deterministic)
    return _classifier(self.config, self.num_labels, "classifier")(pooled.astype(jnp.float32))


class BertForTokenClassification(nn.Module):
  """Per-token classification (NER, POS) from every position of the sequence output."""

  config: BertConfig
  num_labels: int = 2  # size of the tag set

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True,
               **packing):
    """-> logits [B,T,num_labels] float32 (`packing`: encode()'s packed rows)."""
    sequence, _ = encode(self.config, input_ids, input_mask, segment_ids,
                         deterministic=deterministic, **packing)
    if self.config.architecture == "modernbert":
      sequence = _modern_head(self.config, sequence)
    sequence = dropout_lib.Dropout(self.config.hidden_dropout_prob)(
        sequence, deterministic=deterministic)
    return _classifier(self.config, self.num_labels, "classifier")(sequence.astype(jnp.float32))


class BertForQuestionAnswering(nn.Module):
  """Extractive span QA (SQuAD): start and end logits over the sequence."""

  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic: bool = True,
               **packing):
    """-> (start_logits [B,T], end_logits [B,T]) float32 (`packing`: encode()'s packed rows)."""
    sequence, _ = encode(self.config, input_ids, input_mask, segment_ids,
                         deterministic=deterministic, **packing)
    if self.config.architecture == "modernbert":
      sequence = dropout_lib.Dropout(self.config.hidden_dropout_prob)(
          _modern_head(self.config, sequence), deterministic=deterministic)
    logits = _classifier(self.config, 2, "qa_outputs")(sequence.astype(jnp.float32))
    return logits[..., 0], logits[..., 1]
