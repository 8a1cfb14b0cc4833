"""Synthetic twins of the real datasets: same shapes and dtypes, generated from a seed, learnable.

Images are a fixed random prototype per class plus per-example noise, so the label is a function
of the image that a linear model, a ResNet or a row-reading LSTM can learn. Tokens follow a sparse
Markov chain (each token has a handful of possible successors), so a language model can get well
below the uniform perplexity.
"""

import numbers
from typing import Any

import numpy as np

from lbjax.data.stream import ArraySource


def _check_positive(name: str, value: Any) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _check_seed(seed: Any) -> None:
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")


def _class_images(num_examples: int, shape: tuple[int, ...], num_classes: int, noise: float,
                  seed: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  prototypes = rng.uniform(0.0, 1.0, size=(num_classes, *shape)).astype(np.float32)
  labels = rng.integers(num_classes, size=num_examples).astype(np.int32)
  noise = rng.normal(0.0, noise, size=(num_examples, *shape)).astype(np.float32)
  images = np.clip(prototypes[labels] + noise, 0.0, 1.0)
  return images, labels


def synthetic_images(num_examples: int, image_size: int, channels: int, num_classes: int,
                     seed: int, *, noise: float = 0.3) -> ArraySource:
  """Class-prototype images in the format of the TFDS vision pipelines.

  Example i is `clip(prototype[label_i] + noise * N(0, 1), 0, 1)` with a fixed uniform random
  prototype per class and uniformly drawn labels.

  Args:
    num_examples: N.
    image_size: height and width.
    channels: number of channels (3 for ImageNet/CIFAR).
    num_classes: number of labels.
    seed: non-negative integer; the same seed gives the same data.
    noise: per-pixel noise standard deviation (larger is harder).

  Returns:
    `ArraySource(images=float32 [N, image_size, image_size, channels] in [0, 1],
    labels=int32 [N])`.
  """
  for name, value in (("num_examples", num_examples), ("image_size", image_size),
                      ("channels", channels), ("num_classes", num_classes)):
    _check_positive(name, value)
  _check_seed(seed)
  if noise < 0:
    raise ValueError(f"noise must be >= 0, got {noise}.")
  images, labels = _class_images(num_examples, (image_size, image_size, channels), num_classes,
                                 noise, seed)
  return ArraySource(images=images, labels=labels)


def synthetic_mnist(num_examples: int, seed: int, *, noise: float = 0.3) -> ArraySource:
  """Class-prototype digits in the format of `load_mnist_idx`.

  Args:
    num_examples: N.
    seed: non-negative integer; the same seed gives the same data.
    noise: per-pixel noise standard deviation (larger is harder).

  Returns:
    `ArraySource(images=float32 [N, 28, 28] in [0, 1], labels=int32 [N] in 0..9)`.
  """
  _check_positive("num_examples", num_examples)
  _check_seed(seed)
  if noise < 0:
    raise ValueError(f"noise must be >= 0, got {noise}.")
  images, labels = _class_images(num_examples, (28, 28), 10, noise, seed)
  return ArraySource(images=images, labels=labels)


def synthetic_ptb_tokens(num_tokens: int, vocab_size: int, seed: int, *,
                         successors: int = 4) -> np.ndarray:
  """Token ids from a sparse Markov chain, in the format of `PtbCorpus.train`.

  Each token v has `successors` fixed random next tokens; the next token is drawn uniformly among
  those of the current one. A model that learns the chain reaches a perplexity of at most
  `successors` (the uniform one is `vocab_size`).

  Args:
    num_tokens: length of the stream.
    vocab_size: ids lie in [0, vocab_size).
    seed: non-negative integer; the same seed gives the same tokens.
    successors: possible next tokens per token (smaller is easier).

  Returns:
    int32 [num_tokens] token ids.
  """
  _check_positive("num_tokens", num_tokens)
  _check_positive("vocab_size", vocab_size)
  _check_positive("successors", successors)
  _check_seed(seed)
  rng = np.random.default_rng(seed)
  table = rng.integers(vocab_size, size=(vocab_size, successors))
  choices = rng.integers(successors, size=num_tokens)
  tokens = np.empty(num_tokens, dtype=np.int32)
  current = int(rng.integers(vocab_size))
  for i in range(num_tokens):
    tokens[i] = current
    current = int(table[current, choices[i]])
  return tokens
