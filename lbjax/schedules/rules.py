"""Scaling rules by the names configs use, all with one signature.

`config.scaling.rule = "legw"` is `lbjax.schedules.rules.legw`. Every rule maps a baseline recipe
(batch size, peak learning rate, warm-up epochs) to the recipe for `batch_size`, `k = batch_size /
base_batch_size`:

  none:   LR and warm-up unchanged
  linear: LR x k, warm-up unchanged                       (papers/001 §2.3)
  sqrt:   LR x sqrt(k), warm-up unchanged                 (papers/001 §2.3)
  goyal:  LR x k, a fixed 5-epoch warm-up (Goyal et al. 2017; papers/001 Figure 1's comparison)
  legw:   LR x sqrt(k), warm-up epochs x k                (papers/001 §3)

A rule of one's own has the same signature (keyword options after `*` come from `config.scaling`)
and returns a `ScaledRecipe`.
"""

from lbjax.schedules import scaling
from lbjax.schedules import validation
from lbjax.schedules.scaling import ScaledRecipe

__all__ = ["goyal", "legw", "linear", "none", "sqrt"]


def none(base_batch_size: int, base_learning_rate: float, base_warmup_epochs: float,
         batch_size: int) -> ScaledRecipe:
  """The baseline recipe at every batch size (its arguments checked as the other rules check them)."""
  validation.check_positive_int("base_batch_size", base_batch_size)
  validation.check_positive_int("batch_size", batch_size)
  return ScaledRecipe(validation.check_positive("base_learning_rate", base_learning_rate),
                      validation.check_non_negative("base_warmup_epochs", base_warmup_epochs))


def linear(base_batch_size: int, base_learning_rate: float, base_warmup_epochs: float,
           batch_size: int) -> ScaledRecipe:
  """Linear scaling: LR x k (`lbjax.schedules.linear_scaling`)."""
  return scaling.linear_scaling(base_batch_size, base_learning_rate, batch_size, warmup_epochs=base_warmup_epochs)


def sqrt(base_batch_size: int, base_learning_rate: float, base_warmup_epochs: float,
         batch_size: int) -> ScaledRecipe:
  """Sqrt scaling: LR x sqrt(k) (`lbjax.schedules.sqrt_scaling`)."""
  return scaling.sqrt_scaling(base_batch_size, base_learning_rate, batch_size, warmup_epochs=base_warmup_epochs)


def goyal(base_batch_size: int, base_learning_rate: float, base_warmup_epochs: float, batch_size: int, *,
          warmup_epochs: float = scaling.GOYAL_WARMUP_EPOCHS) -> ScaledRecipe:
  """Goyal et al.: LR x k with a fixed gradual warm-up (5 epochs) that replaces the baseline's."""
  validation.check_non_negative("base_warmup_epochs", base_warmup_epochs)  # replaced, but not a bad one
  return scaling.goyal_scaling(base_batch_size, base_learning_rate, batch_size, warmup_epochs=warmup_epochs)


def legw(base_batch_size: int, base_learning_rate: float, base_warmup_epochs: float,
         batch_size: int) -> ScaledRecipe:
  """LEGW: LR x sqrt(k), warm-up epochs x k (`lbjax.schedules.legw`); needs a baseline warm-up > 0."""
  return scaling.legw(base_batch_size, base_learning_rate, base_warmup_epochs, batch_size)
