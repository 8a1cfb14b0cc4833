"""Every bad config is refused before any compute, with a message that says what to change."""

import json

import pytest

from lbjax.train import datasets
from lbjax.train import resolved
from lbjax.train import validate
from lbjax.train import train_and_evaluate
from lbjax.train.config import check_resumable
from lbjax.train.errors import ConfigError
from tests.train import helpers


@pytest.mark.parametrize("overrides, message", [
    ({"model": "ResNet51"}, r"config.model='ResNet51' is not a function of lbjax.models. Did you mean 'ResNet50'"),
    ({"dataset": "imagenet21k"}, r"config.dataset='imagenet21k' is not a function of lbjax.train.datasets"),
    ({"optimizer.name": "larz"}, r"config.optimizer.name='larz' is not a function of lbjax.optim or optax. "
                                 r"Did you mean 'lars'\?"),
    ({"lr.decay": "step"}, r"config.lr.decay='step' is not a function of lbjax.schedules.decay"),
    ({"heartbeat_timeout_seconds": 0}, r"config.heartbeat_timeout_seconds must be an integer >= 1 .*got 0"),
    ({"scaling.rule": "cubic"}, r"config.scaling.rule='cubic' is not a function of lbjax.schedules.rules"),
    ({"model": "PtbLSTM", "model_options": {}},
     r"lbjax.models.PtbLSTM is a language model; config.dataset='synthetic_mnist' is a classification dataset"),
    ({"model": "mnist_lstm"}, r"config.model='mnist_lstm' is now 'MnistLSTM'"),
    ({"lr.decay": "poly"}, r"config.lr.decay='poly' is now 'polynomial_decay'"),
    ({"optimizer.clip_global_norm": 1.0}, r"config.optimizer.clip_global_norm is now config.clip_global_norm"),
    ({"optimizer.name": "mclr", "optimizer.nesterov": True, "optimizer.b1": 0.9},
     r"config.optimizer.b1: lbjax.optim.mclr takes no argument 'b1'"),
    ({"optimizer.name": "lamb", "optimizer.momentum": 0.9},
     r"config.optimizer.momentum: lbjax.optim.lamb takes no argument 'momentum'"),
    ({"model_options.hidden_size": 8, "model": "ResNetTiny", "dataset": "synthetic_images"},
     r"config.model_options.hidden_size: lbjax.models.ResNetTiny takes no argument 'hidden_size'"),
    ({"data_options.seq_len": 8}, r"config.data_options.seq_len: lbjax.train.datasets.synthetic_mnist takes no "
                                  r"argument 'seq_len'"),
    ({"model_options.hidden_size": -3}, r"lbjax.models.MnistLSTM\(.*hidden_size=-3.*\) fails: hidden_size must be a "
                                        r"positive int"),
    ({"loss.discard_fraction": 0.1}, r"discards nothing while config.loss.discard_until_epoch is 0"),
    ({"loss.discard_fraction": 0.1, "loss.discard_until_epoch": 1.0, "mesh.per_device_gradients": True},
     r"each device computes its gradient alone and would rank only its own rows"),
    ({"keep_checkpoints": 0}, r"keep_checkpoints must be an integer >= 1"),
    ({"lr.warmup_epochs": 0.5}, r"lr.warmup_epochs=0.5 but config.lr.warmup='none'"),
    ({"compression.num_levels": 4}, r"config.compression sets num_levels but compression.name='none'"),
    ({"compression.name": "qsgd", "compression.num_levels": 0, "mesh.per_device_gradients": True},
     r"config.compression.name='qsgd': lbjax.optim.compression.qsgd refuses its arguments: qsgd: num_levels \(s\) "
     r"must be >= 1, got 0"),
    ({"compression.name": "qsgd", "compression.num_levels": 4, "compression.axis_name": "data"},
     r"config.compression.axis_name is set by the trainer"),
    ({"compression.name": "qsgd", "compression.num_levels": 4, "compression.seed": 2**64},
     r"qsgd: seed must fit a signed 64-bit integer"),
    ({"seed": 2**63}, r"config.seed must be an integer from 0 to 2\*\*63 - 1"),
    ({"batch_size": 36}, r"global batch size 36 is not divisible by the data-parallel size 8"),
    ({"batch_sizes": (32, 64), "batch_size_boundaries": ()}, r"has 2 sizes but .* 0 epochs"),
    # A Python config may set any value: a field the trainer reads has its default's kind.
    ({"eval_every_epochs": "1"}, r"config.eval_every_epochs must be a number, got '1' \(str\)"),
    ({"lr.base": "0.1"}, r"config.lr.base must be a number, got '0.1' \(str\)"),
    ({"log_every": 2.5}, r"config.log_every must be an integer, got 2.5 \(float\)"),
    ({"mesh.per_device_gradients": 1}, r"config.mesh.per_device_gradients must be True or False, got 1 \(int\)"),
    ({"lr.decay": "exponential_decay", "lr.decay_begin_epoch": 3.0, "lr.decay_factor": 0.5},
     r"config.lr.decay_begin_epoch=3 lies outside training \(0 to config.num_epochs=1\); the decay would never begin"),
    ({"batch_size_boundaries": (0.5,)}, r"config.batch_size_boundaries=\(0.5,\) without config.batch_sizes"),
    ({"max_device_batch": 3}, r"cannot split a device share of 4 examples .*max_device_batch=3"),
    ({"lr.warmup": "linear_warmup", "lr.warmup_epochs": 2.0}, r"warmup_epochs=2.0 is longer than training"),
    ({"num_epochs": 0.0}, r"num_epochs must be > 0"),
    ({"eval_batch_size": 12}, r"eval_batch_size=12 must be a positive multiple of the data-parallel size 8"),
    ({"mesh.fsdp": 3}, r"mesh.fsdp=3 does not divide the 8 devices"),
    ({"mesh.data": 2, "mesh.fsdp": 2}, r"2 \* 2 = 4 but there are 8 devices"),
    ({"scaling.rule": "legw", "lr.warmup": "linear_warmup", "lr.warmup_epochs": 0.5, "scaling.base_batch_size": 8},
     r"warm-up \(2 epochs after scaling.rule='legw' from 8 to batch 32\) is not shorter than training"),
    ({"clip_global_norm": -1.0}, r"clip_global_norm must be a number >= 0 \(0 turns clipping off\), got -1.0"),
    ({"model": "ResNetTiny", "model_options": {"dtype": "float8"}, "dataset": "synthetic_images"},
     r"config.model_options.dtype=.float8. is not known"),
    ({"eval_every_epochs": 0.0}, r"config.eval_every_epochs must be > 0 \(epochs between evaluations\), got 0.0"),
    ({"num_epochs": float("inf")}, r"config.num_epochs must be a finite number, got inf"),
    ({"optimizer.momentum": -3.0}, r"config.optimizer.momentum must be in \[0, 1\)"),
    ({"lr.decay": "multistep_decay", "lr.boundaries": (0.5, 2.0)},
     r"config.lr.boundaries \[2.0\] lie outside training \(0 to config.num_epochs=1\)"),
    ({"mesh.num_devices": 16}, r"config.mesh.num_devices=16 but there are 8 devices"),
    ({"data_options.num_train_examples": 16}, r"config.batch_size: a batch of 32 is larger than the training set of "
                                              r"config.dataset='synthetic_mnist' \(16 examples\)"),
    ({"data_options.num_train_examples": -3}, r"synthetic_mnist fails with config.data_options.num_train_examples=-3"),
    ({"init_from": "/nowhere", "resume_with_changed_optimizer": True}, r"config.init_from starts a new run .* Set one"),
    ({"init_from": "/nowhere"}, r"config.init_from='/nowhere': no checkpoints/ folder there"),
    ({"data_options.eval_split": "valid"}, r"config.data_options.eval_split='valid': lbjax.train.datasets."
                                           r"synthetic_mnist takes eval_split 'test' or 'validation' \(did you mean "
                                           r"'validation'\?\)"),
    ({"data_options.num_validation_examples": 5000}, r"config.data_options.num_validation_examples=5000 applies only "
                                                     r"with config.data_options.eval_split='validation', but it is "
                                                     r"'test': remove it \(the default is 10000\)"),
    # ghost BN's groups against the batch one call of the model sees (ResNet.training_batch_multiple)
    ({"model": "ResNetTiny", "dataset": "synthetic_images", "model_options": {"bn_group_size": 16}, "batch_size": 40},
     r"splits each training batch into groups of 16 .* sees the global batch 40: 40 examples"),
    ({"model": "ResNetTiny", "dataset": "synthetic_images", "model_options": {"bn_group_size": 8},
      "mesh.per_device_gradients": True}, r"groups of 8 .* the global batch 32, 4 per device"),
    ({"model": "ResNetTiny", "dataset": "synthetic_images", "model_options": {"bn_group_size": 32}, "batch_size": 128,
      "max_device_batch": 2}, r"groups of 32 .* the global batch 128 in 8 micro-batches .*: 16 examples"),
])
def test_bad_config_is_refused_with_a_clear_message(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(helpers.tiny_classifier_config(**overrides), tmp_path)
  assert not (tmp_path / "metrics.jsonl").exists()


def test_all_problems_are_listed_at_once(tmp_path):
  config = helpers.tiny_classifier_config(model="ResNet51", batch_size=36)
  with pytest.raises(ValueError) as error:
    train_and_evaluate(config, tmp_path)
  assert "ResNet51" in str(error.value) and "36" in str(error.value)


def test_missing_mnist_files_say_where_to_get_them(tmp_path):
  config = helpers.tiny_classifier_config(dataset="mnist", data_options={}, data_dir=str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match=r"nowhere.*yann.lecun.com|nowhere(.|\n)*tfds"):
    train_and_evaluate(config, tmp_path / "run")


def test_a_checkpoint_config_without_newer_fields_counts_them_as_defaults():
  config = helpers.tiny_classifier_config()
  saved = json.loads(config.to_json())
  del saved["compression"], saved["loss"]["discard_until_epoch"]
  check_resumable(json.dumps(saved), config, "runs/x")
  saved["lr"]["base"] = 0.5
  with pytest.raises(ValueError, match="lr: checkpoint"):
    check_resumable(json.dumps(saved), config, "runs/x")


@pytest.mark.parametrize("dataset, tfds_name", [("imagenet", "imagenet2012"), ("cifar10", "cifar10")])
def test_tfds_data_that_is_not_prepared_says_how_to_prepare_it(tmp_path, dataset, tfds_name):
  pytest.importorskip("tensorflow_datasets")
  config = helpers.tiny_resnet_config(dataset=dataset, data_options={}, data_dir=str(tmp_path / "tfds"))
  with pytest.raises(FileNotFoundError, match=rf"TFDS dataset '{tfds_name}' is not prepared .*tfds build {tfds_name}"):
    train_and_evaluate(config, tmp_path / "run")
  assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("field, saved_value, now", [("name", "momentum", "lars"), ("layout", "per_leaf", "flat")])
def test_a_changed_optimizer_may_not_change_the_structure_of_its_state(field, saved_value, now):
  """Even with resume_with_changed_optimizer, another optimizer or layout cannot take the saved state."""
  config = helpers.tiny_classifier_config(resume_with_changed_optimizer=True, optimizer={"name": "lars"})
  saved = json.loads(config.to_json())
  saved["optimizer"][field] = saved_value
  config.optimizer[field] = now
  with pytest.raises(ValueError, match=rf"optimizer\.{field}='{saved_value}', now '{now}'.*--config\.init_from=runs/x"):
    check_resumable(json.dumps(saved), config, "runs/x")


def test_another_num_epochs_on_resume_is_a_recipe_change_when_the_lr_decay_runs_to_it():
  """A cosine or polynomial decay ends at num_epochs: resuming with another one moved the LR mid-run silently
  (0.048 at step 8, 0.077 at step 9). With a constant LR, num_epochs only says how long to train."""
  saved = helpers.tiny_classifier_config(num_epochs=1.0)
  config = helpers.tiny_classifier_config(num_epochs=4.0)
  assert check_resumable(saved.to_json(), config, "runs/x", lr_reads_num_epochs=False) == {}
  with pytest.raises(ValueError, match=r"num_epochs: checkpoint 1.0 vs now 4.0.*The LR decay runs to "
                                       r"config.num_epochs.*--config.resume_with_changed_optimizer=True"):
    check_resumable(saved.to_json(), config, "runs/x", lr_reads_num_epochs=True)
  config.resume_with_changed_optimizer = True
  assert check_resumable(saved.to_json(), config, "runs/x", lr_reads_num_epochs=True) == {"num_epochs": [1.0, 4.0]}


def test_the_decays_that_run_to_the_end_of_training_are_told_apart():
  assert resolved_learning_rate("cosine_decay").reads_num_epochs
  assert resolved_learning_rate("polynomial_decay").reads_num_epochs
  assert not resolved_learning_rate("constant").reads_num_epochs


def resolved_learning_rate(decay: str):
  return validate(helpers.tiny_classifier_config(**{"lr.decay": decay})).learning_rate


class _Device:
  def __init__(self, process_index):
    self.process_index = process_index


@pytest.mark.parametrize("num_devices, refused", [(2, True), (3, True), (4, False), (0, False)])
def test_a_multi_host_mesh_of_some_devices_must_hold_as_many_of_every_process_s(monkeypatch, num_devices, refused):
  """2 processes x 2 devices: the first 2 devices are process 0's; process 1 would have none in the mesh (it died
  in a jax traceback while process 0 waited for it)."""
  devices = [_Device(0), _Device(0), _Device(1), _Device(1)]
  monkeypatch.setattr(resolved.jax, "devices", lambda: devices)
  monkeypatch.setattr(resolved.jax, "device_count", lambda: 4)
  monkeypatch.setattr(resolved.jax, "process_count", lambda: 2)
  plan = resolved.MeshPlan(-1, 1, num_devices, 1, 1, False, 1, False)
  if refused:
    with pytest.raises(ConfigError, match=rf"config.mesh.num_devices={num_devices} takes the first {num_devices} of "
                                          r"the 4 devices of 2 processes: \[\d, \d\] of each process's.*use "
                                          r"config.mesh.num_devices=0"):
      plan.devices()
  else:
    assert plan.devices() == (devices if num_devices else None)


@pytest.mark.parametrize("overrides, changes_the_update", [
    ({}, False),
    ({"loss.discard_fraction": 0.25, "loss.discard_until_epoch": 1.0}, True),  # discarded per micro-batch
    ({"model": "ResNetTiny", "model_options": {"num_filters": 4}}, True),  # BatchNorm over a call's batch
    ({"model": "ResNetTiny", "model_options": {"num_filters": 4, "bn_group_size": 2}}, False),  # over its groups
])
def test_another_max_device_batch_on_resume_is_a_recipe_change_where_micro_batches_change_the_update(
    overrides, changes_the_update):
  """Accumulating micro-batches gives the true batch's update unless the smallest losses are discarded within
  each micro-batch or BatchNorm normalises over it (by 20-30% of an update in one step): a resume with another
  max_device_batch then continues another run, and was accepted without a word."""
  saved = helpers.tiny_classifier_config(**overrides)
  config = helpers.tiny_classifier_config(max_device_batch=2, **overrides)
  run = validate(config)
  assert run.micro_batches_change_the_update == changes_the_update
  if not changes_the_update:
    assert check_resumable(saved.to_json(), config, "runs/x", False, run.micro_batches_change_the_update) == {}
    return
  with pytest.raises(ValueError, match=r"max_device_batch: checkpoint 0 vs now 2.*changes the update"):
    check_resumable(saved.to_json(), config, "runs/x", False, run.micro_batches_change_the_update)


@pytest.mark.parametrize("field, value", [("data", 0), ("data", -2), ("fsdp", 0), ("fsdp", -1), ("stage", 0),
                                          ("model", 0)])
def test_mesh_sizes_no_device_count_allows_are_refused_by_the_checks_dry_run_makes(field, value):
  """They passed --dry-run and were refused only when the run built its mesh."""
  with pytest.raises(ConfigError, match=f"config.mesh.{field} must be"):
    validate(helpers.tiny_classifier_config(**{f"mesh.{field}": value}))


@pytest.fixture(scope="module")
def tiny_imagenet(tmp_path_factory):
  """A prepared TFDS `imagenet2012` of 8 training and 6 validation JPEGs (benchmarks.resnet50_end_to_end)."""
  pytest.importorskip("tensorflow_datasets")
  from benchmarks import resnet50_end_to_end  # pylint: disable=import-outside-toplevel
  data_dir = tmp_path_factory.mktemp("tfds")
  resnet50_end_to_end.write_imagenet_like(data_dir, train_images=8, distinct_images=4, validation_images=6)
  return data_dir


def test_a_tfds_eval_split_may_be_a_slice_and_an_unknown_one_names_the_splits(tiny_imagenet):
  """TFDS's slices ("validation[:3]") were refused as "has no split"; the name of an unknown one is a config error."""
  dataset = datasets.imagenet(tiny_imagenet, eval_split="validation[:3]")
  assert dataset.fingerprint["eval"].endswith(":validation[:3] (3 rows)")
  batches = list(dataset.make_eval_batches(4, 0, 1))
  assert sum(int(b["mask"].sum()) for b in batches) == 3
  with pytest.raises(ValueError, match=r"eval_split 'valid': TFDS dataset 'imagenet2012' .* has the splits "
                                       r"train, validation, and TFDS's slices"):
    datasets.imagenet(tiny_imagenet, eval_split="valid")


@pytest.mark.parametrize("option, message", [("image_size", "image_size must be >= 1, got 0"),
                                             ("num_workers", "num_workers must be >= 0")])
def test_an_image_option_the_stream_refuses_is_a_config_error_before_training(tiny_imagenet, tmp_path, option,
                                                                             message):
  """They passed --dry-run and ended the run in a traceback from the first training stream."""
  value = {"image_size": 0, "num_workers": -1}[option]
  config = helpers.tiny_resnet_config(dataset="imagenet", data_dir=str(tiny_imagenet),
                                      data_options={"image_size": 32, option: value})
  with pytest.raises(ConfigError, match=message):
    train_and_evaluate(config, tmp_path / "run")
  assert not (tmp_path / "run" / "metrics.jsonl").exists()
