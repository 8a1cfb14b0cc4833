"""Epoch schedules: values at the points the papers state, host vs jit agreement, validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import schedules

LEGW_1K_LR = 2**2.5  # papers/001 §3.2 and Table 1, B=1K.


def test_constant_is_the_same_at_every_epoch():
  schedule = schedules.constant(0.05)
  assert [schedule(e) for e in (0, 3.5, 25)] == [0.05, 0.05, 0.05]


def test_polynomial_decay_is_algorithm_1_of_papers_000():
  """gamma_t = gamma_0 * (1 - t/T)^2: full at 0, a quarter at T/2, zero at T and after."""
  schedule = schedules.polynomial_decay(LEGW_1K_LR, total_epochs=90)
  assert schedule(0) == LEGW_1K_LR
  assert schedule(45) == pytest.approx(LEGW_1K_LR / 4, rel=1e-12)
  assert schedule(30) == pytest.approx(LEGW_1K_LR * (1 - 30 / 90) ** 2, rel=1e-12)
  assert schedule(90) == 0.0
  assert schedule(120) == 0.0


def test_polynomial_decay_with_begin_epoch_and_end_value():
  schedule = schedules.polynomial_decay(1.0, 12, power=1.0, end_value=0.2, begin_epoch=2)
  assert schedule(0) == 1.0
  assert schedule(2) == 1.0
  assert schedule(7) == pytest.approx(0.6, rel=1e-12)
  assert schedule(12) == pytest.approx(0.2, rel=1e-12)


def test_multistep_decay_is_the_legw_multistep_recipe():
  """papers/001 §3.2, Figure 2.1: x0.1 at epochs 30, 60, 80 (a boundary starts the new piece)."""
  schedule = schedules.multistep_decay(LEGW_1K_LR, (30, 60, 80), 0.1)
  expected = {0: 1.0, 29.99: 1.0, 30: 0.1, 59.5: 0.1, 60: 0.01, 80: 0.001, 90: 0.001}
  for epoch, factor in expected.items():
    assert schedule(epoch) == pytest.approx(LEGW_1K_LR * factor, rel=1e-12), epoch


def test_multistep_decay_with_one_factor_per_boundary_and_no_boundary():
  schedule = schedules.multistep_decay(1.0, (10, 20), (0.5, 0.2))
  assert [schedule(e) for e in (5, 10, 25)] == pytest.approx([1.0, 0.5, 0.1], rel=1e-12)
  assert schedules.multistep_decay(0.3, ())(50) == 0.3


def test_exponential_decay_is_the_ptb_recipe():
  """papers/001 §5.1.2: constant for 7 epochs, then halved after each epoch, 13 epochs."""
  schedule = schedules.exponential_decay(1.0, decay_begin_epoch=7, decay_factor=0.5)
  assert schedule(0) == 1.0
  assert schedule(6.999) == 1.0
  assert schedule(7) == 0.5
  assert schedule(7.5) == 0.5
  assert schedule(8) == 0.25
  assert schedule(12.5) == 1 / 64


def test_cosine_decay_values():
  schedule = schedules.cosine_decay(2.0, total_epochs=10, end_value=0.5)
  assert schedule(0) == 2.0
  assert schedule(5) == pytest.approx(1.25, rel=1e-12)
  assert schedule(10) == pytest.approx(0.5, rel=1e-12)
  assert schedule(11) == pytest.approx(0.5, rel=1e-12)


def _all_schedules():
  return {
      "constant": schedules.constant(0.1),
      "poly": schedules.polynomial_decay(3.0, 90),
      "multistep": schedules.multistep_decay(3.0, (30, 60, 80), 0.1),
      "exponential": schedules.exponential_decay(1.0, 7, 0.5),
      "cosine": schedules.cosine_decay(1.0, 90, begin_epoch=5),
      "legw_32k": schedules.warmup_polynomial_decay(2**5, 10, 90),
      "poly_from_0": schedules.warmup_polynomial_decay(
          2**5, 10, 90, decay_from_warmup_end=False
      ),
      "constant_warmup": schedules.constant_warmup(schedules.constant(1.0), 5, 0.1),
  }


def test_host_jit_and_array_evaluation_agree():
  """Floats on the host, jnp scalars inside jit and NumPy arrays all give the same values."""
  epochs = np.array([0.0, 0.5, 4.0, 6.5, 7.0, 10.0, 29.0, 30.0, 45.0, 61.0, 80.0, 89.0, 95.0])
  for name, schedule in _all_schedules().items():
    host = np.array([schedule(float(e)) for e in epochs])
    assert all(isinstance(schedule(float(e)), float) for e in epochs[:2]), name
    jitted = jax.jit(jax.vmap(schedule))(jnp.asarray(epochs, jnp.float32))
    assert isinstance(jitted, jax.Array)
    np.testing.assert_allclose(np.asarray(jitted), host, rtol=2e-6, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(schedule(epochs), host, rtol=1e-12, err_msg=name)


def test_integer_jax_epochs_are_evaluated_in_float():
  value = schedules.polynomial_decay(1.0, 4)(jnp.asarray(2, jnp.int32))
  assert value.dtype == jnp.float32
  assert float(value) == 0.25


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: schedules.constant(-1.0), ValueError, "value must be >= 0"),
        (lambda: schedules.constant("0.1"), TypeError, "value must be a real number"),
        (lambda: schedules.polynomial_decay(1.0, 0), ValueError, "total_epochs must be > 0"),
        (lambda: schedules.polynomial_decay(1.0, 10, power=0), ValueError, "power must be > 0"),
        (
            lambda: schedules.polynomial_decay(1.0, 10, begin_epoch=10),
            ValueError,
            r"begin_epoch \(10.0\) must be before total_epochs \(10.0\)",
        ),
        (lambda: schedules.polynomial_decay(float("nan"), 10), ValueError, "must be finite"),
        (
            lambda: schedules.multistep_decay(1.0, (30, 30), 0.1),
            ValueError,
            "boundaries must be strictly increasing, got 30.0 followed by 30.0",
        ),
        (
            lambda: schedules.multistep_decay(1.0, (0, 30), 0.1),
            ValueError,
            r"boundaries must be epochs > 0",
        ),
        (lambda: schedules.multistep_decay(1.0, 30, 0.1), TypeError, "sequence of epochs"),
        (
            lambda: schedules.multistep_decay(1.0, (30, 60), (0.1,)),
            ValueError,
            r"one factor per boundary \(2\), got 1",
        ),
        (
            lambda: schedules.multistep_decay(1.0, (30,), 0.0),
            ValueError,
            "decay_factors must be > 0",
        ),
        (
            lambda: schedules.exponential_decay(1.0, 7, -0.5),
            ValueError,
            "decay_factor must be > 0",
        ),
        (
            lambda: schedules.exponential_decay(1.0, 7, 0.5, decay_every_epochs=0),
            ValueError,
            "decay_every_epochs must be > 0",
        ),
        (
            lambda: schedules.cosine_decay(1.0, 5, begin_epoch=6),
            ValueError,
            r"begin_epoch \(6.0\) must be before",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_a_clear_message(build, error, match):
  with pytest.raises(error, match=match):
    build()


@pytest.mark.parametrize(
    "epoch, error, match",
    [
        (-0.5, ValueError, "epoch must be finite and >= 0, got -0.5"),
        (float("inf"), ValueError, "epoch must be finite"),
        ("3", TypeError, "epoch must be a real number or an array"),
        (np.array([1.0, -1.0]), ValueError, "epochs must be finite and >= 0"),
    ],
)
def test_invalid_host_epochs_are_refused(epoch, error, match):
  with pytest.raises(error, match=match):
    schedules.polynomial_decay(1.0, 10)(epoch)
