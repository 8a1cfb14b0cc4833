"""TFDS datasets read without TensorFlow: the random-access source of the ImageNet and CIFAR-10 streams.

`TfdsSource` wraps `tfds.data_source(name, split=split, data_dir=data_dir, download=False)`
(array_record files); `prepared_builder` checks that a dataset is prepared. Both say, when it is not,
where they looked and the command that prepares it (`BUILD_HINTS`, the one copy of these commands).
TFDS and Pillow are the optional `[tfds]` extra, imported when first needed.
"""

from collections.abc import Sequence
import os
import pathlib
from typing import Any

import numpy as np

from lbjax.data import stream
from lbjax.data import threads

# How to prepare a dataset for `tfds.data_source`; `{data_dir}` is the folder searched.
BUILD_HINTS = {
    "imagenet2012": (
        "download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from https://image-net.org "
        "into a folder MANUAL_DIR, then run `tfds build imagenet2012 --manual_dir=MANUAL_DIR "
        "--file_format=array_record --data_dir={data_dir}`"),
    "cifar10": "run `tfds build cifar10 --file_format=array_record --data_dir={data_dir}`",
}


def _tfds(name: str):
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError(
        f"Reading {name!r} needs tensorflow-datasets and pillow: pip install 'lbjax[tfds]'.") from err
  return tfds


def build_hint(name: str, data_dir: str) -> str:
  """The command that prepares TFDS dataset `name` in `data_dir` as array_record files."""
  return BUILD_HINTS.get(
      name, "run `tfds build {name} --file_format=array_record --data_dir={data_dir}`").format(
          name=name, data_dir=data_dir)


def _data_dir_root(name: str, builder) -> str:
  """The data_dir that holds `builder`'s dataset: its `data_dir` is `<root>/<name>[/<config>]/<version>`."""
  levels = len(name.split(":")[0].split("/")) + 1  # the name's parts ("imagenet2012_subset/1pct": 2), the version
  return str(pathlib.PurePath(builder.data_dir).parents[levels - 1])


def _not_prepared(name: str, builder) -> FileNotFoundError:
  root = _data_dir_root(name, builder)
  return FileNotFoundError(
      f"TFDS dataset {name!r} is not prepared in data_dir={root!r} (searched {builder.data_dir}). lbjax "
      f"never downloads data; to prepare it, {build_hint(name, root)}. Or pass the data_dir that holds it "
      "(config.data_dir, or set TFDS_DATA_DIR).")


def prepared_builder(name: str, data_dir: str | os.PathLike[str] | None = None):
  """The `tfds.builder` of a prepared dataset; FileNotFoundError saying how to prepare it otherwise."""
  tfds = _tfds(name)
  builder = tfds.builder(name, data_dir=None if data_dir in (None, "") else os.fspath(data_dir))
  if not builder.is_prepared():
    raise _not_prepared(name, builder)
  return builder


