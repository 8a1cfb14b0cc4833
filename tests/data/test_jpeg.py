"""Reduced-size JPEG decoding: same crop windows and flips as the full-decode path, bounded error.

Every test of `decode_resized_crop` and the transforms runs twice (fixture `jpeg_decoder`): with
libturbojpeg's region decoding (skipped where no libturbojpeg with the TurboJPEG 3 API is found) and
with simplejpeg's whole decode (the fallback). The region decoder itself is tested to give the same
pixels as a whole decode at every DCT scale.

The bounds tested, per crop, as mean absolute errors on the 0-255 scale, against the original
full-decode path (Pillow decodes in full, then an antialiased bilinear resize of the crop):
  - at DCT scale 1 the reduced path is bit-identical to the full-decode path of the library
    (Pillow decode, `imagenet.crop_and_resize`): only the resampler differs from the original;
  - every crop is no farther from the original than OpenCV's bilinear resize of the full decode
    (no antialiasing: what TF's reference pipeline computes) is;
  - at DCT scales 1/2 to 1/8, where the DCT downscale antialiases, it is at most 0.75x as far.
Content is 1/f noise (natural-image spectrum), the hard case for aliasing.
"""

import ctypes.util
import importlib.util
import io
import sys

import numpy as np
import pytest

pytest.importorskip("PIL")
cv2 = pytest.importorskip("cv2")
pytest.importorskip("simplejpeg")
from PIL import Image  # pylint: disable=g-import-not-at-top

from lbjax.data import crops  # pylint: disable=g-import-not-at-top
from lbjax.data import imagenet  # pylint: disable=g-import-not-at-top
from lbjax.data import jpeg  # pylint: disable=g-import-not-at-top
from lbjax.data import libturbojpeg  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from lbjax.data import synthetic_jpeg  # pylint: disable=g-import-not-at-top
from tests.data import stream_checks  # pylint: disable=g-import-not-at-top


@pytest.fixture(params=["region", "whole"])
def jpeg_decoder(request, monkeypatch):
  """Runs a test with libturbojpeg's region decoding and with simplejpeg's whole decode."""
  if request.param == "region":
    if libturbojpeg.decoder() is None:
      pytest.skip("no libturbojpeg with the TurboJPEG 3 API (pip install 'lbjax[turbojpeg]')")
  else:
    monkeypatch.setattr(libturbojpeg, "decoder", lambda: None)
  return request.param


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


def test_scale_one_is_bit_identical_to_the_full_decode_path(jpeg_decoder):
  rng = np.random.default_rng(1)
  encoded = _jpeg(rng, 300, 260)
  full = _decode_full(encoded)
  for _ in range(5):
    box = crops.sample_crop_box(rng, 300, 260)
    np.testing.assert_array_equal(
        jpeg.decode_resized_crop(encoded, crops.Box(*box), (224, 224)),
        imagenet.crop_and_resize(full, box, (224, 224)))


def _original_resize(full, box, size):
  """The resize of the original full-decode path: Pillow's antialiased bilinear."""
  return np.asarray(Image.fromarray(full).resize(
      (size, size), Image.Resampling.BILINEAR,
      box=(box.left, box.top, box.left + box.width, box.top + box.height))).astype(float)


def test_reduced_decode_differs_from_full_decode_by_resampling_error_only(jpeg_decoder):
  rng = np.random.default_rng(2)
  scales = []
  for _ in range(6):
    height, width = int(rng.integers(500, 1300)), int(rng.integers(500, 1300))
    encoded = _jpeg(rng, height, width)
    full = _decode_full(encoded)
    for size in (224, 112):
      box = crops.sample_crop_box(rng, height, width)
      scale = jpeg.dct_scale(box.height, box.width, size, size)
      reduced = jpeg.decode_resized_crop(encoded, crops.Box(*box), (size, size)).astype(float)
      original = _original_resize(full, box, size)
      crop = full[box.top:box.top + box.height, box.left:box.left + box.width]
      tf_like = cv2.resize(crop, (size, size), interpolation=cv2.INTER_LINEAR).astype(float)
      error, tf_error = np.abs(reduced - original).mean(), np.abs(tf_like - original).mean()
      if scale == 1:
        np.testing.assert_array_equal(reduced, imagenet.crop_and_resize(full, box, (size, size)))
      else:
        assert error <= 0.75 * tf_error, (scale, error, tf_error)
      assert error <= tf_error + 1e-9, (scale, error, tf_error)
      scales.append(scale)
  assert {1, 2, 4} <= set(scales)


