"""The PTB LSTM on the any-batch step: one [m, H] carry per micro-batch, reset at a batch change
(where `PtbStream` re-lays the rest of the epoch), checkpointed with their count."""

import os
import signal

import jax
import numpy as np

from lbjax.train import any_batch as any_batch_lib, batch_policy, train_and_evaluate
from tests.train import helpers

MICRO = 8
# 24 windows of 16 rows per epoch; the batch changes mid-epoch, at 0.25 and 0.5 of the first one.
SCHEDULE = {"batch_sizes": (16, 32, 8), "batch_size_boundaries": (0.25, 0.5), "num_epochs": 1.0,
            "mesh.num_devices": 1}


def _merged(carries):
  """The micro-batch carries as one [B, H] carry (one device: micro-batch j holds rows j*m..)."""
  return jax.tree.map(lambda *parts: np.concatenate(parts), *helpers.host_tree(carries))


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
