"""Tests of the MNIST loaders on the real idx files, tiny hand-made idx files and TFDS mocks."""

import gzip
import hashlib
import pathlib
import socket

import numpy as np
import pytest

from lbjax import data
from lbjax.data import mnist

TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def mnist_train(shared_data):
  return data.load_mnist_idx(shared_data, "train", verify=True)


@pytest.fixture(scope="module")
def mnist_test(shared_data):
  return data.load_mnist_idx(shared_data / "mnist", "test", verify=True)


def test_train_split_matches_the_published_dataset(mnist_train):
  images, labels = mnist_train.arrays["images"], mnist_train.arrays["labels"]
  assert images.shape == (60000, 28, 28) and images.dtype == np.uint8
  assert labels.shape == (60000,) and labels.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(labels, minlength=10), TRAIN_COUNTS)
  assert labels[0] == 5
  assert images.min() == 0 and images.max() == 255
  # The model reads pixel / 255, the float32 quotient the host division gives.
  model_inputs = data.MNIST_NORMALIZATION(images[:100])
  assert model_inputs.dtype == np.float32 and model_inputs.min() == 0.0 and model_inputs.max() == 1.0
  np.testing.assert_array_equal(model_inputs, images[:100].astype(np.float32) / np.float32(255))


def test_test_split_matches_the_published_dataset(mnist_test):
  images, labels = mnist_test.arrays["images"], mnist_test.arrays["labels"]
  assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
  np.testing.assert_array_equal(np.bincount(labels, minlength=10), TEST_COUNTS)


def test_pixel_scale_on_the_device_gives_the_host_quotients_bit_for_bit():
  """MNIST's pixels reach the device as uint8 and the step scales them; every pixel value must come out as
  the float32 pixel / 255 the host division gave (the runs made when the host divided stay reproduced),
  which XLA's multiply-by-reciprocal form of `x / 255` misses for about half of them."""
  jax, jnp = pytest.importorskip("jax"), pytest.importorskip("jax.numpy")
  pixels = np.arange(256, dtype=np.uint8).reshape(16, 16)
  host_quotients = pixels.astype(np.float32) / np.float32(255)
  on_device = np.asarray(jax.jit(data.MNIST_NORMALIZATION)(jnp.asarray(pixels)))
  assert on_device.dtype == np.float32
  np.testing.assert_array_equal(on_device, host_quotients)
  np.testing.assert_array_equal(data.MNIST_NORMALIZATION(pixels), host_quotients)  # on the host
  reciprocal = np.asarray(jax.jit(lambda x: x.astype(jnp.float32) / 255)(jnp.asarray(pixels)))
  assert np.sum(reciprocal != host_quotients) > 100  # what the two products are for
  with pytest.raises(ValueError, match="takes uint8 pixels"):
    data.MNIST_NORMALIZATION(host_quotients)
  with pytest.raises(ValueError, match="divisor must be positive"):
    data.PixelScale(0.0)


@pytest.mark.parametrize("divisor", [256.0, 127.5, 100.0, 3.0, 1e-3])
def test_pixel_scale_is_the_correctly_rounded_quotient_for_any_divisor_it_accepts(divisor):
  """`x * high + x * low` on the device (XLA:CPU) equals float32(x) / float32(divisor) for every pixel value
  (MNIST's 255: the test above)."""
  jax, jnp = pytest.importorskip("jax"), pytest.importorskip("jax.numpy")
  pixels = np.arange(256, dtype=np.uint8)
  scale = data.PixelScale(divisor)
  want = pixels.astype(np.float32) / np.float32(divisor)
  np.testing.assert_array_equal(np.asarray(jax.jit(scale)(jnp.asarray(pixels))), want)
  np.testing.assert_array_equal(scale(pixels), want)


def test_a_divisor_whose_two_products_miss_a_quotient_is_refused():
  """About 1 divisor in 3,500 drawn at random: for one pixel value the split's sum rounds to another float32."""
  with pytest.raises(ValueError, match=r"PixelScale\(356.57126446805114\): x \* high \+ x \* low does not give"):
    data.PixelScale(356.57126446805114)


