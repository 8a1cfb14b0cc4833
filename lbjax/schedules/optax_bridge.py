"""From epoch schedules to Optax: per-step schedules, and driving the LR from examples seen.

Optax schedules are functions of the update count. For a fixed batch size B on N training
examples, step t starts at epoch t * B / N, and `to_optax(schedule, B, N)` is simply
`t -> schedule(t * B / N)`. When the batch size changes during the run (`BatchSizeSchedule`), the
epoch of step t depends on all earlier batch sizes; `to_optax(schedule, batch_size_schedule, N)`
uses the exact step -> epoch map of `BatchSizeSchedule.segments`, so warm-up and decay stay where
the recipe puts them in epochs.

The trainer instead drives the optimizer from the host, with `optax.inject_hyperparams` and the
learning rate given as a number (not a callable, which Optax would re-evaluate on its count):

  tx = optax.inject_hyperparams(optax.sgd)(learning_rate=lr_schedule(0.0), momentum=0.9)
  ...
  epoch = examples_seen / num_train_examples          # before the step
  opt_state.hyperparams["learning_rate"] = jnp.asarray(lr_schedule(epoch), jnp.float32)
  params, opt_state = train_step(params, opt_state, batch)  # batch of size bs_schedule(epoch)
  examples_seen += batch_size

Both ways give the same learning rate at every step (tests/schedules/test_optax_bridge.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lbjax.schedules import base
from lbjax.schedules import batch_size as batch_size_lib
from lbjax.schedules import validation


def to_optax(
    schedule: base.Schedule,
    batch_size: int | batch_size_lib.BatchSizeSchedule,
    num_train_examples: int,
) -> optax.Schedule:
  """Returns the Optax schedule `step -> schedule(epoch at the start of step)`.

  For a fixed batch size B: epoch(t) = t * B / N. For a `BatchSizeSchedule`: on segment i (see
  `BatchSizeSchedule.segments`), epoch(t) = (start_examples_i + (t - start_step_i) * B_i) / N.
  Under jit the epoch is computed in float32 (a relative error ~1e-7, so a boundary epoch that
  falls exactly on a step may land one step late); on the host (Python int step) it is exact.

  Args:
    schedule: an epoch schedule (`lbjax.schedules.base.Schedule`).
    batch_size: the global batch size, a positive int, or a `BatchSizeSchedule`.
    num_train_examples: N, the training-set size, a positive int.

  Returns:
    A function of the update count usable wherever Optax takes a schedule.
  """
  if not callable(schedule):
    raise TypeError(f"schedule must be a schedule (epoch -> value), got {schedule!r}.")
  if isinstance(batch_size, batch_size_lib.BatchSizeSchedule):
    batch_size_schedule = batch_size
  else:
    batch_size_schedule = batch_size_lib.constant_batch_size(
        validation.check_positive_int("batch_size", batch_size)
    )
  num_train_examples = validation.check_positive_int("num_train_examples", num_train_examples)
  segments = batch_size_schedule.segments(num_train_examples)
  start_steps = np.asarray([s.start_step for s in segments], dtype=np.int32)
  start_epochs = np.asarray([s.start_examples / num_train_examples for s in segments])
  epochs_per_step = np.asarray([s.batch_size / num_train_examples for s in segments])

  def optax_schedule(count):
    if not isinstance(count, jax.Array):
      return schedule(batch_size_schedule.epoch_at_step(count, num_train_examples))
    count = jnp.asarray(count, dtype=jnp.int32)
    # Index of the last segment starting at or before `count` (zero-step segments share a start).
    index = jnp.sum(count[..., None] >= jnp.asarray(start_steps), axis=-1) - 1
    steps_into_segment = (count - jnp.asarray(start_steps)[index]).astype(jnp.float32)
    epoch = (
        jnp.asarray(start_epochs, jnp.float32)[index]
        + steps_into_segment * jnp.asarray(epochs_per_step, jnp.float32)[index]
    )
    return schedule(epoch)

  return optax_schedule
