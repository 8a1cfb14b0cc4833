"""Tests of the ImageNet pipeline: crop sampler bounds, eval crop values, determinism, mock TFDS."""

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("PIL")
pytest.importorskip("cv2")  # The [imagenet] extra: OpenCV resizes, simplejpeg decodes.
pytest.importorskip("simplejpeg")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from lbjax.data import cifar  # pylint: disable=g-import-not-at-top
from lbjax.data import crops  # pylint: disable=g-import-not-at-top
from lbjax.data import imagenet  # pylint: disable=g-import-not-at-top
from lbjax.data import normalization as normalization_lib  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from lbjax.data import tfds_source  # pylint: disable=g-import-not-at-top
from tests.data import stream_checks  # pylint: disable=g-import-not-at-top

_IMAGE_SIZE = 12


@pytest.fixture
def mock_imagenet():
  """Ten fake ImageNet examples of random sizes (TFDS code-generated mock, no files).

  The mock hands out decoded arrays; JPEG bytes (`decode="reduced"`) would need TensorFlow to
  encode them, so these tests read with `decode="full"`. The reduced path is tested on real JPEG
  bytes in test_jpeg.py.
  """
  with tfds.testing.mock_data(num_examples=10, policy=tfds.testing.MockPolicy.USE_CODE):
    yield


def test_train_batches_have_fixed_shape_and_dtypes(mock_imagenet):
  del mock_imagenet
  raw = tfds_source.TfdsSource("imagenet2012", split="train", num_threads=2).take(np.arange(10))
  assert set(raw) == {"image", "label"}
  assert raw["image"].dtype == object  # Ragged: one array per example.
  assert len({image.shape for image in raw["image"]}) > 1  # The mock images differ in size.
  train = imagenet.imagenet_train_stream(image_size=_IMAGE_SIZE, seed=0, num_threads=2,
                                        decode="full")
  batch = train.next_batch(4)
  assert set(batch) == {"images", "labels"}
  assert batch["images"].shape == (4, _IMAGE_SIZE, _IMAGE_SIZE, 3)
  assert batch["images"].dtype == np.uint8  # The step normalises on the device.
  assert batch["labels"].dtype == np.int32


def test_eval_batches_cover_split_once_with_padding_mask(mock_imagenet):
  del mock_imagenet
  batches = list(imagenet.imagenet_eval_batches(4, image_size=_IMAGE_SIZE, num_threads=1,
                                                decode="full"))
  assert len(batches) == 3  # ceil(10 / 4)
  for batch in batches:
    assert batch["images"].shape == (4, _IMAGE_SIZE, _IMAGE_SIZE, 3)
    assert batch["images"].dtype == np.uint8
    assert batch["labels"].dtype == np.int32
  np.testing.assert_array_equal(batches[-1]["mask"], [1, 1, 0, 0])
  again = list(imagenet.imagenet_eval_batches(4, image_size=_IMAGE_SIZE, num_threads=2,
                                              decode="full"))
  for first, second in zip(batches, again):
    np.testing.assert_array_equal(first["images"], second["images"])


def test_crop_box_sampler_obeys_area_and_aspect_bounds():
  height, width = 375, 500
  rng = np.random.default_rng(0)
  areas, ratios = [], []
  for _ in range(3000):
    box = crops.sample_crop_box(rng, height, width)
    assert 0 <= box.top and box.top + box.height <= height
    assert 0 <= box.left and box.left + box.width <= width
    # Sides are rounded to whole pixels, so each may be off by up to half a pixel.
    assert (box.height + 0.5) * (box.width + 0.5) >= 0.08 * height * width
    assert (box.height - 0.5) * (box.width - 0.5) <= height * width
    assert (box.width + 0.5) / (box.height - 0.5) >= 3 / 4
    assert (box.width - 0.5) / (box.height + 0.5) <= 4 / 3
    areas.append(box.height * box.width / (height * width))
    ratios.append(box.width / box.height)
  # The draws fill the allowed ranges, not one corner of them.
  assert min(areas) < 0.1 and max(areas) > 0.9
  assert min(ratios) < 0.78 and max(ratios) > 1.28
  # Log-uniform aspect ratio: median near 1.
  assert 0.95 < np.median(ratios) < 1.05


def test_crop_box_sampler_falls_back_to_central_crop():
  # No window with >= 8% of the area and aspect in [3/4, 4/3] fits an 8x400 strip.
  box = crops.sample_crop_box(np.random.default_rng(0), 8, 400)
  assert box == crops.Box(top=0, left=196, height=7, width=7)  # 7 = round(8 * 224 / 256)
  assert crops.sample_crop_box(np.random.default_rng(0), 50, 60, max_attempts=0) == (
      crops.central_square(50, 60, 224 / 256))


