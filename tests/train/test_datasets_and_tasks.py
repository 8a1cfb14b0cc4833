"""Dataset functions and task metrics: the validation splits of MNIST and of the synthetic images, top-k
accuracy, the console's ETA."""

import hashlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lbjax import schedules
from lbjax.schedules import rules
from lbjax.train import datasets
from lbjax.train.metrics import ProgressLine
from lbjax.train.tasks import ClassificationTask


def _all_examples(dataset: datasets.Dataset, split: str) -> np.ndarray:
  if split == "eval":
    return np.concatenate([b["images"][b["mask"] > 0] for b in dataset.make_eval_batches(1000, 0, 1)])
  stream = dataset.make_train_stream(0, 1)
  return stream.next_batch(stream.num_examples)["images"]


def test_mnist_validation_split_is_held_out_of_training_and_the_same_for_every_seed(shared_data):
  test = datasets.mnist(shared_data)
  validation = datasets.mnist(shared_data, eval_split="validation", num_validation_examples=10000)
  other_seed = datasets.mnist(shared_data, seed=7, eval_split="validation", num_validation_examples=10000)
  held_out, train = _all_examples(validation, "eval"), _all_examples(validation, "train")
  assert len(held_out) == 10000 and len(train) == 50000 and len(_all_examples(test, "train")) == 60000
  np.testing.assert_array_equal(held_out, _all_examples(other_seed, "eval"))
  train_rows = {row.tobytes() for row in train.reshape(len(train), -1)}
  # MNIST has a few duplicate images; the split itself is disjoint by index, so overlap is tiny.
  assert sum(row.tobytes() in train_rows for row in held_out.reshape(len(held_out), -1)) < 20
  with pytest.raises(ValueError, match="eval_split must be 'test' or 'validation'"):
    datasets.mnist(shared_data, eval_split="valid")



def test_synthetic_images_validation_split_is_new_draws_of_the_same_task_with_the_same_training_set():
  options = dict(num_train_examples=32, num_eval_examples=16, image_size=4, noise=0.5)
  test, validation = datasets.synthetic_images(**options), datasets.synthetic_images(**options, eval_split="validation")
  assert (test.eval_split, validation.eval_split) == ("test", "validation")
  assert test.fingerprint["train"] == validation.fingerprint["train"]
  assert test.fingerprint["eval"] != validation.fingerprint["eval"]
  noisier = datasets.synthetic_images(**{**options, "noise": 2.0})
  # The same labels and prototypes: the noise is the only difference, and it scales by 4.
  clean = datasets.synthetic_images(**{**options, "noise": 0.0})
  np.testing.assert_allclose(_all_examples(noisier, "eval") - _all_examples(clean, "eval"),
                             4 * (_all_examples(test, "eval") - _all_examples(clean, "eval")), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="eval_split must be 'test' or 'validation'"):
    datasets.synthetic_images(eval_split="valid")
  # ImageNet's twin takes the splits the data has, and refuses another as the data would.
  with pytest.raises(ValueError, match="synthetic_imagenet: eval_split must be 'validation' or 'train' or 'test'"):
    datasets.synthetic_imagenet(eval_split="valid", image_size=8, num_classes=2)

def test_top5_counts_a_label_among_the_five_largest_logits():
  dataset = datasets.Dataset("classification", None, None, {}, "test", top_k=(5,))
  task = ClassificationTask(None, dataset, "")
  logits = jnp.array([[9.0, 8, 7, 6, 5, 4, 3], [1.0, 2, 3, 4, 5, 6, 7], [0.0, 0, 0, 0, 0, 0, 1]])
  model = lambda images, train: logits
  labels = jnp.array([4, 0, 6])  # 5th largest; smallest; largest
  sums, _ = task.eval_sums(model, {"images": None, "labels": labels, "mask": jnp.array([1.0, 1.0, 0.0])}, None)
  metrics = task.summarize({k: float(v) for k, v in sums.items()})
  assert metrics["top5_accuracy"] == 0.5 and metrics["accuracy"] == 0.0


def test_the_eta_follows_whichever_stop_rule_comes_first():
  out = io.StringIO()
  progress = ProgressLine(num_epochs=100.0, num_steps=20, stream=out)
  progress.reset_window(0, 0.0, 0)
  progress._last = (progress._last[0] - 10.0,) + progress._last[1:]  # 10 s for the next 10 steps
  progress.show(10, 0.01, 1280, 1.0, 0.1, 128)
  assert "ETA 00:00:10" in out.getvalue()  # 10 steps left at 1 step/s, not 99.99 epochs


