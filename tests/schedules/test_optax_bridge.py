"""From epoch schedules to Optax, for a fixed and a changing batch size."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lbjax import schedules

N = 100  # Training-set size of these toy runs.


def _trainer_epochs(batch_size_schedule, num_steps):
  """Epoch at the start of each step, as the trainer computes it (examples seen / N)."""
  examples, epochs = 0, []
  for _ in range(num_steps):
    epochs.append(examples / N)
    examples += batch_size_schedule(examples / N)
  return epochs


def test_to_optax_matches_the_epoch_schedule_for_a_fixed_batch():
  lr = schedules.warmup_polynomial_decay(1.0, warmup_epochs=2, total_epochs=10)
  optax_lr = schedules.to_optax(lr, batch_size=16, num_train_examples=N)
  steps = np.arange(70)
  host = [optax_lr(int(t)) for t in steps]
  assert host == [lr(t * 16 / N) for t in steps]
  assert optax_lr(0) == 0.0
  assert optax_lr(6) == pytest.approx(0.48, rel=1e-12)  # Epoch 0.96 of a 2-epoch warm-up.
  assert optax_lr(25) == pytest.approx(0.5625, rel=1e-12)  # Epoch 4: (1 - 2/8)^2.
  jitted = jax.jit(jax.vmap(optax_lr))(jnp.asarray(steps, jnp.int32))
  np.testing.assert_allclose(np.asarray(jitted), host, rtol=1e-5, atol=1e-6)


def test_to_optax_follows_the_exact_epochs_of_a_changing_batch():
  lr = schedules.warmup_polynomial_decay(1.0, warmup_epochs=1.5, total_epochs=6)
  batch_sizes = schedules.BatchSizeSchedule((8, 24, 40), (0.5, 2.3))
  optax_lr = schedules.to_optax(lr, batch_sizes, N)
  epochs = _trainer_epochs(batch_sizes, 40)
  host = [optax_lr(t) for t in range(40)]
  assert host == [lr(e) for e in epochs]
  jitted = jax.jit(jax.vmap(optax_lr))(jnp.arange(40, dtype=jnp.int32))
  np.testing.assert_allclose(np.asarray(jitted), host, rtol=1e-5, atol=1e-6)


def _applied_learning_rates(batch_sizes, lr, num_steps, drive):
  """Runs SGD on loss(w) = w (gradient 1), so each step moves w by exactly -lr."""
  if drive == "inject_hyperparams":
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=lr(0.0))
  else:
    tx = optax.sgd(learning_rate=schedules.to_optax(lr, batch_sizes, N))
  params = jnp.zeros((), jnp.float32)
  opt_state = tx.init(params)

  @jax.jit
  def train_step(params, opt_state):
    updates, opt_state = tx.update(jnp.ones_like(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  examples, applied = 0, []
  for _ in range(num_steps):
    epoch = examples / N
    if drive == "inject_hyperparams":
      opt_state.hyperparams["learning_rate"] = jnp.asarray(lr(epoch), jnp.float32)
    new_params, opt_state = train_step(params, opt_state)
    applied.append(float(params - new_params))
    params = new_params
    examples += batch_sizes(epoch)
  return applied


@pytest.mark.parametrize("drive", ["inject_hyperparams", "to_optax"])
def test_warmup_stays_right_in_epochs_when_the_batch_grows(drive):
  """The LR applied at each step is lr(epoch at its start), whatever the batch sizes before it."""
  lr = schedules.linear_warmup(schedules.constant(0.5), warmup_epochs=2.0)
  batch_sizes = schedules.BatchSizeSchedule((10, 40), (0.5,))
  applied = _applied_learning_rates(batch_sizes, lr, 12, drive)
  epochs = _trainer_epochs(batch_sizes, 12)
  np.testing.assert_allclose(applied, [lr(e) for e in epochs], rtol=1e-5, atol=1e-7)
  # Warm-up ends at epoch 2.0: step 8 starts at 50 + 3 * 40 = 170 examples (1.7 epochs), step 9
  # at 2.1 epochs. A per-step schedule built for the initial batch of 10 would still be at 45%.
  assert applied[8] < 0.5
  np.testing.assert_allclose(applied[9:], 0.5, rtol=1e-6)
  naive = schedules.to_optax(lr, 10, N)
  assert naive(9) == pytest.approx(0.5 * 0.9 / 2.0)


def test_both_drives_agree_with_a_scheduled_batch_and_decay():
  lr = schedules.warmup_polynomial_decay(0.8, warmup_epochs=1.0, total_epochs=5)
  batch_sizes = schedules.hybrid_schedule(10, 0.8, (1.5, 3.0), 0.5, 30).batch_size_schedule
  injected = _applied_learning_rates(batch_sizes, lr, 20, "inject_hyperparams")
  per_step = _applied_learning_rates(batch_sizes, lr, 20, "to_optax")
  np.testing.assert_allclose(injected, per_step, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: schedules.to_optax(0.1, 128, N), TypeError, "schedule must be a schedule"),
        (
            lambda: schedules.to_optax(schedules.constant(0.1), 0, N),
            ValueError,
            "batch_size must be a positive integer",
        ),
        (
            lambda: schedules.to_optax(schedules.constant(0.1), 12.0, N),
            TypeError,
            "batch_size must be a positive integer",
        ),
        (
            lambda: schedules.to_optax(schedules.constant(0.1), 12, -5),
            ValueError,
            "num_train_examples must be a positive integer",
        ),
        (
            lambda: schedules.to_optax(schedules.constant(0.1), 12, N)(-1),
            ValueError,
            "step must be a non-negative integer",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_a_clear_message(build, error, match):
  with pytest.raises(error, match=match):
    build()
