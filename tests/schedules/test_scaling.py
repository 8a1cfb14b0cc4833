"""Scaling rules: LEGW reproduces Table 1 of papers/001; linear, sqrt and Goyal et al. rules."""

import math

import pytest

from lbjax import schedules
from lbjax.schedules import rules

# papers/001 Table 1 (ResNet-50, LARS, poly power 2, 90 epochs): batch, log2(init LR), warm-up.
TABLE_1 = [
    (32768, 5.0, 10.0),
    (16384, 4.5, 5.0),
    (8192, 4.0, 2.5),
    (4096, 3.5, 1.25),
    (2048, 3.0, 0.625),
    (1024, 2.5, 0.3125),
]


@pytest.mark.parametrize("batch_size, log2_lr, warmup_epochs", TABLE_1)
def test_legw_reproduces_table_1_from_the_1k_row(batch_size, log2_lr, warmup_epochs):
  recipe = schedules.legw(1024, 2**2.5, 0.3125, batch_size)
  assert isinstance(recipe, schedules.ScaledRecipe)
  assert math.log2(recipe.learning_rate) == pytest.approx(log2_lr, abs=1e-12)
  assert recipe.learning_rate == pytest.approx(2**log2_lr, rel=1e-12)
  assert recipe.warmup_epochs == warmup_epochs  # Exact: 0.3125 * 2^j is a binary fraction.


@pytest.mark.parametrize("batch_size, log2_lr, warmup_epochs", TABLE_1)
def test_legw_scales_down_from_the_32k_row(batch_size, log2_lr, warmup_epochs):
  """papers/001 §3.3: tune at 32K, then divide the LR by sqrt(k) and the warm-up by k."""
  learning_rate, warmup = schedules.legw(32768, 2**5.0, 10.0, batch_size)
  assert learning_rate == pytest.approx(2**log2_lr, rel=1e-12)
  assert warmup == warmup_epochs


def test_linear_and_sqrt_scaling():
  assert schedules.linear_scaling(128, 0.01, 8192) == pytest.approx((0.64, 0.0))
  assert schedules.sqrt_scaling(128, 0.01, 8192) == pytest.approx((0.08, 0.0))
  assert schedules.sqrt_scaling(512, 0.4, 128, warmup_epochs=2.0) == pytest.approx((0.2, 2.0))
  assert schedules.linear_scaling(512, 0.4, 128).learning_rate == pytest.approx(0.1)


def test_goyal_recipe_is_linear_scaling_with_five_warmup_epochs():
  """Goyal et al. (papers/001 §3.1, Figure 1): 0.1 * B/256 and 5 warm-up epochs; 3.2 at 8K."""
  recipe = schedules.goyal_scaling(256, 0.1, 8192)
  assert recipe.learning_rate == pytest.approx(3.2, rel=1e-12)
  assert recipe.warmup_epochs == schedules.GOYAL_WARMUP_EPOCHS == 5.0


def test_legw_and_linear_agree_on_warmup_only_at_the_base_batch():
  assert schedules.legw(1024, 5.0, 0.5, 1024) == (5.0, 0.5)
  assert schedules.legw(1024, 5.0, 0.5, 4096) == (10.0, 2.0)


@pytest.mark.parametrize(
    "build, error, match",
    [
        (
            lambda: schedules.legw(1024, 5.0, 0.3125, 2048.0),
            TypeError,
            "batch_size must be a positive integer",
        ),
        (
            lambda: schedules.legw(1024, 5.0, 0.3125, 0),
            ValueError,
            "batch_size must be a positive integer, got 0",
        ),
        (
            lambda: schedules.legw(-1024, 5.0, 0.3125, 2048),
            ValueError,
            "base_batch_size must be a positive",
        ),
        (
            lambda: schedules.legw(1024, 0.0, 0.3125, 2048),
            ValueError,
            "base_learning_rate must be > 0",
        ),
        (
            lambda: schedules.legw(1024, 5.0, 0.0, 2048),
            ValueError,
            "base_warmup_epochs must be > 0",
        ),
        (
            lambda: schedules.legw(True, 5.0, 0.3125, 2048),
            TypeError,
            "base_batch_size must be a positive integer",
        ),
        (
            lambda: schedules.linear_scaling(256, -0.1, 512),
            ValueError,
            "base_learning_rate must be > 0",
        ),
        (
            lambda: schedules.sqrt_scaling(256, 0.1, 512, warmup_epochs=-1),
            ValueError,
            "warmup_epochs must be >= 0",
        ),
        (
            lambda: schedules.goyal_scaling(256, 0.1, 0.5),
            TypeError,
            "batch_size must be a positive integer",
        ),
    ],
)
def test_invalid_arguments_are_refused_with_a_clear_message(build, error, match):
  with pytest.raises(error, match=match):
    build()


def test_warmup_is_keyword_only_for_linear_and_sqrt_scaling():
  """Positional order differs from legw; a legw-style call must fail instead of mis-binding."""
  with pytest.raises(TypeError):
    schedules.linear_scaling(1024, 5.0, 0.3125, 2048)


@pytest.mark.parametrize("rule", rules.__all__)
@pytest.mark.parametrize(
    "args, error, match",
    [
        ((0, 0.1, 1.0, 1024), ValueError, "base_batch_size must be a positive integer, got 0"),
        ((256, 0.1, 1.0, 0), ValueError, "batch_size must be a positive integer, got 0"),
        ((256, 0.1, 1.0, 1024.0), TypeError, "batch_size must be a positive integer"),
        ((256, -0.1, 1.0, 1024), ValueError, "base_learning_rate must be > 0"),
        ((256, 0.1, -1.0, 1024), ValueError, "warmup_epochs must be"),
    ],
    ids=["base_batch_size", "batch_size", "float_batch_size", "learning_rate", "warmup"],
)
def test_every_rule_refuses_a_bad_baseline(rule, args, error, match):
  """`none` returned a negative LR and warm-up unchecked; `goyal` dropped a negative warm-up."""
  with pytest.raises(error, match=match):
    getattr(rules, rule)(*args)
