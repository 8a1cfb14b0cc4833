"""Datasets by name: `config.dataset = "mnist"` is `lbjax.train.datasets.mnist`.

Each function opens (or loads) its data when called, so missing files fail before any compute with
the data module's message, and returns a `Dataset`: the train stream and eval batches as functions of
the process layout, what kind of task it is, and the model arguments that follow from the data
(`num_classes`, `vocab_size`, ...). `config.data_options` are the function's keyword arguments;
`data_dir` and `seed` come from the config's top-level fields. A user's dataset is any function of
this shape, named `"package.module:function"`.

Every dataset `<name>` has a synthetic twin `synthetic_<name>` that takes the same options (and a few
of its own: sizes), so `--config.dataset=synthetic_<name>` runs any config without its data: the
options that shape the batches (`eval_split`, `seq_len`, `carry_state`, `image_size`) act on the twin
as on the data, those about where and how the data is read (`data_dir`, `source`, `download`,
`decode`, `num_workers`, `skip_undecodable`, `num_validation_examples`) have nothing to act on.
"""

from collections.abc import Callable, Iterator
import dataclasses
import hashlib
import os
from typing import Any, Literal

import numpy as np

from lbjax import data as lbdata

TrainStreamFactory = Callable[[int, int], Any]  # (process_index, process_count) -> stream
EvalBatchesFactory = Callable[[int, int, int], Iterator[dict[str, np.ndarray]]]  # (batch, index, count)

MNIST_VALIDATION_SEED = 0

# Options of this module's functions that act only when another option has a given value: (option, the
# option it depends on, that value). Set away from its default otherwise it would change nothing, so
# `lbjax.train.tasks.resolve_dataset` refuses it.
DEPENDENT_OPTIONS = (("num_validation_examples", "eval_split", "validation"),)


@dataclasses.dataclass(frozen=True)
class Dataset:
  """The data half of a task.

  Attributes:
    kind: "classification" (`images` -> `labels`) or "language_model" (`inputs` -> `targets`, a
      carried state across consecutive batches).
    make_train_stream: the resumable training stream of one process.
    make_eval_batches: the evaluation split of one process, in padded batches with a `mask`.
    model_arguments: constructor arguments that follow from the data, used where the model takes
      them and the config does not set them.
    eval_split: the split evaluated ("test", "validation", ...), shown on the console.
    top_k: the accuracies reported besides top-1 (classification).
    fingerprint: what identifies the data of each split ("train", "eval"), recorded in every
      checkpoint so that a resume against other data is refused: a SHA-256 of the arrays read
      (`array_fingerprint`), or the TFDS name, version and size.
    fingerprinted_arrays: the arrays each split's fingerprint was taken of (empty for other
      fingerprints), as the stream hands them over, so that `fingerprint_like` can take it again in
      a checkpoint's kind (`input_fingerprint`).
    image_normalization: for streams of uint8 images (ImageNet, CIFAR-10, MNIST), what the task
      applies to them inside the compiled step, on the device (`lbjax.data.Normalization`'s
      per-channel `(x - mean) / stddev`, MNIST's `PixelScale`); None where the batches hold the
      model's inputs as they are.
  """
  kind: Literal["classification", "language_model"]
  make_train_stream: TrainStreamFactory
  make_eval_batches: EvalBatchesFactory
  model_arguments: dict[str, Any]
  eval_split: str
  top_k: tuple[int, ...] = ()
  fingerprint: dict[str, str] = dataclasses.field(default_factory=dict)
  fingerprinted_arrays: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict, repr=False,
                                                                             compare=False)
  image_normalization: lbdata.Normalization | lbdata.PixelScale | None = None

  def fingerprint_like(self, saved: dict[str, str]) -> dict[str, str]:
    """This data's fingerprint with each split taken in the kind `saved` holds it (all bytes or a
    sample, `array_fingerprint`), so that a checkpoint compares equal on the same data whichever
    kind it recorded."""
    like = dict(self.fingerprint)
    for split, arrays in self.fingerprinted_arrays.items():
      kind = _fingerprint_kind(saved.get(split, ""))
      if kind is not None and kind != _fingerprint_kind(like.get(split, "")):
        like[split] = input_fingerprint(arrays, self.image_normalization, sampled=kind == SAMPLED)
    return like


