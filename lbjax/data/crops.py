"""Crop geometry of the ImageNet transforms: which window of an image becomes the output, and the flip.

One box type (`Box`: top, left, height, width in pixels of the original image; fractional edges
allowed) for every decoder: `lbjax.data.jpeg` decodes and resamples a `Box` of encoded bytes,
`lbjax.data.imagenet` of decoded arrays, and both draw it here from the image's height and width
only, so the two get the same windows and flips from the same generator.

Training: Inception-style random resized crop (Szegedy et al. 2015; the reference TF/MLPerf ResNet-50
pipeline that `papers/000` trains with), area (0.08, 1) of the image, aspect ratio (3/4, 4/3)
log-uniform, falling back to the central square of 224/256 of the shorter side, then a flip with
probability 1/2 (`train_window`). Evaluation: resize the shorter side to `image_size * 256 / 224`,
take the central `image_size` square; `eval_window` is that square mapped back to the original
image, so resizing the window straight to `image_size` samples the same points.
"""

from collections.abc import Sequence
import math
import numbers
from typing import Any, NamedTuple

import numpy as np

# Eval resize: shorter side to `image_size * 256 / 224` (256 for 224), then a central square crop.
EVAL_RESIZE_RATIO = 256 / 224

DEFAULT_AREA_RANGE = (0.08, 1.0)
DEFAULT_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
DEFAULT_MAX_ATTEMPTS = 10


class Box(NamedTuple):
  """A window in pixel coordinates (floats allowed): `[top, top + height)` x `[left, left + width)`."""
  top: float
  left: float
  height: float
  width: float


def check_image_size(image_size: Any) -> int:
  """`image_size` (an output side) as an int; raises unless it is a positive integer."""
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


def central_square(height: int, width: int, fraction: float) -> Box:
  """The central square whose side is `fraction` of the shorter image side (at least 1), whole pixels."""
  if not 0 < fraction <= 1:
    raise ValueError(f"fraction must lie in (0, 1], got {fraction}.")
  side = max(1, int(round(min(height, width) * fraction)))
  return Box((height - side) // 2, (width - side) // 2, side, side)


def sample_crop_box(rng: np.random.Generator, height: int, width: int, *,
                    area_range: tuple[float, float] = DEFAULT_AREA_RANGE,
                    aspect_ratio_range: tuple[float, float] = DEFAULT_ASPECT_RATIO_RANGE,
                    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                    fallback_fraction: float = 1 / EVAL_RESIZE_RATIO) -> Box:
  """Samples an Inception-style crop window (Szegedy et al. 2015; the ResNet reference pipeline).

  Each attempt draws a target area `a ~ U(area_range) * H * W` and an aspect ratio `r` (width /
  height) log-uniformly from `aspect_ratio_range`, sets `h = round(sqrt(a / r))`,
  `w = round(sqrt(a * r))`, and accepts the window if it fits (`h <= H`, `w <= W`), placing it
  uniformly at random. If all `max_attempts` attempts fail (e.g. very elongated images), it falls
  back to `central_square(H, W, fallback_fraction)` (224/256 of the shorter side), as the TF
  reference pipeline does.

  Args:
    rng: numpy generator; the result depends only on its state.
    height: image height H.
    width: image width W.
    area_range: bounds of the crop area as a fraction of the image area.
    aspect_ratio_range: bounds of the crop's width / height.
    max_attempts: number of draws before the fallback.
    fallback_fraction: side of the fallback crop as a fraction of the shorter image side.

  Returns:
    The `Box` (whole pixels), always inside the image and at least 1x1.
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
      return Box(top, left, crop_height, crop_width)
  return central_square(height, width, fallback_fraction)


def train_window(height: int, width: int, rng: np.random.Generator) -> tuple[Box, bool]:
  """The training crop window (`sample_crop_box` of the image's height and width) and whether to
  flip it (`rng.random() < 0.5`), drawn in this order: encoded bytes (header size only) and decoded
  arrays get the same window and flip from the same generator."""
  box = sample_crop_box(rng, height, width)
  return box, bool(rng.random() < 0.5)


def eval_window(height: int, width: int, image_size: int, resize_size: int | None = None) -> Box:
  """The window of a height x width image that becomes the evaluation crop.

  Evaluation resizes the shorter side to `resize_size` (default `round(image_size * 256 / 224)`; the
  other side to `round(side * scale)`) and takes the central `image_size` square; this is that
  square mapped back to original pixels (fractional edges), so resizing the window straight to
  `image_size` samples the same points.
  """
  if resize_size is None:
    resize_size = int(round(image_size * EVAL_RESIZE_RATIO))
  if resize_size < image_size:
    raise ValueError(f"resize_size ({resize_size}) must be >= image_size ({image_size}).")
  scale = resize_size / min(height, width)
  new_height = max(resize_size, int(round(height * scale)))
  new_width = max(resize_size, int(round(width * scale)))
  top = (new_height - image_size) // 2
  left = (new_width - image_size) // 2
  row_scale, column_scale = height / new_height, width / new_width
  return Box(top * row_scale, left * column_scale, image_size * row_scale, image_size * column_scale)