@pytest.mark.parametrize("rule, reference", [
    (rules.linear, lambda: schedules.linear_scaling(128, 0.1, 1024, warmup_epochs=0.5)),
    (rules.sqrt, lambda: schedules.sqrt_scaling(128, 0.1, 1024, warmup_epochs=0.5)),
    (rules.legw, lambda: schedules.legw(128, 0.1, 0.5, 1024)),
    (rules.goyal, lambda: schedules.goyal_scaling(128, 0.1, 1024)),  # its own 5 epochs replace 0.5
    (rules.none, lambda: schedules.ScaledRecipe(0.1, 0.5)),
])
def test_scaling_rules_by_name_are_the_scaling_functions(rule, reference):
  assert rule(128, 0.1, 0.5, 1024) == reference()


def test_mnist_auto_source_reads_idx_files_where_found_else_tfds(shared_data, tmp_path, monkeypatch):
  tfds = pytest.importorskip("tensorflow_datasets")
  from_idx = datasets.mnist(shared_data, source="auto")
  np.testing.assert_array_equal(_all_examples(from_idx, "train")[:5],
                                _all_examples(datasets.mnist(shared_data), "train")[:5])
  requested = []
  real_source = tfds.data_source
  monkeypatch.setattr(tfds, "data_source", lambda *a, **k: requested.append(k["download"]) or real_source(*a, **k))
  with tfds.testing.mock_data(num_examples=12):
    from_tfds = datasets.mnist(tmp_path, source="auto", download=True)  # no idx files in tmp_path
  assert len(_all_examples(from_tfds, "train")) == 12 and requested == [True, True]
  with pytest.raises(ValueError, match="source must be 'idx', 'tfds' or 'auto'"):
    datasets.mnist(shared_data, source="files")


def test_arrays_over_16_mib_are_fingerprinted_by_a_sample_and_small_ones_by_all_their_bytes():
  small = {"x": np.arange(1000, dtype=np.float32)}
  whole = hashlib.sha256(b"x:<f4:(1000,);" + small["x"].tobytes()).hexdigest()[:16]
  assert datasets.array_fingerprint(small) == f"sha256:{whole} (1000 rows)"  # as checkpoints have recorded it
  large = {"x": np.zeros((17 * 2**20,), np.uint8)}
  sampled = datasets.array_fingerprint(large)
  assert sampled.startswith("sampled-sha256:") and sampled.endswith(f" ({17 * 2**20} rows)")
  assert datasets.array_fingerprint(large, sampled=False).startswith("sha256:")
  large["x"][-1] = 1  # the last block is always sampled
  assert datasets.array_fingerprint(large) != sampled


def test_fingerprint_like_takes_each_split_in_the_checkpoints_kind():
  arrays = {"train": {"x": np.zeros((17 * 2**20,), np.uint8)}, "eval": {"x": np.ones(8, np.uint8)}}
  dataset = datasets.Dataset("classification", None, None, {}, "test",
                             fingerprint={k: datasets.array_fingerprint(v) for k, v in arrays.items()},
                             fingerprinted_arrays=arrays)
  full = {k: datasets.array_fingerprint(v, sampled=False) for k, v in arrays.items()}
  assert dataset.fingerprint["train"].startswith("sampled-sha256:")
  assert dataset.fingerprint_like(full) == full
  assert dataset.fingerprint_like(dataset.fingerprint) == dataset.fingerprint
  assert dataset.fingerprint_like({}) == dataset.fingerprint