FULL, SAMPLED = "sha256:", "sampled-sha256:"
SAMPLE_ABOVE_BYTES = 16 * 2**20  # arrays larger than this are fingerprinted by a sample of their bytes
_SAMPLE_BLOCKS, _SAMPLE_BLOCK_BYTES = 1024, 4096  # 4 MiB read of each such array


def _fingerprint_kind(fingerprint: str) -> str | None:
  return next((kind for kind in (SAMPLED, FULL) if fingerprint.startswith(kind)), None)


class _NormalizedRows:
  """`normalization(images)` as `array_fingerprint` reads it, computed a few rows at a time where it reads a
  sample: a dataset's float images (4 bytes for each uint8 pixel) need not exist whole on the host to be
  fingerprinted. `normalization` acts on each row alone (`lbdata.Normalization`, `lbdata.PixelScale`), so
  the bytes of rows normalised apart are those of the whole normalised at once."""

  def __init__(self, images: np.ndarray, normalization: Callable[[np.ndarray], np.ndarray]):
    first = np.ascontiguousarray(normalization(images[:1]))
    self.images, self.normalization = images, normalization
    self.dtype, self.shape = first.dtype, (len(images),) + first.shape[1:]
    self.row_bytes = first.nbytes
    self.nbytes = self.row_bytes * len(images)

  def __len__(self) -> int:
    return len(self.images)

  def byte_range(self, start: int, stop: int) -> memoryview:
    first, last = start // self.row_bytes, -(-stop // self.row_bytes)
    rows = np.ascontiguousarray(self.normalization(self.images[first:last])).reshape(-1).view(np.uint8)
    return memoryview(rows[start - first * self.row_bytes:stop - first * self.row_bytes])


def _byte_reader(array: np.ndarray | _NormalizedRows) -> Callable[[int, int], memoryview]:
  if isinstance(array, _NormalizedRows):
    return array.byte_range
  flat = array.reshape(-1).view(np.uint8)
  return lambda start, stop: memoryview(flat[start:stop])


def _sampled_blocks(array: np.ndarray | _NormalizedRows) -> Iterator[memoryview]:
  """`_SAMPLE_BLOCKS` blocks of `_SAMPLE_BLOCK_BYTES` at evenly spaced offsets, the first block at the
  start and the last at the end of the array's bytes (all of them when the array is smaller)."""
  read = _byte_reader(array)
  if array.nbytes <= _SAMPLE_BLOCKS * _SAMPLE_BLOCK_BYTES:
    yield read(0, array.nbytes)
    return
  for start in np.linspace(0, array.nbytes - _SAMPLE_BLOCK_BYTES, _SAMPLE_BLOCKS).astype(np.int64):
    yield read(int(start), int(start) + _SAMPLE_BLOCK_BYTES)


def array_fingerprint(arrays: dict[str, np.ndarray], *, sampled: bool | None = None) -> str:
  """SHA-256 (first 16 hex digits) over the names, shapes, dtypes and bytes of `arrays`, and the size.

  Taken at every start, so an array larger than `SAMPLE_ABOVE_BYTES` (16 MiB) contributes a
  deterministic sample of its bytes instead of all of them (1,024 blocks of 4 KiB, evenly spaced):
  the fingerprint then reads `sampled-sha256:...` instead of `sha256:...`. It identifies the data a
  run was trained on (another file, version or subset changes it); it is not an integrity check of
  every byte. `sampled`: force one kind (None: sampled exactly when an array exceeds 16 MiB).
  """
  arrays = {name: array if isinstance(array, _NormalizedRows) else np.ascontiguousarray(array)
            for name, array in arrays.items()}
  if sampled is None:
    sampled = any(array.nbytes > SAMPLE_ABOVE_BYTES for array in arrays.values())
  digest = hashlib.sha256()
  for name in sorted(arrays):
    array = arrays[name]
    digest.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
    if sampled and array.nbytes > SAMPLE_ABOVE_BYTES:
      for block in _sampled_blocks(array):
        digest.update(block)
    else:
      digest.update(_byte_reader(array)(0, array.nbytes))
  length = len(next(iter(arrays.values()))) if arrays else 0
  return f"{SAMPLED if sampled else FULL}{digest.hexdigest()[:16]} ({length} rows)"


