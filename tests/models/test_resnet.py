"""ResNet: parameter counts, v1.5 layout, ghost BN, zero-init blocks, dtypes, functional use."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from lbjax.models import BasicBlock, BottleneckBlock, ResNet, ResNet18, ResNet50, ResNetTiny


def _count(model, kind=nnx.Param):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, kind)))


def _images(n, size=16, seed=0):
  return jax.random.normal(jax.random.key(seed), (n, size, size, 3))


def test_resnet50_has_exactly_25557032_parameters():
  model = nnx.eval_shape(lambda: ResNet50(rngs=nnx.Rngs(0)))
  assert _count(model) == 25_557_032
  # Every conv and BN: 1 stem + 16 blocks * 3 + 4 projections = 53 of each; BN mean+var per channel.
  convs = [m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Conv)]
  assert len(convs) == 53 and all(c.bias is None for c in convs)
  assert _count(model, nnx.BatchStat) == 2 * 26_560  # scale/bias count equals mean/var count.
  # Abstract forward at 224x224 in bfloat16 (no compute): float32 logits [N, 1000].
  logits = nnx.eval_shape(lambda m, x: m(x, train=True), nnx.eval_shape(
      lambda: ResNet50(dtype=jnp.bfloat16, rngs=nnx.Rngs(0))),
                          jax.ShapeDtypeStruct((2, 224, 224, 3), jnp.bfloat16))
  assert logits.shape == (2, 1000) and logits.dtype == jnp.float32


def test_resnet50_is_v1_5_stride_in_the_3x3_conv():
  model = nnx.eval_shape(lambda: ResNet50(rngs=nnx.Rngs(0)))
  first_of_stages = [model.blocks[i] for i in (0, 3, 7, 13)]
  assert all(isinstance(b, BottleneckBlock) for b in model.blocks)
  for stage, block in enumerate(first_of_stages):
    stride = (1, 1) if stage == 0 else (2, 2)
    assert block.conv1.strides == (1, 1)
    assert block.conv2.strides == stride and block.conv2.kernel_size == (3, 3)
    assert block.shortcut.conv.strides == stride
  assert model.blocks[1].shortcut is None
  assert model.stem_conv.kernel_size == (7, 7) and model.stem_conv.strides == (2, 2)
  assert model.head.kernel.shape == (2048, 1000)


def test_resnet18_and_tiny_parameter_counts():
  assert _count(nnx.eval_shape(lambda: ResNet18(1000, rngs=nnx.Rngs(0)))) == 11_689_512
  tiny = ResNetTiny(5, rngs=nnx.Rngs(0))
  # CIFAR stem 3x3x3x8 + BN; stage 1: two 3x3x8x8 + 2 BN; stage 2: 3x3x8x16, 3x3x16x16,
  # projection 1x1x8x16 + 3 BN; head 16x5 + 5.
  expected = (27 * 8 + 2 * 8) + 2 * (72 * 8 + 2 * 8) + (
      72 * 16 + 144 * 16 + 8 * 16 + 3 * 2 * 16) + (16 * 5 + 5)
  assert _count(tiny) == expected
  assert isinstance(tiny.blocks[0], BasicBlock) and tiny.stem_conv.kernel_size == (3, 3)


def _bottleneck(**kwargs):
  """A two-stage bottleneck ResNet with the ImageNet stem (7x7/2 conv, 3x3/2 max-pool)."""
  return ResNet((1, 1), block="bottleneck", num_classes=5, num_filters=4, rngs=nnx.Rngs(0),
                **kwargs)


def _models(**kwargs):
  """The two small test architectures (shared so that XLA compiles each op shape once)."""
  return [ResNetTiny(5, rngs=nnx.Rngs(0), **kwargs), _bottleneck(**kwargs)]


def test_forward_shapes_train_and_eval():
  x = _images(2)
  for model in _models():
    for train in (True, False):
      logits = model(x, train=train)
      assert logits.shape == (2, 5) and logits.dtype == jnp.float32
      assert np.all(np.isfinite(logits))


def test_zero_init_last_bn_scale_makes_blocks_their_shortcut():
  for model in _models():
    x = jax.nn.relu(model.stem_conv(_images(2)))
    for b in model.blocks:
      out = b(x, train=True)
      np.testing.assert_array_equal(b.residual(x, train=True), 0.0)
      np.testing.assert_array_equal(out, jax.nn.relu(b.shortcut_path(x, train=True)))
      if b.shortcut is None:  # Identity shortcut on a post-ReLU input: the block is the identity.
        np.testing.assert_array_equal(out, x)
      x = out
  plain = ResNetTiny(5, zero_init_last_bn_scale=False, rngs=nnx.Rngs(0))
  x = jax.nn.relu(plain.stem_conv(_images(2)))
  assert np.all(plain.blocks[0].residual(x, train=True) != 0.0)


def test_ghost_bn_groups_equal_separate_batches():
  g, k = 2, 2
  x = _images(k * g)
  ghost = ResNetTiny(5, bn_group_size=g, rngs=nnx.Rngs(0))
  logits = ghost(x, train=True)
  separate_stats = []
  for i in range(k):
    single = ResNetTiny(5, bn_group_size=None, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(logits[i * g:(i + 1) * g], single(x[i * g:(i + 1) * g], train=True),
                               rtol=1e-4, atol=1e-5)
    separate_stats.append(nnx.state(single, nnx.BatchStat))
  # Running averages move by the mean over groups, i.e. the mean of the separate updates.
  mean_of_separate = jax.tree.map(lambda *s: sum(s) / k, *separate_stats)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               nnx.state(ghost, nnx.BatchStat), mean_of_separate)


def test_train_updates_batch_stats_eval_uses_them():
  model = ResNetTiny(5, rngs=nnx.Rngs(0))
  x = _images(4)
  before = nnx.state(model, nnx.BatchStat)
  eval_logits = model(x, train=False)
  jax.tree.map(np.testing.assert_array_equal, nnx.state(model, nnx.BatchStat), before)
  np.testing.assert_allclose(model(x[:1], train=False), eval_logits[:1], rtol=1e-5, atol=1e-6)
  train_logits = model(x, train=True)
  assert not np.allclose(train_logits, eval_logits, atol=1e-3)
  stem = model.stem_bn
  assert not np.allclose(stem.running_mean[...], 0.0)
  assert not np.allclose(train_logits[:1], model(x[:1] + 0.0, train=False), atol=1e-3)


def test_functional_split_merge_in_jit():
  """The trainer's pattern: params and BN statistics split out, merged inside a jitted grad."""
  model = ResNetTiny(5, bn_group_size=2, rngs=nnx.Rngs(0))
  graphdef, params, batch_stats = nnx.split(model, nnx.Param, nnx.BatchStat)  # Nothing else.
  batch_stats = nnx.to_pure_dict(batch_stats)

  @jax.jit
  def step(params, batch_stats, x):
    def loss(params):
      m = nnx.merge(graphdef, params, batch_stats)
      logits = m(x, train=True)
      return jnp.mean(logits**2), nnx.to_pure_dict(nnx.state(m, nnx.BatchStat))
    (value, new_stats), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, new_stats, grads

  value, new_stats, grads = step(params, batch_stats, _images(4))
  assert np.isfinite(value)
  assert jax.tree.structure(grads) == jax.tree.structure(params)
  changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), new_stats,
                                         batch_stats))
  assert all(changed)


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model16 = ResNetTiny(5, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  model32 = ResNetTiny(5, rngs=nnx.Rngs(0))
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model16, nnx.Param))} == {jnp.dtype("float32")}
  x = _images(4)
  logits16 = model16(x, train=True)
  assert logits16.dtype == jnp.float32
  np.testing.assert_allclose(logits16, model32(x, train=True), atol=0.1)
  assert {x.dtype for x in jax.tree.leaves(nnx.state(model16, nnx.BatchStat))} == {
      jnp.dtype("float32")}


