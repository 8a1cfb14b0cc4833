"""ImageNet (TFDS `imagenet2012`) with the standard ResNet-50 preprocessing, on the CPU.

Training: Inception-style random resized crop (`papers/000` trains ResNet-50 this way, following the
reference TF/MLPerf pipeline) to `image_size` x `image_size`, then a random horizontal flip.
Evaluation: resize the shorter side to `image_size * 256 / 224` and take the central
`image_size` x `image_size` crop. Both end with a per-channel normalisation by the ImageNet
statistics (RGB, 0-255 scale): the transforms give uint8 NHWC images and int32 labels, and the
training step normalises on the device (`IMAGENET_NORMALIZATION`, applied by
`lbjax.train.tasks.ClassificationTask` inside the compiled step): a quarter of the bytes to copy to
the device and no float arithmetic on the host, as big_vision and DALI pipelines do.

Examples are read with `tfds.data_source(..., download=False)` (array_record files; no
TensorFlow). `TfdsSource` is the random-access source the streams of `lbjax.data.stream` consume.
With `decode="reduced"` (the default of the ImageNet streams) it returns each image's JPEG bytes and
the transforms decode only what the output needs (`lbjax.data.jpeg`, libjpeg-turbo): the training
crop window is drawn from the header's height and width, then the JPEG is decoded at the smallest
DCT scale (1, 1/2, 1/4, 1/8) at which that window still covers the output size, only the window's
region where a TurboJPEG 3 library is found (`lbjax.data.libturbojpeg`, the `[turbojpeg]` extra),
else the whole image with simplejpeg (the same pixels); evaluation decodes at the smallest scale
covering the resize-to-256 step. With
`decode="full"` TFDS decodes every image in full with Pillow and the transforms crop and resize the
arrays (the same crop windows and flips). The transforms accept either form per example; both
resample with `jpeg.resize_window` (OpenCV bilinear, not antialiased, as the TF reference
pipeline), so at DCT scale 1 the two forms give the same pixels. Augmentation randomness comes from
`example_rngs(seed, stream position)`, so a batch is the same for any number of processes, worker
processes and after a resume.

TFDS and Pillow are the optional `[tfds]` extra, simplejpeg and OpenCV the `[imagenet]` extra (the
transforms refuse to be built without them, saying what to install); all are imported when first
needed.
"""

from collections.abc import Callable, Sequence
import concurrent.futures
import dataclasses
import math
import numbers
import os
from typing import Any, Literal, NamedTuple

import numpy as np

from lbjax.data import jpeg
from lbjax.data import libturbojpeg
from lbjax.data import stream
from lbjax.data import workers

IMAGENET_MEAN_RGB = (123.675, 116.28, 103.53)
IMAGENET_STDDEV_RGB = (58.395, 57.12, 57.375)

# Eval resize: shorter side to `image_size * 256 / 224` (256 for 224), then a central square crop.
EVAL_RESIZE_RATIO = 256 / 224

DEFAULT_AREA_RANGE = (0.08, 1.0)
DEFAULT_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
DEFAULT_MAX_ATTEMPTS = 10

Decode = Literal["reduced", "full"]
DECODE_MODES = ("reduced", "full")
Decoder = Literal["cpu", "dali"]

_TFDS_BUILD_HINTS = {
    "imagenet2012": (
        "download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from https://image-net.org "
        "into a folder MANUAL_DIR, then run `tfds build imagenet2012 --manual_dir=MANUAL_DIR "
        "--file_format=array_record --data_dir={data_dir}`"),
    "cifar10": "run `tfds build cifar10 --file_format=array_record --data_dir={data_dir}`",
}


class CropBox(NamedTuple):
  """A crop window in pixels: rows `[top, top + height)`, columns `[left, left + width)`."""
  top: int
  left: int
  height: int
  width: int


