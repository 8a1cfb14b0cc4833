"""A tiny adaptive_batch_mnist for the experiment's tests: a 16-unit MNIST LSTM on 256 synthetic digits,
B=16 on micro-batches of 8, the runs of lbjax/configs/adaptive_batch_mnist.py."""

from lbjax.configs import adaptive_batch_mnist
from tests.experiments import tiny_sweep_config

VARIANTS = dict(adaptive_batch_mnist.VARIANTS)
finalize = adaptive_batch_mnist.finalize


def get_config():
  config = tiny_sweep_config.get_config()
  config.batch_size = 16
  config.scaling.base_batch_size = 16
  config.lr.warmup_epochs = 0.125
  config.batch.micro_batch_size = 8
  config.batch.max_batch_size = 64
  config.batch.adapt_every = 2
  config.batch.ema_decay = 0.5
  config.eval_every_epochs = 0.5
  return config
