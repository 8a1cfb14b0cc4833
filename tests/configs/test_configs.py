"""The experiment configs reproduce the papers' recipes: Table 1 of papers/001, Table 4 of papers/000,
the PTB schedule of papers/001 §5.1.2 and the equal-noise schedules of papers/002."""

import importlib
import math

import pytest

from lbjax import config_files
from lbjax import train


def _config(name, variant=None, overrides=()):
  return config_files.load(name.removesuffix(".py") + (f":{variant}" if variant else ""), overrides).config


def _lr(config, epoch):
  return float(train.learning_rate_schedule(config)(epoch))


@pytest.mark.parametrize("name", config_files.packaged_names())
def test_every_config_documents_its_command_and_validates(name):
  module = importlib.import_module(f"lbjax.configs.{name}")
  assert f"lbjax-train --config {name}" in module.__doc__
  for key, variant in module.VARIANTS.items():
    assert variant.help and (variant.field is None) == (variant.default is not None or variant.type is bool), key
  train.validate(_config(name), data_parallel_size=1)


# papers/001 Table 1: batch -> (init LR, warm-up epochs), 90 epochs, poly power 2.
TABLE1 = {32768: (2**5.0, 10.0), 16384: (2**4.5, 5.0), 8192: (2**4.0, 2.5), 4096: (2**3.5, 1.25),
          2048: (2**3.0, 0.625), 1024: (2**2.5, 0.3125)}


@pytest.mark.parametrize("batch", sorted(TABLE1))
def test_resnet50_legw_reproduces_table1(batch):
  config = _config("resnet50_imagenet.py", f"batch={batch}")
  peak, warmup = TABLE1[batch]
  assert config.optimizer.name == "lars" and config.num_epochs == 90 and config.lr.power == 2
  train.validate(config, data_parallel_size=8)
  assert _lr(config, warmup / 2) == pytest.approx(peak / 2, rel=1e-5)  # linear warm-up from 0
  assert _lr(config, warmup) == pytest.approx(peak, rel=1e-5)
  # poly(2) from the end of the warm-up to 0 at epoch 90.
  middle = (warmup + 90) / 2
  assert _lr(config, middle) == pytest.approx(peak * 0.25, rel=1e-4)


@pytest.mark.parametrize("batch, peak, warmup", [(256, 4, 0), (1024, 9, 5), (8192, 30, 5), (16384, 33, 12),
                                                 (32768, 40, 12)])
def test_resnet50_table4_rows_of_papers000(batch, peak, warmup):
  config = _config("resnet50_imagenet.py", f"recipe=table4,batch={batch}")
  assert config.batch_size == batch and config.num_epochs == 100
  assert config.optimizer.weight_decay == 0.0005 and config.optimizer.trust_coefficient == 0.001
  assert _lr(config, warmup) == pytest.approx(peak, rel=1e-5)
  if warmup:
    assert _lr(config, warmup / 4) == pytest.approx(peak / 4, rel=1e-5)


def test_resnet50_bad_variants():
  with pytest.raises(ValueError, match="rows for batch sizes"):
    _config("resnet50_imagenet.py", "recipe=table4,batch=4096")
  with pytest.raises(ValueError, match="recipe='sgd': choose one of legw, table4"):
    _config("resnet50_imagenet.py", "recipe=sgd")
  with pytest.raises(ValueError, match="unknown variant key"):
    _config("resnet50_imagenet.py", "batchsize=1024")


def test_resnet50_smoke_runs_on_cpu(tmp_path):
  config = _config("resnet50_imagenet.py", "smoke=1")
  config.progress = False
  result = train.train_and_evaluate(config, tmp_path)
  assert result.step == 8 and not result.preempted
  assert math.isfinite(result.eval_metrics["loss"])
  assert _lr(config, 0.625) == pytest.approx(2**3.0, rel=1e-5)  # LEGW from B=16 to 32


