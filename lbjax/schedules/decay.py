"""Learning-rate (or momentum) schedules as functions of the epoch: constant and decays.

Every builder validates its arguments, then returns a `Schedule` (see `lbjax.schedules.base`):
a callable `epoch -> value` that gives a float on the host and a `jax.Array` under `jax.jit`.
Epochs are absolute: every schedule here is measured from epoch 0 of the run unless it has a
`begin_epoch` argument, in which case it holds its initial value until `begin_epoch` and is measured
from there. Warm-up is added around these by `lbjax.schedules.warmup`.
"""

from collections.abc import Sequence

import numpy as np

from lbjax.schedules import base
from lbjax.schedules import validation


def _decay_interval(init_value: float, end_value: float, total_epochs: float,
                    begin_epoch: float) -> tuple[float, float, float, float]:
  """Validated (init_value, end_value, begin_epoch, span) of a decay from begin_epoch to total_epochs."""
  init_value = validation.check_non_negative("init_value", init_value)
  end_value = validation.check_non_negative("end_value", end_value)
  total_epochs = validation.check_positive("total_epochs", total_epochs)
  begin_epoch = validation.check_non_negative("begin_epoch", begin_epoch)
  if begin_epoch >= total_epochs:
    raise ValueError(
        f"begin_epoch ({begin_epoch}) must be before total_epochs ({total_epochs}): the decay "
        "needs a non-empty interval."
    )
  return init_value, end_value, begin_epoch, total_epochs - begin_epoch


def constant(value: float) -> base.Schedule:
  """Returns the schedule `v(e) = value` (e.g. the MNIST LSTM recipe of papers/001 §5.1.1).

  Args:
    value: the value at every epoch, finite and >= 0.
  """
  value = validation.check_non_negative("value", value)
  return lambda epoch: base.evaluate(epoch, lambda xp, e: xp.zeros_like(e) + value)


def polynomial_decay(
    init_value: float,
    total_epochs: float,
    power: float = 2.0,
    end_value: float = 0.0,
    begin_epoch: float = 0.0,
) -> base.Schedule:
  """Returns a polynomial ("poly") decay from `init_value` to `end_value` at `total_epochs`.

  With `b = begin_epoch` and `T = total_epochs`:

    v(e) = end + (init - end) * (1 - clip((e - b) / (T - b), 0, 1)) ** power

  so v = init for e <= b and v = end for e >= T. With b = 0 this is the global rate of
  Algorithm 1 of papers/000, gamma_t = gamma_0 * (1 - t/T)^2, and the poly decay of papers/001
  §3.2, eta * (1 - i/I)^p, with the iteration ratio i/I written as the epoch ratio e/T (equal for
  a fixed batch size). Both papers use power 2.

  Args:
    init_value: value up to `begin_epoch`, >= 0.
    total_epochs: epoch where `end_value` is reached, > `begin_epoch`.
    power: exponent p > 0.
    end_value: final value, >= 0.
    begin_epoch: epoch where the decay starts, >= 0 (0: measured from the start of the run).
  """
  power = validation.check_positive("power", power)
  init_value, end_value, begin_epoch, span = _decay_interval(init_value, end_value, total_epochs,
                                                              begin_epoch)

  def formula(xp, e):
    remaining = 1.0 - xp.clip((e - begin_epoch) / span, 0.0, 1.0)
    return end_value + (init_value - end_value) * remaining**power

  return lambda epoch: base.evaluate(epoch, formula)


