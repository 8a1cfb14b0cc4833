"""Tasks: a model and a dataset with the loss, metrics and carried state that pair them.

`build_task(config)` is the one place where `config.model` and `config.dataset` are resolved (the
name is the import: `"MnistLSTM"` is `lbjax.models.MnistLSTM`, `"mnist"` is
`lbjax.train.datasets.mnist`, `"pkg.module:function"` a user's own). The dataset says which kind of
task it is; one class per kind implements the `Task` protocol the step and the loop use:

- `ClassificationTask`: images (or MNIST rows-as-time-steps) -> labels; cross-entropy, top-1 (and
  top-5 where the dataset asks for it) accuracy. Where the dataset streams uint8 images
  (`Dataset.image_normalization`: ImageNet, CIFAR-10), the per-channel `(x - mean) / stddev` runs
  here, inside the compiled step, on the device.
- `LanguageModelTask`: token windows with the LSTM state carried across consecutive batches
  (truncated BPTT), reset where the stream says; perplexity.
"""

import dataclasses
import re
from typing import Any, Protocol

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lbjax import diagnostics
from lbjax import models
from lbjax.train import datasets
from lbjax.train import names
from lbjax.train.errors import ConfigError

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class Task(Protocol):
  """What the trainer needs to know of a model and its data."""
  dataset: datasets.Dataset
  model_description: str  # the resolved constructor call, for the console

  def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
    """A new model with parameters drawn from `rngs`."""

  def train_loss(self, model, batch, carry, dropout_key, discard_fraction: float = 0.0):
    """`(loss, metrics, new_carry)` of a training batch."""

  def eval_sums(self, model, batch, carry):
    """`(sums, new_carry)`: masked sums over an evaluation batch, added up over the split."""

  def summarize(self, sums: dict[str, float]) -> dict[str, float]:
    """The evaluation metrics from the sums over the whole split."""

  def zero_carry(self, model: nnx.Module, global_batch_size: int) -> Any:
    """The carried state at the start of a row of batches (host arrays), or None."""

  def take_carry_reset(self, local_batch: dict[str, np.ndarray]) -> bool:
    """Removes the stream's carry-reset flag from a batch; True where the carry starts again."""


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
    mask, labels = batch["mask"], batch["labels"]
    cross_entropy = models.per_example_cross_entropy(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    sums = {"loss_sum": jnp.sum(cross_entropy * mask), "correct": jnp.sum(correct * mask), "count": jnp.sum(mask)}
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

  def take_carry_reset(self, local_batch):
    return False


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
    mask = batch["mask"]  # [N, T]: 0 where a window runs past the end of its row
    return {"loss_sum": jnp.sum(cross_entropy * mask), "count": jnp.sum(mask)}, carry

  def summarize(self, sums):
    loss = sums["loss_sum"] / sums["count"]
    return {"loss": loss, "perplexity": float(np.exp(loss))}

  def zero_carry(self, model, global_batch_size):
    return jax.tree.map(np.asarray, model.initial_carry(global_batch_size))

  def take_carry_reset(self, local_batch):
    return bool(local_batch.pop("reset_carry"))


def _stack_option(run_stack) -> dict[str, Any]:
  """The model call's `run_stack` keyword when the run pipelines the model's stack (none otherwise)."""
  return {} if run_stack is None else {"run_stack": run_stack}


def _options_named_in(options: dict[str, Any], message: str) -> str:
  """The `config.data_options.<k>=<v>` that the message's numbers point at (all of them when none do)."""
  numbers = set(re.findall(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", message))
  named = {k: v for k, v in options.items() if str(v) in numbers} or options
  return ", ".join(f"config.data_options.{k}={v!r}" for k, v in named.items()) or "no data_options"


def model_options(config: ml_collections.ConfigDict) -> dict[str, Any]:
  options = dict(config.model_options.to_dict())
  for name in ("dtype", "param_dtype"):
    if isinstance(options.get(name), str):
      if options[name] not in _DTYPES:
        raise ConfigError(f"config.model_options.{name}={options[name]!r} is not known; choose one of "
                          f"{', '.join(_DTYPES)}.")
      options[name] = _DTYPES[options[name]]
  return options


def resolve_dataset(config: ml_collections.ConfigDict) -> tuple[names.Resolved, dict[str, Any]]:
  """The dataset function `config.dataset` names and its bound arguments (nothing is opened)."""
  resolved = names.resolve("dataset", config.dataset, [datasets])
  supplied = {"data_dir": config.data_dir or None, "seed": config.seed}
  return resolved, names.bind("data_options", resolved, config.data_options.to_dict(), supplied=supplied)


def resolve_model_name(config: ml_collections.ConfigDict) -> names.Resolved:
  """The model constructor `config.model` names."""
  return names.resolve("model", config.model, [models])


def resolve_model(config: ml_collections.ConfigDict, model_arguments: dict[str, Any]
                  ) -> tuple[names.Resolved, dict[str, Any]]:
  """The model constructor `config.model` names and its arguments (config's, then the data's)."""
  resolved = resolve_model_name(config)
  arguments = names.bind("model_options", resolved, model_options(config),
                         supplied=dict(model_arguments, rngs=None), required=("rngs",))
  arguments.pop("rngs")
  return resolved, arguments


def build_task(config: ml_collections.ConfigDict) -> ClassificationTask | LanguageModelTask:
  """Builds the task a config names; opens or loads its data (missing data fails here)."""
  resolved, arguments = resolve_dataset(config)
  try:
    dataset = resolved.function(**arguments)
  except (ValueError, TypeError, MemoryError) as e:
    raise ConfigError(f"config.dataset={config.dataset!r}: {resolved.qualified_name} fails with "
                      f"{_options_named_in(config.data_options.to_dict(), str(e))}: {e or type(e).__name__}") from e
  if not isinstance(dataset, datasets.Dataset):
    raise ConfigError(f"config.dataset={config.dataset!r}: {resolved.qualified_name} returned "
                      f"{type(dataset).__name__}, not an lbjax.train.datasets.Dataset.")
  model, model_arguments = resolve_model(config, dataset.model_arguments)
  language_model = dataset.kind == "language_model"
  if hasattr(model.function, "initial_carry") != language_model:
    kinds = ("a language model", "a classification dataset") if not language_model else (
        "a classifier", "a language-model dataset")
    raise ConfigError(f"{model.qualified_name} is {kinds[0]}; config.dataset={config.dataset!r} is {kinds[1]}. "
                      "Pair PtbLSTM with ptb/synthetic_ptb, the other models with image datasets.")
  if language_model and config.loss.discard_fraction > 0:
    raise ConfigError("config.loss.discard_fraction applies to classification; a language model has no "
                      "per-example loss to rank. Set it to 0.")
  factory = lambda rngs: model.function(**model_arguments, rngs=rngs)
  description = names.describe(model, model_arguments)
  if language_model:
    return LanguageModelTask(factory, dataset, description,
                             uses_dropout=model_arguments.get("dropout_rate", 0.0) > 0)
  return ClassificationTask(factory, dataset, description)
