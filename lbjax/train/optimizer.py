"""The run's optimizer, learning rate and compressor, resolved from a config once.

Each name is resolved here, once per run (`lbjax.train.resolved.resolve` calls these; `lbjax.train.names`:
the name is the import):

  optimizer.name    lbjax.optim, then optax        ("lars", "momentum", "adamw", "pkg.mod:fn")
  scaling.rule      lbjax.schedules.rules          ("none", "linear", "sqrt", "goyal", "legw")
  lr.decay          lbjax.schedules.decay          ("constant", "polynomial_decay", ...)
  lr.warmup         lbjax.schedules.warmup         ("none", "linear_warmup", "constant_warmup")
  compression.name  lbjax.optim.compression        ("none", "one_bit", "qsgd", "powersgd")

A section's other fields are the named function's keyword arguments, bound to its signature when
the run is resolved (before any compute): one it does not take is an error, never dropped.

The learning rate is one function of (epoch, batch size in force), `LearningRate`, evaluated by the
run at every batch and written into the optimizer's `inject_hyperparams` state, so warm-up and decay
follow epochs whatever the batch size. `config.lr` is the baseline recipe at
`config.scaling.base_batch_size`; the scaling rule maps it to the run's first batch size. With a
batch-size schedule the LR is then held: growing the batch is what lowers the noise (papers/002).
Under the adaptive policy the recipe follows the batch in force instead.

`build_optimizer(config)`, `learning_rate_schedule(config)`, `batch_size_schedule(config)`,
`scaled_recipe(config)` and `build_compressor(config)` are conveniences for scripts and tests that want
one part of a config; a run resolves the whole config once and reads its `ResolvedRun`.
"""

from collections.abc import Callable
import dataclasses
import inspect
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

FieldReads = config_lib.FieldReads


def resolve_optimizer(read: FieldReads) -> names.Call:
  """The optimizer `config.optimizer.name` names, with the section's other fields bound (no learning rate)."""
  resolved = names.resolve("optimizer.name", read("optimizer.name"), [optim, optax])
  arguments = names.bind("optimizer", resolved, read.options("optimizer"),
                         supplied={"learning_rate": 0.0}, required=("learning_rate",))
  arguments.pop("learning_rate")
  # The values, now: building a transformation computes nothing (e.g. an unknown accumulator_dtype).
  _built_once("optimizer", resolved, lambda: resolved.function(learning_rate=0.0, **arguments))
  return names.Call(resolved, arguments)


def _built_once(section: str, resolved: names.Resolved, build: Callable[[], Any]) -> None:
  """Calls `build` (which only checks the values: building a transformation computes nothing); a ValueError or
  TypeError it raises is a ConfigError naming `config.<section>.name` and the function."""
  try:
    build()
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.{section}.name={resolved.name!r}: {resolved.qualified_name} refuses its "
                      f"arguments: {e}") from e


def make_optimizer(optimizer: names.Call, clip_global_norm: float) -> optax.GradientTransformation:
  """The resolved optimizer with `learning_rate` as an injected hyper-parameter.

  With `clip_global_norm = c > 0` the loss gradient g is first replaced by g * min(1, c / ||g||_2)
  (norm over all parameters), as in Zaremba et al.'s PTB LSTMs. The clip keeps no state, and the
  optimizer's state has the same structure with it and without it: a run resumed with a clip set
  (`config.resume_with_changed_optimizer`, what a non-finite step advises) restores its checkpoint.
  """
  def with_learning_rate(learning_rate):  # only the learning rate is injected; the rest stays static
    transform = optimizer(learning_rate=learning_rate)
    return _clipped(transform, clip_global_norm) if clip_global_norm > 0 else transform

  return optax.inject_hyperparams(with_learning_rate)(learning_rate=0.0)


def _clipped(transform: optax.GradientTransformation, max_norm: float) -> optax.GradientTransformation:
  """`optax.chain(optax.clip_by_global_norm(max_norm), transform)` with `transform`'s own state."""
  clip = optax.clip_by_global_norm(max_norm)

  def update(updates, state, params=None):
    updates, _ = clip.update(updates, clip.init(updates))
    return transform.update(updates, state, params)

  return optax.GradientTransformation(transform.init, update)


