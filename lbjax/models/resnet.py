"""ResNet v1.5 (He et al. 2016, as trained with LARS in papers/000 §5 and LEGW in papers/001 §5.2).

"v1.5" is ResNet v1 with the stride of a downsampling bottleneck block in its 3x3 convolution rather
than in the first 1x1 (as in torchvision and the flax examples). Convolutions have no bias (each is
followed by BatchNorm); padding is symmetric like torchvision's (3 for the 7x7 stem, 1 for 3x3), so
ResNet-50 with 1000 classes has exactly 25,557,032 parameters.
"""

from collections.abc import Mapping, Sequence
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from lbjax.models import param_dtype_gradients as kernel_gradients
from lbjax.models import pooling
from lbjax.models.relu import relu
from lbjax.models import validation
from lbjax.models.batch_norm import GhostBatchNorm

BLOCK_TYPES = ("bottleneck", "basic")

# He et al. (2015) initialisation, as torchvision: N(0, 2 / (k*k*out_channels)).
_conv_init = jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class _BNSettings:
  """The BatchNorm/dtype settings every block of one ResNet shares."""

  def __init__(self, group_size, momentum, epsilon, zero_init_last, dtype, param_dtype, param_dtype_gradients):
    self.group_size = group_size
    self.momentum = momentum
    self.epsilon = epsilon
    self.zero_init_last = zero_init_last
    self.dtype = dtype
    self.param_dtype = param_dtype
    self.param_dtype_gradients = param_dtype_gradients

  def kernel_hooks(self, product: str) -> dict[str, Any]:
    """The `nnx.Conv` (`product="conv_general_dilated"`) or `nnx.Linear` (`"dot_general"`) keywords
    that make the kernel gradient in `param_dtype` (`lbjax.models.param_dtype_gradients`); none unless
    `param_dtype_gradients`."""
    if not self.param_dtype_gradients:
      return {}
    return {product: getattr(kernel_gradients, product), "promote_dtype": kernel_gradients.promote_inputs_only}

  def batch_norm(self, features: int, *, last: bool = False) -> GhostBatchNorm:
    return GhostBatchNorm(
        features, group_size=self.group_size, momentum=self.momentum, epsilon=self.epsilon,
        zero_init_scale=last and self.zero_init_last, dtype=self.dtype,
        param_dtype=self.param_dtype)

  def conv(self, in_features: int, out_features: int, kernel_size: int, stride: int,
           rngs: nnx.Rngs) -> nnx.Conv:
    pad = (kernel_size - 1) // 2
    return nnx.Conv(
        in_features, out_features, (kernel_size, kernel_size), strides=(stride, stride),
        padding=((pad, pad), (pad, pad)), use_bias=False, kernel_init=_conv_init,
        dtype=self.dtype, param_dtype=self.param_dtype, rngs=rngs, **self.kernel_hooks("conv_general_dilated"))


class _Shortcut(nnx.Module):
  """Projection shortcut: 1x1 convolution with stride, then BatchNorm."""

  def __init__(self, in_features: int, out_features: int, stride: int,
               settings: _BNSettings, rngs: nnx.Rngs):
    self.conv = settings.conv(in_features, out_features, 1, stride, rngs)
    self.bn = settings.batch_norm(out_features)

  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    return self.bn(self.conv(x), train=train)


class BottleneckBlock(nnx.Module):
  """1x1 (f) -> 3x3 (f, stride) -> 1x1 (4f) with BN after each conv, plus the shortcut.

  out = relu(BN3(conv3(relu(BN2(conv2(relu(BN1(conv1(x)))))))) + shortcut(x)), where shortcut is
  the identity when shapes agree and a strided 1x1 projection with BN otherwise.
  """

  expansion = 4

  def __init__(self, in_features: int, features: int, stride: int,
               settings: _BNSettings, rngs: nnx.Rngs):
    out_features = features * self.expansion
    self.conv1 = settings.conv(in_features, features, 1, 1, rngs)
    self.bn1 = settings.batch_norm(features)
    self.conv2 = settings.conv(features, features, 3, stride, rngs)
    self.bn2 = settings.batch_norm(features)
    self.conv3 = settings.conv(features, out_features, 1, 1, rngs)
    self.bn3 = settings.batch_norm(out_features, last=True)
    self.shortcut = (_Shortcut(in_features, out_features, stride, settings, rngs)
                     if stride != 1 or in_features != out_features else None)

  def residual(self, x: jax.Array, *, train: bool) -> jax.Array:
    """The residual branch F(x) (before the addition)."""
    y = relu(self.bn1(self.conv1(x), train=train))
    y = relu(self.bn2(self.conv2(y), train=train))
    return self.bn3(self.conv3(y), train=train)

  def shortcut_path(self, x: jax.Array, *, train: bool) -> jax.Array:
    """The shortcut branch: identity or projection."""
    return x if self.shortcut is None else self.shortcut(x, train=train)

  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    return relu(self.residual(x, train=train) + self.shortcut_path(x, train=train))


