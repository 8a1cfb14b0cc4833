"""A minimal flax ResNet-50 train step, written from scratch as the reference for `gpu_resnet50`.

Nothing of lbjax is used: ResNet-50 v1.5 (bottleneck blocks (3, 4, 6, 3), stride in the 3x3
convolution) built from `nnx.Conv`, `nnx.BatchNorm` and `nnx.Linear`, bfloat16 compute with float32
parameters, softmax cross-entropy, `optax.sgd` with momentum, one `jax.jit` with the state donated:
the step a researcher would write in an afternoon. lbjax's step should be as fast.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import optax

STAGES = (3, 4, 6, 3)


class _Bottleneck(nnx.Module):

  def __init__(self, in_features: int, features: int, stride: int, dtype, rngs: nnx.Rngs):
    def conv(i, o, k, s):
      return nnx.Conv(i, o, (k, k), strides=(s, s), padding=((k // 2, k // 2),) * 2, use_bias=False,
                      dtype=dtype, rngs=rngs)

    def bn(f):
      return nnx.BatchNorm(f, momentum=0.9, epsilon=1e-5, dtype=dtype, rngs=rngs)

    self.conv1, self.bn1 = conv(in_features, features, 1, 1), bn(features)
    self.conv2, self.bn2 = conv(features, features, 3, stride), bn(features)
    self.conv3, self.bn3 = conv(features, 4 * features, 1, 1), bn(4 * features)
    self.projects = stride != 1 or in_features != 4 * features
    if self.projects:
      self.project, self.project_bn = conv(in_features, 4 * features, 1, stride), bn(4 * features)

  def __call__(self, x):
    y = nnx.relu(self.bn1(self.conv1(x)))
    y = nnx.relu(self.bn2(self.conv2(y)))
    y = self.bn3(self.conv3(y))
    shortcut = self.project_bn(self.project(x)) if self.projects else x
    return nnx.relu(y + shortcut)


class ResNet50(nnx.Module):
  """ResNet-50 v1.5 for 224x224 images."""

  def __init__(self, num_classes: int = 1000, dtype=jnp.bfloat16, *, rngs: nnx.Rngs):
    self.dtype = dtype
    self.stem = nnx.Conv(3, 64, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), use_bias=False,
                         dtype=dtype, rngs=rngs)
    self.stem_bn = nnx.BatchNorm(64, momentum=0.9, epsilon=1e-5, dtype=dtype, rngs=rngs)
    blocks, in_features = [], 64
    for stage, count in enumerate(STAGES):
      for block in range(count):
        stride = 2 if stage > 0 and block == 0 else 1
        blocks.append(_Bottleneck(in_features, 64 * 2**stage, stride, dtype, rngs))
        in_features = 4 * 64 * 2**stage
    self.blocks = nnx.List(blocks)
    self.head = nnx.Linear(in_features, num_classes, dtype=dtype, rngs=rngs)

  def __call__(self, images):
    x = nnx.relu(self.stem_bn(self.stem(images.astype(self.dtype))))
    x = nnx.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for block in self.blocks:
      x = block(x)
    return self.head(jnp.mean(x, axis=(1, 2))).astype(jnp.float32)


class ReferenceStep:
  """One compiled train step of `ResNet50` on a fixed batch already on the device."""

  def __init__(self, batch_size: int, image_size: int = 224, num_classes: int = 1000,
               dtype=jnp.bfloat16, learning_rate: float = 0.01, momentum: float = 0.9):
    model = ResNet50(num_classes, dtype, rngs=nnx.Rngs(0))
    model.train()
    graphdef, params, batch_stats = nnx.split(model, nnx.Param, nnx.BatchStat)
    optimizer = optax.sgd(learning_rate, momentum=momentum)

    def loss_fn(params, batch_stats, images, labels):
      model = nnx.merge(graphdef, params, batch_stats)
      logits = model(images)
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
      return loss, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))

    def step(params, batch_stats, opt_state, images, labels):
      (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(
          params, batch_stats, images, labels)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), batch_stats, opt_state, loss

    keys = jax.random.split(jax.random.key(1))
    self.images = jax.random.uniform(keys[0], (batch_size, image_size, image_size, 3), jnp.float32)
    self.labels = jax.random.randint(keys[1], (batch_size,), 0, num_classes)
    self.params, self.batch_stats = nnx.to_pure_dict(params), nnx.to_pure_dict(batch_stats)
    self.opt_state = optimizer.init(self.params)
    self.num_parameters = sum(x.size for x in jax.tree.leaves(self.params))
    self.compiled = jax.jit(step, donate_argnums=(0, 1, 2)).lower(
        self.params, self.batch_stats, self.opt_state, self.images, self.labels).compile()

  def __call__(self) -> jax.Array:
    self.params, self.batch_stats, self.opt_state, loss = self.compiled(
        self.params, self.batch_stats, self.opt_state, self.images, self.labels)
    return loss
