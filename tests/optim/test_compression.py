"""Tests of lbjax.optim.compression against the statements of papers/004."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from lbjax.optim import compression

NUM_DRAWS = 4000


def _qsgd_draws(v: jax.Array, num_levels: int, num_draws: int = NUM_DRAWS) -> np.ndarray:
  """`num_draws` independent QSGD quantizations of `v` (one per seed), stacked."""
  comp = compression.qsgd(num_levels)
  keys = jax.vmap(lambda k: jax.random.key_data(jax.random.key(k)))(jnp.arange(num_draws))
  draw = jax.jit(jax.vmap(lambda key: comp.update(v, compression.QSGDState(key))[0]))
  return np.asarray(draw(keys))


def _qsgd_exact_moments(v: np.ndarray, s: int) -> tuple[np.ndarray, float, float]:
  """Per-entry variance, E||Q||^2 and E||Q||_0 of QSGD, from the law of xi (papers/004)."""
  norm = np.linalg.norm(v)
  r = s * np.abs(v) / norm
  low = np.floor(r)
  p = r - low
  var = (norm / s) ** 2 * p * (1 - p)
  second = float(np.sum((norm / s) ** 2 * (low**2 * (1 - p) + (low + 1) ** 2 * p)))
  nnz = float(np.sum(np.where(low > 0, 1.0, p)))
  return var, second, nnz


@pytest.mark.parametrize("num_levels", [1, 4])
def test_qsgd_is_unbiased_within_its_variance(num_levels):
  v = jax.random.normal(jax.random.key(0), (24,)) * jnp.linspace(0.1, 3.0, 24)
  draws = _qsgd_draws(v, num_levels)
  var, _, _ = _qsgd_exact_moments(np.asarray(v), num_levels)
  # Mean of NUM_DRAWS draws: standard error sqrt(var/NUM_DRAWS) per entry; allow 5 of them.
  tol = 5 * np.sqrt(var / NUM_DRAWS) + 1e-5
  np.testing.assert_array_less(np.abs(draws.mean(0) - np.asarray(v)), tol)
  # The empirical per-entry variance matches the Bernoulli law of xi.
  np.testing.assert_allclose(draws.var(0), var, rtol=0.2, atol=1e-6)


@pytest.mark.parametrize("power", [-70, 70])
def test_qsgd_commutes_with_scaling_by_a_power_of_two_even_where_squares_leave_float32(power):
  """Q(2^k v) = 2^k Q(v) for the same draw: at 2^-70 (~1e-21) the squares of ||v|| flushed to zero and the
  leaf was sent as zeros; at 2^70 (~1e21) they overflowed and it was sent as nan."""
  v = jax.random.normal(jax.random.key(0), (24,))
  scale = 2.0**power
  np.testing.assert_array_equal(_qsgd_draws(v * scale, 4, num_draws=50), _qsgd_draws(v, 4, num_draws=50) * scale)


@pytest.mark.parametrize("num_levels", [1, 2, 8])
def test_qsgd_second_moment_bound(num_levels):
  n = 64
  v = jax.random.normal(jax.random.key(1), (n,))
  draws = _qsgd_draws(v, num_levels)
  v_sq = float(jnp.sum(v**2))
  bound = (1 + min(n / num_levels**2, math.sqrt(n) / num_levels)) * v_sq
  _, exact_second, _ = _qsgd_exact_moments(np.asarray(v), num_levels)
  empirical = float(np.mean(np.sum(draws**2, axis=1)))
  assert exact_second <= bound
  np.testing.assert_allclose(empirical, exact_second, rtol=0.03)
  assert empirical <= bound


def test_qsgd_expected_nonzeros_bound():
  n, s = 100, 2
  v = jnp.ones((n,))  # uniform vector: every entry is non-zero w.p. s/sqrt(n), E nnz = s sqrt(n)
  nnz = np.count_nonzero(_qsgd_draws(v, s), axis=1)
  assert abs(nnz.mean() - s * math.sqrt(n)) < 5 * nnz.std() / math.sqrt(NUM_DRAWS)
  assert nnz.mean() <= s * (s + math.sqrt(n))
  # The lecture's s^2 + sqrt(n) form is exceeded for s > 1; the bound is s(s + sqrt(n)).
  assert nnz.mean() > s * s + math.sqrt(n)
  # s = 1: E nnz = ||v||_1/||v||_2 <= sqrt(n) (papers/004, Property 3).
  w = jax.random.normal(jax.random.key(2), (n,))
  nnz1 = np.count_nonzero(_qsgd_draws(w, 1), axis=1)
  expected = float(jnp.sum(jnp.abs(w)) / jnp.linalg.norm(w))
  assert abs(nnz1.mean() - expected) < 5 * nnz1.std() / math.sqrt(NUM_DRAWS)
  assert expected <= math.sqrt(n)


def test_qsgd_state_key_is_deterministic_and_advances():
  comp = compression.qsgd(2, seed=3)
  g = {"w": jnp.arange(1.0, 7.0)}
  state = comp.init(g)
  out1, state1 = comp.update(g, state)
  out1_again, _ = comp.update(g, comp.init(g))
  out2, _ = comp.update(g, state1)
  np.testing.assert_array_equal(out1["w"], out1_again["w"])
  assert not np.array_equal(state.key, state1.key)
  assert not np.array_equal(out1["w"], out2["w"])
  zero, _ = comp.update({"w": jnp.zeros(5)}, state)
  np.testing.assert_array_equal(zero["w"], np.zeros(5))


def test_one_bit_matches_lecture_example_and_preserves_group_sums():
  g = jnp.array([0.1, 0.15, -0.2, 20.0, 15.3, -1.222])
  q, _ = compression.one_bit().update({"g": g}, optax.EmptyState())
  expected = np.array([8.8875, 8.8875, -0.711, 8.8875, 8.8875, -0.711])
  np.testing.assert_allclose(q["g"], expected, rtol=1e-6)
  v = jax.random.normal(jax.random.key(0), (7, 5))
  qv, _ = compression.one_bit().update(v, optax.EmptyState())
  pos = v >= 0
  for part in (lambda x: jnp.where(pos, x, 0), lambda x: jnp.where(pos, 0, x)):
    np.testing.assert_allclose(jnp.sum(part(qv)), jnp.sum(part(v)), rtol=1e-5)
  all_neg, _ = compression.one_bit().update(-jnp.arange(1.0, 4.0), optax.EmptyState())
  np.testing.assert_allclose(all_neg, [-2.0, -2.0, -2.0])


def test_one_bit_error_feedback_tracks_cumulative_gradient():
  steps, n = 200, 16
  # A persistent small drift hidden under larger alternating entries: plain 1-bit loses it.
  drift = jnp.linspace(-0.05, 0.05, n)
  noise = jax.random.normal(jax.random.key(0), (steps, n))
  grads = drift + noise

  def cumulative_error(error_feedback):
    comp = compression.one_bit(error_feedback=error_feedback)

    def step(state, g):
      q, state = comp.update(g, state)
      return state, q

    state, sent = jax.lax.scan(step, comp.init(grads[0]), grads)
    return jnp.sum(grads, 0) - jnp.sum(sent, 0), state

  err_ef, state = cumulative_error(True)
  err_plain, _ = cumulative_error(False)
  np.testing.assert_allclose(err_ef, state.residual, atol=1e-4)
  max_grad_norm = float(jnp.max(jnp.linalg.norm(grads, axis=1)))
  assert float(jnp.linalg.norm(err_ef)) < max_grad_norm
  assert float(jnp.linalg.norm(err_plain)) > 3 * float(jnp.linalg.norm(err_ef))


def _data_mesh() -> jax.sharding.Mesh:
  return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))


def _shard_map_over_devices(fn, mesh):
  """jit(shard_map(fn)) with the first argument split over 'data' and the state replicated."""
  mapped = jax.jit(
      jax.shard_map(fn, mesh=mesh, in_specs=(P("data"), P()), out_specs=(P("data"), P())))

  def call(x, state):
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("data")))
    state = jax.device_put(state, jax.sharding.NamedSharding(mesh, P()))
    return mapped(x, state)

  return call


@pytest.mark.parametrize("name, options", [("one_bit", {}), ("qsgd", {"num_levels": 4}), ("powersgd", {"rank": 1})])
def test_a_leaf_without_entries_passes_through_every_compressor(name, options):
  """`jnp.max` of qsgd's empty leaf raised "zero-size array to reduction operation max"."""
  comp = getattr(compression, name)(**options)
  grads = {"empty": jnp.zeros((0, 3)), "w": jnp.ones((4, 3))}
  sent, _ = comp.update(grads, comp.init(grads))
  assert sent["empty"].shape == (0, 3) and bool(jnp.all(jnp.isfinite(sent["w"])))


