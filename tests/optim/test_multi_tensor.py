"""The multi-tensor layout (`lbjax.optim.multi_tensor`, `layout="flat"`): the same numbers as the
per-leaf layout, a state of a few buffers, and on a GPU a number of kernels that does not grow with the
number of leaves. The battery (test_battery.py) runs every optax-style check on the flat `lars`, `lamb`
and `percent_delta` too."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from lbjax import optim
from lbjax.optim import multi_tensor
from lbjax.train import gpu_targets
from tests.optim import test_battery as battery

REPO = pathlib.Path(__file__).resolve().parents[2]
BLOCK = multi_tensor.BLOCK

# One leaf spanning several blocks with a partial last one, a stacked leaf (3 layers), a bfloat16
# leaf beside float32 ones (two buffers, one float32 rate vector), an empty kernel and a vector.
SHAPES = {"dense": ((1500, 3), jnp.float32), "stacked": ((3, 5, 7), jnp.float32),
          "half": ((6, 4), jnp.bfloat16), "empty": ((0, 4), jnp.float32), "bias": ((8,), jnp.float32)}
STACKED = {"dense": 0, "stacked": 1, "half": 0, "empty": 0, "bias": 0}


def tree(seed, scale=1.0):
  rng = np.random.default_rng(seed)
  return {k: jnp.asarray(scale * rng.normal(size=shape), dtype) for k, (shape, dtype) in SHAPES.items()}


def run(opt, steps=3):
  """Parameters, state and last updates after `steps` jitted updates."""
  params, state = tree(0), opt.init(tree(0))
  update = jax.jit(opt.update)
  for t in range(steps):
    updates, state = update(tree(1 + t, scale=0.1), state, params)
    params = optax.apply_updates(params, updates)
  return params, state, updates


def assert_close(actual, desired, rtol):
  for key in SHAPES:
    a, d = (np.asarray(x[key], np.float64) for x in (actual, desired))
    np.testing.assert_allclose(a, d, rtol=rtol, atol=rtol * np.max(np.abs(d), initial=0.0), err_msg=key)


def test_the_layout_pads_every_layer_to_whole_blocks_and_gives_the_leaves_back():
  params = tree(0)
  layout = multi_tensor.FlatLayout.of(params, stacked=STACKED)
  assert layout.dtypes == ("bfloat16", "float32")
  flat = layout.flatten(params)
  # float32: dense 4,500 values -> 5 blocks; 3 stacked layers of 35 -> 1 block each; empty -> none; bias -> 1.
  assert flat.buffers[1].shape == (5 + 3 + 0 + 1, BLOCK) and flat.buffers[0].shape == (1, BLOCK)
  assert float(jnp.sum(jnp.abs(flat.buffers[1]))) == pytest.approx(
      sum(float(jnp.sum(jnp.abs(params[k]))) for k in ("dense", "stacked", "bias")), rel=1e-5)  # padding is zeros
  round_trip = layout.unflatten(flat)
  for key in SHAPES:
    np.testing.assert_array_equal(round_trip[key], params[key])
    assert round_trip[key].dtype == params[key].dtype
  # Leaves in the tree's order (bias, dense, empty, half, stacked); each block names its layer's
  # entry in the float32 rate vector (dense 0, empty 1 with no block, half 2, the stacked layers 3-5);
  # the vector's length (6) marks the bias block, which the default mask leaves out.
  np.testing.assert_array_equal(layout.block_layers[1], [6, 0, 0, 0, 0, 0, 3, 4, 5])
  np.testing.assert_array_equal(layout.block_layers[0], [2])
  # The values of each block that are its layer's (the rest is padding).
  np.testing.assert_array_equal(layout.block_values[1], [8, 1024, 1024, 1024, 1024, 4500 - 4 * 1024, 35, 35, 35])
  np.testing.assert_array_equal(layout.block_values[0], [24])


@pytest.mark.parametrize("name, factory, kwargs, rtol", [
    ("lars", optim.lars, dict(learning_rate=0.5, weight_decay=1e-3, trust_coefficient=1e-2), 1e-5),
    ("lars, Nesterov, bfloat16 momentum", optim.lars,
     dict(learning_rate=0.5, weight_decay=1e-3, trust_coefficient=1e-2, nesterov=True,
          accumulator_dtype="bfloat16"), 1e-5),
    ("lamb", optim.lamb, dict(learning_rate=0.01, weight_decay=1e-3), 1e-5),
    # |d_i / w_i| is heavy-tailed (weights near zero): the first step's rates agree to 1e-7, three
    # steps of momentum carry the rounding to 3e-5.
    ("percent_delta", optim.percent_delta, dict(learning_rate=0.05, weight_decay=1e-3), 1e-4),
])
def test_the_flat_layout_computes_what_the_per_leaf_layout_computes(name, factory, kwargs, rtol):
  """Parameters and every layer's rate (the stacked leaf: one per layer) after three updates agree to
  float32 rounding (the order of summation differs); the empty kernel gets the zero-norm rate."""
  per_leaf = run(factory(stacked=STACKED, **kwargs))
  flat = run(factory(stacked=STACKED, layout="flat", **kwargs))
  assert_close(flat[0], per_leaf[0], rtol)
  ratios, want = optim.trust_ratios(flat[1]), optim.trust_ratios(per_leaf[1])
  assert ratios["stacked"].shape == (3,) and np.isnan(ratios["bias"])
  for key in ("dense", "stacked", "half", "empty"):
    np.testing.assert_allclose(ratios[key], want[key], rtol=rtol, err_msg=f"{name}: {key}")
  assert jax.tree.map(lambda u: u.dtype, flat[2]) == jax.tree.map(lambda p: p.dtype, tree(0))


@pytest.mark.parametrize("hyperparams", ["literal", "injected"])
def test_lamb_without_eps_leaves_the_padding_out_of_its_norms(hyperparams):
  """With eps = eps_root = 0, Adam's direction in the padding (zero gradient, zero moments) is 0/0: the flat
  layout's norms must not read it (they were NaN, and the zero-norm rule set every padded layer's ratio to 1).
  Injected (traced) eps may be 0, so the padding is left out then too."""
  def lamb(layout):
    if hyperparams == "literal":
      return optim.lamb(0.01, eps=0.0, weight_decay=1e-3, stacked=STACKED, layout=layout)
    return optax.inject_hyperparams(optim.lamb, static_args=("layout", "stacked"))(
        learning_rate=0.01, eps=0.0, weight_decay=1e-3, stacked=STACKED, layout=layout)

  flat, per_leaf = run(lamb("flat")), run(lamb("per_leaf"))
  ratios = optim.trust_ratios(flat[1])
  for key in ("dense", "stacked", "half"):
    assert np.all(np.isfinite(ratios[key])) and not np.allclose(ratios[key], 1.0), key
    np.testing.assert_allclose(ratios[key], optim.trust_ratios(per_leaf[1])[key], rtol=1e-5, err_msg=key)
  assert_close(flat[0], per_leaf[0], 1e-5)


def test_the_momentum_is_algorithm_1s_v_in_one_buffer_per_dtype():
  """papers/000 Algorithm 1 keeps v and moves w by -v; the flat state holds that v (the per-leaf
  state, optax's convention, holds -v)."""
  kwargs = dict(learning_rate=0.5, weight_decay=1e-3, trust_coefficient=1e-2, stacked=STACKED)
  _, flat_state, _ = run(optim.lars(layout="flat", **kwargs))
  _, leaf_state, _ = run(optim.lars(**kwargs))
  (trace,) = [x for x in jax.tree.leaves(flat_state, is_leaf=lambda x: isinstance(x, optax.TraceState))
              if isinstance(x, optax.TraceState)]
  assert isinstance(trace.trace, multi_tensor.FlatTree) and len(trace.trace.buffers) == 2
  (leaf_trace,) = [x for x in jax.tree.leaves(leaf_state, is_leaf=lambda x: isinstance(x, optax.TraceState))
                   if isinstance(x, optax.TraceState)]
  v = trace.trace.layout.unflatten(trace.trace)
  assert_close(v, jax.tree.map(jnp.negative, leaf_trace.trace), 1e-5)


def test_sharded_parameters_under_jit_give_the_same_numbers():
  """Correct (if gathered) with parameters split over 8 devices under `jit`; the trainer refuses the
  flat layout with a split mesh for the gathering's sake (tests/train/test_optimizer_config.py)."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(16, 40)), jnp.float32),
            "b": jnp.ones((40,), jnp.float32)}
  grads = jax.tree.map(lambda p: 0.1 * jnp.cos(p), params)
  split = {"w": NamedSharding(mesh, P("fsdp")), "b": NamedSharding(mesh, P())}
  results = []
  for layout in ("per_leaf", "flat"):
    opt = optim.lars(0.5, weight_decay=1e-3, trust_coefficient=1e-2, layout=layout)
    p, g = jax.device_put(params, split), jax.device_put(grads, split)
    updates, _ = jax.jit(opt.update)(g, jax.jit(opt.init)(p), p)
    results.append(updates)
  for key in params:
    np.testing.assert_allclose(results[1][key], results[0][key], rtol=1e-6)


def test_a_layout_that_does_not_exist_and_a_statistic_that_is_not_a_sum_are_refused():
  with pytest.raises(ValueError, match=r"layout must be one of \('per_leaf', 'flat', 'fused'\), got 'flatt'"):
    optim.lars(0.1, layout="flatt")
  with pytest.raises(ValueError, match=r"needs a statistic made of per-layer sums.*layout='per_leaf'"):
    multi_tensor.scale_by_summed_rate(optim.median_curvature_rate())
  with pytest.raises(TypeError, match=r"works on FlatTrees.*scale_by_layerwise_rate on ordinary pytrees"):
    multi_tensor.scale_by_summed_rate(optim.lars_rate()).init({"w": jnp.ones((2, 2))})
  opt = optim.lars(0.1, layout="flat")
  with pytest.raises(ValueError, match=r"needs the parameters: call update\(grads, state, params\)"):
    opt.update({"w": jnp.ones((2, 2))}, opt.init({"w": jnp.ones((2, 2))}))


def test_shard_map_with_stacked_layers_equals_the_global_computation():
  """Each device lays out its own shards; the per-layer sums of all buffers are completed in one psum."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  params = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(4, 16, 24)), jnp.float32)}
  grads_seq = [jax.tree.map(lambda p, t=t: 0.1 * jnp.sin(p + t), params) for t in range(2)]
  kwargs = dict(learning_rate=0.5, weight_decay=1e-3, trust_coefficient=1e-2, stacked=1, layout="flat")
  want, _, _ = battery.run(optim.lars(**kwargs), params, grads_seq)
  got = battery.run_under_shard_map(optim.lars(axis_name="data", **kwargs), mesh, P(None, "data"), params, grads_seq)
  np.testing.assert_allclose(got["w"], want["w"], rtol=1e-5, atol=1e-7)


COUNT_KERNELS = """
import json
from lbjax.train import gpu_targets
gpu_targets.allow_plugin_without_cuda()
import jax, jax.numpy as jnp, optax
from lbjax.train.hlo_analysis import kernel_count
from lbjax import optim
from lbjax.optim import fused
(device,) = gpu_targets.devices("h100")
sharding = jax.sharding.SingleDeviceSharding(device)
counts = {}
for copies in (8, 16):
  for shapes_of in ("same", "distinct"):  # the dense leaves all (64, 48), or each its own shape
    shapes = {f"{name}{i:02d}": shape for i in range(copies)
              for name, shape in (("conv", (3, 3, 16, 16)), ("dense", (64, 48 + (i if shapes_of == "distinct" else 0))),
                                  ("bias", (48,)))}
    params = {k: jax.ShapeDtypeStruct(s, jnp.float32, sharding=sharding) for k, s in shapes.items()}
    for layout in ("per_leaf", "flat", "fused"):
      if (layout, shapes_of) == ("per_leaf", "distinct") or (layout, copies, shapes_of) == ("fused", 8, "same"):
        continue  # not compared: 4-5 s of compilation each
      opt = optim.lars(0.1, weight_decay=1e-4, layout=layout)
      apply_updates = fused.apply_updates if layout == "fused" else optax.apply_updates
      def step(p, s, g):
        u, s = opt.update(g, s, p)
        return apply_updates(p, u), s
      state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                           jax.eval_shape(opt.init, params))
      with gpu_targets.lowering_for({device}):
        compiled = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, params).compile()
      counts[f"{layout} {len(shapes)} {shapes_of}"] = kernel_count(compiled)
print(json.dumps(counts))
"""


def gpu_kernel_counts() -> dict[str, int]:
  """Kernels per LARS update of 24 and 48 leaves (same or distinct shapes) in each layout, compiled for an
  H100 on this machine (XLA:GPU's kernels, as the lent H200 counted them), in a process of its own."""
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "JAX_NUM_CPU_DEVICES")}
  done = subprocess.run([sys.executable, "-c", COUNT_KERNELS], capture_output=True, text=True, timeout=600,
                        check=False, env=dict(env, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu"))
  assert done.returncode == 0, done.stderr[-2000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


NEEDS_CUDA_PLUGIN = pytest.mark.skipif(
    not gpu_targets.plugin_installed(),
    reason='JAX\'s CUDA plugin is not installed: pip install "jax[cuda12-local]==<jax version>"')


@NEEDS_CUDA_PLUGIN
def test_on_a_gpu_the_flat_and_fused_updates_launch_as_many_kernels_for_48_leaves_as_for_24():
  """The per-leaf update adds kernels with every leaf, the flat one only with every new leaf shape (its
  weight updates are grouped by shape), the fused one (test_fused.py) none: its two kernels, the weight update
  and a few small XLA kernels for the rates, however many leaves and shapes. One test, so that the counts'
  process (30 s of compilation) runs once."""
  counts = gpu_kernel_counts()
  assert counts["flat 48 same"] == counts["flat 24 same"] <= 16
  assert counts["flat 48 distinct"] > counts["flat 24 distinct"]
  assert counts["per_leaf 48 same"] > counts["per_leaf 24 same"] + 24
  assert counts["fused 48 distinct"] == counts["fused 24 distinct"] == counts["fused 48 same"] <= 8
