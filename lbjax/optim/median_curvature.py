"""Median-curvature LR (MCLR): a layer-wise LR from the median curvature radius (papers/003 eq. 20-22)."""

from typing import Any

import optax

from lbjax.optim import layerwise


def median_curvature_rate() -> layerwise.LayerRate:
  """The MCLR rate as a `LayerRate`: the median curvature radius `R_m` (papers/003 eq. 20, 22).

      R_m^l = |w_m| / (|g_m| + beta * |w_m|)      (eq. 22; eq. 20 when beta = 0)

  where `|w_m|` and `|g_m|` are the medians of the magnitudes of the layer's weights and gradients
  (the paper's "median values"; medians of signed values would sit near 0 and say nothing of the
  scale). The step is then `gamma * R_m * (g + beta * w)` (eq. 21). When `|w_m|` or the
  denominator is 0 (more than half the weights or gradients zero, e.g. an embedding with sparse
  gradients and beta = 0), `R_m` is 1 (the zero-norm rule of `layerwise.safe_quotient`).

  Returns:
    A `layerwise.LayerRate`.

  References:
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 17 the curvature radius R_i =
      |w_i / g_i|, eq. 20 and 22 its median approximation R_m, eq. 21 the LR gamma * R_m; §4.2 and
      Figure 16 compare it with LARS.)
  """

  def rate(w, g, weight_decay, layer):
    w_m = layer.median_abs(w)
    g_m = layer.median_abs(g)
    return layerwise.safe_quotient(w_m, g_m + weight_decay * w_m)

  return rate


def scale_by_median_curvature(
    weight_decay: Any = 0.0,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
) -> optax.GradientTransformation:
  """The layer-wise part of MCLR: `u^l = R_m^l * (g^l + beta * w^l)` (papers/003 eq. 21-22).

  Args:
    weight_decay: beta, >= 0, selected leaves only.
    mask: which leaves get the rate (pytree of bools, callable or regular expression on leaf names); default
      `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.

  Returns:
    An `optax.GradientTransformation`; `trust_ratios(state)` gives the `R_m` of the last step.

  References:
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 17 the curvature radius R_i =
      |w_i / g_i|, eq. 20 and 22 its median approximation R_m, eq. 21 the LR gamma * R_m; §4.2 and
      Figure 16 compare it with LARS.)
  """
  return layerwise.scale_by_layerwise_rate(
      median_curvature_rate(), weight_decay=weight_decay, mask=mask, stacked=stacked,
      axis_name=axis_name,
  )


def mclr(
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any = 0.9,
    weight_decay: Any = 0.0,
    nesterov: bool = False,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
    accumulator_dtype: Any = None,
) -> optax.GradientTransformation:
  """Momentum SGD with the median-curvature LR (papers/003 eq. 21-22).

      eta_g = gamma_t * R_m^l,   v = m * v + eta_g * (g^l + beta * w^l),   w = w - v

  on selected leaves; unselected leaves get plain momentum SGD. The paper finds it on par with LARS
  below batch 8K and does not recommend it for larger batches (section 4.2).

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

  Returns:
    An `optax.GradientTransformation`.

  References:
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 17 the curvature radius R_i =
      |w_i / g_i|, eq. 20 and 22 its median approximation R_m, eq. 21 the LR gamma * R_m; §4.2 and
      Figure 16 compare it with LARS.)
  """
  return layerwise.layerwise_sgd(
      scale_by_median_curvature(weight_decay, mask, stacked, axis_name), learning_rate, momentum,
      nesterov, accumulator_dtype,
  )
