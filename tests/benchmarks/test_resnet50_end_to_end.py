"""The end-to-end benchmark's data: ImageNet-like JPEGs as a TFDS imagenet2012 that lbjax's ImageNet stream reads."""

import pytest

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("cv2")

from benchmarks import resnet50_end_to_end  # pylint: disable=wrong-import-position
from lbjax.data import imagenet  # pylint: disable=wrong-import-position
from lbjax.train import datasets  # pylint: disable=wrong-import-position


def test_the_written_dataset_is_read_by_the_imagenet_stream_and_written_once(tmp_path):
  sizes = {"train_images": 12, "distinct_images": 4, "validation_images": 3}
  assert resnet50_end_to_end.write_imagenet_like(tmp_path, **sizes) > 0
  assert resnet50_end_to_end.write_imagenet_like(tmp_path, **sizes) == 0.0  # the same recipe: kept
  dataset = datasets.imagenet(tmp_path, image_size=32)
  assert dataset.fingerprint["train"].endswith("(12 rows)") and dataset.fingerprint["eval"].endswith("(3 rows)")
  stream = imagenet.imagenet_train_stream(data_dir=tmp_path, image_size=32, seed=0, num_threads=1)
  batch = stream.next_batch(12)
  assert batch["images"].shape == (12, 32, 32, 3) and sorted(batch["labels"]) == list(range(12))
  raw = imagenet.TfdsSource("imagenet2012", split="train", data_dir=tmp_path, encoded_features=("image",))
  assert raw.take([0])["image"][0] == raw.take([4])["image"][0]  # records cycle through the distinct JPEGs
