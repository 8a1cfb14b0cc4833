"""The fused layout (`lbjax.optim.fused`, `layout="fused"`): its Pallas kernels give the per-leaf layout's
numbers and state, run in Pallas's interpreter here and compiled by Triton where the tests run on a CUDA
GPU (`JAX_PLATFORMS=cuda`: the GPU suite's `fused_tests` part); elsewhere than on a CUDA GPU the layout is
the per-leaf update itself; compiled for an H100, an update launches a handful of kernels whatever the
number of leaves."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from lbjax import optim
from lbjax.optim import fused
from lbjax.optim import layerwise
from lbjax.optim import multi_tensor_apply
from tests.optim import test_battery as battery

CHUNK = multi_tensor_apply.CHUNK
ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU  # the kernels in Pallas's interpreter, except on a GPU

# A leaf of several chunks with a partial last one, a stacked leaf (3 layers, each a chunk), a bfloat16
# leaf beside float32 ones, an empty kernel and a vector (unselected by the default mask).
SHAPES = {"dense": ((CHUNK + 700, 3), jnp.float32), "stacked": ((3, 5, 7), jnp.float32),
          "half": ((6, 4), jnp.bfloat16), "empty": ((0, 4), jnp.float32), "bias": ((8,), jnp.float32)}
STACKED = {"dense": 0, "stacked": 1, "half": 0, "empty": 0, "bias": 0}


def tree(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(scale * rng.normal(size=shape), dtype) for k, (shape, dtype) in SHAPES.items()}


def run(opt, steps=3, apply=optax.apply_updates, state=None):
  """Parameters, state and last updates after `steps` jitted updates."""
  params = tree(0)
  state = opt.init(params) if state is None else state
  update = jax.jit(opt.update)
  for t in range(steps):
    updates, state = update(tree(1 + t, scale=0.1), state, params)
    params = apply(params, updates)
  return params, state, updates


def sgd_pair(rate, **kwargs):
  """The per-leaf update and the fused one with the same arguments."""
  arguments = dict(learning_rate=optax.linear_schedule(0.5, 0.1, 3), momentum=0.9, nesterov=False,
                   accumulator_dtype=None, weight_decay=1e-3, mask=None, stacked=STACKED, axis_name=None)
  arguments.update(kwargs)
  per_leaf = layerwise.layerwise_sgd(
      layerwise.scale_by_layerwise_rate(rate, weight_decay=arguments["weight_decay"], mask=arguments["mask"],
                                        stacked=arguments["stacked"], axis_name=arguments["axis_name"]),
      arguments["learning_rate"], arguments["momentum"], arguments["nesterov"], arguments.pop("accumulator_dtype"))
  return per_leaf, fused.layerwise_sgd(per_leaf, rate, **arguments, interpret=INTERPRET)


def assert_close(actual, desired, rtol):
  """Same structure and dtypes; values within `rtol`, or one rounding step of a narrower dtype (a rate that
  differs in its last float32 bit can round a bfloat16 weight the other way)."""
  assert jax.tree.structure(actual) == jax.tree.structure(desired)
  for (path, a), d in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(desired)):
    assert a.dtype == d.dtype, jax.tree_util.keystr(path)
    rtol = max(rtol, float(jnp.finfo(a.dtype).eps)) if jnp.issubdtype(a.dtype, jnp.floating) else rtol
    a, d = np.asarray(a, np.float64), np.asarray(d, np.float64)
    np.testing.assert_allclose(a, d, rtol=rtol, atol=rtol * np.max(np.abs(d), initial=0.0),
                               err_msg=jax.tree_util.keystr(path))


def assert_same_updates(kernels, per_leaf, rtol):
  """Three updates of each: the parameters, updates, state and trust ratios agree (`assert_close`)."""
  want_params, want_state, want_updates = run(per_leaf)
  got_params, got_state, got_updates = run(kernels)
  assert_close(got_params, want_params, rtol=rtol / 10)
  assert_close(got_updates, want_updates, rtol=rtol)
  assert_close(got_state, want_state, rtol=rtol)
  assert_close(optim.trust_ratios(got_state), optim.trust_ratios(want_state), rtol=rtol)


@pytest.mark.parametrize("name, rate, kwargs, rtol", [
    ("lars", optim.lars_rate(1e-2), {}, 1e-4),
    ("lars, no weight decay", optim.lars_rate(1e-2), dict(weight_decay=0.0), 1e-4),
    ("lars, optax denominator", optim.lars_rate(1e-2, denominator="optax"), {}, 1e-4),
    # The momentum is stored in bfloat16: a rate one float32 bit away can round a stored v the other way.
    ("lars, Nesterov, bfloat16 momentum", optim.lars_rate(1e-2), dict(nesterov=True, accumulator_dtype="bfloat16"),
     float(jnp.finfo(jnp.bfloat16).eps)),
    # |d_i / w_i| of the bfloat16 leaf is computed in bfloat16, and XLA keeps float32 between the fused
    # operations of the per-leaf code where the interpreted kernel rounds each: its rate differs by 0.1%.
    ("percent_delta", optim.percent_delta_rate(), dict(learning_rate=0.05), 2e-3),
])
def test_the_kernels_give_the_per_leaf_layouts_parameters_state_and_rates(name, rate, kwargs, rtol):
  """Algorithm 1 (papers/000) either way: the same parameters after three updates up to the order of
  summation of the norms, the same state, structure and dtypes included (a checkpoint moves between the
  layouts), and the same rates as `trust_ratios` reads them."""
  per_leaf, kernels = sgd_pair(rate, **kwargs)
  assert_same_updates(kernels, per_leaf, rtol)


def lamb_pair(**kwargs):
  """The per-leaf LAMB and the fused one with the same arguments."""
  arguments = dict(learning_rate=optax.linear_schedule(0.01, 0.002, 3), b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0,
                   weight_decay=1e-3, mask=None, stacked=STACKED, axis_name=None)
  arguments.update(kwargs)
  dtypes = {k: arguments.pop(k) for k in ("mu_dtype", "nu_dtype") if k in arguments}
  per_leaf = optim.lamb(**arguments, **dtypes)
  return per_leaf, fused.lamb(per_leaf, optim.lamb_rate(), **arguments, interpret=INTERPRET)


@pytest.mark.parametrize("name, kwargs, rtol", [
    ("lamb", {}, 1e-4),
    ("lamb, every leaf, no weight decay, eps_root", dict(mask=lambda p: jax.tree.map(lambda _: True, p),
                                                         weight_decay=0.0, eps_root=1e-8), 1e-4),
    # bfloat16 moments: a direction one float32 bit away can round a stored moment the other way.
    ("lamb, bfloat16 moments", dict(mu_dtype="bfloat16", nu_dtype="bfloat16"), float(jnp.finfo(jnp.bfloat16).eps)),
])
def test_the_lamb_kernels_give_the_per_leaf_layouts_parameters_state_and_ratios(name, kwargs, rtol):
  """LAMB's Algorithm 2 either way: Adam's moments and count, the trust ratios and the parameters."""
  per_leaf, kernels = lamb_pair(**kwargs)
  assert_same_updates(kernels, per_leaf, rtol)


def momentum_pair(accumulator_dtype=None, **kwargs):
  """lbjax's momentum SGD per leaf and fused with the same arguments."""
  arguments = dict(learning_rate=optax.linear_schedule(0.1, 0.02, 3), momentum=0.9, nesterov=False,
                   weight_decay=1e-3, mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params))
  arguments.update(kwargs)
  per_leaf = optim.momentum(**arguments, accumulator_dtype=accumulator_dtype)
  return per_leaf, fused.momentum_sgd(per_leaf, **arguments, interpret=INTERPRET)