def write_idx(folder: pathlib.Path, split: str, images: np.ndarray, labels: np.ndarray, *,
              gzipped: bool = True, images_magic: int = 0x803, labels_magic: int = 0x801,
              labels_count: int | None = None) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes idx files for `split` in `folder` and returns their paths."""
  prefix = "train" if split == "train" else "t10k"
  n, rows, cols = images.shape
  image_bytes = b"".join(v.to_bytes(4, "big") for v in (images_magic, n, rows, cols))
  image_bytes += images.astype(np.uint8).tobytes()
  count = len(labels) if labels_count is None else labels_count
  label_bytes = b"".join(v.to_bytes(4, "big") for v in (labels_magic, count))
  label_bytes += labels.astype(np.uint8).tobytes()
  paths = []
  for name, content in ((f"{prefix}-images-idx3-ubyte", image_bytes),
                        (f"{prefix}-labels-idx1-ubyte", label_bytes)):
    path = folder / (name + (".gz" if gzipped else ""))
    path.write_bytes(gzip.compress(content) if gzipped else content)
    paths.append(path)
  return paths[0], paths[1]


def tiny_digits(n: int = 3) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.integers(0, 256, size=(n, 28, 28)), np.arange(n) % 10


@pytest.mark.parametrize("gzipped", [True, False])
def test_reads_gzipped_and_plain_idx_files(tmp_path, gzipped):
  pixels, labels = tiny_digits()
  write_idx(tmp_path, "test", pixels, labels, gzipped=gzipped)
  source = data.load_mnist_idx(tmp_path, "test")
  np.testing.assert_array_equal(source.arrays["labels"], labels)
  np.testing.assert_array_equal(source.arrays["images"], pixels)
  assert source.arrays["images"].dtype == np.uint8


def test_missing_directory_and_file_errors_say_where_to_get_mnist(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a directory.*yann.lecun.com"):
    data.load_mnist_idx(tmp_path / "absent", "train")
  with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte\[\.gz\] not found"
                     r".*yann\.lecun\.com.*tfds\.data_source\('mnist'\)"):
    data.load_mnist_idx(tmp_path, "train")


def test_an_empty_data_folder_names_itself_where_it_was_set_and_the_layout(tmp_path, monkeypatch):
  monkeypatch.setenv("LBJAX_DATA_DIR", str(tmp_path))
  with pytest.raises(FileNotFoundError) as error:
    data.load_mnist_idx(None, "train")
  message = str(error.value)
  assert f"not found in the data folder {tmp_path} (set by LBJAX_DATA_DIR); looked for " in message
  assert "MNIST is read from <data folder>/mnist/: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz" in message
  assert ("Set LBJAX_DATA_DIR or config.data_dir (lbjax-train: --config.data_dir=PATH) to the folder that holds "
          "mnist/.") in message
  with pytest.raises(FileNotFoundError, match=r"\(set by data_dir, lbjax-train's config.data_dir\)"):
    data.load_mnist_idx(tmp_path, "train")


def test_bad_split_raises(tmp_path):
  with pytest.raises(ValueError, match="one of \\('train', 'test'\\)"):
    data.load_mnist_idx(tmp_path, "validation")


def test_corrupt_gzip_names_the_file(tmp_path):
  pixels, labels = tiny_digits()
  images_path, _ = write_idx(tmp_path, "train", pixels, labels)
  images_path.write_bytes(images_path.read_bytes()[:40])
  with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz is not a valid gzip"):
    data.load_mnist_idx(tmp_path, "train")


def test_wrong_magic_number_raises(tmp_path):
  pixels, labels = tiny_digits()
  write_idx(tmp_path, "train", pixels, labels, images_magic=0x801)
  with pytest.raises(ValueError, match="magic number 0x801, expected 0x803"):
    data.load_mnist_idx(tmp_path, "train")


def test_truncated_file_raises(tmp_path):
  pixels, labels = tiny_digits()
  images_path, _ = write_idx(tmp_path, "train", pixels, labels, gzipped=False)
  images_path.write_bytes(images_path.read_bytes()[:-10])
  with pytest.raises(ValueError, match="is corrupt: .* expected 2368 for 3 images"):
    data.load_mnist_idx(tmp_path, "train")


def test_image_and_label_counts_must_agree(tmp_path):
  pixels, _ = tiny_digits(3)
  write_idx(tmp_path, "train", pixels, np.array([1, 2]))
  with pytest.raises(ValueError, match="has 3 images but .* has 2 labels"):
    data.load_mnist_idx(tmp_path, "train")


def test_label_out_of_range_raises(tmp_path):
  pixels, _ = tiny_digits(3)
  write_idx(tmp_path, "train", pixels, np.array([1, 2, 12]))
  with pytest.raises(ValueError, match="label 12 outside 0..9"):
    data.load_mnist_idx(tmp_path, "train")


def test_verify_rejects_a_checksum_mismatch(tmp_path):
  pixels, labels = tiny_digits()
  images_path, _ = write_idx(tmp_path, "test", pixels, labels)
  data.load_mnist_idx(tmp_path, "test")  # structurally valid ...
  actual = hashlib.sha256(images_path.read_bytes()).hexdigest()
  with pytest.raises(ValueError, match=f"sha256 {actual}, expected "
                     f"{mnist.MNIST_SHA256['t10k-images-idx3-ubyte.gz']}"):
    data.load_mnist_idx(tmp_path, "test", verify=True)  # ... but not the published file


@pytest.fixture
def no_network(monkeypatch):
  """Fails the test if anything opens a network connection."""

  def refuse(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args}")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)


def test_tfds_loader_gives_the_idx_format_without_downloading(no_network, tmp_path):
  tfds = pytest.importorskip("tensorflow_datasets")
  pixels, labels = tiny_digits(4)
  write_idx(tmp_path, "train", pixels, labels)
  from_idx = data.load_mnist_idx(tmp_path, "train")
  with tfds.testing.mock_data(num_examples=6):
    from_tfds = data.load_mnist_tfds("train")
    mocked = tfds.data_source("mnist", split="train", download=False)
    first = mocked[0]
  assert len(from_tfds) == 6
  for key, value in from_idx.arrays.items():
    assert from_tfds.arrays[key].dtype == value.dtype
    assert from_tfds.arrays[key].shape[1:] == value.shape[1:]
  images, tfds_labels = from_tfds.arrays["images"], from_tfds.arrays["labels"]
  assert set(tfds_labels) <= set(range(10))
  np.testing.assert_array_equal(images[0], first["image"][..., 0])
  assert tfds_labels[0] == first["label"]


def test_tfds_loader_without_prepared_data_says_how_to_prepare(no_network, tmp_path):
  pytest.importorskip("tensorflow_datasets")
  with pytest.raises(FileNotFoundError, match="tfds build mnist --file_format=array_record"):
    data.load_mnist_tfds("train", data_dir=tmp_path)


def test_default_data_dir_prefers_the_environment_variable(monkeypatch, tmp_path):
  monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
  assert data.default_data_dir() == tmp_path
  monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "absent"))
  with pytest.raises(FileNotFoundError, match="LBJAX_DATA_DIR=.* is not a directory"):
    data.default_data_dir()


def test_default_data_dir_finds_the_shared_data(monkeypatch, shared_data):
  monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
  assert data.default_data_dir().resolve() == shared_data.resolve()
