"""A tiny sweepable config for the experiments tests: a 16-unit MNIST LSTM on 256 synthetic digits.

Understands the variant keys of configs/mnist_lstm.py (batch, rule, lr, epochs).
"""

from lbjax.train import check_variant_keys, default_config, parse_variant


def get_config(arg: str | None = None):
  """The tiny baseline (B=32, LR 0.05, LEGW warm-up 0.125 epochs), scaled to `batch` by `rule`."""
  variant = parse_variant(arg)
  check_variant_keys(variant, ("batch", "rule", "lr", "epochs"), "tiny_sweep_config.py")
  config = default_config()
  config.model = "mnist_lstm"
  config.model_options.transform_size = 16
  config.model_options.hidden_size = 16
  config.dataset = "synthetic_mnist"
  config.data_options.num_train_examples = 256
  config.data_options.num_eval_examples = 64
  config.batch_size = int(variant.get("batch", 32))
  config.eval_batch_size = 64
  config.num_epochs = float(variant.get("epochs", 1))
  config.scaling.base_batch_size = 32
  config.scaling.rule = variant.get("rule", "none")
  config.lr.base = float(variant.get("lr", 0.05))
  if config.scaling.rule == "legw":
    config.lr.warmup = "linear"
    config.lr.warmup_epochs = 0.125
  config.log_every = 2
  config.checkpoint_every_steps = 0
  config.progress = False
  return config
