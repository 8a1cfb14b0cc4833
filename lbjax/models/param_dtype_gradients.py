"""Convolutions and dense layers that compute in a low precision and give their parameters' gradients in
the parameters' precision.

A bfloat16 layer with float32 parameters casts its kernel to bfloat16 and JAX's transpose then makes
the kernel gradient where the batch is summed out, in a convolution (or dot) with a bfloat16 output:
under data parallelism the partial sums that leave each device are bfloat16, and XLA's all-reduce
adds them across the devices in bfloat16 (`lbjax-train --compile-only` says when it does). The
reference ResNet-50 trainings sum float32 gradients across replicas (their optimizers reduce the
gradients after the cast back to the variables' dtype).

Here the product is unchanged (bfloat16 inputs, the kernel cast to bfloat16, the same convolution),
the input gradient is JAX's own, and the kernel gradient is the same transposed
convolution (dot) with `preferred_element_type` set to the kernel's dtype: the MXU / tensor cores
accumulate in float32 anyway, so the multiply-adds stay bfloat16 and only the output, and with it
the cross-device sum, is float32:

    dW = conv(x^T, dy^T; window strides <- kernel dilation, kernel dilation <- window strides)   (float32 out)
    dW = x[:, ::s, ::s, :]^T dy        (an unpadded 1x1 convolution of stride s: a matrix product, float32 out)
    dW = x^T dy                                                                                    (dense, float32 out)

The 1x1 form matters on GPUs. cuDNN's kernel-gradient convolution has no bfloat16-in, float32-out
form, so XLA:GPU converts both operands to float32 and convolves in float32 (a float32 copy of the
layer's input and of its cotangent written per step), while a bfloat16 matrix product with a float32
output is one of its GEMMs. Compiled for an H100 (deviceless, `lbjax.train.gpu_targets`; ResNet-50,
batch 256), the step's kernels write 46.8 GiB per step with every kernel gradient a convolution and
34.5 GiB with the 1x1 ones (36 of 53) as products; 27.9 GiB without `param_dtype_gradients`. XLA:TPU
convolves bfloat16 into float32 natively either way.

A bias is added in its own (parameter) dtype, so the layer's output is float32 there and the bias
gradient, the batch sum of that output's cotangent, is a float32 sum too.

`conv_general_dilated`, `dot_general` and `promote_inputs_only` are the `conv_general_dilated`,
`dot_general` and `promote_dtype` hooks of `flax.nnx.Conv` / `nnx.Linear`.
"""

import dataclasses
import functools
from typing import Any, Sequence

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np


def promote_inputs_only(args: Sequence[Any], *, dtype: Any = None) -> tuple[Any, ...]:
  """`nnx.Conv`/`nnx.Linear`'s `promote_dtype` hook: (inputs, kernel, bias) with the inputs cast to
  `dtype` (None: the type all of them promote to, as flax's own hook) and the kernel and bias left in
  their parameter dtype: `conv_general_dilated`/`dot_general` cast the kernel, and the bias is added in
  its own dtype (the layer's output is then float32), so its gradient is a float32 sum too."""
  inputs, *params = args
  if dtype is None:
    dtype = jnp.result_type(*(x for x in args if x is not None))
  return (jnp.asarray(inputs, dtype), *params)