def input_fingerprint(arrays: dict[str, np.ndarray], image_normalization=None, *, sampled: bool | None = None) -> str:
  """`array_fingerprint` of `arrays` as the model reads them: uint8 `images` through the dataset's
  `image_normalization` (on the host, only the rows the hash reads: `_NormalizedRows`). So the
  fingerprint names the examples, not the dtype they travel in: MNIST's checkpoints saved when its
  stream handed over float32 pixel / 255 resume now that it hands over the uint8 pixels."""
  if image_normalization is not None:
    images = arrays["images"]
    arrays = {**arrays, "images": _NormalizedRows(images, image_normalization) if len(images)
              else image_normalization(images)}
  return array_fingerprint(arrays, sampled=sampled)


def _array_dataset(train: lbdata.ArraySource, evaluation: lbdata.ArraySource, *, seed: int,
                   model_arguments: dict[str, Any], eval_split: str, top_k: tuple[int, ...] = (),
                   image_normalization: lbdata.Normalization | lbdata.PixelScale | None = None) -> Dataset:

  def make_train_stream(process_index, process_count):
    return lbdata.TrainStream(train, seed=seed, process_index=process_index, process_count=process_count)

  def make_eval_batches(batch_size, process_index, process_count):
    return lbdata.eval_batches(evaluation, batch_size, process_index=process_index, process_count=process_count)

  arrays = {"train": train.arrays, "eval": evaluation.arrays}
  return Dataset("classification", make_train_stream, make_eval_batches, model_arguments, eval_split, top_k,
                 {split: input_fingerprint(a, image_normalization) for split, a in arrays.items()}, arrays,
                 image_normalization)


def _split_off_validation(train: lbdata.ArraySource, num_validation: int) -> tuple[lbdata.ArraySource, ...]:
  """(train minus validation, validation): a fixed random subset, the same for every run and seed."""
  if not 0 < num_validation < len(train):
    raise ValueError(f"num_validation_examples must be in (0, {len(train)}), got {num_validation}.")
  order = np.random.default_rng(MNIST_VALIDATION_SEED).permutation(len(train))
  keep, held_out = np.sort(order[num_validation:]), np.sort(order[:num_validation])
  return lbdata.ArraySource(**train.take(keep)), lbdata.ArraySource(**train.take(held_out))


def mnist(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0,
          source: Literal["idx", "tfds", "auto"] = "idx", download: bool = False,
          eval_split: Literal["test", "validation"] = "test", num_validation_examples: int = 10000) -> Dataset:
  """MNIST, 60k training and 10k test digits (LeCun's idx files, or TFDS `mnist`).

  Args:
    data_dir: folder of the idx files (or of TFDS data); None: `$LBJAX_DATA_DIR` or ../shared/data.
    seed: the training stream's shuffling seed.
    source: "idx" (LeCun's files), "tfds", or "auto": the idx files where they are found, else TFDS
      (what the notebooks use, so that they run in Colab as they are).
    download: let TFDS download and prepare `mnist` when it is not there (needs network access).
    eval_split: "test" trains on all 60k and evaluates on the test set (the papers' protocol);
      "validation" holds `num_validation_examples` out of the training set (a fixed subset, the same
      for every seed), trains on the rest and evaluates on them: choose hyper-parameters this way.
      The subset is chosen by position in the source's order, and TFDS stores the 60k digits in
      another order than LeCun's files: the two sources hold out different digits (and shuffle
      differently), so compare runs on one source.
    num_validation_examples: size of the held-out set for `eval_split="validation"`.
  """
  if source not in ("idx", "tfds", "auto"):
    raise ValueError(f"mnist: source must be 'idx', 'tfds' or 'auto', got {source!r}.")
  if eval_split not in ("test", "validation"):
    raise ValueError(f"mnist: eval_split must be 'test' or 'validation', got {eval_split!r}.")
  if source == "auto":
    try:
      train, test = (lbdata.load_mnist_idx(data_dir or None, split) for split in ("train", "test"))
    except FileNotFoundError:
      source = "tfds"
  if source == "tfds":
    train, test = (lbdata.load_mnist_tfds(split, data_dir or None, download=download) for split in ("train", "test"))
  elif source == "idx":
    train, test = (lbdata.load_mnist_idx(data_dir or None, split) for split in ("train", "test"))
  if eval_split == "validation":
    train, test = _split_off_validation(train, num_validation_examples)
  return _array_dataset(train, test, seed=seed, eval_split=eval_split,
                        model_arguments={"num_classes": 10, "small_inputs": True, "input_channels": 1},
                        image_normalization=lbdata.MNIST_NORMALIZATION)


