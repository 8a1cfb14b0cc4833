"""Classification and language-model losses and metrics, with optional 0/1 masks.

For logits z [..., K] and integer labels y [...]:

  ce(z, y)  = logsumexp(z) - z[y]                          (per example / per token)
  loss      = sum(mask * ce) / sum(mask)                   (mean over unmasked entries)
  accuracy  = sum(mask * [argmax z == y]) / sum(mask)
  perplexity = exp(mean cross-entropy)                     (papers/001 §5.1.2)

Masks let an evaluator pad its last batch: masked entries are excluded with `jnp.where`, so even a
non-finite value in a padded row cannot leak into the result, and the sums over unmasked entries are
exactly those of the unpadded batch. Everything is computed in float32. With an all-zero mask the
mean is taken over max(sum(mask), 1) entries, i.e. it is 0.
"""

import jax
import jax.numpy as jnp


def _check(logits: jax.Array, labels: jax.Array, mask: jax.Array | None, name: str) -> None:
  logits_shape = getattr(logits, "shape", None)
  labels_shape = getattr(labels, "shape", None)
  if logits_shape is None or len(logits_shape) < 2:
    raise ValueError(f"{name} expects logits of shape [N, K] or [N, T, K], got shape "
                     f"{logits_shape}.")
  if labels_shape != logits_shape[:-1]:
    raise ValueError(f"{name} expects labels of shape {list(logits_shape[:-1])} (logits shape "
                     f"without the class axis), got shape {labels_shape}.")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"{name} expects integer class labels, got dtype {labels.dtype}; pass class "
                     "ids, not one-hot vectors or floats.")
  if mask is not None and getattr(mask, "shape", None) != labels_shape:
    raise ValueError(f"{name} expects a mask of the labels' shape {list(labels_shape)}, got shape "
                     f"{getattr(mask, 'shape', None)}.")


def _masked_mean(values: jax.Array, mask: jax.Array | None) -> jax.Array:
  if mask is None:
    return jnp.mean(values)
  keep = mask.astype(jnp.float32) > 0
  total = jnp.sum(jnp.where(keep, values, 0.0))
  return total / jnp.maximum(jnp.sum(keep.astype(jnp.float32)), 1.0)


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """logsumexp(z) - z[y] in float32 as `optax.softmax_cross_entropy_with_integer_labels` (its values bit
  for bit, its gradient to float32 rounding), with z[y] picked by comparing each class index with y
  where optax gathers it (`take_along_axis`): the gather's gradient is a scatter-add into a zeroed
  [..., K] buffer, which XLA runs with atomics on GPUs (or, under `config.deterministic`, in a slower
  deterministic form), while the comparison's is a select fused with the softmax's. A label outside
  [0, K) gives NaN, so that the trainer stops at it (optax's gather gives NaN for y >= K but wraps a
  negative y around to class K + y)."""
  logits = logits.astype(jnp.float32)
  classes = logits.shape[-1]
  picked = jnp.sum(jnp.where(jnp.arange(classes) == labels[..., None], logits, 0.0), axis=-1)
  picked = jnp.where((labels >= 0) & (labels < classes), picked, jnp.nan)
  return jax.nn.logsumexp(logits, axis=-1) - picked


def per_example_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """ce = logsumexp(z) - z[y] in float32, shape [N] (or [N, T] for sequences)."""
  _check(logits, labels, None, "per_example_cross_entropy")
  return _cross_entropy(logits, labels)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array,
                          mask: jax.Array | None = None) -> jax.Array:
  """Mean cross-entropy over the (unmasked) examples or tokens: sum(mask*ce)/sum(mask)."""
  _check(logits, labels, mask, "softmax_cross_entropy")
  return _masked_mean(_cross_entropy(logits, labels), mask)


def accuracy(logits: jax.Array, labels: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Fraction of (unmasked) entries whose argmax equals the label (ties: first maximum)."""
  _check(logits, labels, mask, "accuracy")
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return _masked_mean(correct, mask)


def perplexity(mean_cross_entropy: jax.Array | float) -> jax.Array:
  """exp(mean cross-entropy in nats), the PTB metric of papers/001 §5.1.2."""
  return jnp.exp(jnp.asarray(mean_cross_entropy, jnp.float32))