def test_decoded_size_is_the_chosen_dct_scale():
  # libjpeg-turbo scales by M/8; the window mapping assumes the M `scaling_numerator` predicts.
  for height, width in ((4, 5), (7, 3), (9, 17), (31, 41), (300, 400), (1001, 777)):
    encoded = synthetic_jpeg.encode_jpeg(np.zeros((height, width, 3), np.uint8))
    for scale in jpeg.DCT_SCALES:
      pixels, step = jpeg.decode(encoded, scale)
      numerator = jpeg.scaling_numerator(height, width, scale)
      assert step == 8 / numerator
      assert pixels.shape == (-(-height * numerator // 8), -(-width * numerator // 8), 3)
      if height >= 8 * scale and width >= 8 * scale:
        assert numerator == 8 // scale


def test_resize_window_samples_bilinearly_at_fractional_edges():
  # Bilinear interpolation of a linear ramp is exact: output column j of a window starting at
  # `left` with `step` input pixels per output pixel reads 2 * (left + (j + 0.5) * step - 0.5).
  image = np.zeros((60, 120, 3), np.uint8)
  image[..., 0] = 2 * np.arange(120)[None, :]
  window = crops.Box(10.25, 20.6, 30.5, 61.3)
  out = jpeg.resize_window(image, window, (20, 40))
  step = window.width / 40
  expected = 2 * (window.left + (np.arange(40) + 0.5) * step - 0.5)
  np.testing.assert_allclose(out[..., 0], np.broadcast_to(expected, (20, 40)), atol=1.0)
  # Whole-pixel edges: OpenCV's resize of the window; the output's size: the window itself.
  np.testing.assert_array_equal(jpeg.resize_window(image, crops.Box(5, 7, 30, 50), (20, 40)),
                                cv2.resize(image[5:35, 7:57], (40, 20)))
  np.testing.assert_array_equal(jpeg.resize_window(image, crops.Box(5, 7, 20, 40), (20, 40)),
                                image[5:25, 7:47])


def _bilinear(image, window, size):
  """float64 bilinear sampling of `window` at OpenCV's pixel centres, edges replicated."""
  def taps(start, extent, count, limit):
    coordinates = np.clip(start + (np.arange(count) + 0.5) * extent / count - 0.5, 0, limit - 1)
    low = np.floor(coordinates).astype(int)
    return low, np.minimum(low + 1, limit - 1), coordinates - low
  (r0, r1, fr), (c0, c1, fc) = (taps(window.top, window.height, size[0], image.shape[0]),
                                taps(window.left, window.width, size[1], image.shape[1]))
  rows = image[r0] * (1 - fr)[:, None, None] + image[r1] * fr[:, None, None]
  return rows[:, c0] * (1 - fc)[None, :, None] + rows[:, c1] * fc[None, :, None]


def test_eval_windows_resample_as_the_resized_image_cropped_within_a_level_of_exact():
  # An eval window's edges are whole steps from the origin: resize_window takes the centre of
  # cv2.resize of the image by 1 / step instead of cv2.warpAffine of the window (2x faster).
  # Bound tested: the same pixels as resizing the whole image to the resize size and cropping
  # its centre (the definition of the eval crop), under 1 level from float64 bilinear sampling
  # (OpenCV's 11-bit resize weights; measured up to 0.81) and at most 1 level from warpAffine.
  rng = np.random.default_rng(3)
  tested = 0
  for size in (224, 128, 12):
    for _ in range(8):
      height, width = (int(n) for n in rng.integers(size + 1, 3 * size, 2))
      image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)  # worst case: noise
      window = crops.eval_window(height, width, size)
      if (all(float(edge).is_integer() for edge in window)
          or min(window.height, window.width) >= 2 * size):  # Whole pixels; area averaging.
        continue
      tested += 1
      out = jpeg.resize_window(image, window, (size, size))
      assert out.shape == (size, size, 3) and out.dtype == np.uint8
      resize = round(size * crops.EVAL_RESIZE_RATIO)
      scale = resize / min(height, width)
      new_height, new_width = max(resize, round(height * scale)), max(resize, round(width * scale))
      top, left = (new_height - size) // 2, (new_width - size) // 2
      whole = cv2.resize(image, (new_width, new_height), interpolation=cv2.INTER_LINEAR)
      np.testing.assert_array_equal(out, whole[top:top + size, left:left + size])
      assert np.abs(out - _bilinear(image.astype(float), window, (size, size))).max() < 1
      step_y, step_x = window.height / size, window.width / size
      warped = cv2.warpAffine(image, np.array([[step_x, 0, window.left + 0.5 * step_x - 0.5],
                                               [0, step_y, window.top + 0.5 * step_y - 0.5]]),
                              (size, size), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_REPLICATE)
      assert np.abs(out.astype(int) - warped).max() <= 1
  assert tested >= 16


def test_train_crops_of_bytes_and_arrays_have_the_same_windows_and_flips(jpeg_decoder):
  # Channel 0 encodes the column, channel 1 the row (smooth, so JPEG keeps them): a crop's corner
  # values locate its window, and the column gradient's sign tells whether it was flipped.
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


def test_transforms_write_into_the_batch_what_the_single_crops_return(jpeg_decoder):
  # The transforms resize (and flip in place) straight into the batch's slots; the single-example
  # functions return new arrays: the same pixels, for bytes and decoded arrays, flipped or not.
  encoded = synthetic_jpeg.imagenet_like_jpegs(8, seed=1, large_fraction=0.5)
  positions = np.arange(8)
  for images in (encoded, [_decode_full(e) for e in encoded]):
    examples = {"image": np.empty(len(images), dtype=object), "label": np.zeros(len(images))}
    examples["image"][:] = images
    train = imagenet.imagenet_train_transform(seed=5, image_size=64, num_threads=2)
    batch = train(examples, positions)["images"]
    rngs = stream.example_rngs(5, positions)
    np.testing.assert_array_equal(
        batch, [imagenet.train_crop(image, rng, 64) for image, rng in zip(images, rngs)])
    sizes = [jpeg.image_size(image) if isinstance(image, bytes) else image.shape[:2]
             for image in images]
    flips = [crops.train_window(*size, rng)[1]
             for size, rng in zip(sizes, stream.example_rngs(5, positions))]
    assert 0 < sum(flips) < len(flips)  # Both branches taken.
    evaluation = imagenet.imagenet_eval_transform(image_size=64, num_threads=1)
    np.testing.assert_array_equal(evaluation(examples, positions)["images"],
                                  [imagenet.eval_crop(image, 64) for image in images])


def test_an_output_buffer_of_another_shape_or_layout_is_refused(jpeg_decoder):
  encoded = _jpeg(np.random.default_rng(11), 40, 50)
  box = crops.Box(0, 0, 40, 50)
  for out in (np.empty((8, 9, 3), np.uint8), np.empty((8, 8, 3), np.float32),
              np.empty((8, 16, 3), np.uint8)[:, ::2], [[0] * 3] * 64):
    with pytest.raises(ValueError, match=r"out must be a writeable C-contiguous uint8 array of "
                                         r"shape \(8, 8, 3\)"):
      jpeg.decode_resized_crop(encoded, box, (8, 8), out=out)
  out = np.zeros((8, 8, 3), np.uint8)
  assert jpeg.decode_resized_crop(encoded, box, (8, 8), flip=True, out=out) is out
  np.testing.assert_array_equal(out, jpeg.decode_resized_crop(encoded, box, (8, 8))[:, ::-1])


def test_crop_windows_from_the_header_match_the_decoded_shape():
  rng = np.random.default_rng(4)
  for height, width in synthetic_jpeg.imagenet_like_sizes(rng, 5, large_fraction=0.5):
    encoded = synthetic_jpeg.encode_jpeg(np.zeros((height, width, 3), np.uint8))
    boxes = [crops.sample_crop_box(np.random.default_rng(seed), *jpeg.image_size(encoded))
             for seed in range(200)]
    assert boxes == [crops.sample_crop_box(np.random.default_rng(seed), height, width)
                     for seed in range(200)]


def test_eval_crop_of_bytes_matches_the_full_decode_path(jpeg_decoder):
  rng = np.random.default_rng(5)
  for height, width in ((300, 400), (256, 256), (700, 1100)):
    encoded = _jpeg(rng, height, width)
    reduced = imagenet.eval_crop(encoded, 224)
    full = imagenet.center_crop_eval(_decode_full(encoded), 224)
    if min(height, width) < 2 * 256:  # Scale 1: the same window resized the same way.
      np.testing.assert_array_equal(reduced, full)
    else:
      assert np.abs(reduced.astype(float) - full).mean() < 5.0


def test_grayscale_cmyk_and_png_are_decoded_to_rgb(jpeg_decoder):
  gray = np.random.default_rng(6).integers(0, 256, (40, 50), dtype=np.uint8)
  buffer = io.BytesIO()
  Image.fromarray(gray).save(buffer, format="JPEG", quality=95)
  out = jpeg.decode_resized_crop(buffer.getvalue(), crops.Box(0, 0, 40, 50), (8, 8))
  assert out.shape == (8, 8, 3) and np.array_equal(out[..., 0], out[..., 2])
  cmyk = io.BytesIO()  # libjpeg-turbo does not convert CMYK to RGB; Pillow decodes it.
  Image.fromarray(np.stack([gray] * 3, -1)).convert("CMYK").save(cmyk, format="JPEG", quality=95)
  assert jpeg.image_size(cmyk.getvalue()) == (40, 50)
  np.testing.assert_array_equal(
      jpeg.decode_resized_crop(cmyk.getvalue(), crops.Box(0, 0, 40, 50), (40, 50)),
      np.asarray(Image.open(io.BytesIO(cmyk.getvalue())).convert("RGB")))
  png = io.BytesIO()
  Image.fromarray(gray).save(png, format="PNG")
  np.testing.assert_array_equal(
      jpeg.decode_resized_crop(png.getvalue(), crops.Box(0, 0, 40, 50), (40, 50)),
      np.repeat(gray[..., None], 3, axis=-1))


def test_bad_input_is_rejected_with_a_clear_message(jpeg_decoder, monkeypatch):
  with pytest.raises(ValueError, match="cannot read an image"):
    jpeg.image_size(b"not a jpeg")
  with pytest.raises(ValueError, match="cannot read an image"):
    jpeg.image_size(b"\xff\xd8\xff truncated")
  encoded = _jpeg(np.random.default_rng(7), 20, 30)
  with pytest.raises(ValueError, match="does not lie inside the 20x30 image"):
    jpeg.decode_resized_crop(encoded, crops.Box(0, 0, 21, 30), (8, 8))
  truncated = _jpeg(np.random.default_rng(8), 200, 300)[:-2000]
  # Whichever rows the window holds: a region decode of the top rows reads no byte near the cut.
  for window in (crops.Box(100, 0, 100, 300), crops.Box(0, 0, 16, 16)):
    with pytest.raises(ValueError, match="Premature end of JPEG file"):
      jpeg.decode_resized_crop(truncated, window, (8, 8))
  monkeypatch.setitem(sys.modules, "simplejpeg", None)  # As if the [imagenet] extra were missing.
  with pytest.raises(ImportError, match=r"pip install 'lbjax\[imagenet\]'"):
    imagenet.imagenet_train_transform(seed=0)


def test_bytes_after_the_end_of_image_change_no_pixel(jpeg_decoder):
  encoded = _jpeg(np.random.default_rng(9), 64, 96)
  trailing = encoded + b"\xff\xda bytes after the end-of-image marker"
  for window in (crops.Box(0, 0, 16, 16), crops.Box(8, 40, 50, 50)):
    np.testing.assert_array_equal(jpeg.decode_resized_crop(trailing, window, (8, 8)),
                                  jpeg.decode_resized_crop(encoded, window, (8, 8)))


def test_padding_before_the_end_of_image_is_decoded_and_a_corrupt_scan_before_it_is_not(jpeg_decoder):
  """libjpeg's "extraneous bytes before marker 0xd9" (bytes after the last scan, common in photo datasets)
  costs no pixel: the image decodes as without them (it was refused as undecodable). A corrupt scan that
  comes before such padding stays refused, whichever warning the decoder reports last."""
  encoded = _jpeg(np.random.default_rng(10), 64, 96)
  padded = encoded[:-2] + bytes(240) + b"\xff\xd9"
  middle = len(padded) // 2
  corrupt = padded[:middle] + b"\xff\xd5" + padded[middle + 2:]  # a restart marker where none belongs
  for window in (crops.Box(0, 0, 16, 16), crops.Box(40, 0, 24, 96)):
    np.testing.assert_array_equal(jpeg.decode_resized_crop(padded, window, (8, 8)),
                                  jpeg.decode_resized_crop(encoded, window, (8, 8)))
    with pytest.raises(jpeg.DecodeError, match="Corrupt JPEG data: premature end of data segment"):
      jpeg.decode_resized_crop(corrupt, window, (8, 8))
  np.testing.assert_array_equal(jpeg.decode(padded, 2)[0], jpeg.decode(encoded, 2)[0])


def test_stream_of_jpeg_bytes_is_deterministic_resumable_and_process_independent(jpeg_decoder):
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


@pytest.mark.parametrize("subsampling", [0, 1, 2])  # Pillow: 4:4:4, 4:2:2, 4:2:0.
def test_region_decode_is_bit_identical_to_the_whole_decode_at_every_scale(subsampling):
  region_decoder = libturbojpeg.decoder()
  if region_decoder is None:
    pytest.skip("no libturbojpeg with the TurboJPEG 3 API (pip install 'lbjax[turbojpeg]')")
  rng = np.random.default_rng(9)
  images = [synthetic_jpeg.pink_noise_image(rng, 613, 901), np.zeros((37, 53, 3), np.uint8)]
  gray = io.BytesIO()
  Image.fromarray(images[0][..., 0]).save(gray, format="JPEG", quality=90)
  encodings = [gray.getvalue()]
  for image in images:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="JPEG", quality=90, subsampling=subsampling)
    encodings.append(buffer.getvalue())
  for encoded in encodings:
    for scale in jpeg.DCT_SCALES:
      whole, _ = jpeg.decode(encoded, scale)
      numerator = jpeg.scaling_numerator(*jpeg.image_size(encoded), scale)
      height, width = whole.shape[:2]
      windows = [((0, height), (0, width)), ((height - 1, height), (width - 1, width))]
      for _ in range(12):  # Random windows, all left edges, cut anywhere.
        top, left = int(rng.integers(0, height)), int(rng.integers(0, width))
        windows.append(((top, int(rng.integers(top + 1, height + 1))),
                        (left, int(rng.integers(left + 1, width + 1)))))
      for rows, columns in windows:
        np.testing.assert_array_equal(
            region_decoder.decode(encoded, numerator, rows, columns),
            whole[rows[0]:rows[1], columns[0]:columns[1]], err_msg=f"{scale} {rows} {columns}")
  with pytest.raises(ValueError, match=r"not inside the 37x53 image decoded at scale 8/8"):
    region_decoder.decode(encodings[-1], 8, (0, 38), (0, 53))


