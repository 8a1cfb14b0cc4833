"""Joining schedules in time: one schedule per interval of epochs."""

from collections.abc import Sequence

from lbjax.schedules import base
from lbjax.schedules import validation


def join_schedules(
    schedules: Sequence[base.Schedule], boundaries: Sequence[float]
) -> base.Schedule:
  """Returns the schedule that follows `schedules[i]` on `[boundaries[i-1], boundaries[i])`.

    v(e) = schedules[i](e),  i = #{j : boundaries[j] <= e}

  Unlike `optax.join_schedules`, the epoch is NOT shifted: every piece sees the absolute epoch of
  the run, so a decay defined over the whole run (e.g. `polynomial_decay(..., total_epochs=90)`)
  keeps its meaning after a warm-up piece. Under `jax.jit` every piece is evaluated and the right
  one selected with `where`.

  Args:
    schedules: the pieces, one more than `boundaries`.
    boundaries: epochs > 0, strictly increasing, where the next piece takes over.
  """
  boundaries = validation.check_boundaries("boundaries", boundaries)
  schedules = tuple(schedules)
  if len(schedules) != len(boundaries) + 1:
    raise ValueError(
        f"join_schedules needs one more schedule than boundaries, got {len(schedules)} schedules "
        f"and {len(boundaries)} boundaries {boundaries!r}."
    )
  for i, schedule in enumerate(schedules):
    if not callable(schedule):
      raise TypeError(f"schedules[{i}] must be a schedule (epoch -> value), got {schedule!r}.")

  def formula(xp, e):
    value = schedules[0](e)
    for boundary, schedule in zip(boundaries, schedules[1:]):
      value = xp.where(e >= boundary, schedule(e), value)
    return value

  return lambda epoch: base.evaluate(epoch, formula)