@pytest.mark.parametrize("name, kwargs, rtol", [
    ("momentum, weight decay on kernels", {}, 1e-6),
    ("Nesterov, no weight decay", dict(nesterov=True, weight_decay=0.0), 1e-6),
    ("no momentum (plain SGD)", dict(momentum=0.0), 1e-6),
    ("bfloat16 momentum", dict(accumulator_dtype="bfloat16"), 1e-6),
])
def test_the_momentum_sgd_kernel_gives_optax_sgds_update(name, kwargs, rtol):
  """The baseline in the same layout: elementwise only, so the same numbers (no sum's order to differ)."""
  per_leaf, kernels = momentum_pair(**kwargs)
  want_params, want_state, want_updates = run(per_leaf)
  got_params, got_state, got_updates = run(kernels)
  assert_close(got_params, want_params, rtol)
  assert_close(got_updates, want_updates, rtol)
  assert_close(got_state, want_state, rtol)


def test_lamb_under_inject_hyperparams_and_shard_map():
  def factory(layout_of, learning_rate, b1, b2, weight_decay):
    return lamb_pair(learning_rate=learning_rate, b1=b1, b2=b2, weight_decay=weight_decay)[layout_of]

  hyper = dict(learning_rate=0.01, b1=0.8, b2=0.99, weight_decay=1e-3)
  want, _, _ = run(optax.inject_hyperparams(functools.partial(factory, 0))(**hyper))
  got, _, _ = run(optax.inject_hyperparams(functools.partial(factory, 1))(**hyper))
  assert_close(got, want, rtol=1e-4)
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 24)), jnp.float32)}
  grads_seq = [jax.tree.map(lambda p, t=t: 0.1 * jnp.sin(p + t), params) for t in range(2)]
  want, _, _ = battery.run(lamb_pair(stacked=1)[0], params, grads_seq)
  got = battery.run_under_shard_map(lamb_pair(stacked=1, axis_name="data")[1], mesh, P(None, "data"), params,
                                    grads_seq)
  np.testing.assert_allclose(got["w"], want["w"], rtol=1e-5, atol=1e-7)