def test_one_bit_keeps_its_residual_in_float32_under_scan():
  """bfloat16 parameters, float32 gradients: the residual, made in bfloat16, became float32 after a step, and a
  scan's carry refused the state ("the input carry ... has type bfloat16[4] but the corresponding output carry
  ... float32[4]"). It is float32 from the start, as PowerSGD's: error feedback accumulates remainders below a
  bfloat16 step."""
  comp = compression.one_bit(error_feedback=True)
  state = comp.init({"w": jnp.zeros((4,), jnp.bfloat16)})
  grads = jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)

  def step(state, g):
    sent, state = comp.update({"w": g}, state)
    return state, sent["w"]

  state, _ = jax.lax.scan(step, state, grads)
  assert state.residual["w"].dtype == jnp.float32


def test_one_bit_error_feedback_keeps_the_rounding_of_bfloat16_gradients_in_the_residual():
  """What is sent has the gradients' dtype: the residual must be what was not sent, rounding to bfloat16
  included, or sum_t sent_t = sum_t g_t - r_T fails (0.03-0.48 per entry after 1000 steps when the residual
  was measured against the float32 decode)."""
  comp = compression.one_bit(error_feedback=True)
  grads = (jax.random.normal(jax.random.key(1), (300, 6)) * 3.0).astype(jnp.bfloat16)

  def step(state, g):
    sent, state = comp.update(g, state)
    return state, sent

  state, sent = jax.lax.scan(step, comp.init(grads[0]), grads)
  assert sent.dtype == jnp.bfloat16
  total = lambda x: jnp.sum(x.astype(jnp.float32), 0)
  np.testing.assert_allclose(total(sent), total(grads) - state.residual, atol=2e-3)


