"""Learning-rate warm-up (gradual and constant) around an epoch schedule, and the poly(2) recipe.

Gradual warm-up (Goyal et al., as described in papers/001 §2.3 and papers/000 §3): the learning
rate starts small and grows linearly to its target over the first epochs. Constant warm-up: a
small constant rate during the first epochs, then the schedule. The warm-up length is in epochs,
so it covers the same part of training at any batch size; LEGW (papers/001 §3) scales it with the
batch size (`lbjax.schedules.legw`).
"""

from lbjax.schedules import base
from lbjax.schedules import composition
from lbjax.schedules import decay
from lbjax.schedules import validation


def _value_after_warmup(schedule: base.Schedule, warmup_epochs: float, where: str) -> float:
  """The value `schedule` takes over with at `warmup_epochs`; raises if it is 0 (the run would train
  at a zero rate from there: a warm-up past the end of a decay)."""
  value = float(schedule(warmup_epochs))
  if value == 0:
    raise ValueError(
        f"{where}: the schedule is 0 at the end of the warm-up (epoch {warmup_epochs:g}), so every step "
        f"after it (and, for a linear warm-up from 0, every step) would have a zero learning rate. Is "
        f"warmup_epochs longer than the schedule (past the total_epochs of its decay)? Shorten the "
        f"warm-up or lengthen the schedule."
    )
  return value


def linear_warmup(
    schedule: base.Schedule, warmup_epochs: float, init_value: float = 0.0
) -> base.Schedule:
  """Returns `schedule` preceded by a linear (gradual) warm-up ending at the schedule's value.

  With `w = warmup_epochs`:

    v(e) = init + (schedule(w) - init) * e / w   for e < w
    v(e) = schedule(e)                            for e >= w

  The ramp ends at `schedule(w)`, so the result is continuous at the end of warm-up for any
  `schedule`. For a schedule that is flat up to `w` (a constant, a multi-step decay, or a decay
  whose `begin_epoch` is `w`) the ramp ends at the peak; for a decay measured from epoch 0 it ends
  at the decayed value. `init_value` 0 is the LEGW ramp ("increases LR from 0", papers/001 §3.2);
  papers/000 (footnote 2) starts from 0.001.

  Args:
    schedule: the schedule that takes over at epoch `warmup_epochs` (absolute epochs).
    warmup_epochs: warm-up length in epochs, > 0, where `schedule` is not 0 (a warm-up past the end
      of a decay to 0 is refused).
    init_value: value at epoch 0, >= 0.
  """
  if not callable(schedule):
    raise TypeError(f"schedule must be a schedule (epoch -> value), got {schedule!r}.")
  warmup_epochs = validation.check_positive("warmup_epochs", warmup_epochs)
  init_value = validation.check_non_negative("init_value", init_value)
  target = _value_after_warmup(schedule, warmup_epochs, "linear_warmup")

  def ramp(epoch):
    return base.evaluate(
        epoch, lambda xp, e: init_value + (target - init_value) * (e / warmup_epochs)
    )

  return composition.join_schedules((ramp, schedule), (warmup_epochs,))


def constant_warmup(
    schedule: base.Schedule, warmup_epochs: float, warmup_value: float
) -> base.Schedule:
  """Returns `schedule` preceded by a constant warm-up (papers/001 §2.3, "Constant Warmup Scheme").

    v(e) = warmup_value  for e < warmup_epochs
    v(e) = schedule(e)   for e >= warmup_epochs

  Unlike `linear_warmup`, this jumps at the end of warm-up, by design.

  Args:
    schedule: the schedule that takes over at epoch `warmup_epochs` (absolute epochs).
    warmup_epochs: warm-up length in epochs, > 0, where `schedule` is not 0 (a warm-up past the end
      of a decay to 0 is refused).
    warmup_value: the small constant used during warm-up, >= 0.
  """
  if not callable(schedule):
    raise TypeError(f"schedule must be a schedule (epoch -> value), got {schedule!r}.")
  warmup_epochs = validation.check_positive("warmup_epochs", warmup_epochs)
  warmup_value = validation.check_non_negative("warmup_value", warmup_value)
  _value_after_warmup(schedule, warmup_epochs, "constant_warmup")
  return composition.join_schedules(
      (decay.constant(warmup_value), schedule), (warmup_epochs,)
  )


def warmup_polynomial_decay(
    peak_value: float,
    warmup_epochs: float,
    total_epochs: float,
    power: float = 2.0,
    init_value: float = 0.0,
    end_value: float = 0.0,
    decay_from_warmup_end: bool = True,
) -> base.Schedule:
  """Returns the LARS/LEGW ResNet-50 schedule: linear warm-up, then poly decay to 0 at the end.

  With `w = warmup_epochs`, `T = total_epochs`, `p = power` and the default
  `decay_from_warmup_end=True` (decay measured from the END of warm-up):

    v(e) = init + (peak - init) * e / w                      for e < w
    v(e) = end + (peak - end) * (1 - (e - w) / (T - w)) ** p  for w <= e <= T

  The rate rises linearly from `init_value` to exactly `peak_value` (the "Init LR" of Table 1 of
  papers/001, e.g. 2^5.0 over 10 epochs at B=32K), then decays continuously to `end_value` at epoch
  T (papers/001 Table 1: p = 2, T = 90). This is how the TPU reference LARS ResNet-50 code
  (tensorflow/tpu, models/official/resnet/lars_util.py) writes the recipe.

  With `decay_from_warmup_end=False` the decay is measured from epoch 0, as written in Algorithm 1
  of papers/000 and §3.2 of papers/001 (`peak * (1 - e/T) ** p`), and the warm-up ramp ends at that
  curve's value at w, `peak * (1 - w/T) ** p`, to stay continuous (the papers' text ramps to `peak`
  and then drops to the curve, a jump of factor (1 - w/T)^p: 0.79 at B=32K).

  Args:
    peak_value: the learning rate reached at the end of warm-up, > 0.
    warmup_epochs: warm-up length in epochs, >= 0 (0: no warm-up), < `total_epochs`.
    total_epochs: length of the run in epochs, > 0; the value is `end_value` from here on.
    power: poly exponent p > 0 (both papers use 2).
    init_value: warm-up start value, >= 0.
    end_value: final value, >= 0.
    decay_from_warmup_end: where the decay is measured from (see above).
  """
  peak_value = validation.check_positive("peak_value", peak_value)
  warmup_epochs = validation.check_non_negative("warmup_epochs", warmup_epochs)
  total_epochs = validation.check_positive("total_epochs", total_epochs)
  if warmup_epochs >= total_epochs:
    raise ValueError(
        f"warmup_epochs ({warmup_epochs}) must be shorter than the run (total_epochs = "
        f"{total_epochs}); shorten the warm-up or train longer."
    )
  if not isinstance(decay_from_warmup_end, bool):
    raise TypeError(f"decay_from_warmup_end must be a bool, got {decay_from_warmup_end!r}.")
  begin_epoch = warmup_epochs if decay_from_warmup_end else 0.0
  schedule = decay.polynomial_decay(
      peak_value, total_epochs, power=power, end_value=end_value, begin_epoch=begin_epoch
  )
  if warmup_epochs == 0:
    return schedule
  return linear_warmup(schedule, warmup_epochs, init_value=init_value)
