"""PercentDelta (papers/003 eq. 24) against a NumPy reference, and its defining property."""

import numpy as np
import pytest

from lbjax import optim
from tests.optim import numpy_reference as ref
from tests.optim.test_lars import SELECTED, make_tree, run_lbjax


def test_percent_delta_matches_numpy_reference():
  lr, m, beta = 0.01, 0.9, 1e-3
  params = make_tree(70)
  params["dense"][0, :3] = 0.0  # zero weights are left out of eq. 24's sum and size
  grads_seq = [make_tree(71 + t, scale=0.1) for t in range(4)]
  got, state = run_lbjax(optim.percent_delta(lr, m, beta), params, grads_seq)
  w, rate = ref.layer_rate_momentum(params, grads_seq, lr, m, beta, ref.percent_delta_rate, SELECTED)
  ratios = optim.trust_ratios(state)
  for k in w:
    np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=1e-7, err_msg=k)
    if SELECTED[k]:
      np.testing.assert_allclose(ratios[k], rate[k], rtol=1e-5)


@pytest.mark.parametrize("gamma", [1e-3, 0.05])
def test_mean_relative_change_equals_the_learning_rate(gamma):
  """Eq. 24 chooses the rate so that mean_i |dw_i / w_i| = gamma, whatever the gradient scale."""
  params, grads = make_tree(80), make_tree(81, scale=1e3)
  opt = optim.percent_delta(gamma, momentum=0.0)
  updates, _ = opt.update(grads, opt.init(params), params)
  for k in ("conv", "dense"):
    np.testing.assert_allclose(np.mean(np.abs(updates[k] / params[k])), gamma, rtol=1e-5)


def test_all_zero_layer_is_finite():
  params = {"w": np.zeros((3, 3), np.float32)}
  grads = {"w": np.ones((3, 3), np.float32)}
  opt = optim.percent_delta(0.1, momentum=0.0)
  updates, state = opt.update(grads, opt.init(params), params)
  np.testing.assert_allclose(optim.trust_ratios(state)["w"], 1.0)
  np.testing.assert_allclose(updates["w"], -0.1)


@pytest.mark.parametrize("layout", ["per_leaf", "flat"])
def test_a_float16_layer_gets_the_rate_of_its_float32_twin(layout):
  """One |d_i / w_i| = 1e5, above float16's largest 65504: the relative changes are summed in float32.
  In float16 the layer's sum was inf and its rate 0, so the layer stopped training without a word."""
  w = np.full((16, 16), 0.5, np.float32)
  g = np.full((16, 16), 0.05, np.float32)
  w[0, 0], g[0, 0] = 1e-3, 100.0
  rates = {}
  for dtype in (np.float32, np.float16):
    opt = optim.percent_delta(0.01, momentum=0.0, layout=layout)
    params = {"w": w.astype(dtype)}
    _, state = opt.update({"w": g.astype(dtype)}, opt.init(params), params)
    rates[dtype] = float(optim.trust_ratios(state)["w"])
  np.testing.assert_allclose(rates[np.float16], w.size / np.sum(np.abs(g / w)), rtol=1e-3)
  np.testing.assert_allclose(rates[np.float16], rates[np.float32], rtol=1e-3)


def test_a_non_finite_layer_statistic_gives_the_rate_1():
  """The zero-norm rule's fallback also covers an infinite norm: count / inf was a finite 0."""
  np.testing.assert_array_equal(optim.safe_quotient(np.float32([3.0, 3.0, np.inf, 3.0]),
                                                    np.float32([np.inf, np.nan, 2.0, 2.0])), [1.0, 1.0, 1.0, 1.5])
