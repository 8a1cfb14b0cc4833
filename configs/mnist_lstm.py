"""MNIST LSTM of papers/001 §5.1.1: 28 steps of 28 pixels, momentum 0.9, constant LR, 25 epochs.

Baseline B=128 (the paper reaches 98.8% test accuracy); LEGW's goal is B=8K without re-tuning.

  python -m lbjax.main --config configs/mnist_lstm.py --workdir runs/mnist_lstm
  python -m lbjax.main --config configs/mnist_lstm.py:batch=8192,rule=legw --workdir runs/mnist_8k_legw

Variant keys (`get_config("key=value,...")`):
  batch:     global batch size (default 128).
  rule:      none | linear | goyal | sqrt | legw: how the B=128 recipe is scaled to `batch`
             (goyal = linear scaling + 5-epoch gradual warm-up, the "previous tuning" of Figure 1).
  optimizer: momentum (default) | adam (the adaptive baseline of papers/001 §5.2).
  lr:        baseline learning rate at B=128.
  epochs:    number of epochs (default 25).
  warmup:    LEGW warm-up of the B=128 baseline in epochs (default 0.15625; scaled x k by legw).
"""

from lbjax.train import check_variant_keys, default_config, parse_variant

# From a 5-epoch grid at B=128 over papers/001's effective range [0.01, 0.16]
# (docs/results/mnist_lstm_lr_grid.md): 0.16 scored 98.62%, 0.08 98.39%. We keep 0.08, inside the
# range rather than at its edge (LEGW multiplies it by 8 at B=8K) and what the sweeps were run with.
BASE_LEARNING_RATE = 0.08
ADAM_LEARNING_RATE = 0.001
# LEGW warm-up of the baseline: 0.15625 epochs at B=128 (73 steps), i.e. 10 of the 25 epochs at 8K,
# the same 10-epoch warm-up the paper reaches at its largest batch for ResNet-50 (Table 1).
BASE_WARMUP_EPOCHS = 0.15625


def get_config(arg: str | None = None):
  variant = parse_variant(arg)
  check_variant_keys(variant, ("batch", "rule", "optimizer", "lr", "epochs", "warmup"), "configs/mnist_lstm.py")
  config = default_config()
  config.model = "mnist_lstm"
  config.dataset = "mnist"
  config.num_epochs = float(variant.get("epochs", 25))
  config.batch_size = int(variant.get("batch", 128))
  config.eval_batch_size = 1000
  config.scaling.base_batch_size = 128
  config.scaling.rule = variant.get("rule", "none")
  config.optimizer.name = variant.get("optimizer", "momentum")
  config.optimizer.momentum = 0.9
  adam = config.optimizer.name == "adam"
  config.lr.base = float(variant.get("lr", ADAM_LEARNING_RATE if adam else BASE_LEARNING_RATE))
  config.lr.decay = "constant"
  if config.scaling.rule == "legw":
    config.lr.warmup = "linear"
    config.lr.warmup_epochs = float(variant.get("warmup", BASE_WARMUP_EPOCHS))
  config.log_every = 100
  config.checkpoint_every_steps = 2000
  return config
