"""Tests that the synthetic twins have the real formats, are deterministic and are learnable."""

import numpy as np
import pytest

from lbjax import data


def class_mean_accuracy(train: data.ArraySource, test: data.ArraySource) -> float:
  """Accuracy on `test` of the nearest-class-mean classifier fitted on `train`."""
  x, y = train.arrays["images"], train.arrays["labels"]
  x = x.reshape(len(x), -1)
  means = np.stack([x[y == c].mean(axis=0) for c in range(y.max() + 1)])
  test_x = test.arrays["images"].reshape(len(test), -1)
  distances = ((test_x[:, None, :] - means[None]) ** 2).sum(axis=-1)
  return float((distances.argmin(axis=1) == test.arrays["labels"]).mean())


def test_synthetic_mnist_has_the_idx_format_and_is_learnable():
  train = data.synthetic_mnist(300, seed=0)
  test = data.synthetic_mnist(200, seed=0, split="test")
  images, labels = train.arrays["images"], train.arrays["labels"]
  assert images.shape == (300, 28, 28) and images.dtype == np.uint8  # MNIST's pixels, 0-255
  assert labels.dtype == np.int32 and set(labels) == set(range(10))
  assert images.min() == 0 and images.max() == 255  # clipped: both ends are reached
  assert not np.array_equal(images[:200], test.arrays["images"])
  assert class_mean_accuracy(train, test) > 0.95
  # Labels depend on the seed's prototypes: another task is not learned from this one.
  assert class_mean_accuracy(train, data.synthetic_mnist(200, seed=1, split="test")) < 0.4


def test_synthetic_images_have_the_vision_pipeline_format_and_are_learnable():
  train = data.synthetic_images(200, image_size=8, channels=3, num_classes=5, seed=0)
  test = data.synthetic_images(100, image_size=8, channels=3, num_classes=5, seed=0,
                               split="test")
  assert train.arrays["images"].shape == (200, 8, 8, 3)
  assert train.arrays["images"].dtype == np.float32 and train.arrays["labels"].dtype == np.int32
  assert abs(train.arrays["images"].mean()) < 0.3 and 0.8 < train.arrays["images"].std() < 2.0
  assert class_mean_accuracy(train, test) > 0.95


def test_synthetic_images_as_a_streams_pixels_normalise_back_to_the_float_images():
  normalization = data.Normalization((120.0, 110.0, 100.0), (60.0, 50.0, 40.0))
  kwargs = dict(image_size=8, channels=3, num_classes=5, seed=0)
  values = data.synthetic_images(50, **kwargs).arrays
  pixels = data.synthetic_images(50, **kwargs, pixels_for=normalization).arrays
  assert pixels["images"].dtype == np.uint8
  np.testing.assert_array_equal(pixels["labels"], values["labels"])
  back = normalization(pixels["images"])
  inside = (back > normalization(np.zeros((1, 3), np.uint8))) & (back < normalization(np.full((1, 3), 255, np.uint8)))
  assert inside.mean() > 0.9  # the clip at 0 and 255 takes the tails, about two standard deviations out
  np.testing.assert_allclose(back[inside], values["images"][inside], atol=0.5 / 40 + 1e-6)  # half a pixel step
  with pytest.raises(ValueError, match="normalises 3 channels but the images have 1"):
    data.synthetic_images(5, image_size=4, channels=1, num_classes=2, seed=0, pixels_for=normalization)


def test_same_seed_same_data():
  a, b = data.synthetic_mnist(20, seed=3), data.synthetic_mnist(20, seed=3)
  for key in ("images", "labels"):
    np.testing.assert_array_equal(a.arrays[key], b.arrays[key])
  np.testing.assert_array_equal(data.synthetic_ptb_tokens(100, 30, seed=3),
                                data.synthetic_ptb_tokens(100, 30, seed=3))


def bigram_perplexity(train: np.ndarray, test: np.ndarray, vocab_size: int) -> float:
  counts = np.full((vocab_size, vocab_size), 1e-3)
  np.add.at(counts, (train[:-1], train[1:]), 1.0)
  log_probs = np.log(counts / counts.sum(axis=1, keepdims=True))
  return float(np.exp(-log_probs[test[:-1], test[1:]].mean()))


def test_synthetic_tokens_have_the_ptb_format_and_are_learnable():
  train = data.synthetic_ptb_tokens(20000, 50, seed=0, successors=4)
  test = data.synthetic_ptb_tokens(2000, 50, seed=0, split="test", successors=4)
  assert train.dtype == np.int32 and train.shape == (20000,)
  assert train.min() >= 0 and train.max() < 50
  assert len(np.unique(train)) > 25  # the walk visits much of the vocabulary
  assert bigram_perplexity(train, test, 50) < 4.2  # at most `successors`, far below 50
  other_task = data.synthetic_ptb_tokens(2000, 50, seed=1, split="test", successors=4)
  assert bigram_perplexity(train, other_task, 50) > 20


@pytest.mark.parametrize("call, match", [
    (lambda: data.synthetic_mnist(0, seed=0), "num_examples must be a positive integer"),
    (lambda: data.synthetic_mnist(5, seed=-1), "seed must be a non-negative integer"),
    (lambda: data.synthetic_mnist(5, seed=0, split="dev"), "split must be one of"),
    (lambda: data.synthetic_mnist(5, seed=0, noise=-1.0), "noise must be a non-negative"),
    (lambda: data.synthetic_images(5, 0, 3, 10, seed=0), "image_size must be a positive"),
    (lambda: data.synthetic_ptb_tokens(10, 0, seed=0), "vocab_size must be a positive"),
])
def test_bad_arguments_raise(call, match):
  with pytest.raises(ValueError, match=match):
    call()
