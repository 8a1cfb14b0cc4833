"""Tests of the local Lipschitz estimate L(x, g) of papers/001 §4."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import diagnostics


def _regression_problem():
  kx, ky, kw = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, (32, 5))
  batch = (x, jax.random.normal(ky, (32,)))
  params = {"w": jax.random.normal(kw, (5,)), "b": jnp.array(0.3)}
  return params, batch


def _squared_loss(params, batch):
  x, y = batch
  return 0.5 * jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def _hessian(batch):
  x = np.concatenate([np.ones((32, 1)), np.asarray(batch[0])], axis=1)  # order: b, w
  return x.T @ x / x.shape[0]


def test_matches_closed_form_on_quadratic_loss():
  params, batch = _regression_problem()
  lip = jax.jit(diagnostics.lipschitz_along_gradient, static_argnums=0)(_squared_loss, params,
                                                                         batch)
  g = jax.grad(_squared_loss)(params, batch)
  g_vec = np.concatenate([[g["b"]], g["w"]])
  expected = abs(g_vec @ _hessian(batch) @ g_vec) / (g_vec @ g_vec)
  np.testing.assert_allclose(lip, expected, rtol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_low_precision_parameters_give_the_curvature_without_overflow(dtype):
  """c/2 |w|^2 has H = c I, so L = c = 100 anywhere; at |g| = 30, g^T H g = 90,000 is past float16's 65,504, and
  float16 parameters gave inf."""
  loss = lambda params, c: 0.5 * c * jnp.sum(params["w"].astype(jnp.float32) ** 2)
  params = {"w": jnp.full((100,), 0.03, dtype)}
  np.testing.assert_allclose(diagnostics.lipschitz_along_gradient(loss, params, 100.0), 100.0, rtol=1e-2)


def test_step_one_over_l_minimises_along_gradient():
  # papers/001 §4: eta* = argmin_eta f(x - eta g) = 1/L(x, g) for the quadratic model.
  params, batch = _regression_problem()
  g = jax.grad(_squared_loss)(params, batch)
  eta_star = 1.0 / diagnostics.lipschitz_along_gradient(_squared_loss, params, batch)
  etas = eta_star * jnp.linspace(0.5, 1.5, 101)
  along = jax.vmap(lambda eta: _squared_loss(jax.tree.map(lambda p, d: p - eta * d, params, g),
                                             batch))(etas)
  np.testing.assert_allclose(etas[jnp.argmin(along)], eta_star, rtol=0.011)


def test_eigenvector_direction_gives_eigenvalue():
  params, batch = _regression_problem()
  eigvals, eigvecs = np.linalg.eigh(_hessian(batch))
  v = eigvecs[:, -1]
  direction = {"b": jnp.asarray(v[0]), "w": jnp.asarray(v[1:])}
  lip = diagnostics.lipschitz_along_gradient(_squared_loss, params, batch, direction)
  np.testing.assert_allclose(lip, eigvals[-1], rtol=1e-4)


def test_matches_finite_difference_hessian_vector_product():
  # The paper's own approximation: H g ~ (grad(x + eps g) - grad(x - eps g)) / (2 eps).
  params, batch = _regression_problem()

  def loss(p, b):
    x, y = b
    return jnp.mean(jnp.log1p(jnp.exp(-y * jnp.tanh(x @ p["w"] + p["b"]))))

  g = jax.grad(loss)(params, batch)
  eps = 1e-3
  shift = lambda s: jax.tree.map(lambda p, d: p + s * eps * d, params, g)
  fd = jax.tree.map(lambda a, b: (a - b) / (2 * eps), jax.grad(loss)(shift(1), batch),
                    jax.grad(loss)(shift(-1), batch))
  gg = sum(float(jnp.vdot(a, a)) for a in jax.tree.leaves(g))
  expected = abs(sum(float(jnp.vdot(a, b)) for a, b in zip(jax.tree.leaves(g),
                                                             jax.tree.leaves(fd)))) / gg
  lip = diagnostics.lipschitz_along_gradient(loss, params, batch)
  np.testing.assert_allclose(lip, expected, rtol=2e-2)


def test_zero_direction_and_bad_direction():
  params, batch = _regression_problem()
  zero = jax.tree.map(jnp.zeros_like, params)
  assert float(diagnostics.lipschitz_along_gradient(_squared_loss, params, batch, zero)) == 0.0
  with pytest.raises(ValueError, match="structure of params"):
    diagnostics.lipschitz_along_gradient(_squared_loss, params, batch, {"w": params["w"]})
  with pytest.raises(TypeError, match="callable"):
    diagnostics.lipschitz_along_gradient("loss", params, batch)