def synthetic_mnist(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0,
                    source: Literal["idx", "tfds", "auto"] = "idx", download: bool = False,
                    eval_split: Literal["test", "validation"] = "test", num_validation_examples: int = 10000,
                    num_train_examples: int = 2048, num_eval_examples: int = 512) -> Dataset:
  """Class-prototype digits shaped like MNIST (tests, benchmarks): `mnist`'s twin. `eval_split`
  "validation" evaluates on the generator's validation draws; `data_dir`, `source`, `download` and
  `num_validation_examples` are `mnist`'s and change nothing here."""
  del data_dir, download, num_validation_examples
  if source not in ("idx", "tfds", "auto"):
    raise ValueError(f"synthetic_mnist: source must be 'idx', 'tfds' or 'auto', got {source!r}.")
  evaluation_split = _synthetic_eval_split("synthetic_mnist", eval_split, {"test": "test", "validation": "valid"})
  train = lbdata.synthetic_mnist(num_train_examples, seed=seed, split="train")
  test = lbdata.synthetic_mnist(num_eval_examples, seed=seed, split=evaluation_split)
  return _array_dataset(train, test, seed=seed, eval_split=eval_split,
                        model_arguments={"num_classes": 10, "small_inputs": True, "input_channels": 1},
                        image_normalization=lbdata.MNIST_NORMALIZATION)


def _synthetic_eval_split(function: str, eval_split: str, splits: dict[str, str]) -> str:
  """The generator's split standing in for the data's `eval_split`."""
  if eval_split not in splits:
    raise ValueError(f"{function}: eval_split must be {' or '.join(map(repr, splits))}, got {eval_split!r}.")
  return splits[eval_split]


def synthetic_images(*, seed: int = 0, num_train_examples: int = 2048, num_eval_examples: int = 512,
                     image_size: int = 32, num_classes: int = 10, noise: float = 1.0,
                     eval_split: Literal["test", "validation"] = "test") -> Dataset:
  """Class-prototype RGB images, float32 values on the scale of normalised images (tests, benchmarks; the
  twins of ImageNet and CIFAR-10, `synthetic_imagenet` and `synthetic_cifar10`, hand over uint8 pixels as they do).

  `noise`: the per-pixel noise standard deviation around each class prototype (larger is harder; see
  `lbjax.data.synthetic_images`). `eval_split`: "test" evaluates on the generator's test draws,
  "validation" on its independent validation draws of the same classes: choose hyper-parameters this way.
  """
  evaluation_split = _synthetic_eval_split("synthetic_images", eval_split,
                                           {"test": "test", "validation": "validation"})
  return _class_prototype_images(seed=seed, num_train_examples=num_train_examples,
                                 num_eval_examples=num_eval_examples, image_size=image_size, num_classes=num_classes,
                                 noise=noise, eval_split=evaluation_split, pixels_for=None)


def _class_prototype_images(*, seed: int, num_train_examples: int, num_eval_examples: int, image_size: int,
                            num_classes: int, noise: float, eval_split: str,
                            pixels_for: lbdata.Normalization | None) -> Dataset:
  """`synthetic_images`' dataset (`eval_split` "test" or "validation", checked by the caller); with
  `pixels_for`, of uint8 pixels that the task normalises with it in the step (the twins of the uint8 image
  streams, ImageNet and CIFAR-10)."""
  kwargs = dict(image_size=image_size, channels=3, num_classes=num_classes, noise=noise, pixels_for=pixels_for)
  train = lbdata.synthetic_images(num_train_examples, **kwargs, seed=seed, split="train")
  evaluation = lbdata.synthetic_images(num_eval_examples, **kwargs, seed=seed,
                                       split="valid" if eval_split == "validation" else "test")
  return _array_dataset(train, evaluation, seed=seed, eval_split=eval_split, top_k=(5,) if num_classes > 5 else (),
                        model_arguments={"num_classes": num_classes, "small_inputs": image_size <= 64,
                                         "input_channels": 3}, image_normalization=pixels_for)


