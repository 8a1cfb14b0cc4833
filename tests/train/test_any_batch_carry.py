"""The PTB LSTM on the any-batch step: one [m, H] carry per micro-batch, reset at a batch change
(where `PtbStream` re-lays the rest of the epoch), checkpointed with their count; on one device and
split over 4 data-parallel devices, and joined back in the batch's order by `whole_batch`."""

import os
import signal

import jax
import numpy as np
import pytest

from lbjax.train import any_batch as any_batch_lib, batch_policy, train_and_evaluate
from lbjax.train.run import Run
from lbjax.train.step import loops_slow_down_convolutions
from tests.train import helpers

MICRO = 8
# 24 windows of 16 rows per epoch; the batch changes mid-epoch, at 0.25 and 0.5 of the first one.
SCHEDULE = {"batch_sizes": (16, 32, 8), "batch_size_boundaries": (0.25, 0.5), "num_epochs": 1.0,
            "mesh.num_devices": 1}


def _merged(carries, data=1):
  """The micro-batch carries as one [B, H] carry in the batch's row order: on `data` data-parallel
  devices micro-batch j holds the j-th slice of each device's share (on one device, rows j*m..)."""

  def merge(*parts):
    stacked = np.stack(parts)  # [k, m, H]
    k, m = stacked.shape[:2]
    return stacked.reshape(k, data, m // data, -1).swapaxes(0, 1).reshape(k * m, -1)

  return jax.tree.map(merge, *helpers.host_tree(carries))


def test_a_fixed_batch_on_the_any_batch_step_equals_the_in_step_accumulation_carries_included(tmp_path):
  """Batch 16 as 2 micro-batches of 8, over one epoch (24 updates, the carry running through):
  the same parameters, optimizer state and carry as the per-size step accumulating micro-batches
  of 8 in one program."""
  overrides = {"num_epochs": 1.0, "mesh.num_devices": 1}
  per_size = train_and_evaluate(helpers.tiny_language_model_config(max_device_batch=MICRO, **overrides),
                                tmp_path / "scan")
  any_batch = train_and_evaluate(helpers.tiny_language_model_config(**overrides, **{"batch.micro_batch_size": MICRO}),
                                 tmp_path / "any")
  assert per_size.step == any_batch.step == 24
  assert len(any_batch.state.carry) == 2
  helpers.assert_trees_close(per_size.state.params, any_batch.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(per_size.state.opt_state, any_batch.state.opt_state, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(per_size.state.carry, _merged(any_batch.state.carry), rtol=2e-5, atol=2e-6)


def test_more_micro_batches_than_one_call_takes_equal_the_in_step_accumulation(tmp_path):
  """SLOTS + 2 micro-batches of 2 rows (two calls of the accumulation program, the second using 2 of
  its slots, dropout on): the same parameters, optimizer state and carries as the per-size step
  accumulating them in one program."""
  overrides = {"num_epochs": 1.0, "mesh.num_devices": 1, "batch_size": 2 * (any_batch_lib.SLOTS + 2)}
  per_size = train_and_evaluate(helpers.tiny_language_model_config(max_device_batch=2, **overrides), tmp_path / "scan")
  any_batch = train_and_evaluate(helpers.tiny_language_model_config(**overrides, **{"batch.micro_batch_size": 2}),
                                 tmp_path / "any")
  assert per_size.step == any_batch.step > 1
  assert len(any_batch.state.carry) == any_batch_lib.SLOTS + 2
  helpers.assert_trees_close(per_size.state.params, any_batch.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(per_size.state.opt_state, any_batch.state.opt_state, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(per_size.state.carry, _merged(any_batch.state.carry), rtol=2e-5, atol=2e-6)


def test_a_sigterm_after_a_mid_epoch_batch_change_resumes_bit_identically(tmp_path, monkeypatch):
  """Stopped after step 9, 3 updates after the batch went from 16 to 32 rows (stream re-laid, 4
  carries of 8 rows): the resumed run restores the re-lay and the 4 carries and ends where the
  unbroken run ends, bit for bit."""
  config = lambda: helpers.tiny_language_model_config(**SCHEDULE, **{"batch.micro_batch_size": MICRO})
  unbroken = train_and_evaluate(config(), tmp_path / "unbroken")
  after_step = batch_policy.BatchPolicy.after_step

  def terminate_after(self, step, *args):
    after_step(self, step, *args)
    if step == 9:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(batch_policy.BatchPolicy, "after_step", terminate_after)
  preempted = train_and_evaluate(config(), tmp_path / "resumed")
  monkeypatch.undo()
  assert preempted.preempted and preempted.step == 9 and len(preempted.state.carry) == 4
  resumed = train_and_evaluate(config(), tmp_path / "resumed")
  assert resumed.step == unbroken.step and resumed.epoch == unbroken.epoch
  helpers.assert_trees_equal(resumed.state, unbroken.state)


DATA = 4  # data-parallel devices: each holds MICRO // DATA = 2 rows of every micro-batch


def _rows_by_device(x):
  return {shard.device: np.asarray(shard.data) for shard in x.addressable_shards}


def test_on_a_data_parallel_mesh_the_carries_are_split_as_the_batch_and_the_run_equals_one_device(tmp_path):
  """Batch 16 as 2 micro-batches of 8 on 4 data-parallel devices, over one epoch (24 updates): the same
  parameters and optimizer state as on one device and as the per-size step on the same mesh
  accumulating 2 micro-batches in one program (max_device_batch 2), and, rows put back in the batch's
  order, the same [16, H] carry as both. Each device
  holds, of micro-batch j's [8, H] carry, the rows j*2..j*2+1 of its own [4, H] share of the per-size
  step's [16, H] carry: no row of a carry changes device. Dropout on (rate 0.1): row n of the batch
  draws its masks from its own key whichever micro-batch and device hold it, although micro-batch j
  holds other rows on one device than on four."""
  config = lambda **overrides: helpers.tiny_language_model_config(num_epochs=1.0, **overrides)
  any_batch = train_and_evaluate(config(**{"mesh.num_devices": DATA, "batch.micro_batch_size": MICRO}),
                                 tmp_path / "any")
  one_device = train_and_evaluate(config(**{"mesh.num_devices": 1, "batch.micro_batch_size": MICRO}),
                                  tmp_path / "one")
  per_size = train_and_evaluate(config(**{"mesh.num_devices": DATA, "max_device_batch": MICRO // DATA}),
                                tmp_path / "scan")
  assert any_batch.step == one_device.step == per_size.step == 24
  for other in (one_device, per_size):
    helpers.assert_trees_close(any_batch.state.params, other.state.params, rtol=2e-5, atol=2e-6)
    helpers.assert_trees_close(any_batch.state.opt_state, other.state.opt_state, rtol=2e-5, atol=2e-6)
  assert len(any_batch.state.carry) == 2
  for merged in (_merged(any_batch.state.carry, DATA), _merged(one_device.state.carry)):
    helpers.assert_trees_close(merged, per_size.state.carry, rtol=2e-5, atol=2e-6)
  _assert_each_device_holds_its_rows(any_batch.state.carry, per_size.state.carry)


def _assert_each_device_holds_its_rows(carries, whole_carry):
  """Micro-batch j's carry holds, on each device, rows j*s..(j+1)*s-1 of that device's share of the
  per-size step's [B, H] carry, s = m / DATA."""
  share = MICRO // DATA
  for j, carry in enumerate(carries):
    for part, whole in zip(jax.tree.leaves(carry), jax.tree.leaves(whole_carry)):
      assert len(part.sharding.device_set) == DATA
      whole_rows = _rows_by_device(whole)
      for device, rows in _rows_by_device(part).items():
        assert rows.shape == (share, 8)
        np.testing.assert_allclose(rows, whole_rows[device][j * share:(j + 1) * share], rtol=2e-5, atol=2e-6)


def test_on_a_data_parallel_mesh_a_mid_epoch_batch_change_equals_the_per_size_steps(tmp_path):
  """SCHEDULE's batches 16 -> 32 -> 8 (the stream re-laid twice, the carries reset to 2, 4, 1 of 8
  rows) on 4 data-parallel devices: the any-batch run ends with the parameters, optimizer state and
  carry of the per-size steps accumulating micro-batches of 2 rows per device. Dropout on: both draw
  row n's masks from the step's key folded with n, at one micro-batch (batch 8) too."""
  schedule = {**SCHEDULE, "mesh.num_devices": DATA}
  any_batch = train_and_evaluate(helpers.tiny_language_model_config(**schedule, **{"batch.micro_batch_size": MICRO}),
                                 tmp_path / "any")
  per_size = train_and_evaluate(helpers.tiny_language_model_config(**schedule, max_device_batch=MICRO // DATA),
                                tmp_path / "scan")
  assert any_batch.step == per_size.step and any_batch.compiled_batch_sizes == (16,)
  assert per_size.compiled_batch_sizes == (16, 32, 8)
  helpers.assert_trees_close(any_batch.state.params, per_size.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(any_batch.state.opt_state, per_size.state.opt_state, rtol=2e-5, atol=2e-6)
  assert len(any_batch.state.carry) == 1  # the last batch: 8 rows
  _assert_each_device_holds_its_rows(any_batch.state.carry, per_size.state.carry)


@pytest.mark.parametrize("num_devices", [1, DATA])
def test_whole_batch_joins_the_micro_batches_and_their_carries_in_the_batch_order(num_devices):
  """`whole_batch` (the batch of the non-finite diagnosis and of layer_table) of a batch of 16 rows
  placed as 2 micro-batches of 8 on 1 or 4 data-parallel devices: row i is the batch's row i, and the
  carries' rows move with their batch rows."""
  run = Run(helpers.tiny_language_model_config(**{"mesh.num_devices": num_devices, "batch.micro_batch_size": MICRO}))
  rows = np.arange(16 * 3, dtype=np.int32).reshape(16, 3)
  micro_batches = run.any_batch.place({"inputs": rows}, 16)
  carries = tuple(micro["inputs"] + 1000 for micro in micro_batches)  # a carry row per batch row
  arrays, carry = any_batch_lib.whole_batch(micro_batches, carries)
  np.testing.assert_array_equal(np.asarray(arrays["inputs"]), rows)
  np.testing.assert_array_equal(np.asarray(carry), rows + 1000)


def test_only_models_with_convolutions_skip_the_rolled_loop_on_cpu():
  """`loops_slow_down_convolutions`: 4-D kernels on the CPU backend (the ResNets), not the LSTMs' 2-D ones."""
  lstm = {"kernel": np.zeros((4, 8)), "bias": np.zeros(8)}
  resnet = {"conv": {"kernel": np.zeros((3, 3, 4, 8))}, "dense": {"kernel": np.zeros((8, 2))}}
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  assert mesh.devices.flat[0].platform == "cpu"
  assert loops_slow_down_convolutions(resnet, mesh) and not loops_slow_down_convolutions(lstm, mesh)
