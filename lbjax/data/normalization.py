"""Normalisation of uint8 images, applied by the training step on the device.

The image streams (ImageNet, CIFAR-10, MNIST) hand over uint8 batches: a quarter of the bytes of
float32 to copy to the device and no float arithmetic on the host, as big_vision and DALI pipelines
do. A dataset names its normalisation and the task applies it inside the compiled step
(`lbjax.train.tasks`); called on a numpy array, the same object computes the same values on the host.

- `Normalization`: per-channel `(x - mean) / stddev` (ImageNet, CIFAR-10).
- `PixelScale`: `x / divisor` exactly as the host divides, through a 256-entry table (MNIST's
  pixel / 255, the [0, 1] values its LSTM has always read).
"""

from collections.abc import Sequence
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Normalization:
  """Per-channel `(x - mean) / stddev` of uint8 images (channels last, 0-255 scale)."""
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


def normalize_images(images: np.ndarray, mean: Sequence[float], stddev: Sequence[float]) -> np.ndarray:
  """Per-channel `(images - mean) / stddev` as float32 on the host; channels last, values on the
  0-255 scale: `Normalization(mean, stddev)`, which the training step applies on the device."""
  images = np.asarray(images)
  if images.ndim < 1 or images.shape[-1] != len(mean) or len(mean) != len(stddev):
    raise ValueError(
        f"normalize_images: images have {images.shape[-1] if images.ndim else 0} channels (shape "
        f"{images.shape}) but mean/stddev have {len(mean)}/{len(stddev)} values.")
  return Normalization(tuple(mean), tuple(stddev))(images)


@dataclasses.dataclass(frozen=True)
class PixelScale:
  """uint8 pixels as float32 `x / divisor`, bit for bit the host's correctly rounded quotients.

  The step looks each pixel up in a 256-entry table computed on the host instead of dividing on the
  device: XLA turns a division by a constant into a multiplication by its reciprocal, and
  `x * (1 / 255)` is one ulp off `x / 255` for 126 of the 256 pixel values, so an MNIST run would no
  longer give the numbers of the runs that read float32 pixels made on the host. Images of any shape
  (MNIST's [N, 28, 28] has no channel axis).
  """
  divisor: float

  def __post_init__(self):
    if not self.divisor > 0:
      raise ValueError(f"PixelScale divisor must be positive, got {self.divisor!r}.")

  def table(self) -> np.ndarray:
    """float32 [256]: entry v is `float32(v) / float32(divisor)`."""
    return np.arange(256, dtype=np.float32) / np.float32(self.divisor)

  def __call__(self, images):
    """float32 `images / divisor` of uint8 `images`, a numpy or a jax array (in a jitted step: on the
    device, a gather from the table)."""
    if images.dtype != np.uint8:
      raise ValueError(f"PixelScale takes uint8 pixels (0-255), got {images.dtype} images.")
    array_namespace = images.__array_namespace__()
    return array_namespace.asarray(self.table())[images]
