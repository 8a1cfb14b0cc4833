"""The shapes of a dataset's batches and the size of its epoch, without reading it (`--compile-only`).

A compiled step needs only the shapes and dtypes of its batch, and the projected time of an epoch its
number of steps. For the datasets of `lbjax.train.datasets` these follow from their arguments (the
image size, `seq_len`, the synthetic sizes) and from the published split sizes in `SPLIT_SIZES`; no
file is opened, so a pod run of ImageNet compiles on a machine that holds no ImageNet. Any other
dataset function (a user's own) is opened and one batch is read for its shapes.
"""

from collections.abc import Callable
import dataclasses
import inspect
from typing import Any

from flax import nnx
import jax
import numpy as np

from lbjax import data as lbdata
from lbjax.train import batch_plan
from lbjax.train import build
from lbjax.train import datasets
from lbjax.train import device_data
from lbjax.train import names
from lbjax.train import tasks
from lbjax.train.errors import ConfigError

# Training-split sizes (examples; PTB: tokens of ptb.train.txt with an end-of-sentence token per line).
SPLIT_SIZES = {
    "mnist": 60_000,  # LeCun et al., train-images-idx3-ubyte
    "imagenet": 1_281_167,  # ILSVRC2012 train, TFDS imagenet2012
    "cifar10": 50_000,  # TFDS cifar10 train
    "ptb": 929_589,  # Mikolov's ptb.train.txt: 887,521 words + 42,068 end-of-sentence tokens
}


