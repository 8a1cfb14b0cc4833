"""Model parallelism in the trainer on 8 simulated devices: a PTB LSTM pipelined over `mesh.stage`
(GPipe, with data parallelism alongside) and tensor-sharded over `mesh.model` equals the one-device
run and resumes exactly; unsupported combinations are refused before compute."""

import json

import jax
from jax.sharding import PartitionSpec as P
import pytest

from lbjax.train import train_and_evaluate
from tests.train import helpers

# Half an epoch of the tiny PTB LSTM (12 steps of 16 windows, dropout on): short, and crosses no epoch.
HALF_EPOCH = {"num_epochs": 0.5}
LAYOUTS = {
    "stage2_data4_remat": {"mesh.stage": 2, "pipeline.num_microbatches": 2, "pipeline.remat": True},
    "stage4_data2": {"mesh.stage": 4, "model_options.num_layers": 4, "pipeline.num_microbatches": 4},
    "model2_data4": {"mesh.model": 2},
}


def _config(**overrides):
  return helpers.tiny_language_model_config(**HALF_EPOCH, **overrides)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_parallel_ptb_run_equals_the_one_device_run_and_resumes_exactly(tmp_path, layout):
  """Parameters, momentum, carried LSTM state and perplexity equal the one-device run's (up to float
  rounding); stopped after 5 steps and resumed, the run ends bit-identical to the uninterrupted one."""
  overrides = LAYOUTS[layout]
  layers = {k: v for k, v in overrides.items() if k.startswith("model_options")}
  single = train_and_evaluate(_config(**{"mesh.num_devices": 1}, **layers), tmp_path / "one")
  parallel = train_and_evaluate(_config(**overrides), tmp_path / layout)
  assert parallel.step == single.step == 12
  helpers.assert_trees_close(parallel.state.params, single.state.params)
  helpers.assert_trees_close(parallel.state.opt_state, single.state.opt_state)
  helpers.assert_trees_close(parallel.state.carry, single.state.carry)
  assert parallel.eval_metrics["loss"] == pytest.approx(single.eval_metrics["loss"], rel=1e-5)
  train_and_evaluate(_config(**overrides, num_steps=5), tmp_path / "resumed")
  resumed = train_and_evaluate(_config(**overrides), tmp_path / "resumed")
  assert resumed.step == 12
  helpers.assert_trees_equal(resumed.state, parallel.state)
  assert resumed.eval_metrics == parallel.eval_metrics


