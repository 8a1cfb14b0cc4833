"""The batch size from the measured gradient noise, and what a batch size buys (host-side math).

B_noise = tr(Sigma)/|G|^2 (McCandlish et al. 2018, §2.2, "B_simple") is the batch size at which
the gradient's noise and signal are equal: far below it an update is nearly as good as B examples
apart, far above it extra examples are wasted. From it follow

* the statistical efficiency of batch B against a base batch B0 (Pollux, Qiao et al. 2021, §3.1):

    E(B) = (B_noise + B0) / (B_noise + B),   so E(B0) = 1 and E -> B0/B once B >> B_noise;

* AdaScale's gain (Johnson et al. 2020, §3, Algorithm 1), with S = B/B0 and the B0-batch gradient variance
  sigma^2 = tr(Sigma)/B0:

    r = (sigma^2 + |G|^2) / (sigma^2/S + |G|^2),   1 <= r <= S,   and r = S * E(B);

  one step at batch B is worth r steps at B0 ("scale-invariant iterations"), and AdaScale multiplies
  the base learning rate by r;

* a batch-size policy: the next batch is `multiple * B_noise`, rounded to a whole number of
  micro-batches, clamped to [min, max] and, optionally, never below the current one.

These are host numbers (Python floats): the controller of `lbjax.train.batch_policy` keeps its
moving averages in float64 on the host, so its decisions are JSON-serialisable and resume exactly.

References:
  McCandlish, Kaplan, Amodei et al., "An Empirical Model of Large-Batch Training", 2018, §2.2 and
    appendix A.1.
  Johnson, Agrawal, Gu, Guestrin, "AdaScale SGD: A User-Friendly Algorithm for Distributed
    Training", ICML 2020, §3.
  Qiao, Choe, Subramanya et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized Deep
    Learning", OSDI 2021, §3.1.
"""

import math
from typing import NamedTuple


def _check_positive(name: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ValueError(f"{name} must be a positive number, got {value!r}.")
  return float(value)


class NoiseScaleAverage(NamedTuple):
  """Exponential moving averages of the unbiased |G|^2 and tr(Sigma) estimates (host floats).

  `count` estimates have been folded in; `value()` divides by 1 - decay^count (debiasing), as
  `lbjax.diagnostics.noise_scale_ema` does on the device.
  """

  grad_norm_sq: float = 0.0
  trace_sigma: float = 0.0
  count: int = 0

  def update(self, decay: float, grad_norm_sq: float, trace_sigma: float) -> "NoiseScaleAverage":
    """m <- decay * m + (1 - decay) * x for each estimate (numerator and denominator apart)."""
    mix = lambda m, x: decay * m + (1.0 - decay) * float(x)
    return NoiseScaleAverage(mix(self.grad_norm_sq, grad_norm_sq), mix(self.trace_sigma, trace_sigma),
                             self.count + 1)

  def debiased(self, decay: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) averages, debiased; (0, 0) before the first estimate."""
    if self.count == 0:
      return 0.0, 0.0
    correction = 1.0 - decay**self.count
    return self.grad_norm_sq / correction, self.trace_sigma / correction

  def noise_scale(self, decay: float) -> float:
    """B_noise = tr(Sigma)/|G|^2 of the averages; nan while undetermined: before any estimate, or
    while the |G|^2 average is not positive (the signal is below what the averages resolve, so
    they say nothing about B_noise yet); 0 when the tr(Sigma) average is negative."""
    grad_norm_sq, trace_sigma = self.debiased(decay)
    if self.count == 0 or grad_norm_sq <= 0:
      return math.nan
    return max(trace_sigma, 0.0) / grad_norm_sq


def statistical_efficiency(noise_scale: float, batch_size: int, base_batch_size: int) -> float:
  """E(B) = (B_noise + B0) / (B_noise + B) (Pollux §3.1): progress per example at B relative to B0.

  Args:
    noise_scale: B_noise >= 0 (inf: all noise, E = 1; nan: unknown, returned as nan).
    batch_size: B > 0.
    base_batch_size: B0 > 0.
  """
  _check_positive("batch_size", batch_size)
  _check_positive("base_batch_size", base_batch_size)
  if math.isnan(noise_scale):
    return math.nan
  if math.isinf(noise_scale):
    return 1.0
  return (max(noise_scale, 0.0) + base_batch_size) / (max(noise_scale, 0.0) + batch_size)


def adascale_gain(noise_scale: float, batch_size: int, base_batch_size: int) -> float:
  """AdaScale's gain r = (sigma^2 + |G|^2)/(sigma^2/S + |G|^2) (Johnson et al. §3), S = B/B0.

  With sigma^2 = tr(Sigma)/B0 this is r = S * E(B) = B (B_noise + B0) / (B0 (B_noise + B)); r = 1
  when the noise is unknown (nan), S when the gradient is all noise (inf).
  """
  efficiency = statistical_efficiency(noise_scale, batch_size, base_batch_size)
  if math.isnan(efficiency):
    return 1.0
  return batch_size / base_batch_size * efficiency


def noise_proportional_batch_size(noise_scale: float, *, multiple: float, micro_batch_size: int,
                                  min_batch_size: int, max_batch_size: int, current: int,
                                  never_shrink: bool) -> int:
  """The next batch: `multiple * B_noise` rounded to a multiple of the micro-batch, in [min, max].

  McCandlish et al. (§2.2) find the training time/compute trade-off balanced at B ~ B_noise, so
  `multiple` near 1; a nan noise scale (undetermined) keeps `current`; +inf gives `max`. With
  `never_shrink`, the result is at least `current` (the noise scale grows as the loss falls, and a
  shrinking batch would undo the LR a scaling rule has set).
  """
  _check_positive("multiple", multiple)
  if math.isnan(noise_scale):
    return current
  target = multiple * noise_scale
  rounded = max_batch_size if math.isinf(target) else round(target / micro_batch_size) * micro_batch_size
  chosen = min(max(rounded, min_batch_size), max_batch_size)
  return max(chosen, current) if never_shrink else chosen
