"""The noise scale of papers/002 and the rule B proportional to eps / (1 - m)."""

import pytest

from lbjax import schedules


def test_noise_scale_formulas():
  """g = eps N / (B (1 - m)) and the exact g = eps / (1 - m) (N/B - 1)."""
  assert schedules.effective_learning_rate(0.1, 0.9) == pytest.approx(1.0)
  assert schedules.noise_scale(0.1, 128, 50000, momentum=0.9) == pytest.approx(50000 / 128)
  assert schedules.exact_noise_scale(0.1, 128, 50000, momentum=0.9) == pytest.approx(
      50000 / 128 - 1
  )
  assert schedules.noise_scale(0.1, 100, 1000) == pytest.approx(1.0)
  assert schedules.exact_noise_scale(0.1, 1000, 1000) == 0.0  # Full batch: no noise.


def test_approximate_noise_scale_is_the_small_batch_limit():
  exact = schedules.exact_noise_scale(0.1, 32, 1_281_167, 0.9)
  approx = schedules.noise_scale(0.1, 32, 1_281_167, 0.9)
  assert approx - exact == pytest.approx(0.1 / (1 - 0.9))
  assert exact / approx == pytest.approx(1 - 32 / 1_281_167)


def test_noise_preserving_batch_size_follows_papers_002():
  """CIFAR-10 schedules of papers/002: B=128 at eps 0.1, m 0.9; 640 at eps 0.5; 3200 at m 0.98."""
  assert schedules.noise_preserving_batch_size(128, 0.1, 0.5, 0.9, 0.9) == 640
  assert schedules.noise_preserving_batch_size(128, 0.1, 0.5, 0.9, 0.98) == 3200
  assert schedules.noise_preserving_batch_size(640, 0.5, 0.1, 0.9, 0.9) == 128
  for base, new in [((128, 0.1, 0.9), (640, 0.5, 0.9)), ((128, 0.1, 0.9), (3200, 0.5, 0.98))]:
    assert schedules.noise_scale(base[1], base[0], 50000, base[2]) == pytest.approx(
        schedules.noise_scale(new[1], new[0], 50000, new[2])
    )


@pytest.mark.parametrize(
    "build, error, match",
    [
        (
            lambda: schedules.noise_scale(0.1, 128, 50000, momentum=1.0),
            ValueError,
            r"0 <= momentum < 1",
        ),
        (
            lambda: schedules.noise_scale(0.1, 128, 50000, momentum=-0.1),
            ValueError,
            r"0 <= momentum < 1",
        ),
        (lambda: schedules.noise_scale(0.0, 128, 50000), ValueError, "learning_rate must be > 0"),
        (
            lambda: schedules.noise_scale(0.1, 128.0, 50000),
            TypeError,
            "batch_size must be a positive integer",
        ),
        (
            lambda: schedules.exact_noise_scale(0.1, 60000, 50000),
            ValueError,
            r"batch_size \(60000\) must not exceed num_train_examples \(50000\)",
        ),
        (
            lambda: schedules.noise_scale(0.1, 128, 0),
            ValueError,
            "num_train_examples must be a positive integer",
        ),
        (lambda: schedules.noise_preserving_batch_size(2, 1.0, 0.1), ValueError, "rounds to 0"),
        (
            lambda: schedules.effective_learning_rate(0.1, float("nan")),
            ValueError,
            "momentum must be finite",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_a_clear_message(build, error, match):
  with pytest.raises(error, match=match):
    build()