def test_ptb_schedule_of_papers001():
  config = _config("ptb_lstm.py")
  assert (config.batch_size, config.num_epochs, config.optimizer.momentum) == (20, 13, 0.9)
  assert config.data_options.seq_len == 20 and config.model_options.hidden_size == 200
  assert [_lr(config, e) for e in (0, 6.99)] == [1.0, 1.0]  # constant for 7 epochs
  assert [_lr(config, e) for e in (7, 8, 12.5)] == pytest.approx([0.5, 0.25, 0.5**6])  # halved per epoch
  legw = _config("ptb_lstm.py", "batch=640,rule=legw")
  assert _lr(legw, 1.0) == pytest.approx(math.sqrt(32))  # LR x sqrt(32) after 32 x 1/32 epochs
  assert _lr(legw, 0.5) == pytest.approx(math.sqrt(32) / 2)
  assert _lr(legw, 7.5) == pytest.approx(math.sqrt(32) / 2)
  assert config.clip_global_norm == 0.0
  longer_warmup = _config("ptb_lstm.py", "batch=640,rule=legw,warmup=0.0625,clip=0.5")
  assert longer_warmup.clip_global_norm == 0.5
  assert _lr(longer_warmup, 1.0) == pytest.approx(math.sqrt(32) / 2)  # warm-up 32 x 1/16 = 2 epochs


def test_ptb_zaremba_recipe_is_tensorflows_small_config_on_the_per_token_loss():
  """SGD, LR 1 and clip 5 on the loss summed over 20 steps == LR 20 and clip 0.25 on the mean."""
  config = _config("ptb_lstm.py", "recipe=zaremba")
  assert (config.optimizer.name, config.clip_global_norm) == ("sgd", 0.25)
  assert [_lr(config, e) for e in (0, 3.99, 4, 5, 12.5)] == pytest.approx([20, 20, 10, 5, 20 * 0.5**9])
  with pytest.raises(ValueError, match="recipe='adam': choose one of paper, zaremba"):
    _config("ptb_lstm.py", "recipe=adam")


def test_ptb_adam_baseline_keeps_the_recipe_but_the_optimizer_and_lr():
  """papers/001 §5.2: Adam with its default LR at every batch size, the recipe's decay and clipping."""
  paper, adam = _config("ptb_lstm.py", "batch=640"), _config("ptb_lstm.py", "batch=640,optimizer=adam")
  assert (adam.optimizer.name, adam.lr.base) == ("adam", 0.001)
  assert [_lr(adam, e) for e in (0, 7, 8)] == pytest.approx([0.001, 0.0005, 0.00025])
  assert adam.clip_global_norm == paper.clip_global_norm and adam.num_epochs == paper.num_epochs
  train.validate(adam, data_parallel_size=1)


def test_mnist_lstm_legw_at_8k():
  config = _config("mnist_lstm.py", "batch=8192,rule=legw")
  assert _lr(config, 10.0) == pytest.approx(config.lr.base * 8)  # sqrt(64), warm-up 64 x 0.15625
  assert _lr(config, 5.0) == pytest.approx(config.lr.base * 4)


def _noise(config, epoch):
  """g ~ eps / (B (1 - m)) of papers/002 (N and the constant factor dropped)."""
  batch = train.batch_size_schedule(config)(epoch)
  return _lr(config, epoch) / (batch * (1 - config.optimizer.momentum))


def test_batch_schedules_share_the_noise_scale_of_papers002():
  configs = {s: _config("batch_schedule_mnist.py", f"schedule={s}") for s in ("decay_lr", "grow_batch", "hybrid")}
  assert configs["grow_batch"].batch_sizes == (128, 640, 3200, 16000)
  assert configs["hybrid"].batch_sizes == (128, 640, 3200)
  assert tuple(configs["hybrid"].lr.boundaries) == (20.0,)
  for epoch in (0.0, 9.9, 10.0, 14.0, 15.0, 19.9, 20.0, 24.9):
    reference = _noise(configs["decay_lr"], epoch)
    for schedule in ("grow_batch", "hybrid"):
      assert _noise(configs[schedule], epoch) == pytest.approx(reference, rel=1e-9), (schedule, epoch)
  assert _noise(configs["decay_lr"], 24.9) == pytest.approx(_noise(configs["decay_lr"], 0) / 125)