def test_without_a_turbojpeg3_library_the_transforms_decode_with_simplejpeg(monkeypatch, tmp_path):
  encoded = _jpeg(np.random.default_rng(10), 120, 160)
  expected = imagenet.crop_and_resize(_decode_full(encoded), crops.Box(10, 20, 90, 100),
                                      (56, 56))  # DCT scale 1.
  try:
    for library, reason in ((tmp_path / "missing.so", "cannot open shared object file"),
                            (ctypes.util.find_library("c"), "no TurboJPEG 3 API")):
      monkeypatch.setenv(libturbojpeg.ENVIRONMENT_VARIABLE, str(library))
      libturbojpeg.decoder.cache_clear()
      with pytest.MonkeyPatch.context() as patch:
        logged = []
        patch.setattr(libturbojpeg.logging, "info", lambda *args: logged.append(args[0] % args[1:]))
        assert libturbojpeg.decoder() is None and libturbojpeg.decoder() is None
      assert len(logged) == 1 and reason in logged[0] and "simplejpeg" in logged[0], logged
      np.testing.assert_array_equal(
          jpeg.decode_resized_crop(encoded, crops.Box(10, 20, 90, 100), (56, 56)), expected)
  finally:
    monkeypatch.undo()
    libturbojpeg.decoder.cache_clear()


def test_the_turbojpeg_wheel_is_found_by_its_import_name_not_its_files(monkeypatch):
  """Without a system libturbojpeg, the `turbojpeg` wheel's extension module is loaded by ctypes (it links
  libturbojpeg, where the dynamic linker finds the tj3 functions), wherever the wheel keeps the library."""
  spec = importlib.util.find_spec("turbojpeg")
  if spec is None:
    pytest.skip("the turbojpeg wheel (lbjax[turbojpeg]) is not installed")
  monkeypatch.delenv(libturbojpeg.ENVIRONMENT_VARIABLE, raising=False)
  monkeypatch.setattr(libturbojpeg.ctypes.util, "find_library", lambda name: None)
  libturbojpeg.decoder.cache_clear()
  try:
    region_decoder = libturbojpeg.decoder()
    assert region_decoder is not None and region_decoder.path == spec.origin
    encoded = _jpeg(np.random.default_rng(11), 40, 48)
    np.testing.assert_array_equal(region_decoder.decode(encoded, 8, (0, 40), (0, 48)), _decode_full(encoded))
  finally:
    monkeypatch.undo()
    libturbojpeg.decoder.cache_clear()
