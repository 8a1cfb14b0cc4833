"""What a "layer" is for the diagnostics: one leaf of the params pytree, named by its path."""

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def layer_name(path: tuple[Any, ...]) -> str:
  """Name of a leaf: its pytree path joined by '/', e.g. ('conv1', 'kernel') -> 'conv1/kernel'."""
  return jax.tree_util.keystr(path, simple=True, separator="/") or "<root>"


def check_matching_trees(params: PyTree, grads: PyTree, where: str) -> None:
  """Raises ValueError unless params and grads have the same structure and leaf shapes.

  Args:
    params: pytree of parameter arrays (or `jax.ShapeDtypeStruct`).
    grads: pytree that should mirror params.
    where: name of the calling function, for the message.
  """
  p_struct, g_struct = jax.tree.structure(params), jax.tree.structure(grads)
  if p_struct != g_struct:
    raise ValueError(
        f"{where}: params and grads must have the same pytree structure, got {p_struct} and "
        f"{g_struct}. Pass the gradient of the loss with respect to exactly these params.")
  if not jax.tree.leaves(params):
    raise ValueError(f"{where}: params has no leaves.")
  for (path, p), g in zip(jax.tree.leaves_with_path(params), jax.tree.leaves(grads)):
    if jnp.shape(p) != jnp.shape(g):
      raise ValueError(
          f"{where}: leaf {layer_name(path)!r} has shape {jnp.shape(p)} in params but "
          f"{jnp.shape(g)} in grads.")
