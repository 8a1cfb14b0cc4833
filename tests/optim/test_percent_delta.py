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
