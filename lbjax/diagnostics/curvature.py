"""Per-layer curvature-radius statistics, papers/003 (Gao & Zhong) eq. 9-22, Figure 2.

The curvature radius of the loss along parameter w_i is (eq. 9)
  R_i = |(1 + (dL/dw_i)^2)^{3/2} / (d^2L/dw_i^2)|.
Near a minimum, L ~ a_i (w_i - b_i)^2 + c_i (eq. 12), so d^2L/dw_i^2 = (dL/dw_i)/(w_i - b_i)
(eq. 15); with b_i = 0 and (dL/dw_i)^2 << 1 this gives the first-order estimate (eq. 17)
  R_i ~ |w_i / (dL/dw_i)|,
and with weight decay beta the gradient of the regularised loss replaces dL/dw_i (eq. 22):
  R_i ~ |w_i / (dL/dw_i + beta w_i)|.
Eq. 17 fails when w_i -> 0 (eq. 18) or dL/dw_i -> 0 (eq. 19); such entries are excluded from the
statistics and counted. The paper's median approximation (eq. 20, eq. 22 with weight decay)
  R_m ~ |w_m / (dL/dw_m + beta w_m)|
takes w_m and dL/dw_m as the medians of the group (a layer); we take medians of |w_i| and
|dL/dw_i|, since the signed medians of a layer are near 0 and would hit eq. 18-19 themselves.
MCLR (eq. 21) sets the layer LR to gamma * R_m; LARS (eq. 23) uses ||w||/||g|| instead.
"""

import dataclasses
import math
import numbers
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lbjax.diagnostics.layers import check_matching_trees, layer_name

PyTree = Any
DEFAULT_QUANTILES = (0.1, 0.25, 0.75, 0.9)


class CurvatureRadiusStats(NamedTuple):
  """Distribution of R_i over one layer's entries that avoid the failure cases eq. 18-19.

  Attributes:
    median: median of R_i (NaN if no entry is valid).
    mean: mean of R_i (NaN if no entry is valid).
    quantiles: R_i quantiles at the requested levels, shape [num_levels].
    median_approx: R_m of eq. 20 (eq. 22 with weight decay), from the medians of |w| and |g|.
    valid_fraction: fraction of entries with |w_i| > min_abs_weight and |g_i| > min_abs_grad.
  """

  median: jax.Array
  mean: jax.Array
  quantiles: jax.Array
  median_approx: jax.Array
  valid_fraction: jax.Array


@dataclasses.dataclass(frozen=True)
class CurvatureRadiusRow:
  """One layer's curvature-radius statistics on the host (one bar of papers/003 Figure 2)."""

  layer: str
  shape: tuple[int, ...]
  median: float
  mean: float
  quantiles: dict[float, float]
  median_approx: float
  valid_fraction: float


def curvature_radius(w: jax.Array, g: jax.Array, weight_decay: float = 0.0) -> jax.Array:
  """Elementwise R_i = |w_i / (g_i + beta w_i)| (eq. 17; eq. 22 form with weight decay beta).

  +inf where the denominator is 0 (failure case eq. 19). `ValueError` if w and g differ in shape or beta is
  a negative or non-finite number.
  """
  if jnp.shape(w) != jnp.shape(g):  # they would broadcast into a radius of neither
    raise ValueError(f"curvature_radius: w and g must have the same shape, got {jnp.shape(w)} and {jnp.shape(g)}.")
  _check_weight_decay(weight_decay, "curvature_radius")
  w = w.astype(jnp.float32)
  denom = jnp.abs(g.astype(jnp.float32) + weight_decay * w)
  return jnp.where(denom > 0, jnp.abs(w) / jnp.where(denom > 0, denom, 1.0), jnp.inf)


def _check_weight_decay(weight_decay, where):
  if isinstance(weight_decay, jax.Array):  # a traced beta is the caller's
    return
  if isinstance(weight_decay, bool) or not isinstance(weight_decay, numbers.Real) or not 0 <= weight_decay < math.inf:
    raise ValueError(f"{where}: weight_decay must be a finite number >= 0, got {weight_decay!r}.")


def _check_options(weight_decay, quantile_levels, min_abs_weight, min_abs_grad, where):
  _check_weight_decay(weight_decay, where)
  if not all(isinstance(v, numbers.Real) and v >= 0 for v in (min_abs_weight, min_abs_grad)):
    raise ValueError(
        f"{where}: min_abs_weight and min_abs_grad must be numbers >= 0, got {min_abs_weight!r} and "
        f"{min_abs_grad!r}.")
  if (isinstance(quantile_levels, str) or not isinstance(quantile_levels, Sequence)
      or any(not isinstance(q, numbers.Real) or not 0.0 <= q <= 1.0 for q in quantile_levels)):
    raise ValueError(f"{where}: quantile_levels must be a sequence of levels in [0, 1], e.g. (0.5, 0.9), got "
                     f"{quantile_levels!r}.")


