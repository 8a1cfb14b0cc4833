"""Tasks: the pairing of a model, a dataset and a loss that a config names.

A task loads or opens its data when it is built (before any compute, so missing data fails early
with the data module's message), builds its model on demand, and says how to compute the training loss and the evaluation sums. Two kinds:
- `ClassificationTask`: images (or MNIST rows-as-time-steps) -> labels; cross-entropy and accuracy.
- `LanguageModelTask`: PTB windows with the LSTM state carried across batches; perplexity.
"""

from collections.abc import Callable, Iterator
import dataclasses
import pathlib
from typing import Any

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lbjax import data as lbdata
from lbjax import diagnostics
from lbjax import models

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _model_options(config: ml_collections.ConfigDict) -> dict[str, Any]:
  options = dict(config.model_options.to_dict())
  for name in ("dtype", "param_dtype"):
    if isinstance(options.get(name), str):
      if options[name] not in _DTYPES:
        raise ValueError(f"config.model_options.{name}={options[name]!r} is not known; choose one of "
                         f"{', '.join(_DTYPES)}.")
      options[name] = _DTYPES[options[name]]
  return options


def _data_dir(config: ml_collections.ConfigDict) -> pathlib.Path | None:
  return pathlib.Path(config.data_dir) if config.data_dir else None


@dataclasses.dataclass
class ClassificationTask:
  """Cross-entropy classification of `batch['images']` into `batch['labels']`."""
  build_model: Callable[[nnx.Rngs], nnx.Module]
  make_train_stream: Callable[[int, int], Any]
  make_eval_batches: Callable[[int, int, int], Iterator[dict[str, np.ndarray]]]
  carries_state: bool = False

  def train_loss(self, model, batch, carry, dropout_key, discard_fraction=0.0):
    del dropout_key
    logits = model(batch["images"], train=True)
    metrics = {"accuracy": models.accuracy(logits, batch["labels"])}
    if not discard_fraction:
      return models.softmax_cross_entropy(logits, batch["labels"]), metrics, carry
    per_example = models.per_example_cross_entropy(logits, batch["labels"])
    kept = diagnostics.small_loss_discard_weights(per_example, discard_fraction)
    return jnp.sum(kept * per_example) / jnp.sum(kept), metrics, carry

  def eval_sums(self, model, batch, carry):
    logits = model(batch["images"], train=False)
    mask = batch["mask"]
    cross_entropy = models.per_example_cross_entropy(logits, batch["labels"])
    correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
    return {"loss_sum": jnp.sum(cross_entropy * mask), "correct": jnp.sum(correct * mask),
            "count": jnp.sum(mask)}, carry

  @staticmethod
  def summarize(sums: dict[str, float]) -> dict[str, float]:
    return {"loss": sums["loss_sum"] / sums["count"], "accuracy": sums["correct"] / sums["count"]}


@dataclasses.dataclass
class LanguageModelTask:
  """Next-token cross-entropy over windows of a token stream, with the LSTM state carried across
  consecutive batches (truncated BPTT) and reset at each epoch start."""
  build_model: Callable[[nnx.Rngs], nnx.Module]
  make_train_stream: Callable[[int, int], Any]
  make_eval_batches: Callable[[int, int, int], Iterator[dict[str, np.ndarray]]]
  uses_dropout: bool = False
  carries_state: bool = True

  def train_loss(self, model, batch, carry, dropout_key, discard_fraction=0.0):
    del discard_fraction  # refused for language models by config validation
    logits, carry = model(batch["inputs"], carry, train=True,
                          dropout_key=dropout_key if self.uses_dropout else None)
    loss = models.softmax_cross_entropy(logits, batch["targets"])
    return loss, {}, carry

  def eval_sums(self, model, batch, carry):
    logits, carry = model(batch["inputs"], carry, train=False)
    cross_entropy = models.per_example_cross_entropy(logits, batch["targets"])
    mask = batch["mask"]  # [N, T]: 0 where a window runs past the end of its row
    return {"loss_sum": jnp.sum(cross_entropy * mask), "count": jnp.sum(mask)}, carry

  @staticmethod
  def summarize(sums: dict[str, float]) -> dict[str, float]:
    loss = sums["loss_sum"] / sums["count"]
    return {"loss": loss, "perplexity": float(np.exp(loss))}


def _image_model(config: ml_collections.ConfigDict, num_classes: int, small_inputs: bool,
                 input_channels: int) -> Callable[[nnx.Rngs], nnx.Module]:
  options = _model_options(config)
  if config.model == "mnist_lstm":
    return lambda rngs: models.MnistLSTM(num_classes=num_classes, **options, rngs=rngs)
  constructor = {"resnet50": models.ResNet50, "resnet18": models.ResNet18,
                 "resnet_tiny": models.ResNetTiny}[config.model]
  options.setdefault("small_inputs", small_inputs)
  options.setdefault("input_channels", input_channels)
  return lambda rngs: constructor(num_classes=num_classes, **options, rngs=rngs)


