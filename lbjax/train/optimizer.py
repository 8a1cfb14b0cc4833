"""From a config to the run's optimizer, learning-rate schedule, batch-size schedule and compressor.

Each name is resolved here, once (`lbjax.train.names`: the name is the import):

  optimizer.name    lbjax.optim, then optax        ("lars", "momentum", "adamw", "pkg.mod:fn")
  scaling.rule      lbjax.schedules.rules          ("none", "linear", "sqrt", "goyal", "legw")
  lr.decay          lbjax.schedules.decay          ("constant", "polynomial_decay", ...)
  lr.warmup         lbjax.schedules.warmup         ("none", "linear_warmup", "constant_warmup")
  compression.name  lbjax.optim.compression        ("none", "one_bit", "qsgd", "powersgd")

A section's other fields are the named function's keyword arguments, bound to its signature when
the run is resolved (before any compute): one it does not take is an error, never dropped.

The learning rate is an epoch schedule evaluated by the loop at every batch and written into the
optimizer's `inject_hyperparams` state, so warm-up and decay follow epochs whatever the batch size.
`config.lr` is the baseline recipe at `config.scaling.base_batch_size`; the scaling rule maps it to
the run's (first) batch size. With a batch-size schedule the LR is then held: growing the batch is
what lowers the noise (papers/002).
"""

import dataclasses
from typing import Any

import ml_collections
import optax

from lbjax import optim
from lbjax import schedules
from lbjax.optim import compression
from lbjax.schedules import decay as decay_lib
from lbjax.schedules import rules
from lbjax.schedules import warmup as warmup_lib
from lbjax.train import config as config_lib
from lbjax.train import names
from lbjax.train.errors import ConfigError
from lbjax.train.mesh import DATA_AXES

LR_RECIPE_FIELDS = ("base", "warmup", "warmup_epochs", "decay")  # the rest of config.lr: decay arguments
SCALING_FIELDS = ("rule", "base_batch_size")  # the rest of config.scaling: the rule's keyword options


def _section_options(section: ml_collections.ConfigDict, own_fields: tuple[str, ...]) -> dict[str, Any]:
  return {k: v for k, v in section.to_dict().items() if k not in own_fields}


@dataclasses.dataclass(frozen=True)
class OptimizerChoice:
  """The resolved optimizer: its function and the arguments the config binds (learning rate aside)."""
  resolved: names.Resolved
  arguments: dict[str, Any]

  def describe(self) -> str:
    return names.describe(self.resolved, self.arguments)


def resolve_optimizer(config: ml_collections.ConfigDict) -> OptimizerChoice:
  resolved = names.resolve("optimizer.name", config.optimizer.name, [optim, optax])
  options = _section_options(config.optimizer, ("name",))
  arguments = names.bind("optimizer", resolved, options, supplied={"learning_rate": 0.0},
                         required=("learning_rate",))
  arguments.pop("learning_rate")
  return OptimizerChoice(resolved, arguments)


def build_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The optimizer the config names, with `learning_rate` as an injected hyper-parameter.

  With `clip_global_norm = c > 0` the loss gradient g is first replaced by g * min(1, c / ||g||_2)
  (norm over all parameters), as in Zaremba et al.'s PTB LSTMs.
  """
  choice = resolve_optimizer(config)
  clip = config.clip_global_norm

  def with_learning_rate(learning_rate):  # only the learning rate is injected; the rest stays static
    optimizer = choice.resolved.function(learning_rate=learning_rate, **choice.arguments)
    return optax.chain(optax.clip_by_global_norm(clip), optimizer) if clip > 0 else optimizer

  return optax.inject_hyperparams(with_learning_rate)(learning_rate=0.0)


def base_warmup_epochs(config: ml_collections.ConfigDict) -> float:
  return config.lr.warmup_epochs if config.lr.warmup != "none" else 0.0


def scaled_recipe(config: ml_collections.ConfigDict) -> schedules.ScaledRecipe:
  """The (learning_rate, warmup_epochs) of the baseline recipe scaled to the run's first batch size."""
  resolved = names.resolve("scaling.rule", config.scaling.rule, [rules])
  supplied = {"base_batch_size": config.scaling.base_batch_size, "base_learning_rate": config.lr.base,
              "base_warmup_epochs": base_warmup_epochs(config),
              "batch_size": config_lib.batch_sizes(config)[0]}
  arguments = names.bind("scaling", resolved, _section_options(config.scaling, SCALING_FIELDS),
                         supplied=supplied, required=tuple(supplied))
  try:
    return schedules.ScaledRecipe(*resolved.function(**arguments))
  except ValueError as e:
    hint = (" LEGW scales the baseline's warm-up: give it one with config.lr.warmup='linear_warmup' and "
            "config.lr.warmup_epochs > 0." if config.scaling.rule == "legw" else "")
    raise ConfigError(f"config.scaling.rule={config.scaling.rule!r}: {e}{hint}") from e


