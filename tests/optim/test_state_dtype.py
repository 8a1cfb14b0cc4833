"""Low-precision optimizer state: `accumulator_dtype` of lars, percent_delta, mclr and momentum,
`mu_dtype`/`nu_dtype` of lamb: the state is stored in its dtype and computed in the wider of its and
the gradient's (`lbjax.optim.low_precision`)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

from lbjax import optim
from tests.optim import numpy_reference as ref
from tests.optim.test_lars import SELECTED, make_tree, run_lbjax


def _bfloat16(x):
  """x rounded to bfloat16, back in float64."""
  return np.asarray(x).astype(ml_dtypes.bfloat16).astype(np.float64)


def _states(state, kind):
  return [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kind)) if isinstance(x, kind)]


def test_lars_with_bfloat16_momentum_is_algorithm_1_with_v_stored_in_bfloat16():
  """papers/000 Algorithm 1 with v rounded to bfloat16 where it is stored (m is not rounded)."""
  lr, m, beta, eta = 1.0, 0.9, 5e-4, 1e-3
  params = make_tree(50)
  grads_seq = [make_tree(51 + t, scale=0.01) for t in range(4)]
  got, state = run_lbjax(optim.lars(lr, m, beta, eta, accumulator_dtype="bfloat16"), params, grads_seq)
  w = {k: v.astype(np.float64) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for grads in grads_seq:
    for k in w:
      _, new_v, _ = ref.lars_step(w[k], grads[k], v[k], lr, m, beta, eta, SELECTED[k])
      v[k] = _bfloat16(new_v)  # v_{t+1} computed in float32 or wider, stored in bfloat16
      w[k] = w[k] - v[k]  # w_{t+1} = w_t - v_{t+1}, with the stored v
  (trace,) = _states(state, optax.TraceState)
  for k in w:
    assert trace.trace[k].dtype == jax.numpy.bfloat16
    assert got[k].dtype == np.float32
    np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=1e-6, err_msg=k)
    stored_v = -np.asarray(trace.trace[k], np.float64)  # optax's trace follows the update, -v
    np.testing.assert_allclose(stored_v, v[k], rtol=1e-2, atol=1e-8, err_msg=k)


@pytest.mark.parametrize("build", [optim.lars, optim.percent_delta, optim.mclr, optim.momentum])
def test_accumulator_dtype_halves_the_state_and_stays_close(build):
  params = make_tree(60)
  grads_seq = [make_tree(61 + t, scale=0.1) for t in range(3)]
  low, low_state = run_lbjax(build(0.1, accumulator_dtype="bfloat16"), params, grads_seq)
  full, full_state = run_lbjax(build(0.1), params, grads_seq)
  (low_trace,), (full_trace,) = _states(low_state, optax.TraceState), _states(full_state, optax.TraceState)
  assert {x.dtype for x in jax.tree.leaves(low_trace)} == {jax.numpy.dtype("bfloat16")}
  nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))
  assert 2 * nbytes(low_trace) == nbytes(full_trace)
  for k in params:  # the runs part by the bfloat16 rounding of the stored v (2^-9 of it per step)
    assert low[k].dtype == np.float32
    moved = np.max(np.abs(full[k] - params[k]))
    assert np.max(np.abs(low[k] - full[k])) <= 2**-7 * moved, k


def test_lamb_moments_in_bfloat16_match_the_reference_with_rounded_moments():
  lr, b1, b2, eps, beta = 0.01, 0.9, 0.999, 1e-6, 1e-2
  params = make_tree(70)
  grads_seq = [make_tree(71 + t, scale=0.1) for t in range(4)]
  opt = optim.lamb(lr, b1, b2, eps, weight_decay=beta, mu_dtype="bfloat16", nu_dtype="bfloat16")
  got, state = run_lbjax(opt, params, grads_seq)
  w = {k: v.astype(np.float64) for k, v in params.items()}
  m1 = {k: np.zeros_like(v) for k, v in w.items()}
  m2 = {k: np.zeros_like(v) for k, v in w.items()}
  for t, grads in enumerate(grads_seq, start=1):
    for k in w:
      w[k], m1[k], m2[k], _ = ref.lamb_step(w[k], grads[k], m1[k], m2[k], t, lr, b1, b2, eps, beta,
                                            SELECTED[k])
      m1[k], m2[k] = _bfloat16(m1[k]), _bfloat16(m2[k])  # the step uses the exact moments
  (adam,) = _states(state, optax.ScaleByAdamState)
  for k in w:
    assert adam.mu[k].dtype == adam.nu[k].dtype == jax.numpy.bfloat16
    np.testing.assert_allclose(got[k], w[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_lamb_moment_dtypes_are_independent():
  params = make_tree(80)
  opt = optim.lamb(1e-3, nu_dtype="bfloat16")
  _, state = run_lbjax(opt, params, [make_tree(81)] * 2)
  (adam,) = _states(state, optax.ScaleByAdamState)
  assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {np.dtype(np.float32)}
  assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jax.numpy.dtype("bfloat16")}


@pytest.mark.parametrize("build", [optim.lamb, optim.lars, optim.percent_delta, optim.mclr, optim.momentum])
def test_the_state_keeps_its_dtypes_when_the_gradients_are_wider_than_the_parameters(build):
  """bfloat16 parameters with float32 gradients: the state after an update has the dtypes it was initialised
  with (a `lax.scan` carry; a jitted step does not recompile). optax's Adam alone stored float32 moments then."""
  params = {"w": jax.numpy.ones((3, 5), jax.numpy.bfloat16)}
  grads = {"w": jax.numpy.full((3, 5), 0.1, jax.numpy.float32)}
  opt = build(0.1)
  state = opt.init(params)
  after, _ = jax.lax.scan(lambda s, _: (opt.update(grads, s, params)[1], None), state, None, length=2)
  assert jax.tree.map(lambda x: x.dtype, after) == jax.tree.map(lambda x: x.dtype, state)


