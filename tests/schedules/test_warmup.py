"""Warm-ups and their composition with decays: start/end values, continuity, absolute epochs."""

import jax
import jax.numpy as jnp
import pytest

from lbjax import schedules

EPS = 1e-9


def test_linear_warmup_ramps_from_init_to_the_schedule_value():
  schedule = schedules.linear_warmup(schedules.constant(3.2), warmup_epochs=5)
  assert schedule(0) == 0.0
  assert schedule(2.5) == pytest.approx(1.6, rel=1e-12)
  assert schedule(5) == 3.2
  assert schedule(40) == 3.2


def test_linear_warmup_from_a_small_value_as_in_papers_000():
  """papers/000 footnote 2: LR starts from 0.001 and grows linearly over 2.5 epochs."""
  schedule = schedules.linear_warmup(schedules.constant(0.05), 2.5, init_value=0.001)
  assert schedule(0) == 0.001
  assert schedule(1.25) == pytest.approx((0.001 + 0.05) / 2, rel=1e-12)
  assert schedule(2.5) == 0.05


def test_legw_32k_row_of_table_1():
  """papers/001 Table 1, B=32K: 0 -> 2^5.0 over 10 epochs, then poly(2) to 0 at epoch 90."""
  schedule = schedules.warmup_polynomial_decay(2**5.0, warmup_epochs=10, total_epochs=90)
  assert schedule(0) == 0.0
  assert schedule(5) == pytest.approx(16.0, rel=1e-12)
  assert schedule(10) == 32.0
  assert schedule(50) == pytest.approx(32.0 / 4, rel=1e-12)  # poly(2) midpoint of [10, 90].
  assert schedule(90) == 0.0
  assert schedule(10 - EPS) == pytest.approx(schedule(10), rel=1e-8)  # continuous.


def test_decay_measured_from_epoch_0_follows_algorithm_1_and_stays_continuous():
  """decay_from_warmup_end=False: peak * (1 - e/T)^2 after warm-up; the ramp ends on that curve."""
  schedule = schedules.warmup_polynomial_decay(
      2**5.0, warmup_epochs=10, total_epochs=90, decay_from_warmup_end=False
  )
  on_curve = 32.0 * (1 - 10 / 90) ** 2
  assert schedule(0) == 0.0
  assert schedule(10) == pytest.approx(on_curve, rel=1e-12)
  assert schedule(10 - EPS) == pytest.approx(on_curve, rel=1e-8)
  assert schedule(45) == pytest.approx(8.0, rel=1e-12)
  assert schedule(90) == 0.0


def test_legw_multistep_composition_is_continuous_at_the_warmup_end():
  """papers/001 §3.2, Figure 2.1 at B=2K: warm-up 0.625 epochs to 2^3.0, x0.1 at 30, 60, 80."""
  schedule = schedules.linear_warmup(
      schedules.multistep_decay(2**3.0, (30, 60, 80), 0.1), warmup_epochs=0.625
  )
  assert schedule(0) == 0.0
  assert schedule(0.625 - EPS) == pytest.approx(8.0, rel=1e-8)
  assert schedule(0.625) == 8.0
  assert schedule(30) == pytest.approx(0.8, rel=1e-12)
  assert schedule(85) == pytest.approx(0.008, rel=1e-12)


def test_zero_warmup_is_the_plain_decay():
  schedule = schedules.warmup_polynomial_decay(4.0, 0, 10)
  assert schedule(0) == 4.0
  assert schedule(5) == pytest.approx(1.0, rel=1e-12)


def test_constant_warmup_jumps_at_the_end_of_warmup():
  schedule = schedules.constant_warmup(schedules.constant(3.2), 5, warmup_value=0.1)
  assert [schedule(e) for e in (0, 4.99, 5, 20)] == [0.1, 0.1, 3.2, 3.2]


def test_join_schedules_passes_absolute_epochs():
  """Each piece sees the run's epoch (no shift as in optax.join_schedules)."""
  decay = schedules.polynomial_decay(1.0, 10, power=1.0)
  schedule = schedules.join_schedules([schedules.constant(5.0), decay], [4])
  assert schedule(3) == 5.0
  assert schedule(4) == pytest.approx(0.6, rel=1e-12)
  assert schedule(8) == pytest.approx(0.2, rel=1e-12)


def test_composition_under_jit_matches_the_host():
  schedule = schedules.warmup_polynomial_decay(2**5.0, 10, 90)
  jitted = jax.jit(schedule)
  for epoch in (0.0, 3.0, 9.5, 10.0, 50.0, 90.0):
    assert float(jitted(jnp.float32(epoch))) == pytest.approx(schedule(epoch), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (
            lambda: schedules.warmup_polynomial_decay(1.0, 100, 90),
            ValueError,
            r"warmup_epochs \(100.0\) must be shorter than the run \(total_epochs = 90.0\)",
        ),
        (
            lambda: schedules.warmup_polynomial_decay(1.0, 90, 90),
            ValueError,
            "must be shorter than the run",
        ),
        (
            lambda: schedules.warmup_polynomial_decay(0.0, 5, 90),
            ValueError,
            "peak_value must be > 0",
        ),
        (
            lambda: schedules.warmup_polynomial_decay(1.0, -1, 90),
            ValueError,
            "warmup_epochs must be >= 0",
        ),
        (
            lambda: schedules.warmup_polynomial_decay(1.0, 5, 90, decay_from_warmup_end="yes"),
            TypeError,
            "decay_from_warmup_end must be a bool",
        ),
        (
            lambda: schedules.linear_warmup(schedules.constant(1.0), 0),
            ValueError,
            "warmup_epochs must be > 0",
        ),
        (lambda: schedules.linear_warmup(1.0, 5), TypeError, "schedule must be a schedule"),
        (  # a warm-up past the end of the decay ramped from 0 to 0: a zero LR all run
            lambda: schedules.linear_warmup(schedules.polynomial_decay(1.0, 90), 100),
            ValueError,
            r"linear_warmup: the schedule is 0 at the end of the warm-up \(epoch 100\).*longer than the schedule",
        ),
        (
            lambda: schedules.constant_warmup(schedules.cosine_decay(1.0, 90), 90, 0.1),
            ValueError,
            r"constant_warmup: the schedule is 0 at the end of the warm-up \(epoch 90\)",
        ),
        (
            lambda: schedules.constant_warmup(schedules.constant(1.0), 5, -0.1),
            ValueError,
            "warmup_value must be >= 0",
        ),
        (
            lambda: schedules.join_schedules([schedules.constant(1.0)], [5]),
            ValueError,
            "one more schedule than boundaries, got 1 schedules and 1 boundaries",
        ),
        (
            lambda: schedules.join_schedules([schedules.constant(1.0), 2.0], [5]),
            TypeError,
            r"schedules\[1\] must be a schedule",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_a_clear_message(build, error, match):
  with pytest.raises(error, match=match):
    build()
