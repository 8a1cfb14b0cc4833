"""Scaling rules: from a baseline recipe (batch size, learning rate, warm-up) to another batch size.

For `k = batch_size / base_batch_size` (k > 1 scales up, k < 1 scales down):

* linear scaling (papers/001 §2.3, Krizhevsky): lr * k, warm-up unchanged;
* sqrt scaling (papers/001 §2.3, keeps the gradient variance constant): lr * sqrt(k), warm-up
  unchanged;
* Goyal et al. (as compared against in papers/001 Figure 1 and §3.1): linear scaling with a fixed
  5-epoch gradual warm-up;
* LEGW, linear-epoch gradual warm-up (papers/001 §3, §3.3): lr * sqrt(k), warm-up epochs * k.

Each returns a `ScaledRecipe(learning_rate, warmup_epochs)`; the warm-up is in epochs and is meant
for `lbjax.schedules.linear_warmup` / `warmup_polynomial_decay`.
"""

import math
from typing import NamedTuple

from lbjax.schedules import validation

GOYAL_WARMUP_EPOCHS = 5.0
"""Warm-up epochs of Goyal et al. (papers/001 §3.1: "set the warmup length at five epochs")."""


class ScaledRecipe(NamedTuple):
  """A learning rate and a warm-up length (epochs) for one batch size."""

  learning_rate: float
  warmup_epochs: float


def _batch_ratio(base_batch_size: int, batch_size: int) -> float:
  base_batch_size = validation.check_positive_int("base_batch_size", base_batch_size)
  batch_size = validation.check_positive_int("batch_size", batch_size)
  return batch_size / base_batch_size


def linear_scaling(
    base_batch_size: int,
    base_learning_rate: float,
    batch_size: int,
    *,
    warmup_epochs: float = 0.0,
) -> ScaledRecipe:
  """Linear scaling rule: `lr = base_lr * k`, `k = batch_size / base_batch_size` (papers/001 §2.3).

  Args:
    base_batch_size: batch size of the baseline recipe, a positive int.
    base_learning_rate: learning rate of the baseline recipe, > 0.
    batch_size: the batch size to scale to, a positive int.
    warmup_epochs: warm-up length, returned unchanged, >= 0.

  Returns:
    `ScaledRecipe(base_learning_rate * k, warmup_epochs)`.
  """
  k = _batch_ratio(base_batch_size, batch_size)
  base_learning_rate = validation.check_positive("base_learning_rate", base_learning_rate)
  warmup_epochs = validation.check_non_negative("warmup_epochs", warmup_epochs)
  return ScaledRecipe(base_learning_rate * k, warmup_epochs)


def sqrt_scaling(
    base_batch_size: int,
    base_learning_rate: float,
    batch_size: int,
    *,
    warmup_epochs: float = 0.0,
) -> ScaledRecipe:
  """Sqrt scaling rule: `lr = base_lr * sqrt(k)`, `k = batch_size / base_batch_size` (§2.3, 001).

  Args:
    base_batch_size: batch size of the baseline recipe, a positive int.
    base_learning_rate: learning rate of the baseline recipe, > 0.
    batch_size: the batch size to scale to, a positive int.
    warmup_epochs: warm-up length, returned unchanged, >= 0.

  Returns:
    `ScaledRecipe(base_learning_rate * sqrt(k), warmup_epochs)`.
  """
  k = _batch_ratio(base_batch_size, batch_size)
  base_learning_rate = validation.check_positive("base_learning_rate", base_learning_rate)
  warmup_epochs = validation.check_non_negative("warmup_epochs", warmup_epochs)
  return ScaledRecipe(base_learning_rate * math.sqrt(k), warmup_epochs)


def goyal_scaling(
    base_batch_size: int,
    base_learning_rate: float,
    batch_size: int,
    *,
    warmup_epochs: float = GOYAL_WARMUP_EPOCHS,
) -> ScaledRecipe:
  """Goyal et al. recipe: linear scaling plus a fixed gradual warm-up of 5 epochs at every batch.

  This is the "Goyal et al" curve of papers/001 Figure 1 (e.g. base 256 / lr 0.1 gives lr 3.2 at
  B=8K, 5 warm-up epochs).

  Args:
    base_batch_size: batch size of the baseline recipe, a positive int.
    base_learning_rate: learning rate of the baseline recipe, > 0.
    batch_size: the batch size to scale to, a positive int.
    warmup_epochs: the fixed warm-up length, 5 in Goyal et al.

  Returns:
    `ScaledRecipe(base_learning_rate * k, warmup_epochs)`.
  """
  return linear_scaling(
      base_batch_size, base_learning_rate, batch_size, warmup_epochs=warmup_epochs
  )


def legw(
    base_batch_size: int,
    base_learning_rate: float,
    base_warmup_epochs: float,
    batch_size: int,
) -> ScaledRecipe:
  """LEGW, linear-epoch gradual warm-up (papers/001 §3, §3.3, Table 1).

  For `k = batch_size / base_batch_size`, in either direction:

    learning_rate = base_learning_rate * sqrt(k)    (sqrt scaling)
    warmup_epochs = base_warmup_epochs * k          (linear-epoch warm-up)

  From the B=1K row of Table 1 (lr 2^2.5, 0.3125 warm-up epochs) this gives every other row, e.g.
  B=32K: lr 2^5.0, 10 warm-up epochs; and from the 32K row back down to 1K.

  Args:
    base_batch_size: batch size of the tuned baseline, a positive int.
    base_learning_rate: its peak learning rate, > 0.
    base_warmup_epochs: its warm-up length in epochs, > 0 (a zero warm-up stays zero at every
      batch size, which is not LEGW).
    batch_size: the batch size to scale to, a positive int.

  Returns:
    `ScaledRecipe(learning_rate, warmup_epochs)` for `batch_size`.
  """
  k = _batch_ratio(base_batch_size, batch_size)
  base_learning_rate = validation.check_positive("base_learning_rate", base_learning_rate)
  base_warmup_epochs = validation.check_positive("base_warmup_epochs", base_warmup_epochs)
  return ScaledRecipe(base_learning_rate * math.sqrt(k), base_warmup_epochs * k)
