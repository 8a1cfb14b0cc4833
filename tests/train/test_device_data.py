"""`config.train_data_on_device`: the training set held on the devices trains the run of batches sent from
the host, bit for bit, and is refused, before any compute, where it cannot be held."""

import json

import numpy as np
import pytest

from lbjax import data as lbdata
from lbjax import main as cli
from lbjax.train import ConfigError, train_and_evaluate
from lbjax.train.build import global_call_batches
from lbjax.train.device_data import DeviceTrainingSet
from lbjax.train.run import Run
from tests.train import helpers

# Three batch sizes over two epochs (a batch straddles the first epoch's end), evaluations every half epoch.
SCHEDULE = {"batch_sizes": (16, 32, 64), "batch_size_boundaries": (0.25, 0.5), "num_epochs": 2.0,
            "eval_every_epochs": 0.5, "log_every": 3}


def _train_losses(workdir):
  with open(workdir / "metrics.jsonl") as f:
    return [(r["step"], r["loss"]) for r in map(json.loads, f) if r["kind"] == "train"]


def _assert_same_training(host, device, host_dir, device_dir):
  assert host.step == device.step and host.examples_seen == device.examples_seen
  helpers.assert_trees_equal(host.state.params, device.state.params)
  helpers.assert_trees_equal(host.state.opt_state, device.state.opt_state)
  helpers.assert_trees_equal(host.state.model_state, device.state.model_state)
  assert host.eval_metrics == device.eval_metrics
  assert _train_losses(host_dir) == _train_losses(device_dir)


@pytest.mark.parametrize("overrides", [
    {},
    {"steps_per_call": 3},  # calls of 3 steps (their stacked indices) and single steps between them
    {"mesh.fsdp": 2, "batch.micro_batch_size": 8},  # parameters split; the any-batch step's micro-batches
], ids=["steps", "calls", "fsdp_micro_batches"])
def test_the_training_set_on_the_devices_trains_the_run_of_host_batches_bit_for_bit(tmp_path, overrides):
  """The MNIST LSTM over a batch-size schedule on 8 devices: the same parameters, optimizer state, losses
  and evaluations, bit for bit."""
  host = train_and_evaluate(helpers.tiny_classifier_config(**SCHEDULE, **overrides), tmp_path / "host")
  device = train_and_evaluate(helpers.tiny_classifier_config(train_data_on_device=True, **SCHEDULE, **overrides),
                              tmp_path / "device")
  assert host.step == 12
  _assert_same_training(host, device, tmp_path / "host", tmp_path / "device")


@pytest.mark.parametrize("overrides", [{}, {"mesh.model": 2}], ids=["data", "head_split_over_model"])
def test_a_resnet_on_float_images_trains_bit_for_bit_with_its_training_set_on_the_devices(tmp_path, overrides):
  """Float32 images [N, 8, 8, 3] and BatchNorm statistics; also with the head split over a `model` axis (the
  batch then split over `data` alone)."""
  config = lambda **o: helpers.tiny_resnet_config(num_epochs=0.5, log_every=2, **overrides, **o)
  host = train_and_evaluate(config(), tmp_path / "host")
  device = train_and_evaluate(config(train_data_on_device=True), tmp_path / "device")
  _assert_same_training(host, device, tmp_path / "host", tmp_path / "device")


def test_the_run_holds_the_training_set_on_every_device_and_its_stream_hands_out_indices():
  run = Run(helpers.tiny_classifier_config(train_data_on_device=True))
  try:
    images = run.task.dataset.fingerprinted_arrays["train"]["images"]
    assert run.training_set.nbytes == images.nbytes + run.task.dataset.fingerprinted_arrays["train"]["labels"].nbytes
    batch = run.next_batch()
    host = run.stream.batch_at(0, 32)
    assert set(host) == {lbdata.INDEX} and host[lbdata.INDEX].dtype == np.int32
    np.testing.assert_array_equal(np.asarray(batch.arrays["images"]), images[host[lbdata.INDEX]])
    assert batch.arrays["images"].dtype == np.uint8 and len(batch.arrays["images"].sharding.device_set) == 8
    assert not batch.arrays["images"].sharding.is_fully_replicated
  finally:
    run.close()


