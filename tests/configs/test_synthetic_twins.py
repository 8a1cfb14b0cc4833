"""Every packaged config runs on its dataset's synthetic twin (`--config.dataset=synthetic_<name>`), which takes
the dataset's options: a config can be tried without its data."""

import inspect
import typing

import numpy as np
import pytest

from lbjax import config_files
from lbjax.train import abstract_data
from lbjax.train import datasets
from lbjax.train import protocols
from lbjax.train import train_and_evaluate

REAL_DATASETS = ("mnist", "ptb", "imagenet", "cifar10")

# Sizes only, so that each run takes seconds on a CPU: the twins' own size options, the evaluation batch, and for
# the image configs a smaller batch and ResNetTiny for ResNet-50 (whose compilation alone takes minutes on a CPU).
SMALL = {
    "synthetic_mnist": ["--config.data_options.num_eval_examples=32", "--config.eval_batch_size=32"],
    "synthetic_ptb": ["--config.data_options.num_train_tokens=2000", "--config.data_options.num_eval_tokens=400"],
    "synthetic_imagenet": ["--config.data_options.image_size=16", "--config.data_options.num_classes=10",
                           "--config.data_options.num_train_examples=32", "--config.data_options.num_eval_examples=16",
                           "--config.batch_size=16", "--config.eval_batch_size=16", "--config.model=ResNetTiny",
                           "--config.model_options.bn_group_size=8", "--config.model_options.dtype=float32"],
    "synthetic_images": ["--config.data_options.image_size=16", "--config.data_options.num_train_examples=32",
                         "--config.data_options.num_eval_examples=16", "--config.batch_size=16",
                         "--config.eval_batch_size=16", "--config.model_options.bn_group_size=8"],
}


def _twin(dataset: str) -> str:
  return dataset if dataset.startswith("synthetic_") else f"synthetic_{dataset}"


@pytest.mark.parametrize("name", REAL_DATASETS)
def test_every_dataset_has_a_twin_that_takes_its_options_with_the_same_defaults(name):
  real = inspect.signature(getattr(datasets, name)).parameters
  twin = inspect.signature(getattr(datasets, f"synthetic_{name}")).parameters
  assert set(real) <= set(twin), f"synthetic_{name} lacks {sorted(set(real) - set(twin))}"
  assert {p: twin[p].default for p in real} == {p: real[p].default for p in real}


@pytest.mark.parametrize("name", REAL_DATASETS)
def test_a_twin_hands_over_the_batches_its_dataset_does(name):
  """The twin's training batches have the dtypes and example shapes of its dataset's (`abstract_data.SHAPES`, what
  `--compile-only` compiles the real run for) and the task normalises them in the step as it does the data's
  (uint8 pixels for ImageNet, CIFAR-10 and MNIST): a run on the twin runs the real run's step."""
  real_function, twin_function = getattr(datasets, name), getattr(datasets, f"synthetic_{name}")
  options = {"image_size": 16} if name == "imagenet" else {}
  sizes = {"num_classes": 10, "num_train_examples": 8, "num_eval_examples": 8} if name == "imagenet" else {}
  bound = inspect.signature(real_function).bind_partial(**options)
  bound.apply_defaults()
  real = abstract_data.SHAPES[real_function](dict(bound.arguments))
  twin = twin_function(**options, **sizes)
  batch = twin.make_train_stream(0, 1).next_batch(4)
  protocols.take_carry_reset(batch)
  assert {key: (value.shape[1:], value.dtype) for key, value in batch.items()} == real.example
  assert twin.image_normalization == real.dataset.image_normalization


@pytest.mark.parametrize("twin", ["synthetic_mnist", "synthetic_ptb", "synthetic_images", "synthetic_imagenet",
                                  "synthetic_cifar10"])
def test_the_shapes_of_a_twin_name_the_split_it_evaluates(twin):
  """`abstract_data.SHAPES` (what --dry-run, --compile-only and the experiments' tables read) says the split the
  opened twin evaluates, for each split it takes (synthetic_mnist said test and synthetic_ptb valid whatever
  they were given)."""
  function = getattr(datasets, twin)
  for split in typing.get_args(typing.get_type_hints(function)["eval_split"]):
    options = {"eval_split": split, **({"image_size": 16} if twin in ("synthetic_images", "synthetic_imagenet")
                                       else {})}
    bound = inspect.signature(function).bind_partial(**options)
    bound.apply_defaults()
    assert abstract_data.SHAPES[function](dict(bound.arguments)).dataset.eval_split == function(
        **options).eval_split == split


@pytest.mark.parametrize("name", config_files.packaged_names())
def test_every_packaged_config_runs_two_steps_on_its_synthetic_twin(name, tmp_path):
  packaged = config_files.load(name).config
  twin = _twin(packaged.dataset)
  # The adaptive policy's largest batch must fit the training set (checked at the start): PTB's, one window of
  # seq_len + 1 tokens per row.
  largest, fits = packaged.batch.max_batch_size, []
  if packaged.batch.policy == "adaptive" and twin == "synthetic_ptb":
    fits = [f"--config.data_options.num_train_tokens={largest * (packaged.data_options.seq_len + 1)}"]
  elif packaged.batch.policy == "adaptive":
    fits = [f"--config.data_options.num_train_examples={largest}"]
  config = config_files.load(name, [
      f"--config.dataset={twin}", "--config.num_steps=2", "--config.mesh.num_devices=1", "--config.log_every=1",
      "--config.checkpoint_every_steps=0",
      "--config.progress=False", *SMALL[twin], *fits]).config
  result = train_and_evaluate(config, tmp_path)
  assert result.step == 2
  assert np.isfinite(result.eval_metrics["loss"])
