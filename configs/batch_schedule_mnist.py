"""papers/002 on the MNIST LSTM: the same noise schedule by decaying the LR, growing the batch, or both.

Smith et al. (papers/002 §5.1) decay the SGD noise scale g = eps N / (B (1 - m)) by a factor of 5 in three
steps, realised three ways; they find equal test accuracy with far fewer parameter updates for the
growing batch. Here on the MNIST LSTM of papers/001 §5.1.1 (momentum 0.9, 25 epochs), with steps at
40%, 60% and 80% of training (epochs 10, 15, 20), the schedules derived with lbjax.schedules so that g
is identical at every epoch:

  decay_lr:   B = 128,                   LR 0.08 -> 0.016 -> 0.0032 -> 0.00064
  grow_batch: B = 128 -> 640 -> 3200 -> 16000, LR 0.08 (batch_schedule_from_lr_decay)
  hybrid:     B = 128 -> 640 -> 3200 (B_max), then LR 0.08 -> 0.016 at epoch 20 (hybrid_schedule)

  python -m lbjax.main --config configs/batch_schedule_mnist.py:schedule=grow_batch --workdir runs/bs_grow
  python -m experiments.batch_schedule --config configs/batch_schedule_mnist.py \
      --out docs/results/batch_schedule_mnist --workdir runs/batch_schedule_mnist

Variant keys (`get_config("key=value,...")`):
  schedule:  decay_lr (default) | grow_batch | hybrid.
  epochs:    number of epochs (default 25); the steps stay at 40%, 60%, 80% of training.
  batch:     initial batch size (default 128).
  max_batch: hybrid's largest batch B_max (default 3200 = 128 x 5^2).
  lr:        initial learning rate (default: configs/mnist_lstm.py's tuned BASE_LEARNING_RATE).
"""

import importlib.util
import pathlib

from lbjax import schedules
from lbjax.train import check_variant_keys, default_config, parse_variant

SCHEDULES = ("decay_lr", "grow_batch", "hybrid")
NOISE_DECAY_FACTOR = 0.2  # papers/002: the noise scale falls by a factor of 5 at each step
STEP_FRACTIONS = (0.4, 0.6, 0.8)  # three steps, equally spaced in epochs after the first


def _mnist_lstm_config(arg: str):
  path = pathlib.Path(__file__).with_name("mnist_lstm.py")
  spec = importlib.util.spec_from_file_location("lbjax_configs_mnist_lstm", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def get_config(arg: str | None = None):
  """The MNIST LSTM with the `schedule` realisation of the three-step noise decay."""
  variant = parse_variant(arg)
  check_variant_keys(variant, ("schedule", "epochs", "batch", "max_batch", "lr"), "configs/batch_schedule_mnist.py")
  schedule = variant.get("schedule", "decay_lr")
  if schedule not in SCHEDULES:
    raise ValueError(f"configs/batch_schedule_mnist.py: schedule={schedule!r} is not known; choose one of "
                     f"{', '.join(SCHEDULES)}.")
  base = variant.get("lr")
  config = _mnist_lstm_config(f"epochs={variant.get('epochs', 25)}" + (f",lr={base}" if base else ""))
  batch = int(variant.get("batch", 128))
  max_batch = int(variant.get("max_batch", round(batch / NOISE_DECAY_FACTOR**2)))
  boundaries = tuple(f * config.num_epochs for f in STEP_FRACTIONS)
  config.scaling.rule = "none"
  config.scaling.base_batch_size = batch
  config.batch_size = batch
  if schedule == "decay_lr":
    config.lr.decay = "multistep"
    config.lr.boundaries = boundaries
    config.lr.factor = NOISE_DECAY_FACTOR
  elif schedule == "grow_batch":
    batch_schedule = schedules.batch_schedule_from_lr_decay(batch, boundaries, NOISE_DECAY_FACTOR)
    config.batch_sizes = batch_schedule.sizes
    config.batch_size_boundaries = batch_schedule.boundaries
  else:
    hybrid = schedules.hybrid_schedule(batch, config.lr.base, boundaries, NOISE_DECAY_FACTOR, max_batch)
    config.batch_sizes = hybrid.batch_size_schedule.sizes
    config.batch_size_boundaries = hybrid.batch_size_schedule.boundaries
    lr_boundaries, lr_factors = [], []
    for boundary in boundaries:  # read the LR steps back from hybrid_schedule's LR schedule
      ratio = hybrid.learning_rate_schedule(boundary) / hybrid.learning_rate_schedule(boundary - 1e-6)
      if abs(ratio - 1.0) > 1e-9:
        lr_boundaries.append(boundary)
        lr_factors.append(ratio)
    if any(abs(f - lr_factors[0]) > 1e-9 for f in lr_factors):
      raise ValueError(f"configs/batch_schedule_mnist.py: max_batch={max_batch} makes the hybrid LR fall "
                       f"by unequal factors {lr_factors}; choose max_batch = batch x 5^n so every LR step "
                       "is the full factor 5.")
    if lr_boundaries:
      config.lr.decay = "multistep"
      config.lr.boundaries = tuple(lr_boundaries)
      config.lr.factor = lr_factors[0]
  config.log_every = 50
  return config