def test_a_checkpoint_of_host_batches_resumes_with_the_training_set_on_the_devices(tmp_path):
  """The stream's position is the same integer in both ways, so a run may change the setting on resume:
  one epoch with host batches, the second with the training set on the devices, ends as two epochs of
  host batches."""
  whole = train_and_evaluate(helpers.tiny_classifier_config(**SCHEDULE), tmp_path / "whole")
  first = train_and_evaluate(helpers.tiny_classifier_config(**{**SCHEDULE, "num_epochs": 1.0}), tmp_path / "resumed")
  assert first.step == 8
  resumed = train_and_evaluate(helpers.tiny_classifier_config(train_data_on_device=True, **SCHEDULE),
                               tmp_path / "resumed")
  assert resumed.step == whole.step == 12
  helpers.assert_trees_equal(whole.state.params, resumed.state.params)
  helpers.assert_trees_equal(whole.state.opt_state, resumed.state.opt_state)


def test_a_stream_that_is_not_of_in_memory_arrays_is_refused_before_any_compute():
  with pytest.raises(ConfigError, match=r"train_data_on_device=True .* 'synthetic_ptb' does not read in-memory "
                                        r"arrays \(it is a PtbStream\);.*Set config.train_data_on_device=False"):
    Run(helpers.tiny_language_model_config(train_data_on_device=True))


def test_a_stream_with_a_host_transform_is_refused():
  source = lbdata.ArraySource(images=np.zeros((8, 2, 2), np.uint8), labels=np.zeros(8, np.int32))
  stream = lbdata.TrainStream(source, seed=0, transform=lambda examples, positions: examples)
  with pytest.raises(ConfigError, match="'augmented' transforms its examples on the host"):
    DeviceTrainingSet(stream, "augmented")


class _SmallDevice:
  """A device that reports 1 MiB of memory."""

  def memory_stats(self):
    return {"bytes_limit": 2**20}

  def __str__(self):
    return "small:0"


class _Replicated:
  addressable_devices = {_SmallDevice()}


def test_a_training_set_larger_than_half_a_devices_memory_is_refused():
  source = lbdata.ArraySource(images=np.zeros((1024, 32, 32), np.uint8), labels=np.zeros(1024, np.int32))
  training_set = DeviceTrainingSet(lbdata.TrainStream(source, seed=0), "big")
  assert training_set.nbytes == 1024 * 1024 + 4096
  with pytest.raises(ConfigError, match=r"training set \(0.00 GiB\) on each device, more than half of small:0's "
                                        r"memory \(0.00 GiB\)"):
    training_set.place(_Replicated())


def test_a_setting_that_is_not_a_bool_is_refused():
  config = helpers.tiny_classifier_config()
  with config.ignore_type():
    config.train_data_on_device = "yes"
  with pytest.raises(ConfigError, match=r"config.train_data_on_device must be True or False, got 'yes'"):
    Run(config)


def test_a_calls_batches_are_gathered_from_the_host_indices_or_the_placed_ones_split_as_a_call_is():
  """A call's stacked indices [k, B] (the step axis whole) give [k, B, ...] arrays split the same way,
  whether the jitted gather takes the host's indices (one process) or indices placed from every process's
  rows (several)."""
  run = Run(helpers.tiny_classifier_config(train_data_on_device=True, steps_per_call=2))
  try:
    local = [run.next_host_batch().host_arrays for _ in range(2)]
    sharding = run.parts.call_batch_sharding
    index = global_call_batches(local, sharding)
    expected = run.task.dataset.fingerprinted_arrays["train"]["images"][np.asarray(index[lbdata.INDEX])]
    for gathered in (run.training_set.call_batch(local, sharding), run.training_set.gather(index)):
      assert gathered["images"].shape == (2, 32, 28, 28) and gathered["images"].sharding.spec == sharding.spec
      np.testing.assert_array_equal(np.asarray(gathered["images"]), expected)
  finally:
    run.close()


def test_the_dry_run_says_the_training_set_is_held_on_the_devices(capsys):
  assert cli.main(["--config", "mnist_lstm", "--config.train_data_on_device=True", "--dry-run"]) == 0
  batch_line, = [line for line in capsys.readouterr().out.splitlines() if line.startswith("batch ")]
  assert batch_line.endswith("; training set held on the devices")
