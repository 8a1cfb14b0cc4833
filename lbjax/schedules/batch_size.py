"""Batch-size schedules (papers/002): piecewise-constant batch sizes in epochs, and the Smith rules.

A `BatchSizeSchedule` maps the epoch to a global batch size on the host. Progress is counted the
way the trainer counts it: before each step, `epoch = examples_seen / num_train_examples` (a
float64), the step uses the batch size `schedule(epoch)`, then `examples_seen += batch_size`. A
change of batch size therefore takes effect at the first step that starts at or after the boundary
epoch; `segments`, `epoch_at_step` and `steps_for_epochs` give that exact step -> epoch map.

Smith, Kindermans & Le (papers/002) keep the noise scale g = eps * N / (B (1 - m)) of a multi-step
learning-rate decay while holding the learning rate constant: where eps would be multiplied by f,
multiply B by 1/f instead (`batch_schedule_from_lr_decay`). With a hardware limit B_max, the hybrid
schedule grows B up to B_max and decays eps by the factor that remains (`hybrid_schedule`).
"""

import bisect
from collections.abc import Sequence
import dataclasses
import fractions
import math
import numbers
from typing import NamedTuple

from lbjax.schedules import base
from lbjax.schedules import decay
from lbjax.schedules import validation


class BatchSegment(NamedTuple):
  """A run of steps with one batch size: it starts at `start_step`, after `start_examples`."""

  batch_size: int
  start_step: int
  start_examples: int


def _check_step(step: object) -> int:
  if isinstance(step, bool) or not isinstance(step, numbers.Integral):
    raise TypeError(f"step must be a non-negative integer, got {step!r} ({type(step).__name__}).")
  if step < 0:
    raise ValueError(f"step must be a non-negative integer, got {step!r}.")
  return int(step)


def _steps_to_reach(segment: BatchSegment, epoch: float, num_train_examples: int) -> int:
  """Smallest s >= 0 with (start_examples + s * batch_size) / N >= epoch, compared in float64."""
  needed = fractions.Fraction(epoch) * num_train_examples - segment.start_examples
  steps = max(0, math.ceil(needed / segment.batch_size))
  # The trainer compares the float64 quotient examples / N with the epoch; the quotient can round
  # up onto the boundary one step before the exact rational crosses it.
  while (
      steps > 0
      and (segment.start_examples + (steps - 1) * segment.batch_size) / num_train_examples
      >= epoch
  ):
    steps -= 1
  return steps


