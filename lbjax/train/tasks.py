"""Tasks: a model and a dataset with the loss, metrics and carried state that pair them.

`resolve_model` and `resolve_dataset` resolve `config.model` and `config.dataset` (the name is the
import: `"MnistLSTM"` is `lbjax.models.MnistLSTM`, `"mnist"` is `lbjax.train.datasets.mnist`,
`"pkg.module:function"` a user's own), once per run, when the run is resolved (`lbjax.train.resolved`);
`make_task` pairs the model with the opened dataset. The dataset says which kind of task it is; one
class per kind implements the `lbjax.train.protocols.Task` protocol the steps and the run use:

- `ClassificationTask`: images (or MNIST rows-as-time-steps) -> labels; cross-entropy, top-1 (and
  top-5 where the dataset asks for it) accuracy. Where the dataset streams uint8 images
  (`Dataset.image_normalization`: ImageNet and CIFAR-10's per-channel `(x - mean) / stddev`, MNIST's
  pixel / 255), the normalisation runs here, inside the compiled step, on the device.
- `LanguageModelTask`: token windows with the LSTM state carried across consecutive batches
  (truncated BPTT), reset where the stream says; perplexity.
"""

import dataclasses
import re
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lbjax import diagnostics
from lbjax import models
from lbjax.train import config as config_lib
from lbjax.train import datasets
from lbjax.train import names
from lbjax.train import protocols
from lbjax.train.errors import ConfigError

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass
class ClassificationTask:
  """Cross-entropy classification of `batch['images']` into `batch['labels']`."""
  model_factory: Any
  dataset: datasets.Dataset
  model_description: str
  run_stack: Any = None  # how the model's stack of layers runs in training (lbjax.train.mesh.pipeline_runner)

  def build_model(self, rngs):
    return self.model_factory(rngs=rngs)

  def images(self, batch):
    """The model's input: `batch['images']`, normalised by the dataset's `image_normalization`
    (float32, the values the host normalisation gave) where it has one."""
    normalization = self.dataset.image_normalization
    if normalization is None:
      return batch["images"]
    if batch["images"].dtype != jnp.uint8:
      raise ValueError(f"{self.model_description}: the dataset normalises uint8 images in the step, but the batch's "
                       f"images are {batch['images'].dtype}; its streams must hand over uint8 pixels (0-255).")
    return normalization(batch["images"])

  def train_loss(self, model, batch, carry, dropout_key, discard_fraction=0.0):
    del dropout_key
    logits = model(self.images(batch), train=True, **_stack_option(self.run_stack))
    metrics = {"accuracy": models.accuracy(logits, batch["labels"])}
    if not discard_fraction:
      return models.softmax_cross_entropy(logits, batch["labels"]), metrics, carry
    per_example = models.per_example_cross_entropy(logits, batch["labels"])
    kept = diagnostics.small_loss_discard_weights(per_example, discard_fraction)
    return jnp.sum(kept * per_example) / jnp.sum(kept), metrics, carry

  def eval_sums(self, model, batch, carry):
    logits = model(self.images(batch), train=False)
    mask, labels = batch[protocols.MASK], batch["labels"]
    cross_entropy = models.per_example_cross_entropy(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    sums = {"loss_sum": _masked_sum(cross_entropy, mask), "correct": jnp.sum(correct * mask), "count": jnp.sum(mask)}
    for k in self.dataset.top_k:
      label_logit = jnp.take_along_axis(logits, labels[:, None], axis=-1)
      in_top_k = (jnp.sum(logits > label_logit, axis=-1) < k).astype(jnp.float32)
      sums[f"correct_top{k}"] = jnp.sum(in_top_k * mask)
    return sums, carry

  def summarize(self, sums):
    metrics = {"loss": sums["loss_sum"] / sums["count"], "accuracy": sums["correct"] / sums["count"]}
    for k in self.dataset.top_k:
      metrics[f"top{k}_accuracy"] = sums[f"correct_top{k}"] / sums["count"]
    return metrics

  def zero_carry(self, model, global_batch_size):
    return None


@dataclasses.dataclass
class LanguageModelTask:
  """Next-token cross-entropy over windows of a token stream, with the LSTM state carried across
  consecutive batches (truncated BPTT) and reset where the stream starts a row again (each epoch)."""
  model_factory: Any
  dataset: datasets.Dataset
  model_description: str
  uses_dropout: bool = False
  run_stack: Any = None  # how the model's stack of layers runs in training (lbjax.train.mesh.pipeline_runner)

  def build_model(self, rngs):
    return self.model_factory(rngs=rngs)

  def train_loss(self, model, batch, carry, dropout_key, discard_fraction=0.0):
    del discard_fraction  # refused for language models by config validation
    logits, carry = model(batch["inputs"], carry, train=True,
                          dropout_key=dropout_key if self.uses_dropout else None, **_stack_option(self.run_stack))
    return models.softmax_cross_entropy(logits, batch["targets"]), {}, carry

  def eval_sums(self, model, batch, carry):
    logits, carry = model(batch["inputs"], carry, train=False)
    cross_entropy = models.per_example_cross_entropy(logits, batch["targets"])
    mask = batch[protocols.MASK]  # [N, T]: 0 where a window runs past the end of its row
    return {"loss_sum": _masked_sum(cross_entropy, mask), "count": jnp.sum(mask)}, carry

  def summarize(self, sums):
    loss = sums["loss_sum"] / sums["count"]
    return {"loss": loss, "perplexity": float(np.exp(loss))}

  def zero_carry(self, model, global_batch_size):
    return jax.tree.map(np.asarray, model.initial_carry(global_batch_size))


def _masked_sum(values: jax.Array, mask: jax.Array) -> jax.Array:
  """sum(mask * values) where a padded entry's value (a NaN from a padding label, say) cannot leak in."""
  return jnp.sum(jnp.where(mask > 0, values * mask, 0.0))


def _stack_option(run_stack) -> dict[str, Any]:
  """The model call's `run_stack` keyword when the run pipelines the model's stack (none otherwise)."""
  return {} if run_stack is None else {"run_stack": run_stack}


def _options_named_in(options: dict[str, Any], message: str) -> str:
  """The `config.data_options.<k>=<v>` that the message's numbers point at (all of them when none do)."""
  numbers = set(re.findall(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", message))
  named = {k: v for k, v in options.items() if str(v) in numbers} or options
  return ", ".join(f"config.data_options.{k}={v!r}" for k, v in named.items()) or "no data_options"


def _model_options(options: dict[str, Any]) -> dict[str, Any]:
  """`config.model_options` with dtype names (`dtype`, `param_dtype`) as jax dtypes."""
  options = dict(options)
  for name in ("dtype", "param_dtype"):
    if isinstance(options.get(name), str):
      if options[name] not in _DTYPES:
        raise ConfigError(f"config.model_options.{name}={options[name]!r} is not known; choose one of "
                          f"{', '.join(_DTYPES)}.")
      options[name] = _DTYPES[options[name]]
  return options


@dataclasses.dataclass(frozen=True)
class ModelChoice:
  """The model constructor `config.model` names and `config.model_options`, checked against its
  signature once; the arguments that follow from the data (`Dataset.model_arguments`) fill in the rest."""
  resolved: names.Resolved
  options: dict[str, Any]

  @property
  def language_model(self) -> bool:
    return hasattr(names.declared_class(self.resolved.function), "initial_carry")

  def training_batch_multiple(self) -> int:
    """What each training batch one call of the model sees must be a multiple of (1 unless the
    model's class declares `training_batch_multiple(options)`, e.g. the ResNets' ghost BN groups)."""
    declared = getattr(names.declared_class(self.resolved.function), "training_batch_multiple", None)
    return declared(self.options) if declared is not None else 1

  def normalizes_over_the_batch(self) -> bool:
    """Whether an example's output depends on the rest of the batch of a call (False unless the model's class
    declares `normalizes_over_the_batch(options)`, e.g. the ResNets' BatchNorm without groups)."""
    declared = getattr(names.declared_class(self.resolved.function), "normalizes_over_the_batch", None)
    return declared(self.options) if declared is not None else False

  def arguments(self, data_arguments: dict[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments (rngs aside): the config's options, then the data's."""
    arguments = names.bind("model_options", self.resolved, self.options, supplied=dict(data_arguments, rngs=None),
                           required=("rngs",))
    arguments.pop("rngs")
    return arguments


def resolve_model(read: config_lib.FieldReads) -> ModelChoice:
  """The model `config.model` names, with `config.model_options` checked against its signature (the
  arguments that follow from the data are known only once it is open)."""
  resolved = names.resolve("model", read("model"), [models])
  options = _model_options(read.options("model_options"))
  names.bind("model_options", resolved, options, supplied={name: None for name in names.parameters(resolved.function)},
             required=("rngs",))
  return ModelChoice(resolved, options)


def resolve_dataset(read: config_lib.FieldReads) -> names.Call:
  """The dataset function `config.dataset` names and its bound arguments (nothing is opened)."""
  resolved = names.resolve("dataset", read("dataset"), [datasets])
  supplied = {"data_dir": read("data_dir") or None, "seed": read("seed")}
  arguments = names.bind("data_options", resolved, read.options("data_options"), supplied=supplied)
  if resolved.function.__module__ == datasets.__name__:
    _check_dependent_options(arguments, names.parameters(resolved.function))
  return names.Call(resolved, arguments)


def _check_dependent_options(arguments: dict[str, Any], accepted) -> None:
  """An option set away from its default where the option it depends on turns it off (`datasets.DEPENDENT_OPTIONS`,
  e.g. `num_validation_examples` without `eval_split='validation'`) would change nothing: refused."""
  for option, condition, needed in datasets.DEPENDENT_OPTIONS:
    if option not in accepted or condition not in accepted:
      continue
    default = accepted[option].default
    value, current = arguments.get(option, default), arguments.get(condition, accepted[condition].default)
    if value != default and current != needed:
      raise ConfigError(f"config.data_options.{option}={value!r} applies only with config.data_options.{condition}="
                        f"{needed!r}, but it is {current!r}: remove it (the default is {default!r}) or set "
                        f"config.data_options.{condition}={needed!r}.")


def open_dataset(dataset: names.Call) -> datasets.Dataset:
  """Calls the dataset function: opens or loads the data (missing data fails here)."""
  try:
    opened = dataset()
  except (ValueError, TypeError, MemoryError) as e:
    raise dataset_refusal(dataset, e) from e
  if not isinstance(opened, datasets.Dataset):
    raise ConfigError(f"config.dataset={dataset.resolved.name!r}: {dataset.resolved.qualified_name} returned "
                      f"{type(opened).__name__}, not an lbjax.train.datasets.Dataset.")
  return opened


def dataset_refusal(dataset: names.Call, error: Exception) -> ConfigError:
  """The config error of the dataset function `dataset` refusing its arguments with `error`."""
  options = {k: v for k, v in dataset.arguments.items() if k not in ("data_dir", "seed")}
  return ConfigError(f"config.dataset={dataset.resolved.name!r}: {dataset.resolved.qualified_name} fails with "
                     f"{_options_named_in(options, str(error))}: {error or type(error).__name__}")


def make_task(model: ModelChoice, dataset: datasets.Dataset, dataset_name: str
              ) -> ClassificationTask | LanguageModelTask:
  """The task that pairs the model with the opened dataset (`dataset_name`: config.dataset, for messages)."""
  model_arguments = model.arguments(dataset.model_arguments)
  language_model = dataset.kind == "language_model"
  if model.language_model != language_model:
    kinds = ("a language model", "a classification dataset") if not language_model else (
        "a classifier", "a language-model dataset")
    raise ConfigError(f"{model.resolved.qualified_name} is {kinds[0]}; config.dataset={dataset_name!r} is "
                      f"{kinds[1]}. Pair PtbLSTM with ptb/synthetic_ptb, the other models with image datasets.")
  factory = lambda rngs: model.resolved.function(**model_arguments, rngs=rngs)
  description = names.describe(model.resolved, model_arguments)
  if language_model:
    return LanguageModelTask(factory, dataset, description,
                             uses_dropout=model_arguments.get("dropout_rate", 0.0) > 0)
  return ClassificationTask(factory, dataset, description)


def build_task(config: ml_collections.ConfigDict) -> ClassificationTask | LanguageModelTask:
  """The task a config names, its data opened (for scripts and tests; a run resolves its config once)."""
  read = config_lib.FieldReads(config)
  dataset = resolve_dataset(read)
  return make_task(resolve_model(read), open_dataset(dataset), dataset.resolved.name)