def test_compressed_pmean_uncompressed_equals_pmean_over_8_devices():
  mesh = _data_mesh()
  grads = jax.random.normal(jax.random.key(0), (8, 3))
  comp = compression.no_compression()

  def fn(g, state):
    mean, state = compression.compressed_pmean(g, state, comp, "data")
    return mean - jax.lax.pmean(g, "data"), state

  diff, _ = _shard_map_over_devices(fn, mesh)(grads, optax.EmptyState())
  np.testing.assert_array_equal(diff, np.zeros((8, 3)))


def test_compressed_pmean_qsgd_devices_draw_different_randomness():
  mesh = _data_mesh()
  comp = compression.qsgd(1, seed=0, axis_name="data")
  local = jnp.tile(jnp.linspace(-1.0, 1.0, 16), (8, 1))  # same gradient on every device

  def fn(g, state):
    decoded, _ = comp.update(g[0], state)
    mean, state = compression.compressed_pmean(g, state, comp, "data")
    return decoded[None], state

  decoded, new_state = _shard_map_over_devices(fn, mesh)(local, comp.init(local[0]))
  assert len({tuple(row) for row in np.asarray(decoded).tolist()}) > 1
  single = compression.qsgd(1, seed=0)
  _, expected_state = single.update(local[0], single.init(local[0]))
  np.testing.assert_array_equal(new_state.key, expected_state.key)


def test_compressed_pmean_one_bit_is_mean_of_local_decodes():
  mesh = _data_mesh()
  grads = jax.random.normal(jax.random.key(4), (8, 6))
  comp = compression.one_bit()

  def fn(g, state):
    mean, state = compression.compressed_pmean(g[0], state, comp, "data")
    return mean[None], state

  mean, _ = _shard_map_over_devices(fn, mesh)(grads, optax.EmptyState())
  local = jnp.stack([comp.update(g, optax.EmptyState())[0] for g in grads])
  np.testing.assert_allclose(np.asarray(mean), np.tile(local.mean(0), (8, 1)), rtol=1e-5, atol=1e-6)


def test_compressed_pmean_error_feedback_keeps_a_residual_per_device():
  mesh = _data_mesh()
  steps = jax.random.normal(jax.random.key(5), (3, 8, 6))
  comp = compression.one_bit(error_feedback=True)
  mapped = jax.jit(jax.shard_map(
      lambda g, state: compression.compressed_pmean(g, state, comp, "data"), mesh=mesh,
      in_specs=(P("data"), P("data")), out_specs=(P(), P("data"))))
  sharding = jax.sharding.NamedSharding(mesh, P("data"))
  state = jax.device_put(comp.init(steps[0]), sharding)
  sent = 0.0
  for g in steps:
    mean, state = mapped(jax.device_put(g, sharding), state)
    sent = sent + np.asarray(mean)
  # Per device: sum of sent = sum of true - residual, so the device means satisfy the same.
  true_sum = np.asarray(steps.sum(0))
  residual = np.asarray(state.residual)
  assert np.abs(residual).max() > 0.01
  np.testing.assert_allclose(sent[0], (true_sum - residual).mean(0), atol=1e-5)


