"""Cross-entropy, accuracy and perplexity on hand-computed examples; exact masking."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lbjax.models import accuracy, per_example_cross_entropy, perplexity, softmax_cross_entropy

# Row 0: logits (0, 0), label 0 -> ce = log 2, argmax 0 (first maximum) is correct.
# Row 1: logits (log 3, 0), label 1 -> ce = log(3 + 1) - 0 = log 4, argmax 0 is wrong.
LOGITS = jnp.array([[0.0, 0.0], [math.log(3.0), 0.0]])
LABELS = jnp.array([0, 1])


def test_cross_entropy_and_accuracy_by_hand():
  np.testing.assert_allclose(per_example_cross_entropy(LOGITS, LABELS),
                             [math.log(2.0), math.log(4.0)], rtol=1e-6)
  np.testing.assert_allclose(softmax_cross_entropy(LOGITS, LABELS), 1.5 * math.log(2.0),
                             rtol=1e-6)
  np.testing.assert_allclose(accuracy(LOGITS, LABELS), 0.5)


def test_mask_excludes_padding_exactly_even_if_padding_is_not_finite():
  padded_logits = jnp.concatenate([LOGITS, jnp.full((2, 2), jnp.nan)])
  padded_labels = jnp.concatenate([LABELS, jnp.array([1, 0])])
  mask = jnp.array([1.0, 1.0, 0.0, 0.0])
  np.testing.assert_array_equal(softmax_cross_entropy(padded_logits, padded_labels, mask),
                                softmax_cross_entropy(LOGITS, LABELS))
  np.testing.assert_array_equal(accuracy(padded_logits, padded_labels, mask),
                                accuracy(LOGITS, LABELS))
  # Masking the wrong row leaves only the correct one.
  np.testing.assert_allclose(softmax_cross_entropy(LOGITS, LABELS, jnp.array([1.0, 0.0])),
                             math.log(2.0), rtol=1e-6)
  np.testing.assert_allclose(accuracy(LOGITS, LABELS, jnp.array([1.0, 0.0])), 1.0)
  np.testing.assert_array_equal(softmax_cross_entropy(LOGITS, LABELS, jnp.zeros(2)), 0.0)


def test_sequence_losses_average_over_unmasked_tokens():
  logits = jnp.stack([LOGITS, LOGITS[::-1]])  # [N=2, T=2, K=2]
  labels = jnp.stack([LABELS, LABELS[::-1]])
  assert per_example_cross_entropy(logits, labels).shape == (2, 2)
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0]])
  # Unmasked tokens: log 2, log 4 and (row 1, t 0) = (log 3, 0) with label 1 -> log 4.
  np.testing.assert_allclose(softmax_cross_entropy(logits, labels, mask),
                             (math.log(2.0) + 2 * math.log(4.0)) / 3, rtol=1e-6)
  np.testing.assert_allclose(accuracy(logits, labels, mask), 1.0 / 3.0, rtol=1e-6)


def test_bfloat16_logits_give_float32_losses():
  loss = softmax_cross_entropy(LOGITS.astype(jnp.bfloat16), LABELS)
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, 1.5 * math.log(2.0), rtol=1e-2)


def test_perplexity_is_exp_of_mean_cross_entropy():
  # papers/001 §5.1.2 reports perplexity 115.91 for PTB: that is a cross-entropy of log 115.91.
  np.testing.assert_allclose(perplexity(math.log(115.91)), 115.91, rtol=1e-6)
  np.testing.assert_allclose(perplexity(softmax_cross_entropy(LOGITS, LABELS)),
                             math.sqrt(8.0), rtol=1e-6)  # exp(1.5 log 2) = 2^1.5.
  assert perplexity(jnp.zeros(())).dtype == jnp.float32


@pytest.mark.parametrize("fn", [softmax_cross_entropy, accuracy, per_example_cross_entropy])
def test_validation(fn):
  with pytest.raises(ValueError, match=r"labels of shape \[2\] .*got shape \(3,\)"):
    fn(LOGITS, jnp.array([0, 1, 1]))
  with pytest.raises(ValueError, match="integer class labels"):
    fn(LOGITS, LABELS.astype(jnp.float32))
  with pytest.raises(ValueError, match=r"logits of shape \[N, K\] or \[N, T, K\], got shape \(2,\)"):
    fn(LOGITS[0], LABELS)


@pytest.mark.parametrize("fn", [softmax_cross_entropy, accuracy])
def test_mask_validation(fn):
  with pytest.raises(ValueError, match=r"mask of the labels' shape \[2\], got shape \(2, 1\)"):
    fn(LOGITS, LABELS, jnp.ones((2, 1)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_cross_entropy_is_optaxs(dtype):
  """The label's logit is picked by a comparison, not gathered (no scatter in the gradient): optax's
  value bit for bit, its gradient to float32 rounding (XLA fuses the two differently); a label outside
  [0, K) gives NaN (optax's gather wraps a negative one around)."""
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(6, 5, 11)) * 4, dtype)
  labels = jnp.asarray(rng.integers(0, 11, size=(6, 5)))
  ours = jax.jit(jax.value_and_grad(lambda z: jnp.sum(jnp.sin(per_example_cross_entropy(z, labels)))))
  theirs = jax.jit(jax.value_and_grad(lambda z: jnp.sum(jnp.sin(
      optax.softmax_cross_entropy_with_integer_labels(z.astype(jnp.float32), labels)))))
  (value, gradient), (optax_value, optax_gradient) = ours(logits), theirs(logits)
  np.testing.assert_array_equal(value, optax_value)
  np.testing.assert_allclose(np.asarray(gradient, np.float32), np.asarray(optax_gradient, np.float32), rtol=1e-6,
                             atol=1e-7)
  outside = labels.at[0, 0].set(11).at[1, 1].set(-1)  # optax's gather: NaN and the last class
  ce = per_example_cross_entropy(logits, outside)
  assert np.isnan(ce[0, 0]) and np.isnan(ce[1, 1]) and np.isfinite(ce).sum() == ce.size - 2