class BasicBlock(nnx.Module):
  """3x3 (f, stride) -> 3x3 (f) with BN after each conv, plus the shortcut (ResNet-18/34).

  out = relu(BN2(conv2(relu(BN1(conv1(x))))) + shortcut(x)).
  """

  expansion = 1

  def __init__(self, in_features: int, features: int, stride: int,
               settings: _BNSettings, rngs: nnx.Rngs):
    self.conv1 = settings.conv(in_features, features, 3, stride, rngs)
    self.bn1 = settings.batch_norm(features)
    self.conv2 = settings.conv(features, features, 3, 1, rngs)
    self.bn2 = settings.batch_norm(features, last=True)
    self.shortcut = (_Shortcut(in_features, features, stride, settings, rngs)
                     if stride != 1 or in_features != features else None)

  def residual(self, x: jax.Array, *, train: bool) -> jax.Array:
    """The residual branch F(x) (before the addition)."""
    y = relu(self.bn1(self.conv1(x), train=train))
    return self.bn2(self.conv2(y), train=train)

  def shortcut_path(self, x: jax.Array, *, train: bool) -> jax.Array:
    """The shortcut branch: identity or projection."""
    return x if self.shortcut is None else self.shortcut(x, train=train)

  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    return relu(self.residual(x, train=train) + self.shortcut_path(x, train=train))


# The standard depths (He et al. 2016, Table 1): blocks per stage and block type.
STAGES_BY_DEPTH = {18: ((2, 2, 2, 2), "basic"), 34: ((3, 4, 6, 3), "basic"),
                   50: ((3, 4, 6, 3), "bottleneck"), 101: ((3, 4, 23, 3), "bottleneck"),
                   152: ((3, 8, 36, 3), "bottleneck")}


def _check_not_a_depth(stage_sizes: Any) -> None:
  """Raises a `ValueError` that says how to build a depth when `stage_sizes` is one (50, "resnet50")."""
  if isinstance(stage_sizes, bool) or not isinstance(stage_sizes, (int, str)):
    return
  digits = "".join(c for c in str(stage_sizes) if c.isdigit())
  depth = int(digits) if digits else None
  if depth in STAGES_BY_DEPTH:
    stages, block = STAGES_BY_DEPTH[depth]
    how = f"for ResNet-{depth} pass ResNet({stages}, block={block!r}, ...)"
  else:
    how = f"the standard depths are {', '.join(map(str, STAGES_BY_DEPTH))} ({depth or stage_sizes!r} is not one)"
  raise ValueError(
      f"stage_sizes must be a non-empty sequence of positive ints (blocks per stage), got {stage_sizes!r}: "
      f"ResNet takes the blocks of each stage, not a depth; {how}, or use ResNet50(...) or ResNet18(...).")


