"""From a config to the run's optimizer, learning-rate schedule and batch-size schedule.

The learning rate is an epoch schedule (`lbjax.schedules`) evaluated by the loop at every batch and
written into the optimizer's `inject_hyperparams` state, so warm-up and decay follow epochs whatever
the batch size. `config.lr` is the baseline recipe at `config.scaling.base_batch_size`; the scaling
rule maps it to the run's (first) batch size:

  none:   LR, warm-up unchanged
  linear: LR x k                      (k = batch / base batch)
  sqrt:   LR x sqrt(k)
  goyal:  LR x k, 5-epoch gradual warm-up (Goyal et al. 2017, as compared in papers/001 Figure 1)
  legw:   LR x sqrt(k), warm-up epochs x k (papers/001 §3)

With a batch-size schedule the rule scales to the first batch size and the LR is then held: growing
the batch is what lowers the noise (papers/002).
"""

import functools

import jax
import ml_collections
import optax

from lbjax import optim
from lbjax import schedules
from lbjax.optim import compression
from lbjax.train import config as config_lib
from lbjax.train.mesh import DATA_AXES

LAYERWISE_OPTIMIZERS = ("lars", "lamb", "percent_delta", "mclr")


def scaled_recipe(config: ml_collections.ConfigDict) -> schedules.ScaledRecipe:
  """The (learning_rate, warmup_epochs) of the baseline recipe scaled to the run's first batch size."""
  base = config.scaling.base_batch_size
  batch = config_lib.batch_sizes(config)[0]
  lr, warmup = config.lr.base, config.lr.warmup_epochs if config.lr.warmup != "none" else 0.0
  rule = config.scaling.rule
  if rule == "none":
    return schedules.ScaledRecipe(lr, warmup)
  if rule == "linear":
    return schedules.linear_scaling(base, lr, batch, warmup_epochs=warmup)
  if rule == "sqrt":
    return schedules.sqrt_scaling(base, lr, batch, warmup_epochs=warmup)
  if rule == "goyal":
    return schedules.goyal_scaling(base, lr, batch)
  return schedules.legw(base, lr, warmup, batch)


def learning_rate_schedule(config: ml_collections.ConfigDict) -> schedules.Schedule:
  """The run's learning rate as a function of epochs (after the scaling rule).

  Raises:
    ValueError: if the scaled warm-up is not shorter than training, or a decay setting is invalid.
  """
  peak, warmup_epochs = scaled_recipe(config)
  warmup = "linear" if config.scaling.rule == "goyal" else config.lr.warmup
  if warmup != "none" and warmup_epochs >= config.num_epochs:
    raise ValueError(
        f"The warm-up ({warmup_epochs:g} epochs after scaling.rule={config.scaling.rule!r} from "
        f"{config.scaling.base_batch_size} to batch {config_lib.batch_sizes(config)[0]}) is not shorter than "
        f"training (config.num_epochs={config.num_epochs}); train longer or shorten config.lr.warmup_epochs.")
  lr = config.lr
  begin = warmup_epochs if warmup == "linear" else 0.0
  if lr.decay == "constant":
    schedule = schedules.constant(peak)
  elif lr.decay == "poly":
    schedule = schedules.polynomial_decay(peak, config.num_epochs, power=lr.power, end_value=lr.end_value,
                                          begin_epoch=begin)
  elif lr.decay == "multistep":
    schedule = schedules.multistep_decay(peak, tuple(lr.boundaries), lr.factor)
  elif lr.decay == "exponential":
    schedule = schedules.exponential_decay(peak, lr.decay_start_epoch, lr.decay_rate)
  else:
    schedule = schedules.cosine_decay(peak, config.num_epochs, end_value=lr.end_value, begin_epoch=begin)
  if warmup == "linear" and warmup_epochs > 0:
    return schedules.linear_warmup(schedule, warmup_epochs)
  if warmup == "constant" and warmup_epochs > 0:
    return schedules.constant_warmup(schedule, warmup_epochs, warmup_value=config.lr.base)
  return schedule


def batch_size_schedule(config: ml_collections.ConfigDict) -> schedules.BatchSizeSchedule:
  """The run's global batch size as a function of epochs."""
  if config.batch_sizes:
    return schedules.BatchSizeSchedule(tuple(config.batch_sizes), tuple(config.batch_size_boundaries))
  return schedules.constant_batch_size(config.batch_size)


def _weight_decay_mask(params):
  """Weight decay on kernels only (ndim >= 2), as the MLPerf LARS recipes and lbjax.optim's default."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def momentum_sgd(learning_rate: optax.ScalarOrSchedule, momentum: float = 0.9, nesterov: bool = False,
                 weight_decay: float = 0.0) -> optax.GradientTransformation:
  """SGD with momentum (`optax.sgd`) and L2 weight decay on kernels added to the gradient."""
  decay = optax.add_decayed_weights(weight_decay, mask=_weight_decay_mask) if weight_decay else optax.identity()
  return optax.chain(decay, optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov))


def build_compressor(config: ml_collections.ConfigDict) -> compression.GradientCompressor | None:
  """The compressor of the per-device gradient reduction, or None for the GSPMD step.

  `config.compression` (papers/004) picks 1-bit SGD or QSGD; `config.mesh.per_device_gradients`
  without compression sends the raw gradients (`no_compression`: the reduction is one `pmean`).
  """
  c = config.compression
  if c.name == "one_bit":
    return compression.one_bit(error_feedback=c.error_feedback)
  if c.name == "qsgd":
    return compression.qsgd(c.levels, seed=config.seed, axis_name=DATA_AXES)
  if config.mesh.per_device_gradients:
    return compression.no_compression()
  return None


def build_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The optimizer the config names, with `learning_rate` as an injected hyper-parameter.

  With `optimizer.clip_global_norm = c > 0` the loss gradient g is first replaced by
  g * min(1, c / ||g||_2) (norm over all parameters), as in Zaremba et al.'s PTB LSTMs.
  """
  o = config.optimizer
  if o.name in ("sgd", "momentum"):
    factory = functools.partial(momentum_sgd, momentum=o.momentum if o.name == "momentum" else 0.0,
                                nesterov=o.nesterov, weight_decay=o.weight_decay)
  elif o.name == "lars":
    factory = functools.partial(optim.lars, momentum=o.momentum, weight_decay=o.weight_decay,
                                trust_coefficient=o.trust_coefficient, eps=o.eps, nesterov=o.nesterov)
  elif o.name == "lamb":
    factory = functools.partial(optim.lamb, b1=o.b1, b2=o.b2, eps=o.adam_eps, weight_decay=o.weight_decay)
  elif o.name == "adam":
    factory = functools.partial(optax.adamw, b1=o.b1, b2=o.b2, eps=o.adam_eps, weight_decay=o.weight_decay,
                                mask=_weight_decay_mask)
  elif o.name == "percent_delta":
    factory = functools.partial(optim.percent_delta, momentum=o.momentum, weight_decay=o.weight_decay)
  else:
    factory = functools.partial(optim.mclr, momentum=o.momentum, weight_decay=o.weight_decay)

  def with_learning_rate(learning_rate):  # only the learning rate is injected; the rest stays static
    if o.clip_global_norm > 0:
      return optax.chain(optax.clip_by_global_norm(o.clip_global_norm), factory(learning_rate))
    return factory(learning_rate)

  return optax.inject_hyperparams(with_learning_rate)(learning_rate=0.0)