@dataclasses.dataclass(frozen=True)
class Normalization:
  """Per-channel `(x - mean) / stddev` of uint8 images (channels last, 0-255 scale).

  The image streams hand over uint8 batches; a dataset names its `Normalization` and the training
  step applies it on the device (`lbjax.train.tasks`). `normalize_images` computes the same values
  on the host.
  """
  mean: tuple[float, ...]
  stddev: tuple[float, ...]

  def __post_init__(self):
    if len(self.mean) != len(self.stddev) or not self.mean:
      raise ValueError(f"Normalization needs one mean and one stddev per channel, got mean "
                       f"{self.mean!r} and stddev {self.stddev!r}.")
    if any(not s > 0 for s in self.stddev):
      raise ValueError(f"stddev must be positive, got {self.stddev!r}.")

  def __call__(self, images):
    """float32 `(images - mean) * (1 / stddev)`, with the float32 constants of `normalize_images`
    (so the same values); `images` is a numpy or a jax array (in a jitted step: on the device)."""
    if images.shape[-1] != len(self.mean):
      raise ValueError(f"images have {images.shape[-1]} channels (shape {tuple(images.shape)}) "
                       f"but the normalisation has {len(self.mean)}.")
    mean = np.asarray(self.mean, np.float32)
    inverse_stddev = np.float32(1) / np.asarray(self.stddev, np.float32)
    return (images.astype(np.float32) - mean) * inverse_stddev


IMAGENET_NORMALIZATION = Normalization(IMAGENET_MEAN_RGB, IMAGENET_STDDEV_RGB)


def default_num_threads() -> int:
  """Threads for decoding and augmenting a batch: the CPU count, at most 16."""
  return min(16, os.cpu_count() or 1)