def test_with_no_leaf_selected_the_kernels_give_momentum_sgd():
  """A mask that selects no leaf: no rates (an empty rate vector in the state), plain momentum SGD."""
  nothing = {"dense": False, "stacked": False, "half": False, "empty": False, "bias": False}
  per_leaf, kernels = sgd_pair(optim.lars_rate(1e-2), mask=nothing)
  assert_same_updates(kernels, per_leaf, rtol=1e-5)


def test_with_only_empty_layers_selected_every_rate_is_the_zero_norm_ones():
  """A selected kernel with no values beside a vector: its rate is 1 (`layerwise.safe_quotient`), as per leaf."""
  params = {"empty": jnp.zeros((0, 4)), "bias": jnp.ones((8,))}
  for per_leaf, kernels in (sgd_pair(optim.lars_rate(1e-2), stacked=None), lamb_pair(stacked=None)):
    want = per_leaf.update(params, per_leaf.init(params), params)
    got = kernels.update(params, kernels.init(params), params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_a_state_moves_between_the_layouts():
  per_leaf, kernels = sgd_pair(optim.lars_rate(1e-2))
  _, state, _ = run(per_leaf, steps=2)
  want, _, _ = run(per_leaf, steps=2, state=state)
  got, _, _ = run(kernels, steps=2, state=state)
  assert_close(got, want, rtol=1e-5)


def test_hyper_parameters_that_are_arrays_reach_the_kernels():
  """`optax.inject_hyperparams` passes the learning rate, momentum and weight decay as arrays: the kernels
  read them as inputs (Python numbers stay constants of the kernel)."""

  def factory(layout_of, learning_rate, momentum, weight_decay):
    return sgd_pair(optim.lars_rate(1e-2), learning_rate=learning_rate, momentum=momentum,
                    weight_decay=weight_decay)[layout_of]

  hyper = dict(learning_rate=0.5, momentum=0.8, weight_decay=1e-3)
  want, _, _ = run(optax.inject_hyperparams(functools.partial(factory, 0))(**hyper))
  got, state, _ = run(optax.inject_hyperparams(functools.partial(factory, 1))(**hyper))
  assert_close(got, want, rtol=1e-5)
  assert float(state.hyperparams["momentum"]) == pytest.approx(0.8)


def test_each_layer_of_a_stacked_leaf_longer_than_a_chunk_gets_its_own_rate():
  """Layers of several chunks each (the kernels' general case: a chunk's layer and offset both computed)."""
  per_leaf, kernels = sgd_pair(optim.lars_rate(1e-2), stacked={"w": 1})
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(3, CHUNK + 100)), jnp.float32)}
  grads_seq = [jax.tree.map(lambda p, t=t: 0.1 * jnp.sin(p * (t + 1) + p[:, :1] * 3), params) for t in range(2)]
  want, want_state, _ = battery.run(per_leaf, params, grads_seq)
  got, got_state, _ = battery.run(kernels, params, grads_seq)
  assert_close(got, want, rtol=1e-5)
  assert_close(got_state, want_state, rtol=1e-4)


