"""The shared layer-wise machinery: pluggable statistics, Nesterov, argument checks, import hygiene."""

import dataclasses
import functools
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lbjax import optim
from tests.optim import numpy_reference as ref
from tests.optim.test_lars import make_tree


def test_custom_statistic_plugs_into_the_shared_transform():
  def unit_step(w, g, weight_decay, layer):  # every selected layer moves by a unit-norm step
    return optim.safe_quotient(1.0, layer.norm(g + weight_decay * w))

  params, grads = make_tree(100), make_tree(101)
  opt = optim.layerwise_sgd(optim.scale_by_layerwise_rate(unit_step), 0.1, momentum=0.0)
  updates, state = opt.update(grads, opt.init(params), params)
  for k in ("conv", "dense"):
    np.testing.assert_allclose(np.linalg.norm(updates[k]), 0.1, rtol=1e-5)
    np.testing.assert_allclose(optim.trust_ratios(state)[k], 1 / np.linalg.norm(grads[k]),
                               rtol=1e-5)
  np.testing.assert_allclose(updates["bias"], -0.1 * grads["bias"], rtol=1e-6)


def test_nesterov_lars_matches_numpy():
  lr, m, beta, eta = 0.5, 0.9, 1e-3, 1e-3
  params = make_tree(102)
  grads_seq = [make_tree(103 + t, scale=0.1) for t in range(3)]
  opt = optim.lars(lr, m, beta, eta, nesterov=True, mask=lambda p: {k: True for k in p})
  state = opt.init(params)
  got = params
  for grads in grads_seq:
    updates, state = opt.update(grads, state, got)
    got = optax.apply_updates(got, updates)
  w = {k: v.astype(np.float64) for k, v in params.items()}
  v = {k: np.zeros_like(x) for k, x in w.items()}
  for grads in grads_seq:
    for k in w:
      step = lr * ref.lars_local_lr(w[k], grads[k], eta, beta) * (grads[k] + beta * w[k])
      v[k] = m * v[k] + step
      w[k] = w[k] - (m * v[k] + step)  # Nesterov: look ahead along the new velocity
  for k in w:
    np.testing.assert_allclose(got[k], w[k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("build, message", [
    (lambda: optim.lamb(-1e-3), "learning_rate"),
    (lambda: optim.lamb(1e-3, b1=1.0), "b1"),
    (lambda: optim.lamb(1e-3, b2=-0.1), "b2"),
    (lambda: optim.lamb(1e-3, weight_decay=-1.0), "weight_decay"),
    (lambda: optim.percent_delta(0.1, momentum=1.5), "momentum"),
    (lambda: optim.mclr(0.1, weight_decay=-1e-4), "weight_decay"),
    (lambda: optim.lars(float("nan")), "learning_rate"),
])
def test_relatives_reject_bad_arguments(build, message):
  with pytest.raises(ValueError, match=message):
    build()


@pytest.mark.parametrize("build, message", [
    (lambda: optim.scale_by_layerwise_rate(1.0), "rate must be a SummedRate .* got 1.0"),
    (lambda: optim.scale_by_layerwise_rate(optim.lars_rate), r"call it: rate=lars_rate\(...\)"),
    (lambda: optim.scale_by_layerwise_rate(optim.scale_by_lars()), "rate must be a SummedRate"),
    (lambda: optim.layerwise_sgd(optim.lars_rate(), 0.1),
     r"scaling must be an optax.GradientTransformation .* wrap it as scale_by_layerwise_rate\(rate\)"),
    (lambda: optim.layerwise_sgd(None, 0.1), "scaling must be an optax.GradientTransformation"),
])
def test_a_rate_or_scaling_of_the_wrong_kind_is_a_type_error_when_built(build, message):
  """Not "'float' object is not callable" or "'SummedRate' object has no attribute 'init'"."""
  with pytest.raises(TypeError, match=message):
    build()


def test_non_numeric_hyperparameter_is_a_type_error():
  with pytest.raises(TypeError, match="number"):
    optim.lars("0.1")


def test_importing_optim_pulls_in_no_flax_tfds_or_other_lbjax():
  code = ("import sys, lbjax.optim; "
          "bad = [m for m in sys.modules if m.split('.')[0] in ('flax', 'tensorflow_datasets', "
          "'tensorflow') or (m.startswith('lbjax.') and not m.startswith('lbjax.optim'))]; "
          "print(bad); sys.exit(1 if bad else 0)")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"JAX_PLATFORMS": "cpu", "PATH": ""}, check=False)
  assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", ["lars", "lars_optax", "lamb", "percent_delta", "mclr"])
