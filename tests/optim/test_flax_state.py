"""`lbjax.optim.flax_state`: Flax's serializer saves and restores lbjax's optimizer states exactly."""

import subprocess
import sys

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import optim

PARAMS = {"dense": {"kernel": jnp.arange(12.0).reshape(3, 4) / 7, "bias": jnp.ones((4,))},
          "half": jnp.linspace(-1.0, 1.0, 6, dtype=jnp.bfloat16).reshape(2, 3)}


def _stepped_state(optimizer):
  state = optimizer.init(PARAMS)
  grads = jax.tree.map(lambda p: jnp.cos(p.astype(jnp.float32)).astype(p.dtype), PARAMS)
  _, state = optimizer.update(grads, state, PARAMS)
  return state


@pytest.mark.parametrize("name, layout", [("lars", "per_leaf"), ("lars", "flat"), ("lamb", "flat"),
                                          ("percent_delta", "per_leaf"), ("mclr", "per_leaf")])
def test_to_bytes_of_a_state_restores_it_exactly_into_a_fresh_one(name, layout):
  options = {"layout": layout} if layout != "per_leaf" else {}
  optimizer = getattr(optim, name)(0.1, **options)
  state = _stepped_state(optimizer)
  restored = serialization.from_bytes(optimizer.init(PARAMS), serialization.to_bytes(state))
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for saved, back in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    assert saved.dtype == back.dtype
    np.testing.assert_array_equal(np.asarray(saved, np.float32), np.asarray(back, np.float32))
  assert optim.trust_ratios(restored) is not None


def test_a_state_of_other_parameters_is_refused_naming_why():
  optimizer = optim.lars(0.1)
  saved = serialization.to_bytes(_stepped_state(optimizer))  # rates of 2 layers
  one_layer = {**PARAMS, "half": PARAMS["half"].reshape(-1)}  # a vector: no rate
  with pytest.raises(ValueError, match=r"LayerRates: the saved state holds arrays of shapes \[\(2,\)\], the target "
                                       r"\[\(1,\)\]"):
    serialization.from_bytes(optimizer.init(one_layer), saved)


def test_flax_imported_after_lbjax_optim_still_saves_a_state_made_after_it():
  code = ("import lbjax.optim, jax.numpy as jnp; from flax import serialization; "
          "state = lbjax.optim.lars(0.1).init({'w': jnp.ones((3, 4))}); print(len(serialization.to_bytes(state)))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"JAX_PLATFORMS": "cpu", "PATH": ""}, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