def _tfds_fingerprint(name: str, data_dir, splits: tuple[str, str]) -> dict[str, str]:
  """Checks that TFDS `name` is prepared (else the "not prepared, here is how" message, before any
  compute) and returns its fingerprint: name, version and each split's size."""
  builder = lbdata.prepared_builder(name, data_dir)
  fingerprint = {}
  for role, split in zip(("train", "eval"), splits):
    try:  # a name, or TFDS's slicing of one ("validation[:1000]", "train[90%:]")
      rows = builder.info.splits[split].num_examples
    except (KeyError, ValueError, AssertionError) as e:
      raise ValueError(f"{'eval_split' if role == 'eval' else 'the training split'} {split!r}: TFDS dataset "
                       f"{name!r} in {builder.data_dir} has the splits {', '.join(builder.info.splits)}, and "
                       f"TFDS's slices of them such as 'validation[:1000]' ({e}).") from None
    fingerprint[role] = f"tfds:{name}:{builder.version}:{split} ({rows} rows)"
  return fingerprint


def check_image_stream_options(image_size: int | None, num_workers: int, skip_undecodable: bool) -> None:
  """The options of a TFDS image dataset (`imagenet`, `cifar10`; `image_size` None where fixed), checked when it
  opens (a config error, not an error of the first stream made) and by `--dry-run` without the data
  (`lbjax.train.abstract_data`)."""
  if image_size is not None:
    lbdata.check_image_size(image_size)
  lbdata.check_num_workers(num_workers)
  lbdata.check_skip_undecodable(skip_undecodable)


def _tfds_vision(train_stream, eval_batches, *, tfds_name: str, data_dir, seed: int, eval_split: str,
                 num_classes: int, small_inputs: bool, normalization: lbdata.Normalization,
                 **kwargs) -> Dataset:
  check_image_stream_options(kwargs.get("image_size"), kwargs["num_workers"], kwargs["skip_undecodable"])
  fingerprint = _tfds_fingerprint(tfds_name, data_dir, ("train", eval_split))

  def make_train_stream(process_index, process_count):
    return train_stream(data_dir=data_dir or None, seed=seed, process_index=process_index,
                        process_count=process_count, **kwargs)

  def make_eval_batches(batch_size, process_index, process_count):
    return eval_batches(batch_size, split=eval_split, data_dir=data_dir or None, process_index=process_index,
                        process_count=process_count, **kwargs)

  return Dataset("classification", make_train_stream, make_eval_batches,
                 {"num_classes": num_classes, "small_inputs": small_inputs, "input_channels": 3},
                 eval_split, top_k=(5,), fingerprint=fingerprint, image_normalization=normalization)


def imagenet(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, image_size: int = 224,
             eval_split: str = "validation", decode: Literal["reduced", "full"] = "reduced",
             num_workers: int = 0, skip_undecodable: bool = False) -> Dataset:
  """ImageNet-1k (`imagenet2012` prepared for TFDS): Inception crops + flips for training, centre crops
  for evaluation, uint8 batches normalised in the step; top-1 and top-5 accuracy. `decode`, `num_workers` and
  `skip_undecodable`: see `lbjax.data.imagenet_train_stream` (reduced-size JPEG decoding; grain worker
  processes; skipping the records that cannot be decoded, counted as `undecodable_skipped` in the metrics)."""
  return _tfds_vision(lbdata.imagenet_train_stream, lbdata.imagenet_eval_batches, tfds_name="imagenet2012",
                      data_dir=data_dir, seed=seed,
                      eval_split=eval_split, num_classes=1000, small_inputs=image_size <= 64,
                      normalization=lbdata.IMAGENET_NORMALIZATION,
                      image_size=image_size, decode=decode, num_workers=num_workers,
                      skip_undecodable=skip_undecodable)


