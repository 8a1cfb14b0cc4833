"""MNIST LSTM of papers/001 §5.1.1 (Figure 1): 28 steps of 28 pixels, momentum 0.9, constant LR, 25 epochs.

Baseline B=128 (the paper reaches 98.8% test accuracy); LEGW's goal is B=8K without re-tuning.

  lbjax-train --config mnist_lstm --workdir runs/mnist_lstm
  lbjax-train --config mnist_lstm:batch=8192,rule=legw --workdir runs/mnist_8k_legw

`rule=legw` scales the baseline's warm-up: when the config gives none, the baseline gets a linear
warm-up of `BASE_WARMUP_EPOCHS` (so `--config.scaling.rule=legw` is the same run as `:rule=legw`).
Choose learning rates with `eval_split=validation` (10k examples held out of the 60k training set).
"""

from lbjax.configs import Variant
from lbjax.configs._warmup import complete_baseline_warmup
from lbjax.train import default_config

# Chosen on the validation split (10k held out of the training set), 25 epochs at B=128 inside
# papers/001's effective range [0.01, 0.16]: 0.04 98.69%, 0.08 98.94%, 0.16 98.64%
# (docs/results/mnist_lstm_lr_grid_validation.md).
BASE_LEARNING_RATE = 0.08
ADAM_LEARNING_RATE = 0.001
# LEGW warm-up of the baseline: 0.15625 epochs at B=128 (73 steps), i.e. 10 of the 25 epochs at 8K,
# the same 10-epoch warm-up the paper reaches at its largest batch for ResNet-50 (Table 1).
BASE_WARMUP_EPOCHS = 0.15625

VARIANTS = {
    "batch": Variant("global batch size", field="batch_size"),
    "rule": Variant("how the B=128 recipe is scaled to `batch`: none, linear, sqrt, goyal, legw",
                    field="scaling.rule"),
    "lr": Variant("baseline learning rate at B=128", field="lr.base"),
    "epochs": Variant("number of epochs", field="num_epochs"),
    "warmup": Variant("warm-up of the B=128 baseline in epochs (LEGW scales it by k)", field="lr.warmup_epochs"),
    "seed": Variant("initialisation and shuffling seed", field="seed"),
    "eval_split": Variant("test, or validation (held out of the training set)", field="data_options.eval_split"),
    "optimizer": Variant("momentum, or adam (the adaptive baseline of papers/001 §5.2, LR 0.001)",
                         default="momentum", choices=("momentum", "adam")),
}


def get_config():
  config = default_config()
  config.model = "MnistLSTM"
  config.dataset = "mnist"
  config.num_epochs = 25.0
  config.batch_size = 128
  config.eval_batch_size = 1000
  config.scaling.base_batch_size = 128
  config.optimizer.name = "momentum"
  config.optimizer.momentum = 0.9
  config.lr.base = BASE_LEARNING_RATE
  config.lr.decay = "constant"
  config.log_every = 100
  config.checkpoint_every_steps = 2000
  return config


def finalize(config, presets):
  if presets["optimizer"] == "adam":
    config.optimizer = {"name": "adam"}
    config.lr.base = ADAM_LEARNING_RATE
  complete_baseline_warmup(config, BASE_WARMUP_EPOCHS)
