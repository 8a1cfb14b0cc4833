"""Tests of the CIFAR-10 pipeline: pad-crop-flip values, statistics, determinism, mock TFDS."""

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from lbjax.data import cifar  # pylint: disable=g-import-not-at-top
from lbjax.data import tfds_source  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from tests.data import stream_checks  # pylint: disable=g-import-not-at-top


@pytest.fixture
def mock_cifar10():
  """Ten fake CIFAR-10 examples (TFDS code-generated mock, no files)."""
  with tfds.testing.mock_data(num_examples=10, policy=tfds.testing.MockPolicy.USE_CODE):
    yield


def _reference_pad_crop_flip(image, offset, flip, padding):
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  height, width = image.shape[:2]
  crop = padded[offset[0]:offset[0] + height, offset[1]:offset[1] + width]
  return crop[:, ::-1] if flip else crop


def test_train_and_eval_batches_shapes_under_mock_data(mock_cifar10):
  del mock_cifar10
  batch = cifar.cifar10_train_stream(seed=0, num_threads=2).next_batch(4)
  assert set(batch) == {"images", "labels"}
  assert batch["images"].shape == (4, 32, 32, 3) and batch["images"].dtype == np.uint8
  assert batch["labels"].shape == (4,) and batch["labels"].dtype == np.int32
  batches = list(cifar.cifar10_eval_batches(4, num_threads=1))
  assert len(batches) == 3  # ceil(10 / 4)
  assert all(b["images"].shape == (4, 32, 32, 3) for b in batches)
  np.testing.assert_array_equal(batches[-1]["mask"], [1, 1, 0, 0])


def test_eval_is_the_images_then_normalisation_on_the_device(mock_cifar10):
  del mock_cifar10
  raw = tfds_source.TfdsSource("cifar10", split="test", num_threads=1).take(np.arange(4))
  assert raw["image"].dtype == np.uint8 and raw["image"].shape == (4, 32, 32, 3)
  batch = next(cifar.cifar10_eval_batches(4))
  np.testing.assert_array_equal(batch["images"], raw["image"])
  expected = (raw["image"] - np.array(cifar.CIFAR10_MEAN_RGB)) / np.array(cifar.CIFAR10_STDDEV_RGB)
  np.testing.assert_allclose(cifar.CIFAR10_NORMALIZATION(batch["images"]), expected, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_array_equal(batch["labels"], raw["label"])


def test_pad_crop_flip_matches_per_example_reference():
  rng = np.random.default_rng(0)
  images = rng.integers(1, 256, (16, 32, 32, 3), dtype=np.uint8)
  offsets = rng.integers(0, 9, (16, 2))
  flips = rng.random(16) < 0.5
  out = cifar.pad_crop_flip(images, offsets, flips)
  assert out.shape == images.shape and out.dtype == np.uint8
  for i in range(16):
    np.testing.assert_array_equal(out[i], _reference_pad_crop_flip(images[i], offsets[i],
                                                                   flips[i], 4))


def test_pad_crop_flip_special_offsets():
  image = np.random.default_rng(1).integers(1, 256, (1, 32, 32, 3), dtype=np.uint8)
  centred = cifar.pad_crop_flip(image, np.array([[4, 4]]), np.array([False]))
  np.testing.assert_array_equal(centred, image)
  mirrored = cifar.pad_crop_flip(image, np.array([[4, 4]]), np.array([True]))
  np.testing.assert_array_equal(mirrored, image[:, :, ::-1])
  corner = cifar.pad_crop_flip(image, np.array([[0, 8]]), np.array([False]))
  assert np.all(corner[0, :4] == 0) and np.all(corner[0, :, -4:] == 0)  # Zero padding.
  np.testing.assert_array_equal(corner[0, 4:, :-4], image[0, :-4, 4:])


def test_offsets_cover_all_shifts_and_flip_half():
  rngs = stream.example_rngs(0, np.arange(900))
  offsets, flips = cifar.sample_crop_offsets_and_flips(rngs)
  assert offsets.min() == 0 and offsets.max() == 8
  assert set(map(tuple, offsets.tolist())) == {(r, c) for r in range(9) for c in range(9)}
  assert 0.43 < flips.mean() < 0.57


def test_normalisation_statistics():
  mean = np.array(cifar.CIFAR10_MEAN_RGB)
  std = np.array(cifar.CIFAR10_STDDEV_RGB)
  np.testing.assert_allclose(mean, [125.307, 122.961, 113.8575], atol=1e-3)
  np.testing.assert_allclose(std, [62.985, 62.0925, 66.708], atol=1e-3)
  # uint8 pixels at round(mean + k * std) normalise to (pixel - mean) / std, i.e. k up to the
  # rounding of the pixel value (half a level, 0.5 / std).
  ks = np.array([-1.5, 0.0, 1.0])
  pixels = np.rint(mean + ks[:, None] * std)
  images = np.broadcast_to(pixels[:, None, None, :], (3, 32, 32, 3)).astype(np.uint8)
  out = cifar.CIFAR10_NORMALIZATION(cifar.cifar10_eval_transform()(
      {"image": images, "label": np.arange(3)}, np.arange(3))["images"])
  assert out.dtype == np.float32
  np.testing.assert_allclose(out[:, 5, 7], (pixels - mean) / std, atol=1e-6)
  np.testing.assert_allclose(out[:, 5, 7], np.broadcast_to(ks[:, None], (3, 3)),
                             atol=0.5 / std.min())


def test_augmentation_is_deterministic_resumable_and_process_independent():
  rng = np.random.default_rng(0)
  source = stream.ArraySource(image=rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8),
                              label=np.arange(12))
  transform = cifar.cifar10_train_transform(seed=3)
  reference = stream_checks.check_augmented_stream(source, transform, seed=3, process_count=4,
                                                   resume_after=1)  # 12 examples: straddles the epoch end
  # Augmentation really happens: the images are not just the originals.
  first = stream.TrainStream(source, seed=3).example_indices(np.arange(8))
  plain = cifar.cifar10_eval_transform()(source.take(first), np.arange(8))
  assert not np.array_equal(plain["images"], reference[0]["images"])
  np.testing.assert_array_equal(plain["labels"], reference[0]["labels"])


def test_missing_dataset_error_names_dataset_dir_and_build_command(tmp_path):
  with pytest.raises(FileNotFoundError) as error:
    cifar.cifar10_eval_batches(8, data_dir=tmp_path)
  message = str(error.value)
  assert "cifar10" in message and str(tmp_path) in message
  assert "tfds build cifar10" in message


def test_bad_arguments_are_rejected():
  with pytest.raises(ValueError, match="seed"):
    cifar.cifar10_train_transform(seed=-3)
  with pytest.raises(ValueError, match="padding"):
    cifar.cifar10_train_transform(seed=0, padding=-1)
  with pytest.raises(ValueError, match="offsets"):
    cifar.pad_crop_flip(np.zeros((2, 32, 32, 3), np.uint8), np.array([[0, 9], [0, 0]]),
                        np.array([False, False]))
  with pytest.raises(ValueError, match="uint8 CIFAR images"):
    cifar.cifar10_eval_transform()({"image": np.zeros((2, 32, 32), np.uint8),
                                    "label": np.zeros(2)}, np.arange(2))