def multistep_decay(
    init_value: float,
    boundaries: Sequence[float],
    decay_factors: float | Sequence[float] = 0.1,
) -> base.Schedule:
  """Returns a piecewise-constant schedule multiplied by a factor at each boundary epoch.

    v(e) = init * prod_{i : e >= boundaries[i]} decay_factors[i]

  The value changes exactly at each boundary (the boundary belongs to the new piece). Example: the
  multi-step recipe of papers/001 §3.2 (Figure 2.1): `multistep_decay(2**2.5, (30, 60, 80), 0.1)`;
  the wide-ResNet recipe of papers/002: factor 0.2 at each step.

  Args:
    init_value: value before the first boundary, >= 0.
    boundaries: epochs > 0, strictly increasing; may be empty (a constant schedule).
    decay_factors: one factor > 0 for every boundary, or a sequence with one per boundary.
  """
  init_value = validation.check_non_negative("init_value", init_value)
  boundaries = validation.check_boundaries("boundaries", boundaries)
  factors = validation.check_decay_factors("decay_factors", decay_factors, len(boundaries))
  boundary_array = np.asarray(boundaries, dtype=np.float64)
  factor_array = np.asarray(factors, dtype=np.float64)

  def formula(xp, e):
    e = xp.expand_dims(e, -1)
    passed = e >= xp.asarray(boundary_array, dtype=e.dtype)
    multipliers = xp.where(passed, xp.asarray(factor_array, dtype=e.dtype), 1.0)
    return init_value * xp.prod(multipliers, axis=-1)

  return lambda epoch: base.evaluate(epoch, formula)


def exponential_decay(
    init_value: float,
    decay_begin_epoch: float,
    decay_factor: float,
    decay_every_epochs: float = 1.0,
) -> base.Schedule:
  """Returns a schedule constant until `decay_begin_epoch`, then multiplied every few epochs.

  With `b = decay_begin_epoch`, `d = decay_every_epochs`, `f = decay_factor`:

    v(e) = init                                  for e < b
    v(e) = init * f ** (floor((e - b) / d) + 1)  for e >= b

  i.e. the first multiplication happens at epoch b, the next at b + d, and so on. The PTB LSTM
  recipe of papers/001 §5.1.2 ("constant learning rate in the first seven epochs, then decayed by
  a half after each epoch", 13 epochs) is `exponential_decay(lr, 7, 0.5)`: lr on [0, 7), lr/2 on
  [7, 8), lr/4 on [8, 9), ..., lr/64 on [12, 13).

  Args:
    init_value: value before `decay_begin_epoch`, >= 0.
    decay_begin_epoch: epoch of the first multiplication, >= 0.
    decay_factor: multiplier f > 0 applied at each decay.
    decay_every_epochs: epochs between multiplications, > 0.
  """
  init_value = validation.check_non_negative("init_value", init_value)
  decay_begin_epoch = validation.check_non_negative("decay_begin_epoch", decay_begin_epoch)
  decay_factor = validation.check_decay_factors("decay_factor", decay_factor, 1)[0]
  decay_every_epochs = validation.check_positive("decay_every_epochs", decay_every_epochs)

  def formula(xp, e):
    decays = xp.where(
        e >= decay_begin_epoch,
        xp.floor((e - decay_begin_epoch) / decay_every_epochs) + 1.0,
        0.0,
    )
    return init_value * decay_factor**decays

  return lambda epoch: base.evaluate(epoch, formula)


def cosine_decay(
    init_value: float,
    total_epochs: float,
    end_value: float = 0.0,
    begin_epoch: float = 0.0,
) -> base.Schedule:
  """Returns a half-cosine decay from `init_value` to `end_value` at `total_epochs`.

    v(e) = end + (init - end) * (1 + cos(pi * clip((e - b) / (T - b), 0, 1))) / 2

  with `b = begin_epoch` and `T = total_epochs`; v = init for e <= b, v = end for e >= T.

  Args:
    init_value: value up to `begin_epoch`, >= 0.
    total_epochs: epoch where `end_value` is reached, > `begin_epoch`.
    end_value: final value, >= 0.
    begin_epoch: epoch where the decay starts, >= 0 (0: measured from the start of the run).
  """
  init_value, end_value, begin_epoch, span = _decay_interval(init_value, end_value, total_epochs,
                                                              begin_epoch)

  def formula(xp, e):
    progress = xp.clip((e - begin_epoch) / span, 0.0, 1.0)
    return end_value + (init_value - end_value) * 0.5 * (1.0 + xp.cos(np.pi * progress))

  return lambda epoch: base.evaluate(epoch, formula)