def pallas_calls(update, *args) -> int:
  """How many Pallas kernels `update(*args)` builds (on a GPU, in the `platform_dependent` CUDA branch)."""
  return str(jax.make_jaxpr(update)(*args)).count("pallas_call[")


def test_more_leaves_than_a_kernel_takes_go_to_several_kernels_with_the_same_numbers(monkeypatch):
  """Kernels of at most `LEAVES_PER_KERNEL` leaves each (Triton's compile grows with the square of a
  kernel's leaves): with two, each pass over the 4 non-empty leaves is two kernels, the norms of the 3
  selected ones two more whose program sums are joined, and the numbers stay the per-leaf layout's."""
  monkeypatch.setattr(multi_tensor_apply, "LEAVES_PER_KERNEL", 2)
  params, grads = tree(0), tree(1, scale=0.1)
  for per_leaf, kernels in [sgd_pair(optim.lars_rate(1e-2)), lamb_pair()]:
    assert pallas_calls(kernels.update, grads, kernels.init(params), params) == 2 + 2
    assert_same_updates(kernels, per_leaf, rtol=1e-4)
  per_leaf, kernels = momentum_pair()
  assert pallas_calls(kernels.update, grads, kernels.init(params), params) == 2
  for got, want in zip(run(kernels), run(per_leaf)):
    assert_close(got, want, rtol=1e-6)
  add = functools.partial(fused.apply_updates, interpret=INTERPRET)
  assert pallas_calls(add, params, grads) == 2
  monkeypatch.setattr(multi_tensor_apply, "LEAVES_PER_KERNEL", 0)
  with pytest.raises(ValueError, match="LEAVES_PER_KERNEL must be a positive int, got 0"):
    fused.apply_updates(params, grads, interpret=INTERPRET)
  monkeypatch.setattr(multi_tensor_apply, "LEAVES_PER_KERNEL", 2)
  for key, value in jax.jit(add)(params, grads).items():
    np.testing.assert_array_equal(np.asarray(value, np.float32),
                                  np.asarray(optax.apply_updates(params, grads)[key], np.float32), err_msg=key)


def test_with_optax_multisteps_the_kernels_run_every_kth_call():
  per_leaf, kernels = sgd_pair(optim.lars_rate(1e-2))
  want, _, _ = run(optax.MultiSteps(per_leaf, 2), steps=4)
  got, _, _ = run(optax.MultiSteps(kernels, 2), steps=4)
  assert_close(got, want, rtol=1e-5)


def test_under_shard_map_each_device_sums_its_chunks_and_one_psum_completes_them():
  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 24)), jnp.float32)}
  grads_seq = [jax.tree.map(lambda p, t=t: 0.1 * jnp.sin(p + t), params) for t in range(2)]
  kwargs = dict(learning_rate=0.5, weight_decay=1e-3, stacked=1)
  want, _, _ = battery.run(sgd_pair(optim.lars_rate(1e-2), **kwargs)[0], params, grads_seq)
  got = battery.run_under_shard_map(sgd_pair(optim.lars_rate(1e-2), axis_name="data", **kwargs)[1], mesh,
                                    P(None, "data"), params, grads_seq)
  np.testing.assert_allclose(got["w"], want["w"], rtol=1e-5, atol=1e-7)


