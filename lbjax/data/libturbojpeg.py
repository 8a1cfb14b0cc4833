"""Partial JPEG decoding through libjpeg-turbo's TurboJPEG 3 API (ctypes): only a window's pixels.

`tj3SetCroppingRegion` makes `tj3Decompress8` decode a region of the (DCT-scaled) image: rows above
it are entropy-decoded and discarded without inverse DCT, upsampling or colour conversion
(`jpeg_skip_scanlines`), rows below it are not decoded at all, and only the columns of the region,
its left edge moved down to the scaled iMCU width (16 pixels for 4:2:0 at scale 1), go through the
inverse DCT and the colour conversion (`jpeg_crop_scanline`). The Huffman decoding of every row down
to the region's bottom remains: it is most of a full decode of a photograph (measured in
benchmarks/README.md, section input-pipeline-imagenet).

Exactness: a region decoded with one pixel of margin on the left and on the right (where the image
has one) is bit-identical to the same pixels of a whole decode at the same scale (simplejpeg, Pillow:
the same accurate integer DCT and fancy upsampling); without the margin the outermost columns of a
cut differ, because the fancy upsampler of 4:2:0/4:2:2 chroma sees no neighbour there. `decode`
adds the margin and returns exactly the columns asked for (tested in tests/data/test_jpeg.py).

The TurboJPEG 3 API is in libjpeg-turbo 3.0 and later. Where the library comes from, in this order:
the file named by `$LBJAX_LIBTURBOJPEG` (and nothing else when it is set); the system's
`libturbojpeg` (conda-forge and Homebrew ship 3.x; Debian 12 and 13 ship 2.1, whose TurboJPEG 2 API
cannot crop, so apt does not help there); the `turbojpeg` wheel on PyPI (`pip install
'lbjax[turbojpeg]'`, libjpeg-turbo 3.0): its extension module, found by import name
(`importlib.util.find_spec`) and loaded by ctypes without running it, links libturbojpeg, and the
dynamic linker looks the `tj3*` functions up in its dependencies, wherever the wheel keeps the
library. Without one, `decoder()` returns None, says so once in the log, and `lbjax.data.jpeg`
decodes the whole image with simplejpeg (the same pixels, slower: benchmarks/README.md, section
input-pipeline-decoders, measures what the region decoding is worth).

References: libjpeg-turbo `turbojpeg.h` (tj3Init, tj3DecompressHeader, tj3Get, tj3SetScalingFactor,
tj3SetCroppingRegion, tj3Decompress8), libjpeg.txt "Partial image decompression".
"""

import ctypes
import ctypes.util
import functools
import importlib.util
import math
import os
import threading

from absl import logging
import numpy as np

ENVIRONMENT_VARIABLE = "LBJAX_LIBTURBOJPEG"

_TJINIT_DECOMPRESS = 1
_TJPARAM_SUBSAMP, _TJPARAM_JPEGWIDTH, _TJPARAM_JPEGHEIGHT = 4, 5, 6
_TJPF_RGB = 0
# iMCU width in pixels at scale 1 by TJSAMP (444, 422, 420, GRAY, 440, 411, 441); TJSAMP_UNKNOWN (-1,
# unusual sampling factors) cannot be cropped and is decoded whole.
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)


class _Region(ctypes.Structure):
  _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _ScalingFactor(ctypes.Structure):
  _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class _Handle:
  """One TurboJPEG decompressor; destroyed with the thread-local that holds it."""

  def __init__(self, library):
    self._destroy = library.tj3Destroy
    self.pointer = library.tj3Init(_TJINIT_DECOMPRESS)
    if not self.pointer:
      raise MemoryError("tj3Init could not create a TurboJPEG decompressor.")

  def __del__(self):
    self._destroy(self.pointer)


