"""ImageNet (TFDS `imagenet2012`) with the standard ResNet-50 preprocessing, on the CPU: transforms and streams.

Training: an Inception-style random resized crop to `image_size` x `image_size` and a random
horizontal flip; evaluation: the central crop after resizing the shorter side to
`image_size * 256 / 224`. The windows and flips are drawn in `lbjax.data.crops` from each image's
height and width and `example_rngs(seed, stream position)`, so a batch is the same for any number of
processes, worker processes and after a resume. The transforms give uint8 NHWC images and int32
labels; the training step normalises them on the device (`IMAGENET_NORMALIZATION`,
`lbjax.data.normalization`).

Examples come from `TfdsSource` (`lbjax.data.tfds_source`). With `decode="reduced"` (the default)
it hands over each image's JPEG bytes and the transforms decode only what the output needs
(`lbjax.data.jpeg`: the DCT scale covering the window, only the window's region where libjpeg-turbo's
TurboJPEG 3 API is found); with `decode="full"` TFDS decodes every image in full with Pillow and the
transforms crop and resize the arrays. Both resample with `jpeg.resize_window`, so at DCT scale 1
they give the same pixels. A record that cannot be decoded stops the stream with its dataset, split
and index, or is skipped with `skip_undecodable=True` (`lbjax.data.stream`).

simplejpeg and OpenCV are the `[imagenet]` extra (the transforms refuse to be built without them,
saying what to install), TFDS and Pillow the `[tfds]` extra; all are imported when first needed.
"""

from collections.abc import Callable
import os
from typing import Any, Literal

import numpy as np

from lbjax.data import crops
from lbjax.data import jpeg
from lbjax.data import libturbojpeg
from lbjax.data import stream
from lbjax.data import threads
from lbjax.data import workers
from lbjax.data.normalization import Normalization
from lbjax.data.tfds_source import TfdsSource

IMAGENET_MEAN_RGB = (123.675, 116.28, 103.53)
IMAGENET_STDDEV_RGB = (58.395, 57.12, 57.375)
IMAGENET_NORMALIZATION = Normalization(IMAGENET_MEAN_RGB, IMAGENET_STDDEV_RGB)

Decode = Literal["reduced", "full"]
DECODE_MODES = ("reduced", "full")


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


def crop_and_resize(image: np.ndarray, box: crops.Box, size: tuple[int, int],
                    out: np.ndarray | None = None) -> np.ndarray:
  """Crops `box` out of uint8 `image` [H, W, 3] and resizes it to `size` = (height, width).

  `jpeg.resize_window`: one bilinear resampling of the exact window (area averaging when it is at
  least twice the output); returns uint8, written into `out` (C-contiguous) when given.
  """
  return jpeg.resize_window(as_rgb(image), crops.Box(*box), size, out)


