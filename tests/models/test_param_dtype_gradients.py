"""Kernel gradients in the parameters' dtype: the same gradients as JAX's own, with a float32 kernel gradient
of a bfloat16 layer, and a bfloat16 ResNet whose data-parallel step sums float32 kernel gradients."""

from flax import nnx
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax.models import param_dtype_gradients
from lbjax.models.resnet import ResNet

CONVOLUTIONS = [  # batch, size, in, out, window, stride, padding
    (4, 16, 3, 8, 7, 2, ((3, 3), (3, 3))),  # the ResNet stem
    (2, 15, 4, 6, 3, 2, ((1, 1), (1, 1))),  # odd input, strided: the transpose pads asymmetrically
    (3, 9, 5, 4, 1, 2, ((0, 0), (0, 0))),  # strided 1x1 projection shortcut
    (2, 8, 4, 4, 3, 1, ((1, 1), (1, 1))),
    (2, 10, 3, 5, 3, 2, "SAME"),
    (2, 11, 3, 5, 3, 3, "VALID"),
]
NHWC = ("NHWC", "HWIO", "NHWC")


def _conv_loss(conv, padding, stride):
  return lambda x, w: jnp.sum(jnp.sin(conv(x, w, (stride, stride), padding, dimension_numbers=NHWC)).astype(
      jnp.float32))


def _arrays(rng, batch, size, cin, cout, window, dtype):
  x = jnp.asarray(rng.normal(size=(batch, size, size, cin)), dtype)
  w = jnp.asarray(rng.normal(size=(window, window, cin, cout)) / window, jnp.float32)
  return x, w


