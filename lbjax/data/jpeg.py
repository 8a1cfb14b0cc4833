"""JPEG decoding of a crop's region at the smallest DCT scale covering it (libjpeg-turbo), bilinear
resize (OpenCV).

`dct_scale` picks the largest 8/M downscale (M in 8, 4, 2, 1) that leaves the crop at least the output's
size in each direction; `decode_resized_crop` decodes at that scale only the rows and columns the resize
reads where a TurboJPEG 3 library is found (`libturbojpeg.decoder()`), else simplejpeg decodes the whole
image at it; `resize_window` is the one resampler of the ImageNet transforms. Why these scales, this
resampler and these decoders, with the measurements: docs/design.md, "JPEG decoding".
"""

import io
import math
from typing import NamedTuple

import numpy as np

from lbjax.data import libturbojpeg
from lbjax.data.crops import Box

DCT_SCALES = (8, 4, 2, 1)
INSTALL_HINT = "pip install 'lbjax[imagenet]' (simplejpeg and opencv-python-headless)"

# JPEG colour spaces libjpeg-turbo converts to RGB; others (CMYK, YCCK) are decoded by Pillow.
_RGB_CONVERTIBLE = ("YCbCr", "Gray", "RGB")
# The one libjpeg warning that costs no pixel: bytes between the last scan's data and the end-of-image
# marker (camera padding, common in photo datasets), met after every pixel is decoded; TensorFlow, OpenCV
# and Pillow decode such files. Every other warning (a truncated or corrupt scan) makes an image undecodable.
_PADDING_BEFORE_END = "extraneous bytes before marker 0xd9"


class DecodeError(ValueError):
  """Encoded bytes that cannot be decoded: a truncated or corrupt JPEG, or bytes that are no image."""


def codecs():
  """(simplejpeg, cv2), or an ImportError that says what to install (the transforms call it when
  they are built, so a missing extra is reported before any data is read)."""
  try:
    import cv2  # pylint: disable=g-import-not-at-top
    import simplejpeg  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError(f"The ImageNet input path decodes and resizes with simplejpeg and OpenCV: "
                      f"{INSTALL_HINT}.") from err
  return simplejpeg, cv2


def _pil():
  try:
    from PIL import Image  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError("Decoding images other than RGB or grayscale JPEGs needs pillow: pip install "
                      "'lbjax[tfds]'.") from err
  return Image


def _is_jpeg(encoded: bytes) -> bool:
  return encoded[:3] == b"\xff\xd8\xff"


class Header(NamedTuple):
  """What an image's header says: its size, and whether libjpeg-turbo decodes it to RGB (a YCbCr,
  grayscale or RGB JPEG; other images are decoded by Pillow)."""
  height: int
  width: int
  libjpeg_rgb: bool


