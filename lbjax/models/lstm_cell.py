"""The LSTM cell of papers/001 §5.1: TensorFlow's BasicLSTMCell with one fused kernel.

For input x_t [N, D] and carry (c_{t-1}, h_{t-1}) [N, H] each:

  [i, j, f, o] = split([x_t, h_{t-1}] @ W + b, 4)          W: [D+H, 4H], b: [4H]
  c_t = c_{t-1} * sigmoid(f + forget_bias) + sigmoid(i) * tanh(j)
  h_t = tanh(c_t) * sigmoid(o)

So the MNIST model's cell kernel (D = H = 128) is the 256x512 matrix of §5.1.1 and each PTB layer's
(D = H = 200) the 400x800 matrix of §5.1.2.

Over time (`lstm_unroll`) the backward pass keeps, of each step, only the gate pre-activations
[i, j, f, o] (named `GATES`) besides the carries the scan keeps, and recomputes the gates' sigmoids and
tanhs from them (`jax.checkpoint` with `save_only_these_names`): the same numbers bit for bit, a
third less activation memory for the MNIST LSTM, and, compiled for an H100, 637 kernels per MNIST
training step at B=128 instead of 870 (the forward loop's body wrote 12 saved arrays per time step, one
kernel each) and 882 instead of 1,201 for the PTB LSTM (benchmarks/README.md, Findings 11).
"""

import jax
from jax.ad_checkpoint import checkpoint_name
import jax.numpy as jnp
from flax import nnx

from lbjax.models import validation

LSTMCarry = tuple[jax.Array, jax.Array]
GATES = "lstm_gates"  # the name of the gate pre-activations, the residual `lstm_unroll` keeps per time step


def lstm_step(kernel: jax.Array, bias: jax.Array, carry: LSTMCarry, x: jax.Array,
              forget_bias: float) -> tuple[LSTMCarry, jax.Array]:
  """One BasicLSTMCell step (formula in the module docstring); returns ((c_t, h_t), h_t)."""
  c, h = carry
  gates = checkpoint_name(jnp.concatenate([x, h], axis=-1) @ kernel + bias, GATES)
  i, j, f, o = jnp.split(gates, 4, axis=-1)
  new_c = c * jax.nn.sigmoid(f + forget_bias) + jax.nn.sigmoid(i) * jnp.tanh(j)
  new_h = jnp.tanh(new_c) * jax.nn.sigmoid(o)
  return (new_c, new_h), new_h


def lstm_unroll(kernel: jax.Array, bias: jax.Array, carry: LSTMCarry, inputs: jax.Array,
                forget_bias: float) -> tuple[LSTMCarry, jax.Array]:
  """`lstm_step` over time with `jax.lax.scan`: inputs [N, T, D] -> (carry_T, outputs [N, T, H]); its
  gradient keeps only each step's `GATES` (module docstring)."""
  step = jax.checkpoint(lambda carry, x: lstm_step(kernel, bias, carry, x, forget_bias), prevent_cse=False,
                        policy=jax.checkpoint_policies.save_only_these_names(GATES))
  carry, outputs = jax.lax.scan(step, carry, jnp.swapaxes(inputs, 0, 1))
  return carry, jnp.swapaxes(outputs, 0, 1)


class LSTMCell(nnx.Module):
  """BasicLSTMCell with a fused [input_size + hidden_size, 4*hidden_size] kernel (gates i, j, f, o).

  Attributes:
    kernel: `nnx.Param` [input_size + hidden_size, 4 * hidden_size], Glorot-uniform (TensorFlow's
      default for this cell).
    bias: `nnx.Param` [4 * hidden_size], zeros; `forget_bias` is added to f on top of it.
  """

  def __init__(self, input_size: int, hidden_size: int, *, forget_bias: float = 1.0,
               kernel_init: jax.nn.initializers.Initializer = jax.nn.initializers.glorot_uniform(),
               rngs: nnx.Rngs):
    """Creates the cell.

    Args:
      input_size: size D of x_t.
      hidden_size: size H of c_t and h_t.
      forget_bias: constant added to the forget-gate pre-activation (1.0 in BasicLSTMCell).
      kernel_init: initializer of the [D + H, 4H] kernel (the bias starts at zero).
      rngs: `nnx.Rngs` for the kernel initialisation.

    Raises:
      ValueError: on `rngs` that is not an `nnx.Rngs`, non-positive sizes or a forget_bias that is not a finite
        number.
    """
    validation.check_rngs(rngs)
    validation.check_positive_int("input_size", input_size)
    validation.check_positive_int("hidden_size", hidden_size)
    self.input_size = input_size
    self.hidden_size = hidden_size
    self.forget_bias = validation.check_finite_number("forget_bias", forget_bias)
    self.kernel = nnx.Param(kernel_init(rngs.params(), (input_size + hidden_size, 4 * hidden_size), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((4 * hidden_size,), jnp.float32))

  def initial_carry(self, batch_size: int) -> LSTMCarry:
    """Zero (c, h), each [batch_size, hidden_size] float32."""
    validation.check_positive_int("batch_size", batch_size)
    zeros = jnp.zeros((batch_size, self.hidden_size), jnp.float32)
    return zeros, zeros

  def _check(self, carry: LSTMCarry, inputs: jax.Array, expected: str) -> None:
    if inputs.shape[-1] != self.input_size:
      raise ValueError(f"LSTMCell expects inputs of shape {expected}, got shape {inputs.shape}.")
    expected_carry = (inputs.shape[0], self.hidden_size)
    if (not isinstance(carry, tuple) or len(carry) != 2
        or any(getattr(a, "shape", None) != expected_carry for a in carry)):
      shapes = jax.tree.map(jnp.shape, carry)
      raise ValueError(
          f"LSTMCell expects a carry (c, h) of two arrays of shape {list(expected_carry)}, "
          f"got {shapes}; build it with `initial_carry(batch_size)`.")

  def __call__(self, carry: LSTMCarry, x: jax.Array) -> tuple[LSTMCarry, jax.Array]:
    """One step: x [N, input_size] -> ((c_t, h_t), h_t)."""
    if getattr(x, "ndim", None) != 2:
      raise ValueError(f"LSTMCell expects x of shape [N, {self.input_size}], got shape "
                       f"{getattr(x, 'shape', None)}.")
    self._check(carry, x, f"[N, {self.input_size}]")
    return lstm_step(self.kernel[...], self.bias[...], carry, x, self.forget_bias)

  def unroll(self, carry: LSTMCarry, inputs: jax.Array) -> tuple[LSTMCarry, jax.Array]:
    """Runs the cell over time with `jax.lax.scan`: inputs [N, T, input_size] -> (carry_T, [N, T, H])."""
    if getattr(inputs, "ndim", None) != 3:
      raise ValueError(f"LSTMCell.unroll expects inputs of shape [N, T, {self.input_size}], "
                       f"got shape {getattr(inputs, 'shape', None)}.")
    self._check(carry, inputs, f"[N, T, {self.input_size}]")
    return lstm_unroll(self.kernel[...], self.bias[...], carry, inputs, self.forget_bias)