def test_mnist_fingerprint_is_that_of_the_float32_pixels_it_streamed_before():
  """MNIST now streams uint8 pixels; its fingerprint is taken of pixel / 255 as the model reads them, the
  arrays it streamed until 2026-11-30, so the checkpoints saved then resume."""
  from lbjax import data  # pylint: disable=import-outside-toplevel
  pixels = np.random.default_rng(0).integers(0, 256, (17 * 2**20 // (28 * 28 * 4) + 1, 28, 28), dtype=np.uint8)
  labels = np.arange(len(pixels), dtype=np.int32) % 10
  as_streamed_before = {"images": pixels.astype(np.float32) / np.float32(255), "labels": labels}
  arrays = {"images": pixels, "labels": labels}
  assert datasets.array_fingerprint(as_streamed_before).startswith("sampled-sha256:")
  assert (datasets.input_fingerprint(arrays, data.MNIST_NORMALIZATION)
          == datasets.array_fingerprint(as_streamed_before))
  dataset = datasets.Dataset("classification", None, None, {}, "test", fingerprinted_arrays={"train": arrays},
                             image_normalization=data.MNIST_NORMALIZATION)
  full = {"train": datasets.array_fingerprint(as_streamed_before, sampled=False)}
  assert dataset.fingerprint_like(full) == full  # a checkpoint of the every-byte kind


@pytest.mark.parametrize("rows, sampled", [(3000, None), (3000, False), (100, None), (0, None)],
                         ids=["sampled", "every_byte", "small", "empty"])
def test_normalised_images_are_fingerprinted_as_if_normalised_whole(rows, sampled):
  """Per-channel normalisation of [N, 37, 41, 3] uint8 images (a row of 18,204 float32 bytes, so sampled
  blocks straddle rows): the rows the hash reads, normalised apart, give the fingerprint of the whole."""
  from lbjax import data  # pylint: disable=import-outside-toplevel
  normalization = data.Normalization((120.0, 115.0, 100.0), (60.0, 61.0, 62.0))
  images = np.random.default_rng(1).integers(0, 256, (rows, 37, 41, 3), dtype=np.uint8)
  labels = np.arange(rows, dtype=np.int32)
  whole = datasets.array_fingerprint({"images": normalization(images), "labels": labels}, sampled=sampled)
  assert datasets.input_fingerprint({"images": images, "labels": labels}, normalization, sampled=sampled) == whole
  assert whole.startswith("sampled-sha256:" if rows == 3000 and sampled is None else "sha256:")


def test_a_sampled_fingerprint_never_holds_the_normalised_images_whole():
  """MNIST's 60,000 digits: 188 MB as float32; the fingerprint reads 4 MiB of them, a row range at a time."""
  import tracemalloc  # pylint: disable=import-outside-toplevel
  from lbjax import data  # pylint: disable=import-outside-toplevel
  arrays = {"images": np.zeros((60000, 28, 28), np.uint8), "labels": np.zeros(60000, np.int32)}
  tracemalloc.start()
  try:
    datasets.input_fingerprint(arrays, data.MNIST_NORMALIZATION)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert peak < 2**20, f"{peak / 2**20:.1f} MiB at the peak"


def test_classification_task_normalises_uint8_images_in_the_step_as_the_host_did():
  pytest.importorskip("cv2")
  from lbjax.data import cifar, imagenet, normalization  # pylint: disable=import-outside-toplevel
  dataset = datasets.Dataset("classification", None, None, {}, "test",
                             image_normalization=imagenet.IMAGENET_NORMALIZATION)
  task = ClassificationTask(None, dataset, "ResNet50()")
  images = np.random.default_rng(0).integers(0, 256, (2, 5, 4, 3), dtype=np.uint8)
  batch = {"images": jnp.asarray(images), "labels": jnp.array([0, 1]), "mask": jnp.ones(2)}
  host = normalization.normalize_images(images, imagenet.IMAGENET_MEAN_RGB, imagenet.IMAGENET_STDDEV_RGB)  # as before
  np.testing.assert_allclose(jax.jit(task.images)(batch), host, rtol=1e-6, atol=1e-6)
  seen = []

  def model(inputs, train):
    seen.append(inputs)
    return jnp.zeros((inputs.shape[0], 3))

  task.train_loss(model, batch, None, None)
  task.eval_sums(model, batch, None)
  for inputs in seen:
    assert inputs.dtype == jnp.float32
    np.testing.assert_allclose(inputs, host, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="normalises uint8 images in the step, but the batch's images are float32"):
    task.train_loss(model, {**batch, "images": batch["images"].astype(jnp.float32)}, None, None)
  # Datasets without a normalisation (synthetic images) hand the model their images as they are.
  plain = ClassificationTask(None, datasets.Dataset("classification", None, None, {}, "test"), "")
  assert plain.images({"images": host}) is host
  assert cifar.CIFAR10_NORMALIZATION.mean == cifar.CIFAR10_MEAN_RGB
