"""Tests of the gradient noise scale estimates (McCandlish et al. 2018, appendix A.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import diagnostics


def test_exact_expectations_recover_both_terms():
  true_g2, true_trace = 4.0, 30.0
  expected_sq_norm = lambda b: true_g2 + true_trace / b  # E|G_B|^2 = |G|^2 + tr(Sigma)/B
  est = diagnostics.noise_scale_estimates(expected_sq_norm(8), expected_sq_norm(64), 8, 64)
  np.testing.assert_allclose(est.grad_norm_sq, true_g2, rtol=1e-6)
  np.testing.assert_allclose(est.trace_sigma, true_trace, rtol=1e-6)
  np.testing.assert_allclose(diagnostics.simple_noise_scale(est), 7.5, rtol=1e-6)


def test_unbiased_on_synthetic_gradients_with_known_sigma():
  # Per-example gradients G + e with e ~ N(0, diag(sigma^2)): |G|^2 and tr(Sigma) are known.
  trials, small, big = 2000, 4, 32
  true_g = jnp.array([1.0, -2.0, 0.5, 0.0, 1.5, -1.0])
  sigma = jnp.array([3.0, 1.0, 2.0, 0.5, 4.0, 1.0])
  per_example = true_g + sigma * jax.random.normal(jax.random.key(0), (trials, big, 6))
  g_small = per_example[:, :small].mean(1)  # a micro-batch of the accumulated batch
  g_big = per_example.mean(1)
  est = jax.vmap(lambda a, b: diagnostics.noise_scale_estimates(a, b, small, big))(
      jnp.sum(g_small**2, -1), jnp.sum(g_big**2, -1))
  for values, truth in ((est.grad_norm_sq, jnp.sum(true_g**2)), (est.trace_sigma,
                                                                 jnp.sum(sigma**2))):
    stderr = float(jnp.std(values)) / np.sqrt(trials)
    assert abs(float(jnp.mean(values)) - float(truth)) < 5 * stderr
  # Ratio of averaged components recovers B_simple = tr(Sigma)/|G|^2 = 32.25/8.5.
  avg = diagnostics.NoiseScaleEstimate(jnp.mean(est.grad_norm_sq), jnp.mean(est.trace_sigma))
  np.testing.assert_allclose(diagnostics.simple_noise_scale(avg), 32.25 / 8.5, rtol=0.15)


def test_ema_averages_numerator_and_denominator_separately():
  ema = diagnostics.noise_scale_ema(decay=0.5)
  state = ema.init()
  np.testing.assert_array_equal(ema.value(state), (0.0, 0.0))
  first = diagnostics.NoiseScaleEstimate(jnp.float32(1.0), jnp.float32(10.0))
  second = diagnostics.NoiseScaleEstimate(jnp.float32(3.0), jnp.float32(20.0))
  state = ema.update(state, first)
  np.testing.assert_allclose(ema.value(state), (1.0, 10.0), rtol=1e-6)  # debiased
  state = jax.jit(ema.update)(state, second)
  # Debiased weights after two steps: (0.25, 0.5) / 0.75.
  g2, trace = (0.25 * 1.0 + 0.5 * 3.0) / 0.75, (0.25 * 10.0 + 0.5 * 20.0) / 0.75
  np.testing.assert_allclose(ema.value(state), (g2, trace), rtol=1e-6)
  b_simple = float(diagnostics.simple_noise_scale(ema.value(state)))
  np.testing.assert_allclose(b_simple, trace / g2, rtol=1e-6)
  mean_of_ratios = (0.25 * 10.0 + 0.5 * 20.0 / 3.0) / 0.75
  assert abs(b_simple - mean_of_ratios) > 0.5


def test_nonpositive_grad_norm_estimate_gives_inf():
  est = diagnostics.NoiseScaleEstimate(jnp.float32(-0.1), jnp.float32(5.0))
  assert np.isinf(diagnostics.simple_noise_scale(est))


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="must be larger than small_batch"):
    diagnostics.noise_scale_estimates(1.0, 0.5, 64, 64)
  with pytest.raises(ValueError, match="positive int"):
    diagnostics.noise_scale_estimates(1.0, 0.5, 0, 64)
  with pytest.raises(ValueError, match="positive int"):
    diagnostics.noise_scale_estimates(1.0, 0.5, 8.0, 64)
  with pytest.raises(ValueError, match="decay"):
    diagnostics.noise_scale_ema(decay=1.0)