def synthetic_imagenet(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, image_size: int = 224,
                       eval_split: str = "validation", decode: Literal["reduced", "full"] = "reduced",
                       num_workers: int = 0, skip_undecodable: bool = False, num_classes: int = 1000,
                       num_train_examples: int = 256, num_eval_examples: int = 128) -> Dataset:
  """Class-prototype images shaped like `imagenet`'s batches (its twin): uint8 pixels normalised in the step
  with ImageNet's statistics, `image_size` and `eval_split` ("validation": the generator's validation draws;
  "train" or "test": its test draws) as there, top-5 accuracy. The prototypes take
  `num_classes * image_size**2 * 12` bytes (600 MB at 1000 x 224)."""
  del data_dir, decode, num_workers, skip_undecodable
  evaluation_split = _synthetic_eval_split("synthetic_imagenet", eval_split,
                                           {"validation": "validation", "train": "test", "test": "test"})
  return _class_prototype_images(seed=seed, num_train_examples=num_train_examples,
                                 num_eval_examples=num_eval_examples, image_size=image_size, num_classes=num_classes,
                                 noise=1.0, eval_split=evaluation_split, pixels_for=lbdata.IMAGENET_NORMALIZATION)


def cifar10(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, eval_split: str = "test",
            num_workers: int = 0, skip_undecodable: bool = False) -> Dataset:
  """CIFAR-10 (TFDS `cifar10`): pad-crop-flip for training, uint8 batches normalised in the step; top-1 and
  top-5 accuracy. `num_workers`: grain worker processes computing batches (0: the training process);
  `skip_undecodable`: skip the records TFDS cannot decode (`lbjax.data.cifar10_train_stream`)."""
  return _tfds_vision(lbdata.cifar10_train_stream, lbdata.cifar10_eval_batches, tfds_name="cifar10",
                      data_dir=data_dir, seed=seed,
                      eval_split=eval_split, num_classes=10, small_inputs=True,
                      normalization=lbdata.CIFAR10_NORMALIZATION, num_workers=num_workers,
                      skip_undecodable=skip_undecodable)


def synthetic_cifar10(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, eval_split: str = "test",
                      num_workers: int = 0, skip_undecodable: bool = False, num_train_examples: int = 2048,
                      num_eval_examples: int = 512) -> Dataset:
  """Class-prototype 32x32 images shaped like `cifar10`'s batches (its twin): uint8 pixels normalised in the step
  with CIFAR-10's statistics; `eval_split` "test" or "validation" (the generator's test or validation draws)."""
  del data_dir, num_workers, skip_undecodable
  evaluation_split = _synthetic_eval_split("synthetic_cifar10", eval_split,
                                           {"test": "test", "validation": "validation"})
  return _class_prototype_images(seed=seed, num_train_examples=num_train_examples,
                                 num_eval_examples=num_eval_examples, image_size=32, num_classes=10, noise=1.0,
                                 eval_split=evaluation_split, pixels_for=lbdata.CIFAR10_NORMALIZATION)


EVAL_PROTOCOLS = ("windows", "stream")


def check_language_model_options(seq_len: int, carry_state: bool, eval_protocol: str, stream_window: int) -> None:
  """The options of a token dataset (`ptb`, `synthetic_ptb`), checked when it opens (a config error, not an error
  of the first stream made) and by `--dry-run` without the data (`lbjax.train.abstract_data`)."""
  lbdata.check_seq_len(seq_len)
  lbdata.check_carry_state(carry_state)
  if eval_protocol not in EVAL_PROTOCOLS:
    raise ValueError(f"eval_protocol must be one of {EVAL_PROTOCOLS} (batched windows, or ptb_word_lm's one "
                     f"stream), got {eval_protocol!r}.")
  lbdata.check_stream_window(stream_window)
  if eval_protocol == "stream" and not carry_state:
    raise ValueError("eval_protocol='stream' carries the state through the whole split; it contradicts "
                     "carry_state=False. Use eval_protocol='windows' with carry_state=False.")


