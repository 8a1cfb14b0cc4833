"""Synthetic twins of the real datasets: same shapes and dtypes, generated from a seed, learnable.

Images are a fixed random prototype per class plus per-example noise, so the label is a function
of the image that a linear model, a ResNet or a row-reading LSTM can learn. Tokens follow a sparse
Markov chain (each token has a handful of possible successors), so a language model can get well
below the uniform perplexity.

`seed` fixes the task (prototypes, Markov chain); `split` draws independent examples of that task,
so `split='train'` and `split='test'` with one seed are a train set and a held-out set.
"""

import numbers
from typing import Any

import numpy as np

from lbjax.data.normalization import Normalization
from lbjax.data.stream import ArraySource

SYNTHETIC_SPLITS = ("train", "valid", "test")


def _check_positive(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _check_seed_and_split(seed: Any, split: Any) -> None:
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
  if split not in SYNTHETIC_SPLITS:
    raise ValueError(f"split must be one of {SYNTHETIC_SPLITS}, got {split!r}.")


def _split_rng(seed: int, split: str) -> np.random.Generator:
  return np.random.default_rng([seed, 1 + SYNTHETIC_SPLITS.index(split)])


def _class_examples(num_examples: int, prototypes: np.ndarray, noise: float, seed: int,
                    split: str) -> tuple[np.ndarray, np.ndarray]:
  """`prototypes[label] + noise * N(0, 1)` with uniformly drawn labels, float32."""
  rng = _split_rng(seed, split)
  labels = rng.integers(len(prototypes), size=num_examples).astype(np.int32)
  noise = rng.normal(0.0, noise, size=(num_examples, *prototypes.shape[1:])).astype(np.float32)
  return prototypes[labels] + noise, labels


def _check_noise(noise: Any) -> None:
  if not isinstance(noise, numbers.Real) or noise < 0:
    raise ValueError(f"noise must be a non-negative number, got {noise!r}.")


def synthetic_images(num_examples: int, image_size: int, channels: int, num_classes: int,
                     seed: int, *, split: str = "train", noise: float = 1.0,
                     pixels_for: Normalization | None = None) -> ArraySource:
  """Class-prototype images: normalised float32 values, or the uint8 pixels of the ImageNet/CIFAR streams.

  Example i is `x_i = prototype[label_i] + noise * N(0, 1)` with a fixed standard-normal prototype per
  class and uniformly drawn labels: float32 NHWC values on the scale of per-channel normalised
  images (about zero mean and unit variance per prototype). With `pixels_for`, a stream's
  `Normalization`, the images are instead the uint8 pixels `mean + stddev * x_i`, rounded and
  clipped to 0-255, that this normalisation maps back to `x_i` (up to the rounding, and the clip
  beyond about two standard deviations): what the ImageNet and CIFAR-10 streams hand over.

  Args:
    num_examples: N.
    image_size: height and width.
    channels: number of channels (3 for ImageNet/CIFAR).
    num_classes: number of labels.
    seed: non-negative integer; fixes the class prototypes.
    split: 'train', 'valid' or 'test': independent examples of the same classes.
    noise: per-pixel noise standard deviation (larger is harder).
    pixels_for: None (float32 values), or the `Normalization` whose uint8 pixels to give.

  Returns:
    `ArraySource(images=float32 (uint8 with `pixels_for`) [N, image_size, image_size, channels],
    labels=int32 [N])`.
  """
  for name, value in (("num_examples", num_examples), ("image_size", image_size),
                      ("channels", channels), ("num_classes", num_classes)):
    _check_positive(name, value)
  _check_seed_and_split(seed, split)
  _check_noise(noise)
  prototypes = np.random.default_rng([seed, 0]).normal(
      size=(num_classes, image_size, image_size, channels)).astype(np.float32)
  images, labels = _class_examples(num_examples, prototypes, noise, seed, split)
  if pixels_for is not None:
    if len(pixels_for.mean) != channels:
      raise ValueError(f"pixels_for normalises {len(pixels_for.mean)} channels but the images have {channels}.")
    scaled = np.asarray(pixels_for.mean, np.float32) + np.asarray(pixels_for.stddev, np.float32) * images
    images = np.rint(np.clip(scaled, 0, 255)).astype(np.uint8)
  return ArraySource(images=images, labels=labels)


def synthetic_mnist(num_examples: int, seed: int, *, split: str = "train",
                    noise: float = 0.3) -> ArraySource:
  """Class-prototype digits in the format of `load_mnist_idx`.

  Example i is `clip(prototype[label_i] + noise * N(0, 1), 0, 1)` with a fixed uniform [0, 1]
  prototype per digit class and uniformly drawn labels, as uint8 pixels (times 255, rounded):
  `MNIST_NORMALIZATION` gives the model its [0, 1] values, as for MNIST.

  Args:
    num_examples: N.
    seed: non-negative integer; fixes the class prototypes.
    split: 'train', 'valid' or 'test': independent examples of the same classes.
    noise: per-pixel noise standard deviation (larger is harder).

  Returns:
    `ArraySource(images=uint8 [N, 28, 28], labels=int32 [N] in 0..9)`.
  """
  _check_positive("num_examples", num_examples)
  _check_seed_and_split(seed, split)
  _check_noise(noise)
  prototypes = np.random.default_rng([seed, 0]).uniform(size=(10, 28, 28)).astype(np.float32)
  images, labels = _class_examples(num_examples, prototypes, noise, seed, split)
  pixels = np.rint(np.clip(images, 0.0, 1.0) * np.float32(255)).astype(np.uint8)
  return ArraySource(images=pixels, labels=labels)


def synthetic_ptb_tokens(num_tokens: int, vocab_size: int, seed: int, *, split: str = "train",
                         successors: int = 4) -> np.ndarray:
  """Token ids from a sparse Markov chain, in the format of `PtbCorpus.train`.

  Each token v has `successors` fixed random next tokens; the next token is drawn uniformly among
  those of the current one. A model that learns the chain reaches a perplexity of at most
  `successors` (the uniform one is `vocab_size`).

  Args:
    num_tokens: length of the stream.
    vocab_size: ids lie in [0, vocab_size).
    seed: non-negative integer; fixes the Markov chain.
    split: 'train', 'valid' or 'test': independent walks on the same chain.
    successors: possible next tokens per token (smaller is easier).

  Returns:
    int32 [num_tokens] token ids.
  """
  _check_positive("num_tokens", num_tokens)
  _check_positive("vocab_size", vocab_size)
  _check_positive("successors", successors)
  _check_seed_and_split(seed, split)
  table = np.random.default_rng([seed, 0]).integers(vocab_size, size=(vocab_size, successors))
  rng = _split_rng(seed, split)
  choices = rng.integers(successors, size=num_tokens)
  tokens = np.empty(num_tokens, dtype=np.int32)
  current = int(rng.integers(vocab_size))
  for i in range(num_tokens):
    tokens[i] = current
    current = int(table[current, choices[i]])
  return tokens
