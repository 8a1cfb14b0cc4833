"""ImageNet JPEG decoding and augmentation on the GPU with NVIDIA DALI (the optional `[dali]` extra).

`dali_imagenet_transform` is a drop-in for `imagenet_train_transform` / `imagenet_eval_transform`
(same signature, same uint8 output) whose pixels are decoded, cropped, resized and flipped
by a DALI pipeline on the GPU (nvJPEG; region-of-interest decoding, so only the blocks of the
crop window are decoded):

    jpegs, windows, flips  --(host: drawn here)-->  fn.decoders.image_slice (device="mixed")
        -> fn.resize (bilinear, antialiased, to image_size)
        -> fn.crop_mirror_normalize (flip, uint8 HWC; the step normalises on the device)

The crop windows and flips are not drawn by DALI's own random operators: they are drawn on the
host by `imagenet.train_window` from the JPEG header's size and `example_rngs(seed, position)`,
the very windows and flips of the CPU path. So the augmentation distribution is the paper recipe's
(area (0.08, 1), aspect ratio (3/4, 4/3) log-uniform, the central-crop fallback, flip p = 1/2),
a batch is deterministic per stream position, and a resumed or re-sharded run gets the same
windows. Evaluation uses `imagenet.eval_window` (resize the shorter side to 256/224 of the output,
central crop). Pixel values differ from the CPU path by the resampling differences of nvJPEG's
decoder and DALI's resize.

The batch is copied back to host memory as numpy (`TensorListGPU.as_cpu()`), because the trainer
assembles its global batch from host-local arrays (`jax.make_array_from_process_local_data`); the
decoding work leaves the CPU, the host-to-device copy of the float32 batch stays.

References:
  NVIDIA DALI documentation, `fn.decoders.image_slice`, `fn.resize`, `fn.crop_mirror_normalize`.
"""

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from lbjax.data import imagenet
from lbjax.data import jpeg
from lbjax.data import stream

Mode = Literal["train", "eval"]


def _dali():
  try:
    from nvidia import dali  # pylint: disable=g-import-not-at-top
    from nvidia.dali import fn  # pylint: disable=g-import-not-at-top
    from nvidia.dali import types  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError(
        "decoder='dali' needs NVIDIA DALI and a CUDA GPU: pip install 'lbjax[dali]' (DALI for "
        "CUDA 12), or use decoder='cpu'.") from err
  return dali, fn, types


