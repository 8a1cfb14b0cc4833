"""ReLU whose derivative reads its output (lbjax.models.relu): jax.nn.relu's values and derivatives, forward
and reverse, in both dtypes; the optimisation barrier on GPUs only."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax.models.relu import relu


def _inputs(dtype):
  """Normal values with exact zeros and ties: where the derivative's convention shows."""
  x = np.random.default_rng(0).normal(size=(3, 7, 5))
  x[0] = 0.0
  x[1, :3] = -0.0
  return jnp.asarray(x, dtype)


def _loss(activation):
  return lambda x: jnp.sum(jnp.sin(activation(x).astype(jnp.float32)) * activation(x).astype(jnp.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_gradients_and_hessian_vector_products_are_jax_relus(dtype):
  x = _inputs(dtype)
  np.testing.assert_array_equal(relu(x), jax.nn.relu(x))
  ours, theirs = _loss(relu), _loss(jax.nn.relu)
  gradient = jax.grad(ours)(x)
  assert gradient.dtype == dtype
  np.testing.assert_array_equal(gradient, jax.grad(theirs)(x))
  np.testing.assert_array_equal(gradient[0], 0)  # the derivative at 0 is 0, as jax.nn.relu's
  vector = jnp.asarray(np.random.default_rng(1).normal(size=x.shape), dtype)
  np.testing.assert_array_equal(jax.jvp(jax.grad(ours), (x,), (vector,))[1],
                                jax.jvp(jax.grad(theirs), (x,), (vector,))[1])


def test_only_gpus_keep_the_output_behind_a_barrier():
  traced = jax.jit(jax.grad(_loss(relu))).trace(_inputs(jnp.float32))
  lowered = {platform: traced.lower(lowering_platforms=(platform,)).as_text()
             for platform in ("cuda", "rocm", "tpu", "cpu")}
  assert {platform: "optimization_barrier" in text for platform, text in lowered.items()} == {
      "cuda": True, "rocm": True, "tpu": False, "cpu": False}
