"""Argument checks shared by the layer-wise optimizers.

Every check runs when an optimizer is built, before any compute. Values that are only known inside a
trace (for example hyper-parameters turned into arrays by `optax.inject_hyperparams`, which rebuilds the
transform inside `update`) cannot be inspected and are accepted as they are; they were checked when the
transform was first built from concrete values.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_literal_zero(value: Any) -> bool:
  """Whether `value` is a Python 0: a term it multiplies (weight decay, momentum) can be left out of the
  update. A traced or array value (`optax.inject_hyperparams`) always gets the term, which computes the same
  update."""
  return isinstance(value, (int, float)) and value == 0


def concrete_value(value: Any, name: str = "value", schedule: bool = False) -> float | None:
  """Returns `value` as a Python float, or None if it is a schedule (where allowed) or traced.

  Args:
    value: a hyper-parameter: Python number, NumPy or JAX scalar, a tracer or a schedule (callable).
    name: the argument's name, for the message.
    schedule: whether a schedule (a callable of the step count) is accepted (only `learning_rate`).

  Raises:
    TypeError: if `value` is neither a number nor a scalar array, nor (with `schedule`) a callable.
  """
  if callable(value):
    if schedule:
      return None
    raise TypeError(
        f"{name} must be a number, not a schedule, got {value!r}: only learning_rate is evaluated at "
        f"the step count. To schedule {name}, wrap the optimizer in optax.inject_hyperparams and give "
        f"the schedule there: optax.inject_hyperparams(optimizer)(learning_rate=..., {name}=schedule)."
    )
  if isinstance(value, jax.core.Tracer):
    return None
  expected = "a scalar number or a schedule" if schedule else "a scalar number"
  if isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be {expected}, got the bool {value!r}.")
  try:
    array = np.asarray(value)
  except TypeError as error:
    raise TypeError(f"{name} must be {expected}, got {value!r}.") from error
  if array.shape != () or not np.issubdtype(array.dtype, np.number):
    raise TypeError(f"{name} must be {expected}, got {value!r}.")
  return float(array)


def check_nonnegative(name: str, value: Any, *, schedule: bool = False) -> None:
  """Raises ValueError if the concrete `value` of hyper-parameter `name` is negative or not finite
  (TypeError if it is not a number, or a schedule where `schedule` is False)."""
  number = concrete_value(value, name, schedule)
  if number is not None and not (np.isfinite(number) and number >= 0.0):
    raise ValueError(f"{name} must be a finite number >= 0, got {number}.")


def check_positive(name: str, value: Any) -> None:
  """Raises ValueError if the concrete `value` of hyper-parameter `name` is not > 0 and finite
  (TypeError if it is not a number)."""
  number = concrete_value(value, name)
  if number is not None and not (np.isfinite(number) and number > 0.0):
    raise ValueError(f"{name} must be a finite number > 0, got {number}.")


def check_momentum(name: str, value: Any) -> None:
  """Raises ValueError unless the concrete `value` lies in [0, 1) (a decay rate; TypeError if it is
  not a number)."""
  number = concrete_value(value, name)
  if number is not None and not 0.0 <= number < 1.0:
    raise ValueError(
        f"{name} must lie in [0, 1) (it is a decay rate; 0.9 is the usual choice), got {number}."
    )


def check_bool(name: str, value: Any) -> None:
  """Raises TypeError unless `value` is a bool (a string such as "False" would count as True)."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")


def check_seed(seed: Any, where: str) -> None:
  """Raises TypeError unless `seed` is an int, ValueError unless it fits `jax.random.key` (a signed 64-bit integer,
  which a larger one overflows when the state is first made)."""
  if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
    raise TypeError(f"{where}: seed must be an int, got {seed!r}.")
  if not -2**63 <= seed < 2**63:
    raise ValueError(f"{where}: seed must fit a signed 64-bit integer (|seed| < 2**63), got {seed}.")


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
  """Raises ValueError unless `value` is one of `choices`."""
  if value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def check_axis_name(axis_name: Any, where: str) -> None:
  """Raises TypeError unless `axis_name` is None, a string, or a non-empty tuple of strings."""
  if axis_name is None or isinstance(axis_name, str):
    return
  if isinstance(axis_name, tuple) and axis_name and all(isinstance(a, str) for a in axis_name):
    return
  raise TypeError(
      f"{where}: axis_name must be None, a mesh axis name (str) or a tuple of them, got "
      f"{axis_name!r}. Pass the name used in shard_map/pmap, e.g. axis_name='data'.")


def check_axis_bound(axis_name: Any, where: str, otherwise: str | None = None) -> None:
  """Raises ValueError unless the mapped axis `axis_name` is bound where this runs (inside a
  `shard_map` over a mesh with that axis, or a `pmap`/`vmap` of that name): the collective that
  would use it fails with JAX's "unbound axis name", or inside a `shard_map` over other axes with a
  bare AssertionError. Traces nothing (`jax.lax.axis_size` is a Python int).

  Args:
    axis_name: the axis name (or tuple of names) about to be reduced over.
    where: who needs it, first in the message.
    otherwise: what to do instead when no such axis is meant to exist, last in the message.
  """
  try:
    jax.lax.axis_size(axis_name)
  except NameError as error:
    raise ValueError(
        f"{where}: axis {axis_name!r} is not bound here; call it inside jax.shard_map (mesh axis "
        f"{axis_name!r}) or jax.pmap(axis_name={axis_name!r})" + (f"; {otherwise}" if otherwise else "") + "."
    ) from error


def state_dtype(name: str, value: Any) -> np.dtype | None:
  """Returns the optimizer-state dtype `value` names (None: the parameters' dtype).

  Args:
    name: the argument's name, for the message.
    value: None, a dtype, or a dtype's name such as "bfloat16" or "float32".

  Raises:
    ValueError: if `value` names no dtype, or one that is not floating point (or complex).
  """
  if value is None:
    return None
  try:
    dtype = np.dtype(value)
  except TypeError as error:
    raise ValueError(
        f"{name} must name a floating-point dtype such as 'bfloat16' or 'float32' (or be None for the "
        f"parameters' dtype), got {value!r}."
    ) from error
  if not jnp.issubdtype(dtype, jnp.inexact):
    raise ValueError(
        f"{name} must be a floating-point dtype such as 'bfloat16' or 'float32' (or None for the "
        f"parameters' dtype), got {dtype.name}."
    )
  return dtype