def test_under_vmap_each_member_of_an_ensemble_gets_its_own_update():
  """Pallas batches a kernel by adding a grid axis; each model's chunks and rates stay its own."""
  per_leaf, kernels = sgd_pair(optim.lars_rate(1e-2), stacked=None)
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(2, CHUNK + 9, 3)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(2, 7)), jnp.float32)}
  grads = jax.tree.map(lambda p: 0.1 * jnp.sin(p), params)

  def member(opt, p, g):
    updates, _ = opt.update(g, opt.init(p), p)
    return fused.apply_updates(p, updates, interpret=INTERPRET)

  got = jax.jit(jax.vmap(functools.partial(member, kernels)))(params, grads)
  for i in range(2):
    want = member(per_leaf, *jax.tree.map(lambda x, i=i: x[i], (params, grads)))
    for key in want:
      np.testing.assert_allclose(got[key][i], want[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_the_fused_apply_updates_is_optaxs_bit_for_bit():
  params = tree(0)
  updates = jax.tree.map(lambda x: (0.1 * x).astype(jnp.float32), tree(1))  # a bfloat16 leaf, a float32 update
  want = optax.apply_updates(params, updates)
  got = jax.jit(functools.partial(fused.apply_updates, interpret=INTERPRET))(params, updates)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for key in SHAPES:
    assert got[key].dtype == want[key].dtype
    np.testing.assert_array_equal(np.asarray(got[key], np.float32), np.asarray(want[key], np.float32), err_msg=key)


@pytest.mark.skipif(ON_GPU, reason="on a GPU the layout runs its kernels")
def test_off_a_gpu_the_fused_layout_is_the_per_leaf_update_bit_for_bit():
  kwargs = dict(learning_rate=0.5, weight_decay=1e-3, trust_coefficient=1e-2, stacked=STACKED)
  want_params, want_state, _ = run(optim.lars(**kwargs))
  got_params, got_state, _ = run(optim.lars(**kwargs, layout="fused"), apply=fused.apply_updates)
  for want, got in ((want_params, got_params), (want_state, got_state)):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, d in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(d, np.float32))


def test_a_tree_the_kernels_cannot_take_gets_the_per_leaf_update():
  """Complex leaves (Triton has no complex type) and `optax.masked`'s MaskedNodes: the per-leaf update, also
  on the kernels' path."""
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(3, 4)) * (1 + 1j), jnp.complex64)}
  per_leaf, kernels = sgd_pair(optim.lars_rate(), stacked=None)
  assert not multi_tensor_apply.kernels_take(params) and multi_tensor_apply.kernels_take(tree(0))
  want = per_leaf.update(params, per_leaf.init(params), params)
  got = kernels.update(params, kernels.init(params), params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(fused.apply_updates(params, params, interpret=INTERPRET)["w"], 2 * params["w"])
  masked = optax.masked(kernels, {"dense": True, "stacked": False, "half": True, "empty": True, "bias": False})
  want, _, _ = run(optax.masked(per_leaf, {"dense": True, "stacked": False, "half": True, "empty": True,
                                           "bias": False}))
  got, _, _ = run(masked)
  assert_close(got, want, rtol=0)


def test_a_jax_without_pallas_triton_refuses_the_layout_and_adds_updates_as_optax(monkeypatch):
  """Pallas's Triton backend is deprecated (JAX 0.12): where it is gone, the layout says what to use."""
  monkeypatch.setattr(multi_tensor_apply, "plgpu", None)
  with pytest.raises(ValueError, match=r"layout='fused' needs Pallas's Triton backend .* use layout='flat'"):
    optim.lars(0.1, layout="fused")
  with pytest.raises(ValueError, match=r"needs Pallas's Triton backend"):
    optim.lamb(0.1, layout="fused")
  params = tree(0)
  got = fused.apply_updates(params, params, interpret=INTERPRET)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(optax.apply_updates(params, params))):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_what_the_kernels_cannot_run_is_refused_with_what_to_use():
  with pytest.raises(ValueError, match=r"needs a statistic made of per-layer sums.*layout='per_leaf'"):
    fused.layerwise_sgd(optim.momentum(0.1), optim.median_curvature_rate(), 0.1, 0.9, False, 0.0, None, None, None)
  opt = optim.lars(0.1, layout="fused")
  with pytest.raises(ValueError, match=r"needs the parameters: call update\(grads, state, params\)"):
    opt.update({"w": jnp.ones((2, 2))}, opt.init({"w": jnp.ones((2, 2))}))

