"""JPEG decoding of a crop's region at the smallest DCT scale covering it (libjpeg-turbo), bilinear
resize (OpenCV).

A baseline JPEG stores 8x8 blocks of DCT coefficients. libjpeg-turbo can run its inverse DCT at
M/8 of the size (M = 1..8), giving the image downscaled by 8/M for a fraction of the inverse-DCT,
upsampling and colour-conversion work (the entropy decoding is the same). Reduced pixel `j`
covers full-size pixels `[8j/M, 8(j+1)/M)`, so a crop window `[y0, y1)` of the full image is the
window `[y0 M/8, y1 M/8)` of the reduced one.

`dct_scale` picks the largest `a` in (8, 4, 2, 1) for which the crop still has at least as many
decoded pixels as the output in each direction, so the final resize never enlarges what a full-size
decode would have shrunk. The other M/8 scales (M = 3, 5, 6, 7) would decode fewer pixels for many
training crops (those 1.14 to 2 times the output side), but libjpeg-turbo's inverse DCTs at those
sizes are plain C (its SIMD ones are 8x8, 4x4 and 2x2), so decoding the crops' regions at them is
slower, not faster (benchmarks/input_pipeline.py, row "at the smallest M/8"). At `a = 1` the decoded
pixels are bit-identical to Pillow's (both are libjpeg-turbo's accurate integer DCT with fancy
upsampling), so the two paths differ only where `a > 1`, by the resampling error of the DCT-domain
downscale (tested in tests/data/test_jpeg.py).

`resize_window` is the one resampler of the ImageNet transforms (decoded arrays too): OpenCV
bilinear (`INTER_LINEAR`, no antialiasing, as TF's `tf.image.resize(..., antialias=False)` in the
reference ResNet-50 pipeline), on the exact window: `cv2.resize` of the window when its edges are
whole pixels; of the image from its origin by exactly 1 / step when the edges are whole steps from
it (the evaluation window: the centre of the image resized to 256, so the same pixels as resizing
and cropping, in about half the time of the affine warp); `cv2.warpAffine` for other fractional
edges (training crops decoded at a DCT scale below 1). After the DCT scale the window is shrunk by
less than 2x in its shorter direction relative to the output (the other by at most the crop's
aspect ratio more), so aliasing stays that of a mild bilinear shrink; where even 1/8 leaves the
window at least twice the output in both directions (crops over 16x the output side), it averages
areas instead (`INTER_AREA`, antialiased; at fractional factors it costs more than bilinear, so it
is kept for these) over the window rounded out to whole decoded pixels (under half an output
pixel).

Region decoding: where a libturbojpeg with the TurboJPEG 3 API is found (`libturbojpeg.decoder()`:
`pip install 'lbjax[turbojpeg]'`, a system libjpeg-turbo >= 3.0, or `$LBJAX_LIBTURBOJPEG`),
`decode_resized_crop` decodes only the rows and columns the resize reads (`_support`; from the
origin for the evaluation window), at the same DCT scale; the pixels are bit-identical to those of
the whole decode, so everything above holds unchanged. Otherwise simplejpeg decodes the whole
image at that scale (logged once).

Why these decoders, measured on this machine (`python -m benchmarks.input_pipeline --part imagenet`,
benchmarks/README.md): the entropy (Huffman) decoding of every JPEG dominates the training
transform. simplejpeg (libjpeg-turbo bundled in its wheel) decodes 1.3-1.5x faster than Pillow,
and OpenCV's bilinear resize of the numpy window costs a fraction of Pillow's antialiased resize.
Region decoding then saves the inverse DCT, upsampling and colour conversion outside the crop and
the entropy decoding below it (the train transform 1.2x as fast as with simplejpeg, the eval
transform 1.04x: benchmarks/README.md, section input-pipeline-decoders), not
the entropy decoding of the rows above the crop, which the benchmark's last-row-only decode shows
to be most of a decode of these photographs. Of the decoders installable from PyPI, only a
TurboJPEG 3 library decodes a region: simplejpeg, Pillow (draft mode), OpenCV (`IMREAD_REDUCED_*`)
and imagecodecs (`jpeg8_decode`) expose no cropping; PyTurboJPEG's `crop` is a lossless
transform to a new JPEG (entropy-decodes the whole image and re-encodes the crop) and its `decode`
takes no region; Debian's and Ubuntu's libturbojpeg0 (2.1) has only the TurboJPEG 2 API, which
cannot crop a decode; the libjpeg API of their libjpeg62-turbo can (`jpeg_crop_scanline`,
`jpeg_skip_scanlines`), but its errors `longjmp` out of C, which ctypes cannot catch. The
`turbojpeg` wheel (pybind11 bindings without cropping) bundles a libturbojpeg 3.0, which
`lbjax.data.libturbojpeg` loads. OpenCV's decoder (`cv2.imdecode`, `IMREAD_REDUCED_*`) is slower
than simplejpeg's (section input-pipeline-decoders), so OpenCV only resizes. Other formats and CMYK
JPEGs (rare in ImageNet; TFDS re-encodes them) are decoded in full by Pillow.

References:
  libjpeg-turbo, `tjGetScalingFactors` / libjpeg `scale_num, scale_denom` (libjpeg.txt,
  "Decompression parameter selection", "Partial image decompression"); simplejpeg
  `decode_jpeg(min_height, min_width)`; OpenCV
  `resize`, `warpAffine`.
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
      return simplejpeg.decode_jpeg(encoded, "RGB", **sizes), 8 / numerator
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
  whole image at that scale. Both give the same pixels. Equivalent, up to the DCT-downscale
  resampling error, to decoding the whole image, cropping `box` and resizing it with
  `resize_window`, as `imagenet.crop_and_resize` does (bit-identical when `dct_scale` is 1).

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
  if region_decoder is None:
    pixels, step = decode(encoded, scale)
    window = Box(*(edge / step for edge in box))
  else:
    numerator = scaling_numerator(height, width, scale)
    window = Box(*(edge / (8 / numerator) for edge in box))  # As `decode`'s step.
    rows, columns = _support(window, -(-height * numerator // 8), -(-width * numerator // 8))
    if _steps_to_window(window, size) is not None:  # `resize_window` reads from the origin.
      rows, columns = (0, rows[1]), (0, columns[1])
    try:
      pixels = region_decoder.decode(encoded, numerator, rows, columns)
    except ValueError as err:
      raise DecodeError(str(err)) from err
    window = window._replace(top=window.top - rows[0], left=window.left - columns[0])
  out = np.empty((*size, 3), np.uint8) if out is None else out
  resize_window(pixels, window, size, out)
  return codecs()[1].flip(out, 1, dst=out) if flip else out  # In place.


def decoded_pixel_fraction(height: int, width: int, box: Box, size: tuple[int, int]) -> float:
  """Fraction of the full image's pixels that `decode_resized_crop` decodes for `box`."""
  numerator = scaling_numerator(height, width, dct_scale(box.height, box.width, *size))
  return -(-height * numerator // 8) * -(-width * numerator // 8) / (height * width)