def test_bits_per_step_on_small_tree():
  params = {"w": jnp.zeros((10, 10)), "b": jax.ShapeDtypeStruct((10,), jnp.float32)}
  assert compression.bits_per_step(params, compression.no_compression()) == (3520.0, 3520, 1.0)
  one_bit = compression.bits_per_step(params, compression.one_bit())
  assert one_bit.compressed == (100 + 64) + (10 + 64)
  assert one_bit.ratio == pytest.approx(3520 / 238)
  # Dense QSGD: float norm + (sign + ceil(log2(s+1)) level bits) per entry.
  assert compression.bits_per_step(params, compression.qsgd(1)).compressed == (32 + 200) + (32 + 20)
  assert compression.bits_per_step(params, compression.qsgd(4)).compressed == (32 + 400) + (32 + 40)
  # Elias-coded QSGD: the bound of Theorem 3.2 with s(s + sqrt n) non-zeros, and a bit saying which code was sent.
  elias = compression.bits_per_step({"w": jnp.zeros((100,))}, compression.qsgd(1, encoding="elias"))
  assert elias.compressed == pytest.approx(1 + 11 * (1.5 * math.log2(2 * 101 / 11) + 3) + 32)


@pytest.mark.parametrize("num_levels, n", [(16, 10), (64, 10), (64, 128), (1, 0)])
def test_elias_coded_qsgd_never_counts_more_than_the_dense_code_and_its_flag(num_levels, n):
  """Small leaves (biases) or many levels: s(s + sqrt n) exceeds the n entries, and the bound on s(s + sqrt n)
  non-zeros many times the dense code (s=64, n=10: 18,949 bits against 112, 59x the float32 leaf). No leaf
  has more than n non-zeros, and an encoder sends the shorter code with a bit saying which."""
  dense = compression.qsgd_dense_bits(n, num_levels)
  assert compression.qsgd_elias_bits(n, num_levels) <= (
      1.5 * math.log2(2 * (num_levels**2 + n) / n) * n + 3 * n + 32 if n else 32)
  elias = compression.bits_per_step({"b": jax.ShapeDtypeStruct((n,), jnp.float32)},
                                    compression.qsgd(num_levels, encoding="elias"))
  assert elias.compressed <= dense + 1


def test_compressors_chain_with_optax():
  opt = optax.chain(compression.one_bit(error_feedback=True), optax.sgd(0.5))
  params = {"w": jnp.array([1.0, -2.0, 3.0])}
  updates, _ = opt.update({"w": jnp.array([1.0, 3.0, -2.0])}, opt.init(params), params)
  np.testing.assert_allclose(updates["w"], [-1.0, -1.0, 1.0])


def test_validation_errors():
  with pytest.raises(ValueError, match="num_levels"):
    compression.qsgd(0)
  with pytest.raises(TypeError, match="num_levels"):
    compression.qsgd(2.5)
  with pytest.raises(TypeError, match="num_levels"):
    compression.qsgd(True)
  with pytest.raises(ValueError, match="encoding"):
    compression.qsgd(2, encoding="huffman")
  with pytest.raises(TypeError, match="axis_name"):
    compression.qsgd(2, axis_name=0)
  for make in (lambda seed: compression.qsgd(2, seed=seed), lambda seed: compression.powersgd(1, seed=seed)):
    with pytest.raises(ValueError, match="64-bit"):  # an OverflowError from jax.random.key at the first init
      make(2**64)
    with pytest.raises(TypeError, match="seed must be an int"):
      make(1.5)
  g = jnp.ones(4)
  with pytest.raises(ValueError, match="not bound"):
    compression.compressed_pmean(g, optax.EmptyState(), compression.no_compression(), "data")
  comp = compression.qsgd(2)
  with pytest.raises(ValueError, match="share randomness"):
    compression.compressed_pmean(g, comp.init(g), comp, "data")
  with pytest.raises(ValueError, match="not bound"):
    sharded = compression.qsgd(2, axis_name="data")
    sharded.update(g, sharded.init(g))
  with pytest.raises(TypeError, match="GradientCompressor"):
    compression.compressed_pmean(g, (), optax.sgd(1.0), "data")
