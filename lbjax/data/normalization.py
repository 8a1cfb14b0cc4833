"""Per-channel normalisation of uint8 images, applied by the training step on the device.

The image streams (ImageNet, CIFAR-10) hand over uint8 NHWC batches: a quarter of the bytes of
float32 to copy to the device and no float arithmetic on the host, as big_vision and DALI pipelines
do. A dataset names its `Normalization` and the task applies it inside the compiled step
(`lbjax.train.tasks`); `normalize_images` computes the same values on the host.
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
