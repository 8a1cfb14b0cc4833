"""`build.StepParts`: the steps of a resolved run compile from abstract arrays, with the state's shapes
and shardings exactly those of the state a `Run` initialises (what `--compile-only` relies on)."""

import jax
import numpy as np

from lbjax.train import build
from lbjax.train import validation
from tests.train import helpers


def _abstract_batch(parts, local):
  count = jax.process_count()
  return {k: jax.ShapeDtypeStruct((v.shape[0] * count,) + v.shape[1:], v.dtype, sharding=parts.batch_sharding)
          for k, v in local.items()}


def test_the_abstract_state_is_the_initial_states_shapes_and_shardings():
  resolved = validation.validate(helpers.tiny_classifier_config(**{"mesh.fsdp": 2}), data_parallel_size=8)
  mesh = resolved.mesh.build()
  parts = build.StepParts.create(resolved, resolved.open_task(), mesh)
  abstract, initial = parts.abstract_state(), parts.initial_state()
  describe = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), tree)
  assert describe(abstract) == describe(initial)


def test_every_train_step_of_a_schedule_and_the_eval_step_compile_without_initialising():
  config = helpers.tiny_classifier_config(batch_sizes=(16, 32), batch_size_boundaries=(0.5,), max_device_batch=2)
  resolved = validation.validate(config, data_parallel_size=8)
  parts = build.StepParts.create(resolved, resolved.open_task(), resolved.mesh.build())
  state = parts.abstract_state()
  stream = parts.task.dataset.make_train_stream(0, 1)
  for size in resolved.batch.sizes:
    batch = _abstract_batch(parts, stream.next_batch(size))
    compiled = parts.train_step(size, 0.0, state, batch).lower(state, batch, parts.abstract_learning_rate()).compile()
    assert " all-reduce" in compiled.as_text()  # the gradient is reduced over the 8 data-parallel devices
  eval_batch = _abstract_batch(parts, next(iter(parts.task.dataset.make_eval_batches(32, 0, 1))))
  assert parts.eval_step().lower(state.params, state.model_state, eval_batch, None).compile() is not None
  assert resolved.batch.num_microbatches(32, parts.data_parallel_size) == 2  # each share of 4 in two steps


def test_a_calls_batches_are_placed_as_one_stack_of_the_batches_placed_alone():
  """`global_call_batches` (a call of `steps_per_call` steps): row j of each [k, B, ...] input is batch j
  as `global_batch` places it, the step axis whole on every device and the example axis split as a batch's."""
  resolved = validation.validate(helpers.tiny_classifier_config(**{"mesh.fsdp": 2}), data_parallel_size=8)
  parts = build.StepParts.create(resolved, resolved.open_task(), resolved.mesh.build())
  stream = parts.task.dataset.make_train_stream(0, 1)
  local_batches = [stream.next_batch(16) for _ in range(3)]
  stacked = build.global_call_batches(local_batches, parts.call_batch_sharding)
  for name, array in stacked.items():
    assert array.shape == (3, 16) + local_batches[0][name].shape[1:]
    assert array.sharding.shard_shape(array.shape)[:2] == (3, 16 // 8)
    for row, local in enumerate(local_batches):
      np.testing.assert_array_equal(array[row], build.global_batch(local, parts.batch_sharding)[name])
