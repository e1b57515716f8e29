"""experiments/configs/pretrain.py:efficient against the recipe it claims to be.

The values are princeton-nlp/DinkyTrain's run_efficient_mlm_recipe.sh (Wettig et al.
2023), copied here from the script's flags, and the config must pass the
pretraining trainer's own checks on a mesh, as a run would before its first step.
The compiled step for TPU slices is experiments/results/README.md#preflight-efficient.
"""

import jax
import numpy as np

from bert_jax.pretrain import phases
from bert_jax.pretrain import steps as pretrain_steps
from bert_jax.training import optim
from bert_jax.training import state as state_lib
from data_pipeline import specs
from experiments.configs import pretrain

# fairseq-train flags of run_efficient_mlm_recipe.sh -> where our config holds them.
SCRIPT = {
    "batch_size": 4096,  # BSZ
    "total_steps": 23_000,  # TOTAL_UPDATES
    "optimizer.learning_rate": 2e-3,  # PEAK_LR
    "optimizer.warmup_steps": 1_380,  # WARMUP_UPDATES
    "optimizer.b1": 0.9, "optimizer.b2": 0.98,  # --adam-betas '(0.9,0.98)'
    "optimizer.eps": 1e-6,  # --adam-eps
    "optimizer.grad_clip_norm": 0.0,  # --clip-norm 0.0
    "optimizer.weight_decay": 0.01,  # --weight-decay
    "optimizer.decay_power": 1.0, "optimizer.end_learning_rate": 0.0,  # polynomial_decay
    "data.max_seq_length": 128,  # TOKENS_PER_SAMPLE
    "data.masking.ratio": 0.4,  # MASK_RATE
    "data.masking.mask_prob": 1.0,  # SAME_RATE=0, RANDOM_RATE=0
    "data.masking.random_prob": 0.0, "data.masking.keep_prob": 0.0,
    "data.objective": "none",  # --task masked_lm
    "model.hidden_dropout_prob": 0.1, "model.attention_probs_dropout_prob": 0.1,
    "model.pre_layer_norm": True,  # --encoder-normalize-before
    "seed": 1,
}


def _get(config, dotted):
  for key in dotted.split("."):
    config = config[key]
  return config


def test_efficient_is_the_script_and_passes_the_trainers_checks():
  """Fails if a value drifted from the script, the network is not pre-LN RoBERTa-large
  with RoBERTa's positions, or the trainer would refuse the config on an 8-device mesh."""
  config = pretrain.get_config("efficient")
  drift = {k: (_get(config, k), v) for k, v in SCRIPT.items() if _get(config, k) != v}
  assert not drift
  bert_config = pretrain_steps.network(config, vocab_size=30522)
  assert (bert_config.num_hidden_layers, bert_config.hidden_size,
          bert_config.num_attention_heads, bert_config.intermediate_size) == (24, 1024, 16, 4096)
  assert (bert_config.position_offset, bert_config.max_position_embeddings,
          bert_config.type_vocab_size) == (2, 514, 1)
  assert bert_config.hf_model_type == "roberta-prelayernorm"
  (phase,) = phases.of(config)  # one phase
  data_config = phase.data
  assert specs.max_predictions(data_config) == 52  # ceil(40% of 128) slots
  mesh, _ = state_lib.setup_mesh(config)
  assert mesh.devices.size == len(jax.devices()) == 8
  pretrain_steps.check_config(config, mesh)
  # 6% warmup, then linear to 0 at step 23k.
  _, schedule = optim.make_optimizer(config.optimizer, config.total_steps)
  np.testing.assert_allclose([schedule(1_380), schedule(12_190), schedule(23_000)],
                             [2e-3, 1e-3, 0.0], atol=1e-9)