def windows_and_flips(images: Sequence[bytes], positions: np.ndarray, *, seed: int,
                      image_size: int, mode: Mode) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The host half of the DALI path: each example's crop window and flip.

  Args:
    images: encoded JPEG bytes, one per example.
    positions: their stream positions (train) or dataset indices (eval).
    seed: the stream's seed (train).
    image_size: output side.
    mode: "train" (`imagenet.train_window` with `example_rngs(seed, positions)`) or "eval"
      (`imagenet.eval_window`, never flipped).

  Returns:
    `anchors` float32 [b, 2] (x, y) = (left, top), `shapes` float32 [b, 2] (width, height) in
    original pixels, and `flips` int32 [b] (1 = mirror), as `fn.decoders.image_slice` (axis names
    "WH", absolute coordinates) and `fn.crop_mirror_normalize` take them.
  """
  count = len(images)
  anchors = np.zeros((count, 2), np.float32)
  shapes = np.zeros((count, 2), np.float32)
  flips = np.zeros(count, np.int32)
  rngs = stream.example_rngs(seed, positions) if mode == "train" else None
  for i, image in enumerate(images):
    if not isinstance(image, bytes):
      raise TypeError(f"the DALI path decodes JPEG bytes; example {i} is a {type(image).__name__}. "
                      "Read the dataset with decode='reduced'.")
    height, width = jpeg.image_size(image)
    if mode == "train":
      box, flip = imagenet.train_window(height, width, rngs[i])
      flips[i] = flip
    else:
      box = imagenet.eval_window(height, width, image_size)
    anchors[i] = box.left, box.top
    shapes[i] = box.width, box.height
  return anchors, shapes, flips


class _Pipeline:
  """A built DALI pipeline fed per batch through external sources (rebuilt for larger batches)."""

  def __init__(self, image_size: int, max_batch_size: int, device_id: int, num_threads: int):
    dali, fn, types = _dali()

    @dali.pipeline_def(batch_size=max_batch_size, num_threads=num_threads, device_id=device_id)
    def pipeline():
      jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
      anchors = fn.external_source(name="anchors", dtype=types.FLOAT)
      shapes = fn.external_source(name="shapes", dtype=types.FLOAT)
      flips = fn.external_source(name="flips", dtype=types.INT32)
      images = fn.decoders.image_slice(jpegs, anchors, shapes, device="mixed",
                                       normalized_anchor=False, normalized_shape=False,
                                       output_type=types.RGB)
      images = fn.resize(images, resize_x=image_size, resize_y=image_size,
                         interp_type=types.INTERP_LINEAR, antialias=True)
      return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC",
                                      mirror=flips)  # mean 0, std 1: the step normalises

    self.max_batch_size = max_batch_size
    self._pipeline = pipeline()
    self._pipeline.build()

  def run(self, images: Sequence[bytes], anchors: np.ndarray, shapes: np.ndarray,
          flips: np.ndarray) -> np.ndarray:
    self._pipeline.feed_input("jpegs", [np.frombuffer(image, np.uint8) for image in images])
    self._pipeline.feed_input("anchors", list(anchors))
    self._pipeline.feed_input("shapes", list(shapes))
    self._pipeline.feed_input("flips", [np.array(flip, np.int32) for flip in flips])
    (output,) = self._pipeline.run()
    return np.asarray(output.as_cpu().as_array(), np.uint8)


def dali_imagenet_transform(*, mode: Mode, image_size: int = 224, seed: int = 0,
                            device_id: int = 0, num_threads: int = 2) -> stream.Transform:
  """`imagenet_train_transform` (mode="train") or `imagenet_eval_transform` (mode="eval") on DALI.

  Args:
    mode: "train" or "eval".
    image_size: output side.
    seed: the stream's seed (train): example `k` uses `example_rngs(seed, [k])`.
    device_id: the CUDA device DALI decodes on (this process's local GPU).
    num_threads: DALI's host threads (parsing, the host half of nvJPEG).

  Returns:
    `transform(examples, positions) -> {"images": uint8 [b, s, s, 3], "labels": int32 [b]}`
    for examples whose "image" entries are JPEG bytes. The pipeline is built on the first call.
  """
  if mode not in ("train", "eval"):
    raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}.")
  image_size = imagenet._check_image_size(image_size)  # pylint: disable=protected-access
  seed = imagenet._check_seed(seed)  # pylint: disable=protected-access
  _dali()
  pipelines: list[_Pipeline] = []

  def transform(examples: stream.Batch, positions: np.ndarray) -> stream.Batch:
    if "image" not in examples or "label" not in examples:
      raise KeyError(f"expected examples with 'image' and 'label', got {sorted(examples)}.")
    images = list(examples["image"])
    anchors, shapes, flips = windows_and_flips(images, positions, seed=seed,
                                               image_size=image_size, mode=mode)
    if not pipelines or pipelines[0].max_batch_size < len(images):
      pipelines[:] = [_Pipeline(image_size, len(images), device_id, num_threads)]
    return {"images": pipelines[0].run(images, anchors, shapes, flips),
            "labels": np.asarray(examples["label"]).astype(np.int32)}

  return transform


def check_decoder(decoder: Any, decode: str, num_workers: int) -> str:
  """`decoder` ("cpu" or "dali"), refusing combinations that cannot work before any data is read."""
  if decoder not in ("cpu", "dali"):
    raise ValueError(f"decoder must be 'cpu' or 'dali', got {decoder!r}.")
  if decoder == "dali":
    if decode != "reduced":
      raise ValueError("decoder='dali' decodes the JPEG bytes on the GPU; it needs "
                       f"decode='reduced' (JPEG bytes from TFDS), got decode={decode!r}.")
    if num_workers:
      raise ValueError("decoder='dali' runs its GPU pipeline in the training process; set "
                       f"num_workers=0 (got {num_workers}).")
    _dali()
  return decoder