@pytest.mark.parametrize("build, name", [
    (lambda dtype: optim.lars(0.1, accumulator_dtype=dtype), "accumulator_dtype"),
    (lambda dtype: optim.percent_delta(0.1, accumulator_dtype=dtype), "accumulator_dtype"),
    (lambda dtype: optim.mclr(0.1, accumulator_dtype=dtype), "accumulator_dtype"),
    (lambda dtype: optim.momentum(0.1, accumulator_dtype=dtype), "accumulator_dtype"),
    (lambda dtype: optim.lamb(0.1, mu_dtype=dtype), "mu_dtype"),
    (lambda dtype: optim.lamb(0.1, nu_dtype=dtype), "nu_dtype"),
])
@pytest.mark.parametrize("dtype, problem", [("bfloat", "must name a floating-point dtype"),
                                            ("int8", "must be a floating-point dtype .*, got int8")])
def test_bad_state_dtype_is_a_clear_error_when_built(build, name, dtype, problem):
  with pytest.raises(ValueError, match=f"{name} {problem}"):
    build(dtype)


@pytest.mark.parametrize("layout", ["per_leaf", "flat"])
def test_lamb_of_float16_parameters_computes_its_moments_in_float32(layout):
  """|g| = 300: g^2 = 90,000 is above float16's largest 65504. Computed in float16, nu was inf, Adam's
  direction 0 and the layer did not move; in float32 the step is the float32 model's, rounded."""
  params = {"w": jnp.ones((8, 8), jnp.float16)}
  grads = {"w": jnp.full((8, 8), 300.0, jnp.float16)}
  updates = {}
  for dtype in (jnp.float32, jnp.float16):
    opt = optim.lamb(1e-2, layout=layout)
    typed = jax.tree.map(lambda x, dtype=dtype: x.astype(dtype), (params, grads))
    updates[dtype], _ = opt.update(typed[1], opt.init(typed[0]), typed[0])
  assert updates[jnp.float16]["w"].dtype == jnp.float16
  np.testing.assert_allclose(np.float32(updates[jnp.float16]["w"]), updates[jnp.float32]["w"], rtol=1e-3)