def test_tensor_sharded_resnet_head_equals_the_one_device_run_and_resumes_exactly(tmp_path):
  """The ResNet head's classes over `model` = 2 (4 data shards, ghost BatchNorm): parameters and BatchNorm
  statistics equal the one-device run's; stopped after 1 step and resumed, the run ends bit-identical."""
  sharded_config = lambda steps: helpers.tiny_resnet_config(**{"mesh.model": 2, "num_steps": steps})
  single = train_and_evaluate(helpers.tiny_resnet_config(**{"mesh.num_devices": 1, "num_steps": 3}), tmp_path / "1")
  sharded = train_and_evaluate(sharded_config(3), tmp_path / "2")
  assert sharded.state.params["head"]["kernel"].sharding.spec == P(None, "model")
  helpers.assert_trees_close(sharded.state.params, single.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(sharded.state.model_state, single.state.model_state)
  train_and_evaluate(sharded_config(1), tmp_path / "resumed")
  resumed = train_and_evaluate(sharded_config(3), tmp_path / "resumed")
  assert resumed.step == 3
  with open(tmp_path / "resumed" / "metrics.jsonl") as f:
    assert [r["step"] for r in map(json.loads, f) if r["kind"] == "resume"] == [1]
  assert resumed.state.params["head"]["kernel"].sharding.spec == P(None, "model")
  helpers.assert_trees_equal(resumed.state, sharded.state)
  assert resumed.eval_metrics == sharded.eval_metrics


def test_sharded_parameters_and_their_optimizer_state_are_split_over_model(tmp_path):
  run = train_and_evaluate(_config(**{"mesh.model": 4, "num_steps": 1}), tmp_path)
  params, momentum = run.state.params, run.state.opt_state
  assert params["embed"]["embedding"].sharding.spec == P("model", None)
  assert params["softmax"]["kernel"].sharding.spec == P(None, "model")
  assert params["softmax"]["bias"].addressable_shards[0].data.shape == (20 // 4,)
  trace = [x for x in jax.tree.leaves(momentum) if x.shape == (8, 20)]
  assert trace and all(x.sharding.spec == P(None, "model") for x in trace)


@pytest.mark.parametrize("overrides, message", [
    ({"mesh.stage": 3}, r"config.mesh.stage=3 does not divide the 8 devices"),
    ({"mesh.stage": 2, "mesh.data": 2},
     r"config.mesh.data \* config.mesh.fsdp \* config.mesh.stage = 2 \* 1 \* 2 = 4 but there are 8 devices"),
    ({"mesh.stage": 4}, r"config.mesh.stage=4 does not divide the 2 layers of PtbLSTM"),
    ({"mesh.stage": 2, "model_options.embed_size": 6},
     r"PtbLSTM's 2 layers are not identical .* set model_options.embed_size equal to hidden_size"),
    ({"mesh.stage": 2, "pipeline.num_microbatches": 3},
     r"global batch size 16 does not split into 4 data shard\(s\) of config.pipeline.num_microbatches=3"),
    ({"pipeline.num_microbatches": 2}, r"config.pipeline.num_microbatches=2 / remat=False .* but mesh.stage=1"),
    ({"mesh.stage": 2, "mesh.model": 2}, r"either pipelining or tensor sharding .* set one of them to 1"),
    ({"mesh.stage": 2, "mesh.fsdp": 2}, r"config.mesh.stage=2 with config.mesh.fsdp=2: .* set mesh.fsdp=1"),
    ({"mesh.stage": 2, "compression.name": "qsgd"}, r"config.compression.name='qsgd' computes whole per-device"),
    ({"mesh.model": 2, "mesh.per_device_gradients": True},
     r"config.mesh.per_device_gradients=True computes whole per-device gradients .* or config.mesh.model=1"),
    ({"mesh.stage": 2, "max_device_batch": 2}, r"config.max_device_batch=2 with config.mesh.stage=2"),
    ({"mesh.stage": 2, "batch.micro_batch_size": 8}, r"config.batch.micro_batch_size=8 \(the any-batch step\)"),
    ({"mesh.model": 8, "data_options.vocab_size": 20}, r"config.mesh.model=8 does not divide embed/embedding's "
                                                       r"dimension of 20"),
    ({"mesh.model": 0}, r"config.mesh.model must be an integer >= 1, got 0"),
])
def test_unsupported_model_parallel_configs_are_refused_before_compute(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(_config(**overrides), tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()


def test_a_model_without_a_declared_stack_is_refused(tmp_path):
  with pytest.raises(ValueError, match=r"config.mesh.stage=2: config.model='MnistLSTM' declares no PIPELINED_STACK"):
    train_and_evaluate(helpers.tiny_classifier_config(**{"mesh.stage": 2}), tmp_path)


def test_optimizer_state_whose_shape_the_model_axis_does_not_divide_is_not_split(tmp_path):
  """Adafactor keeps a (1,)-shaped factored statistic of the 1-D softmax bias: its path and rank match the bias's
  spec P('model'), but a size-1 axis cannot be split over model=2 (it failed to compile with a traceback). It is
  replicated; the run equals the one-device run."""
  config = lambda **more: _config(**{"optimizer.name": "adafactor", "num_steps": 2}, **more)
  single = train_and_evaluate(config(**{"mesh.num_devices": 1}), tmp_path / "one")
  sharded = train_and_evaluate(config(**{"mesh.model": 2}), tmp_path / "two")
  assert sharded.state.params["softmax"]["bias"].sharding.spec == P("model")
  helpers.assert_trees_close(sharded.state.params, single.state.params)
