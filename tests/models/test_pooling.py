"""Max pooling without a scatter in its gradient (lbjax.models.pooling): nnx.max_pool's values; JAX's
gradient on TPUs; elsewhere the same first-maximum assignment as select-and-scatter, the cotangents that
meet at an input position summed in float32 and rounded once."""

import functools
import itertools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax.models import pooling

POOLS = [  # input shape, window, strides, padding
    ((2, 9, 9, 3), (3, 3), (2, 2), ((1, 1), (1, 1))),  # the ResNet stem's, odd size
    ((2, 8, 7, 4), (3, 3), (2, 2), ((1, 1), (1, 1))),  # even and odd sizes
    ((1, 10, 10, 2), (2, 2), (2, 2), ((0, 0), (0, 0))),  # windows that do not overlap
    ((2, 7, 9, 3), (3, 2), (1, 2), ((1, 0), (0, 1))),  # unequal windows, strides and padding
]


def _tied(shape, dtype, seed=0):
  """ReLU'd small integers: most windows hold their maximum more than once."""
  return jnp.asarray(np.maximum(np.random.default_rng(seed).integers(-3, 4, size=shape), 0), dtype)


def _nnx(window, strides, padding):
  return lambda x: nnx.max_pool(x, window, strides=strides, padding=padding)


def _exact_gradient(x, cotangent, window, strides, padding):
  """Select-and-scatter by hand in float64: each output's cotangent to the first maximum of its window
  (row-major), summed where windows overlap."""
  x, cotangent = np.asarray(x, np.float64), np.asarray(cotangent, np.float64)
  padded = np.pad(x, ((0, 0), *padding, (0, 0)), constant_values=-np.inf)
  gradient = np.zeros_like(padded)
  for n, h, w, c in itertools.product(*map(range, cotangent.shape)):
    top, left = h * strides[0], w * strides[1]
    values = padded[n, top:top + window[0], left:left + window[1], c]
    i, j = np.unravel_index(np.argmax(values), values.shape)  # the first maximum in row-major order
    gradient[n, top + i, left + j, c] += cotangent[n, h, w, c]
  return gradient[:, padding[0][0]:padding[0][0] + x.shape[1], padding[1][0]:padding[1][0] + x.shape[2]]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape,window,strides,padding", POOLS)
def test_the_gradient_is_select_and_scatters_summed_in_float32(shape, window, strides, padding, dtype):
  """nnx.max_pool's values; its gradient gives the cotangent of each output to the first maximum of its
  window, as JAX's places it (the same inputs get a gradient), the overlapping windows' cotangents summed
  in float32 and rounded once (JAX's scatter adds in the input's dtype, so its bfloat16 sums may differ in
  the last bit)."""
  x = _tied(shape, dtype)
  theirs = _nnx(window, strides, padding)
  pool = jax.jit(lambda x: pooling.max_pool(x, window, strides, padding))
  np.testing.assert_array_equal(pool(x), theirs(x))
  cotangent = jnp.asarray(np.abs(np.random.default_rng(2).normal(size=theirs(x).shape)) + 0.1, dtype)  # > 0
  ours = jax.vjp(pool, x)[1](cotangent)[0]
  assert ours.dtype == dtype and ours.shape == x.shape
  np.testing.assert_array_equal(ours != 0, jax.vjp(theirs, x)[1](cotangent)[0] != 0)
  exact = _exact_gradient(x, cotangent, window, strides, padding)
  if dtype == jnp.bfloat16:  # at most 4 bfloat16 cotangents: their float32 sum is exact, then rounded once
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(jnp.asarray(exact, dtype), np.float32))
  else:
    np.testing.assert_allclose(ours, exact, rtol=4e-7)  # three float32 roundings at most


def test_only_tpus_keep_select_and_scatter():
  """The TPU form is JAX's own gradient, the same numbers as nnx.max_pool's."""
  x = _tied((2, 9, 9, 3), jnp.float32)
  pool = lambda x: pooling.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))  # pylint: disable=unnecessary-lambda-assignment
  gradient = jax.grad(lambda x: jnp.sum(pool(x)))
  traced = jax.jit(gradient).trace(x)
  lowered = {platform: traced.lower(lowering_platforms=(platform,)).as_text() for platform in ("cuda", "tpu", "cpu")}
  assert {platform: "select_and_scatter" in text for platform, text in lowered.items()} == {
      "cuda": False, "tpu": True, "cpu": False}
  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 5, 3)), jnp.float32)
  theirs = jax.vjp(_nnx((3, 3), (2, 2), ((1, 1), (1, 1))), x)[1](cotangent)[0]
  tangent = functools.partial(pooling._jax_tangent, ((3, 3), (2, 2), ((1, 1), (1, 1))), x)  # pylint: disable=protected-access
  np.testing.assert_array_equal(jax.linear_transpose(tangent, x)(cotangent)[0], theirs)


@pytest.mark.parametrize("shape,window,strides,padding", POOLS)
def test_forward_mode_gives_the_first_maximums_tangent_and_hessian_vector_products(shape, window, strides, padding):
  """The tangent of each output is its window's first maximum's (what the Lipschitz diagnostic's
  forward-over-reverse Hessian-vector products need; a custom_vjp would refuse them); an HVP through the
  pooling is nnx.max_pool's (without ties)."""
  x = _tied(shape, jnp.float32)
  tangent = jnp.asarray(np.random.default_rng(3).normal(size=shape), jnp.float32)
  pool = lambda x: pooling.max_pool(x, window, strides, padding)  # pylint: disable=unnecessary-lambda-assignment
  values, ours = jax.jvp(pool, (x,), (tangent,))
  np.testing.assert_array_equal(values, _nnx(window, strides, padding)(x))
  padded = np.pad(np.asarray(tangent), ((0, 0), *padding, (0, 0)))
  exact = np.zeros(values.shape, np.float32)
  for n, h, w, c in itertools.product(*map(range, values.shape)):
    top, left = h * strides[0], w * strides[1]
    window_values = np.pad(np.asarray(x), ((0, 0), *padding, (0, 0)), constant_values=-np.inf)[
        n, top:top + window[0], left:left + window[1], c]
    i, j = np.unravel_index(np.argmax(window_values), window_values.shape)
    exact[n, h, w, c] = padded[n, top + i, left + j, c]
  np.testing.assert_array_equal(ours, exact)

  untied = jnp.asarray(np.random.default_rng(4).normal(size=shape), jnp.float32)  # JAX breaks ties its own way

  def hessian_vector_product(pool):
    loss = lambda x: jnp.sum(jnp.sin(pool(x)) * pool(x))  # pylint: disable=unnecessary-lambda-assignment
    return jax.jvp(jax.grad(loss), (untied,), (tangent,))[1]

  np.testing.assert_allclose(hessian_vector_product(pool), hessian_vector_product(_nnx(window, strides, padding)),
                             rtol=1e-6, atol=1e-6)


def test_a_window_per_spatial_dimension_is_required():
  with pytest.raises(ValueError, match="one window size, stride and"):
    pooling.max_pool(jnp.ones((1, 4, 4, 1)), (2,), (2, 2), ((0, 0), (0, 0)))
