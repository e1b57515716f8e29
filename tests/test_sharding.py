"""Tests for bert_jax.sharding and the trainer on several meshes and processes.

The 8 CPU devices come from tests/conftest.py (XLA_FLAGS set before jax is imported).
"""

import json
import pathlib
import socket

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from bert_jax import checkpoint
from bert_jax import model as model_lib
from bert_jax import sharding
from bert_jax import train
from experiments.configs import pretrain


def _losses(workdir) -> dict[int, float]:
  records = [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_mesh_shape_takes_the_rest_and_refuses_mismatches():
  assert sharding.mesh_shape({"data": -1, "fsdp": 2, "tensor": 1}, 8) == (4, 2, 1)
  assert sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="needs 4 devices but 8 are available"):
    sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="do not divide the 8 available devices"):
    sharding.mesh_shape({"data": -1, "fsdp": 3, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    sharding.mesh_shape({"data": -1, "fsdp": -1, "tensor": 1}, 8)
  with pytest.raises(ValueError, match="config.mesh.tensor=0"):
    sharding.mesh_shape({"data": -1, "fsdp": 1, "tensor": 0}, 8)


def test_parameters_follow_the_logical_rules():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  rules = pretrain.get_config("tiny").logical_axis_rules
  module = model_lib.BertForPreTraining(model_lib.BertConfig.from_size("tiny", vocab_size=96))
  ids = jnp.zeros((1, 8), jnp.int32)
  boxed = jax.eval_shape(lambda: module.init(jax.random.key(0), ids, ids, ids, ids[:, :2]))
  shardings = sharding.logical_shardings(boxed["params"], mesh, rules)
  layer = shardings["bert"]["encoder"]["layer_0"]
  assert layer["attention"]["query"]["kernel"].spec == P("fsdp", "tensor", None)
  assert layer["attention"]["output"]["kernel"].spec == P("tensor", None, "fsdp")
  assert layer["intermediate"]["kernel"].spec == P("fsdp", "tensor")
  assert layer["output_layer_norm"]["scale"].spec == P("fsdp")
  assert shardings["bert"]["embeddings"]["word_embeddings"]["embedding"].spec == P("tensor", "fsdp")
  sharding.check_divisible(nn.unbox(boxed["params"]), shardings)
  # 96 words split 8 ways is fine; 2 heads are not.
  wide = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 8})
  with pytest.raises(ValueError, match=r"cannot be split 8 ways over mesh axes \('tensor',\)"):
    sharding.check_divisible(nn.unbox(boxed["params"]),
                             sharding.logical_shardings(boxed["params"], wide, rules))


def test_global_batch_is_split_over_data_and_fsdp():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  local = {"input_ids": np.arange(16 * 3, dtype=np.int32).reshape(16, 3)}
  batch = sharding.global_batch(local, mesh)
  np.testing.assert_array_equal(batch["input_ids"], local["input_ids"])
  assert batch["input_ids"].sharding.spec == P(("data", "fsdp"))
  assert {s.data.shape for s in batch["input_ids"].addressable_shards} == {(4, 3)}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(8, 1, 1), (2, 4, 1), (2, 2, 2)])
def test_meshes_follow_the_single_device_run(mesh, pretrain_reference_run, pretrain_test_config,
                                              tmp_path):
  data, fsdp, tensor = mesh
  config = pretrain_test_config(**{"mesh.data": data, "mesh.fsdp": fsdp, "mesh.tensor": tensor})
  train.train_and_evaluate(config, str(tmp_path))
  reference, ours = _losses(pretrain_reference_run), _losses(tmp_path)
  assert sorted(ours) == list(range(1, 21))
  np.testing.assert_allclose([ours[s] for s in sorted(ours)],
                             [reference[s] for s in sorted(ours)], rtol=1e-5)
  _, ref_params = checkpoint.load_params_from_workdir(str(pretrain_reference_run))
  _, params = checkpoint.load_params_from_workdir(str(tmp_path))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               params, ref_params)


@pytest.mark.slow
def test_two_processes_match_one_process(pretrain_test_config, pretrain_subprocess, tmp_path):
  """2 processes x 2 devices (jax.distributed on localhost) vs 1 process x 4 devices."""
  config = pretrain_test_config(**{"total_steps": 6, "checkpoint.every_steps": 3})
  single = pretrain_subprocess(config, tmp_path / "single", devices=4, synthetic=True)
  assert single.wait(timeout=600) == 0, (tmp_path / "single.log").read_text()[-3000:]

  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  processes = []
  for i in range(2):
    config.distributed.update(enabled=True, coordinator_address=f"localhost:{port}",
                              num_processes=2, process_id=i)
    processes.append(pretrain_subprocess(config, tmp_path / "multi", devices=2, synthetic=True,
                                         name=f"multi_{i}"))
  for i, p in enumerate(processes):
    assert p.wait(timeout=600) == 0, (tmp_path / f"multi_{i}.log").read_text()[-3000:]

  np.testing.assert_allclose(list(_losses(tmp_path / "multi").values()),
                             list(_losses(tmp_path / "single").values()), rtol=1e-5)
  _, single_params = checkpoint.load_params_from_workdir(str(tmp_path / "single"))
  _, multi_params = checkpoint.load_params_from_workdir(str(tmp_path / "multi"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               multi_params, single_params)
