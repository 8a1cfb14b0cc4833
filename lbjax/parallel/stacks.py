"""Stacks of identical layers as pure functions, for `lbjax.parallel.pipeline`.

Parameters are pytrees whose leaves stack the L layers on their first axis, the layout
`pipeline` splits into stages (and `sequential` scans over).

* `lstm_layer`: one BasicLSTMCell layer (`lbjax.models.lstm_cell.lstm_unroll`, papers/001 §5.1) run over a
  sequence [N, T, H] -> [N, T, H] from a zero carry, the layer the PTB LSTM stacks (2 x 200 there).
* `mlp_block`: a residual block h + tanh(h W + b), [N, D] -> [N, D].
"""

import jax
import jax.numpy as jnp

from lbjax.models import validation
from lbjax.models.lstm_cell import lstm_unroll

FORGET_BIAS = 1.0


def init_lstm_stack(key: jax.Array, num_layers: int, hidden_size: int) -> dict[str, jax.Array]:
  """L LSTM layers of width H: kernel [L, 2H, 4H] Glorot-uniform, bias [L, 4H] zeros (as `LSTMCell`).
  `ValueError` unless L and H are positive ints."""
  validation.check_positive_int("num_layers", num_layers)
  validation.check_positive_int("hidden_size", hidden_size)
  shape = (2 * hidden_size, 4 * hidden_size)
  kernels = jnp.stack([jax.nn.initializers.glorot_uniform()(k, shape, jnp.float32)
                       for k in jax.random.split(key, num_layers)])
  return {"kernel": kernels, "bias": jnp.zeros((num_layers, 4 * hidden_size), jnp.float32)}


def lstm_layer(params: dict[str, jax.Array], inputs: jax.Array) -> jax.Array:
  """One LSTM layer over time: inputs [N, T, H] -> hidden states [N, T, H], from a zero carry."""
  zeros = jnp.zeros_like(inputs[:, 0])  # [N, H]; like the inputs, so it has their sharding type in shard_map
  _, outputs = lstm_unroll(params["kernel"], params["bias"], (zeros, zeros), inputs, FORGET_BIAS)
  return outputs


def init_mlp_stack(key: jax.Array, num_layers: int, width: int) -> dict[str, jax.Array]:
  """L residual blocks of width D: kernel [L, D, D] LeCun-normal per layer (variance 1/D: the layer axis is a
  batch axis of the initializer, not fan-in), bias [L, D] zeros. `ValueError` unless L and D are positive ints."""
  validation.check_positive_int("num_layers", num_layers)
  validation.check_positive_int("width", width)
  kernel = jax.nn.initializers.lecun_normal(batch_axis=(0,))(key, (num_layers, width, width), jnp.float32)
  return {"kernel": kernel, "bias": jnp.zeros((num_layers, width), jnp.float32)}


def mlp_block(params: dict[str, jax.Array], inputs: jax.Array) -> jax.Array:
  """h + tanh(h W + b): inputs [N, D] -> [N, D]."""
  return inputs + jnp.tanh(inputs @ params["kernel"] + params["bias"])
