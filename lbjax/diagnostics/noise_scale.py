"""Gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al. 2018, appendix A.1).

G is the true gradient and Sigma the per-example gradient covariance. A batch-B gradient G_B has
E|G_B|^2 = |G|^2 + tr(Sigma)/B, so the squared norms at two batch sizes B_small < B_big give
unbiased estimates of both terms:

  |G|^2     ~ (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small),
  tr(Sigma) ~ (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big).

In an accumulating step, G_small is a micro-batch gradient (or the mean of the micro-batch squared
norms, still unbiased) and G_big the accumulated gradient. A single step is noisy and its ratio is
biased, so, as the paper recommends, average numerator and denominator separately (EMA) and divide
the averages: `ema = noise_scale_ema(decay)`, then `simple_noise_scale(ema.value(state))`.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


class NoiseScaleEstimate(NamedTuple):
  """Unbiased one-step estimates of |G|^2 and tr(Sigma) (either may be negative in one step)."""

  grad_norm_sq: jax.Array
  trace_sigma: jax.Array


class NoiseScaleEMAState(NamedTuple):
  """Exponential moving averages of the two estimates, with the step count for debiasing."""

  grad_norm_sq: jax.Array
  trace_sigma: jax.Array
  count: jax.Array


def _check_batch_sizes(small_batch: int, big_batch: int) -> None:
  for name, b in (("small_batch", small_batch), ("big_batch", big_batch)):
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
      raise ValueError(f"noise_scale_estimates: {name} must be a positive int, got {b!r}.")
  if big_batch <= small_batch:
    raise ValueError(
        f"noise_scale_estimates: big_batch ({big_batch}) must be larger than small_batch "
        f"({small_batch}); the estimates divide by B_big - B_small.")


def noise_scale_estimates(
    small_grad_norm_sq: ArrayLike,
    big_grad_norm_sq: ArrayLike,
    small_batch: int | jax.Array,
    big_batch: int | jax.Array,
) -> NoiseScaleEstimate:
  """Unbiased estimates of |G|^2 and tr(Sigma) from gradients at two batch sizes. Jittable.

  McCandlish et al. (2018) appendix A.1:
    |G|^2     = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
    tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)

  Args:
    small_grad_norm_sq: |G_small|^2, squared global norm of a gradient over small_batch examples
      (e.g. `optax.tree.norm(g, squared=True)`).
    big_grad_norm_sq: |G_big|^2, the same over big_batch examples.
    small_batch: B_small, a Python int (checked) or a traced integer scalar.
    big_batch: B_big > B_small, a Python int (checked) or a traced integer scalar, e.g. the
      micro-batch count times the micro-batch in a step whose count is a traced value; there the
      caller ensures B_big > B_small (the estimates are inf/nan otherwise).

  Returns:
    `NoiseScaleEstimate(grad_norm_sq, trace_sigma)`.
  """
  if not isinstance(small_batch, jax.Array) and not isinstance(big_batch, jax.Array):
    _check_batch_sizes(small_batch, big_batch)
  small_batch = jnp.asarray(small_batch, jnp.float32)
  big_batch = jnp.asarray(big_batch, jnp.float32)
  g_small = jnp.asarray(small_grad_norm_sq, jnp.float32)
  g_big = jnp.asarray(big_grad_norm_sq, jnp.float32)
  grad_norm_sq = (big_batch * g_big - small_batch * g_small) / (big_batch - small_batch)
  trace_sigma = (g_small - g_big) / (1.0 / small_batch - 1.0 / big_batch)
  return NoiseScaleEstimate(grad_norm_sq, trace_sigma)


def simple_noise_scale(estimate: NoiseScaleEstimate) -> jax.Array:
  """B_simple = tr(Sigma)/|G|^2; +inf where the |G|^2 estimate is not positive."""
  g2 = estimate.grad_norm_sq
  return jnp.where(g2 > 0, estimate.trace_sigma / jnp.where(g2 > 0, g2, 1.0), jnp.inf)


class NoiseScaleEMA(NamedTuple):
  """Pure functions of an EMA of the noise-scale estimates (see `noise_scale_ema`)."""

  init: Callable[[], NoiseScaleEMAState]
  update: Callable[[NoiseScaleEMAState, NoiseScaleEstimate], NoiseScaleEMAState]
  value: Callable[[NoiseScaleEMAState], NoiseScaleEstimate]


def noise_scale_ema(decay: float = 0.99) -> NoiseScaleEMA:
  """EMA of |G|^2 and tr(Sigma) taken separately, for B_simple as a ratio of averages.

  update: m <- decay*m + (1 - decay)*x for each of the two estimates (numerator and denominator
  of B_simple averaged separately, as McCandlish et al. recommend); value: the debiased averages
  m / (1 - decay^count), zero before the first update. Use
  `simple_noise_scale(ema.value(state))`. All three functions are jittable.

  Args:
    decay: in [0, 1); 0 keeps only the last estimate.

  Returns:
    `NoiseScaleEMA(init, update, value)`.
  """
  if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
    raise ValueError(f"noise_scale_ema: decay must be a float in [0, 1), got {decay!r}.")

  def init() -> NoiseScaleEMAState:
    zero = jnp.zeros((), jnp.float32)
    return NoiseScaleEMAState(zero, zero, jnp.zeros((), jnp.int32))

  def update(state: NoiseScaleEMAState, estimate: NoiseScaleEstimate) -> NoiseScaleEMAState:
    mix = lambda m, x: decay * m + (1.0 - decay) * jnp.asarray(x, jnp.float32)
    return NoiseScaleEMAState(
        mix(state.grad_norm_sq, estimate.grad_norm_sq),
        mix(state.trace_sigma, estimate.trace_sigma),
        state.count + 1,
    )

  def value(state: NoiseScaleEMAState) -> NoiseScaleEstimate:
    correction = 1.0 - jnp.float32(decay) ** state.count
    safe = jnp.where(state.count > 0, correction, 1.0)
    return NoiseScaleEstimate(state.grad_norm_sq / safe, state.trace_sigma / safe)

  return NoiseScaleEMA(init, update, value)
