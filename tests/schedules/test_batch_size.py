"""Batch-size schedules: the step -> epoch map, and the Smith et al. rules (papers/002)."""

import numpy as np
import pytest

from lbjax import schedules

MOMENTUM = 0.9
CIFAR_N = 50_000  # CIFAR-10 training set (papers/002).
IMAGENET_N = 1_281_167


def _simulate_trainer(batch_size_schedule, num_train_examples, num_steps):
  """The trainer's loop: epoch from examples seen before each step, batch from the schedule."""
  examples, epochs, sizes = 0, [], []
  for _ in range(num_steps):
    epoch = examples / num_train_examples
    size = batch_size_schedule(epoch)
    epochs.append(epoch)
    sizes.append(size)
    examples += size
  return epochs, sizes


def test_call_sizes_and_boundaries():
  schedule = schedules.BatchSizeSchedule([128, 640, 3200], [60, 120])
  assert schedule.sizes == (128, 640, 3200)
  assert schedule.boundaries == (60.0, 120.0)
  assert [schedule(e) for e in (0, 59.99, 60, 119, 120, 500)] == [128, 128, 640, 640, 3200, 3200]
  assert schedules.constant_batch_size(256)(12.5) == 256


def test_step_to_epoch_map_matches_the_trainer_loop():
  """Boundaries that do not fall on a step (0.3 epochs, 0.75 epochs) switch at the next step."""
  schedule = schedules.BatchSizeSchedule((7, 20, 3), (0.3, 0.75))
  n = 100
  epochs, sizes = _simulate_trainer(schedule, n, 40)
  for step in range(40):
    assert schedule.epoch_at_step(step, n) == epochs[step]
    assert schedule.batch_size_at_step(step, n) == sizes[step]
    assert schedule.examples_at_step(step, n) == round(epochs[step] * n)
  # 5 steps of 7 reach 35 examples (0.35 >= 0.3); then 20s until 75 (0.75); then 3s.
  assert schedule.segments(n) == (
      schedules.BatchSegment(7, 0, 0),
      schedules.BatchSegment(20, 5, 35),
      schedules.BatchSegment(3, 7, 75),
  )
  assert schedule.steps_for_epochs(1.0, n) == 7 + 9  # 75 + 9 * 3 = 102 >= 100.
  assert schedule.steps_for_epochs(0.3, n) == 5
  assert schedule.steps_for_epochs(0.5, n) == 6


def test_a_size_skipped_within_one_step_gets_an_empty_segment():
  schedule = schedules.BatchSizeSchedule((50, 10, 20), (0.1, 0.2))
  n = 100
  segments = schedule.segments(n)
  assert segments[1].start_step == segments[2].start_step == 1  # 50 examples pass both.
  epochs, sizes = _simulate_trainer(schedule, n, 6)
  assert sizes == [50, 20, 20, 20, 20, 20]
  assert [schedule.batch_size_at_step(s, n) for s in range(6)] == sizes
  assert [schedule.epoch_at_step(s, n) for s in range(6)] == epochs


def test_boundaries_agree_with_float_epochs_of_the_trainer():
  """A boundary like 0.3 compares as the trainer does: float64 examples / N >= 0.3."""
  schedule = schedules.BatchSizeSchedule((1, 2), (0.3,))
  for n in (10, 50_000, 1_281_167):
    start = schedule.segments(n)[1].start_examples
    assert start / n >= 0.3
    assert (start - 1) / n < 0.3


def test_grow_batch_instead_of_decaying_lr_keeps_the_noise_scale_at_every_epoch():
  """papers/002 (wide ResNet, CIFAR-10): eps 0.1, B 128, x0.2 at epochs 60, 120, 160."""
  lr, batch, boundaries, factor = 0.1, 128, (60, 120, 160), 0.2
  decaying_lr = schedules.multistep_decay(lr, boundaries, factor)
  growing_batch = schedules.batch_schedule_from_lr_decay(batch, boundaries, factor)
  assert growing_batch.sizes == (128, 640, 3200, 16000)
  assert growing_batch.boundaries == (60.0, 120.0, 160.0)
  for epoch in np.concatenate([np.linspace(0, 200, 401), [59.999, 119.999, 159.999]]):
    g_decay = schedules.noise_scale(decaying_lr(epoch), batch, CIFAR_N, MOMENTUM)
    g_grow = schedules.noise_scale(lr, growing_batch(epoch), CIFAR_N, MOMENTUM)
    assert g_grow == pytest.approx(g_decay, rel=1e-12), epoch


def test_hybrid_schedule_keeps_the_noise_scale_with_a_maximum_batch():
  """papers/002 with B_max = 5120: 128 -> 640 -> 3200 -> 5120, the last step decays eps by 0.32."""
  lr, batch, boundaries, factor = 0.1, 128, (60, 120, 160), 0.2
  decaying_lr = schedules.multistep_decay(lr, boundaries, factor)
  hybrid = schedules.hybrid_schedule(batch, lr, boundaries, factor, max_batch_size=5120)
  assert isinstance(hybrid, schedules.HybridSchedule)
  assert hybrid.batch_size_schedule.sizes == (128, 640, 3200, 5120)
  assert hybrid.learning_rate_schedule(170) == pytest.approx(0.1 * 0.32, rel=1e-12)
  for epoch in np.linspace(0, 200, 401):
    g_decay = schedules.noise_scale(decaying_lr(epoch), batch, CIFAR_N, MOMENTUM)
    g_hybrid = schedules.noise_scale(
        hybrid.learning_rate_schedule(epoch),
        hybrid.batch_size_schedule(epoch),
        CIFAR_N,
        MOMENTUM,
    )
    assert g_hybrid == pytest.approx(g_decay, rel=1e-12), epoch


