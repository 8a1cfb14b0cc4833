"""LARS (papers/000, Algorithm 1) against an independent NumPy implementation, and its properties."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lbjax import optim
from tests.optim import numpy_reference as ref

SHAPES = {"conv": (3, 3, 4, 8), "dense": (16, 8), "bias": (8,), "scale": (8,)}
SELECTED = {"conv": True, "dense": True, "bias": False, "scale": False}


def make_tree(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return {k: (scale * rng.normal(size=s)).astype(np.float32) for k, s in SHAPES.items()}


def run_lbjax(opt, params, grads_seq):
  state = opt.init(params)
  update = jax.jit(opt.update)
  for grads in grads_seq:
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params, state


def test_lars_matches_numpy_algorithm_1_with_decaying_lr():
  steps, m, beta, eta = 12, 0.9, 5e-4, 1e-3
  schedule = optax.polynomial_schedule(init_value=2.0, end_value=0.0, power=2, transition_steps=20)
  params = make_tree(0)
  grads_seq = [make_tree(10 + t, scale=0.01 * (t + 1)) for t in range(steps)]
  opt = optim.lars(schedule, momentum=m, weight_decay=beta, trust_coefficient=eta)
  got, state = run_lbjax(opt, params, grads_seq)

  w = {k: v.astype(np.float64) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  local = {}
  for t, grads in enumerate(grads_seq):
    lr = 2.0 * (1 - t / 20) ** 2  # gamma_t = gamma_0 * (1 - t/T)^2
    for k in w:
      w[k], v[k], local[k] = ref.lars_step(w[k], grads[k], v[k], lr, m, beta, eta, SELECTED[k])
  for k in w:
    np.testing.assert_allclose(got[k], w[k], rtol=1e-6, atol=1e-6, err_msg=k)
  ratios = optim.trust_ratios(state)
  for k in w:
    if SELECTED[k]:
      np.testing.assert_allclose(ratios[k], local[k], rtol=1e-6)
    else:
      assert np.isnan(ratios[k])


@pytest.mark.parametrize("denominator", ["paper", "optax"])
def test_step_norm_without_momentum(denominator):
  """||step^l|| = lr * eta * ||w|| * ||g + beta*w|| / den (papers/000 eq. 6 with momentum 0)."""
  lr, beta, eta = 0.5, 1e-2, 1e-3
  params, grads = make_tree(1), make_tree(2, scale=0.1)
  opt = optim.lars(lr, momentum=0.0, weight_decay=beta, trust_coefficient=eta,
                   denominator=denominator)
  updates, _ = opt.update(grads, opt.init(params), params)
  for k in ("conv", "dense"):
    w, g = params[k].astype(np.float64), grads[k].astype(np.float64)
    d = np.linalg.norm(g + beta * w)
    den = np.linalg.norm(g) + beta * np.linalg.norm(w) if denominator == "paper" else d
    expected = lr * eta * np.linalg.norm(w) * d / den
    np.testing.assert_allclose(np.linalg.norm(updates[k]), expected, rtol=1e-5)
  if denominator == "optax":  # ||step|| = lr * eta * ||w||: independent of g.
    np.testing.assert_allclose(np.linalg.norm(updates["dense"]),
                               lr * eta * np.linalg.norm(params["dense"]), rtol=1e-5)


def test_step_invariant_to_gradient_scale_without_weight_decay():
  params, grads = make_tree(3), make_tree(4)
  opt = optim.lars(0.1, momentum=0.9)
  state = opt.init(params)
  small, _ = opt.update(grads, state, params)
  big, _ = opt.update(jax.tree.map(lambda g: 1e4 * g, grads), state, params)
  for k in ("conv", "dense"):
    np.testing.assert_allclose(big[k], small[k], rtol=1e-5)
  np.testing.assert_allclose(big["bias"], 1e4 * small["bias"], rtol=1e-5)


def test_optax_denominator_matches_optax_lars():
  params, grads = make_tree(5), make_tree(6, scale=0.1)
  mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
  ours = optim.lars(0.3, weight_decay=1e-3, eps=1e-9, denominator="optax")
  theirs = optax.lars(0.3, weight_decay=1e-3, eps=1e-9, weight_decay_mask=mask,
                      trust_ratio_mask=mask)
  a, _ = run_lbjax(ours, params, [grads] * 3)
  b, _ = run_lbjax(theirs, params, [grads] * 3)
  for k in params:
    np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)


def test_zero_norm_leaves_are_finite_and_scaled_by_eta():
  params = {"zero_w": np.zeros((4, 4), np.float32), "zero_g": np.ones((4, 4), np.float32),
            "both": np.zeros((2, 2), np.float32)}
  grads = {"zero_w": np.full((4, 4), 3.0, np.float32), "zero_g": np.zeros((4, 4), np.float32),
           "both": np.zeros((2, 2), np.float32)}
  for beta in (0.0, 1e-3):
    opt = optim.lars(10.0, momentum=0.0, weight_decay=beta, trust_coefficient=1e-3)
    updates, state = opt.update(grads, opt.init(params), params)
    ratios = optim.trust_ratios(state)
    assert all(np.all(np.isfinite(u)) for u in jax.tree.leaves(updates))
    # ||w|| = 0: lambda = eta, the step is lr * eta * g, not the raw lr * g.
    np.testing.assert_allclose(updates["zero_w"], -10.0 * 1e-3 * 3.0, rtol=1e-6)
    np.testing.assert_allclose(ratios["zero_w"], 1e-3)
    np.testing.assert_allclose(updates["both"], 0.0)
    # ||g|| = 0: with beta > 0 Algorithm 1 is defined (lambda = eta / beta); with beta = 0, eta.
    expected = 1e-3 / beta if beta else 1e-3
    np.testing.assert_allclose(ratios["zero_g"], expected, rtol=1e-6)
    np.testing.assert_allclose(updates["zero_g"], -10.0 * expected * beta, rtol=1e-6)


def test_sharded_jit_equals_unsharded():
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  shapes = {"conv": (3, 3, 8, 16), "dense": (16, 24), "bias": (24,)}
  rng = np.random.default_rng(7)
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  grads = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  opt = optim.lars(0.5, weight_decay=1e-3)

  def step(p, g, s):
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  want, want_state = jax.jit(step)(params, grads, opt.init(params))
  spec = {"conv": P(None, None, None, "data"), "dense": P("data"), "bias": P("data")}
  shard = lambda t: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), t, spec)
  sp, sg = shard(params), shard(grads)
  got, got_state = jax.jit(step)(sp, sg, opt.init(sp))
  assert got["dense"].sharding.spec == P("data")
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
               optim.trust_ratios(got_state), optim.trust_ratios(want_state))


def _sharded_problem():
  rng = np.random.default_rng(8)
  shapes = {"dense": (16, 6), "stack": (8, 5)}
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  grads = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  mask = {"dense": True, "stack": True}
  return params, grads, mask


def test_shard_map_with_axis_name_equals_global():
  params, grads, mask = _sharded_problem()
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  global_opt = optim.lars(0.5, weight_decay=1e-3, mask=mask)
  want, _ = global_opt.update(grads, global_opt.init(params), params)
  local_opt = optim.lars(0.5, weight_decay=1e-3, mask=mask, axis_name="data")

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(P("data"), P("data")),
                     out_specs=(P("data"), P()))
  def update(g, p):
    u, s = local_opt.update(g, local_opt.init(p), p)
    return u, optim.trust_ratios(s)

  got, ratios = jax.jit(update)(grads, params)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-8)
  for k in params:
    expected = ref.lars_local_lr(params[k], grads[k], 1e-3, 1e-3)
    np.testing.assert_allclose(ratios[k], expected, rtol=1e-5)


def test_pmap_with_axis_name_equals_global():
  params, grads, mask = _sharded_problem()
  global_opt = optim.lars(0.5, weight_decay=1e-3, mask=mask)
  want, _ = global_opt.update(grads, global_opt.init(params), params)
  local_opt = optim.lars(0.5, weight_decay=1e-3, mask=mask, axis_name="i")
  split = lambda t: jax.tree.map(lambda x: x.reshape((8, -1) + x.shape[1:]), t)

  def update(g, p):
    return local_opt.update(g, local_opt.init(p), p)[0]

  got = jax.pmap(update, axis_name="i")(split(grads), split(params))
  for k in params:
    np.testing.assert_allclose(np.asarray(got[k]).reshape(want[k].shape), want[k], rtol=1e-6,
                               atol=1e-8)


def test_multisteps_equals_one_step_on_the_mean_gradient():
  params = make_tree(9)
  micro = [make_tree(20 + i, scale=0.1) for i in range(3)]
  mean = jax.tree.map(lambda *g: sum(g) / 3, *micro)
  opt = optim.lars(0.5, weight_decay=1e-3)
  want, want_state = run_lbjax(opt, params, [mean])
  got, got_state = run_lbjax(optax.MultiSteps(opt, every_k_schedule=3), params, micro)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5),
               optim.trust_ratios(got_state), optim.trust_ratios(want_state))


def test_inject_hyperparams_learning_rate_can_be_set_each_step():
  params = make_tree(11)
  grads_seq = [make_tree(30 + t, scale=0.1) for t in range(4)]
  lrs = [1.0, 0.5, 0.25, 0.0]
  opt = optax.inject_hyperparams(optim.lars)(learning_rate=1.0, momentum=0.9, weight_decay=1e-3)
  state = opt.init(params)
  update = jax.jit(opt.update)
  got = params
  for lr, grads in zip(lrs, grads_seq):
    state.hyperparams["learning_rate"] = jnp.asarray(lr)
    updates, state = update(grads, state, got)
    got = optax.apply_updates(got, updates)
  want, _ = run_lbjax(optim.lars(lambda t: jnp.asarray(lrs)[t], weight_decay=1e-3), params,
                      grads_seq)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)
  assert optim.trust_ratios(state)["conv"].shape == ()


def test_masks_callable_and_pytree_select_the_same_leaves():
  params, grads = make_tree(12), make_tree(13)
  by_fn = optim.lars(0.1, mask=lambda p: {k: k != "conv" for k in p})
  by_tree = optim.lars(0.1, mask={"conv": False, "dense": True, "bias": True, "scale": True})
  a, sa = by_fn.update(grads, by_fn.init(params), params)
  b, sb = by_tree.update(grads, by_tree.init(params), params)
  ra, rb = optim.trust_ratios(sa), optim.trust_ratios(sb)
  assert set(ra) == set(params)  # every leaf accounted for
  assert np.isnan(ra["conv"]) and np.isnan(rb["conv"])
  for k in params:
    np.testing.assert_array_equal(a[k], b[k])
  np.testing.assert_allclose(a["conv"], -0.1 * grads["conv"], rtol=1e-6)  # plain SGD


@pytest.mark.parametrize("mask, message", [
    ({"conv": True}, "same tree structure"),
    ({"conv": True, "dense": True, "bias": 1, "scale": False}, "Python bool"),
])
def test_bad_mask_gives_clear_error(mask, message):
  opt = optim.lars(0.1, mask=mask)
  with pytest.raises(ValueError, match=message):
    opt.init(make_tree(0))


def test_stacked_layers_get_one_trust_ratio_per_slice():
  rng = np.random.default_rng(14)
  w = rng.normal(size=(3, 5, 4)).astype(np.float32) * np.array([1, 10, 100], np.float32)[:, None,
                                                                                         None]
  g = rng.normal(size=(3, 5, 4)).astype(np.float32)
  params, grads = {"blocks": w, "bias": np.ones((3, 4), np.float32)}, {"blocks": g,
                                                                      "bias": np.ones((3, 4))}
  opt = optim.lars(1.0, momentum=0.0, stacked=1)
  updates, state = opt.update(grads, opt.init(params), params)
  ratios = optim.trust_ratios(state)
  assert ratios["blocks"].shape == (3,)
  assert np.isnan(ratios["bias"])  # a stacked bias has 1-D layers: not selected by default
  for i in range(3):
    np.testing.assert_allclose(ratios["blocks"][i], ref.lars_local_lr(w[i], g[i], 1e-3, 0.0),
                               rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(updates["blocks"][i]),
                               1e-3 * np.linalg.norm(w[i]), rtol=1e-5)


def test_trust_ratios_found_in_nested_states():
  params, grads = make_tree(15), make_tree(16)
  inner = optax.inject_hyperparams(optim.lars)(learning_rate=0.1)
  opt = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(1.0), inner), every_k_schedule=1)
  _, state = run_lbjax(opt, params, [grads])
  ratios = optim.trust_ratios(state)
  clipped = jax.tree.map(lambda g: g * min(1.0, 1.0 / optax.tree.norm(grads)), grads)
  np.testing.assert_allclose(ratios["dense"],
                             ref.lars_local_lr(params["dense"], clipped["dense"], 1e-3, 0.0),
                             rtol=1e-5)
  with pytest.raises(ValueError, match="no LayerwiseRateState"):
    optim.trust_ratios(optax.sgd(0.1).init(params))


def test_trust_ratios_merge_multi_transform_states():
  params, grads = make_tree(17), make_tree(18)
  labels = {"conv": "a", "dense": "b", "bias": "b", "scale": "a"}
  opt = optax.multi_transform({"a": optim.lars(
      0.1, mask={"conv": True, "dense": True, "bias": True, "scale": False}),
                               "b": optim.lars(0.2, trust_coefficient=0.01)}, labels)
  _, state = run_lbjax(opt, params, [grads])
  ratios = optim.trust_ratios(state)
  np.testing.assert_allclose(ratios["conv"], ref.lars_local_lr(params["conv"], grads["conv"],
                                                               1e-3, 0.0), rtol=1e-5)
  np.testing.assert_allclose(ratios["dense"], ref.lars_local_lr(params["dense"], grads["dense"],
                                                                1e-2, 0.0), rtol=1e-5)
  assert np.isnan(ratios["bias"]) and np.isnan(ratios["scale"])


def test_update_without_params_is_an_error():
  opt = optim.lars(0.1)
  params = make_tree(0)
  with pytest.raises(ValueError, match="need the parameters"):
    opt.update(params, opt.init(params))


@pytest.mark.parametrize("kwargs, message", [
    ({"learning_rate": -0.1}, "learning_rate"),
    ({"momentum": 1.0}, "momentum"),
    ({"momentum": -0.5}, "momentum"),
    ({"weight_decay": -1e-4}, "weight_decay"),
    ({"trust_coefficient": 0.0}, "trust_coefficient"),
    ({"trust_coefficient": -1e-3}, "trust_coefficient"),
    ({"eps": -1.0}, "eps"),
    ({"denominator": "l1"}, "denominator"),
    ({"stacked": 5}, "stacked"),
])
def test_bad_arguments_give_clear_errors(kwargs, message):
  args = {"learning_rate": 0.1, **kwargs}
  with pytest.raises(ValueError, match=message):
    opt = optim.lars(**args)
    opt.init(make_tree(0))


def test_inject_hyperparams_with_static_callable_mask_and_stacked():
  params = {"blocks": np.ones((2, 3, 4), np.float32), "bias": np.ones((2, 4), np.float32)}
  grads = jax.tree.map(lambda p: 0.5 * p, params)
  factory = optax.inject_hyperparams(optim.lars, static_args=("mask", "stacked"))
  opt = factory(learning_rate=0.1, mask=lambda p: {"blocks": True, "bias": False}, stacked=1)
  _, state = jax.jit(opt.update)(grads, opt.init(params), params)
  ratios = optim.trust_ratios(state)
  np.testing.assert_allclose(ratios["blocks"], [2e-3, 2e-3], rtol=1e-6)  # eta * ||w|| / ||g||
  assert np.isnan(ratios["bias"])
