"""Tests of the per-layer norms table (papers/000 Table 2)."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lbjax import diagnostics


def _tree():
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  params = {
      "conv1": {"bias": jnp.full((4,), 0.5), "kernel": jax.random.normal(k1, (3, 3, 2, 4))},
      "fc": {"kernel": jax.random.normal(k2, (8, 16))},
  }
  grads = jax.tree.map(lambda p: 0.01 * jax.random.normal(k3, p.shape), params)
  return params, grads


def test_rows_hold_names_shapes_and_norms():
  params, grads = _tree()
  rows = diagnostics.layer_norms(params, grads)
  assert [r.layer for r in rows] == ["conv1/bias", "conv1/kernel", "fc/kernel"]
  assert [r.shape for r in rows] == [(4,), (3, 3, 2, 4), (8, 16)]
  for row, w, g in zip(rows, jax.tree.leaves(params), jax.tree.leaves(grads)):
    w, g = np.asarray(w), np.asarray(g)
    np.testing.assert_allclose(row.weight_norm, np.linalg.norm(w), rtol=1e-5)
    np.testing.assert_allclose(row.grad_norm, np.linalg.norm(g), rtol=1e-5)
    np.testing.assert_allclose(row.ratio, np.linalg.norm(w) / np.linalg.norm(g), rtol=1e-5)
    # papers/003 Figure 3: average gradient = L1 norm / number of parameters.
    np.testing.assert_allclose(row.mean_abs_grad, np.abs(g).sum() / g.size, rtol=1e-5)


def test_table2_conv1_ratio_and_scaling():
  # papers/000 Table 2, conv1.w: ||w|| = 0.098, ||grad|| = 0.017, ratio 5.76.
  w = jnp.full((2, 2), 0.098 / 2)
  g = jnp.full((2, 2), 0.017 / 2)
  norms = diagnostics.per_layer_norms({"conv1.w": w}, {"conv1.w": g})
  assert round(float(norms.ratio["conv1.w"]), 2) == 5.76
  # The ratio is homogeneous: degree 1 in w, degree -1 in grad.
  scaled = diagnostics.per_layer_norms({"conv1.w": 3 * w}, {"conv1.w": 0.5 * g})
  np.testing.assert_allclose(scaled.ratio["conv1.w"], 6 * norms.ratio["conv1.w"], rtol=1e-6)


def test_zero_gradient_gives_infinite_ratio_not_nan():
  norms = diagnostics.per_layer_norms({"b": jnp.ones(3)}, {"b": jnp.zeros(3)})
  assert np.isinf(norms.ratio["b"])


def test_jitted_on_sharded_params_matches_unsharded():
  params, grads = _tree()
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
  spec = lambda x: P("data") if x.shape[0] % 8 == 0 else P()
  shard = lambda x: jax.device_put(x, NamedSharding(mesh, spec(x)))
  sharded = jax.jit(diagnostics.per_layer_norms)(jax.tree.map(shard, params),
                                                  jax.tree.map(shard, grads))
  local = diagnostics.per_layer_norms(params, grads)
  for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(local)):
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_format_table_and_csv(tmp_path):
  params, grads = _tree()
  rows = diagnostics.layer_norms(params, grads)
  lines = diagnostics.format_table(rows).splitlines()
  assert len(lines) == 2 + len(rows)
  assert len({len(line) for line in lines}) == 1  # aligned columns
  assert lines[0].split("|")[1].strip() == "layer"
  assert "3x3x2x4" in lines[3] and "conv1/kernel" in lines[3]
  assert f"{rows[2].ratio:.4g}" in lines[4]
  path = tmp_path / "norms.csv"
  diagnostics.write_csv(rows, path)
  with open(path) as f:
    read = list(csv.DictReader(f))
  assert [r["layer"] for r in read] == [r.layer for r in rows]
  assert float(read[1]["ratio"]) == rows[1].ratio
  assert read[2]["shape"] == "8x16"


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match="same pytree structure"):
    diagnostics.layer_norms({"a": jnp.ones(2)}, {"b": jnp.ones(2)})
  with pytest.raises(ValueError, match="'a' has shape"):
    diagnostics.per_layer_norms({"a": jnp.ones(2)}, {"a": jnp.ones(3)})
  with pytest.raises(ValueError, match="no rows"):
    diagnostics.format_table([])
