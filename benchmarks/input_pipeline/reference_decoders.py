"""The decode paths the ImageNet parts compare lbjax's against: the full-decode baseline (Pillow, as
TFDS decodes), Pillow's draft mode, OpenCV's decoder, lbjax without its region decoder; the variants' names."""

import io

import numpy as np

from lbjax.data import crops
from lbjax.data import imagenet
from lbjax.data import jpeg
from lbjax.data import libturbojpeg
from lbjax.data import stream as stream_lib


TRAIN_BASELINE, EVAL_BASELINE = "train full-decode baseline", "eval full-decode baseline"
TRAIN_BASELINE_UINT8 = "train full-decode baseline, uint8 out (no host normalisation)"
EVAL_BASELINE_UINT8 = "eval full-decode baseline, uint8 out (no host normalisation)"
TRAIN_WHOLE = "train simplejpeg whole decode + OpenCV (lbjax without libturbojpeg 3)"
EVAL_WHOLE = "eval simplejpeg whole decode + OpenCV (lbjax without libturbojpeg 3)"
TRAIN_REGION = "train libturbojpeg region decode + OpenCV (lbjax)"
EVAL_REGION = "eval libturbojpeg region decode + OpenCV (lbjax)"
DECODE_BASELINE = "decode alone, Pillow, full size"
DECODE_SIMPLEJPEG = "decode alone, simplejpeg, full size"
DECODE_REGIONS = "decode alone, libturbojpeg, the train crops' regions"
DECODE_REGIONS_EIGHTHS = ("decode alone, libturbojpeg, the train crops' regions at the smallest "
                          "M/8 covering the output (M = 1..8; not used)")
DECODE_ENTROPY = "decode alone, libturbojpeg, last row only (entropy decoding of all rows)"


def decode_in_full(encoded: bytes) -> np.ndarray:
  """uint8 RGB array of a whole JPEG, decoded by Pillow as TFDS's image feature does."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))


def objects(values) -> np.ndarray:
  """1-D object array of `values` (how a source hands out images of different sizes or bytes)."""
  values = list(values)
  array = np.empty(len(values), dtype=object)
  array[:] = values
  return array


def pil_resize(image, window, size: int) -> np.ndarray:
  """Pillow's antialiased bilinear resize of `window` (top, left, height, width) of a PIL image."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  top, left, height, width = window
  return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR,
                                 box=(left, top, left + width, top + height)))


