"""LAMB trust ratio against a NumPy reference and against optax.lamb."""

import jax
import numpy as np
import optax

from lbjax import optim
from tests.optim import numpy_reference as ref
from tests.optim.test_lars import SELECTED, make_tree, run_lbjax


def test_lamb_matches_numpy_reference():
  lr, b1, b2, eps, beta, steps = 0.01, 0.9, 0.999, 1e-6, 1e-2, 5
  params = make_tree(40)
  grads_seq = [make_tree(41 + t, scale=0.1) for t in range(steps)]
  got, state = run_lbjax(optim.lamb(lr, b1, b2, eps, weight_decay=beta), params, grads_seq)
  w = {k: v.astype(np.float64) for k, v in params.items()}
  m1 = {k: np.zeros_like(v) for k, v in w.items()}
  m2 = {k: np.zeros_like(v) for k, v in w.items()}
  ratio = {}
  for t, grads in enumerate(grads_seq, start=1):
    for k in w:
      w[k], m1[k], m2[k], ratio[k] = ref.lamb_step(w[k], grads[k], m1[k], m2[k], t, lr, b1, b2,
                                                   eps, beta, SELECTED[k])
  ratios = optim.trust_ratios(state)
  for k in w:
    np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=1e-6, err_msg=k)
    if SELECTED[k]:
      np.testing.assert_allclose(ratios[k], ratio[k], rtol=1e-5)
    else:
      assert np.isnan(ratios[k])


def test_lamb_with_every_leaf_selected_equals_optax_lamb():
  params = make_tree(50)
  grads_seq = [make_tree(51 + t, scale=0.1) for t in range(3)]
  everything = lambda p: jax.tree.map(lambda _: True, p)
  a, _ = run_lbjax(optim.lamb(0.01, weight_decay=1e-2, mask=everything), params, grads_seq)
  b, _ = run_lbjax(optax.lamb(0.01, weight_decay=1e-2), params, grads_seq)
  for k in params:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)


def test_trust_ratio_part_composes_with_any_direction():
  params, grads = make_tree(60), make_tree(61)
  opt = optax.chain(optax.scale_by_rms(), optim.scale_by_lamb_trust_ratio())
  updates, state = opt.update(grads, opt.init(params), params)
  # Every selected layer's update has the norm of its weights.
  for k in ("conv", "dense"):
    np.testing.assert_allclose(np.linalg.norm(updates[k]), np.linalg.norm(params[k]), rtol=1e-5)
  assert np.isnan(optim.trust_ratios(state)["bias"])
