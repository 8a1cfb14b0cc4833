"""Local Lipschitz estimate along a direction, papers/001 (LEGW) §4, Figure 3.

For the step x <- x - eta g, the second-order model f(x - eta g) ~ f(x) - eta g^T grad f +
eta^2/2 g^T H g is minimised (for g = grad f) at eta* = 1/L(x, g) with

  L(x, g) = |g^T H g| / ||g||^2,   H = Hessian of the loss at x.

The paper plots L over iterations (it peaks early, and the peak moves right with the batch size),
which motivates the linear-epoch warm-up. The paper approximates H on a small batch by finite
differences; here the Hessian-vector product is exact, forward-over-reverse (`jax.jvp` of
`jax.grad`), on the batch passed in (use a separate, small one).
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

PyTree = Any


def hessian_vector_product(
    loss_fn: Callable[[PyTree, Any], jax.Array], params: PyTree, batch: Any, vector: PyTree
) -> PyTree:
  """H v with H = d^2 loss_fn(params, batch)/d params^2, forward-over-reverse. Jittable."""
  return jax.jvp(lambda p: jax.grad(loss_fn)(p, batch), (params,), (vector,))[1]


def lipschitz_along_gradient(
    loss_fn: Callable[[PyTree, Any], jax.Array],
    params: PyTree,
    batch: Any,
    direction: PyTree | None = None,
) -> jax.Array:
  """L(x, g) = |g^T H g| / ||g||^2 of papers/001 §4 (Figure 3). Jittable (loss_fn static).

  Args:
    loss_fn: `loss_fn(params, batch) -> scalar` loss.
    params: the point x.
    batch: the (small) batch on which the Hessian is taken.
    direction: g; default the gradient of loss_fn at params on this batch.

  Returns:
    A float32 scalar. 0 when g = 0 (there is no step along g to bound).
  """
  if not callable(loss_fn):
    raise TypeError(f"lipschitz_along_gradient: loss_fn must be callable, got {loss_fn!r}.")
  if direction is None:
    direction = jax.grad(loss_fn)(params, batch)
  elif jax.tree.structure(direction) != jax.tree.structure(params):
    raise ValueError(
        "lipschitz_along_gradient: direction must have the structure of params, got "
        f"{jax.tree.structure(direction)} vs {jax.tree.structure(params)}.")
  hv = hessian_vector_product(loss_fn, params, batch, direction)
  # Summed in float32 at least: in float16, g^T H g and |g|^2 overflow past 65504.
  wide = lambda tree: jax.tree.map(lambda x: x.astype(jnp.promote_types(x.dtype, jnp.float32)), tree)
  direction, hv = wide(direction), wide(hv)
  curvature = optax.tree.vdot(direction, hv).astype(jnp.float32)
  norm_sq = optax.tree.norm(direction, squared=True).astype(jnp.float32)
  return jnp.where(norm_sq > 0, jnp.abs(curvature) / jnp.where(norm_sq > 0, norm_sq, 1.0), 0.0)