@pytest.mark.parametrize("epochs", [2.0, 13.0])
def test_adaptive_batch_ptb_runs_keep_the_papers001_recipe_in_proportion(epochs):
  """The five runs of adaptive_batch_ptb validate on micro-batches of 10 that divide every batch; the
  baseline's LR and LEGW's warm-up are ptb_lstm's compressed to `epochs` (its own at 13); grow_batch keeps the
  baseline's noise scale eps/B at every epoch (papers/002); legw is LEGW at 160; the adaptive runs
  grow from 20 to at most 640."""
  runs = {r: _config("adaptive_batch_ptb", f"run={r},epochs={epochs:g}") for r in
          ("baseline", "legw", "grow_batch", "adaptive", "adascale")}
  for run, config in runs.items():
    train.validate(config, data_parallel_size=1)
    sizes = (*config.batch_sizes, config.batch_size, config.batch.max_batch_size or config.batch_size)
    assert config.batch.micro_batch_size == 10 and all(b % 10 == 0 and b >= 20 for b in sizes), run
  paper = _config("ptb_lstm")
  grid = [e * epochs / 13 for e in (0.01, 3.0, 6.99, 7.01, 8.5, 12.99)]
  for epoch in grid:
    assert _lr(runs["baseline"], epoch) == pytest.approx(_lr(paper, epoch * 13 / epochs), rel=1e-9), epoch
    assert _noise(runs["grow_batch"], epoch) == pytest.approx(_noise(runs["baseline"], epoch), rel=1e-9), epoch
    assert _lr(runs["adascale"], epoch) == _lr(runs["baseline"], epoch)
  assert runs["grow_batch"].batch_sizes == (20, 40, 80, 160, 320, 640, 1280)
  assert _lr(runs["legw"], grid[1]) == pytest.approx(math.sqrt(160 / 20))
  assert runs["legw"].lr.warmup_epochs == pytest.approx(0.03125 * epochs / 13) and runs["legw"].batch_size == 160
  assert _config("adaptive_batch_ptb", "run=legw,epochs=2,warmup=0.1").lr.warmup_epochs == 0.1
  assert {r: runs[r].batch.policy for r in runs} == {"baseline": "fixed", "legw": "fixed", "grow_batch": "schedule",
                                                     "adaptive": "adaptive", "adascale": "adaptive"}
  assert runs["adaptive"].scaling.rule == "legw" and runs["adascale"].batch.learning_rate == "adascale"
  assert runs["adaptive"].batch.max_batch_size == runs["adascale"].batch.max_batch_size == 640


def test_batch_schedule_bad_variants():
  with pytest.raises(ValueError, match="schedule='cosine': choose one of decay_lr, grow_batch, hybrid"):
    _config("batch_schedule_mnist.py", "schedule=cosine")
  with pytest.raises(ValueError, match="unequal factors"):
    _config("batch_schedule_mnist.py", "schedule=hybrid,max_batch=1000")


def test_a_variant_and_the_override_of_its_field_are_the_same_run():
  """`:batch=8192,rule=legw` and `:batch=8192 --config.scaling.rule=legw` resolve identically; so do
  every field-alias variant key of every packaged config and its --config override."""
  variant = _config("mnist_lstm", "batch=8192,rule=legw")
  override = _config("mnist_lstm", "batch=8192", ["--config.scaling.rule=legw"])
  assert variant.to_json() == override.to_json()
  assert variant.lr.warmup == "linear_warmup" and variant.lr.warmup_epochs == 0.15625
  for name in config_files.packaged_names():
    module = importlib.import_module(f"lbjax.configs.{name}")
    for key, declared in module.VARIANTS.items():
      if declared.field is None:
        continue
      value = {"batch_size": "256", "scaling.rule": "sqrt", "lr.base": "0.5", "num_epochs": "3",
               "lr.warmup_epochs": "0.5", "seed": "3", "clip_global_norm": "0.5",
               "batch.micro_batch_size": "32", "batch.max_batch_size": "2048",
               "batch.noise_multiple": "2.0"}.get(declared.field)
      value = value or {"mnist_lstm": "validation", "ptb_lstm": "valid"}.get(name)
      by_variant = _config(name, f"{key}={value}")
      by_override = _config(name, None, [f"--config.{declared.field}={value}"])
      assert by_variant.to_json() == by_override.to_json(), (name, key)


def test_an_explicit_setting_wins_over_what_the_config_derives():
  config = _config("mnist_lstm", "rule=legw", ["--config.lr.warmup_epochs=0.5"])
  assert config.lr.warmup_epochs == 0.5
  assert _config("ptb_lstm", "recipe=zaremba", ["--config.lr.base=3"]).lr.base == 3.0


