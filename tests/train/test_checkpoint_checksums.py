"""Checkpoint checksums: the numpy sums (arrays in CPU memory) equal the compiled ones (accelerators)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax.train import checkpointing


def _compiled_sums(tree, replicated):
  return {name: [int(v) for v in value]
          for name, value in jax.device_get(jax.jit(checkpointing._sums, out_shardings=replicated)(tree)).items()}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.int32, jnp.uint8, jnp.bool_])
def test_numpy_sums_equal_the_compiled_sums_on_any_sharding(dtype):
  """Several chunks (the weighted sum's offsets), wrap-around modulo 2^32, one device and eight."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  values = np.random.default_rng(0).integers(0, 2**31, size=(checkpointing._CHUNK + 40,), dtype=np.uint32)
  leaf = jax.lax.bitcast_convert_type(jnp.asarray(values), jnp.float32).astype(dtype)
  tree = {"a": leaf, "b": {"c": jnp.arange(7, dtype=jnp.int32)},
          "sharded": jax.device_put(leaf, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))}
  expected = _compiled_sums(tree, replicated)  # what checkpoints written before the numpy path recorded
  found = checkpointing.state_checksums(tree, replicated)
  assert found == expected
  assert list(found) == ["a", "b/c", "sharded"]
  assert found["a"] == found["sharded"]


def test_a_flipped_bit_changes_the_numpy_sums():
  replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",)),
                                          jax.sharding.PartitionSpec())
  values = np.linspace(-1.0, 1.0, checkpointing._CHUNK + 3, dtype=np.float32)
  flipped = values.copy()
  flipped.view(np.uint32)[-2] ^= 1 << 7
  assert (checkpointing.state_checksums({"w": jnp.asarray(values)}, replicated)
          != checkpointing.state_checksums({"w": jnp.asarray(flipped)}, replicated))