def test_hybrid_schedule_of_the_imagenet_experiment():
  """papers/002: B 8192, eps 3, x0.1 at 30, 60, 80; B grows to 81920, then eps decays twice."""
  hybrid = schedules.hybrid_schedule(8192, 3.0, (30, 60, 80), 0.1, max_batch_size=81920)
  assert hybrid.batch_size_schedule.sizes == (8192, 81920)
  assert hybrid.batch_size_schedule.boundaries == (30.0,)
  lr = hybrid.learning_rate_schedule
  assert [lr(e) for e in (0, 30, 59)] == [3.0, 3.0, 3.0]
  assert lr(60) == pytest.approx(0.3, rel=1e-12)
  assert lr(80) == pytest.approx(0.03, rel=1e-12)
  for epoch in np.linspace(0, 90, 181):
    expected = 3.0 * 0.1 ** sum(epoch >= b for b in (30, 60, 80)) / 8192
    actual = lr(epoch) / hybrid.batch_size_schedule(epoch)
    assert actual == pytest.approx(expected, rel=1e-12), epoch


def test_hybrid_with_a_large_maximum_is_the_growing_batch_schedule():
  hybrid = schedules.hybrid_schedule(128, 0.1, (60, 120, 160), 0.2, max_batch_size=16000)
  assert hybrid.batch_size_schedule == schedules.batch_schedule_from_lr_decay(
      128, (60, 120, 160), 0.2
  )
  assert hybrid.learning_rate_schedule(199) == 0.1


def test_hybrid_growth_that_lands_on_the_maximum_up_to_rounding_keeps_the_lr():
  """21 / 0.7 is 30.000000000000004 in floating point: B reaches B_max = 30 and eps stays."""
  hybrid = schedules.hybrid_schedule(21, 1.0, (5,), 0.7, max_batch_size=30)
  assert hybrid.batch_size_schedule.sizes == (21, 30)
  assert hybrid.learning_rate_schedule(10) == 1.0


@pytest.mark.parametrize(
    "build, error, match",
    [
        (
            lambda: schedules.BatchSizeSchedule((128, 256), (60, 30)),
            ValueError,
            "strictly increasing",
        ),
        (
            lambda: schedules.BatchSizeSchedule((128, 256), ()),
            ValueError,
            "one boundary fewer than sizes",
        ),
        (lambda: schedules.BatchSizeSchedule((), ()), ValueError, "at least one batch size"),
        (
            lambda: schedules.BatchSizeSchedule((128, 12.5), (10,)),
            TypeError,
            r"sizes\[1\] must be a positive integer",
        ),
        (
            lambda: schedules.BatchSizeSchedule((128, 0), (10,)),
            ValueError,
            r"sizes\[1\] must be a positive integer, got 0",
        ),
        (
            lambda: schedules.BatchSizeSchedule((128, 128), (10,)),
            ValueError,
            "consecutive batch sizes must differ",
        ),
        (lambda: schedules.BatchSizeSchedule(128), TypeError, "sizes must be a sequence"),
        (
            lambda: schedules.BatchSizeSchedule((128,))(-1.0),
            ValueError,
            "epoch must be finite and >= 0",
        ),
        (lambda: schedules.BatchSizeSchedule((128,))("1"), TypeError, "evaluated on the host"),
        (
            lambda: schedules.BatchSizeSchedule((128,)).epoch_at_step(-1, 10),
            ValueError,
            "step must be a non-negative integer",
        ),
        (
            lambda: schedules.BatchSizeSchedule((128,)).epoch_at_step(1.5, 10),
            TypeError,
            "step must be a non-negative integer",
        ),
        (
            lambda: schedules.BatchSizeSchedule((128,)).segments(0),
            ValueError,
            "num_train_examples must be a positive integer",
        ),
        (
            lambda: schedules.batch_schedule_from_lr_decay(128, (60,), 0.3),
            ValueError,
            "not an integer",
        ),
        (
            lambda: schedules.batch_schedule_from_lr_decay(128, (60,), 1.0),
            ValueError,
            r"must be < 1 \(a decay",
        ),
        (
            lambda: schedules.batch_schedule_from_lr_decay(128, (60,), -0.2),
            ValueError,
            "must be > 0",
        ),
        (
            lambda: schedules.batch_schedule_from_lr_decay(128.0, (60,), 0.2),
            TypeError,
            "batch_size must be a positive integer",
        ),
        (
            lambda: schedules.hybrid_schedule(8192, 3.0, (30,), 0.1, 4096),
            ValueError,
            r"batch_size \(8192\) must not exceed max_batch_size \(4096\)",
        ),
        (
            lambda: schedules.hybrid_schedule(8192, 0.0, (30,), 0.1, 81920),
            ValueError,
            "learning_rate must be > 0",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_a_clear_message(build, error, match):
  with pytest.raises(error, match=match):
    build()