class TfdsSource:
  """Random-access source over a prepared TFDS dataset, read without TensorFlow.

  Wraps `tfds.data_source(name, split=split, data_dir=data_dir, download=False)`; it never
  downloads or prepares anything. `take(indices)` reads and decodes the examples with a thread pool
  (TFDS decodes images with PIL, which releases the GIL) and returns, per feature, one stacked
  array when every example has the same shape (CIFAR images, labels) and otherwise a 1-D object
  array of per-example values (ImageNet images of different sizes, or encoded bytes).
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
      num_threads: threads used by `take`; None means `default_num_threads()`, 1 reads serially.
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
    self._num_threads = _check_num_threads(num_threads)
    unknown = sorted(set(encoded_features) - set(self.features))
    if unknown:
      raise ValueError(f"encoded_features {unknown} are not among features {list(self.features)}.")
    self._data_source = _open_tfds_data_source(name, split, data_dir, tuple(encoded_features))
    self._num_examples = len(self._data_source)
    if self._num_examples == 0:
      raise ValueError(f"TFDS split {name}/{split} is empty.")

  def __len__(self) -> int:
    return self._num_examples

  def take(self, indices: np.ndarray) -> stream.Batch:
    """Reads and decodes examples `indices` (1-D integers in [0, len)); see the class docstring."""
    indices = stream.check_indices(indices, self._num_examples, f"{self.name}/{self.split}")
    examples = _map_threaded(self._read, [int(i) for i in indices], self._num_threads)
    return {name: _stack_or_objects([ex[name] for ex in examples]) for name in self.features}

  def _read(self, index: int) -> dict[str, Any]:
    example = self._data_source[index]
    missing = [name for name in self.features if name not in example]
    if missing:
      raise KeyError(
          f"{self.name}/{self.split} examples have no feature(s) {missing}; available: "
          f"{sorted(example)}.")
    return example

  def __repr__(self) -> str:
    return f"TfdsSource({self.name!r}, split={self.split!r}, num_examples={self._num_examples})"


def _open_tfds_data_source(name: str, split: str, data_dir: Any, encoded_features: tuple[str, ...]):
  """`tfds.data_source(..., download=False)` with a clear error when the data is not prepared."""
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError(
        f"Reading {name!r} needs tensorflow-datasets and pillow: pip install 'lbjax[tfds]'."
    ) from err
  data_dir = None if data_dir is None else os.fspath(data_dir)
  decoders = {feature: tfds.decode.SkipDecoding() for feature in encoded_features} or None
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False, decoders=decoders)
  except (FileNotFoundError, NotImplementedError, AssertionError) as err:
    builder = tfds.builder(name, data_dir=data_dir)
    root = os.path.dirname(os.path.dirname(builder.data_dir))
    hint = _TFDS_BUILD_HINTS.get(name, f"run `tfds build {name} --file_format=array_record "
                                       "--data_dir={data_dir}`").format(data_dir=root)
    if builder.is_prepared():
      raise FileNotFoundError(
          f"TFDS dataset {name!r} is prepared in {builder.data_dir} but not as array_record "
          f"files, which random access without TensorFlow needs ({err}). Rebuild it: {hint}."
      ) from err
    raise FileNotFoundError(
        f"TFDS dataset {name!r} is not prepared in data_dir={root!r} (searched "
        f"{builder.data_dir}). lbjax never downloads data; to prepare it, {hint}. Or pass the "
        "data_dir that holds it (or set TFDS_DATA_DIR).") from err


def _check_num_threads(num_threads: Any) -> int:
  if num_threads is None:
    return default_num_threads()
  if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral):
    raise TypeError(f"num_threads must be a positive integer or None, got {num_threads!r}.")
  if num_threads < 1:
    raise ValueError(f"num_threads must be >= 1, got {num_threads}.")
  return int(num_threads)


def _map_threaded(fn: Callable[[Any], Any], items: Sequence[Any], num_threads: int) -> list[Any]:
  """`[fn(x) for x in items]`, on up to `num_threads` threads, results in order."""
  if num_threads <= 1 or len(items) <= 1:
    return [fn(item) for item in items]
  with concurrent.futures.ThreadPoolExecutor(min(num_threads, len(items))) as pool:
    return list(pool.map(fn, items))


def _stack_or_objects(values: list[Any]) -> np.ndarray:
  """One stacked array, or a 1-D object array when shapes differ or the values are bytes."""
  if values and not any(isinstance(value, bytes) for value in values):
    arrays = [np.asarray(value) for value in values]
    if len({(a.shape, a.dtype) for a in arrays}) <= 1:
      return np.stack(arrays)
  objects = np.empty(len(values), dtype=object)
  objects[:] = [value if isinstance(value, bytes) else np.asarray(value) for value in values]
  return objects


def _check_seed(seed: Any) -> int:
  """Returns `seed` as an int; raises unless it is a non-negative integer."""
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
  return int(seed)


def _check_image_size(image_size: Any) -> int:
  if isinstance(image_size, bool) or not isinstance(image_size, numbers.Integral):
    raise TypeError(f"image_size must be a positive integer, got {image_size!r}.")
  if image_size < 1:
    raise ValueError(f"image_size must be >= 1, got {image_size}.")
  return int(image_size)


def _check_range(name: str, value: Sequence[float], low: float, high: float) -> tuple[float, float]:
  if len(value) != 2 or not low <= value[0] <= value[1] <= high:
    raise ValueError(
        f"{name} must be a pair (min, max) with {low} <= min <= max <= {high}, got {value!r}.")
  return float(value[0]), float(value[1])


def as_rgb(image: np.ndarray) -> np.ndarray:
  """Returns `image` as uint8 [H, W, 3]; grayscale ([H, W] or [H, W, 1]) is repeated to RGB."""
  image = np.asarray(image)
  if image.ndim == 2:
    image = image[:, :, None]
  if image.ndim != 3 or image.shape[-1] not in (1, 3) or image.shape[0] < 1 or image.shape[1] < 1:
    raise ValueError(
        f"expected an image of shape [H, W, 3] (or grayscale [H, W] / [H, W, 1]), got shape "
        f"{image.shape}.")
  if image.dtype != np.uint8:
    raise ValueError(f"expected a uint8 image with values in [0, 255], got dtype {image.dtype}.")
  if image.shape[-1] == 1:
    image = np.repeat(image, 3, axis=-1)
  return image


def center_crop_box(height: int, width: int, crop_fraction: float) -> CropBox:
  """Central square crop whose side is `crop_fraction` of the shorter image side (at least 1)."""
  if not 0 < crop_fraction <= 1:
    raise ValueError(f"crop_fraction must lie in (0, 1], got {crop_fraction}.")
  side = max(1, int(round(min(height, width) * crop_fraction)))
  return CropBox((height - side) // 2, (width - side) // 2, side, side)


def sample_crop_box(rng: np.random.Generator, height: int, width: int, *,
                    area_range: tuple[float, float] = DEFAULT_AREA_RANGE,
                    aspect_ratio_range: tuple[float, float] = DEFAULT_ASPECT_RATIO_RANGE,
                    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                    fallback_crop_fraction: float = 1 / EVAL_RESIZE_RATIO) -> CropBox:
  """Samples an Inception-style crop window (Szegedy et al. 2015; the ResNet reference pipeline).

  Each attempt draws a target area `a ~ U(area_range) * H * W` and an aspect ratio `r` (width /
  height) log-uniformly from `aspect_ratio_range`, sets `h = round(sqrt(a / r))`,
  `w = round(sqrt(a * r))`, and accepts the window if it fits (`h <= H`, `w <= W`), placing it
  uniformly at random. If all `max_attempts` attempts fail (e.g. very elongated images), it falls
  back to the central square crop of `fallback_crop_fraction` (224/256) of the shorter side, the
  evaluation crop, as the TF reference pipeline does.

  Args:
    rng: numpy generator; the result depends only on its state.
    height: image height H.
    width: image width W.
    area_range: bounds of the crop area as a fraction of the image area.
    aspect_ratio_range: bounds of the crop's width / height.
    max_attempts: number of draws before the fallback.
    fallback_crop_fraction: side of the fallback crop as a fraction of the shorter image side.

  Returns:
    The `CropBox`, always inside the image and at least 1x1.
  """
  if height < 1 or width < 1:
    raise ValueError(f"image height and width must be >= 1, got {height}x{width}.")
  min_area, max_area = _check_range("area_range", area_range, 0.0, 1.0)
  if min_area <= 0:
    raise ValueError(f"area_range min must be > 0, got {area_range!r}.")
  min_ratio, max_ratio = _check_range("aspect_ratio_range", aspect_ratio_range, 0.0, math.inf)
  if min_ratio <= 0:
    raise ValueError(f"aspect_ratio_range min must be > 0, got {aspect_ratio_range!r}.")
  if max_attempts < 0:
    raise ValueError(f"max_attempts must be >= 0, got {max_attempts}.")
  image_area = height * width
  log_ratio_range = (math.log(min_ratio), math.log(max_ratio))
  for _ in range(max_attempts):
    area = image_area * rng.uniform(min_area, max_area)
    ratio = math.exp(rng.uniform(*log_ratio_range))
    crop_width = int(round(math.sqrt(area * ratio)))
    crop_height = int(round(math.sqrt(area / ratio)))
    if 0 < crop_width <= width and 0 < crop_height <= height:
      top = int(rng.integers(0, height - crop_height + 1))
      left = int(rng.integers(0, width - crop_width + 1))
      return CropBox(top, left, crop_height, crop_width)
  return center_crop_box(height, width, fallback_crop_fraction)


def crop_and_resize(image: np.ndarray, box: CropBox | jpeg.Box, size: tuple[int, int],
                    out: np.ndarray | None = None) -> np.ndarray:
  """Crops `box` out of uint8 `image` [H, W, 3] and resizes it to `size` = (height, width).

  `jpeg.resize_window`: one bilinear resampling of the exact window (area averaging when it is at
  least twice the output); returns uint8, written into `out` (C-contiguous) when given.
  """
  return jpeg.resize_window(as_rgb(image), jpeg.Box(*box), size, out)


def random_resized_crop(image: np.ndarray, rng: np.random.Generator, image_size: int, *,
                        area_range: tuple[float, float] = DEFAULT_AREA_RANGE,
                        aspect_ratio_range: tuple[float, float] = DEFAULT_ASPECT_RATIO_RANGE,
                        max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> np.ndarray:
  """Inception-style random crop (`sample_crop_box`) resized to `image_size` x `image_size`.

  Args:
    image: uint8 [H, W, 3] (or grayscale).
    rng: numpy generator for the crop window.
    image_size: side of the output.
    area_range: crop area bounds as a fraction of the image area.
    aspect_ratio_range: crop width / height bounds.
    max_attempts: draws before falling back to the central crop.

  Returns:
    uint8 [image_size, image_size, 3].
  """
  image_size = _check_image_size(image_size)
  image = as_rgb(image)
  box = sample_crop_box(rng, image.shape[0], image.shape[1], area_range=area_range,
                        aspect_ratio_range=aspect_ratio_range, max_attempts=max_attempts)
  return crop_and_resize(image, box, (image_size, image_size))


def random_flip_left_right(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Mirrors `image` [H, W, C] horizontally with probability 1/2."""
  return image[:, ::-1] if rng.random() < 0.5 else image