class ResNet(nnx.Module):
  """ResNet v1.5 for NHWC images.

  Stem: 7x7/2 conv (64 filters by default), BN, ReLU, 3x3/2 max-pool; with `small_inputs=True`
  the CIFAR stem instead: 3x3/1 conv, BN, ReLU, no pooling. Then `len(stage_sizes)` stages; stage
  `i` has `stage_sizes[i]` blocks with `num_filters * 2**i` filters (x4 output for bottlenecks)
  and stride 2 in its first block for `i > 0`. Head: global average pool, dense layer.

  Parameters are `nnx.Param`; BatchNorm running averages are `nnx.BatchStat`; there is no other
  state. `dtype` is the compute dtype (e.g. bfloat16); parameters stay in `param_dtype` and the
  logits are returned in float32.

  `TENSOR_PARALLEL_SPECS`: the head's classes split over a `model` mesh axis (`lbjax.train.mesh`);
  `training_batch_multiple`: the batches ghost BN can split into its groups; `normalizes_over_the_batch`:
  whether BN spans the whole batch of a call.
  """

  TENSOR_PARALLEL_SPECS = {"head/kernel": P(None, "model"), "head/bias": P("model")}

  @staticmethod
  def training_batch_multiple(options: Mapping[str, Any]) -> int:
    """What every training batch one call of the model sees must be a multiple of, for the
    constructor keywords `options`: `bn_group_size` (ghost BN), 1 for BN over the whole batch. The
    trainer checks its batches against it before any compute (`lbjax.train.batch_plan`). A size that
    is not a positive int counts as 1 here: the constructor refuses it with its own message."""
    size = options.get("bn_group_size")
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1

  @staticmethod
  def normalizes_over_the_batch(options: Mapping[str, Any]) -> bool:
    """Whether, for the constructor keywords `options`, an example's output depends on the other examples
    of the batch one call sees: BatchNorm over the whole batch (no `bn_group_size`). Then accumulating
    micro-batches (`config.max_device_batch`) changes the update: the trainer refuses another value on resume."""
    return options.get("bn_group_size") is None

  def __init__(self, stage_sizes: Sequence[int], *, block: str = "bottleneck",
               num_classes: int, num_filters: int = 64, small_inputs: bool = False,
               bn_group_size: int | None = None, zero_init_last_bn_scale: bool = True,
               bn_momentum: float = 0.9, bn_epsilon: float = 1e-5,
               dtype: jnp.dtype = jnp.float32, param_dtype: jnp.dtype = jnp.float32,
               param_dtype_gradients: bool = False, input_channels: int = 3, rngs: nnx.Rngs):
    """Builds the network.

    Args:
      stage_sizes: blocks per stage, e.g. (3, 4, 6, 3) for ResNet-50.
      block: 'bottleneck' (ResNet-50/101/152) or 'basic' (ResNet-18/34).
      num_classes: size of the output layer.
      num_filters: filters of the stem and of the first stage (64 in the paper).
      small_inputs: CIFAR stem (3x3 stride-1 conv, no max-pool) for 32x32 inputs.
      bn_group_size: examples per BatchNorm group in training (ghost BN); None: whole batch.
      zero_init_last_bn_scale: initialise the scale of the last BN of each residual branch to 0
        (Goyal et al. 2017), so every block starts as relu(shortcut(x)).
      bn_momentum: decay of the BatchNorm running averages.
      bn_epsilon: BatchNorm epsilon.
      dtype: compute dtype.
      param_dtype: parameter dtype.
      param_dtype_gradients: compute the kernel gradients of the convolutions and the dense head in
        `param_dtype` (the multiply-adds stay in `dtype`; `lbjax.models.param_dtype_gradients`) and
        add the head's bias in `param_dtype`, so data parallelism sums every gradient across devices
        in `param_dtype`; False: kernel and bias gradients in `dtype`, as JAX's transpose of the
        bfloat16 layers makes them. The same network either way (the logits differ by the rounding
        of the head's bias addition); no effect when `dtype` is `param_dtype`.
      input_channels: channels of the input images.
      rngs: `nnx.Rngs` for parameter initialisation.

    Raises:
      ValueError: on `rngs` that is not an `nnx.Rngs`, an unknown `block`, non-positive sizes (or a depth such as 50 for
        `stage_sizes`), BatchNorm settings out of range or a dtype that is not floating point.
    """
    validation.check_rngs(rngs)
    _check_not_a_depth(stage_sizes)
    stage_sizes = validation.check_positive_int_sequence("stage_sizes", stage_sizes)
    if block not in BLOCK_TYPES:
      raise ValueError(f"Unknown block type {block!r}; expected one of {BLOCK_TYPES}.")
    validation.check_positive_int("num_classes", num_classes)
    validation.check_positive_int("num_filters", num_filters)
    validation.check_positive_int("input_channels", input_channels)
    if bn_group_size is not None:
      validation.check_positive_int("bn_group_size (None for the whole batch)", bn_group_size)
    validation.check_batch_norm("bn_momentum", bn_momentum, "bn_epsilon", bn_epsilon)
    validation.check_float_dtype("dtype", dtype)
    validation.check_float_dtype("param_dtype", param_dtype)
    for name, value in (("small_inputs", small_inputs), ("zero_init_last_bn_scale", zero_init_last_bn_scale),
                        ("param_dtype_gradients", param_dtype_gradients)):
      validation.check_bool(name, value)
    settings = _BNSettings(bn_group_size, bn_momentum, bn_epsilon, zero_init_last_bn_scale,
                           dtype, param_dtype, param_dtype_gradients)
    self.bn_group_size = bn_group_size
    self.small_inputs = small_inputs
    self.input_channels = input_channels
    self.dtype = dtype
    self.stem_conv = settings.conv(input_channels, num_filters, 3 if small_inputs else 7,
                                   1 if small_inputs else 2, rngs)
    self.stem_bn = settings.batch_norm(num_filters)
    block_cls = BottleneckBlock if block == "bottleneck" else BasicBlock
    blocks = []
    in_features = num_filters
    for i, num_blocks in enumerate(stage_sizes):
      features = num_filters * 2**i
      for j in range(num_blocks):
        stride = 2 if i > 0 and j == 0 else 1
        blocks.append(block_cls(in_features, features, stride, settings, rngs))
        in_features = features * block_cls.expansion
    self.blocks = nnx.List(blocks)
    self.head = nnx.Linear(in_features, num_classes, dtype=dtype, param_dtype=param_dtype,
                           rngs=rngs, **settings.kernel_hooks("dot_general"))

  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    """Maps images [N, H, W, C] (float) to logits [N, num_classes] (float32). With
    `input_channels=1`, grayscale images [N, H, W] (MNIST's) are taken as their one channel.

    Raises:
      ValueError: on a wrong rank/channel count/dtype, or, when `train`, a batch not divisible by
        `bn_group_size`.
    """
    expected = f"[N, H, W, {self.input_channels}]" + (" or [N, H, W]" if self.input_channels == 1 else "")
    if self.input_channels == 1 and getattr(images, "ndim", None) == 3:
      images = images[..., None]
    if getattr(images, "ndim", None) != 4 or images.shape[-1] != self.input_channels:
      raise ValueError(f"ResNet expects images of shape {expected}, got shape "
                       f"{getattr(images, 'shape', None)}.")
    validation.check_floating_array("images", images, expected)
    if train:
      self.stem_bn.check_batch(images.shape[0])
    x = images.astype(self.dtype)
    x = relu(self.stem_bn(self.stem_conv(x), train=train))
    if not self.small_inputs:
      x = pooling.max_pool(x, (3, 3), (2, 2), ((1, 1), (1, 1)))  # nnx.max_pool's, without a scatter
    for block in self.blocks:
      x = block(x, train=train)
    x = jnp.mean(x.astype(jnp.float32), axis=(1, 2)).astype(self.dtype)
    return self.head(x).astype(jnp.float32)