@dataclasses.dataclass(frozen=True)
class LearningRate:
  """The learning rate as one function of (epoch, batch size in force): `learning_rate(epoch, batch_size)`.

  The baseline recipe (`base` at `base_batch_size`, a warm-up of `base_warmup_epochs`, a decay) goes
  through the scaling `rule` to a batch size, then warm-up and decay run in epochs. With
  `recipe_batch_size` set (the "fixed" and "schedule" policies: the first batch) the recipe is scaled
  to it and held whatever batch is in force; with None (the adaptive policy) it follows the batch in
  force. `schedule(batch_size)` is the recipe at one batch size, built once per size.
  """
  base: float
  base_batch_size: int
  base_warmup_epochs: float
  rule: names.Call  # the scaling rule with the config's options; the recipe and batch size are supplied
  warmup_name: str  # config.lr.warmup ("none": the rule's own warm-up, if any, is linear)
  warmup: names.Resolved  # config.lr.warmup's function, or linear_warmup for "none"
  decay: names.Call  # the decay with the config's options; peak, length and start are supplied
  peak_argument: str  # the decay's argument for the peak ("init_value" or "value")
  num_epochs: float
  recipe_batch_size: int | None
  _schedules: dict[int, schedules.Schedule] = dataclasses.field(default_factory=dict, compare=False, repr=False)

  def __call__(self, epoch: float, batch_size: int) -> float:
    return self.schedule(self.recipe_batch_size or batch_size)(epoch)

  @property
  def reads_num_epochs(self) -> bool:
    """Whether the decay runs to the end of training (takes `total_epochs`: polynomial, cosine): then
    `num_epochs` is part of the recipe, and a resume with another one would move the LR mid-run."""
    return "total_epochs" in inspect.signature(self.decay.resolved.function).parameters

  def recipe(self, batch_size: int) -> schedules.ScaledRecipe:
    """The (learning_rate, warmup_epochs) of the baseline recipe scaled to `batch_size`."""
    supplied = {"base_batch_size": self.base_batch_size, "base_learning_rate": self.base,
                "base_warmup_epochs": self.base_warmup_epochs, "batch_size": batch_size}
    arguments = names.bind("scaling", self.rule.resolved, self.rule.arguments, supplied=supplied,
                           required=tuple(supplied))
    try:
      return schedules.ScaledRecipe(*self.rule.resolved.function(**arguments))
    except ValueError as e:
      hint = (" LEGW scales the baseline's warm-up: give it one with config.lr.warmup='linear_warmup' and "
              "config.lr.warmup_epochs > 0." if self.rule.resolved.name == "legw" else "")
      raise ConfigError(f"config.scaling.rule={self.rule.resolved.name!r}: {e}{hint}") from e

  def schedule(self, batch_size: int) -> schedules.Schedule:
    """The learning rate in epochs of the recipe scaled to `batch_size`. A rule that brings its own
    warm-up (goyal) gets a linear one when `lr.warmup` is "none".

    Raises:
      ConfigError: if the scaled warm-up is not shorter than training, or a decay setting is invalid.
    """
    if batch_size not in self._schedules:
      self._schedules[batch_size] = self._build(batch_size)
    return self._schedules[batch_size]

  def _build(self, batch_size: int) -> schedules.Schedule:
    peak, warmup_epochs = self.recipe(batch_size)
    warmup = self.warmup_name != "none" or bool(warmup_epochs)
    linear = self.warmup_name == "none" or self.warmup_name == "linear_warmup"
    if warmup and warmup_epochs >= self.num_epochs:
      raise ConfigError(
          f"The warm-up ({warmup_epochs:g} epochs after scaling.rule={self.rule.resolved.name!r} from "
          f"{self.base_batch_size} to batch {batch_size}) is not shorter than "
          f"training (config.num_epochs={self.num_epochs}); train longer or shorten config.lr.warmup_epochs.")
    begin = warmup_epochs if warmup and linear else 0.0
    supplied = {self.peak_argument: peak, "total_epochs": self.num_epochs, "begin_epoch": begin}
    try:
      arguments = names.bind("lr", self.decay.resolved, self.decay.arguments, supplied=supplied,
                             required=(self.peak_argument,))
      schedule = self.decay.resolved.function(**arguments)
    except (TypeError, ValueError) as e:
      if isinstance(e, ConfigError):
        raise
      raise ConfigError(f"config.lr (decay {self.decay.resolved.name!r}): {e}") from e
    if not warmup or warmup_epochs <= 0:
      return schedule
    arguments = names.bind("lr.warmup", self.warmup, {}, supplied={
        "schedule": schedule, "warmup_epochs": warmup_epochs, "warmup_value": self.base},
        required=("schedule", "warmup_epochs"))
    return self.warmup.function(**arguments)