def center_crop_eval(image: np.ndarray, image_size: int, *,
                     resize_size: int | None = None) -> np.ndarray:
  """Evaluation preprocessing: resize the shorter side to `resize_size`, then central crop.

  Args:
    image: uint8 [H, W, 3] (or grayscale).
    image_size: side of the output crop (224 for ResNet-50).
    resize_size: shorter side after resizing; default `round(image_size * 256 / 224)` (256 for
      224). Must be >= image_size.

  Returns:
    uint8 [image_size, image_size, 3]: rows/columns `[(R - s) // 2, (R - s) // 2 + s)` of the
    resized image, with R its height/width and s = image_size.
  """
  image_size = _check_image_size(image_size)
  if resize_size is None:
    resize_size = int(round(image_size * EVAL_RESIZE_RATIO))
  if resize_size < image_size:
    raise ValueError(f"resize_size ({resize_size}) must be >= image_size ({image_size}).")
  image = as_rgb(image)
  box = jpeg.center_crop_box(image.shape[0], image.shape[1], image_size, resize_size)
  return crop_and_resize(image, box, (image_size, image_size))


def normalize_images(images: np.ndarray, mean: Sequence[float] = IMAGENET_MEAN_RGB,
                     stddev: Sequence[float] = IMAGENET_STDDEV_RGB) -> np.ndarray:
  """Per-channel `(images - mean) / stddev` as float32 on the host; channels last, values on the
  0-255 scale: `Normalization(mean, stddev)`, which the training step applies on the device."""
  images = np.asarray(images)
  if images.ndim < 1 or images.shape[-1] != len(mean) or len(mean) != len(stddev):
    raise ValueError(
        f"normalize_images: images have {images.shape[-1] if images.ndim else 0} channels (shape "
        f"{images.shape}) but mean/stddev have {len(mean)}/{len(stddev)} values.")
  return Normalization(tuple(mean), tuple(stddev))(images)