def header(encoded: bytes) -> Header:
  """The `Header` of an encoded image, read from its header only (no pixel is decoded)."""
  if isinstance(encoded, (bytearray, memoryview)):
    encoded = bytes(encoded)
  if not isinstance(encoded, bytes):
    raise TypeError(f"expected the encoded image as bytes, got {type(encoded).__name__}.")
  if _is_jpeg(encoded):
    simplejpeg, _ = codecs()
    try:
      height, width, colorspace, _ = simplejpeg.decode_jpeg_header(encoded)
    except ValueError as err:
      raise DecodeError(f"cannot read an image from {len(encoded)} encoded bytes: {err}") from err
    if colorspace in _RGB_CONVERTIBLE:
      return Header(height, width, True)
  try:
    width, height = _pil().open(io.BytesIO(encoded)).size
  except (OSError, SyntaxError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError.
    reason = ("no JPEG, nor another format Pillow reads" if type(err).__name__ == "UnidentifiedImageError"
              else str(err))
    raise DecodeError(f"cannot read an image from {len(encoded)} encoded bytes: {reason}") from err
  return Header(height, width, False)


def image_size(encoded: bytes) -> tuple[int, int]:
  """(height, width) of an encoded image, read from its header only (no pixel is decoded)."""
  height, width, _ = header(encoded)
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


def scaling_numerator(height: int, width: int, scale: int) -> int:
  """The M of the M/8 inverse DCT libjpeg-turbo runs when asked for at least
  `ceil(height / scale) x ceil(width / scale)` pixels: the smallest M in 1..8 that gives as many
  (`8 / scale`, except for images of a few pixels, where a smaller M rounds up to the same size).
  """
  min_height, min_width = -(-height // scale), -(-width // scale)
  return next(m for m in range(1, 9)
              if -(-height * m // 8) >= min_height and -(-width * m // 8) >= min_width)


def decode(encoded: bytes, scale: int = 1) -> tuple[np.ndarray, float]:
  """Decodes an image at DCT scale 1/`scale` (JPEG) or in full (other formats, CMYK JPEGs).

  Returns:
    uint8 [h, w, 3] RGB and the full-size pixels per decoded pixel (`8 / M`, see
    `scaling_numerator`; 1 for a full decode).

  Raises:
    DecodeError: the bytes are no image, or a truncated or corrupt one.
  """
  height, width, libjpeg_rgb = header(encoded)
  try:
    if libjpeg_rgb:
      simplejpeg, _ = codecs()
      numerator = scaling_numerator(height, width, scale)
      sizes = {} if numerator == 8 else {"min_height": -(-height * numerator // 8),
                                         "min_width": -(-width * numerator // 8)}
      try:  # strict: the first warning raises
        return simplejpeg.decode_jpeg(encoded, "RGB", **sizes), 8 / numerator
      except ValueError as err:
        if _PADDING_BEFORE_END not in str(err):
          raise
        return simplejpeg.decode_jpeg(encoded, "RGB", strict=False, **sizes), 8 / numerator
    return np.asarray(_pil().open(io.BytesIO(encoded)).convert("RGB")), 1.0
  except (OSError, SyntaxError, ValueError) as err:  # simplejpeg: ValueError; Pillow: OSError (truncated)
    raise DecodeError(f"cannot decode an image from {len(encoded)} encoded bytes: {err}") from err


def _check_window(window: Box, height: int, width: int) -> None:
  if not (0 <= window.top and window.top + window.height <= height and 0 <= window.left
          and window.left + window.width <= width and window.height > 0 and window.width > 0):
    raise ValueError(f"crop box {tuple(window)} does not lie inside the {height}x{width} image.")


def resize_window(pixels: np.ndarray, window: Box, size: tuple[int, int],
                  out: np.ndarray | None = None) -> np.ndarray:
  """Resamples `window` of uint8 `pixels` [H, W, C] to `size` = (height, width) (module docstring),
  into `out` (C-contiguous uint8 [height, width, C]) when given, which is then returned.

  Bilinear with OpenCV's pixel-centre convention: output pixel `i` reads input coordinate
  `top + (i + 0.5) * window.height / height - 0.5` (rows; columns alike), edges replicated; area
  averaging when the window is at least twice the output in both directions. A window of the
  output's size at whole-pixel edges is returned as it is (a view of `pixels`) when `out` is None.

  Three ways to the same sampling points: whole-pixel edges resize the window itself
  (`cv2.resize`); edges at whole multiples of the step (`_steps_to_window`: the evaluation
  window, the centre of the image resized by 1 / step) take rows and columns `k, k + 1, ...` of
  `cv2.resize` by exactly 1 / step of the pixels from the origin to the window's far edges;
  other fractional edges (training crops decoded at a DCT scale below 1) go through
  `cv2.warpAffine`, about twice the time. The resize's weights are fixed-point (11 bits): it
  stays under one level of float64 bilinear sampling and within one level of the warp
  (tests/data/test_jpeg.py).
  """
  _, cv2 = codecs()
  _check_window(window, *pixels.shape[:2])
  if out is not None:
    _check_out(out, (*size, *pixels.shape[2:]))
  out_height, out_width = size
  row_step, column_step = window.height / out_height, window.width / out_width
  whole_pixels = all(float(edge).is_integer() for edge in window)
  if whole_pixels or min(row_step, column_step) >= 2:
    top, left = math.floor(window.top), math.floor(window.left)
    region = pixels[top:math.ceil(window.top + window.height),
                    left:math.ceil(window.left + window.width)]
    if region.shape[:2] == tuple(size):
      return region if out is None else _copy_into(out, region)
    interpolation = cv2.INTER_AREA if min(row_step, column_step) >= 2 else cv2.INTER_LINEAR
    return cv2.resize(region, (out_width, out_height), dst=out, interpolation=interpolation)
  (_, bottom), (_, right) = _support(window, *pixels.shape[:2])
  steps = _steps_to_window(window, size)
  if steps is not None:
    # Output pixel k + i of the resize by 1 / step reads (k + i + 0.5) * step - 0.5, the window's.
    resized = cv2.resize(pixels[:bottom, :right], None, fx=1 / column_step, fy=1 / row_step,
                         interpolation=cv2.INTER_LINEAR)
    window_pixels = resized[steps[0]:steps[0] + out_height, steps[1]:steps[1] + out_width]
    return window_pixels if out is None else _copy_into(out, window_pixels)
  # Fractional edges: the same bilinear sampling on the exact window, from a region one pixel
  # wider on each side than the window (what the filter reads).
  top, left = max(0, math.floor(window.top) - 1), max(0, math.floor(window.left) - 1)
  region = pixels[top:bottom, left:right]
  transform = np.array([[column_step, 0, window.left - left + 0.5 * column_step - 0.5],
                        [0, row_step, window.top - top + 0.5 * row_step - 0.5]])
  return cv2.warpAffine(region, transform, (out_width, out_height), dst=out,
                        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                        borderMode=cv2.BORDER_REPLICATE)


def _check_out(out: np.ndarray, shape: tuple[int, ...]) -> None:
  """OpenCV would silently write a new array instead of an `out` of another shape, dtype or
  layout."""
  if not (isinstance(out, np.ndarray) and out.shape == shape and out.dtype == np.uint8
          and out.flags.c_contiguous and out.flags.writeable):
    described = (f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray)
                 else type(out).__name__)
    raise ValueError(f"out must be a writeable C-contiguous uint8 array of shape {shape}, got "
                     f"{described}.")


def _copy_into(out: np.ndarray, pixels: np.ndarray) -> np.ndarray:
  out[...] = pixels
  return out


def _steps_to_window(window: Box, size: tuple[int, int]) -> tuple[int, int] | None:
  """(k, l) where `resize_window` resamples from the origin: the window has fractional edges, is
  less than twice the output in some direction, and its top and left edges are k and l whole
  steps (window side / output side) from the origin within a relative 1e-9 (the evaluation
  window, `crops.eval_window`); None otherwise."""
  if (all(float(edge).is_integer() for edge in window)
      or min(window.height / size[0], window.width / size[1]) >= 2):
    return None
  steps = (window.top * size[0] / window.height, window.left * size[1] / window.width)
  whole = [round(step) for step in steps]
  if all(abs(step - k) <= 1e-9 * max(1, k) for step, k in zip(steps, whole)):
    return whole[0], whole[1]
  return None


def _support(window: Box, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
  """The rows and columns of a [height, width] image that `resize_window` reads for `window`: the
  pixels it overlaps and one more on each side (what the bilinear filter reads at fractional
  edges), within the image."""
  return ((max(0, math.floor(window.top) - 1),
           min(height, math.ceil(window.top + window.height) + 1)),
          (max(0, math.floor(window.left) - 1),
           min(width, math.ceil(window.left + window.width) + 1)))


def decode_resized_crop(encoded: bytes, box: Box, size: tuple[int, int], *, flip: bool = False,
                        image_header: Header | None = None,
                        out: np.ndarray | None = None) -> np.ndarray:
  """Decodes window `box` of a JPEG at the smallest DCT scale covering `size`, resizes it to `size`.

  With a libturbojpeg that has the TurboJPEG 3 API (`libturbojpeg.decoder()`) only the pixels the
  resize reads are decoded (`libturbojpeg.RegionDecoder.decode`); otherwise simplejpeg decodes the
  whole image at that scale. Both give the same pixels. Equivalent, up to the DCT-downscale resampling
  error, to decoding the whole image, cropping `box` and resizing it with `resize_window`, as
  `imagenet.crop_and_resize` does (bit-identical when `dct_scale` is 1).

  Args:
    encoded: the image file's bytes (JPEG; other formats Pillow reads are decoded in full).
    box: the window in full-size pixel coordinates; must lie inside the image.
    size: output (height, width).
    flip: mirror the output left-right.
    image_header: `header(encoded)` where the caller has read it already (read here when None).
    out: C-contiguous uint8 [height, width, 3] to write the crop into (a new array when None).

  Returns:
    uint8 [height, width, 3] RGB: `out` when given.

  Raises:
    DecodeError: the bytes are no image, or a truncated or corrupt one.
  """
  height, width, libjpeg_rgb = header(encoded) if image_header is None else image_header
  _check_window(Box(*box), height, width)
  if out is not None:
    _check_out(out, (*size, 3))
  scale = dct_scale(box.height, box.width, *size)
  region_decoder = libturbojpeg.decoder() if libjpeg_rgb else None
  pixels = None
  if region_decoder is not None:
    numerator = scaling_numerator(height, width, scale)
    window = Box(*(edge / (8 / numerator) for edge in box))  # As `decode`'s step.
    rows, columns = _support(window, -(-height * numerator // 8), -(-width * numerator // 8))
    if _steps_to_window(window, size) is not None:  # `resize_window` reads from the origin.
      rows, columns = (0, rows[1]), (0, columns[1])
    try:
      pixels = region_decoder.decode(encoded, numerator, rows, columns)
    except ValueError as err:
      # TurboJPEG reports its last warning: the padding's may follow a worse one, which `decode` finds first.
      if _PADDING_BEFORE_END not in str(err):
        raise DecodeError(str(err)) from err
    window = window._replace(top=window.top - rows[0], left=window.left - columns[0])
  if pixels is None:
    pixels, step = decode(encoded, scale)
    window = Box(*(edge / step for edge in box))
  out = np.empty((*size, 3), np.uint8) if out is None else out
  resize_window(pixels, window, size, out)
  return codecs()[1].flip(out, 1, dst=out) if flip else out  # In place.


def decoded_pixel_fraction(height: int, width: int, box: Box, size: tuple[int, int]) -> float:
  """Fraction of the full image's pixels that `decode_resized_crop` decodes for `box`."""
  numerator = scaling_numerator(height, width, dct_scale(box.height, box.width, *size))
  return -(-height * numerator // 8) * -(-width * numerator // 8) / (height * width)