def _array_task(config, train_source, eval_source, num_classes, *, small_inputs, input_channels,
                train_transform=None, eval_transform=None) -> ClassificationTask:

  def make_train_stream(process_index, process_count):
    return lbdata.TrainStream(train_source, seed=config.seed, process_index=process_index,
                              process_count=process_count, transform=train_transform)

  def make_eval_batches(batch_size, process_index, process_count):
    return lbdata.eval_batches(eval_source, batch_size, process_index=process_index,
                               process_count=process_count, transform=eval_transform)

  return ClassificationTask(_image_model(config, num_classes, small_inputs, input_channels),
                            make_train_stream, make_eval_batches)


def _mnist_task(config) -> ClassificationTask:
  options = config.data_options
  if options.mnist_format == "tfds":
    train = lbdata.load_mnist_tfds("train", config.data_dir or None)
    test = lbdata.load_mnist_tfds("test", config.data_dir or None)
  else:
    train = lbdata.load_mnist_idx(_data_dir(config), "train")
    test = lbdata.load_mnist_idx(_data_dir(config), "test")
  return _array_task(config, train, test, 10, small_inputs=True, input_channels=1)


def _synthetic_image_task(config, *, mnist: bool) -> ClassificationTask:
  options = config.data_options
  num_train = options.num_train_examples
  num_eval = options.num_eval_examples
  num_classes = options.num_classes
  if mnist:
    train = lbdata.synthetic_mnist(num_train, seed=config.seed, split="train")
    test = lbdata.synthetic_mnist(num_eval, seed=config.seed, split="test")
    return _array_task(config, train, test, 10, small_inputs=True, input_channels=1)
  image_size = options.image_size or 32
  kwargs = dict(image_size=image_size, channels=3, num_classes=num_classes)
  train = lbdata.synthetic_images(num_train, **kwargs, seed=config.seed, split="train")
  test = lbdata.synthetic_images(num_eval, **kwargs, seed=config.seed, split="test")
  return _array_task(config, train, test, num_classes, small_inputs=image_size <= 64, input_channels=3)


def _vision_task(config, dataset: str) -> ClassificationTask:
  image_size = config.data_options.image_size or (224 if dataset == "imagenet" else 32)
  data_dir = config.data_dir or None
  if dataset == "imagenet":
    train_stream, eval_batches, num_classes = lbdata.imagenet_train_stream, lbdata.imagenet_eval_batches, 1000
    kwargs = {"image_size": image_size}
  else:
    train_stream, eval_batches, num_classes = lbdata.cifar10_train_stream, lbdata.cifar10_eval_batches, 10
    kwargs = {}

  def make_train_stream(process_index, process_count):
    return train_stream(data_dir=data_dir, seed=config.seed, process_index=process_index,
                        process_count=process_count, **kwargs)

  def make_eval_batches(batch_size, process_index, process_count):
    return eval_batches(batch_size, data_dir=data_dir, process_index=process_index,
                        process_count=process_count, **kwargs)

  return ClassificationTask(_image_model(config, num_classes, dataset == "cifar10", 3),
                            make_train_stream, make_eval_batches)


def _language_model_task(config) -> LanguageModelTask:
  options = config.data_options
  seq_len = options.seq_len
  if config.dataset == "ptb":
    corpus = lbdata.PtbCorpus.from_dir(_data_dir(config))
    train_tokens, eval_tokens = corpus.train, corpus.split(options.eval_split)
    vocab_size = corpus.vocab_size
  else:
    vocab_size = options.vocab_size
    train_tokens = lbdata.synthetic_ptb_tokens(options.num_train_tokens, vocab_size,
                                               seed=config.seed, split="train")
    eval_tokens = lbdata.synthetic_ptb_tokens(options.num_eval_tokens, vocab_size,
                                              seed=config.seed, split="valid")
  model_options = _model_options(config)
  model_options.setdefault("vocab_size", vocab_size)

  def make_train_stream(process_index, process_count):
    return lbdata.PtbStream(train_tokens, seq_len=seq_len, process_index=process_index,
                            process_count=process_count)

  def make_eval_batches(batch_size, process_index, process_count):
    return lbdata.ptb_eval_batches(eval_tokens, batch_size, seq_len=seq_len, process_index=process_index,
                                   process_count=process_count)

  return LanguageModelTask(lambda rngs: models.PtbLSTM(**model_options, rngs=rngs), make_train_stream,
                           make_eval_batches, uses_dropout=model_options.get("dropout_rate", 0.0) > 0)


def build_task(config: ml_collections.ConfigDict) -> ClassificationTask | LanguageModelTask:
  """Builds the task a (validated) config names; loads or opens its data."""
  if config.dataset in ("ptb", "synthetic_ptb"):
    return _language_model_task(config)
  if config.dataset == "mnist":
    return _mnist_task(config)
  if config.dataset in ("synthetic_mnist", "synthetic_images"):
    return _synthetic_image_task(config, mnist=config.dataset == "synthetic_mnist")
  return _vision_task(config, config.dataset)


def initial_carry(model: nnx.Module, global_batch_size: int) -> Any:
  """The zero LSTM state for a batch (host arrays; the loop places them on the mesh)."""
  return jax.tree.map(np.asarray, model.initial_carry(global_batch_size))
