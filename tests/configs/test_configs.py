"""The experiment configs reproduce the papers' recipes: Table 1 of papers/001, Table 4 of papers/000,
the PTB schedule of papers/001 §5.1.2 and the equal-noise schedules of papers/002."""

import math
import pathlib

import pytest

from experiments import config_files
from lbjax import train

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _config(name, variant=None):
  return config_files.load_config(CONFIGS / name, variant)


def _lr(config, epoch):
  return float(train.learning_rate_schedule(config)(epoch))


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.py")))
def test_every_config_documents_its_command_and_validates(name):
  text = (CONFIGS / name).read_text()
  assert "python -m lbjax.main --config configs/" + name in text
  config = _config(name)
  train.validate(config, data_parallel_size=1)


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
  with pytest.raises(ValueError, match="recipe='sgd' is not known"):
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
  assert config.optimizer.clip_global_norm == 0.0
  longer_warmup = _config("ptb_lstm.py", "batch=640,rule=legw,warmup=0.0625,clip=0.5")
  assert longer_warmup.optimizer.clip_global_norm == 0.5
  assert _lr(longer_warmup, 1.0) == pytest.approx(math.sqrt(32) / 2)  # warm-up 32 x 1/16 = 2 epochs


def test_ptb_zaremba_recipe_is_tensorflows_small_config_on_the_per_token_loss():
  """SGD, LR 1 and clip 5 on the loss summed over 20 steps == LR 20 and clip 0.25 on the mean."""
  config = _config("ptb_lstm.py", "recipe=zaremba")
  assert (config.optimizer.name, config.optimizer.clip_global_norm) == ("sgd", 0.25)
  assert [_lr(config, e) for e in (0, 3.99, 4, 5, 12.5)] == pytest.approx([20, 20, 10, 5, 20 * 0.5**9])
  with pytest.raises(ValueError, match="unknown recipe 'adam'; choose one of paper, zaremba"):
    _config("ptb_lstm.py", "recipe=adam")


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


def test_batch_schedule_bad_variants():
  with pytest.raises(ValueError, match="schedule='cosine' is not known"):
    _config("batch_schedule_mnist.py", "schedule=cosine")
  with pytest.raises(ValueError, match="unequal factors"):
    _config("batch_schedule_mnist.py", "schedule=hybrid,max_batch=1000")
