"""config.optimizer -> the optax transformation the trainer runs."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lbjax import optim
from lbjax.train import default_config, validate
from lbjax.train.errors import ConfigError
from lbjax.train.optimizer import build_optimizer


def _one_update(config, grads, params):
  optimizer = build_optimizer(config)
  state = optimizer.init(params)
  state.hyperparams["learning_rate"] = jnp.asarray(1.0)
  updates, state = optimizer.update(grads, state, params)
  return updates, state


def test_clip_global_norm_rescales_the_loss_gradient_before_weight_decay():
  """||g|| = 10 clipped to 5 halves g; the L2 decay term (added after clipping) is not scaled."""
  config = default_config()
  config.optimizer = {"name": "momentum", "momentum": 0.0, "weight_decay": 0.1}
  config.clip_global_norm = 5.0
  params = {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}
  grads = {"kernel": jnp.full((2, 2), 3.0), "bias": jnp.array([8.0, 0.0])}  # norm sqrt(36 + 64)
  updates, _ = _one_update(config, grads, params)
  np.testing.assert_allclose(updates["kernel"], -(1.5 + 0.1 * 1.0) * np.ones((2, 2)), rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], [-4.0, 0.0], rtol=1e-6)  # no decay on biases


def test_gradients_inside_the_clip_norm_are_untouched():
  config = default_config()
  config.optimizer = {"name": "sgd"}
  config.clip_global_norm = 5.0
  grads = {"w": jnp.array([3.0, 4.0])}  # norm 5
  updates, _ = _one_update(config, grads, {"w": jnp.zeros(2)})
  np.testing.assert_allclose(updates["w"], [-3.0, -4.0], rtol=1e-6)


def test_trust_ratios_are_found_behind_the_clip():
  config = default_config()
  config.optimizer.name = "lars"
  config.clip_global_norm = 1.0
  params = {"kernel": jnp.ones((3, 3))}
  _, state = _one_update(config, {"kernel": jnp.full((3, 3), 2.0)}, params)
  ratios = optim.trust_ratios(state)
  assert jnp.isfinite(ratios["kernel"]) and ratios["kernel"] > 0
  assert isinstance(build_optimizer(config), optax.GradientTransformation)


def test_an_optimizer_argument_the_transform_refuses_is_a_config_error_before_any_compute():
  config = default_config()
  config.optimizer.accumulator_dtype = "bfloat17"
  with pytest.raises(ConfigError, match=r"lbjax.optim.momentum refuses its arguments: accumulator_dtype must name"):
    validate(config)


@pytest.mark.parametrize("compressor, argument, message", [
    ("qsgd", {"num_levels": 0}, r"lbjax.optim.compression.qsgd refuses its arguments: qsgd: num_levels \(s\) must be "
                                r">= 1, got 0\."),
    ("powersgd", {"rank": 0}, r"lbjax.optim.compression.powersgd refuses its arguments: powersgd: rank must be >= 1"),
])
def test_a_compression_argument_the_compressor_refuses_is_a_config_error_before_any_compute(compressor, argument,
                                                                                            message):
  config = default_config()
  config.compression = {"name": compressor, **argument}
  with pytest.raises(ConfigError, match=message):
    validate(config)


def test_the_flat_layout_with_parameters_split_over_devices_is_a_config_error():
  """The flat layout concatenates the parameters: with fsdp/model/stage splitting them it would gather
  them on every device, so the run is refused before any compute, saying what to use instead."""
  config = default_config()
  config.optimizer.name = "lars"
  config.optimizer.layout = "flat"
  validate(config)  # pure data parallelism: fine
  config.mesh.fsdp = 2
  with pytest.raises(ConfigError, match=r"layout='flat'.*\(mesh\.fsdp=2\).*layout='per_leaf'"):
    validate(config)


def test_the_fused_layout_is_refused_in_the_trainer_with_what_to_use():
  """Its kernels write the momentum in place, and the step's non-finite guard needs the old state."""
  config = default_config()
  config.optimizer.name = "lars"
  config.optimizer.layout = "fused"
  with pytest.raises(ConfigError, match=r"layout='fused' updates the momentum in place.*Use layout='flat' on GPUs, "
                                        r"'per_leaf' elsewhere.*lbjax.optim.fused.apply_updates"):
    validate(config)