def resolve_decay(config: ml_collections.ConfigDict) -> tuple[names.Resolved, dict[str, Any]]:
  """The decay function `config.lr.decay` names and the `lr` fields that are its arguments."""
  return names.resolve("lr.decay", config.lr.decay, [decay_lib]), _section_options(config.lr, LR_RECIPE_FIELDS)


def _decay(config: ml_collections.ConfigDict, peak: float, begin_epoch: float) -> schedules.Schedule:
  resolved, options = resolve_decay(config)
  peak_argument = next((a for a in ("init_value", "value") if names.takes(resolved.function, a)), None)
  if peak_argument is None:
    raise ConfigError(f"config.lr.decay={config.lr.decay!r}: {resolved.qualified_name} takes neither "
                      "init_value nor value, so it cannot start from the scaled peak learning rate.")
  supplied = {peak_argument: peak, "total_epochs": config.num_epochs, "begin_epoch": begin_epoch}
  arguments = names.bind("lr", resolved, options, supplied=supplied, required=(peak_argument,))
  return resolved.function(**arguments)


def learning_rate_schedule(config: ml_collections.ConfigDict) -> schedules.Schedule:
  """The run's learning rate as a function of epochs (after the scaling rule).

  A rule that brings its own warm-up (goyal) gets a linear one when `lr.warmup` is "none".

  Raises:
    ConfigError: if the scaled warm-up is not shorter than training, or a decay setting is invalid.
  """
  peak, warmup_epochs = scaled_recipe(config)
  warmup = config.lr.warmup if config.lr.warmup != "none" or not warmup_epochs else "linear_warmup"
  if warmup != "none" and warmup_epochs >= config.num_epochs:
    raise ConfigError(
        f"The warm-up ({warmup_epochs:g} epochs after scaling.rule={config.scaling.rule!r} from "
        f"{config.scaling.base_batch_size} to batch {config_lib.batch_sizes(config)[0]}) is not shorter than "
        f"training (config.num_epochs={config.num_epochs}); train longer or shorten config.lr.warmup_epochs.")
  begin = warmup_epochs if warmup == "linear_warmup" else 0.0
  try:
    schedule = _decay(config, peak, begin)
  except (TypeError, ValueError) as e:
    if isinstance(e, ConfigError):
      raise
    raise ConfigError(f"config.lr (decay {config.lr.decay!r}): {e}") from e
  if warmup == "none" or warmup_epochs <= 0:
    return schedule
  resolved = names.resolve("lr.warmup", warmup, [warmup_lib])
  arguments = names.bind("lr.warmup", resolved, {}, supplied={
      "schedule": schedule, "warmup_epochs": warmup_epochs, "warmup_value": config.lr.base},
      required=("schedule", "warmup_epochs"))
  return resolved.function(**arguments)


def batch_size_schedule(config: ml_collections.ConfigDict) -> schedules.BatchSizeSchedule:
  """The run's global batch size as a function of epochs."""
  if config.batch_sizes:
    return schedules.BatchSizeSchedule(tuple(config.batch_sizes), tuple(config.batch_size_boundaries))
  return schedules.constant_batch_size(config.batch_size)


def build_compressor(config: ml_collections.ConfigDict) -> compression.GradientCompressor | None:
  """The compressor of the per-device gradient reduction, or None for the GSPMD step.

  `config.compression` (papers/004) names 1-bit SGD, QSGD or PowerSGD (`compression.rank`);
  `config.mesh.per_device_gradients` without compression sends the raw gradients (`no_compression`: the
  reduction is one `pmean`).
  """
  choice = resolve_compressor(config)
  if choice is None:
    return compression.no_compression() if config.mesh.per_device_gradients else None
  resolved, arguments = choice
  return resolved.function(**arguments)


def resolve_compressor(config: ml_collections.ConfigDict) -> tuple[names.Resolved, dict[str, Any]] | None:
  """The compressor function `config.compression.name` names and its bound arguments; None for "none"."""
  if config.compression.name == "none":
    return None
  resolved = names.resolve("compression.name", config.compression.name, [compression])
  return resolved, names.bind("compression", resolved, _section_options(config.compression, ("name",)),
                              supplied={"seed": config.seed, "axis_name": DATA_AXES})
