"""Argument checks shared by the schedule builders.

Every builder in `lbjax.schedules` validates its arguments when it is called, before any schedule
is evaluated, and raises `ValueError` (wrong value) or `TypeError` (wrong kind of value) with a
message that names the argument, shows what was passed, and says what is expected.
"""

from collections.abc import Sequence
import math
import numbers


def check_real(name: str, value: object) -> float:
  """Returns `value` as a float; raises if it is not a finite real number (bools are refused)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__}).")
  value = float(value)
  if not math.isfinite(value):
    raise ValueError(f"{name} must be finite, got {value!r}.")
  return value


def check_positive(name: str, value: object) -> float:
  """Returns `value` as a float; raises unless it is a finite real number > 0."""
  value = check_real(name, value)
  if value <= 0:
    raise ValueError(f"{name} must be > 0, got {value!r}.")
  return value


def check_non_negative(name: str, value: object) -> float:
  """Returns `value` as a float; raises unless it is a finite real number >= 0."""
  value = check_real(name, value)
  if value < 0:
    raise ValueError(f"{name} must be >= 0, got {value!r}.")
  return value


def check_positive_int(name: str, value: object) -> int:
  """Returns `value` as an int; raises unless it is an integer >= 1 (a float such as 8.0 is not)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(
        f"{name} must be a positive integer, got {value!r} ({type(value).__name__}); "
        "pass an int such as 1024."
    )
  if value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")
  return int(value)


def check_momentum(name: str, value: object) -> float:
  """Returns `value` as a float; raises unless 0 <= value < 1 (the noise scale has 1/(1-m))."""
  value = check_real(name, value)
  if not 0.0 <= value < 1.0:
    raise ValueError(f"{name} must satisfy 0 <= {name} < 1, got {value!r}.")
  return value


def check_boundaries(name: str, boundaries: object) -> tuple[float, ...]:
  """Returns epoch boundaries as a tuple of floats; raises unless > 0 and strictly increasing."""
  if isinstance(boundaries, (str, bytes)) or not isinstance(boundaries, Sequence):
    raise TypeError(
        f"{name} must be a sequence of epochs such as (30, 60, 80), got {boundaries!r}."
    )
  values = tuple(check_real(f"{name}[{i}]", b) for i, b in enumerate(boundaries))
  for i, b in enumerate(values):
    if b <= 0:
      raise ValueError(f"{name} must be epochs > 0, got {name}[{i}] = {b!r} in {values!r}.")
    if i > 0 and b <= values[i - 1]:
      raise ValueError(
          f"{name} must be strictly increasing, got {values[i - 1]!r} followed by {b!r} "
          f"in {values!r}."
      )
  return values


def check_decay_factors(
    name: str, factors: object, num_boundaries: int, *, below_one: bool = False
) -> tuple[float, ...]:
  """Returns one multiplicative factor per boundary from a scalar or a sequence.

  Args:
    name: argument name used in error messages.
    factors: one real number used at every boundary, or one per boundary.
    num_boundaries: how many boundaries the factors go with.
    below_one: if True, each factor must also be < 1 (a real decay).

  Returns:
    A tuple of `num_boundaries` floats, each > 0.
  """
  if isinstance(factors, numbers.Real) and not isinstance(factors, bool):
    values = (check_real(name, factors),) * num_boundaries
  elif isinstance(factors, Sequence) and not isinstance(factors, (str, bytes)):
    if len(factors) != num_boundaries:
      raise ValueError(
          f"{name} must have one factor per boundary ({num_boundaries}), got {len(factors)}: "
          f"{factors!r}."
      )
    values = tuple(check_real(f"{name}[{i}]", f) for i, f in enumerate(factors))
  else:
    raise TypeError(f"{name} must be a number or a sequence of numbers, got {factors!r}.")
  for f in values:
    if f <= 0:
      raise ValueError(f"{name} must be > 0 (a multiplicative factor), got {f!r}.")
    if below_one and f >= 1:
      raise ValueError(
          f"{name} must be < 1 (a decay, e.g. 0.1 or 0.2), got {f!r}."
      )
  return values