@pytest.mark.parametrize("batch,size,cin,cout,window,stride,padding", CONVOLUTIONS)
def test_a_float32_convolution_has_jaxs_own_value_and_gradients(batch, size, cin, cout, window, stride, padding):
  x, w = _arrays(np.random.default_rng(0), batch, size, cin, cout, window, jnp.float32)
  ours = _conv_loss(param_dtype_gradients.conv_general_dilated, padding, stride)
  jaxs = _conv_loss(lax.conv_general_dilated, padding, stride)
  np.testing.assert_allclose(ours(x, w), jaxs(x, w), rtol=1e-6)
  for a, b in zip(jax.grad(ours, (0, 1))(x, w), jax.grad(jaxs, (0, 1))(x, w)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("numbers", [("NCHW", "OIHW", "NCHW"), ("NHWC", "OIHW", "NCHW"), ("CHWN", "HWOI", "HNWC")])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_1x1_kernel_gradient_is_jaxs_in_any_layout(numbers, stride):
  """The 1x1 kernel gradient, a matrix product over the strided input (not a convolution): JAX's own
  in layouts where batch, features and positions sit anywhere."""
  rng = np.random.default_rng(4)
  lhs_shape = {"N": 3, "C": 5, "H": 9, "W": 7}
  x = jnp.asarray(rng.normal(size=[lhs_shape[d] for d in numbers[0]]), jnp.float32)
  w = jnp.asarray(rng.normal(size=[{"O": 4, "I": 5, "H": 1, "W": 1}[d] for d in numbers[1]]), jnp.float32)

  def loss(conv):
    return lambda x, w: jnp.sum(jnp.sin(conv(x, w, (stride, stride), "VALID", dimension_numbers=numbers)))

  for ours, jaxs in zip(jax.grad(loss(param_dtype_gradients.conv_general_dilated), (0, 1))(x, w),
                        jax.grad(loss(lax.conv_general_dilated), (0, 1))(x, w)):
    np.testing.assert_allclose(ours, jaxs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch,size,cin,cout,window,stride,padding", CONVOLUTIONS[:3])
def test_a_bfloat16_convolution_gives_the_float32_kernel_gradient_of_its_bfloat16_products(
    batch, size, cin, cout, window, stride, padding):
  """Forward and input gradient as JAX's bfloat16 convolution; the kernel gradient is the float32 sum of
  the bfloat16 products (the float32 convolution of the bfloat16 values), not its bfloat16 rounding."""
  x, w = _arrays(np.random.default_rng(1), batch, size, cin, cout, window, jnp.bfloat16)
  ours = _conv_loss(param_dtype_gradients.conv_general_dilated, padding, stride)
  jaxs = _conv_loss(lambda x, w, *a, **k: lax.conv_general_dilated(x, w.astype(x.dtype), *a, **k), padding, stride)
  assert ours(x, w) == jaxs(x, w)
  (ours_x, ours_w), (jaxs_x, jaxs_w) = jax.grad(ours, (0, 1))(x, w), jax.grad(jaxs, (0, 1))(x, w)
  assert ours_x.dtype == jnp.bfloat16 and ours_w.dtype == jnp.float32
  np.testing.assert_array_equal(ours_x, jaxs_x)
  cotangent = jnp.cos(lax.conv_general_dilated(x, w.astype(x.dtype), (stride, stride), padding,
                                               dimension_numbers=NHWC)).astype(jnp.bfloat16)
  exact = jax.vjp(lambda k: lax.conv_general_dilated(x.astype(jnp.float32), k, (stride, stride), padding,
                                                     dimension_numbers=NHWC, precision="highest"),
                  w.astype(jnp.bfloat16).astype(jnp.float32))[1](cotangent.astype(jnp.float32))[0]
  ours_error = float(jnp.max(jnp.abs(ours_w - exact)))
  jaxs_error = float(jnp.max(jnp.abs(jaxs_w.astype(jnp.float32) - exact)))
  assert ours_error <= 1e-4 * float(jnp.max(jnp.abs(exact))) < jaxs_error


def test_a_bfloat16_dense_layer_gives_a_float32_kernel_gradient_and_jaxs_input_gradient():
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.normal(size=(4, 3, 6)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
  numbers = (((2,), (0,)), ((), ()))
  ours = lambda x, w: jnp.sum(jnp.sin(param_dtype_gradients.dot_general(x, w, numbers)).astype(jnp.float32))
  jaxs = lambda x, w: jnp.sum(jnp.sin(lax.dot_general(x, w.astype(x.dtype), numbers)).astype(jnp.float32))
  assert ours(x, w) == jaxs(x, w)
  (ours_x, ours_w), (jaxs_x, _) = jax.grad(ours, (0, 1))(x, w), jax.grad(jaxs, (0, 1))(x, w)
  np.testing.assert_array_equal(ours_x, jaxs_x)
  cotangent = jnp.cos(lax.dot_general(x, w.astype(x.dtype), numbers)).astype(jnp.float32)
  exact = jnp.einsum("abi,abo->io", x.astype(jnp.float32), cotangent, precision="highest")
  assert ours_w.dtype == jnp.float32
  np.testing.assert_allclose(ours_w, exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keywords,named", [
    ({"rhs_dilation": (2, 2)}, r"rhs_dilation=\(2, 2\)"),
    ({"feature_group_count": 2}, "feature_group_count=2"),
    ({"preferred_element_type": jnp.float32}, "preferred_element_type"),
])
def test_what_the_convolution_does_not_cover_is_refused_by_name(keywords, named):
  x, w = jnp.ones((1, 8, 8, 4)), jnp.ones((3, 3, 2 if "feature_group_count" in keywords else 4, 4))
  with pytest.raises(ValueError, match=named):
    param_dtype_gradients.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NHWC, **keywords)


def test_a_resnet_computes_the_same_and_makes_float32_gradients():
  """param_dtype_gradients=True: the same logits but for the rounding of the head's bias addition (now in
  float32), and every product that sums the batch into a kernel's gradient (the convolutions' and the
  head's) has a float32 output, as has the head's bias gradient: data parallelism all-reduces float32;
  the plain bfloat16 ResNet makes them in bfloat16. (XLA:CPU computes bfloat16 convolutions in float32, so
  the all-reduce itself is checked on a TPU compile: tests/train/test_compile_only.py.)"""
  images = jnp.asarray(np.random.default_rng(3).normal(size=(6, 16, 16, 3)), jnp.float32)
  kernel_gradient_types, bias_gradient_types, logits = {}, {}, {}
  for flag in (False, True):
    model = ResNet((1, 1), block="basic", num_classes=4, num_filters=8, small_inputs=True, dtype=jnp.bfloat16,
                   param_dtype_gradients=flag, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    kernels = [p for p in jax.tree.leaves(params) if p.ndim >= 2]
    # A 1x1 convolution's kernel gradient is a matrix product: [in, out], the window's 1s left out.
    kernel_shapes = {tuple(p.shape) for p in kernels} | {p.shape[-2:] for p in kernels if p.shape[:-2] == (1, 1)}

    def loss(params, graphdef=graphdef, rest=rest):
      return jnp.mean(nnx.merge(graphdef, params, rest)(images, train=False) ** 2)

    logits[flag] = nnx.merge(graphdef, params, rest)(images, train=False)
    gradient_jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
    kernel_gradient_types[flag] = [str(e.outvars[0].aval.dtype) for e in _equations(gradient_jaxpr)
                                   if e.primitive.name in ("conv_general_dilated", "dot_general")
                                   and tuple(e.outvars[0].aval.shape) in kernel_shapes]
    bias_gradient_types[flag] = {str(e.outvars[0].aval.dtype) for e in _equations(gradient_jaxpr)
                                 if e.primitive.name == "reduce_sum" and e.outvars[0].aval.shape == (4,)}
  np.testing.assert_allclose(logits[False], logits[True], rtol=1e-2, atol=1e-2)
  assert len(kernel_gradient_types[True]) == 7  # 5 convolutions (stem, 2 per block) + 1 shortcut + the head
  assert set(kernel_gradient_types[False]) == {"bfloat16"} and set(kernel_gradient_types[True]) == {"float32"}
  assert bias_gradient_types == {False: {"bfloat16"}, True: {"float32"}}


def _equations(jaxpr):
  """Every equation of `jaxpr` (a Jaxpr or ClosedJaxpr), those of the calls in it (jit, custom_vjp) included."""
  for equation in getattr(jaxpr, "jaxpr", jaxpr).eqns:
    yield equation
    for value in equation.params.values():
      if hasattr(value, "eqns") or hasattr(getattr(value, "jaxpr", None), "eqns"):
        yield from _equations(value)


def test_param_dtype_gradients_takes_a_bool():
  with pytest.raises(ValueError, match="param_dtype_gradients must be True or False"):
    ResNet((1,), num_classes=2, param_dtype_gradients="yes", rngs=nnx.Rngs(0))