def _images_of(examples: stream.Batch) -> list[Any]:
  if "image" not in examples or "label" not in examples:
    raise KeyError(f"expected examples with 'image' and 'label', got {sorted(examples)}.")
  return list(examples["image"])


def _labels_of(examples: stream.Batch) -> np.ndarray:
  return np.asarray(examples["label"]).astype(np.int32)


def train_window(height: int, width: int, rng: np.random.Generator) -> tuple[CropBox, bool]:
  """The training crop window (`sample_crop_box` of the image's height and width) and whether to
  flip it (`rng.random() < 0.5`), drawn in this order: encoded bytes (header size only), decoded
  arrays and the DALI path get the same window and flip from the same generator."""
  box = sample_crop_box(rng, height, width)
  return box, bool(rng.random() < 0.5)


def train_crop(image: Any, rng: np.random.Generator, image_size: int,
               out: np.ndarray | None = None) -> np.ndarray:
  """One training example: Inception crop window, resized to `image_size`, flipped with p = 1/2.

  The window and flip come from `train_window`. Encoded bytes are decoded at the smallest DCT
  scale covering the window at the output size (`jpeg.decode_resized_crop`); decoded arrays are
  cropped and resized (`crop_and_resize`).

  Returns:
    uint8 [image_size, image_size, 3], written into `out` (C-contiguous) when given.
  """
  size = (image_size, image_size)
  if isinstance(image, bytes):
    image_header = jpeg.header(image)
    box, flip = train_window(image_header.height, image_header.width, rng)
    return jpeg.decode_resized_crop(image, jpeg.Box(*box), size, flip=flip,
                                    image_header=image_header, out=out)
  image = as_rgb(image)
  box, flip = train_window(image.shape[0], image.shape[1], rng)
  crop = crop_and_resize(image, box, size, out)
  if out is None:
    return crop[:, ::-1] if flip else crop
  return jpeg.codecs()[1].flip(out, 1, dst=out) if flip else out  # In place.


def eval_window(height: int, width: int, image_size: int) -> jpeg.Box:
  """The window of a height x width image that `center_crop_eval` turns into the evaluation crop."""
  resize_size = int(round(image_size * EVAL_RESIZE_RATIO))
  return jpeg.center_crop_box(height, width, image_size, resize_size)


