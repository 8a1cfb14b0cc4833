"""Reduced-size JPEG decoding: same crop windows and flips as the full-decode path, bounded error.

The bound tested: decoding at DCT scale 1/a and resizing the window differs from "decode in full,
crop, resize bilinearly" by a mean absolute error of at most 1.5x the difference between two
standard resamplers (bilinear vs bicubic) of the same full-size crop, and at most 4 levels of 255,
per crop; averaged over crops it is below the bilinear-vs-bicubic difference. At scale 1 the two
paths are bit-identical. Content is 1/f noise (natural-image spectrum), the hard case for aliasing.
"""

import io

import numpy as np
import pytest

pytest.importorskip("PIL")
from PIL import Image  # pylint: disable=g-import-not-at-top

from lbjax.data import imagenet  # pylint: disable=g-import-not-at-top
from lbjax.data import jpeg  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from lbjax.data import synthetic_jpeg  # pylint: disable=g-import-not-at-top
from tests.data import stream_checks  # pylint: disable=g-import-not-at-top


def _decode_full(encoded):
  return np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))


def _jpeg(rng, height, width):
  return synthetic_jpeg.encode_jpeg(synthetic_jpeg.pink_noise_image(rng, height, width))


def test_dct_scale_is_the_largest_that_covers_the_output():
  assert jpeg.dct_scale(224, 300, 224, 224) == 1
  assert jpeg.dct_scale(447, 900, 224, 224) == 1
  assert jpeg.dct_scale(448, 500, 224, 224) == 2
  assert jpeg.dct_scale(1000, 900, 224, 224) == 4
  assert jpeg.dct_scale(2000, 1800, 224, 224) == 8
  assert jpeg.dct_scale(100, 100, 224, 224) == 1  # Upsampling: decode in full.


def test_header_size_is_the_decoded_size():
  encoded = _jpeg(np.random.default_rng(0), 37, 53)
  assert jpeg.image_size(encoded) == (37, 53) == _decode_full(encoded).shape[:2]


def test_scale_one_is_bit_identical_to_the_full_decode_path():
  rng = np.random.default_rng(1)
  encoded = _jpeg(rng, 300, 260)
  full = _decode_full(encoded)
  for _ in range(5):
    box = imagenet.sample_crop_box(rng, 300, 260)
    np.testing.assert_array_equal(
        jpeg.decode_resized_crop(encoded, jpeg.Box(*box), (224, 224)),
        imagenet.crop_and_resize(full, box, (224, 224)))


def test_reduced_decode_differs_from_full_decode_by_resampling_error_only():
  rng = np.random.default_rng(2)
  errors, reference_errors, scales = [], [], []
  for _ in range(6):
    height, width = int(rng.integers(500, 1300)), int(rng.integers(500, 1300))
    encoded = _jpeg(rng, height, width)
    full = _decode_full(encoded)
    for size in (224, 112):
      box = imagenet.sample_crop_box(rng, height, width)
      scale = jpeg.dct_scale(box.height, box.width, size, size)
      if scale == 1:
        continue
      reduced = jpeg.decode_resized_crop(encoded, jpeg.Box(*box), (size, size)).astype(float)
      bilinear = imagenet.crop_and_resize(full, box, (size, size)).astype(float)
      bicubic = np.asarray(Image.fromarray(full).resize(
          (size, size), Image.Resampling.BICUBIC,
          box=(box.left, box.top, box.left + box.width, box.top + box.height))).astype(float)
      error, reference_error = np.abs(reduced - bilinear).mean(), np.abs(bicubic - bilinear).mean()
      assert error <= 4.0 and error <= 1.5 * reference_error, (scale, error, reference_error)
      errors.append(error)
      reference_errors.append(reference_error)
      scales.append(scale)
  assert len(set(scales)) >= 2  # Both 1/2 and 1/4 (or 1/8) were exercised.
  assert np.mean(errors) < np.mean(reference_errors)