class RegionDecoder:
  """Decodes windows of JPEGs with one loaded libturbojpeg; safe to share between threads (each
  thread gets its own TurboJPEG instance)."""

  def __init__(self, library: ctypes.CDLL, path: str):
    self.path = path
    self._lib = library
    handle = ctypes.c_void_p
    signatures = {
        "tj3Init": ([ctypes.c_int], handle),
        "tj3Destroy": ([handle], None),
        "tj3DecompressHeader": ([handle, ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int),
        "tj3Get": ([handle, ctypes.c_int], ctypes.c_int),
        "tj3SetScalingFactor": ([handle, _ScalingFactor], ctypes.c_int),
        "tj3SetCroppingRegion": ([handle, _Region], ctypes.c_int),
        "tj3Decompress8": ([handle, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_int, ctypes.c_int], ctypes.c_int),
        "tj3GetErrorStr": ([handle], ctypes.c_char_p),
    }
    for name, (argtypes, restype) in signatures.items():
      function = getattr(library, name)
      function.argtypes, function.restype = argtypes, restype
    self._local = threading.local()

  def _handle(self) -> int:
    handle = getattr(self._local, "handle", None)
    if handle is None:
      handle = self._local.handle = _Handle(self._lib)
    return handle.pointer

  def _check(self, status: int, handle: int, encoded: bytes) -> None:
    if status != 0:
      message = self._lib.tj3GetErrorStr(handle).decode(errors="replace").replace("\n", " ")
      raise ValueError(f"cannot decode a JPEG from {len(encoded)} encoded bytes: {message}")

  def decode(self, encoded: bytes, numerator: int, rows: tuple[int, int],
             columns: tuple[int, int]) -> np.ndarray:
    """Rows `[rows[0], rows[1])` x columns `[columns[0], columns[1])` of the JPEG decoded at scale
    `numerator / 8` (libjpeg-turbo's size `ceil(side * numerator / 8)`), uint8 [h, w, 3] RGB,
    bit-identical to the same window of a whole decode at that scale (module docstring).

    Raises:
      ValueError: the bytes are not a JPEG libjpeg-turbo decodes to RGB without a warning (as
        simplejpeg's strict mode), or the window is empty or outside the scaled image.
    """
    encoded = encoded if isinstance(encoded, bytes) else bytes(encoded)
    handle = self._handle()
    lib = self._lib
    self._check(lib.tj3DecompressHeader(handle, encoded, len(encoded)), handle, encoded)
    divisor = math.gcd(numerator, 8)  # TurboJPEG accepts only reduced fractions (1/2, not 4/8).
    self._check(lib.tj3SetScalingFactor(handle, _ScalingFactor(numerator // divisor, 8 // divisor)),
                handle, encoded)
    height = -(-lib.tj3Get(handle, _TJPARAM_JPEGHEIGHT) * numerator // 8)
    width = -(-lib.tj3Get(handle, _TJPARAM_JPEGWIDTH) * numerator // 8)
    (top, bottom), (left, right) = rows, columns
    if not (0 <= top < bottom <= height and 0 <= left < right <= width):
      raise ValueError(f"window rows {rows} x columns {columns} is not inside the {height}x{width} "
                       f"image decoded at scale {numerator}/8.")
    subsampling = lib.tj3Get(handle, _TJPARAM_SUBSAMP)
    if not 0 <= subsampling < len(_MCU_WIDTH):  # Cannot be cropped: decode whole, take the window.
      return self._decompress(handle, encoded, _Region(0, 0, 0, 0), (height, width))[
          top:bottom, left:right]
    mcu_width = _MCU_WIDTH[subsampling] * numerator // 8
    start, stop = max(0, left - 1) // mcu_width * mcu_width, min(width, right + 1)
    # Rows below the region are not read: a file cut there decodes without libjpeg's "Premature end"
    # warning, which a whole decode gives. Where the data may not be whole, decode down to the last row.
    last_row = bottom if _ends_after_its_last_scan(encoded) else height
    pixels = self._decompress(handle, encoded, _Region(start, top, stop - start, last_row - top),
                              (last_row - top, stop - start))
    return pixels[:bottom - top, left - start:right - start]

  def _decompress(self, handle: int, encoded: bytes, region: _Region,
                  shape: tuple[int, int]) -> np.ndarray:
    self._check(self._lib.tj3SetCroppingRegion(handle, region), handle, encoded)
    pixels = np.empty((*shape, 3), np.uint8)
    self._check(self._lib.tj3Decompress8(handle, encoded, len(encoded), pixels.ctypes.data,
                                         pixels.strides[0], _TJPF_RGB), handle, encoded)
    return pixels


def _ends_after_its_last_scan(encoded: bytes) -> bool:
  """Whether an end-of-image marker (FF D9) follows the last start-of-scan marker (FF DA). Entropy-coded
  data holds neither (an FF in it is followed by 00 or a restart marker), so a file cut inside its
  scans has none; a whole file has one (trailing bytes after it aside, which only cost a full decode)."""
  return encoded.rfind(b"\xff\xd9") > encoded.rfind(b"\xff\xda")


def _turbojpeg_extension() -> str | None:
  """The `turbojpeg` wheel's extension module (which links libturbojpeg), by import name; None without it."""
  spec = importlib.util.find_spec("turbojpeg")
  return spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None


def _candidates() -> list[str]:
  if os.environ.get(ENVIRONMENT_VARIABLE):
    return [os.environ[ENVIRONMENT_VARIABLE]]
  return [path for path in (ctypes.util.find_library("turbojpeg"), _turbojpeg_extension()) if path]


@functools.cache
def decoder() -> RegionDecoder | None:
  """The region decoder of the first library found with the TurboJPEG 3 API (module docstring), or
  None; either outcome is logged once per process."""
  tried = []
  for path in _candidates():
    try:
      library = ctypes.CDLL(path)
    except OSError as err:
      tried.append(f"{path} ({err})")
      continue
    if not hasattr(library, "tj3SetCroppingRegion"):
      tried.append(f"{path} (no TurboJPEG 3 API: libjpeg-turbo < 3.0)")
      continue
    logging.info("Decoding JPEG windows with libturbojpeg's cropping region: %s", path)
    return RegionDecoder(library, path)
  logging.info("No libturbojpeg with the TurboJPEG 3 API (tried: %s); JPEGs are decoded whole (at "
               "the DCT scale) with simplejpeg. For region decoding: pip install "
               "'lbjax[turbojpeg]', or a libjpeg-turbo >= 3.0 (or $%s naming its libturbojpeg).",
               ", ".join(tried) or "none found", ENVIRONMENT_VARIABLE)
  return None