def eval_crop(image: Any, image_size: int, out: np.ndarray | None = None) -> np.ndarray:
  """One evaluation example: `center_crop_eval` of a decoded image, or the same window
  (`eval_window`) of an encoded one decoded at the smallest DCT scale covering the resize step.
  Returns uint8, written into `out` (C-contiguous [image_size, image_size, 3]) when given."""
  if isinstance(image, bytes):
    image_header = jpeg.header(image)
    return jpeg.decode_resized_crop(
        image, eval_window(image_header.height, image_header.width, image_size),
        (image_size, image_size), image_header=image_header, out=out)
  crop = center_crop_eval(image, image_size)
  if out is None:
    return crop
  out[...] = crop
  return out


def _crop_all(crop_fn: Callable[[int, np.ndarray], np.ndarray], count: int, image_size: int,
              num_threads: int) -> np.ndarray:
  """uint8 [count, s, s, 3]: `crop_fn(i, out)` writes example `i` into `out`, its slot of the
  batch."""
  images = np.empty((count, image_size, image_size, 3), np.uint8)

  def fill(i: int) -> None:
    crop_fn(i, images[i])

  _map_threaded(fill, range(count), num_threads)
  return images


def imagenet_train_transform(*, seed: int, image_size: int = 224,
                             num_threads: int | None = None) -> stream.Transform:
  """The training transform: random resized crop, random flip (`train_crop`); uint8 out, the
  step normalises on the device (`IMAGENET_NORMALIZATION`).

  Args:
    seed: the stream's seed; example `k` is augmented with `example_rngs(seed, [k])`.
    image_size: output side.
    num_threads: threads for the per-example decodes and crops; None means
      `default_num_threads()`.

  Returns:
    `transform(examples, positions) -> {"images": uint8 [b, s, s, 3], "labels": int32 [b]}`;
    `examples["image"]` holds decoded uint8 arrays or encoded JPEG bytes.
  """
  seed = _check_seed(seed)
  image_size = _check_image_size(image_size)
  num_threads = _check_num_threads(num_threads)
  jpeg.codecs()
  libturbojpeg.decoder()  # Finds the region decoder (or logs that there is none) once, here.

  def transform(examples: stream.Batch, positions: np.ndarray) -> stream.Batch:
    images = _images_of(examples)
    rngs = stream.example_rngs(seed, positions)
    crops = _crop_all(lambda i, out: train_crop(images[i], rngs[i], image_size, out),
                      len(images), image_size, num_threads)
    return {"images": crops, "labels": _labels_of(examples)}

  return transform


def imagenet_eval_transform(*, image_size: int = 224,
                            num_threads: int | None = None) -> stream.Transform:
  """The evaluation transform: resize shorter side, central crop (deterministic); uint8 out, the
  step normalises on the device (`IMAGENET_NORMALIZATION`)."""
  image_size = _check_image_size(image_size)
  num_threads = _check_num_threads(num_threads)
  jpeg.codecs()
  libturbojpeg.decoder()  # Finds the region decoder (or logs that there is none) once, here.

  def transform(examples: stream.Batch, indices: np.ndarray) -> stream.Batch:
    del indices  # Evaluation preprocessing is deterministic.
    images = _images_of(examples)
    crops = _crop_all(lambda i, out: eval_crop(images[i], image_size, out), len(images),
                      image_size, num_threads)
    return {"images": crops, "labels": _labels_of(examples)}

  return transform


def _dali():
  """`lbjax.data.dali`, imported when first used (it imports this module, and NVIDIA DALI)."""
  from lbjax.data import dali  # pylint: disable=g-import-not-at-top
  return dali


def _check_decoder(decoder: Any, decode: str, num_workers: int) -> str:
  return _dali().check_decoder(decoder, decode, num_workers)


def _check_decode(decode: Any) -> tuple[str, ...]:
  """The TFDS features to read encoded for `decode`."""
  if decode not in DECODE_MODES:
    raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}: 'reduced' decodes "
                     "each JPEG at the DCT scale its crop needs, 'full' lets TFDS decode it in full.")
  return ("image",) if decode == "reduced" else ()


