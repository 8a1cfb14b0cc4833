"""PowerSGD (Vogels et al. 2019) against the statements of the paper, on 1 and 8 simulated devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from lbjax.optim import compression
from lbjax.train.optimizer import build_compressor
from tests.train import helpers

NUM_DEVICES = 8


def _low_rank(key, shape, rank):
  """A random array of `shape` whose matrix view (all axes but the last x the last) has this rank."""
  rows, cols = compression.matrix_shape(shape)
  a, b = jax.random.split(key)
  return (jax.random.normal(a, (rows, rank)) @ jax.random.normal(b, (rank, cols))).reshape(shape)


@pytest.mark.parametrize("rank, true_rank", [(1, 1), (2, 2), (4, 4), (4, 2)])
def test_gradient_of_rank_at_most_r_is_reconstructed_exactly_in_one_step(rank, true_rank):
  """If rank(M) <= r, span(M Q) = span(M) for the Gaussian initial Q (probability 1), so
  P^ P^T M = M: the first step, before any warm start, already returns M (up to float rounding)
  and leaves a zero error-feedback memory. A conv kernel is compressed as (h w in) x out."""
  grads = {"dense": _low_rank(jax.random.key(0), (24, 16), true_rank),
           "conv": _low_rank(jax.random.key(1), (3, 3, 4, 12), true_rank)}
  comp = compression.powersgd(rank)
  out, state = comp.update(grads, comp.init(grads))
  for name in grads:
    scale = float(jnp.abs(grads[name]).max())
    np.testing.assert_allclose(out[name], grads[name], atol=1e-5 * scale)
  assert all(float(jnp.abs(e).max()) < 1e-5 * 50 for e in state.residuals)


def test_warm_start_is_subspace_iteration_converging_to_the_truncated_svd():
  """§4.1: for a gradient that stays the same, reusing Q is subspace iteration, so without error
  feedback the output converges to the best rank-r approximation U_r S_r V_r^T (Eckart-Young)."""
  u, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(20, 12)))
  v, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(12, 12)))
  singular = 2.0 ** -np.arange(12)  # gap sigma_3 / sigma_2 = 1/2: error shrinks by 2 per step
  m = jnp.asarray((u * singular) @ v.T, jnp.float32)
  best = (u[:, :2] * singular[:2]) @ v[:, :2].T
  comp = compression.powersgd(2, error_feedback=False)
  state = comp.init(m)
  first, state = comp.update(m, state)
  for _ in range(30):
    out, state = comp.update(m, state)
  assert np.linalg.norm(first - best) > 1e-3
  np.testing.assert_allclose(out, best, atol=1e-5)


def test_error_feedback_makes_applied_updates_track_the_gradients():
  """Per worker, sum_t out_t = sum_t g_t - e_T: the running sum of applied updates tracks the running
  sum of gradients up to the bounded memory; without error feedback the lost part accumulates."""
  steps = 200
  drift = jnp.outer(jnp.linspace(-1.0, 1.0, 16), jnp.linspace(1.0, -1.0, 8)) * 0.05 + 0.02
  grads = drift + jax.random.normal(jax.random.key(0), (steps, 16, 8))

  def run(error_feedback):
    comp = compression.powersgd(1, error_feedback=error_feedback)
    state, sent = jax.lax.scan(lambda s, g: comp.update(g, s)[::-1], comp.init(grads[0]), grads)
    return jnp.sum(grads, 0) - jnp.sum(sent, 0), state

  err_ef, state = run(True)
  err_plain, _ = run(False)
  np.testing.assert_allclose(err_ef, state.residuals[0], atol=2e-4)
  assert float(jnp.linalg.norm(err_ef)) < 2 * float(jnp.max(jnp.linalg.norm(grads, axis=(1, 2))))
  assert float(jnp.linalg.norm(err_plain)) > 5 * float(jnp.linalg.norm(err_ef))


def test_small_leaves_are_sent_whole_and_bits_count_the_factors():
  params = {"kernel": jnp.zeros((100, 40)), "bias": jnp.zeros((40,)), "small": jnp.zeros((4, 4)),
            "conv": jax.ShapeDtypeStruct((3, 3, 8, 16), jnp.float32)}
  comp = compression.powersgd(2)
  assert [compression.compressed_rank(jnp.shape(p), 2) for p in jax.tree.leaves(params)] == [0, 2, 2, 0]  # sorted keys
  bits = compression.bits_per_step(params, comp)
  assert bits.compressed == 32 * (16 + 2 * (72 + 16) + 2 * (100 + 40) + 40) == 16384
  assert bits.uncompressed == 32 * (4000 + 40 + 1152 + 16)
  grads = {"kernel": jnp.ones((100, 40)), "bias": jnp.arange(40.0), "small": jnp.eye(4),
           "conv": jnp.ones((3, 3, 8, 16))}
  out, state = comp.update(grads, comp.init(grads))
  np.testing.assert_array_equal(out["bias"], grads["bias"])
  np.testing.assert_array_equal(out["small"], grads["small"])
  assert [q.shape for q in state.queries] == [(16, 2), (40, 2)]


def _numpy_powersgd(per_device_grads, queries, steps):
  """Algorithm 1 + 2 of the paper written out for W explicit workers in float64 numpy.

  per_device_grads: [steps][W] lists of dicts of numpy matrices (the compressed leaves only)."""
  names = sorted(per_device_grads[0][0])
  memories = [{n: np.zeros_like(per_device_grads[0][0][n]) for n in names} for _ in per_device_grads[0]]
  queries = {n: np.asarray(q, np.float64) for n, q in zip(names, queries)}
  outputs = []
  for t in range(steps):
    ms = [{n: g[n] + e[n] for n in names} for g, e in zip(per_device_grads[t], memories)]
    out = {}
    for n in names:
      p = np.mean([m[n] @ queries[n] for m in ms], axis=0)
      p_hat = np.linalg.qr(p)[0]
      queries[n] = np.mean([m[n].T @ p_hat for m in ms], axis=0)
      out[n] = p_hat @ queries[n].T
    memories = [{n: m[n] - out[n] for n in names} for m in ms]
    outputs.append(out)
  return outputs, memories


def test_sharded_powersgd_on_8_devices_equals_a_numpy_reference_of_the_algorithm():
  mesh = jax.make_mesh((NUM_DEVICES,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  steps = 3
  key = jax.random.key(7)
  shapes = {"a": (12, 6), "b": (2, 2, 3, 10), "bias": (10,)}
  grads = [{n: np.asarray(jax.random.normal(jax.random.fold_in(key, 10 * t + i), (NUM_DEVICES, *s)))
            for i, (n, s) in enumerate(shapes.items())} for t in range(steps)]
  comp = compression.powersgd(2, seed=3, axis_name="data")
  state = comp.init({n: jnp.zeros(s) for n, s in shapes.items()})
  initial_queries = [np.asarray(q) for q in state.queries]
  per_device = NamedSharding(mesh, P("data"))
  state = jax.device_put(jax.tree.map(lambda x: jnp.broadcast_to(x, (NUM_DEVICES, *x.shape)), state), per_device)

  def local(g, s):
    mean, s = compression.compressed_pmean(jax.tree.map(lambda x: x[0], g), jax.tree.map(lambda x: x[0], s),
                                           comp, "data")
    return mean, jax.tree.map(lambda x: x[None], s)

  step = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("data"), P("data")), out_specs=(P(), P("data"))))
  outputs = []
  for g in grads:
    out, state = step(jax.device_put(g, per_device), state)
    outputs.append(out)

  as_matrix = lambda x: np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  reference_grads = [[{"a": as_matrix(g["a"][w]), "b": as_matrix(g["b"][w])} for w in range(NUM_DEVICES)]
                     for g in grads]
  expected, memories = _numpy_powersgd(reference_grads, initial_queries, steps)
  for out, exp, g in zip(outputs, expected, grads):
    np.testing.assert_allclose(as_matrix(out["a"]), exp["a"], atol=2e-5)
    np.testing.assert_allclose(as_matrix(out["b"]), exp["b"], atol=2e-5)
    np.testing.assert_allclose(out["bias"], g["bias"].mean(0), atol=1e-6)  # sent whole
  residuals = [np.asarray(r) for r in state.residuals]
  for w in range(NUM_DEVICES):
    np.testing.assert_allclose(residuals[0][w], memories[w]["a"], atol=2e-5)
    np.testing.assert_allclose(residuals[1][w], memories[w]["b"], atol=2e-5)
  # Q is all-reduced, hence the same on every device.
  for q in map(np.asarray, state.queries):
    np.testing.assert_array_equal(q, np.broadcast_to(q[0], q.shape))


def test_config_selects_powersgd_with_its_rank():
  config = helpers.tiny_classifier_config(**{"compression.name": "powersgd", "compression.rank": 4})
  comp = build_compressor(config)
  assert comp.aggregates and comp.axis_name == ("data", "fsdp")
  assert compression.bits_per_step({"w": jnp.zeros((64, 32))}, comp).compressed == 32 * 4 * 96


def test_validation_errors():
  with pytest.raises(ValueError, match="rank"):
    compression.powersgd(0)
  with pytest.raises(TypeError, match="rank"):
    compression.powersgd(2.0)
  with pytest.raises(TypeError, match="error_feedback"):
    compression.powersgd(2, error_feedback=1)
  comp = compression.powersgd(2)
  g = {"w": jnp.ones((8, 8))}
  with pytest.raises(TypeError, match="PowerSGDState"):
    comp.update(g, optax.EmptyState())
  with pytest.raises(ValueError, match="initialize the state"):
    comp.update({"w": jnp.ones((8, 8)), "v": jnp.ones((8, 8))}, comp.init(g))
  with pytest.raises(ValueError, match="all-reduces its factors"):
    compression.compressed_pmean(g, comp.init(g), comp, "data")
  sharded = compression.powersgd(2, axis_name="data")
  with pytest.raises(ValueError, match="not bound"):
    sharded.update(g, sharded.init(g))
