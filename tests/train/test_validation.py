"""Every bad config is refused before any compute, with a message that says what to change."""

import json

import pytest

from lbjax.train import train_and_evaluate
from lbjax.train.config import check_resumable, parse_variant
from tests.train import helpers


@pytest.mark.parametrize("overrides, message", [
    ({"model": "resnet51"}, r"config.model='resnet51' is not known; choose one of mnist_lstm"),
    ({"dataset": "imagenet21k"}, r"config.dataset='imagenet21k' is not known"),
    ({"optimizer.name": "lion"}, r"config.optimizer.name='lion' is not known; choose one of sgd"),
    ({"lr.decay": "step"}, r"config.lr.decay='step' is not known"),
    ({"scaling.rule": "cubic"}, r"config.scaling.rule='cubic' is not known"),
    ({"model": "ptb_lstm"}, r"cannot train on config.dataset='synthetic_mnist'"),
    ({"batch_size": 36}, r"global batch size 36 is not divisible by the data-parallel size 8"),
    ({"batch_sizes": (32, 64), "batch_size_boundaries": ()}, r"has 2 sizes but .* 0 epochs"),
    ({"max_device_batch": 3}, r"cannot split a device share of 4 examples .*max_device_batch=3"),
    ({"lr.warmup": "linear", "lr.warmup_epochs": 2.0}, r"warmup_epochs=2.0 is longer than training"),
    ({"num_epochs": 0.0}, r"num_epochs must be > 0"),
    ({"eval_batch_size": 12}, r"eval_batch_size=12 must be a positive multiple of the data-parallel size 8"),
    ({"mesh.fsdp": 3}, r"mesh.fsdp=3 does not divide the 8 devices"),
    ({"mesh.data": 2, "mesh.fsdp": 2}, r"2 \* 2 = 4 but there are 8 devices"),
    ({"scaling.rule": "legw", "lr.warmup": "linear", "lr.warmup_epochs": 0.5, "scaling.base_batch_size": 8},
     r"warm-up \(2 epochs after scaling.rule='legw' from 8 to batch 32\) is not shorter than training"),
    ({"optimizer.clip_global_norm": -1.0}, r"clip_global_norm must be a number >= 0 \(0 turns clipping off\), got -1.0"),
    ({"model_options.dtype": "float8"}, r"config.model_options.dtype='float8' is not known"),
])
def test_bad_config_is_refused_with_a_clear_message(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(helpers.tiny_classifier_config(**overrides), tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()


def test_all_problems_are_listed_at_once(tmp_path):
  config = helpers.tiny_classifier_config(model="resnet51", batch_size=36)
  with pytest.raises(ValueError) as error:
    train_and_evaluate(config, tmp_path)
  assert "resnet51" in str(error.value) and "36" in str(error.value)


def test_missing_mnist_files_say_where_to_get_them(tmp_path):
  config = helpers.tiny_classifier_config(dataset="mnist", data_dir=str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match=r"nowhere.*yann.lecun.com|nowhere(.|\n)*tfds"):
    train_and_evaluate(config, tmp_path / "run")


def test_config_variant_strings():
  assert parse_variant("batch=8192, rule=legw") == {"batch": "8192", "rule": "legw"}
  assert parse_variant(None) == {}
  with pytest.raises(ValueError, match="key=value pairs"):
    parse_variant("batch8192")


def test_a_checkpoint_config_without_newer_fields_counts_them_as_defaults():
  config = helpers.tiny_classifier_config()
  saved = json.loads(config.to_json())
  del saved["compression"], saved["loss"]["discard_until_epoch"]
  check_resumable(json.dumps(saved), config, "runs/x")
  saved["lr"]["base"] = 0.5
  with pytest.raises(ValueError, match="lr: checkpoint"):
    check_resumable(json.dumps(saved), config, "runs/x")
