"""The DALI path: the host half (windows and flips) is the CPU path's; the GPU half runs where
DALI and a CUDA GPU exist and is skipped cleanly elsewhere."""

import importlib.util

import numpy as np
import pytest

pytest.importorskip("PIL")

from lbjax.data import dali  # pylint: disable=g-import-not-at-top
from lbjax.data import imagenet  # pylint: disable=g-import-not-at-top
from lbjax.data import jpeg  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from lbjax.data import synthetic_jpeg  # pylint: disable=g-import-not-at-top

_HAS_DALI = importlib.util.find_spec("nvidia") is not None and (
    importlib.util.find_spec("nvidia.dali") is not None)


def _has_gpu() -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  try:
    return bool(jax.devices("gpu"))
  except RuntimeError:
    return False


def test_train_windows_and_flips_are_those_of_the_cpu_path():
  jpegs = synthetic_jpeg.imagenet_like_jpegs(6, seed=0, large_fraction=0.3)
  positions = np.arange(100, 106)
  anchors, shapes, flips = dali.windows_and_flips(jpegs, positions, seed=4, image_size=224,
                                                  mode="train")
  for i, (encoded, rng) in enumerate(zip(jpegs, stream.example_rngs(4, positions))):
    box, flip = imagenet.train_window(*jpeg.image_size(encoded), rng)
    np.testing.assert_array_equal(anchors[i], [box.left, box.top])
    np.testing.assert_array_equal(shapes[i], [box.width, box.height])
    assert flips[i] == flip
  assert anchors.dtype == shapes.dtype == np.float32 and flips.dtype == np.int32


def test_eval_windows_are_the_central_crop_and_never_flipped():
  jpegs = synthetic_jpeg.imagenet_like_jpegs(3, seed=1, large_fraction=0.0)
  anchors, shapes, flips = dali.windows_and_flips(jpegs, np.arange(3), seed=0, image_size=224,
                                                  mode="eval")
  for i, encoded in enumerate(jpegs):
    box = imagenet.eval_window(*jpeg.image_size(encoded), 224)
    np.testing.assert_allclose(anchors[i], [box.left, box.top], rtol=1e-6)
    np.testing.assert_allclose(shapes[i], [box.width, box.height], rtol=1e-6)
  assert not flips.any()


def test_decoder_choices_are_checked_before_any_data_is_read():
  with pytest.raises(ValueError, match="decoder must be 'cpu' or 'dali'"):
    imagenet.imagenet_train_stream(seed=0, decoder="gpu")
  with pytest.raises(ValueError, match="needs decode='reduced'"):
    imagenet.imagenet_train_stream(seed=0, decoder="dali", decode="full")
  with pytest.raises(ValueError, match="num_workers=0"):
    imagenet.imagenet_eval_batches(8, decoder="dali", num_workers=2)
  with pytest.raises(TypeError, match="decodes JPEG bytes"):
    dali.windows_and_flips([np.zeros((4, 4, 3), np.uint8)], np.arange(1), seed=0, image_size=4,
                           mode="train")


@pytest.mark.skipif(_HAS_DALI, reason="DALI is installed")
def test_missing_dali_names_the_extra():
  with pytest.raises(ImportError, match=r"pip install 'lbjax\[dali\]'"):
    imagenet.imagenet_train_stream(seed=0, decoder="dali")


@pytest.mark.skipif(not _HAS_DALI, reason="NVIDIA DALI is not installed")
def test_dali_batches_match_the_cpu_path_up_to_resampling():
  if not _has_gpu():
    pytest.skip("no CUDA GPU")
  jpegs = synthetic_jpeg.imagenet_like_jpegs(8, seed=2)
  images = np.empty(8, dtype=object)
  images[:] = jpegs
  examples = {"image": images, "label": np.arange(8)}
  positions = np.arange(8)
  for mode, cpu in (("train", imagenet.imagenet_train_transform(seed=3, num_threads=1)),
                    ("eval", imagenet.imagenet_eval_transform(num_threads=1))):
    on_gpu = dali.dali_imagenet_transform(mode=mode, seed=3)(examples, positions)
    expected = cpu(examples, positions)
    assert on_gpu["images"].shape == expected["images"].shape == (8, 224, 224, 3)
    np.testing.assert_array_equal(on_gpu["labels"], expected["labels"])
    # Normalised units (1 = one standard deviation, about 58 levels): resampling differences only.
    assert np.abs(on_gpu["images"] - expected["images"]).mean() < 0.1
