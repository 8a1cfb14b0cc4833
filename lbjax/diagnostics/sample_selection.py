"""Discarding small-loss samples, papers/003 (Gao & Zhong) §3.1, Figures 9-10.

The paper drops the p% of a batch's samples with the smallest per-sample loss (p = 30% for the
first 100 epochs in its AlexNet/CIFAR-10 runs) to enlarge the gradient, which large batches shrink
as 1/sqrt(n) (eq. 4). Here that is a per-sample weight vector: the training loss becomes
sum_k m_k loss_k / sum_k m_k, i.e. the mean over the kept samples.
"""

import math

import jax
import jax.numpy as jnp


def kept_examples(batch: int, discard_fraction: float) -> int:
  """How many of a batch's `batch` samples `small_loss_discard_weights` keeps: B - floor(p * B). The
  gradient of the loss is a mean over these, so the noise scale counts them as its batch. p * B is rounded to 9
  decimals first: 0.29 * 100 is 28.999999999999996 in floating point, and p = 0.29 drops 29 of 100."""
  return batch - math.floor(round(discard_fraction * batch, 9))


def small_loss_discard_weights(per_example_loss: jax.Array, discard_fraction: float) -> jax.Array:
  """0/1 weights that drop the floor(p * B) smallest-loss samples of a batch. Jittable.

  Ties are broken by position (stable sort). Weights carry no gradient (the selection is a
  constant of the step, as in the paper).

  Args:
    per_example_loss: shape [B], the loss of each sample computed alone.
    discard_fraction: p in [0, 1); the paper uses 0.3.

  Returns:
    float32 weights of shape [B] with exactly B - floor(p * B) ones.
  """
  if jnp.ndim(per_example_loss) != 1:
    raise ValueError(
        "small_loss_discard_weights: per_example_loss must have shape [batch], got shape "
        f"{jnp.shape(per_example_loss)}; compute the loss per sample without reducing it.")
  if isinstance(discard_fraction, bool) or not 0.0 <= discard_fraction < 1.0:
    raise ValueError(
        "small_loss_discard_weights: discard_fraction must be in [0, 1), got "
        f"{discard_fraction!r}.")
  batch = jnp.shape(per_example_loss)[0]
  num_discard = batch - kept_examples(batch, discard_fraction)
  order = jnp.argsort(jax.lax.stop_gradient(per_example_loss), stable=True)
  rank = jnp.empty((batch,), jnp.int32).at[order].set(jnp.arange(batch, dtype=jnp.int32))
  return (rank >= num_discard).astype(jnp.float32)