def _accepts_resnet_keywords(factory):
  """Gives a ResNet factory the signature of what it accepts (its own arguments and ResNet's
  keywords), so that a config's model options are checked against it before any compute."""
  own = inspect.signature(factory).parameters
  keywords = [p.replace(kind=p.KEYWORD_ONLY) for name, p in inspect.signature(ResNet.__init__).parameters.items()
              if name not in ("self", "stage_sizes", "block") and name not in own]
  factory.__signature__ = inspect.Signature([p for p in own.values() if p.kind != p.VAR_KEYWORD] + keywords)
  return factory


@_accepts_resnet_keywords
def ResNet50(num_classes: int = 1000, **kwargs) -> ResNet:  # pylint: disable=invalid-name
  """ResNet-50 v1.5: bottleneck blocks (3, 4, 6, 3); 25,557,032 parameters for 1000 classes."""
  stages, block = STAGES_BY_DEPTH[50]
  return ResNet(stages, block=block, num_classes=num_classes, **kwargs)


@_accepts_resnet_keywords
def ResNet18(num_classes: int, **kwargs) -> ResNet:  # pylint: disable=invalid-name
  """ResNet-18: basic blocks (2, 2, 2, 2); 11,689,512 parameters for 1000 classes."""
  stages, block = STAGES_BY_DEPTH[18]
  return ResNet(stages, block=block, num_classes=num_classes, **kwargs)


@_accepts_resnet_keywords
def ResNetTiny(num_classes: int = 10, **kwargs) -> ResNet:  # pylint: disable=invalid-name
  """A tiny ResNet for tests and smoke runs: basic blocks (1, 1), 8 filters, CIFAR stem.

  Any `ResNet` keyword (e.g. `num_filters`, `small_inputs`, `bn_group_size`) overrides the defaults.
  """
  kwargs.setdefault("num_filters", 8)
  kwargs.setdefault("small_inputs", True)
  return ResNet((1, 1), block="basic", num_classes=num_classes, **kwargs)
