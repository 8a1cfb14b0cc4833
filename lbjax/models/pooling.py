"""Max pooling whose gradient is a sum of strided placements instead of a scatter.

JAX differentiates `lax.reduce_window` max with select-and-scatter, which XLA:GPU expands into a
variadic reduce-window that writes the window's argmax as four int32 coordinate arrays of the output's
size, then a scatter-add of the cotangent into a zeroed input-sized buffer (atomics: its sums depend
on the order threads finish, so under `config.deterministic` XLA has to replace it with a slower,
deterministic form). Compiled for an H100 (deviceless, `lbjax.train.gpu_targets`), the kernels of the
ResNet-50 step (bfloat16, batch 256) write 27.9 GiB per step with that gradient and 26.2 GiB with this
one, which XLA fuses with the stem's BatchNorm gradient. On TPUs select-and-scatter is native and stays.

Here the window position of each output's maximum is found again in the backward pass, the first in
row-major window order as select-and-scatter picks it, `k*` = first k with x_k = max_k x_k, and the
input gradient is, for each window position k = (i, j),

    dx = sum_k place_k(dy * [k == k*])      (place_k: the output grid put at x's positions i + s_h * h, j + s_w * w)

where `place_k` is `lax.pad` with interior padding `stride - 1`: no scatter, no atomics, the inputs
JAX's gradient gives the cotangents to, and their sums (at most ceil(window / stride) cotangents per
dimension meet at one input position) added in float32 and rounded once. `lax.platform_dependent`
takes JAX's own on TPUs (the same numbers as `nnx.max_pool`) and this form everywhere else: on a CPU
it takes 0.31x [0.27, 0.32] of select-and-scatter's time (`python -m benchmarks.max_pool --batch 8`, 2
cores, noisy).
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _max_pool(x: jax.Array, pool: tuple) -> jax.Array:
  return _reduce_window_max(x, *pool)


def _max_pool_forward(x, pool):
  return _max_pool(x, pool), x


def _window_views(x: jax.Array, output_shape, window, strides, padding):
  """For each window position k (row-major), x at the output grid's k-th window elements (padded with -inf)."""
  padded = jnp.pad(x, ((0, 0), *padding, (0, 0)), constant_values=-jnp.inf)
  outputs = output_shape[1:-1]
  for offsets in itertools.product(*map(range, window)):  # row-major
    starts = (0, *offsets, 0)
    limits = (x.shape[0], *(o + s * (n - 1) + 1 for o, s, n in zip(offsets, strides, outputs)), x.shape[-1])
    yield offsets, lax.slice(padded, starts, limits, (1, *strides, 1))


def _max_pool_backward(pool, x, cotangent):
  # On TPUs select-and-scatter is native, and XLA's estimate of the ResNet-50 step (v5p:2x2x1, batch 256)
  # grows from 12.98 to 17.30 ms with the placements: not there.
  return (lax.platform_dependent(x, cotangent, tpu=functools.partial(_jax_gradient, pool),
                                 default=functools.partial(_gradient_without_scatter, pool)),)


def _jax_gradient(pool, x, cotangent):
  return jax.vjp(lambda x: _reduce_window_max(x, *pool), x)[1](cotangent)[0]


def _gradient_without_scatter(pool, x, cotangent):
  """The input gradient as the sum of placements of the module doc."""
  window, strides, padding = pool
  views = list(_window_views(x, cotangent.shape, window, strides, padding))
  index_dtype = jnp.int8 if len(views) <= jnp.iinfo(jnp.int8).max else jnp.int32  # written once, read once
  best, first_max = views[0][1], jnp.zeros(cotangent.shape, index_dtype)
  for k, (_, view) in enumerate(views[1:], start=1):  # strictly greater: the first maximum keeps its place
    larger = view > best
    best, first_max = jnp.where(larger, view, best), jnp.where(larger, jnp.asarray(k, index_dtype), first_max)
  cotangent = cotangent.astype(jnp.float32)
  padded_shape = [x.shape[0], *(n + low + high for n, (low, high) in zip(x.shape[1:-1], padding)), x.shape[-1]]
  gradient = jnp.zeros(padded_shape, jnp.float32)
  for k, (offsets, _) in enumerate(views):
    placed = jnp.where(first_max == k, cotangent, 0.0)
    config = [(0, 0, 0)]
    for offset, stride, size, out in zip(offsets, strides, padded_shape[1:-1], cotangent.shape[1:-1]):
      config.append((offset, size - offset - (stride * (out - 1) + 1), stride - 1))
    gradient = gradient + lax.pad(placed, 0.0, [*config, (0, 0, 0)])
  inner = tuple(slice(low, low + n) for n, (low, _) in zip(x.shape[1:-1], padding))
  return gradient[(slice(None), *inner, slice(None))].astype(x.dtype)


_max_pool.defvjp(_max_pool_forward, _max_pool_backward)