def test_every_statistic_under_shard_map_and_sharded_jit_equals_global(name):
  build = {
      "lars": lambda **kw: optim.scale_by_lars(weight_decay=1e-2, **kw),
      "lars_optax": lambda **kw: optim.scale_by_lars(weight_decay=1e-2, denominator="optax", **kw),
      "lamb": lambda **kw: optim.scale_by_lamb_trust_ratio(weight_decay=1e-2, **kw),
      "percent_delta": lambda **kw: optim.scale_by_percent_delta(weight_decay=1e-2, **kw),
      "mclr": lambda **kw: optim.scale_by_median_curvature(weight_decay=1e-2, **kw),
  }[name]
  rng = np.random.default_rng(110)
  params = {"w": rng.normal(size=(16, 6)).astype(np.float32),
            "stack": rng.normal(size=(2, 8, 3)).astype(np.float32)}
  params["w"][:4, 0] = 0.0
  grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params)
  stacked = {"w": 0, "stack": 1}
  spec = {"w": P("data"), "stack": P(None, "data")}
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  opt = build(mask={"w": True, "stack": True}, stacked=stacked)
  want, want_state = opt.update(grads, opt.init(params), params)
  want_ratios = optim.trust_ratios(want_state)

  local = build(mask={"w": True, "stack": True}, stacked=stacked, axis_name="data")

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, P()))
  def update(g, p):
    u, s = local.update(g, local.init(p), p)
    return u, optim.trust_ratios(s)

  got, got_ratios = jax.jit(update)(grads, params)
  shard = lambda t: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), t, spec)
  jit_got, jit_state = jax.jit(opt.update)(shard(grads), opt.init(shard(params)), shard(params))
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got_ratios[k], want_ratios[k], rtol=1e-5)
    np.testing.assert_allclose(jit_got[k], want[k], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(optim.trust_ratios(jit_state)[k], want_ratios[k], rtol=1e-5)


def _stacked_problem(seed):
  rng = np.random.default_rng(seed)
  shapes = {"a": (16, 4), "b": (8, 3), "c": (2, 8, 3), "bias": (8,)}
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  grads = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
  return params, grads, {"a": 0, "b": 0, "c": 1, "bias": 0}


@pytest.mark.parametrize("build", [optim.scale_by_lars, optim.scale_by_lamb_trust_ratio,
                                   optim.scale_by_percent_delta])
def test_summed_statistics_take_one_psum_for_the_whole_tree(build):
  """Under shard_map, all sums of all layers are reduced across devices in one psum of one array."""
  params, grads, stacked = _stacked_problem(120)
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  spec = {"a": P("data"), "b": P("data"), "c": P(None, "data"), "bias": P("data")}
  opt = build(weight_decay=1e-3, stacked=stacked, axis_name="data")

  @functools.partial(jax.shard_map, mesh=mesh, in_specs=(spec, spec), out_specs=spec)
  def update(g, p):
    return opt.update(g, opt.init(p), p)[0]

  jaxpr = str(jax.make_jaxpr(update)(grads, params))
  assert len(re.findall(r"\bpsum\w*\[", jaxpr)) == 1, jaxpr


def test_rates_are_one_vector_in_the_state_and_per_leaf_in_trust_ratios():
  params, grads, stacked = _stacked_problem(121)
  opt = optim.lars(0.1, weight_decay=1e-3, stacked=stacked)
  _, state = jax.jit(opt.update)(grads, opt.init(params), params)
  (rate_state,) = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optim.LayerwiseRateState))
                   if isinstance(x, optim.LayerwiseRateState)]
  (vector,) = jax.tree.leaves(rate_state)
  assert vector.shape == (1 + 1 + 2,)  # a, b, and the two stacked layers of c; bias not selected
  ratios = optim.trust_ratios(state)
  assert ratios["c"].shape == (2,) and np.isnan(ratios["bias"])
  for k in ("a", "b"):
    np.testing.assert_allclose(ratios[k], ref.lars_local_lr(params[k], grads[k], 1e-3, 1e-3), rtol=1e-5)
  for i in range(2):
    np.testing.assert_allclose(ratios["c"][i], ref.lars_local_lr(params["c"][i], grads["c"][i], 1e-3, 1e-3),
                               rtol=1e-5)


@pytest.mark.parametrize("summed_rate", [optim.lars_rate, optim.lamb_rate, optim.percent_delta_rate])
def test_leaf_local_rates_give_the_rate_vectors_numbers_bit_for_bit(summed_rate):
  """`SummedRate.leaf_local` (LARS's, under jit) only changes which reductions each update waits for."""
  params, grads, stacked = _stacked_problem(123)
  results = []
  for leaf_local in (False, True):
    opt = optim.scale_by_layerwise_rate(dataclasses.replace(summed_rate(), leaf_local=leaf_local),
                                        weight_decay=1e-3, stacked=stacked)
    results.append(jax.jit(opt.update)(grads, opt.init(params), params))
  for got, want in zip(*map(jax.tree.leaves, results)):
    np.testing.assert_array_equal(got, want)


def test_sharded_parameters_under_jit_need_no_gather():
  """FSDP-sharded leaves (split along different axes): the compiled update has no all-gather,
  all-to-all or collective-permute; the per-layer sums are all-reduced."""
  params, grads, stacked = _stacked_problem(122)
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  spec = {"a": P("data"), "b": P("data", None), "c": P(None, "data"), "bias": P("data")}
  shard = lambda t: jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), t, spec)
  opt = optim.lars(0.1, weight_decay=1e-3, stacked=stacked)

  def step(p, s, g):
    u, s = opt.update(g, s, p)
    return optax.apply_updates(p, u), s

  sp = shard(params)
  hlo = jax.jit(step).lower(sp, jax.jit(opt.init)(sp), shard(grads)).compile().as_text()
  assert not re.search(r" (all-gather|all-to-all|collective-permute)(-start)?\(", hlo)
  assert re.search(r" all-reduce(-start)?\(", hlo)


def test_stacked_takes_a_numpy_integer_and_names_static_args_for_an_array():
  """A NumPy integer is an int; optax.inject_hyperparams turns `stacked` into an array, which was refused as "must
  have the same tree structure as the parameters" without the static_args hint."""
  params = {"b": jnp.ones((4, 3)), "k": jnp.ones((4, 3, 2))}
  assert optim.lars(0.1, stacked=np.int64(1)).init(params)[0].rates.vectors[0].shape == (4,)
  with pytest.raises(ValueError, match=r"must be a Python int .* pass static_args=\('stacked',\)"):
    optax.inject_hyperparams(optim.lars)(learning_rate=0.1, stacked=1).init(params)
  injected = optax.inject_hyperparams(optim.lars, static_args=("stacked",))(learning_rate=0.1, stacked=1)
  assert injected.init(params).inner_state[0].rates.vectors[0].shape == (4,)