def test_random_resized_crop_resizes_the_sampled_box():
  image = np.random.default_rng(1).integers(0, 256, (40, 30, 3), dtype=np.uint8)
  out = imagenet.random_resized_crop(image, np.random.default_rng(5), 16)
  box = crops.sample_crop_box(np.random.default_rng(5), 40, 30)
  assert out.shape == (16, 16, 3) and out.dtype == np.uint8
  np.testing.assert_array_equal(out, imagenet.crop_and_resize(image, box, (16, 16)))
  # The whole image with its own aspect ratio: the crop is the image itself.
  whole = imagenet.random_resized_crop(image[:30], np.random.default_rng(0), 30,
                                       area_range=(1.0, 1.0), aspect_ratio_range=(1.0, 1.0))
  np.testing.assert_array_equal(whole, image[:30])


def test_random_flip_mirrors_half_the_time():
  image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
  flipped = 0
  for seed in range(400):
    out = imagenet.random_flip_left_right(image, np.random.default_rng(seed))
    if np.array_equal(out, image[:, ::-1]):
      flipped += 1
    else:
      np.testing.assert_array_equal(out, image)
  assert 160 < flipped < 240


def test_center_crop_eval_takes_the_exact_central_window():
  image = np.random.default_rng(0).integers(0, 256, (18, 30, 3), dtype=np.uint8)
  # Shorter side already equals resize_size: no resampling, a pure central slice.
  out = imagenet.center_crop_eval(image, 16, resize_size=18)
  np.testing.assert_array_equal(out, image[1:17, 7:23])


def test_center_crop_eval_of_a_gradient():
  # Channel 0 grows by 4 per column, channel 1 by 4 per row. Halving the size averages pixel
  # pairs (2j, 2j + 1), so resized column j holds 4 * (2j + 0.5) = 8j + 2; the central 14x14
  # crop of the 16x32 resized image starts at row 1, column 9.
  image = np.zeros((32, 64, 3), np.uint8)
  image[..., 0] = 4 * np.arange(64)[None, :]
  image[..., 1] = 4 * np.arange(32)[:, None]
  out = imagenet.center_crop_eval(image, 14, resize_size=16)
  expected_columns = 8 * (np.arange(14) + 9) + 2
  expected_rows = 8 * (np.arange(14) + 1) + 2
  np.testing.assert_array_equal(out[..., 0], np.broadcast_to(expected_columns[None, :], (14, 14)))
  np.testing.assert_array_equal(out[..., 1], np.broadcast_to(expected_rows[:, None], (14, 14)))
  np.testing.assert_array_equal(out[..., 2], 0)


def test_center_crop_eval_default_resize_is_256_for_224():
  # A 256-pixel shorter side needs no resize; the output is the central 224 window.
  image = np.random.default_rng(0).integers(0, 256, (256, 300, 3), dtype=np.uint8)
  np.testing.assert_array_equal(imagenet.center_crop_eval(image, 224), image[16:240, 38:262])


def test_normalization_uses_imagenet_statistics():
  mean = np.array(imagenet.IMAGENET_MEAN_RGB)
  std = np.array(imagenet.IMAGENET_STDDEV_RGB)
  np.testing.assert_allclose(mean, [123.675, 116.28, 103.53])
  np.testing.assert_allclose(std, [58.395, 57.12, 57.375])
  images = (mean + np.array([-1.0, 0.0, 2.0])[:, None] * std).reshape(3, 1, 1, 3)
  out = normalization_lib.normalize_images(images, imagenet.IMAGENET_MEAN_RGB, imagenet.IMAGENET_STDDEV_RGB)
  assert out.dtype == np.float32
  np.testing.assert_allclose(out[:, 0, 0], np.broadcast_to([[-1.0], [0.0], [2.0]], (3, 3)),
                             atol=1e-6)
  # The eval transform keeps a constant image's uint8 pixels; the device normalisation maps them
  # to the constant (value - mean) / std.
  constant = np.full((20, 24, 3), [200, 100, 50], np.uint8)
  examples = {"image": np.stack([constant]), "label": np.array([3])}
  batch = imagenet.imagenet_eval_transform(image_size=8, num_threads=1)(examples, np.arange(1))
  np.testing.assert_array_equal(batch["images"][0], np.broadcast_to([200, 100, 50], (8, 8, 3)))
  np.testing.assert_allclose(imagenet.IMAGENET_NORMALIZATION(batch["images"])[0], np.broadcast_to(
      (np.array([200, 100, 50]) - mean) / std, (8, 8, 3)), rtol=1e-6)
  np.testing.assert_array_equal(batch["labels"], [3])


