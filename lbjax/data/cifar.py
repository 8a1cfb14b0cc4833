"""CIFAR-10 (TFDS `cifar10`) with the standard ResNet augmentation, numpy only.

Training: zero-pad each 32x32 image by 4 pixels, take a random 32x32 crop and flip it horizontally
with probability 1/2 (He et al. 2016, Sec. 4.2); evaluation: the image unchanged. Both give uint8
NHWC images and int32 labels; the training step normalises them on the device by the CIFAR-10
training-set mean and standard deviation (`CIFAR10_NORMALIZATION`, as ImageNet's, see
`lbjax.data.normalization`). The whole batch is cropped and flipped with one gather; randomness
comes from `example_rngs(seed, stream position)`, so a batch is the same for any number of
processes and after a resume.
"""

import os

import numpy as np

from lbjax.data import stream
from lbjax.data import workers
from lbjax.data.normalization import Normalization
from lbjax.data.tfds_source import TfdsSource

# Per-channel statistics of the CIFAR-10 training images, RGB on the 0-255 scale.
CIFAR10_MEAN_RGB = (0.4914 * 255, 0.4822 * 255, 0.4465 * 255)
CIFAR10_STDDEV_RGB = (0.2470 * 255, 0.2435 * 255, 0.2616 * 255)
CIFAR10_NORMALIZATION = Normalization(CIFAR10_MEAN_RGB, CIFAR10_STDDEV_RGB)

DEFAULT_PADDING = 4


def sample_crop_offsets_and_flips(rngs: list[np.random.Generator],
                                  padding: int = DEFAULT_PADDING) -> tuple[np.ndarray, np.ndarray]:
  """Draws, per example, a crop offset in the padded image and whether to flip.

  Args:
    rngs: one generator per example (from `example_rngs`).
    padding: pixels of zero padding on each side; offsets lie in [0, 2 * padding].

  Returns:
    `offsets` int64 [b, 2] (row, column) and `flips` bool [b].
  """
  offsets = np.zeros((len(rngs), 2), np.int64)
  flips = np.zeros(len(rngs), bool)
  for i, rng in enumerate(rngs):
    offsets[i] = rng.integers(0, 2 * padding + 1, size=2)
    flips[i] = rng.random() < 0.5
  return offsets, flips


def pad_crop_flip(images: np.ndarray, offsets: np.ndarray, flips: np.ndarray, *,
                  padding: int = DEFAULT_PADDING) -> np.ndarray:
  """Zero-pads a batch, crops each image at its offset to the original size, flips where asked.

  Output pixel `[i, r, c]` is `padded[i, offsets[i, 0] + r, offsets[i, 1] + c']` with
  `c' = W - 1 - c` if `flips[i]` else `c`, where `padded` has `padding` zeros on each side.

  Args:
    images: [b, H, W, C] batch.
    offsets: int [b, 2] row/column offsets in [0, 2 * padding].
    flips: bool [b].
    padding: zero padding on each side.

  Returns:
    [b, H, W, C] with the dtype of `images`.
  """
  images = np.asarray(images)
  offsets = np.asarray(offsets)
  flips = np.asarray(flips, bool)
  if images.ndim != 4:
    raise ValueError(f"images must be a batch [b, H, W, C], got shape {images.shape}.")
  batch, height, width, _ = images.shape
  if padding < 0:
    raise ValueError(f"padding must be >= 0, got {padding}.")
  if offsets.shape != (batch, 2) or flips.shape != (batch,):
    raise ValueError(
        f"expected offsets of shape {(batch, 2)} and flips of shape {(batch,)}, got "
        f"{offsets.shape} and {flips.shape}.")
  if offsets.size and (offsets.min() < 0 or offsets.max() > 2 * padding):
    raise ValueError(f"offsets must lie in [0, {2 * padding}], got range "
                     f"[{offsets.min()}, {offsets.max()}].")
  padded = np.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  out = np.empty_like(images)
  for i, ((top, left), flip) in enumerate(zip(offsets, flips)):  # slices: 3-4x a fancy-index gather
    crop = padded[i, top:top + height, left:left + width]
    out[i] = crop[:, ::-1] if flip else crop
  return out


def _stacked_images(examples: stream.Batch) -> np.ndarray:
  if "image" not in examples or "label" not in examples:
    raise KeyError(f"expected examples with 'image' and 'label', got {sorted(examples)}.")
  images = examples["image"]
  if images.dtype == object:
    images = np.stack(list(images))
  if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8:
    raise ValueError(
        f"expected uint8 CIFAR images [b, 32, 32, 3], got {images.dtype} {images.shape}.")
  return images