def test_train_crops_of_bytes_and_arrays_have_the_same_windows_and_flips():
  # Channel 0 encodes the column, channel 1 the row (smooth, so JPEG keeps them): a crop's corner
  # values locate its window, and the column gradient's sign tells whether it was flipped.
  rng = np.random.default_rng(3)
  reduced_corners, full_corners = [], []
  for height, width in ((300, 380), (900, 1000), (1100, 700)):
    image = np.zeros((height, width, 3), np.uint8)
    image[..., 0] = np.linspace(20, 235, width)[None, :]
    image[..., 1] = np.linspace(20, 235, height)[:, None]
    encoded = synthetic_jpeg.encode_jpeg(image, quality=95)
    full = _decode_full(encoded)
    for position in range(100):
      reduced = imagenet.train_crop(encoded, stream.example_rngs(0, [position])[0], 56)
      decoded = imagenet.train_crop(full, stream.example_rngs(0, [position])[0], 56)
      reduced_corners.append(reduced[[0, -1]][:, [0, -1], :2].astype(float))
      full_corners.append(decoded[[0, -1]][:, [0, -1], :2].astype(float))
  reduced_corners, full_corners = np.array(reduced_corners), np.array(full_corners)
  # Every crop: the same window (corner values within a few levels, 1 level ~ 2-5 pixels here).
  assert np.abs(reduced_corners - full_corners).max() <= 4
  # Flips agree (sign of the column gradient) and occur about half the time.
  reduced_flips = reduced_corners[:, 0, 1, 0] < reduced_corners[:, 0, 0, 0]
  np.testing.assert_array_equal(reduced_flips, full_corners[:, 0, 1, 0] < full_corners[:, 0, 0, 0])
  assert 0.4 < reduced_flips.mean() < 0.6
  # And so the same statistics of position and extent over all samples.
  np.testing.assert_allclose(reduced_corners.mean(0), full_corners.mean(0), atol=0.5)
  np.testing.assert_allclose(reduced_corners.std(0), full_corners.std(0), atol=0.5)


def test_crop_windows_from_the_header_match_the_decoded_shape():
  rng = np.random.default_rng(4)
  for height, width in synthetic_jpeg.imagenet_like_sizes(rng, 5, large_fraction=0.5):
    encoded = synthetic_jpeg.encode_jpeg(np.zeros((height, width, 3), np.uint8))
    boxes = [imagenet.sample_crop_box(np.random.default_rng(seed), *jpeg.image_size(encoded))
             for seed in range(200)]
    assert boxes == [imagenet.sample_crop_box(np.random.default_rng(seed), height, width)
                     for seed in range(200)]


def test_eval_crop_of_bytes_matches_the_full_decode_path():
  rng = np.random.default_rng(5)
  for height, width in ((300, 400), (256, 256), (700, 1100)):
    encoded = _jpeg(rng, height, width)
    reduced = imagenet.eval_crop(encoded, 224).astype(float)
    full = imagenet.center_crop_eval(_decode_full(encoded), 224).astype(float)
    error = np.abs(reduced - full).mean()
    if min(height, width) < 2 * 256:  # Scale 1: the same window resized the same way.
      assert error < 0.01, error
    else:
      assert error < 4.0, error


def test_grayscale_and_png_are_decoded_to_rgb():
  gray = np.random.default_rng(6).integers(0, 256, (40, 50), dtype=np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(gray).save(buffer, format="JPEG", quality=95)
  out = jpeg.decode_resized_crop(buffer.getvalue(), jpeg.Box(0, 0, 40, 50), (8, 8))
  assert out.shape == (8, 8, 3) and np.array_equal(out[..., 0], out[..., 2])
  png = io.BytesIO()
  Image.fromarray(gray).save(png, format="PNG")
  np.testing.assert_array_equal(
      jpeg.decode_resized_crop(png.getvalue(), jpeg.Box(0, 0, 40, 50), (40, 50)),
      np.repeat(gray[..., None], 3, axis=-1))


def test_bad_input_is_rejected_with_a_clear_message():
  with pytest.raises(ValueError, match="cannot read an image"):
    jpeg.image_size(b"not a jpeg")
  encoded = _jpeg(np.random.default_rng(7), 20, 30)
  with pytest.raises(ValueError, match="does not lie inside the 20x30 image"):
    jpeg.decode_resized_crop(encoded, jpeg.Box(0, 0, 21, 30), (8, 8))


def test_stream_of_jpeg_bytes_is_deterministic_resumable_and_process_independent():
  encoded = synthetic_jpeg.imagenet_like_jpegs(12, seed=0, large_fraction=0.0)
  images = np.empty(12, dtype=object)
  images[:] = encoded
  source = stream.ArraySource(image=images, label=np.arange(12))
  transform = imagenet.imagenet_train_transform(seed=7, image_size=16, num_threads=2)
  stream_checks.check_augmented_stream(source, transform, seed=7, process_count=2, resume_after=2)
  evaluation = list(stream.eval_batches(source, 8, transform=imagenet.imagenet_eval_transform(
      image_size=16, num_threads=1)))
  assert evaluation[0]["images"].shape == (8, 16, 16, 3)
  np.testing.assert_array_equal(evaluation[1]["mask"], [1] * 4 + [0] * 4)
