"""Batches on grain worker processes equal the in-process batches, across batch-size changes,
process sharding and a mid-epoch resume (ImageNet JPEG bytes; CIFAR-10 from TFDS mock data)."""

import numpy as np
import pytest

pytest.importorskip("grain")
tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("PIL")
pytest.importorskip("cv2")  # The [imagenet] extra: OpenCV resizes, simplejpeg decodes.
pytest.importorskip("simplejpeg")

from lbjax.data import cifar  # pylint: disable=g-import-not-at-top
from lbjax.data import imagenet  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from lbjax.data import synthetic_jpeg  # pylint: disable=g-import-not-at-top
from lbjax.data import workers  # pylint: disable=g-import-not-at-top

pytestmark = pytest.mark.slow  # Worker processes start in a few seconds each.


def _jpeg_source(count=12):
  images = np.empty(count, dtype=object)
  images[:] = synthetic_jpeg.imagenet_like_jpegs(count, seed=1, large_fraction=0.0)
  return stream.ArraySource(image=images, label=np.arange(count))


def test_a_record_that_cannot_be_decoded_on_a_worker_stops_as_it_does_in_process():
  """Grain hands a worker's exception back pickled, and `UndecodableRecordError` was rebuilt from its message
  alone: a TypeError without the dataset, index or what to do (and lbjax-train printed a traceback)."""
  jpegs = synthetic_jpeg.imagenet_like_jpegs(8, seed=1, large_fraction=0.0)
  jpegs[3] = b"<html>this is no image</html>"
  broken = np.empty(8, dtype=object)
  broken[:] = jpegs
  source = stream.ArraySource(image=broken, label=np.arange(8))
  transform = imagenet.imagenet_train_transform(seed=5, image_size=16, num_threads=1)
  messages = []
  for make in (lambda s: s, lambda s: workers.WorkerTrainStream(s, num_workers=1)):
    train = make(stream.TrainStream(source, seed=5, shuffle=False, transform=transform))
    try:
      with pytest.raises(stream.UndecodableRecordError) as error:
        train.next_batch(8)
      messages.append((str(error.value), error.value.index))
    finally:
      getattr(train, "close", lambda: None)()
  assert messages[0] == messages[1] and messages[0][1] == 3
  with pytest.raises(stream.UndecodableRecordError, match="example 3 cannot be decoded"):
    list(workers.worker_eval_batches(source, 8, num_workers=1, transform=imagenet.imagenet_eval_transform(
        image_size=16, num_threads=1)))


def test_two_workers_give_the_in_process_batches_through_size_changes_and_resume():
  source = _jpeg_source()
  transform = imagenet.imagenet_train_transform(seed=5, image_size=16, num_threads=1)
  sizes = [4, 4, 8, 8, 4]  # The epoch (12 examples) ends inside the third batch.
  reference = stream.TrainStream(source, seed=5, process_index=1, process_count=2,
                                 transform=transform)
  expected = [reference.next_batch(size) for size in sizes]
  on_workers = workers.WorkerTrainStream(
      stream.TrainStream(source, seed=5, process_index=1, process_count=2, transform=transform),
      num_workers=2)
  try:
    for size, batch in zip(sizes[:3], expected):
      got = on_workers.next_batch(size)
      np.testing.assert_array_equal(got["images"], batch["images"])
      np.testing.assert_array_equal(got["labels"], batch["labels"])
    state = on_workers.get_state()
    assert state == {**reference.get_state(), "examples_consumed": 16}
    on_workers.set_state({**state, "examples_consumed": 8})  # Back to the third batch.
    for size, batch in zip(sizes[2:], expected[2:]):
      np.testing.assert_array_equal(on_workers.next_batch(size)["images"], batch["images"])
    assert on_workers.examples_consumed == reference.examples_consumed
    assert on_workers.epoch() == reference.epoch()
  finally:
    on_workers.close()


def test_cifar10_from_tfds_on_a_worker_resumes_exactly_mid_epoch():
  with tfds.testing.mock_data(num_examples=10, policy=tfds.testing.MockPolicy.USE_CODE):
    reference = cifar.cifar10_train_stream(seed=3)
    expected = [reference.next_batch(4) for _ in range(3)]  # The second straddles no epoch end.
    on_worker = cifar.cifar10_train_stream(seed=3, num_workers=1)
    assert isinstance(on_worker, workers.WorkerTrainStream)
    try:
      on_worker.set_state({**reference.get_state(), "examples_consumed": 4})
      for batch in expected[1:]:
        np.testing.assert_array_equal(on_worker.next_batch(4)["images"], batch["images"])
      evaluation = list(cifar.cifar10_eval_batches(4, num_workers=1))
      np.testing.assert_array_equal(
          np.concatenate([b["images"] for b in evaluation]),
          np.concatenate([b["images"] for b in cifar.cifar10_eval_batches(4)]))
      np.testing.assert_array_equal(evaluation[-1]["mask"], [1, 1, 0, 0])
    finally:
      on_worker.close()


def test_bad_worker_arguments_are_rejected_before_any_worker_starts():
  train = stream.TrainStream(_jpeg_source(), seed=0)
  with pytest.raises(ValueError, match="num_workers must be >= 0"):
    imagenet.imagenet_train_stream(seed=0, num_workers=-1)
  with pytest.raises(TypeError, match="num_workers must be a non-negative integer"):
    workers.WorkerTrainStream(train, num_workers=1.5)
  with pytest.raises(ValueError, match="num_workers >= 1"):
    workers.WorkerTrainStream(train, num_workers=0)
  with pytest.raises(ValueError, match="not divisible by process_count"):
    workers.WorkerTrainStream(stream.TrainStream(_jpeg_source(), seed=0, process_count=2),
                              num_workers=1).next_batch(3)


def test_records_skipped_on_workers_are_those_skipped_in_process_and_counted_in_the_main_process():
  source = _jpeg_source()
  images = source.arrays["image"]
  images[2] = images[2][:len(images[2]) // 8]  # truncated
  source = stream.ArraySource(image=images, label=np.arange(len(images)))
  transform = imagenet.imagenet_train_transform(seed=5, image_size=16, num_threads=1)
  reference = stream.TrainStream(source, seed=5, transform=transform, skip_undecodable=True)
  expected = [reference.next_batch(12) for _ in range(2)]
  on_worker = workers.WorkerTrainStream(
      stream.TrainStream(source, seed=5, transform=transform, skip_undecodable=True), num_workers=1)
  try:
    for batch in expected:
      np.testing.assert_array_equal(on_worker.next_batch(12)["images"], batch["images"])
    assert on_worker.undecodable_skipped == reference.undecodable_skipped == 2
  finally:
    on_worker.close()
