"""LAMB: the layer-wise trust ratio of LARS applied to the Adam direction (You et al. 2020)."""

from typing import Any

import jax.numpy as jnp
import optax

from lbjax.optim import fused
from lbjax.optim import layerwise
from lbjax.optim import low_precision
from lbjax.optim import multi_tensor
from lbjax.optim import validation


def lamb_rate(zero_at_padding: bool = True) -> layerwise.SummedRate:
  """The LAMB trust ratio as a `SummedRate`: `||w^l|| / ||u^l + beta * w^l||` (Algorithm 2 of LAMB).

  `u` is the incoming (Adam) direction. With the zero-norm rule of `layerwise.safe_quotient` the
  ratio is 1 when either norm is zero, as in optax and the LAMB paper.

  Args:
    zero_at_padding: whether `u` is zero where the gradient and the state are (`SummedRate.zero_at_padding`):
      Adam's direction is, unless eps and eps_root are both 0.

  Returns:
    A `layerwise.SummedRate` (the sums: `||w||^2` and `||u + beta * w||^2`).

  References:
    You, Y., Li, J., Reddi, S., Hseu, J., Kumar, S., Bhojanapalli, S., Song, X., Demmel, J.,
      Keutzer, K., and Hsieh, C.-J. Large Batch Optimization for Deep Learning: Training BERT in 76
      minutes. ICLR 2020. arXiv:1904.00962. (Algorithm 2, LAMB; with phi the identity.)
  """

  def sums(w, u, weight_decay, layer):
    return layer.sum_of_squares(w), layer.sum_of_squares(u + weight_decay * w)

  def rate(layer_sums, weight_decay):
    del weight_decay  # inside the second sum already
    w_squared, d_squared = layer_sums
    return layerwise.safe_quotient(jnp.sqrt(w_squared), jnp.sqrt(d_squared))

  return layerwise.SummedRate(sums, rate, zero_at_padding=zero_at_padding)


def scale_by_lamb_trust_ratio(
    weight_decay: Any = 0.0,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
) -> optax.GradientTransformation:
  """The trust-ratio part of LAMB on its own: `u^l <- ||w^l|| / ||d^l|| * d^l`, `d = u + beta * w`.

  This is the last line of Algorithm 2 of LAMB (with the scaling function phi the identity),
  before the learning rate.

  Composes after any direction (Adam in `lamb`; other preconditioners work the same way).
  Unselected leaves pass through unchanged (no weight decay, no trust ratio).

  Args:
    weight_decay: beta, >= 0 (decoupled, added to the direction before the ratio), selected leaves.
    mask: which leaves get the trust ratio (pytree of bools, callable or regular expression on leaf names);
      default `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.

  Returns:
    An `optax.GradientTransformation`; `trust_ratios(state)` gives the ratios of the last step.

  References:
    You, Y., Li, J., Reddi, S., Hseu, J., Kumar, S., Bhojanapalli, S., Song, X., Demmel, J.,
      Keutzer, K., and Hsieh, C.-J. Large Batch Optimization for Deep Learning: Training BERT in 76
      minutes. ICLR 2020. arXiv:1904.00962. (Algorithm 2, LAMB; with phi the identity.)
  """
  return layerwise.scale_by_layerwise_rate(
      lamb_rate(), weight_decay=weight_decay, mask=mask, stacked=stacked, axis_name=axis_name
  )


def scale_by_adam(
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-6,
    eps_root: Any = 0.0,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> optax.GradientTransformation:
  """`optax.scale_by_adam` with each moment stored in its own dtype and computed in float32 (or wider).

      mu_t = b1 * mu_{t-1} + (1 - b1) * g_t,    nu_t = b2 * nu_{t-1} + (1 - b2) * g_t^2
      r_t = (mu_t / (1 - b1^t)) / (sqrt(nu_t / (1 - b2^t) + eps_root) + eps)

  optax's own `mu_dtype` also computes `b1 * mu` in that dtype, and has no `nu_dtype`: in bfloat16,
  b2 = 0.999 rounds to 1.0 and the second moment would never decay. Here both moments are widened
  before the step and rounded only where stored (`low_precision.stored_in`).

  Args:
    b1: first-moment decay, in [0, 1).
    b2: second-moment decay, in [0, 1).
    eps: added to the root of the second moment, >= 0.
    eps_root: added inside the root, >= 0.
    mu_dtype: dtype of the stored first moment, or None for the parameters' dtype.
    nu_dtype: dtype of the stored second moment, or None for the parameters' dtype. Stored in bfloat16
      it cannot decay by b2 = 0.999 per step (bfloat16's rounding step, 2^-8 of the value, exceeds
      1 - b2): keep it in float32 for bfloat16 parameters.

  Returns:
    An `optax.GradientTransformation` with `optax.ScaleByAdamState`.

  References:
    Kingma, D. P. and Ba, J. Adam: A Method for Stochastic Optimization. ICLR 2015. arXiv:1412.6980.
      (Algorithm 1.)
  """
  return low_precision.stored_in(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root),
      mu=validation.state_dtype("mu_dtype", mu_dtype), nu=validation.state_dtype("nu_dtype", nu_dtype))