@pytest.mark.parametrize("spec, overrides, message", [
    ("mnist_lstm:batch=abc", (), r"variant batch \(config.batch_size\)='abc': expected int"),
    ("mnist_lstm:batsh=8", (), r"unknown variant key 'batsh' \(did you mean 'batch'\?\)"),
    ("mnist_lstm", ("--config.num_epoch=3",), r"config has no field 'num_epoch'. Did you mean 'num_epochs'"),
    ("mnist_lstm", ("--config.optimiser.momentum=0.5",), r"no section 'optimiser'. Did you mean 'optimizer'"),
    ("mnist_lstm", ("--config.lr.base=fast",), r"--config.lr.base='fast': expected float"),
    ("mnist_lsmt", (), r"No config named 'mnist_lsmt'. Did you mean 'mnist_lstm'"),
    ("configs/mnist_lstm.py", (), r"Config file configs/mnist_lstm.py not found. The packaged config 'mnist_lstm'"),
    # a batch size beside a schedule that does not start at it would be ignored: the schedule gives every batch
    ("mnist_lstm", ("--config.batch_sizes=(128,256)", "--config.batch_size_boundaries=(1.0,)",
                    "--config.batch_size=512"),
     r"--config.batch_size=512 is not used: config.batch_sizes=\(128, 256\) gives the batch size of every epoch"),
    ("mnist_lstm:batch=512", ("--config.batch_sizes=(128,256)", "--config.batch_size_boundaries=(1.0,)"),
     r"variant batch \(config.batch_size\)=512 is not used"),
    # a preset key that the other presets make moot
    ("batch_schedule_mnist:schedule=grow_batch,max_batch=3200", (),
     r"variant max_batch=3200 applies only with schedule=hybrid, and schedule is grow_batch: remove max_batch, or set "
     r"schedule\."),
    ("adaptive_batch_mnist:large_batch=512", (), r"variant large_batch=512 applies only with run=legw, and run is "
                                                 r"adaptive"),
])
def test_bad_settings_name_the_key_and_what_it_wants(spec, overrides, message):
  with pytest.raises(train.ConfigError, match=message):
    config_files.load(spec, overrides)


COPY_A_PACKAGED_CONFIG = "A config file defines get_config() returning lbjax.train.default_config() with its changes"


@pytest.mark.parametrize("source, message", [
    ("X = 1\n", r"defines no get_config\(\)\. "),
    ("def get_config():\n  return {'model': 'MnistLSTM'}\n",
     r"get_config\(\) returned a dict, not an ml_collections.ConfigDict\. "),
    ("import ml_collections\n\ndef get_config():\n  return ml_collections.ConfigDict({'batch_size': 8})\n",
     r"get_config\(\) returned a config without batch.adapt_every, .* and \d+ more\. "),
    ("def get_config(:\n  pass\n", r"has a syntax error at line 1: "),
    ("import no_such_module_xyz\n", r"failed to import at line 1: No module named 'no_such_module_xyz'\. Install the "),
    ("def get_config():\n  return 1 / 0\n", r"get_config\(\) raised ZeroDivisionError at line 2: division by zero\. "),
])
def test_a_config_file_that_is_not_a_config_says_what_is_wrong_and_what_a_config_file_defines(tmp_path, source,
                                                                                               message):
  path = tmp_path / "my_config.py"
  path.write_text(source)
  with pytest.raises(train.ConfigError, match=message) as error:
    config_files.load(str(path))
  assert str(error.value).startswith(f"Config file {path}")
  assert COPY_A_PACKAGED_CONFIG in str(error.value) and "lbjax/configs/mnist_lstm.py" in str(error.value)


def test_a_config_file_setting_a_field_a_run_does_not_have_is_refused_naming_it(tmp_path):
  path = tmp_path / "my_config.py"
  path.write_text("from lbjax.train import default_config\n\ndef get_config():\n  config = default_config()\n"
                  "  config.num_epoch = 3\n  config.optimizer.nesterov = True\n  return config\n")
  with pytest.raises(train.ConfigError, match=r"get_config\(\) sets fields a run does not have: 'num_epoch' \(did "
                                              r"you mean 'num_epochs'\?\)\. Only the argument sections"):
    config_files.load(str(path))
