"""Median-curvature LR (papers/003 eq. 20-22) against a NumPy reference."""

import functools

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from lbjax import optim
from tests.optim import numpy_reference as ref
from tests.optim.test_lars import SELECTED, make_tree, run_lbjax


def test_mclr_matches_numpy_reference():
  lr, m, beta = 1e-3, 0.9, 1e-2
  params = make_tree(90)
  grads_seq = [make_tree(91 + t, scale=0.1) for t in range(4)]
  got, state = run_lbjax(optim.mclr(lr, m, beta), params, grads_seq)
  w, rate = ref.layer_rate_momentum(params, grads_seq, lr, m, beta, ref.median_curvature_rate, SELECTED)
  ratios = optim.trust_ratios(state)
  for k in w:
    np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=1e-7, err_msg=k)
    if SELECTED[k]:
      np.testing.assert_allclose(ratios[k], rate[k], rtol=1e-5)


def test_sparse_gradient_median_falls_back_to_rate_one():
  params = {"emb": np.ones((6, 4), np.float32)}
  grads = {"emb": np.zeros((6, 4), np.float32)}
  grads["emb"][0] = 1.0  # most rows of an embedding get no gradient: median |g| = 0
  opt = optim.mclr(0.1, momentum=0.0)
  updates, state = opt.update(grads, opt.init(params), params)
  np.testing.assert_allclose(optim.trust_ratios(state)["emb"], 1.0)
  np.testing.assert_allclose(updates["emb"], -0.1 * grads["emb"])


def test_shard_map_median_gathers_the_layer():
  rng = np.random.default_rng(95)
  params = {"w": rng.normal(size=(16, 3)).astype(np.float32)}
  grads = {"w": rng.normal(size=(16, 3)).astype(np.float32)}
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  opt = optim.scale_by_median_curvature(axis_name="data")

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=P())
  def rates(g, p):
    return optim.trust_ratios(opt.update(g, opt.init(p), p)[1])

  got = jax.jit(rates)(grads, params)
  np.testing.assert_allclose(got["w"], ref.median_curvature_rate(params["w"], grads["w"], 0.0),
                             rtol=1e-6)


def test_median_abs_by_bisection_is_exact():
  rng = np.random.default_rng(96)
  cases = [
      rng.normal(size=(7, 3)) * 10.0 ** rng.integers(-6, 3, size=(7, 3)),  # odd size, wide range
      rng.normal(size=(4, 6)),  # even size: mean of the two middle values
      np.array([[0.0, 0.0, 0.0, 2.0], [-2.0, 1.0, -1.0, 0.0]]),  # ties and zeros
  ]
  for x in cases:
    x = x.astype(np.float32)
    layer = optim.LayerReducer(stacked_axes=0, ndim=x.ndim, local_size=x.size)
    np.testing.assert_allclose(jax.jit(layer.median_abs)(x), np.median(np.abs(x)), rtol=1e-7)
  stacked = rng.normal(size=(3, 5, 2)).astype(np.float32)
  layer = optim.LayerReducer(stacked_axes=1, ndim=3, local_size=10)
  np.testing.assert_allclose(layer.median_abs(stacked),
                             np.median(np.abs(stacked).reshape(3, -1), axis=1), rtol=1e-7)


def test_an_empty_selected_layer_gets_the_zero_norm_rate_as_in_lars():
  """A (0, 4) kernel is selected (ndim >= 2) and has no median: its rate is 1 (`safe_quotient` of two zero
  medians), as LARS gives its zero norms, and the other layer's rate is unchanged (it raised in jnp.min)."""
  params = {"w": np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4), "e": np.zeros((0, 4), np.float32)}
  mclr = optim.mclr(0.1)
  updates, state = mclr.update(params, mclr.init(params), params)
  assert updates["e"].shape == (0, 4)
  rates = optim.trust_ratios(state)
  assert float(rates["e"]) == 1.0 and float(rates["w"]) == 1.0  # median |w| / median |g| with g = w
  np.testing.assert_allclose(updates["w"], -0.1 * params["w"], rtol=1e-6)
