"""Tests of the per-layer curvature-radius statistics (papers/003 eq. 9-22)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import diagnostics


def _parabola(a):
  """L(w) = sum_i a_i w_i^2 (eq. 12 with b_i = c_i = 0)."""
  return lambda w: jnp.sum(a * w**2)


def test_eq17_is_the_parabola_radius():
  a = jnp.linspace(0.5, 5.0, 10)
  w = jnp.linspace(-1e-3, 1e-3, 10)
  g = jax.grad(_parabola(a))(w)
  radius = diagnostics.curvature_radius(w, g)
  # eq. 17 gives |w/(2 a w)| = 1/(2a) = 1/(d^2L/dw^2), the radius of eq. 9 without the g^2 term.
  np.testing.assert_allclose(radius, 1 / (2 * a), rtol=1e-5)
  hess_diag = jnp.diag(jax.hessian(_parabola(a))(w))
  eq9 = (1 + g**2) ** 1.5 / hess_diag
  np.testing.assert_allclose(radius, eq9, rtol=2e-4)  # (dL/dw)^2 <= 1e-4 here


def test_layer_statistics_match_numpy():
  a = jnp.linspace(0.5, 5.0, 40)
  w = jax.random.normal(jax.random.key(0), (40,))
  params = {"layer": w.reshape(8, 5)}
  grads = {"layer": jax.grad(_parabola(a))(w).reshape(8, 5)}
  stats = jax.jit(diagnostics.per_layer_curvature_radius)(params, grads)["layer"]
  r = 1 / (2 * np.asarray(a))
  np.testing.assert_allclose(stats.median, np.median(r), rtol=1e-5)
  np.testing.assert_allclose(stats.mean, np.mean(r), rtol=1e-5)
  np.testing.assert_allclose(stats.quantiles, np.quantile(r, [0.1, 0.25, 0.75, 0.9]), rtol=1e-5)
  assert float(stats.valid_fraction) == 1.0


def test_failure_cases_eq18_eq19_are_excluded_and_counted():
  w = jnp.array([1.0, 2.0, 0.0, 4.0, 1e-9])
  g = jnp.array([0.5, 1.0, 1.0, 0.0, 1.0])
  stats = diagnostics.per_layer_curvature_radius(
      {"l": w}, {"l": g}, min_abs_weight=1e-6)["l"]
  np.testing.assert_allclose(stats.valid_fraction, 0.4)  # w = 0, w ~ 0 and g = 0 are dropped
  np.testing.assert_allclose(stats.median, 2.0)
  assert np.isfinite(stats.mean)


def test_median_approximation_eq20_and_weight_decay_eq22():
  w = jax.random.normal(jax.random.key(1), (101,))
  c, beta = 4.0, 0.5
  params, grads = {"l": w}, {"l": c * w}  # |g_i| = c|w_i|: every R_i is 1/c
  stats = diagnostics.per_layer_curvature_radius(params, grads)["l"]
  np.testing.assert_allclose([stats.median, stats.median_approx], [1 / c, 1 / c], rtol=1e-5)
  decayed = diagnostics.per_layer_curvature_radius(params, grads, weight_decay=beta)["l"]
  np.testing.assert_allclose([decayed.median, decayed.median_approx],
                             [1 / (c + beta), 1 / (c + beta)], rtol=1e-5)


def test_rows_are_named_per_layer():
  params = {"conv1": {"kernel": jnp.ones((2, 3))}, "fc": {"bias": jnp.arange(1.0, 5.0)}}
  grads = jax.tree.map(lambda p: 0.5 * p, params)
  rows = diagnostics.curvature_radius_rows(params, grads, quantile_levels=(0.5,))
  assert [r.layer for r in rows] == ["conv1/kernel", "fc/bias"]
  assert rows[0].shape == (2, 3)
  assert rows[1].quantiles == {0.5: pytest.approx(2.0)}
  assert rows[1].median_approx == pytest.approx(2.0)


def test_bad_inputs_raise_clear_errors():
  p = {"l": jnp.ones(3)}
  with pytest.raises(ValueError, match="quantile_levels must be a sequence of levels in"):
    diagnostics.per_layer_curvature_radius(p, p, quantile_levels=(1.5,))
  with pytest.raises(ValueError, match="weight_decay"):
    diagnostics.per_layer_curvature_radius(p, p, weight_decay=-1.0)
  with pytest.raises(ValueError, match="same pytree structure"):
    diagnostics.per_layer_curvature_radius(p, {"m": jnp.ones(3)})
  with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0, got nan"):
    diagnostics.per_layer_curvature_radius(p, p, weight_decay=float("nan"))
  with pytest.raises(ValueError, match="min_abs_weight and min_abs_grad must be numbers >= 0"):
    diagnostics.per_layer_curvature_radius(p, p, min_abs_grad=float("nan"))


@pytest.mark.parametrize("options, message", [
    # A Python TypeError or JAX's "Non-hashable static arguments" from the compiled statistics:
    ({"quantile_levels": 0.5}, r"quantile_levels must be a sequence of levels in \[0, 1\], e.g. \(0.5, 0.9\), got 0.5"),
    ({"min_abs_weight": None}, r"min_abs_weight and min_abs_grad must be numbers >= 0, got None and 0.0"),
    ({"weight_decay": "0.1"}, r"weight_decay must be a finite number >= 0, got '0.1'"),
])
def test_the_rows_refuse_a_bad_option_naming_it(options, message):
  p = {"l": jnp.ones(3)}
  with pytest.raises(ValueError, match=message):
    diagnostics.curvature_radius_rows(p, p, **options)


def test_the_rows_take_an_array_weight_decay_as_the_jittable_statistics_do():
  p = {"l": jnp.arange(1.0, 4.0)}
  rows = diagnostics.curvature_radius_rows(p, p, weight_decay=jnp.float32(0.5))
  stats = diagnostics.per_layer_curvature_radius(p, p, weight_decay=jnp.float32(0.5))
  assert rows[0].median_approx == pytest.approx(float(stats["l"].median_approx))


def test_the_elementwise_radius_refuses_what_would_broadcast_or_a_bad_weight_decay():
  """w [3, 4] and g [4] would broadcast into a radius that is neither's; beta < 0 flips eq. 22's sign."""
  with pytest.raises(ValueError, match=r"w and g must have the same shape, got \(3, 4\) and \(4,\)"):
    diagnostics.curvature_radius(jnp.ones((3, 4)), jnp.ones(4))
  with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0, got -0.1"):
    diagnostics.curvature_radius(jnp.ones(3), jnp.ones(3), weight_decay=-0.1)
  traced = jax.jit(diagnostics.curvature_radius)(jnp.ones(3), jnp.full(3, 0.5), 0.5)  # a traced beta is computed
  np.testing.assert_allclose(traced, 1.0)
