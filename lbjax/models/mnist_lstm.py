"""The pure-LSTM MNIST classifier of papers/001 §5.1.1.

Each 28x28 image is read as 28 time steps of 28 pixels. A linear transform maps each step to 128
features, a 128-unit BasicLSTMCell (cell kernel 256x512) runs over the 28 steps, and a dense layer
maps the last output h_28 to 10 logits:

  z_t = x_t @ W_in + b_in,   (c_t, h_t) = LSTM((c_{t-1}, h_{t-1}), z_t),   logits = h_T @ W_out + b_out

with (c_0, h_0) = 0. Parameters: 28*128 + 128 + 256*512 + 512 + 128*10 + 10 = 136,586.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from lbjax.models import validation
from lbjax.models.lstm_cell import LSTMCell


class MnistLSTM(nnx.Module):
  """Input transform -> LSTM over rows -> classifier on the last output (papers/001 §5.1.1)."""

  def __init__(self, num_classes: int = 10, input_size: int = 28, transform_size: int = 128,
               hidden_size: int = 128, *, rngs: nnx.Rngs):
    """Builds the model.

    Args:
      num_classes: number of output classes.
      input_size: pixels per time step (image width).
      transform_size: output size of the per-step linear transform (LSTM input size).
      hidden_size: LSTM units.
      rngs: `nnx.Rngs` for parameter initialisation.

    Raises:
      ValueError: on `rngs` that is not an `nnx.Rngs` or non-positive sizes.
    """
    validation.check_rngs(rngs)
    validation.check_positive_int("num_classes", num_classes)
    validation.check_positive_int("input_size", input_size)
    validation.check_positive_int("transform_size", transform_size)
    validation.check_positive_int("hidden_size", hidden_size)
    self.input_size = input_size
    self.transform = nnx.Linear(input_size, transform_size, rngs=rngs)
    self.cell = LSTMCell(transform_size, hidden_size, forget_bias=1.0, rngs=rngs)
    self.classifier = nnx.Linear(hidden_size, num_classes, rngs=rngs)

  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    """Maps images [N, T, input_size] or [N, T, input_size, 1] (float) to logits [N, C] float32.

    `train` is accepted for a uniform model interface; the model has no dropout or BatchNorm, so
    training and evaluation compute the same function.

    Raises:
      ValueError: on a wrong rank, width or dtype.
    """
    del train  # Same function in training and evaluation.
    expected = f"[N, T, {self.input_size}] or [N, T, {self.input_size}, 1]"
    given_shape = getattr(images, "shape", None)
    shape = given_shape
    if shape is not None and len(shape) == 4 and shape[-1] == 1:
      images = images[..., 0]
      shape = images.shape
    if shape is None or len(shape) != 3 or shape[-1] != self.input_size or shape[1] == 0:
      raise ValueError(f"MnistLSTM expects images of shape {expected}, got shape {given_shape}.")
    validation.check_floating_array("images", images, expected)
    x = self.transform(images.astype(jnp.float32))
    _, outputs = self.cell.unroll(self.cell.initial_carry(shape[0]), x)
    return self.classifier(outputs[:, -1]).astype(jnp.float32)