def resolve_learning_rate(read: FieldReads, recipe_batch_size: int | None, first_batch_size: int) -> LearningRate:
  """The run's `LearningRate`, checked at its first batch size (the schedule is built there)."""
  rule = names.resolve("scaling.rule", read("scaling.rule"), [rules])
  rule_options = read.options("scaling")
  warmup_name = read("lr.warmup")
  warmup_epochs = read("lr.warmup_epochs")
  decay = names.resolve("lr.decay", read("lr.decay"), [decay_lib])
  decay_options = read.options("lr")
  peak_argument = next((a for a in ("init_value", "value") if names.takes(decay.function, a)), None)
  if peak_argument is None:
    raise ConfigError(f"config.lr.decay={decay.name!r}: {decay.qualified_name} takes neither "
                      "init_value nor value, so it cannot start from the scaled peak learning rate.")
  learning_rate = LearningRate(
      base=read("lr.base"), base_batch_size=read("scaling.base_batch_size"),
      base_warmup_epochs=warmup_epochs if warmup_name != "none" else 0.0, rule=names.Call(rule, rule_options),
      warmup_name=warmup_name,
      warmup=names.resolve("lr.warmup", warmup_name if warmup_name != "none" else "linear_warmup", [warmup_lib]),
      decay=names.Call(decay, decay_options), peak_argument=peak_argument, num_epochs=read("num_epochs"),
      recipe_batch_size=recipe_batch_size)
  learning_rate.schedule(first_batch_size)
  return learning_rate


def resolve_compressor(read: FieldReads) -> names.Call | None:
  """The compressor `config.compression.name` names with its bound arguments; None for "none"."""
  name = read("compression.name")
  options = read.options("compression")
  if name == "none":
    return None
  resolved = names.resolve("compression.name", name, [compression])
  call = names.Call(resolved, names.bind("compression", resolved, options,
                                         supplied={"seed": read("seed"), "axis_name": DATA_AXES},
                                         owned=("axis_name",)))
  _built_once("compression", resolved, call)  # e.g. qsgd's num_levels=0, powersgd's rank=0
  return call


def make_compressor(compressor: names.Call | None, per_device_gradients: bool
                    ) -> compression.GradientCompressor | None:
  """The compressor of the per-device gradient reduction, or None for the GSPMD step.

  `config.compression` (papers/004) names 1-bit SGD, QSGD or PowerSGD (`compression.rank`);
  `config.mesh.per_device_gradients` without compression sends the raw gradients (`no_compression`:
  the reduction is one `pmean`).
  """
  if compressor is None:
    return compression.no_compression() if per_device_gradients else None
  return compressor()


def build_optimizer(config: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """`make_optimizer` of a config's optimizer section and `clip_global_norm` (for scripts and tests)."""
  return make_optimizer(resolve_optimizer(FieldReads(config)), config.clip_global_norm)


def learning_rate_schedule(config: ml_collections.ConfigDict) -> schedules.Schedule:
  """A config's learning rate in epochs at its first batch size (for scripts and tests)."""
  first = config_lib.batch_sizes(config)[0]
  return resolve_learning_rate(FieldReads(config), first, first).schedule(first)


def scaled_recipe(config: ml_collections.ConfigDict) -> schedules.ScaledRecipe:
  """A config's (learning_rate, warmup_epochs) scaled to its first batch size (for scripts and tests)."""
  first = config_lib.batch_sizes(config)[0]
  return resolve_learning_rate(FieldReads(config), first, first).recipe(first)


def batch_size_schedule(config: ml_collections.ConfigDict) -> schedules.BatchSizeSchedule:
  """A config's global batch size as a function of epochs (for scripts and tests)."""
  if config.batch_sizes:
    return schedules.BatchSizeSchedule(tuple(config.batch_sizes), tuple(config.batch_size_boundaries))
  return schedules.constant_batch_size(config.batch_size)


def build_compressor(config: ml_collections.ConfigDict) -> compression.GradientCompressor | None:
  """`make_compressor` of a config's compression section (for scripts and tests)."""
  return make_compressor(resolve_compressor(FieldReads(config)), config.mesh.per_device_gradients)