@dataclasses.dataclass(frozen=True)
class _Conv:
  """The static arguments of one convolution (hashable: `custom_vjp`'s non-differentiable argument)."""
  window_strides: tuple[int, ...]
  padding: tuple[tuple[int, int], ...]
  dimension_numbers: lax.ConvDimensionNumbers
  precision: Any

  def __call__(self, lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(lhs, rhs, self.window_strides, self.padding,
                                    dimension_numbers=self.dimension_numbers, precision=self.precision)

  def kernel_gradient(self, lhs: jax.Array, cotangent: jax.Array, kernel_shape: Sequence[int],
                      dtype: Any) -> jax.Array:
    """d(sum(cotangent * conv(lhs, W)))/dW as one convolution with a `dtype` output: the batch is the
    contracted dimension, the output's spatial dimensions the window (dilated by the strides)."""
    lhs_spec, rhs_spec, out_spec = self.dimension_numbers
    swap = lambda spec: (spec[1], spec[0]) + tuple(spec[2:])
    in_sizes = [lhs.shape[d] for d in lhs_spec[2:]]
    window = [kernel_shape[d] for d in rhs_spec[2:]]
    if all(k == 1 for k in window) and all(pad == (0, 0) for pad in self.padding):
      return self._pointwise_kernel_gradient(lhs, cotangent, dtype)
    out_sizes = [cotangent.shape[d] for d in out_spec[2:]]
    padding = []
    for (low, _), size, k, out, stride in zip(self.padding, in_sizes, window, out_sizes, self.window_strides):
      dilated_out = 1 + stride * (out - 1)
      padding.append((low, dilated_out - size + k - low - 1))
    return lax.conv_general_dilated(
        lhs, cotangent, window_strides=(1,) * len(window), padding=padding, rhs_dilation=self.window_strides,
        dimension_numbers=lax.ConvDimensionNumbers(swap(lhs_spec), swap(out_spec), swap(rhs_spec)),
        precision=self.precision, preferred_element_type=dtype)

  def _pointwise_kernel_gradient(self, lhs: jax.Array, cotangent: jax.Array, dtype: Any) -> jax.Array:
    """The kernel gradient of an unpadded 1x1 convolution as the matrix product it is: the input at the
    output's positions (every `stride`-th), its batch and positions contracted with the cotangent's."""
    lhs_spec, rhs_spec, out_spec = self.dimension_numbers
    strided = [slice(None)] * lhs.ndim
    for dimension, stride in zip(lhs_spec[2:], self.window_strides):
      strided[dimension] = slice(None, None, stride)
    contracted = ((lhs_spec[0], *lhs_spec[2:]), (out_spec[0], *out_spec[2:]))
    sampled = lhs[tuple(strided)]
    if any(stride > 1 for stride in self.window_strides):
      # Materialised first: XLA:GPU 0.11.2 (jax 0.11.2) aborts compiling a GEMM that fuses the strided slice
      # ("triton_tiling_propagation.cc: Check failed: subdim_size_accumulator == dim_size (784 vs. 56)").
      sampled = lax.optimization_barrier(sampled)
    product = lax.dot_general(sampled, cotangent, (contracted, ((), ())), precision=self.precision,
                              preferred_element_type=dtype)  # [in features, out features]
    kernel = product.reshape(product.shape + (1,) * (lhs.ndim - 2))  # axes: in, out, the 1x1 window
    return jnp.transpose(kernel, np.argsort((rhs_spec[1], rhs_spec[0], *rhs_spec[2:])))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(lhs: jax.Array, kernel: jax.Array, conv: _Conv) -> jax.Array:
  return conv(lhs, kernel.astype(lhs.dtype))


def _conv_forward(lhs, kernel, conv):
  return _conv(lhs, kernel, conv), (lhs, kernel)


def _conv_backward(conv, residuals, cotangent):
  lhs, kernel = residuals
  _, input_vjp = jax.vjp(lambda x: conv(x, kernel.astype(lhs.dtype)), lhs)
  (input_gradient,) = input_vjp(cotangent)
  return input_gradient, conv.kernel_gradient(lhs, cotangent, kernel.shape, kernel.dtype)


_conv.defvjp(_conv_forward, _conv_backward)


def conv_general_dilated(lhs: jax.Array, rhs: jax.Array, window_strides: Sequence[int], padding: Any, *,
                         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1, precision: Any = None,
                         preferred_element_type: Any = None, out_sharding: Any = None) -> jax.Array:
  """`lax.conv_general_dilated(lhs, rhs.astype(lhs.dtype), ...)` whose gradient w.r.t. `rhs` (the
  kernel, in its parameter dtype) is computed in `rhs.dtype` (see the module docstring).

  Strided, padded convolutions (string or explicit padding) of one feature group; no dilation, no
  `preferred_element_type` and no `out_sharding` (the output has `lhs`'s dtype and XLA's layout).

  Raises:
    ValueError: a dilation, several feature groups, `preferred_element_type` or `out_sharding`.
  """
  unsupported = {"lhs_dilation": lhs_dilation, "rhs_dilation": rhs_dilation, "out_sharding": out_sharding,
                 "preferred_element_type": preferred_element_type}
  named = [f"{name}={value!r}" for name, value in unsupported.items()
           if value is not None and (not name.endswith("dilation") or any(d != 1 for d in value))]
  if feature_group_count != 1:
    named.append(f"feature_group_count={feature_group_count}")
  if named:
    raise ValueError(f"param_dtype_gradients convolutions take no {', '.join(named)}; build the layer without "
                     "param_dtype_gradients for these.")
  numbers = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  window_strides = tuple(int(s) for s in window_strides)
  if isinstance(padding, str):
    padding = lax.padtype_to_pads([lhs.shape[d] for d in numbers.lhs_spec[2:]],
                                  [rhs.shape[d] for d in numbers.rhs_spec[2:]], window_strides, padding)
  padding = tuple((int(low), int(high)) for low, high in padding)
  return _conv(lhs, rhs, _Conv(window_strides, padding, numbers, precision))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _dense(inputs: jax.Array, kernel: jax.Array, precision: Any) -> jax.Array:
  return lax.dot_general(inputs, kernel.astype(inputs.dtype), (((inputs.ndim - 1,), (0,)), ((), ())),
                         precision=precision)


def _dense_forward(inputs, kernel, precision):
  return _dense(inputs, kernel, precision), (inputs, kernel)


def _dense_backward(precision, residuals, cotangent):
  inputs, kernel = residuals
  input_gradient = lax.dot_general(cotangent, kernel.astype(inputs.dtype),
                                   (((cotangent.ndim - 1,), (1,)), ((), ())), precision=precision)
  batch_dims = tuple(range(inputs.ndim - 1))
  kernel_gradient = lax.dot_general(inputs, cotangent, ((batch_dims, batch_dims), ((), ())), precision=precision,
                                    preferred_element_type=kernel.dtype)
  return input_gradient, kernel_gradient


_dense.defvjp(_dense_forward, _dense_backward)


def dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers: Any, precision: Any = None,
                preferred_element_type: Any = None, out_sharding: Any = None) -> jax.Array:
  """`nnx.Linear`'s product `lhs @ rhs.astype(lhs.dtype)` (the last axis of `lhs` with the first of a
  2-d kernel), whose gradient w.r.t. `rhs` is computed in `rhs.dtype` (see the module docstring).

  Raises:
    ValueError: other dimension numbers (batch dimensions, another contraction), a kernel that is not
      2-d, `preferred_element_type` or `out_sharding`.
  """
  expected = (((lhs.ndim - 1,), (0,)), ((), ()))
  normalised = tuple(tuple(tuple(int(d) for d in dims) for dims in pair) for pair in dimension_numbers)
  if rhs.ndim != 2 or normalised != expected or preferred_element_type is not None or out_sharding is not None:
    raise ValueError(f"param_dtype_gradients dense layers take a 2-d kernel contracted as {expected} and no "
                     f"preferred_element_type or out_sharding, got dimension_numbers={dimension_numbers}, a "
                     f"{rhs.ndim}-d kernel, preferred_element_type={preferred_element_type!r}, out_sharding="
                     f"{out_sharding!r}; build the layer without param_dtype_gradients for these.")
  return _dense(lhs, rhs, precision)