@pytest.mark.parametrize("normalization", ["imagenet", "cifar10"])
def test_device_normalization_equals_the_host_normalisation(normalization):
  """The normalisation the step runs on the device (jitted) gives the host path's float32 values."""
  normalization = {"imagenet": imagenet.IMAGENET_NORMALIZATION,
                   "cifar10": cifar.CIFAR10_NORMALIZATION}[normalization]
  images = np.random.default_rng(0).integers(0, 256, (4, 16, 12, 3), dtype=np.uint8)
  images[0, 0, 0] = [0, 255, 128]
  host = normalization_lib.normalize_images(images, normalization.mean, normalization.stddev)
  device = np.asarray(jax.jit(normalization)(jnp.asarray(images)))
  assert device.dtype == np.float32
  np.testing.assert_allclose(device, host, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(normalization(images), host)  # numpy: the same float32 operations


def test_normalization_refuses_bad_statistics_and_channel_counts():
  with pytest.raises(ValueError, match="one mean and one stddev per channel"):
    normalization_lib.Normalization((1.0, 2.0), (1.0,))
  with pytest.raises(ValueError, match="stddev must be positive"):
    normalization_lib.Normalization((1.0,), (0.0,))
  with pytest.raises(ValueError, match="images have 1 channels"):
    imagenet.IMAGENET_NORMALIZATION(np.zeros((2, 2, 1), np.uint8))


def _ragged_source(num_examples=12):
  rng = np.random.default_rng(0)
  images = np.empty(num_examples, dtype=object)
  images[:] = [rng.integers(0, 256, (rng.integers(10, 30), rng.integers(10, 30), 3),
                            dtype=np.uint8) for _ in range(num_examples)]
  return stream.ArraySource(image=images, label=np.arange(num_examples))


def test_augmentation_is_deterministic_resumable_and_process_independent():
  source = _ragged_source()
  transform = imagenet.imagenet_train_transform(seed=7, image_size=8, num_threads=2)
  stream_checks.check_augmented_stream(source, transform, seed=7, process_count=2, resume_after=2)
  other = stream.TrainStream(source, seed=8, shuffle=False,
                             transform=imagenet.imagenet_train_transform(seed=8, image_size=8))
  unshuffled = stream.TrainStream(source, seed=7, shuffle=False, transform=transform)
  assert not np.array_equal(other.next_batch(8)["images"], unshuffled.next_batch(8)["images"])


def test_missing_dataset_error_names_dataset_dir_and_build_command(tmp_path):
  with pytest.raises(FileNotFoundError) as error:
    imagenet.imagenet_train_stream(data_dir=tmp_path, seed=0)
  message = str(error.value)
  assert "imagenet2012" in message and str(tmp_path) in message
  assert "tfds build imagenet2012 --manual_dir=" in message
  assert "image-net.org" in message


def test_bad_arguments_are_rejected_before_reading():
  with pytest.raises(ValueError, match="image_size"):
    imagenet.imagenet_train_transform(seed=0, image_size=0)
  with pytest.raises(ValueError, match="seed"):
    imagenet.imagenet_train_transform(seed=-1)
  with pytest.raises(ValueError, match="num_threads"):
    imagenet.imagenet_eval_transform(num_threads=0)
  with pytest.raises(ValueError, match="area_range"):
    crops.sample_crop_box(np.random.default_rng(0), 10, 10, area_range=(0.5, 0.1))
  with pytest.raises(ValueError, match="resize_size"):
    imagenet.center_crop_eval(np.zeros((8, 8, 3), np.uint8), 8, resize_size=4)
  with pytest.raises(ValueError, match="uint8"):
    imagenet.center_crop_eval(np.zeros((8, 8, 3), np.float32), 4)


def test_the_not_prepared_message_of_a_dataset_with_a_config_names_the_data_dir_given(tmp_path):
  """`<data_dir>/<name>/<config>/<version>`: the message named `<data_dir>/<name>` and a build command there."""
  data_dir = tmp_path / "tfds"
  with pytest.raises(FileNotFoundError) as error:
    tfds_source.TfdsSource("imagenet2012_subset/1pct", split="train", data_dir=data_dir)
  assert f"data_dir='{data_dir}'" in str(error.value) and f"--data_dir={data_dir}`" in str(error.value)
