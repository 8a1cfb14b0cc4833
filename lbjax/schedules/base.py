"""What a schedule is: a function of training progress in epochs, usable on the host and in jit.

lbjax measures training progress in epochs, `epoch = examples_seen / num_train_examples` (a float),
so that a recipe stated in epochs (warm-up 0.3125 epochs, decay at epoch 30) stays right when the
batch size changes. A `Schedule` maps an epoch to a value (a learning rate, a momentum, ...):

* on the host, called with a Python or NumPy real number it returns a Python `float` computed in
  float64 with NumPy (no device dispatch, no compilation); a NumPy array of epochs gives a NumPy
  array of values. Host epochs must be finite and >= 0.
* called with a `jax.Array` (a concrete array or a tracer inside `jax.jit`) it returns a `jax.Array`
  computed with `jax.numpy` and no Python control flow on the value, in at least float32.
"""

from collections.abc import Callable
import math
import numbers
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

Epoch: TypeAlias = float | int | np.ndarray | jax.Array
"""Training progress in epochs (examples seen / training-set size)."""

Schedule: TypeAlias = Callable[[Epoch], Any]
"""A function `epoch -> value`, returning a float on the host and a `jax.Array` for array input."""

ArrayNamespace: TypeAlias = Any
"""`numpy` or `jax.numpy`, whichever matches the epoch a schedule is called with."""


def evaluate(epoch: Epoch, formula: Callable[[ArrayNamespace, Any], Any]) -> Any:
  """Evaluates `formula(xp, epoch)` with NumPy on host input and with jax.numpy on jax arrays.

  Args:
    epoch: the training progress in epochs.
    formula: the schedule body, written against the array namespace `xp` it receives (only
      `xp.where`-style selection, no Python branching on the epoch value).

  Returns:
    A Python float for a host scalar, a NumPy array for a NumPy array, a `jax.Array` otherwise.

  Raises:
    TypeError: if `epoch` is not a real number or array.
    ValueError: if a host epoch is negative or not finite.
  """
  if isinstance(epoch, jax.Array):
    dtype = jnp.promote_types(epoch.dtype, jnp.float32)
    return formula(jnp, jnp.asarray(epoch, dtype=dtype))
  if isinstance(epoch, np.ndarray):
    values = np.asarray(epoch, dtype=np.float64)
    if not np.all(np.isfinite(values)) or np.any(values < 0):
      raise ValueError(f"epochs must be finite and >= 0, got {epoch!r}.")
    return np.asarray(formula(np, values), dtype=np.float64)
  if isinstance(epoch, bool) or not isinstance(epoch, numbers.Real):
    raise TypeError(
        f"epoch must be a real number or an array, got {epoch!r} ({type(epoch).__name__})."
    )
  value = float(epoch)
  if not math.isfinite(value) or value < 0:
    raise ValueError(f"epoch must be finite and >= 0, got {epoch!r}.")
  return float(formula(np, np.float64(value)))