@dataclasses.dataclass(frozen=True)
class BatchSizeSchedule:
  """A piecewise-constant global batch size as a function of the epoch (host side).

    B(e) = sizes[i],  i = #{j : boundaries[j] <= e}

  Attributes:
    sizes: the batch size of each piece, positive ints, consecutive sizes distinct; the trainer
      compiles one step per distinct size.
    boundaries: the epochs (> 0, strictly increasing) where the size changes; one fewer than
      `sizes`.
  """

  sizes: tuple[int, ...]
  boundaries: tuple[float, ...] = ()

  def __post_init__(self):
    if isinstance(self.sizes, (str, bytes)) or not isinstance(self.sizes, Sequence):
      raise TypeError(
          f"sizes must be a sequence of batch sizes such as (128, 640), got {self.sizes!r}."
      )
    if not self.sizes:
      raise ValueError("sizes must hold at least one batch size, got an empty sequence.")
    sizes = tuple(
        validation.check_positive_int(f"sizes[{i}]", size) for i, size in enumerate(self.sizes)
    )
    for i in range(1, len(sizes)):
      if sizes[i] == sizes[i - 1]:
        raise ValueError(
            f"consecutive batch sizes must differ, got sizes[{i - 1}] = sizes[{i}] = {sizes[i]} "
            f"in {sizes!r}; drop the boundary between them."
        )
    boundaries = validation.check_boundaries("boundaries", self.boundaries)
    if len(boundaries) != len(sizes) - 1:
      raise ValueError(
          f"a batch-size schedule needs one boundary fewer than sizes, got {len(sizes)} sizes "
          f"{sizes!r} and {len(boundaries)} boundaries {boundaries!r}."
      )
    object.__setattr__(self, "sizes", sizes)
    object.__setattr__(self, "boundaries", boundaries)

  def __call__(self, epoch: float) -> int:
    """Returns the global batch size at `epoch` (a host number, finite and >= 0)."""
    if isinstance(epoch, bool) or not isinstance(epoch, numbers.Real):
      raise TypeError(
          "BatchSizeSchedule is evaluated on the host (the batch size fixes array shapes); "
          f"pass a Python float epoch, got {epoch!r} ({type(epoch).__name__})."
      )
    epoch = float(epoch)
    if not math.isfinite(epoch) or epoch < 0:
      raise ValueError(f"epoch must be finite and >= 0, got {epoch!r}.")
    return self.sizes[bisect.bisect_right(self.boundaries, epoch)]

  def segments(self, num_train_examples: int) -> tuple[BatchSegment, ...]:
    """Returns where each batch size starts, in steps and examples, for a training set of N.

    Segment i+1 starts at the first step whose starting epoch (examples / N) is >= boundaries[i].
    A segment whose size is never used (a boundary passed within one step) has zero steps: it
    starts at the same step as the next one.

    Args:
      num_train_examples: N, the training-set size, a positive int.
    """
    num_train_examples = validation.check_positive_int("num_train_examples", num_train_examples)
    segments = [BatchSegment(self.sizes[0], 0, 0)]
    for boundary, size in zip(self.boundaries, self.sizes[1:]):
      previous = segments[-1]
      steps = _steps_to_reach(previous, boundary, num_train_examples)
      segments.append(
          BatchSegment(
              size,
              previous.start_step + steps,
              previous.start_examples + steps * previous.batch_size,
          )
      )
    return tuple(segments)

  def _segment_at_step(self, step: int, num_train_examples: int) -> BatchSegment:
    segments = self.segments(num_train_examples)
    starts = [segment.start_step for segment in segments]
    return segments[bisect.bisect_right(starts, step) - 1]

  def examples_at_step(self, step: int, num_train_examples: int) -> int:
    """Returns the number of examples seen before step `step` (0-based) starts."""
    step = _check_step(step)
    segment = self._segment_at_step(step, num_train_examples)
    return segment.start_examples + (step - segment.start_step) * segment.batch_size

  def epoch_at_step(self, step: int, num_train_examples: int) -> float:
    """Returns the epoch (examples seen / N, float64) at which step `step` (0-based) starts."""
    return self.examples_at_step(step, num_train_examples) / num_train_examples

  def batch_size_at_step(self, step: int, num_train_examples: int) -> int:
    """Returns the batch size used by step `step` (0-based); equals `self(epoch_at_step(step))`."""
    step = _check_step(step)
    return self._segment_at_step(step, num_train_examples).batch_size

  def steps_for_epochs(self, num_epochs: float, num_train_examples: int) -> int:
    """Returns the number of steps of a run of `num_epochs` epochs (the last may overshoot).

    This is the smallest step count s with examples_seen(s) / N >= num_epochs.
    """
    num_epochs = validation.check_positive("num_epochs", num_epochs)
    segments = self.segments(num_train_examples)
    for segment, following in zip(segments, segments[1:] + (None,)):
      steps = _steps_to_reach(segment, num_epochs, num_train_examples)
      if following is None or segment.start_step + steps <= following.start_step:
        return segment.start_step + steps
    raise AssertionError("unreachable: the last segment is unbounded")


def constant_batch_size(batch_size: int) -> BatchSizeSchedule:
  """Returns the schedule with one batch size for the whole run."""
  return BatchSizeSchedule((batch_size,))


def _grow(batch_size: int, decay_factor: float) -> int:
  """Returns batch_size / decay_factor, which must be an integer."""
  grown = batch_size / decay_factor
  rounded = round(grown)
  if abs(grown - rounded) > 1e-9 * grown:
    raise ValueError(
        f"growing batch size {batch_size} by 1/{decay_factor:g} gives {grown:.6g}, not an "
        "integer, so the noise scale could not be kept; choose a batch size and decay factor "
        "whose quotient is an integer (e.g. 128 with 0.2, 8192 with 0.1)."
    )
  return rounded