def random_resized_crop(image: np.ndarray, rng: np.random.Generator, image_size: int, *,
                        area_range: tuple[float, float] = crops.DEFAULT_AREA_RANGE,
                        aspect_ratio_range: tuple[float, float] = crops.DEFAULT_ASPECT_RATIO_RANGE,
                        max_attempts: int = crops.DEFAULT_MAX_ATTEMPTS) -> np.ndarray:
  """Inception-style random crop (`crops.sample_crop_box`) resized to `image_size` x `image_size`.

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
  image_size = crops.check_image_size(image_size)
  image = as_rgb(image)
  box = crops.sample_crop_box(rng, image.shape[0], image.shape[1], area_range=area_range,
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
  image_size = crops.check_image_size(image_size)
  image = as_rgb(image)
  box = crops.eval_window(image.shape[0], image.shape[1], image_size, resize_size)
  return crop_and_resize(image, box, (image_size, image_size))


def _images_of(examples: stream.Batch) -> list[Any]:
  if "image" not in examples or "label" not in examples:
    raise KeyError(f"expected examples with 'image' and 'label', got {sorted(examples)}.")
  return list(examples["image"])


def _labels_of(examples: stream.Batch) -> np.ndarray:
  return np.asarray(examples["label"]).astype(np.int32)


def train_crop(image: Any, rng: np.random.Generator, image_size: int,
               out: np.ndarray | None = None) -> np.ndarray:
  """One training example: Inception crop window, resized to `image_size`, flipped with p = 1/2.

  The window and flip come from `crops.train_window`. Encoded bytes are decoded at the smallest DCT
  scale covering the window at the output size (`jpeg.decode_resized_crop`); decoded arrays are
  cropped and resized (`crop_and_resize`).

  Returns:
    uint8 [image_size, image_size, 3], written into `out` (C-contiguous) when given.

  Raises:
    jpeg.DecodeError: encoded bytes that cannot be decoded.
  """
  size = (image_size, image_size)
  if isinstance(image, bytes):
    image_header = jpeg.header(image)
    box, flip = crops.train_window(image_header.height, image_header.width, rng)
    return jpeg.decode_resized_crop(image, box, size, flip=flip, image_header=image_header, out=out)
  image = as_rgb(image)
  box, flip = crops.train_window(image.shape[0], image.shape[1], rng)
  crop = crop_and_resize(image, box, size, out)
  if out is None:
    return crop[:, ::-1] if flip else crop
  return jpeg.codecs()[1].flip(out, 1, dst=out) if flip else out  # In place.


def eval_crop(image: Any, image_size: int, out: np.ndarray | None = None) -> np.ndarray:
  """One evaluation example: `center_crop_eval` of a decoded image, or the same window
  (`crops.eval_window`) of an encoded one decoded at the smallest DCT scale covering the resize step.
  Returns uint8, written into `out` (C-contiguous [image_size, image_size, 3]) when given."""
  if isinstance(image, bytes):
    image_header = jpeg.header(image)
    return jpeg.decode_resized_crop(
        image, crops.eval_window(image_header.height, image_header.width, image_size),
        (image_size, image_size), image_header=image_header, out=out)
  crop = center_crop_eval(image, image_size)
  if out is None:
    return crop
  out[...] = crop
  return out


def _crop_all(crop_fn: Callable[[int, np.ndarray], np.ndarray], count: int, image_size: int,
              num_threads: int) -> np.ndarray:
  """uint8 [count, s, s, 3]: `crop_fn(i, out)` writes example `i` into `out`, its slot of the
  batch. Examples whose bytes cannot be decoded raise `stream.UndecodableExample`, all at once."""
  images = np.empty((count, image_size, image_size, 3), np.uint8)

  def fill(i: int) -> str | None:
    try:
      crop_fn(i, images[i])
    except jpeg.DecodeError as err:
      return str(err)
    return None

  failed = {i: reason for i, reason in enumerate(threads.map_threaded(fill, range(count), num_threads)) if reason}
  if failed:
    raise stream.UndecodableExample(failed)
  return images


def _check_codecs() -> None:
  """Refuses to build a transform without simplejpeg and OpenCV; finds the region decoder (or logs
  that there is none) once, here."""
  jpeg.codecs()
  libturbojpeg.decoder()


def imagenet_train_transform(*, seed: int, image_size: int = 224,
                             num_threads: int | None = None) -> stream.Transform:
  """The training transform: random resized crop, random flip (`train_crop`); uint8 out, the
  step normalises on the device (`IMAGENET_NORMALIZATION`).

  Args:
    seed: the stream's seed; example `k` is augmented with `example_rngs(seed, [k])`.
    image_size: output side.
    num_threads: threads for the per-example decodes and crops; None means
      `threads.default_num_threads()`.

  Returns:
    `transform(examples, positions) -> {"images": uint8 [b, s, s, 3], "labels": int32 [b]}`;
    `examples["image"]` holds decoded uint8 arrays or encoded JPEG bytes.
  """
  seed = stream.check_seed(seed)
  image_size = crops.check_image_size(image_size)
  num_threads = threads.check_num_threads(num_threads)
  _check_codecs()

  def transform(examples: stream.Batch, positions: np.ndarray) -> stream.Batch:
    images = _images_of(examples)
    rngs = stream.example_rngs(seed, positions)
    batch_images = _crop_all(lambda i, out: train_crop(images[i], rngs[i], image_size, out),
                       len(images), image_size, num_threads)
    return {"images": batch_images, "labels": _labels_of(examples)}

  return transform


def imagenet_eval_transform(*, image_size: int = 224,
                            num_threads: int | None = None) -> stream.Transform:
  """The evaluation transform: resize shorter side, central crop (deterministic); uint8 out, the
  step normalises on the device (`IMAGENET_NORMALIZATION`)."""
  image_size = crops.check_image_size(image_size)
  num_threads = threads.check_num_threads(num_threads)
  _check_codecs()

  def transform(examples: stream.Batch, indices: np.ndarray) -> stream.Batch:
    del indices  # Evaluation preprocessing is deterministic.
    images = _images_of(examples)
    batch_images = _crop_all(lambda i, out: eval_crop(images[i], image_size, out), len(images),
                       image_size, num_threads)
    return {"images": batch_images, "labels": _labels_of(examples)}

  return transform


def _source(split: str, data_dir: str | os.PathLike[str] | None, decode: Any,
            num_threads: int | None) -> TfdsSource:
  """The `imagenet2012` split, with the images as JPEG bytes (`decode="reduced"`) or decoded arrays."""
  if decode not in DECODE_MODES:
    raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}: 'reduced' decodes "
                     "each JPEG at the DCT scale its crop needs, 'full' lets TFDS decode it in full.")
  return TfdsSource("imagenet2012", split=split, data_dir=data_dir, num_threads=num_threads,
                    encoded_features=("image",) if decode == "reduced" else ())


def imagenet_train_stream(*, split: str = "train", data_dir: str | os.PathLike[str] | None = None,
                          image_size: int = 224, seed: int, process_index: int = 0,
                          process_count: int = 1, num_threads: int | None = None,
                          decode: Decode = "reduced", num_workers: int = 0,
                          skip_undecodable: bool = False) -> stream.TrainStream | workers.WorkerTrainStream:
  """Shuffled, augmented ImageNet training stream (`imagenet2012` from TFDS).

  Args:
    split: TFDS split.
    data_dir: TFDS data folder (None: TFDS default).
    image_size: side of the output crops (224 for ResNet-50; small for CPU smoke runs).
    seed: shuffling and augmentation seed.
    process_index: this process's index.
    process_count: number of processes reading the stream.
    num_threads: decoding/augmentation threads (None: `threads.default_num_threads()`).
    decode: "reduced" (JPEG bytes, decoded at the DCT scale each crop needs) or "full" (TFDS
      decodes each image in full; `tfds.testing.mock_data` without TensorFlow supports only this).
      Both give the same crop windows and flips.
    num_workers: grain worker processes computing batches ahead (`workers.WorkerTrainStream`);
      0 computes them in this process. With workers, `num_threads` defaults to 1 per worker.
    skip_undecodable: read the next record in place of one that cannot be decoded, instead of
      raising `stream.UndecodableRecordError` (`stream.TrainStream`).

  Returns:
    A `TrainStream` (or, with workers, a `WorkerTrainStream`: the same batches and state) whose
    batches are `{"images": uint8 [b, s, s, 3], "labels": int32 [b]}` (normalise them with
    `IMAGENET_NORMALIZATION`).
  """
  num_workers = workers.check_num_workers(num_workers)
  num_threads = 1 if num_workers and num_threads is None else num_threads
  transform = imagenet_train_transform(seed=seed, image_size=image_size, num_threads=num_threads)
  train = stream.TrainStream(_source(split, data_dir, decode, num_threads), seed=seed,
                             process_index=process_index, process_count=process_count,
                             transform=transform, skip_undecodable=skip_undecodable)
  return workers.WorkerTrainStream(train, num_workers=num_workers) if num_workers else train


def imagenet_eval_batches(global_batch_size: int, *, split: str = "validation",
                          data_dir: str | os.PathLike[str] | None = None, image_size: int = 224,
                          process_index: int = 0, process_count: int = 1,
                          num_threads: int | None = None, decode: Decode = "reduced",
                          num_workers: int = 0, skip_undecodable: bool = False):
  """Every ImageNet evaluation example once, preprocessed, in padded batches (`eval_batches`).

  Args:
    global_batch_size: global batch size, divisible by process_count.
    split: TFDS split.
    data_dir: TFDS data folder (None: TFDS default).
    image_size: side of the output crops.
    process_index: this process's index.
    process_count: number of processes.
    num_threads: decoding/preprocessing threads (None: `threads.default_num_threads()`).
    decode: "reduced" or "full", as for `imagenet_train_stream`.
    num_workers: grain worker processes (0: this process), as for `imagenet_train_stream`.
    skip_undecodable: mask out (`mask` 0) an example whose record cannot be decoded instead of
      raising `stream.UndecodableRecordError`.

  Returns:
    Iterator of `{"images": uint8 [b, s, s, 3], "labels": int32 [b], "mask": float32 [b]}`.
  """
  num_workers = workers.check_num_workers(num_workers)
  num_threads = 1 if num_workers and num_threads is None else num_threads
  transform = imagenet_eval_transform(image_size=image_size, num_threads=num_threads)
  return workers.worker_eval_batches(_source(split, data_dir, decode, num_threads), global_batch_size,
                                     num_workers=num_workers, process_index=process_index,
                                     process_count=process_count, transform=transform,
                                     skip_undecodable=skip_undecodable)
