"""Normalisation of uint8 images, applied by the training step on the device.

The image streams (ImageNet, CIFAR-10, MNIST) hand over uint8 batches: a quarter of the bytes of
float32 to copy to the device and no float arithmetic on the host, as big_vision and DALI pipelines
do. A dataset names its normalisation and the task applies it inside the compiled step
(`lbjax.train.tasks`); called on a numpy array, the same object computes the same values on the host.

- `Normalization`: per-channel `(x - mean) / stddev` (ImageNet, CIFAR-10).
- `PixelScale`: `x / divisor` exactly as the host divides, as two products and a sum (MNIST's
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


_PIXELS = np.arange(256, dtype=np.float32)
_HIGH_BITS = 16  # the leading bits of 1 / divisor in `high`: with a pixel's 8, a product of at most 24 bits


def reciprocal_parts(divisor: float) -> tuple[np.float32, np.float32]:
  """float32 (high, low) with high + low = 1 / float32(divisor) to float32 rounding: `high` its leading 16
  bits (so that `pixel * high` is exact), `low` the rest, rounded."""
  reciprocal = 1.0 / float(np.float32(divisor))
  mantissa, exponent = np.frexp(reciprocal)
  high = np.float32(np.ldexp(np.round(mantissa * 2**_HIGH_BITS), exponent - _HIGH_BITS))
  return high, np.float32(reciprocal - float(high))


@dataclasses.dataclass(frozen=True)
class PixelScale:
  """uint8 pixels as float32 `x / divisor`, bit for bit the host's correctly rounded quotients.

  XLA turns a division by a constant into a multiplication by its reciprocal, and `x * (1 / 255)` is one
  ulp off `x / 255` for 126 of the 256 pixel values, so an MNIST run would no longer give the numbers of
  the runs that read float32 pixels made on the host. The step computes `x * high + x * low` instead
  (`reciprocal_parts`: `x * high` exact): for every pixel value that is the correctly rounded quotient
  whether float32 arithmetic rounds the two products apart or fuses one of them with the sum (an FMA),
  which the constructor checks for its divisor, and XLA:CPU and XLA:GPU keep the two products
  (tests/data/test_mnist.py, tests/train/test_compile_for_gpus.py). XLA:TPU folds them into
  `x * (high + low)`, one multiplication, within an ulp of the quotient (a TPU's float32 matmuls round
  otherwise than a CPU's anyway). Elementwise, it fuses into the step's first kernel; the form before, a
  256-entry table gathered per pixel, cost a TPU about 15 ms per 2,048 MNIST images in XLA's cost model
  (a TPU gathers element by element). Images of any shape (MNIST's [N, 28, 28] has no channel axis).
  """
  divisor: float

  def __post_init__(self):
    if not self.divisor > 0:
      raise ValueError(f"PixelScale divisor must be positive, got {self.divisor!r}.")
    high, low = reciprocal_parts(self.divisor)
    want = _PIXELS / np.float32(self.divisor)
    products = (_PIXELS * high, _PIXELS * low)  # float32, each rounded (the first exact)
    # The sum rounded once from exact float64 values: the products apart, or one of them fused (an FMA).
    sums = [products[0] + products[1], (_PIXELS.astype(np.float64) * low + products[0]).astype(np.float32),
            (_PIXELS.astype(np.float64) * high + products[1]).astype(np.float32)]
    if not all(np.array_equal(s, want) for s in sums):
      raise ValueError(f"PixelScale({self.divisor!r}): x * high + x * low does not give float32(x) / "
                       f"float32({self.divisor!r}) for every pixel value; normalise with `Normalization` "
                       "(a multiplication by the reciprocal) instead.")

  def __call__(self, images):
    """float32 `images / divisor` of uint8 `images`, a numpy or a jax array (in a jitted step: on the
    device)."""
    if images.dtype != np.uint8:
      raise ValueError(f"PixelScale takes uint8 pixels (0-255), got {images.dtype} images.")
    high, low = reciprocal_parts(self.divisor)
    pixels = images.astype(np.float32)
    return pixels * high + pixels * low