def cifar10_train_transform(*, seed: int, padding: int = DEFAULT_PADDING) -> stream.Transform:
  """The training transform: pad, random crop, random flip; uint8 out (`CIFAR10_NORMALIZATION` on
  the device).

  Args:
    seed: the stream's seed; example `k` is augmented with `example_rngs(seed, [k])`.
    padding: zero padding on each side before the random crop.

  Returns:
    `transform(examples, positions) -> {"images": uint8 [b, 32, 32, 3], "labels": int32 [b]}`.
  """
  stream.check_seed(seed)
  if padding < 0:
    raise ValueError(f"padding must be >= 0, got {padding}.")

  def transform(examples: stream.Batch, positions: np.ndarray) -> stream.Batch:
    images = _stacked_images(examples)
    offsets, flips = sample_crop_offsets_and_flips(stream.example_rngs(seed, positions), padding)
    return {
        "images": pad_crop_flip(images, offsets, flips, padding=padding),
        "labels": np.asarray(examples["label"]).astype(np.int32),
    }

  return transform


def cifar10_eval_transform() -> stream.Transform:
  """The evaluation transform: the images as they are, uint8 (`CIFAR10_NORMALIZATION` on the
  device)."""

  def transform(examples: stream.Batch, indices: np.ndarray) -> stream.Batch:
    del indices  # Evaluation preprocessing is deterministic.
    return {
        "images": _stacked_images(examples),
        "labels": np.asarray(examples["label"]).astype(np.int32),
    }

  return transform


def cifar10_train_stream(*, split: str = "train", data_dir: str | os.PathLike[str] | None = None,
                         seed: int, process_index: int = 0, process_count: int = 1,
                         num_threads: int | None = None, num_workers: int = 0,
                         skip_undecodable: bool = False) -> stream.TrainStream | workers.WorkerTrainStream:
  """Shuffled, augmented CIFAR-10 training stream (`cifar10` from TFDS).

  Args:
    split: TFDS split.
    data_dir: TFDS data folder (None: TFDS default).
    seed: shuffling and augmentation seed.
    process_index: this process's index.
    process_count: number of processes reading the stream.
    num_threads: decoding threads (None: `threads.default_num_threads()`; 1 with workers).
    num_workers: grain worker processes computing batches ahead (`workers.WorkerTrainStream`);
      0 computes them in this process.
    skip_undecodable: read the next record in place of one TFDS cannot decode (`stream.TrainStream`).

  Returns:
    A `TrainStream` (or, with workers, a `WorkerTrainStream`: the same batches and state) whose
    batches are `{"images": uint8 [b, 32, 32, 3], "labels": int32 [b]}` (normalise them with
    `CIFAR10_NORMALIZATION`).
  """
  num_workers = workers.check_num_workers(num_workers)
  num_threads = 1 if num_workers and num_threads is None else num_threads
  transform = cifar10_train_transform(seed=seed)
  source = TfdsSource("cifar10", split=split, data_dir=data_dir, num_threads=num_threads)
  train = stream.TrainStream(source, seed=seed, process_index=process_index,
                             process_count=process_count, transform=transform,
                             skip_undecodable=skip_undecodable)
  return workers.WorkerTrainStream(train, num_workers=num_workers) if num_workers else train


def cifar10_eval_batches(global_batch_size: int, *, split: str = "test",
                         data_dir: str | os.PathLike[str] | None = None, process_index: int = 0,
                         process_count: int = 1, num_threads: int | None = None,
                         num_workers: int = 0, skip_undecodable: bool = False):
  """Every CIFAR-10 test example once, in padded batches (`eval_batches`).

  Args:
    global_batch_size: global batch size, divisible by process_count.
    split: TFDS split.
    data_dir: TFDS data folder (None: TFDS default).
    process_index: this process's index.
    process_count: number of processes.
    num_threads: decoding threads (None: `threads.default_num_threads()`; 1 with workers).
    num_workers: grain worker processes (0: this process).
    skip_undecodable: mask out (`mask` 0) an example TFDS cannot decode.

  Returns:
    Iterator of `{"images": uint8 [b, 32, 32, 3], "labels": int32 [b], "mask": float32 [b]}`.
  """
  num_workers = workers.check_num_workers(num_workers)
  num_threads = 1 if num_workers and num_threads is None else num_threads
  source = TfdsSource("cifar10", split=split, data_dir=data_dir, num_threads=num_threads)
  return workers.worker_eval_batches(source, global_batch_size, num_workers=num_workers,
                                     process_index=process_index, process_count=process_count,
                                     transform=cifar10_eval_transform(), skip_undecodable=skip_undecodable)