def _layer_stats(w, g, weight_decay, levels, min_abs_weight, min_abs_grad):
  w = w.astype(jnp.float32).ravel()
  g = g.astype(jnp.float32).ravel()
  radius = curvature_radius(w, g, weight_decay)
  valid = (jnp.abs(w) > min_abs_weight) & (jnp.abs(g) > min_abs_grad) & jnp.isfinite(radius)
  masked = jnp.where(valid, radius, jnp.nan)
  w_m = jnp.median(jnp.abs(w))
  denom = jnp.median(jnp.abs(g)) + weight_decay * w_m
  median_approx = jnp.where(denom > 0, w_m / jnp.where(denom > 0, denom, 1.0), jnp.inf)
  return CurvatureRadiusStats(
      median=jnp.nanmedian(masked),
      mean=jnp.nanmean(masked),
      quantiles=jnp.nanquantile(masked, jnp.asarray(levels, jnp.float32)),
      median_approx=median_approx,
      valid_fraction=jnp.mean(valid.astype(jnp.float32)),
  )


def per_layer_curvature_radius(
    params: PyTree,
    grads: PyTree,
    *,
    weight_decay: float = 0.0,
    quantile_levels: Sequence[float] = DEFAULT_QUANTILES,
    min_abs_weight: float = 0.0,
    min_abs_grad: float = 0.0,
) -> PyTree:
  """Per-leaf distribution of the curvature radius R_i (papers/003 eq. 17/22). Jittable.

  Args:
    params: pytree of parameter arrays w.
    grads: pytree of loss gradients dL/dw with the same structure and shapes.
    weight_decay: beta of eq. 22 (0 gives eq. 17 and eq. 20).
    quantile_levels: levels in [0, 1] of the reported quantiles.
    min_abs_weight: entries with |w_i| <= this are excluded (failure case eq. 18).
    min_abs_grad: entries with |g_i| <= this are excluded (failure case eq. 19).

  Returns:
    A pytree with the structure of params whose leaves are `CurvatureRadiusStats`.
  """
  check_matching_trees(params, grads, "per_layer_curvature_radius")
  _check_options(weight_decay, quantile_levels, min_abs_weight, min_abs_grad,
                 "per_layer_curvature_radius")
  levels = tuple(float(q) for q in quantile_levels)
  return jax.tree.map(
      lambda w, g: _layer_stats(w, g, weight_decay, levels, min_abs_weight, min_abs_grad),
      params, grads)


_per_layer_curvature_radius_jit = jax.jit(
    per_layer_curvature_radius,
    static_argnames=("weight_decay", "quantile_levels", "min_abs_weight", "min_abs_grad"))


def curvature_radius_rows(
    params: PyTree,
    grads: PyTree,
    *,
    weight_decay: float = 0.0,
    quantile_levels: Sequence[float] = DEFAULT_QUANTILES,
    min_abs_weight: float = 0.0,
    min_abs_grad: float = 0.0,
) -> list[CurvatureRadiusRow]:
  """Host-side rows of `per_layer_curvature_radius`, one per leaf, named by pytree path."""
  if isinstance(weight_decay, jax.Array) and weight_decay.ndim == 0:
    weight_decay = weight_decay.item()  # a static argument of the compiled statistics: hashable
  _check_options(weight_decay, quantile_levels, min_abs_weight, min_abs_grad, "curvature_radius_rows")
  levels = tuple(float(q) for q in quantile_levels)
  stats = jax.device_get(_per_layer_curvature_radius_jit(
      params, grads, weight_decay=float(weight_decay), quantile_levels=levels,
      min_abs_weight=min_abs_weight, min_abs_grad=min_abs_grad))
  leaves = jax.tree.leaves(stats, is_leaf=lambda x: isinstance(x, CurvatureRadiusStats))
  return [
      CurvatureRadiusRow(
          layer=layer_name(path),
          shape=tuple(jnp.shape(p)),
          median=float(s.median),
          mean=float(s.mean),
          quantiles={q: float(v) for q, v in zip(levels, s.quantiles)},
          median_approx=float(s.median_approx),
          valid_fraction=float(s.valid_fraction),
      )
      for (path, p), s in zip(jax.tree.leaves_with_path(params), leaves)
  ]
