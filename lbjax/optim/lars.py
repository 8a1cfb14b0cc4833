"""LARS: layer-wise adaptive rate scaling (papers/000, Algorithm 1; papers/003, eq. 23)."""

from typing import Any

import jax.numpy as jnp
import optax

from lbjax.optim import layerwise
from lbjax.optim import multi_tensor
from lbjax.optim import validation

DENOMINATORS = ("paper", "optax")


def lars_rate(
    trust_coefficient: Any = 1e-3, eps: Any = 0.0, denominator: str = "paper"
) -> layerwise.SummedRate:
  """The LARS local LR as a `SummedRate` (papers/000 eq. 6 and Algorithm 1; papers/003 eq. 23).

      denominator="paper":  lambda^l = eta * ||w^l|| / (||g^l|| + beta * ||w^l|| + eps)
      denominator="optax":  lambda^l = eta * ||w^l|| / (||g^l + beta * w^l|| + eps)

  The first is the line "compute the local LR" of Algorithm 1 (eq. 6 with weight decay); the second
  is what `optax.lars` computes. With the zero-norm rule of `layerwise.safe_quotient`,
  `lambda^l = eta` when `||w^l|| = 0` or the denominator is 0. Norms are `sqrt(sum_i |x_i|^2)`, so
  complex leaves are measured as real vectors of twice the length.

  Args:
    trust_coefficient: eta.
    eps: added to the denominator.
    denominator: "paper" (Algorithm 1) or "optax".

  Returns:
    A `layerwise.SummedRate` (the sums: `||w||^2` and `||g||^2`, or `||g + beta * w||^2`).

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000 is its ICLR 2018 submission, "Large Batch Training of
      Convolutional Networks with Layer-wise Adaptive Rate Scaling": eq. 4-6, Algorithm 1.)
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 23, LARS as a layer-wise
      curvature radius.)
    optax.lars, google-deepmind/optax, optax/_src/alias.py (the denominator ||g + beta * w||).
  """
  validation.check_positive("trust_coefficient", trust_coefficient)
  validation.check_nonnegative("eps", eps)
  validation.check_choice("denominator", denominator, DENOMINATORS)

  def sums(w, g, weight_decay, layer):
    if denominator == "paper":
      return layer.sum_of_squares(w), layer.sum_of_squares(g)
    return layer.sum_of_squares(w), layer.sum_of_squares(g + weight_decay * w)

  def rate(layer_sums, weight_decay):
    w_squared, d_squared = layer_sums
    w_norm = jnp.sqrt(w_squared)
    if denominator == "paper":
      den = jnp.sqrt(d_squared) + weight_decay * w_norm + eps
    else:
      den = jnp.sqrt(d_squared) + eps
    return trust_coefficient * layerwise.safe_quotient(w_norm, den)

  return layerwise.SummedRate(sums, rate, leaf_local=True)


def scale_by_lars(
    trust_coefficient: Any = 1e-3,
    weight_decay: Any = 0.0,
    eps: Any = 0.0,
    denominator: str = "paper",
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
) -> optax.GradientTransformation:
  """The layer-wise part of LARS on its own: `u^l = lambda^l * (g^l + beta * w^l)` (papers/000
  Algorithm 1: eq. 5 with weight decay).

  `lambda^l` is `lars_rate` (papers/000 Algorithm 1: `eta * ||w|| / (||g|| + beta * ||w||)`).
  Unselected leaves pass through unchanged (no weight decay, no trust ratio). Composes with any optax
  chain; `lars` is `chain(scale_by_lars, scale_by_learning_rate, trace)`.

  Args:
    trust_coefficient: eta (the LARS coefficient), > 0.
    weight_decay: beta, >= 0, applied to selected leaves only.
    eps: added to the trust-ratio denominator, >= 0.
    denominator: "paper" (`||g|| + beta * ||w||`, Algorithm 1) or "optax" (`||g + beta * w||`).
    mask: which leaves get LARS (pytree of bools, callable on params, or regular expression
      on leaf names such as 'kernel$'); default `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.

  Returns:
    An `optax.GradientTransformation`; `trust_ratios(state)` gives the `lambda^l` of the last step.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000 is its ICLR 2018 submission, "Large Batch Training of
      Convolutional Networks with Layer-wise Adaptive Rate Scaling": eq. 4-6, Algorithm 1.)
    optax.lars, google-deepmind/optax, optax/_src/alias.py (the denominator ||g + beta * w||).
  """
  return layerwise.scale_by_layerwise_rate(
      lars_rate(trust_coefficient, eps, denominator),
      weight_decay=weight_decay,
      mask=mask,
      stacked=stacked,
      axis_name=axis_name,
  )


