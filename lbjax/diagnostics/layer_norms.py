"""Per-layer weight and gradient norms, the table of papers/000 (LARS) Table 2.

`per_layer_norms` is the jittable core: it maps (params, grads) to pytrees of per-leaf scalars and
works on sharded arrays (the norms are global). `layer_norms` fetches them to the host as rows;
`format_table` and `write_csv` render rows. A "layer" is one leaf of the params pytree, named by its
path joined with '/', e.g. `conv1/kernel` (Table 2's `conv1.w`).
"""

import csv
import dataclasses
import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lbjax.diagnostics.layers import check_matching_trees, layer_name

PyTree = Any


class PerLayerNorms(NamedTuple):
  """Per-leaf statistics, each a pytree with the structure of params, one scalar per leaf.

  Attributes:
    weight_norm: ||w||_2.
    grad_norm: ||grad||_2.
    ratio: ||w||/||grad|| (papers/000 Table 2); +inf where ||grad|| = 0.
    mean_abs_grad: ||grad||_1 / size, the "average gradient" of papers/003 Figure 3 (eq. 4).
  """

  weight_norm: PyTree
  grad_norm: PyTree
  ratio: PyTree
  mean_abs_grad: PyTree


@dataclasses.dataclass(frozen=True)
class LayerNormRow:
  """One row of the per-layer norms table (papers/000 Table 2, transposed)."""

  layer: str
  shape: tuple[int, ...]
  weight_norm: float
  grad_norm: float
  ratio: float
  mean_abs_grad: float


def per_layer_norms(params: PyTree, grads: PyTree) -> PerLayerNorms:
  """Per-leaf ||w||, ||grad||, ||w||/||grad|| and mean |grad| (papers/000 Table 2). Jittable.

  Norms are computed in float32 over the whole leaf, so under `jax.jit` with sharded leaves they
  are global norms. The ratio is the LARS local-LR statistic (papers/000 eq. 6 without eta);
  where ||grad|| = 0 it is +inf (the failure case eq. 19 of papers/003).

  Args:
    params: pytree of parameter arrays.
    grads: pytree of gradients with the same structure and shapes.

  Returns:
    `PerLayerNorms`, each field a pytree of scalars with the structure of params.
  """
  check_matching_trees(params, grads, "per_layer_norms")

  def l2(x):
    return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32))))

  w_norm = jax.tree.map(l2, params)
  g_norm = jax.tree.map(l2, grads)
  ratio = jax.tree.map(lambda w, g: jnp.where(g > 0, w / jnp.where(g > 0, g, 1.0), jnp.inf),
                       w_norm, g_norm)
  mean_abs = jax.tree.map(lambda g: jnp.mean(jnp.abs(g.astype(jnp.float32))), grads)
  return PerLayerNorms(w_norm, g_norm, ratio, mean_abs)


_per_layer_norms_jit = jax.jit(per_layer_norms)


def layer_norms(params: PyTree, grads: PyTree) -> list[LayerNormRow]:
  """Rows of the per-layer norms table, in pytree leaf order (host-side; fetches the values).

  Args:
    params: pytree of parameter arrays.
    grads: pytree of gradients with the same structure and shapes.

  Returns:
    One `LayerNormRow` per leaf: name (path joined by '/'), shape, ||w||, ||grad||,
    ||w||/||grad||, mean |grad|.
  """
  check_matching_trees(params, grads, "layer_norms")
  stats = jax.device_get(_per_layer_norms_jit(params, grads))
  columns = [jax.tree.leaves(field) for field in stats]
  return [
      LayerNormRow(layer_name(path), tuple(jnp.shape(p)), *(float(c[i]) for c in columns))
      for i, (path, p) in enumerate(jax.tree.leaves_with_path(params))
  ]


_HEADER = ("layer", "shape", "||w||", "||grad||", "||w||/||grad||", "mean|grad|")


def _cells(row: LayerNormRow, precision: int) -> list[str]:
  shape = "x".join(str(d) for d in row.shape) or "scalar"
  numbers = (row.weight_norm, row.grad_norm, row.ratio, row.mean_abs_grad)
  return [row.layer, shape] + [f"{x:.{precision}g}" for x in numbers]


def format_table(rows: list[LayerNormRow], precision: int = 4) -> str:
  """Renders rows as an aligned markdown table (readable as plain text too).

  Args:
    rows: output of `layer_norms`.
    precision: significant digits of the numbers.

  Returns:
    The table, one line per row plus a header and a separator line.
  """
  if not rows:
    raise ValueError("format_table: no rows to format; pass the output of layer_norms.")
  if precision < 1:
    raise ValueError(f"format_table: precision must be >= 1, got {precision}.")
  table = [list(_HEADER)] + [_cells(r, precision) for r in rows]
  widths = [max(len(line[j]) for line in table) for j in range(len(_HEADER))]

  def render(cells):
    padded = [c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths))]
    return "| " + " | ".join(padded) + " |"

  separator = "|" + "|".join(
      "-" * (w + 2) if j < 2 else "-" * (w + 1) + ":" for j, w in enumerate(widths)) + "|"
  return "\n".join([render(table[0]), separator] + [render(line) for line in table[1:]])


def write_csv(rows: list[LayerNormRow], path: str | os.PathLike[str]) -> None:
  """Writes rows as CSV with header layer,shape,weight_norm,grad_norm,ratio,mean_abs_grad.

  Shapes are written like `3x3x64`; numbers with full float precision (repr).
  """
  if not rows:
    raise ValueError("write_csv: no rows to write; pass the output of layer_norms.")
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["layer", "shape", "weight_norm", "grad_norm", "ratio", "mean_abs_grad"])
    for r in rows:
      writer.writerow([r.layer, "x".join(str(d) for d in r.shape),
                       repr(r.weight_norm), repr(r.grad_norm), repr(r.ratio),
                       repr(r.mean_abs_grad)])