@pytest.mark.parametrize("kwargs, message", [
    (dict(stage_sizes=(1,), block="wide"), "Unknown block type 'wide'"),
    (dict(stage_sizes=()), "stage_sizes must be a non-empty sequence of positive ints"),
    (dict(stage_sizes=(1, 0)), "stage_sizes must be a non-empty sequence of positive ints"),
    (dict(stage_sizes=(1,), num_classes=0), "num_classes must be a positive int"),
    (dict(stage_sizes=(1,), num_filters=-4), "num_filters must be a positive int"),
    (dict(stage_sizes=(1,), bn_group_size=0), "bn_group_size"),
    (dict(stage_sizes=(1,), bn_momentum=1.5), r"bn_momentum must be in \[0, 1\), got 1.5"),
    (dict(stage_sizes=(1,), bn_epsilon=-1.0), "bn_epsilon must be > 0"),
    (dict(stage_sizes=(1,), bn_momentum="0.9"), "bn_momentum must be a finite number, got '0.9'"),
    (dict(stage_sizes=(1,), bn_epsilon=float("inf")), "bn_epsilon must be a finite number, got inf"),
    (dict(stage_sizes="34"), "stage_sizes must be a non-empty sequence of positive ints"),
    # A depth where the stage sizes go: how to build that depth, or which depths there are.
    (dict(stage_sizes=50), r"not a depth; for ResNet-50 pass ResNet\(\(3, 4, 6, 3\), block='bottleneck'"),
    (dict(stage_sizes="resnet101"), r"for ResNet-101 pass ResNet\(\(3, 4, 23, 3\), block='bottleneck'"),
    (dict(stage_sizes=42), r"the standard depths are 18, 34, 50, 101, 152 \(42 is not one\)"),
    # A dtype name that is not one, or not floating point (was 'data type not understood' or a
    # failure at the first call).
    (dict(stage_sizes=(1,), dtype="bf16"), "dtype must name a floating-point dtype .* got 'bf16'"),
    (dict(stage_sizes=(1,), dtype="int8"), "dtype must be a floating-point dtype .* got int8"),
    (dict(stage_sizes=(1,), param_dtype="float8"), "param_dtype must name a floating-point dtype"),
    # An "off" that is a truthy string built the CIFAR stem or zeroed the last BN scales.
    (dict(stage_sizes=(1,), small_inputs="no"), "small_inputs must be True or False, got 'no'"),
    (dict(stage_sizes=(1,), zero_init_last_bn_scale="false"), "zero_init_last_bn_scale must be True or False"),
])
def test_constructor_validation(kwargs, message):
  kwargs.setdefault("num_classes", 3)
  with pytest.raises(ValueError, match=message):
    ResNet(**kwargs, rngs=nnx.Rngs(0))