def lars(
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any = 0.9,
    weight_decay: Any = 0.0,
    trust_coefficient: Any = 1e-3,
    eps: Any = 0.0,
    nesterov: bool = False,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    denominator: str = "paper",
    axis_name: layerwise.AxisName = None,
    accumulator_dtype: Any = None,
    layout: str = "per_leaf",
) -> optax.GradientTransformation:
  """SGD with LARS, exactly Algorithm 1 of papers/000 (eq. 5-6 with momentum and weight decay).

  For a selected leaf (layer `l`), with `gamma_t = learning_rate(t)`, `m = momentum`,
  `beta = weight_decay`, `eta = trust_coefficient`:

      lambda^l = eta * ||w_t^l|| / (||g_t^l|| + beta * ||w_t^l||)       (local LR)
      v_{t+1}^l = m * v_t^l + gamma_t * lambda^l * (g_t^l + beta * w_t^l)
      w_{t+1}^l = w_t^l - v_{t+1}^l

  (the returned update is `-v_{t+1}`, since optax adds updates to the parameters). Leaves not
  selected by `mask` get plain momentum SGD with the same `gamma_t`: `v = m * v + gamma_t * g`, no
  weight decay, no trust ratio. `nesterov=True` returns `-(m * v_{t+1} + gamma_t * lambda * d)`
  instead, as `optax.trace` does. Zero norms: `lambda^l = eta` when `||w^l|| = 0` or the denominator
  is 0 (see `layerwise`), so a zero-initialised selected leaf moves by `gamma_t * eta * g`, never NaN.

  Works under `optax.inject_hyperparams(lars)(learning_rate=..., ...)` (the numeric arguments become
  hyper-parameters; pass callable `mask`/`stacked` through `static_args`) and `optax.MultiSteps`.

  Args:
    learning_rate: gamma, a float or an optax schedule of the update count.
    momentum: m, in [0, 1).
    weight_decay: beta, >= 0, applied to selected leaves only.
    trust_coefficient: eta, > 0.
    eps: added to the trust-ratio denominator, >= 0.
    nesterov: Nesterov momentum.
    mask: which leaves get LARS (pytree of bools, callable on params, or regular expression
      on leaf names such as 'kernel$'); default `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    denominator: "paper" (Algorithm 1) or "optax" (`||g + beta * w||`, as `optax.lars`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.
    accumulator_dtype: dtype of the momentum buffer (e.g. "bfloat16"), or None for the parameters'
      dtype (see `layerwise.layerwise_sgd`).
    layout: "per_leaf" (a reduction and an update per leaf), "flat" (the multi-tensor layout of
      `multi_tensor`: the momentum in a few block-padded buffers, every layer's norms in a few
      kernels; for GPUs, where an update is launch-bound; not for parameters sharded under `jit`) or
      "fused" (`lbjax.optim.fused`: the norms, then the update, over every leaf in Pallas kernels
      of up to 96 leaves each on CUDA GPUs, the per-leaf update elsewhere, the per-leaf state; add the updates with
      `fused.apply_updates`; not for parameters sharded under `jit`).

  Returns:
    An `optax.GradientTransformation`.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000 is its ICLR 2018 submission, "Large Batch Training of
      Convolutional Networks with Layer-wise Adaptive Rate Scaling": eq. 4-6, Algorithm 1.)
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 23, LARS as a layer-wise
      curvature radius.)
    optax.lars, google-deepmind/optax, optax/_src/alias.py (the denominator ||g + beta * w||).
  """
  return multi_tensor.layerwise_sgd(layout, lars_rate(trust_coefficient, eps, denominator), learning_rate, momentum,
                                     nesterov, accumulator_dtype, weight_decay, mask, stacked, axis_name)
