"""A tiny sweepable config for the experiments tests: a 16-unit MNIST LSTM on 256 synthetic digits.

Understands the variant keys of lbjax/configs/mnist_lstm.py (batch, rule, lr, epochs).
"""

from lbjax.configs import Variant
from lbjax.configs._warmup import complete_baseline_warmup
from lbjax.train import default_config

BASE_WARMUP_EPOCHS = 0.125

VARIANTS = {
    "batch": Variant("global batch size", field="batch_size"),
    "rule": Variant("how the B=32 recipe is scaled to `batch`", field="scaling.rule"),
    "lr": Variant("baseline learning rate at B=32", field="lr.base"),
    "epochs": Variant("number of epochs", field="num_epochs"),
}


def get_config():
  """The tiny baseline: B=32, LR 0.05, one epoch."""
  config = default_config()
  config.model = "MnistLSTM"
  config.model_options.transform_size = 16
  config.model_options.hidden_size = 16
  config.dataset = "synthetic_mnist"
  config.data_options.num_train_examples = 256
  config.data_options.num_eval_examples = 64
  config.batch_size = 32
  config.eval_batch_size = 64
  config.num_epochs = 1.0
  config.scaling.base_batch_size = 32
  config.scaling.rule = "none"
  config.lr.base = 0.05
  config.log_every = 2
  config.checkpoint_every_steps = 0
  config.progress = False
  return config


def finalize(config, presets):
  """LEGW gets the baseline a linear warm-up of 0.125 epochs when it has none."""
  del presets
  complete_baseline_warmup(config, BASE_WARMUP_EPOCHS)