def pil_draft_decode(encoded: bytes, window, size: int):
  """The previous reduced path (lbjax before simplejpeg): Pillow's draft mode at the DCT scale of
  `jpeg.dct_scale`, then Pillow's resize of the window mapped to the drafted image."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  image = Image.open(io.BytesIO(encoded))
  width, height = image.size
  scale = jpeg.dct_scale(window.height, window.width, size, size)
  drafted = image.draft("RGB", (width // scale, height // scale)) if scale > 1 else None
  step = width / drafted[1][2] if drafted else 1
  return pil_resize(image.convert("RGB"), [edge / step for edge in window], size)


def opencv_decode(encoded: bytes, scale: int = 1) -> np.ndarray:
  """OpenCV's decoder (`cv2.imdecode`, libjpeg-turbo inside OpenCV's wheel) at DCT scale 1/`scale`, RGB."""
  cv2 = jpeg.codecs()[1]
  flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
           8: cv2.IMREAD_REDUCED_COLOR_8}[scale]
  return cv2.cvtColor(cv2.imdecode(np.frombuffer(encoded, np.uint8), flags), cv2.COLOR_BGR2RGB)


def pil_draft(encoded: bytes, scale: int) -> np.ndarray:
  """Pillow's decoder at DCT scale 1/`scale` (draft mode), RGB."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  image = Image.open(io.BytesIO(encoded))
  image.draft("RGB", (-(-image.width // scale), -(-image.height // scale)))
  return np.asarray(image.convert("RGB"))


def _row_normalizer(mean, stddev, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Mean and 1 / stddev tiled along one image row, so numpy's inner loop runs over a whole row
  ([W * C] values) instead of the C channels (about 5x faster): the host normalisation lbjax's
  transforms did before they handed over uint8 (the baselines' cost of it)."""
  inverse = np.float32(1) / np.asarray(stddev, np.float32)
  return np.tile(np.asarray(mean, np.float32), width), np.tile(inverse, width)


def _normalize_into(out: np.ndarray, image: np.ndarray, normalizer: tuple[np.ndarray, np.ndarray]) -> None:
  """`out[...] = (image - mean) / stddev` with `_row_normalizer`'s rows."""
  mean_row, inverse_stddev_row = normalizer
  rows = out.reshape(-1, mean_row.shape[0])
  np.subtract(np.asarray(image).reshape(rows.shape), mean_row, out=rows, dtype=np.float32)
  np.multiply(rows, inverse_stddev_row, out=rows)


def reference_transforms(image_size: int):
  """Train and eval transforms of JPEG bytes as the variants to compare compute them, one thread:
  the same windows (`crops.train_window`, `crops.eval_window`) and flips as `imagenet`'s
  transforms, only the decode and the resize differ, and these normalise on the host to float32
  as the ImageNet path did before its batches became uint8 (the `uint8 out` baselines do not).

  Returns {name: transform(examples, positions)}:
    full-decode baseline   the ImageNet path before reduced decoding (lbjax's `decode='full'` until
                           this decoder): Pillow decodes to a numpy array (as TFDS's image feature
                           does), the window is resized from it by Pillow's antialiased bilinear
                           (`Image.fromarray(array).resize(box=window)`)
    ..., uint8 out         the same, without the host normalisation
    PIL draft              the previous reduced path (`pil_draft_decode`)
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top
  normalizer = _row_normalizer(imagenet.IMAGENET_MEAN_RGB, imagenet.IMAGENET_STDDEV_RGB, image_size)

  def full_train(encoded, rng):
    array = decode_in_full(encoded)
    window, flip = crops.train_window(array.shape[0], array.shape[1], rng)
    crop = pil_resize(Image.fromarray(array), window, image_size)
    return crop[:, ::-1] if flip else crop

  def draft_train(encoded, rng):
    window, flip = crops.train_window(*jpeg.image_size(encoded), rng)
    crop = pil_draft_decode(encoded, window, image_size)
    return crop[:, ::-1] if flip else crop

  def full_eval(encoded, rng):
    del rng
    array = decode_in_full(encoded)
    return pil_resize(Image.fromarray(array), crops.eval_window(*array.shape[:2], image_size),
                      image_size)

  def draft_eval(encoded, rng):
    del rng
    return pil_draft_decode(encoded, crops.eval_window(*jpeg.image_size(encoded), image_size),
                            image_size)

  def transform_of(crop, normalise=True):
    def transform(examples, positions):
      images = np.empty((len(positions), image_size, image_size, 3),
                        np.float32 if normalise else np.uint8)
      for i, (encoded, rng) in enumerate(zip(examples["image"],
                                             stream_lib.example_rngs(0, positions))):
        if normalise:
          _normalize_into(images[i], crop(encoded, rng), normalizer)
        else:
          images[i] = crop(encoded, rng)
      return {"images": images, "labels": np.asarray(examples["label"]).astype(np.int32)}
    return transform

  return {TRAIN_BASELINE: transform_of(full_train),
          TRAIN_BASELINE_UINT8: transform_of(full_train, normalise=False),
          "train PIL draft": transform_of(draft_train),
          EVAL_BASELINE: transform_of(full_eval),
          EVAL_BASELINE_UINT8: transform_of(full_eval, normalise=False),
          "eval PIL draft": transform_of(draft_eval)}


def without_region_decoding(function):
  """`function` run as lbjax runs where no TurboJPEG 3 library is found (simplejpeg decodes whole
  images): `libturbojpeg.decoder` answers None for the duration of the call."""
  def run():
    found = libturbojpeg.decoder
    libturbojpeg.decoder = lambda: None
    try:
      return function()
    finally:
      libturbojpeg.decoder = found
  return run


def train_regions(jpegs: list[bytes], image_size: int,
                  eighths: bool = False) -> list[tuple[int, tuple, tuple]]:
  """(DCT numerator, rows, columns) that the train transform decodes of each JPEG at position = its
  index (the windows of `crops.train_window`, as `jpeg.decode_resized_crop` maps them); with
  `eighths`, at the smallest M/8 (any M in 1..8, not only 8, 4, 2, 1) that leaves the crop at
  least `image_size` on both sides."""
  regions = []
  for position, encoded in enumerate(jpegs):
    height, width = jpeg.image_size(encoded)
    box, _ = crops.train_window(height, width, stream_lib.example_rngs(0, [position])[0])
    if eighths:
      numerator = next(m for m in range(1, 9)
                       if min(box.height, box.width) * m >= 8 * image_size or m == 8)
    else:
      numerator = jpeg.scaling_numerator(
          height, width, jpeg.dct_scale(box.height, box.width, image_size, image_size))
    window = crops.Box(*(edge / (8 / numerator) for edge in box))
    regions.append((numerator, *jpeg._support(  # pylint: disable=protected-access
        window, -(-height * numerator // 8), -(-width * numerator // 8))))
  return regions