class TfdsSource:
  """Random-access source over a prepared TFDS dataset, read without TensorFlow.

  Wraps `tfds.data_source(name, split=split, data_dir=data_dir, download=False)`; it never
  downloads or prepares anything. `take(indices)` reads and decodes the examples with a thread pool
  (TFDS decodes images with PIL, which releases the GIL) and returns, per feature, one stacked
  array when every example has the same shape (CIFAR images, labels) and otherwise a 1-D object
  array of per-example values (ImageNet images of different sizes, or encoded bytes). A record
  TFDS cannot decode raises `stream.UndecodableExample` with its row.
  """

  def __init__(self, name: str, *, split: str, data_dir: str | os.PathLike[str] | None = None,
               features: Sequence[str] = ("image", "label"), num_threads: int | None = None,
               encoded_features: Sequence[str] = ()):
    """Opens the dataset.

    Args:
      name: TFDS name, e.g. "imagenet2012" or "cifar10".
      split: TFDS split, e.g. "train", "validation", "test" or "train[:1000]".
      data_dir: TFDS data folder; None uses TFDS's default (`$TFDS_DATA_DIR` or
        `~/tensorflow_datasets`).
      features: the features `take` returns (others, e.g. file names, are dropped).
      num_threads: threads used by `take`; None means `threads.default_num_threads()`, 1 reads serially.
      encoded_features: image features returned as their encoded bytes (`tfds.decode.SkipDecoding`)
        instead of decoded arrays, e.g. ("image",) for `jpeg.decode_resized_crop`. TFDS's
        `testing.mock_data` can only produce these with TensorFlow installed.

    Raises:
      FileNotFoundError: the dataset is not prepared in `data_dir` as array_record files; the
        message names the dataset, the folder searched and the command that prepares it.
    """
    if not features:
      raise ValueError("features must name at least one feature, e.g. ('image', 'label').")
    self.name = name
    self.split = split
    self.features = tuple(features)
    self._num_threads = threads.check_num_threads(num_threads)
    unknown = sorted(set(encoded_features) - set(self.features))
    if unknown:
      raise ValueError(f"encoded_features {unknown} are not among features {list(self.features)}.")
    self._data_source = _open(name, split, data_dir, tuple(encoded_features))
    self._num_examples = len(self._data_source)
    if self._num_examples == 0:
      raise ValueError(f"TFDS split {name}/{split} is empty.")

  def __len__(self) -> int:
    return self._num_examples

  def take(self, indices: np.ndarray) -> stream.Batch:
    """Reads and decodes examples `indices` (1-D integers in [0, len)); see the class docstring."""
    indices = stream.check_indices(indices, self._num_examples, str(self))
    examples = threads.map_threaded(self._read, [int(i) for i in indices], self._num_threads)
    failed = {row: example for row, example in enumerate(examples) if isinstance(example, str)}
    if failed:
      raise stream.UndecodableExample(failed)
    return {name: _stack_or_objects([ex[name] for ex in examples]) for name in self.features}

  def _read(self, index: int) -> dict[str, Any] | str:
    """The example, or why TFDS cannot decode it."""
    try:
      example = self._data_source[index]
    except (OSError, ValueError) as err:  # Pillow: UnidentifiedImageError (an OSError), truncated data
      return f"{type(err).__name__}: {err}"
    missing = [name for name in self.features if name not in example]
    if missing:
      raise KeyError(
          f"{self} examples have no feature(s) {missing}; available: {sorted(example)}.")
    return example

  def __str__(self) -> str:
    return f"{self.name} split {self.split!r}"

  def __repr__(self) -> str:
    return f"TfdsSource({self.name!r}, split={self.split!r}, num_examples={self._num_examples})"


def _open(name: str, split: str, data_dir: Any, encoded_features: tuple[str, ...]):
  """`tfds.data_source(..., download=False)` with a clear error when the data is not prepared."""
  tfds = _tfds(name)
  data_dir = None if data_dir is None else os.fspath(data_dir)
  decoders = {feature: tfds.decode.SkipDecoding() for feature in encoded_features} or None
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False, decoders=decoders)
  except (FileNotFoundError, NotImplementedError, AssertionError) as err:
    builder = tfds.builder(name, data_dir=data_dir)
    if builder.is_prepared():
      root = _data_dir_root(name, builder)
      raise FileNotFoundError(
          f"TFDS dataset {name!r} is prepared in {builder.data_dir} but not as array_record "
          f"files, which random access without TensorFlow needs ({err}). Rebuild it: "
          f"{build_hint(name, root)}.") from err
    raise _not_prepared(name, builder) from err


def _stack_or_objects(values: list[Any]) -> np.ndarray:
  """One stacked array, or a 1-D object array when shapes differ or the values are bytes."""
  if values and not any(isinstance(value, bytes) for value in values):
    arrays = [np.asarray(value) for value in values]
    if len({(a.shape, a.dtype) for a in arrays}) <= 1:
      return np.stack(arrays)
  objects = np.empty(len(values), dtype=object)
  objects[:] = [value if isinstance(value, bytes) else np.asarray(value) for value in values]
  return objects
