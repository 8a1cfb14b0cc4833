"""Tests of discarding small-loss samples (papers/003 §3.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import diagnostics


def test_drops_the_smallest_losses():
  losses = jnp.array([5.0, 1.0, 4.0, 2.0, 3.0, 0.0])
  weights = jax.jit(diagnostics.small_loss_discard_weights, static_argnums=1)(losses, 0.5)
  np.testing.assert_array_equal(weights, [1, 0, 1, 0, 1, 0])
  # The kept-sample mean loss is at least the full-batch mean.
  assert float(jnp.sum(weights * losses) / jnp.sum(weights)) >= float(jnp.mean(losses))


def test_count_is_batch_minus_floor_of_fraction():
  losses = jax.random.uniform(jax.random.key(0), (10,))
  for fraction, kept in ((0.0, 10), (0.3, 7), (0.35, 7), (0.99, 1)):
    assert int(diagnostics.small_loss_discard_weights(losses, fraction).sum()) == kept
  # floor(p * B) of the exact product: 0.29 * 100 is 28.999999999999996 in floating point, and 28 were dropped.
  losses = jax.random.uniform(jax.random.key(0), (100,))
  for fraction in (0.29, 0.57, 0.58):
    kept = diagnostics.kept_examples(100, fraction)
    assert kept == 100 - round(fraction * 100) == int(diagnostics.small_loss_discard_weights(losses, fraction).sum())


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="shape \\[batch\\]"):
    diagnostics.small_loss_discard_weights(jnp.ones((2, 3)), 0.3)
  with pytest.raises(ValueError, match="discard_fraction"):
    diagnostics.small_loss_discard_weights(jnp.ones(4), 1.0)
