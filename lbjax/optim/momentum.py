"""Momentum SGD with L2 weight decay on kernels: the baseline that LARS is compared with."""

from typing import Any

import optax

from lbjax.optim import fused
from lbjax.optim import layerwise
from lbjax.optim import low_precision
from lbjax.optim import validation

LAYOUTS = ("per_leaf", "fused")


def momentum(
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any = 0.9,  # pylint: disable=redefined-outer-name
    nesterov: bool = False,
    weight_decay: Any = 0.0,
    mask: layerwise.MaskOrFn = None,
    accumulator_dtype: Any = None,
    layout: str = "per_leaf",
) -> optax.GradientTransformation:
  """Heavy-ball SGD with L2 weight decay added to the gradient of the selected leaves.

  With `gamma_t = learning_rate(t)`, `m = momentum`, `beta = weight_decay`:

      d_t = g_t + beta * w_t        (selected leaves; d_t = g_t for the others)
      v_{t+1} = m * v_t + d_t
      w_{t+1} = w_t - gamma_t * v_{t+1}

  as `optax.sgd` computes it (Nesterov: `w_{t+1} = w_t - gamma_t * (m * v_{t+1} + d_t)`). This is
  papers/000 Algorithm 1 with the local LR lambda fixed to 1 (for a constant gamma; Algorithm 1 puts
  gamma inside the momentum sum), the momentum baseline of papers/000 and papers/001 §5, with the
  weight decay of the MLPerf recipes: kernels only, by default, as `lars` does.

  Args:
    learning_rate: gamma, a float or an optax schedule of the update count.
    momentum: m, in [0, 1); 0 gives plain SGD.
    nesterov: Nesterov momentum.
    weight_decay: beta, >= 0.
    mask: which leaves get weight decay (pytree of bools, callable on params, or regular expression
      on leaf names); default
      `ndim >= 2` (kernels; no decay on biases and norm scales).
    accumulator_dtype: dtype of the momentum buffer (e.g. "bfloat16"), or None for the parameters'
      dtype; computed in float32 and rounded only where stored (`low_precision.trace`), where
      `optax.sgd`'s also rounds `momentum` and `momentum * v`.
    layout: "per_leaf" (XLA's kernels, one per leaf on a GPU) or "fused" (one Pallas kernel over every
      leaf on CUDA GPUs, the per-leaf update elsewhere, the same state: `lbjax.optim.fused.momentum_sgd`;
      add the updates with `fused.apply_updates`).

  Returns:
    An `optax.GradientTransformation`.

  References:
    Polyak, B. T. Some methods of speeding up the convergence of iteration methods. USSR
    Computational Mathematics and Mathematical Physics 4(5), 1964.
    You, Gitman, Ginsburg. Large Batch Training of Convolutional Networks. arXiv:1708.03888, 2017
    (papers/000, the momentum baseline of its tables).
  """
  validation.check_nonnegative("learning_rate", learning_rate, schedule=True)
  validation.check_momentum("momentum", momentum)
  validation.check_bool("nesterov", nesterov)
  validation.check_nonnegative("weight_decay", weight_decay)
  accumulator_dtype = validation.state_dtype("accumulator_dtype", accumulator_dtype)
  validation.check_choice("layout", layout, LAYOUTS)
  layerwise.check_mask(mask)
  # A pytree of bools for the parameters, its structure and leaves checked (`layerwise.resolve_mask`).
  given_mask = mask
  mask = lambda params: layerwise.resolve_mask(given_mask, params, meaning="True: weight decay; False: none")
  # A literal 0 leaves its term out: no decay term, no momentum buffer (`validation.is_literal_zero`).
  no_decay = validation.is_literal_zero(weight_decay)
  no_momentum = validation.is_literal_zero(momentum)
  decay = optax.identity() if no_decay else optax.add_decayed_weights(weight_decay, mask=mask)
  # optax.sgd's chain, with its trace computed in float32 when it is stored in a narrower dtype.
  trace = optax.identity() if no_momentum else low_precision.trace(momentum, nesterov, accumulator_dtype)
  chained = optax.chain(decay, optax.chain(trace, optax.scale_by_learning_rate(learning_rate)))

  def init_fn(params):
    mask(params)  # a wrong mask is an error also where weight_decay=0 leaves it unused
    return chained.init(params)

  per_leaf = optax.GradientTransformation(init_fn, chained.update)
  if layout == "fused":
    return fused.momentum_sgd(per_leaf, learning_rate, momentum, nesterov, weight_decay, mask)
  return per_leaf
