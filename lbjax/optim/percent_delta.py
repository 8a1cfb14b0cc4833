"""PercentDelta: a layer-wise LR that fixes the mean relative change of the weights (papers/003 eq. 24)."""

from typing import Any

import jax.numpy as jnp
import optax

from lbjax.optim import layerwise
from lbjax.optim import multi_tensor


def percent_delta_rate() -> layerwise.SummedRate:
  """The PercentDelta rate as a `SummedRate` (papers/003 eq. 24, Abuelhaija 2017).

      rate^l = size(w^l) / || d^l / w^l ||_1,     d = g + beta * w

  so that a step `gamma * rate * d` changes the weights of the layer by `gamma` on average, in
  relative terms: `mean_i |step_i / w_i| = gamma`. The relative change of a zero weight is undefined:
  zero weights are left out of both `size` and the sum. If no weight is nonzero or `d` vanishes on
  all of them, the rate is 1 (the zero-norm rule of `layerwise.safe_quotient`).

  Returns:
    A `layerwise.SummedRate` (the sums: the number of nonzero weights and `||d / w||_1`).

  References:
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 24.)
    Abu-El-Haija, S. Proportionate Gradient Updates with PercentDelta. arXiv:1708.07227, 2017.
  """

  def sums(w, g, weight_decay, layer):
    # Arithmetic only, and no subexpression shared by the two reductions: XLA:CPU then fuses each
    # elementwise input into its reduction instead of materialising it (a select, an int32 count or
    # a shared |w| each cost a full-size temporary). In float32 or wider: in float16 one |d_i / w_i|
    # above 65504 made the layer's sum inf and its rate 0.
    w, g = (x.astype(jnp.promote_types(x.dtype, jnp.float32)) for x in (w, g))
    nonzero = jnp.sign(jnp.abs(w))  # 1 per nonzero weight, 0 per zero weight
    relative = jnp.abs(g + weight_decay * w) * nonzero / (jnp.abs(w) + (1 - nonzero))  # |d_i / w_i|, 0 at w_i = 0
    count = layer.sum(jnp.abs(jnp.sign(w)))  # in float32, exact up to 2^24 weights per layer
    return count, layer.sum(relative)

  def rate(layer_sums, weight_decay):
    del weight_decay  # inside the relative changes already
    count, relative_sum = layer_sums
    return layerwise.safe_quotient(count, relative_sum)

  return layerwise.SummedRate(sums, rate)


def scale_by_percent_delta(
    weight_decay: Any = 0.0,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
) -> optax.GradientTransformation:
  """The layer-wise part of PercentDelta: `u^l = size(w^l) / ||d^l / w^l||_1 * d^l`, `d = g + beta*w`.

  Args:
    weight_decay: beta, >= 0, selected leaves only.
    mask: which leaves get the rate (pytree of bools, callable or regular expression on leaf names); default
      `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.

  Returns:
    An `optax.GradientTransformation`; `trust_ratios(state)` gives the rates of the last step.

  References:
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 24.)
    Abu-El-Haija, S. Proportionate Gradient Updates with PercentDelta. arXiv:1708.07227, 2017.
  """
  return layerwise.scale_by_layerwise_rate(
      percent_delta_rate(), weight_decay=weight_decay, mask=mask, stacked=stacked,
      axis_name=axis_name,
  )


def percent_delta(
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any = 0.9,
    weight_decay: Any = 0.0,
    nesterov: bool = False,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
    accumulator_dtype: Any = None,
    layout: str = "per_leaf",
) -> optax.GradientTransformation:
  """Momentum SGD with the PercentDelta layer-wise LR (papers/003 eq. 24).

      eta_g = gamma_t * size(w^l) / ||d^l / w^l||_1,   v = m * v + eta_g * d^l,   w = w - v

  with `d = g + beta * w` on selected leaves; unselected leaves get plain momentum SGD. With
  `momentum=0`, `gamma` is the mean relative change of the weights per step.

  Args:
    learning_rate: gamma, a float or an optax schedule of the update count.
    momentum: m, in [0, 1).
    weight_decay: beta, >= 0, selected leaves only.
    nesterov: Nesterov momentum.
    mask: which leaves get the rate (pytree of bools, callable or regular expression on leaf names);
      default `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.
    accumulator_dtype: dtype of the momentum buffer (e.g. "bfloat16"), or None for the parameters'
      dtype (see `layerwise.layerwise_sgd`).
    layout: "per_leaf", "flat" (the multi-tensor layout) or "fused" (Pallas kernels on GPUs): see `lars`.

  Returns:
    An `optax.GradientTransformation`.

  References:
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 24.)
    Abu-El-Haija, S. Proportionate Gradient Updates with PercentDelta. arXiv:1708.07227, 2017.
  """
  return multi_tensor.layerwise_sgd(layout, percent_delta_rate(), learning_rate, momentum, nesterov,
                                     accumulator_dtype, weight_decay, mask, stacked, axis_name)
