"""A tiny adaptive_batch_mnist for the experiment's tests: a 16-unit MNIST LSTM on 256 synthetic digits,
B=16 on micro-batches of 8, the runs of lbjax/configs/adaptive_batch_mnist.py."""

from lbjax.configs import adaptive_batch_mnist
from lbjax.train import default_config

VARIANTS = dict(adaptive_batch_mnist.VARIANTS)
finalize = adaptive_batch_mnist.finalize


def get_config():
  config = default_config()
  config.model = "MnistLSTM"
  config.model_options.transform_size = 16
  config.model_options.hidden_size = 16
  config.dataset = "synthetic_mnist"
  config.data_options.num_train_examples = 256
  config.data_options.num_eval_examples = 64
  config.batch_size = 16
  config.eval_batch_size = 64
  config.num_epochs = 1.0
  config.scaling.base_batch_size = 16
  config.lr.base = 0.05
  config.lr.warmup_epochs = 0.125
  config.batch.micro_batch_size = 8
  config.batch.max_batch_size = 64
  config.batch.adapt_every = 2
  config.batch.ema_decay = 0.5
  config.eval_every_epochs = 0.5
  config.log_every = 2
  config.checkpoint_every_steps = 0
  config.progress = False
  return config
