"""JPEG decoding at the smallest DCT scale that still covers the pixels a crop needs (PIL draft mode).

A baseline JPEG stores 8x8 blocks of DCT coefficients. libjpeg (bundled with Pillow) can run its
inverse DCT at 1/2, 1/4 or 1/8 of the size, giving the image downscaled by `a` in {2, 4, 8} for
a fraction of the inverse-DCT, upsampling and colour-conversion work (the entropy decoding is the
same). Reduced pixel `j` covers full-size pixels `[a*j, a*(j+1))`, so a crop window `[y0, y1)` of
the full image is the window `[y0/a, y1/a)` of the reduced one.

`dct_scale` picks the largest `a` for which the crop still has at least as many decoded pixels as
the output in each direction, so the final resize never enlarges what the full-size decode would
have shrunk: the result differs from "decode in full, then crop and resize" only by the resampling
error of the DCT-domain downscale (tested in tests/data/test_jpeg.py). With ImageNet's typical
size (about 400x350) and 224x224 outputs most crops need `a = 1`; the savings come from large
images and small outputs.

Why PIL's draft mode and not simplejpeg, PyTurboJPEG or OpenCV: PIL is already a dependency and
decodes straight into the image its resize reads. simplejpeg (libjpeg-turbo, same DCT scales)
decodes a whole JPEG about 1.5x faster, but its array must be copied into PIL (or another resizer)
and the train transform with it was only about 1.1x the PIL one (`python -m
benchmarks.input_pipeline --part imagenet`, benchmarks/README.md); PyTurboJPEG needs the system
libturbojpeg, OpenCV a large wheel, and neither decodes a region without entropy-decoding the rows
above it.

References:
  Independent JPEG Group, libjpeg `scale_num / scale_denom` (libjpeg.txt, "Decompression parameter
  selection"); Pillow `Image.draft`.
"""

import io
import math
from typing import Any, NamedTuple

import numpy as np

DCT_SCALES = (8, 4, 2, 1)


class Box(NamedTuple):
  """A window in full-size pixel coordinates (floats allowed): `[top, top + height)` x
  `[left, left + width)`."""
  top: float
  left: float
  height: float
  width: float


def _pil():
  try:
    from PIL import Image  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError("Decoding JPEGs needs pillow: pip install 'lbjax[tfds]'.") from err
  return Image


def open_image(encoded: bytes):
  """A lazily decoded `PIL.Image` of `encoded` (only the header is read until pixels are asked for)."""
  Image = _pil()  # pylint: disable=invalid-name
  try:
    image = Image.open(io.BytesIO(encoded))
  except Exception as err:  # PIL raises UnidentifiedImageError, OSError, SyntaxError...
    raise ValueError(f"cannot read an image from {len(encoded)} encoded bytes: {err}") from err
  return image


def image_size(encoded: bytes) -> tuple[int, int]:
  """(height, width) of an encoded image, read from its header only (no pixel is decoded)."""
  width, height = open_image(encoded).size
  return height, width


def dct_scale(box_height: float, box_width: float, out_height: int, out_width: int) -> int:
  """Largest `a` in (8, 4, 2, 1) with `box_height / a >= out_height` and `box_width / a >= out_width`.

  At this scale the crop window still holds at least one decoded pixel per output pixel in each
  direction, so resizing it to the output only shrinks (or keeps) it.
  """
  for scale in DCT_SCALES:
    if box_height >= scale * out_height and box_width >= scale * out_width:
      return scale
  return 1


def decode_resized_crop(encoded: Any, box: Box, size: tuple[int, int], *,
                        flip: bool = False) -> np.ndarray:
  """Decodes window `box` of a JPEG at the smallest DCT scale covering `size`, resizes it to `size`.

  Equivalent, up to the DCT-downscale resampling error, to decoding the whole image, cropping `box`
  and resizing it with one bilinear (antialiased) resampling, as `imagenet.crop_and_resize` does.

  Args:
    encoded: the JPEG file's bytes (other formats PIL reads are decoded in full), or the
      not yet loaded image `open_image` returned for them (saves parsing the header twice).
    box: the window in full-size pixel coordinates; must lie inside the image.
    size: output (height, width).
    flip: mirror the output left-right.

  Returns:
    uint8 [height, width, 3] RGB.
  """
  Image = _pil()  # pylint: disable=invalid-name
  image = open_image(encoded) if isinstance(encoded, bytes) else encoded
  width, height = image.size
  if not (0 <= box.top and box.top + box.height <= height and 0 <= box.left
          and box.left + box.width <= width and box.height > 0 and box.width > 0):
    raise ValueError(f"crop box {box} does not lie inside the {height}x{width} image.")
  scale = dct_scale(box.height, box.width, *size)
  drafted = None
  if scale > 1 and image.format == "JPEG":
    drafted = image.draft("RGB", (width // scale, height // scale))
  scale = width / drafted[1][2] if drafted else 1
  if image.mode not in ("RGB", "L"):
    image = image.convert("RGB")
  window = (box.left / scale, box.top / scale, (box.left + box.width) / scale,
            (box.top + box.height) / scale)
  resized = image.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=window)
  if resized.mode != "RGB":
    resized = resized.convert("RGB")
  if flip:
    resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
  return np.asarray(resized)


def center_crop_box(height: int, width: int, image_size: int, resize_size: int) -> Box:
  """The window of the original image that becomes the evaluation crop.

  Evaluation resizes the shorter side to `resize_size` (the other to `round(side * scale)`) and
  takes the central `image_size` square; this is that square mapped back to original pixels, so
  resizing the window straight to `image_size` gives the same pixels (the bilinear filter reads
  past the window's edges in both cases).
  """
  scale = resize_size / min(height, width)
  new_height = max(resize_size, int(round(height * scale)))
  new_width = max(resize_size, int(round(width * scale)))
  top = (new_height - image_size) // 2
  left = (new_width - image_size) // 2
  row_scale, column_scale = height / new_height, width / new_width
  return Box(top * row_scale, left * column_scale, image_size * row_scale,
             image_size * column_scale)


def decoded_pixel_fraction(height: int, width: int, box: Box, size: tuple[int, int]) -> float:
  """Fraction of the full image's pixels that `decode_resized_crop` decodes for `box`."""
  scale = dct_scale(box.height, box.width, *size)
  return math.ceil(height / scale) * math.ceil(width / scale) / (height * width)