def _language_model(train_tokens: np.ndarray, eval_tokens: np.ndarray, *, vocab_size: int, seq_len: int,
                    eval_split: str, carry_state: bool, eval_protocol: str, stream_window: int) -> Dataset:
  check_language_model_options(seq_len, carry_state, eval_protocol, stream_window)
  if len(train_tokens) < seq_len + 1:  # here, where the dataset opens: the stream is made only once training starts
    raise ValueError(f"the training split has {len(train_tokens)} tokens; windows of seq_len={seq_len} need at least "
                     f"seq_len + 1 = {seq_len + 1}. Use a longer training text or a smaller seq_len.")

  def make_train_stream(process_index, process_count):
    return lbdata.PtbStream(train_tokens, seq_len=seq_len, process_index=process_index,
                            process_count=process_count, carry_state=carry_state)

  def make_eval_batches(batch_size, process_index, process_count):
    if eval_protocol == "stream":
      return lbdata.ptb_stream_eval_batches(eval_tokens, batch_size, stream_window, process_index=process_index,
                                            process_count=process_count)
    return lbdata.ptb_eval_batches(eval_tokens, batch_size, seq_len=seq_len, process_index=process_index,
                                   process_count=process_count, carry_state=carry_state)

  arrays = {"train": {"tokens": train_tokens}, "eval": {"tokens": eval_tokens}}
  return Dataset("language_model", make_train_stream, make_eval_batches, {"vocab_size": vocab_size}, eval_split,
                 fingerprint={split: array_fingerprint(a) for split, a in arrays.items()}, fingerprinted_arrays=arrays)


def ptb(data_dir: str | os.PathLike[str] | None = None, *, seq_len: int = 20,
        eval_split: Literal["valid", "test"] = "valid", carry_state: bool = True,
        eval_protocol: Literal["windows", "stream"] = "windows", stream_window: int = 1000) -> Dataset:
  """Penn Treebank (Mikolov's `ptb.{train,valid,test}.txt`, 10,000 types) in BPTT windows of `seq_len`.

  Args:
    data_dir: folder holding `ptb/ptb.*.txt` or the files themselves; None: `$LBJAX_DATA_DIR` or
      ../shared/data.
    seq_len: the truncated-BPTT window (20 in papers/001).
    eval_split: "valid" (choose hyper-parameters here) or "test".
    carry_state: True: the LSTM state flows from window to window (training and evaluation);
      False: every window starts from a zero state (an ablation of the carried state).
    eval_protocol: "windows": the split in `eval_batch_size` rows of batched windows, each row's state
      starting at its row boundary (fast; `lbjax.data.ptb_eval_batches`); "stream": TensorFlow
      `ptb_word_lm`'s test protocol, the papers' baseline (batch 1, one state carried from the start
      of the split through all of it; `lbjax.data.ptb_stream_eval_batches`): set `eval_batch_size`
      to the data-parallel size, since rows past the first are padding.
    stream_window: with "stream", tokens per device call (a scanned pass); changes speed, not results.
  """
  if eval_split not in ("valid", "test"):
    raise ValueError(f"ptb: eval_split must be 'valid' or 'test', got {eval_split!r}.")
  corpus = lbdata.PtbCorpus.from_dir(data_dir or None)
  return _language_model(corpus.train, corpus.split(eval_split), vocab_size=corpus.vocab_size, seq_len=seq_len,
                         eval_split=eval_split, carry_state=carry_state, eval_protocol=eval_protocol,
                         stream_window=stream_window)


def synthetic_ptb(data_dir: str | os.PathLike[str] | None = None, *, seed: int = 0, seq_len: int = 20,
                  eval_split: Literal["valid", "test"] = "valid", carry_state: bool = True,
                  eval_protocol: Literal["windows", "stream"] = "windows", stream_window: int = 1000,
                  vocab_size: int = 50, num_train_tokens: int = 20000, num_eval_tokens: int = 4000) -> Dataset:
  """Tokens of a sparse Markov chain shaped like PTB (tests, benchmarks): `ptb`'s twin, `seq_len`,
  `eval_split` (the chain's valid or test walk), `carry_state`, `eval_protocol` and `stream_window` as there;
  `data_dir` changes nothing."""
  del data_dir
  evaluation_split = _synthetic_eval_split("synthetic_ptb", eval_split, {"valid": "valid", "test": "test"})
  train = lbdata.synthetic_ptb_tokens(num_train_tokens, vocab_size, seed=seed, split="train")
  evaluation = lbdata.synthetic_ptb_tokens(num_eval_tokens, vocab_size, seed=seed, split=evaluation_split)
  return _language_model(train, evaluation, vocab_size=vocab_size, seq_len=seq_len, eval_split=eval_split,
                         carry_state=carry_state, eval_protocol=eval_protocol, stream_window=stream_window)