def lamb(
    learning_rate: optax.ScalarOrSchedule,
    b1: Any = 0.9,
    b2: Any = 0.999,
    eps: Any = 1e-6,
    eps_root: Any = 0.0,
    weight_decay: Any = 0.0,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
    axis_name: layerwise.AxisName = None,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    layout: str = "per_leaf",
) -> optax.GradientTransformation:
  """LAMB: Adam direction, decoupled weight decay, layer-wise trust ratio (Algorithm 2 of LAMB).

      r_t = m_hat_t / (sqrt(v_hat_t + eps_root) + eps)            (Adam, bias-corrected)
      w_{t+1}^l = w_t^l - gamma_t * ||w_t^l|| / ||r_t^l + beta * w_t^l|| * (r_t^l + beta * w_t^l)

  for selected leaves; unselected leaves take the plain Adam step `-gamma_t * r_t`. With every leaf
  selected this is `optax.lamb` (whose `mask` only governs weight decay).

  Args:
    learning_rate: gamma, a float or an optax schedule of the update count.
    b1: Adam's first-moment decay, in [0, 1).
    b2: Adam's second-moment decay, in [0, 1).
    eps: added to the root of the second moment, >= 0.
    eps_root: added inside the root, >= 0.
    weight_decay: beta, >= 0, selected leaves only.
    mask: which leaves get weight decay and the trust ratio (pytree of bools, callable or regular
      expression on leaf names such as 'kernel$'); default `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `scale_by_layerwise_rate`).
    axis_name: mapped axis the parameters are sharded over inside `shard_map`/`pmap`, or None.
    mu_dtype: dtype of Adam's first moment (e.g. "bfloat16"), or None for the parameters' dtype.
    nu_dtype: dtype of Adam's second moment, or None for the parameters' dtype. Each moment is
      updated in the wider of its dtype and the gradient's and rounded only where stored
      (`scale_by_adam`). With b2 = 0.999, a bfloat16 `nu` moves by 1 - b2 = 0.1% of itself per
      step, below bfloat16's half step of 0.2%: it changes only where g^2 is far from it. Keep `nu`
      in float32 unless b2 <= 0.99.
    layout: "per_leaf", "flat" (the multi-tensor layout: Adam's moments in a few block-padded
      buffers; see `lars`) or "fused" (two passes of Pallas kernels over every leaf on CUDA GPUs,
      the per-leaf state: `lbjax.optim.fused.lamb`).

  Returns:
    An `optax.GradientTransformation`.

  References:
    You, Y., Li, J., Reddi, S., Hseu, J., Kumar, S., Bhojanapalli, S., Song, X., Demmel, J.,
      Keutzer, K., and Hsieh, C.-J. Large Batch Optimization for Deep Learning: Training BERT in 76
      minutes. ICLR 2020. arXiv:1904.00962. (Algorithm 2, LAMB; with phi the identity.)
    Kingma, D. P. and Ba, J. Adam: A Method for Stochastic Optimization. ICLR 2015. arXiv:1412.6980.
      (Algorithm 1, the direction r_t.)
  """
  validation.check_nonnegative("learning_rate", learning_rate, schedule=True)
  validation.check_momentum("b1", b1)
  validation.check_momentum("b2", b2)
  validation.check_nonnegative("eps", eps)
  validation.check_nonnegative("eps_root", eps_root)
  # Adam's direction where the gradient and the moments are zero is 0 / (sqrt(eps_root) + eps): 0 unless both
  # may be 0 (a traced value may be).
  rate = lamb_rate(zero_at_padding=any(isinstance(e, (int, float)) and e > 0 for e in (eps, eps_root)))
  return multi_tensor.in_layout(
      layout,
      lambda scaling, flip_sign: optax.chain(scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nu_dtype), scaling,
                                             optax.scale_by_learning_rate(learning_rate, flip_sign=flip_sign)),
      rate, weight_decay, mask, stacked, axis_name,
      lambda per_leaf: fused.lamb(per_leaf, rate, learning_rate, b1, b2, eps, eps_root, weight_decay, mask,
                                  stacked, axis_name),
  )