def imagenet_train_stream(*, split: str = "train", data_dir: str | os.PathLike[str] | None = None,
                          image_size: int = 224, seed: int, process_index: int = 0,
                          process_count: int = 1, num_threads: int | None = None,
                          decode: Decode = "reduced", num_workers: int = 0,
                          decoder: Decoder = "cpu") -> stream.TrainStream | workers.WorkerTrainStream:
  """Shuffled, augmented ImageNet training stream (`imagenet2012` from TFDS).

  Args:
    split: TFDS split.
    data_dir: TFDS data folder (None: TFDS default).
    image_size: side of the output crops (224 for ResNet-50; small for CPU smoke runs).
    seed: shuffling and augmentation seed.
    process_index: this process's index.
    process_count: number of processes reading the stream.
    num_threads: decoding/augmentation threads (None: `default_num_threads()`).
    decode: "reduced" (JPEG bytes, decoded at the DCT scale each crop needs) or "full" (TFDS
      decodes each image in full; `tfds.testing.mock_data` without TensorFlow supports only this).
      Both give the same crop windows and flips.
    num_workers: grain worker processes computing batches ahead (`workers.WorkerTrainStream`);
      0 computes them in this process. With workers, `num_threads` defaults to 1 per worker.
    decoder: "cpu" (simplejpeg and OpenCV, the `[imagenet]` extra) or "dali" (`lbjax.data.dali`:
      decode, crop, resize and flip on the GPU with the same windows and flips; needs
      the `[dali]` extra, decode="reduced" and no workers).

  Returns:
    A `TrainStream` (or, with workers, a `WorkerTrainStream`: the same batches and state) whose
    batches are `{"images": uint8 [b, s, s, 3], "labels": int32 [b]}` (normalise them with
    `IMAGENET_NORMALIZATION`).
  """
  encoded = _check_decode(decode)
  num_workers = workers.check_num_workers(num_workers)
  num_threads = 1 if num_workers and num_threads is None else num_threads
  if _check_decoder(decoder, decode, num_workers) == "dali":
    transform = _dali().dali_imagenet_transform(mode="train", image_size=image_size, seed=seed)
  else:
    transform = imagenet_train_transform(seed=seed, image_size=image_size,
                                         num_threads=num_threads)
  source = TfdsSource("imagenet2012", split=split, data_dir=data_dir, num_threads=num_threads,
                      encoded_features=encoded)
  train = stream.TrainStream(source, seed=seed, process_index=process_index,
                             process_count=process_count, transform=transform)
  return workers.WorkerTrainStream(train, num_workers=num_workers) if num_workers else train


def imagenet_eval_batches(global_batch_size: int, *, split: str = "validation",
                          data_dir: str | os.PathLike[str] | None = None, image_size: int = 224,
                          process_index: int = 0, process_count: int = 1,
                          num_threads: int | None = None, decode: Decode = "reduced",
                          num_workers: int = 0, decoder: Decoder = "cpu"):
  """Every ImageNet evaluation example once, preprocessed, in padded batches (`eval_batches`).

  Args:
    global_batch_size: global batch size, divisible by process_count.
    split: TFDS split.
    data_dir: TFDS data folder (None: TFDS default).
    image_size: side of the output crops.
    process_index: this process's index.
    process_count: number of processes.
    num_threads: decoding/preprocessing threads (None: `default_num_threads()`).
    decode: "reduced" or "full", as for `imagenet_train_stream`.
    num_workers: grain worker processes (0: this process), as for `imagenet_train_stream`.
    decoder: "cpu" or "dali", as for `imagenet_train_stream`.

  Returns:
    Iterator of `{"images": uint8 [b, s, s, 3], "labels": int32 [b], "mask": float32 [b]}`.
  """
  encoded = _check_decode(decode)
  num_workers = workers.check_num_workers(num_workers)
  num_threads = 1 if num_workers and num_threads is None else num_threads
  if _check_decoder(decoder, decode, num_workers) == "dali":
    transform = _dali().dali_imagenet_transform(mode="eval", image_size=image_size)
  else:
    transform = imagenet_eval_transform(image_size=image_size, num_threads=num_threads)
  source = TfdsSource("imagenet2012", split=split, data_dir=data_dir, num_threads=num_threads,
                      encoded_features=encoded)
  return workers.worker_eval_batches(source, global_batch_size, num_workers=num_workers,
                                     process_index=process_index, process_count=process_count,
                                     transform=transform)
