"""Argument checks shared by the lbjax models: each raises a `ValueError` naming the fix."""

import math
import numbers
from collections.abc import Sequence

import jax.numpy as jnp
from flax import nnx


def check_positive_int(name: str, value: object) -> int:
  """Returns `value` if it is a positive int, else raises a `ValueError` naming `name`."""
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError(f"{name} must be a positive int, got {value!r}.")
  return value


def check_bool(name: str, value: object) -> bool:
  """Returns `value` if it is True or False, else raises a `ValueError` naming `name` (a string "no" is truthy)."""
  if not isinstance(value, bool):
    raise ValueError(f"{name} must be True or False, got {value!r}.")
  return value


def check_rngs(value: object) -> None:
  """Raises a `ValueError` unless `value` is an `nnx.Rngs` (a seed alone is flax's AttributeError deep inside
  the first layer)."""
  if not isinstance(value, nnx.Rngs):
    hint = f"nnx.Rngs({value!r})" if isinstance(value, int) and not isinstance(value, bool) else "nnx.Rngs(0)"
    raise ValueError(f"rngs must be an nnx.Rngs, e.g. rngs={hint}; got {value!r}.")


def is_real(value: object) -> bool:
  """Whether `value` is a real number (not a bool, a string or None)."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_finite_number(name: str, value: object) -> float:
  """Returns `value` as a float if it is a finite real number (not a bool, a string or NaN/inf)."""
  if not is_real(value) or not math.isfinite(value):
    raise ValueError(f"{name} must be a finite number, got {value!r}.")
  return float(value)


def check_batch_norm(momentum_name: str, momentum: object, epsilon_name: str, epsilon: object) -> None:
  """Raises a `ValueError` unless the BatchNorm `momentum` is a number in [0, 1) and `epsilon` one > 0."""
  if not 0.0 <= check_finite_number(momentum_name, momentum) < 1.0:
    raise ValueError(f"{momentum_name} must be in [0, 1), got {momentum!r}.")
  if not check_finite_number(epsilon_name, epsilon) > 0.0:
    raise ValueError(f"{epsilon_name} must be > 0, got {epsilon!r}.")


def check_positive_int_sequence(name: str, value: object) -> tuple[int, ...]:
  """Returns `value` as a tuple if it is a non-empty sequence of positive ints."""
  if (not isinstance(value, Sequence) or isinstance(value, str) or not value
      or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
             for v in value)):
    raise ValueError(
        f"{name} must be a non-empty sequence of positive ints, got {value!r}.")
  return tuple(value)


def check_floating_array(name: str, array: object, expected_shape: str) -> None:
  """Raises a `ValueError` unless `array` has a floating dtype."""
  dtype = getattr(array, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(
        f"{name} must be a floating-point array of shape {expected_shape}, "
        f"got dtype {dtype}; convert it with `.astype(jnp.float32)`.")


def check_float_dtype(name: str, value: object) -> None:
  """Raises a `ValueError` unless `value` is (or names) a floating-point dtype."""
  try:
    dtype = None if value is None else jnp.dtype(value)
  except TypeError:
    dtype = None
  if dtype is None:
    raise ValueError(
        f"{name} must name a floating-point dtype such as 'float32' or 'bfloat16' (or jnp.float32, "
        f"jnp.bfloat16), got {value!r}.")
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(
        f"{name} must be a floating-point dtype such as 'float32' or 'bfloat16', got {dtype.name}.")
