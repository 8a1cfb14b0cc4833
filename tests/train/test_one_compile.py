"""Any batch that is a whole number of micro-batches runs on programs compiled once (lbjax.train.any_batch).

The compile count is read from JAX's own monitoring event for every XLA backend compilation, so a
stray recompile anywhere in the run (train step, eval step, helpers) would show.
"""

import jax
import pytest

from lbjax.train import train_and_evaluate
from tests.train import helpers

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture
def backend_compiles():
  events = []
  listener = lambda event, seconds, **_: events.append(event) if event == BACKEND_COMPILE_EVENT else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  yield events
  jax.monitoring.unregister_event_duration_listener(listener)


def _compiles_of(config, workdir, events) -> int:
  jax.clear_caches()  # nothing compiled by an earlier run or test may be reused
  events.clear()
  train_and_evaluate(config, workdir)
  return len(events)


def test_a_four_size_schedule_compiles_as_often_as_one_size(tmp_path, backend_compiles):
  four_sizes = helpers.tiny_classifier_config(**{
      "batch.micro_batch_size": 16, "batch_sizes": (16, 32, 64, 128), "batch_size_boundaries": (0.25, 0.5, 0.75),
      "num_epochs": 1.0})
  one_size = helpers.tiny_classifier_config(**{"batch.micro_batch_size": 16, "batch_size": 64})
  many = _compiles_of(four_sizes, tmp_path / "four", backend_compiles)
  one = _compiles_of(one_size, tmp_path / "one", backend_compiles)
  assert many == one, f"a 4-size schedule compiled {many} programs, a 1-size run {one}"


def test_a_ptb_schedule_changing_the_batch_mid_epoch_compiles_as_often_as_one_size(tmp_path, backend_compiles):
  """The PTB LSTM with its carries: 16 -> 32 -> 8 rows at 0.25 and 0.5 of the epoch (the stream
  re-laid, the carries reset to 2, 4 and 1 of 8 rows) compiles what a run at 16 rows does."""
  common = {"batch.micro_batch_size": 8, "num_epochs": 1.0}
  three_sizes = helpers.tiny_language_model_config(**common, batch_sizes=(16, 32, 8), batch_size_boundaries=(0.25, 0.5))
  one_size = helpers.tiny_language_model_config(**common)
  many = _compiles_of(three_sizes, tmp_path / "three", backend_compiles)
  one = _compiles_of(one_size, tmp_path / "one", backend_compiles)
  assert many == one, f"a 3-size PTB schedule compiled {many} programs, a 1-size run {one}"


def test_without_micro_batches_each_size_compiles_its_own_step(tmp_path, backend_compiles):
  """The per-size step the any-batch step replaces: 3 more compiles for 3 more sizes (the baseline
  the previous test improves on)."""
  four_sizes = helpers.tiny_classifier_config(batch_sizes=(16, 32, 64, 128), batch_size_boundaries=(0.25, 0.5, 0.75))
  one_size = helpers.tiny_classifier_config(batch_size=64)
  many = _compiles_of(four_sizes, tmp_path / "four", backend_compiles)
  one = _compiles_of(one_size, tmp_path / "one", backend_compiles)
  assert many == one + 3


def test_micro_batches_of_16_equal_the_true_batch_of_64_with_ghost_batch_norm(tmp_path):
  """The update, BatchNorm running statistics (groups of 8) and LARS state of 4 micro-batches of 16
  equal those of one batch of 64, as the in-step accumulation's do (test_trainer; one device, so a
  group of 8 lies within one device's micro share, as ghost BN needs)."""
  overrides = {"batch_size": 64, "mesh.num_devices": 1, "optimizer.name": "lars", "lr.base": 1.0}
  true_batch = train_and_evaluate(helpers.tiny_resnet_config(**overrides), tmp_path / "true")
  any_batch = train_and_evaluate(helpers.tiny_resnet_config(**overrides, **{"batch.micro_batch_size": 16}),
                                 tmp_path / "micro")
  assert true_batch.step == any_batch.step == 4
  helpers.assert_trees_close(true_batch.state.params, any_batch.state.params, rtol=2e-5, atol=2e-6)
  helpers.assert_trees_close(true_batch.state.model_state, any_batch.state.model_state)
  helpers.assert_trees_close(true_batch.state.opt_state, any_batch.state.opt_state, rtol=2e-5, atol=2e-6)


def test_the_any_batch_step_equals_the_in_step_accumulation_over_a_schedule(tmp_path):
  """Over a 3-size schedule (16, 32, 64), micro-batches of 16 match the per-size steps that
  accumulate micro-batches of 16 inside the compiled step."""
  schedule = dict(batch_sizes=(16, 32, 64), batch_size_boundaries=(0.25, 0.5), num_epochs=1.0)
  per_size = train_and_evaluate(helpers.tiny_classifier_config(max_device_batch=16, **schedule), tmp_path / "scan")
  any_batch = train_and_evaluate(helpers.tiny_classifier_config(**schedule, **{"batch.micro_batch_size": 16}),
                                 tmp_path / "any")
  assert per_size.step == any_batch.step
  assert per_size.compiled_batch_sizes == (16, 32, 64) and any_batch.compiled_batch_sizes == (16,)
  helpers.assert_trees_close(per_size.state.params, any_batch.state.params, rtol=2e-5, atol=2e-6)