@dataclasses.dataclass(frozen=True)
class DataShapes:
  """A dataset as the compiled steps see it.

  Attributes:
    dataset: a `datasets.Dataset` whose streams are never opened (the task reads its kind, top-k and
      image normalisation).
    example: name -> (shape, dtype) of one row of a training batch.
    train_size: training examples, or tokens for a language model.
    seq_len: the language model's window (None for classification).
    read_from_data: whether the shapes were read from a batch of the data (a dataset not in the table).
    in_memory: whether the training stream reads in-memory arrays without host transforms, so that
      `config.train_data_on_device` can hold them on the devices (`lbjax.train.device_data`).
  """
  dataset: datasets.Dataset
  example: dict[str, tuple[tuple[int, ...], Any]]
  train_size: int
  seq_len: int | None = None
  read_from_data: bool = False
  in_memory: bool = False

  @property
  def train_bytes(self) -> int:
    """The bytes of the training set's arrays (what `config.train_data_on_device` holds on each device)."""
    row = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in self.example.values())
    return self.train_size * row

  def train_batch(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct((batch_size, *shape), dtype) for k, (shape, dtype) in self.example.items()}

  def eval_batch(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """A training batch's arrays and the `mask` of padded rows (per token for a language model)."""
    mask_shape = (batch_size,) if self.seq_len is None else (batch_size, self.seq_len)
    return dict(self.train_batch(batch_size), mask=jax.ShapeDtypeStruct(mask_shape, np.float32))

  def steps_per_epoch(self, batch_size: int) -> int:
    """Training steps in one epoch at `batch_size` (PTB's streams: full windows of each row, `lbjax.data.ptb`)."""
    if self.seq_len is None:
      return self.train_size // batch_size
    return max(self.train_size // batch_size - 1, 0) // self.seq_len

  def refuse_impossible(self, batch_size: int) -> str | None:
    """Why `batch_size` cannot be trained on this data (the trainer's refusal), or None."""
    if self.steps_per_epoch(batch_size) < 1:
      unit = "tokens leave no full window per row" if self.seq_len else "examples are fewer than the batch"
      return f"a batch of {batch_size}: the {self.train_size} training {unit}; use a smaller batch size."
    return None


def _never_opened(*_):
  raise RuntimeError("compile-only data has no stream; it describes the batches' shapes only.")


def _dataset(kind: str, model_arguments: dict[str, Any], eval_split: str, top_k=(),
             image_normalization=None) -> datasets.Dataset:
  return datasets.Dataset(kind, _never_opened, _never_opened, model_arguments, eval_split, tuple(top_k),
                          image_normalization=image_normalization)


def _image_classes(size: int, channels: int, dtype, train_size: int, num_classes: int, eval_split: str,
                   normalization=None, in_memory: bool = True) -> DataShapes:
  model_arguments = {"num_classes": num_classes, "small_inputs": size <= 64 or channels == 1,
                     "input_channels": channels}
  shape = (size, size) if channels == 1 else (size, size, channels)
  top_k = (5,) if num_classes > 5 and channels == 3 else ()
  return DataShapes(_dataset("classification", model_arguments, eval_split, top_k, normalization),
                    {"images": (shape, dtype), "labels": ((), np.int32)}, train_size, in_memory=in_memory)


def _tokens(arguments: dict[str, Any], train_tokens: int, vocab_size: int, eval_split: str) -> DataShapes:
  seq_len = arguments["seq_len"]
  datasets.check_language_model_options(seq_len, arguments["carry_state"], arguments["eval_protocol"],
                                        arguments["stream_window"])
  return DataShapes(_dataset("language_model", {"vocab_size": vocab_size}, eval_split),
                    {"inputs": ((seq_len,), np.int32), "targets": ((seq_len,), np.int32)}, train_tokens, seq_len)


def _mnist(a):
  train = SPLIT_SIZES["mnist"] - (a["num_validation_examples"] if a["eval_split"] == "validation" else 0)
  return _image_classes(28, 1, np.uint8, train, 10, a["eval_split"], lbdata.MNIST_NORMALIZATION)


def _imagenet(a):
  datasets.check_image_stream_options(a["image_size"], a["num_workers"], a["skip_undecodable"])
  return _image_classes(a["image_size"], 3, np.uint8, SPLIT_SIZES["imagenet"], 1000, a["eval_split"],
                        lbdata.IMAGENET_NORMALIZATION, in_memory=False)


def _cifar10(a):
  datasets.check_image_stream_options(None, a["num_workers"], a["skip_undecodable"])
  return _image_classes(32, 3, np.uint8, SPLIT_SIZES["cifar10"], 10, a["eval_split"], lbdata.CIFAR10_NORMALIZATION,
                        in_memory=False)


# Each dataset function of `lbjax.train.datasets` -> its shapes from its (complete) arguments.
SHAPES: dict[Callable, Callable[[dict[str, Any]], DataShapes]] = {
    datasets.mnist: _mnist,
    datasets.synthetic_mnist: lambda a: _image_classes(28, 1, np.uint8, a["num_train_examples"], 10, a["eval_split"],
                                                       lbdata.MNIST_NORMALIZATION),
    datasets.synthetic_images: lambda a: _image_classes(a["image_size"], 3, np.float32, a["num_train_examples"],
                                                        a["num_classes"], a["eval_split"]),
    datasets.synthetic_imagenet: lambda a: _image_classes(a["image_size"], 3, np.uint8, a["num_train_examples"],
                                                          a["num_classes"], a["eval_split"],
                                                          lbdata.IMAGENET_NORMALIZATION),
    datasets.synthetic_cifar10: lambda a: _image_classes(32, 3, np.uint8, a["num_train_examples"], 10, a["eval_split"],
                                                         lbdata.CIFAR10_NORMALIZATION),
    datasets.imagenet: _imagenet,
    datasets.cifar10: _cifar10,
    datasets.ptb: lambda a: _tokens(a, SPLIT_SIZES["ptb"], 10_000, a["eval_split"]),
    datasets.synthetic_ptb: lambda a: _tokens(a, a["num_train_tokens"], a["vocab_size"], a["eval_split"]),
}


def described_shapes(dataset_call: names.Call) -> DataShapes | None:
  """The batch shapes and epoch size of a dataset of `SHAPES`, from its arguments alone; None for another."""
  resolved, arguments = dataset_call.resolved, dataset_call.arguments
  describe = SHAPES.get(resolved.function)
  if describe is None:
    return None
  bound = inspect.signature(resolved.function).bind_partial(**arguments)
  bound.apply_defaults()
  try:
    return describe(dict(bound.arguments))
  except ValueError as e:  # arguments the dataset function refuses when it opens
    raise tasks.dataset_refusal(dataset_call, e) from e


def data_shapes(dataset_call: names.Call) -> DataShapes:
  """The batch shapes and epoch size of the resolved run's dataset (`ResolvedRun.dataset`), from `SHAPES`
  (nothing read) or, for a dataset function not in it, from one batch of its training stream."""
  described = described_shapes(dataset_call)
  if described is not None:
    return described
  dataset = tasks.open_dataset(dataset_call)
  stream = dataset.make_train_stream(0, 1)
  batch = {k: np.asarray(v) for k, v in stream.next_batch(1).items() if k != "reset_carry"}
  example = {k: (v.shape[1:], v.dtype) for k, v in batch.items()}
  if dataset.kind == "language_model":
    seq_len = batch["inputs"].shape[1]
    tokens = (stream.windows_per_epoch(1) * seq_len) + 1
    return DataShapes(dataset, example, tokens, seq_len, read_from_data=True)
  return DataShapes(dataset, example, stream.num_examples, read_from_data=True, in_memory=_in_memory(stream))


def check_data(run: Any, data: DataShapes) -> tasks.ClassificationTask | tasks.LanguageModelTask:
  """What the start of a run refuses about its data, on the data's shapes (`run` a `ResolvedRun`): a
  training set the devices cannot hold (`config.train_data_on_device`), a batch the data cannot fill, a
  model that does not pair with the dataset (`tasks.make_task`, as the run does). Returns the task.

  Raises:
    ConfigError: the first problem.
  """
  if run.train_data_on_device and not data.in_memory:
    raise device_data.refusal(run.dataset_name, "does not read in-memory arrays without host transforms")
  for field, size in batch_plan.sizes_to_fit_data(run.batch):
    if (problem := data.refuse_impossible(size)) is not None:
      raise ConfigError(f"{field}: {problem}")
  return tasks.make_task(run.model, data.dataset, run.dataset_name)


def check_without_data(run: Any) -> None:
  """`check_data` where the dataset's shapes are known without reading it (`SHAPES`; `--dry-run`), and the model, its
  training loss on such batches and the optimizer's state in shapes (`build.abstract_model`,
  `build.check_model_takes_batches`, `build.abstract_optimizer_state`: a mask of none of the parameters): a dataset
  function not in `SHAPES` (a user's) is neither opened nor checked here, but at the start of the run."""
  data = described_shapes(run.dataset)
  if data is None:
    return
  task = check_data(run, data)
  model = build.abstract_model(run, task)
  build.check_model_takes_batches(run, task, model, data.example)
  _, params, _ = nnx.split(model, nnx.Param, nnx.BatchStat)
  build.abstract_optimizer_state(run, run.build_optimizer(), nnx.to_pure_dict(params))


def _in_memory(stream: Any) -> bool:
  try:
    device_data.index_stream(stream, "")
  except ConfigError:
    return False
  return True
