"""Max pooling whose gradient is a sum of strided placements instead of a scatter.

JAX differentiates `lax.reduce_window` max with select-and-scatter, which XLA:GPU expands into a
variadic reduce-window that writes the window's argmax as four int32 coordinate arrays of the output's
size, then a scatter-add of the cotangent into a zeroed input-sized buffer (atomics: its sums depend
on the order threads finish, so under `config.deterministic` XLA has to replace it with a slower,
deterministic form). Compiled for an H100 (deviceless, `lbjax.train.gpu_targets`), the kernels of the
ResNet-50 step (bfloat16, batch 256) write 27.9 GiB per step with that gradient and 26.2 GiB with this
one, which XLA fuses with the stem's BatchNorm gradient. On TPUs select-and-scatter is native and stays.

Here the pooling's tangent is written by hand (`jax.custom_jvp`): each output's tangent is that of the first
maximum of its window, in row-major window order as select-and-scatter picks it, `k*` = first k with
x_k = max_k x_k. Reverse mode transposes it: each window position's strided slice becomes a placement,
and the input gradient is, for each window position k = (i, j),

    dx = sum_k place_k(dy * [k == k*])      (place_k: the output grid put at x's positions i + s_h * h, j + s_w * w)

where `place_k` is `lax.pad` with interior padding `stride - 1`: no scatter, no atomics, the inputs
JAX's gradient gives the cotangents to, and their sums (at most ceil(window / stride) cotangents per
dimension meet at one input position) added in float32 and rounded once. Being a tangent rule, it also
differentiates forward: the Hessian-vector products of the Lipschitz diagnostic (forward over reverse,
`lbjax.diagnostics.lipschitz`) go through it, as through `nnx.max_pool`. `lax.platform_dependent` takes
JAX's own tangent on TPUs (the same numbers as `nnx.max_pool`) and this one everywhere else: on a CPU its
gradient takes 0.24x [0.23, 0.24] of select-and-scatter's time (`python -m benchmarks.max_pool --batch 8`,
2 cores).
"""

import functools
import itertools
from typing import Sequence

import jax
from jax import lax
import jax.numpy as jnp


def max_pool(x: jax.Array, window: Sequence[int], strides: Sequence[int],
             padding: Sequence[tuple[int, int]]) -> jax.Array:
  """`flax.nnx.max_pool(x, window, strides, padding)` on `[batch, *spatial, features]` with explicit
  padding: the same values; the gradient to the same inputs, without a scatter except on TPUs (module doc).

  Raises:
    ValueError: `window`, `strides` and `padding` not one per spatial dimension of `x`.
  """
  spatial = x.ndim - 2
  window, strides = tuple(int(w) for w in window), tuple(int(s) for s in strides)
  padding = tuple((int(low), int(high)) for low, high in padding)
  if not len(window) == len(strides) == len(padding) == spatial:
    raise ValueError(f"max_pool of a {x.ndim}-d input [batch, *spatial, features] takes one window size, stride and "
                     f"(low, high) padding per spatial dimension ({spatial}), got window={window}, strides={strides}, "
                     f"padding={padding}.")
  return _max_pool(x, (window, strides, padding))


def _reduce_window_max(x: jax.Array, window, strides, padding) -> jax.Array:
  return lax.reduce_window(x, -jnp.inf, lax.max, (1, *window, 1), (1, *strides, 1), ((0, 0), *padding, (0, 0)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _max_pool(x: jax.Array, pool: tuple) -> jax.Array:
  return _reduce_window_max(x, *pool)


@_max_pool.defjvp
def _max_pool_jvp(pool, primals, tangents):
  (x,), (tangent,) = primals, tangents
  # On TPUs select-and-scatter is native, and XLA's estimate of the ResNet-50 step (v5p:2x2x1, batch 256)
  # grows from 12.98 to 17.30 ms with the placements: not there.
  return _max_pool(x, pool), lax.platform_dependent(x, tangent, tpu=functools.partial(_jax_tangent, pool),
                                                    default=functools.partial(_first_maximum_tangent, pool))


def _jax_tangent(pool, x, tangent):
  """JAX's tangent of the pooling (select-and-gather); its transpose is select-and-scatter."""
  return jax.jvp(lambda x: _reduce_window_max(x, *pool), (x,), (tangent,))[1]


def _window_slices(shape, output_shape, window, strides, padding):
  """For each window position k (row-major), the strided slice of the padded input at the output grid's
  k-th window elements: `lax.slice` arguments (start indices, limit indices, strides)."""
  outputs = output_shape[1:-1]
  for offsets in itertools.product(*map(range, window)):  # row-major
    starts = (0, *offsets, 0)
    limits = (shape[0], *(o + s * (n - 1) + 1 for o, s, n in zip(offsets, strides, outputs)), shape[-1])
    yield starts, limits, (1, *strides, 1)


def _first_maximum_tangent(pool, x, tangent):
  """Each output's tangent is that of its window's first maximum `k*` (module doc), in float32 and rounded
  once. Its transpose, the gradient, is the module doc's sum of placements: a slice transposes to a `lax.pad`
  (the windows are visited last to first so that the placements are added first to last)."""
  window, strides, padding = pool
  output_shape = jax.eval_shape(lambda x: _reduce_window_max(x, *pool), x).shape
  slices = list(_window_slices(x.shape, output_shape, window, strides, padding))
  spatial_padding = ((0, 0), *padding, (0, 0))
  padded = jnp.pad(x, spatial_padding, constant_values=-jnp.inf)
  views = [lax.slice(padded, *s) for s in slices]
  index_dtype = jnp.int8 if len(views) <= jnp.iinfo(jnp.int8).max else jnp.int32
  best, first_max = views[0], jnp.zeros(output_shape, index_dtype)
  for k, view in enumerate(views[1:], start=1):  # strictly greater: the first maximum keeps its place
    larger = view > best
    best, first_max = jnp.where(larger, view, best), jnp.where(larger, jnp.asarray(k, index_dtype), first_max)
  padded_tangent = jnp.pad(tangent.astype(jnp.float32), spatial_padding)
  output_tangent = jnp.zeros(output_shape, jnp.float32)
  for k in reversed(range(len(slices))):
    output_tangent = output_tangent + jnp.where(first_max == k, lax.slice(padded_tangent, *slices[k]), 0.0)
  return output_tangent.astype(tangent.dtype)