def test_a_one_channel_resnet_takes_grayscale_images_with_or_without_their_channel_axis():
  model = ResNetTiny(3, input_channels=1, small_inputs=True, num_filters=4, rngs=nnx.Rngs(0))
  images = jax.random.uniform(jax.random.key(0), (2, 8, 8))
  np.testing.assert_array_equal(model(images, train=False), model(images[..., None], train=False))
  with pytest.raises(ValueError, match=r"images of shape \[N, H, W, 1\] or \[N, H, W\], got shape \(2, 8\)"):
    model(jnp.ones((2, 8)), train=False)


def test_call_validation():
  model = ResNetTiny(3, bn_group_size=4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"images of shape \[N, H, W, 3\], got shape \(2, 8, 8\)"):
    model(jnp.ones((2, 8, 8)), train=False)
  with pytest.raises(ValueError, match=r"images of shape \[N, H, W, 3\], got shape \(2, 8, 8, 1\)"):
    model(jnp.ones((2, 8, 8, 1)), train=False)
  with pytest.raises(ValueError, match="floating-point array"):
    model(jnp.ones((4, 8, 8, 3), jnp.uint8), train=False)
  with pytest.raises(ValueError, match="batch size 6 is not divisible by the BatchNorm group size 4"):
    model(jnp.ones((6, 8, 8, 3)), train=True)