def batch_schedule_from_lr_decay(
    batch_size: int,
    boundaries: Sequence[float],
    decay_factors: float | Sequence[float],
) -> BatchSizeSchedule:
  """Turns a multi-step LR decay into the batch schedule with the same noise scale (papers/002).

  The recipe "learning rate eps, batch B, multiply eps by f_i at boundaries[i]" becomes "learning
  rate eps (constant), batch B, multiply B by 1/f_i at boundaries[i]": at every epoch

    g = eps * prod f_i * N / (B (1 - m)) = eps * N / ((B / prod f_i) (1 - m)).

  Example (papers/002, wide ResNet on CIFAR-10): B=128, factor 0.2 at each step gives
  128 -> 640 -> 3200 -> 16000.

  Args:
    batch_size: the initial (and, in the LR-decay recipe, only) batch size, a positive int.
    boundaries: epochs of the LR decays, > 0, strictly increasing.
    decay_factors: LR multipliers f with 0 < f < 1, one for all boundaries or one per boundary;
      `batch_size / prod f` must be an integer at each boundary.

  Returns:
    The `BatchSizeSchedule`; use it with the constant initial learning rate.
  """
  size = validation.check_positive_int("batch_size", batch_size)
  boundaries = validation.check_boundaries("boundaries", boundaries)
  factors = validation.check_decay_factors(
      "decay_factors", decay_factors, len(boundaries), below_one=True
  )
  sizes = [size]
  for factor in factors:
    sizes.append(_grow(sizes[-1], factor))
  return BatchSizeSchedule(tuple(sizes), boundaries)


class HybridSchedule(NamedTuple):
  """The batch-size and learning-rate schedules of a hybrid recipe, used together."""

  batch_size_schedule: BatchSizeSchedule
  learning_rate_schedule: base.Schedule


def hybrid_schedule(
    batch_size: int,
    learning_rate: float,
    boundaries: Sequence[float],
    decay_factors: float | Sequence[float],
    max_batch_size: int,
) -> HybridSchedule:
  """The hybrid schedule of papers/002: grow B where eps would decay, up to B_max, then decay eps.

  At boundary i the noise scale g ~ eps / B must be multiplied by f_i. The batch grows to
  B' = min(B / f_i, B_max); the learning rate is multiplied by whatever is left,
  eps' = eps * f_i * B' / B (1 while B / f_i <= B_max, f_i once B is at B_max). Hence g is the same
  as in the LR-decay recipe at every epoch.

  Examples (papers/002): ImageNet, B=8192, eps=3, factor 0.1 at epochs 30, 60, 80, B_max=81920:
  B grows to 81920 at epoch 30, then eps decays by 10 at epochs 60 and 80. CIFAR-10, B=128,
  factor 0.2, B_max=5120: B 128 -> 640 -> 3200 -> 5120 with eps * 0.32 at the third step.

  Args:
    batch_size: the initial batch size, a positive int <= `max_batch_size`.
    learning_rate: the initial learning rate, > 0.
    boundaries: epochs of the decays, > 0, strictly increasing.
    decay_factors: noise multipliers f with 0 < f < 1, one for all boundaries or one per boundary.
    max_batch_size: B_max, the largest batch the hardware allows, a positive int.

  Returns:
    `HybridSchedule(batch_size_schedule, learning_rate_schedule)`.
  """
  size = validation.check_positive_int("batch_size", batch_size)
  max_batch_size = validation.check_positive_int("max_batch_size", max_batch_size)
  if size > max_batch_size:
    raise ValueError(
        f"batch_size ({size}) must not exceed max_batch_size ({max_batch_size})."
    )
  learning_rate = validation.check_positive("learning_rate", learning_rate)
  boundaries = validation.check_boundaries("boundaries", boundaries)
  factors = validation.check_decay_factors(
      "decay_factors", decay_factors, len(boundaries), below_one=True
  )
  sizes, size_boundaries = [size], []
  lr_factors, lr_boundaries = [], []
  for boundary, factor in zip(boundaries, factors):
    previous = sizes[-1]
    if previous / factor <= max_batch_size * (1 + 1e-9):  # Tolerates rounding, e.g. 21 / 0.7.
      grown, lr_factor = _grow(previous, factor), 1.0
    else:
      grown, lr_factor = max_batch_size, factor * max_batch_size / previous
    if grown != previous:
      sizes.append(grown)
      size_boundaries.append(boundary)
    if lr_factor != 1.0:
      lr_factors.append(lr_factor)
      lr_boundaries.append(boundary)
  return HybridSchedule(
      BatchSizeSchedule(tuple(sizes), tuple(size_boundaries)),
      decay.multistep_decay(learning_rate, lr_boundaries, lr_factors),
  )
