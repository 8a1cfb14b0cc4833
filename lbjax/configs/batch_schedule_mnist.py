"""papers/002 on the MNIST LSTM: the same noise schedule by decaying the LR, growing the batch, or both.

Smith et al. (papers/002 §5.1) decay the SGD noise scale g = eps N / (B (1 - m)) by a factor of 5 in three
steps, realised three ways; they find equal test accuracy with far fewer parameter updates for the
growing batch. Here on the MNIST LSTM of papers/001 §5.1.1 (momentum 0.9, 25 epochs), with steps at
40%, 60% and 80% of training (epochs 10, 15, 20), the schedules derived with lbjax.schedules so that g
is identical at every epoch:

  decay_lr:   B = 128,                   LR 0.08 -> 0.016 -> 0.0032 -> 0.00064
  grow_batch: B = 128 -> 640 -> 3200 -> 16000, LR 0.08 (batch_schedule_from_lr_decay)
  hybrid:     B = 128 -> 640 -> 3200 (B_max), then LR 0.08 -> 0.016 at epoch 20 (hybrid_schedule)

  lbjax-train --config batch_schedule_mnist:schedule=grow_batch --workdir runs/bs_grow
  python -m experiments.batch_schedule --config batch_schedule_mnist --out reproduced/batch_schedule_mnist \
      --workdir runs/batch_schedule_mnist
"""

from lbjax import schedules
from lbjax.configs import mnist_lstm
from lbjax.configs import Variant

NOISE_DECAY_FACTOR = 0.2  # papers/002: the noise scale falls by a factor of 5 at each step
STEP_FRACTIONS = (0.4, 0.6, 0.8)  # three steps, equally spaced in epochs after the first

VARIANTS = {
    "epochs": Variant("number of epochs; the steps stay at 40%, 60%, 80% of training", field="num_epochs"),
    "batch": Variant("initial batch size", field="batch_size"),
    "lr": Variant("initial learning rate", field="lr.base"),
    "seed": Variant("initialisation and shuffling seed", field="seed"),
    "schedule": Variant("how the noise decays", default="decay_lr", choices=("decay_lr", "grow_batch", "hybrid")),
    "max_batch": Variant("hybrid's largest batch B_max (default: batch x 5^2)", type=int, default=0,
                         only_with=("schedule", ("hybrid",))),
}


def get_config():
  """The MNIST LSTM baseline (B=128, LR 0.08, 25 epochs); the schedule is set by finalize."""
  config = mnist_lstm.get_config()
  config.log_every = 50
  return config


def finalize(config, presets):
  """Realises the three-step noise decay as `presets["schedule"]` from the batch, LR and epochs."""
  batch = config.batch_size
  max_batch = presets["max_batch"] or round(batch / NOISE_DECAY_FACTOR**2)
  boundaries = tuple(f * config.num_epochs for f in STEP_FRACTIONS)
  config.scaling.rule = "none"
  config.scaling.base_batch_size = batch
  if presets["schedule"] == "decay_lr":
    _multistep(config, boundaries, NOISE_DECAY_FACTOR)
  elif presets["schedule"] == "grow_batch":
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
      raise ValueError(f"max_batch={max_batch} makes the hybrid LR fall by unequal factors {lr_factors}; "
                       "choose max_batch = batch x 5^n so every LR step is the full factor 5.")
    if lr_boundaries:
      _multistep(config, tuple(lr_boundaries), lr_factors[0])


def _multistep(config, boundaries, factor) -> None:
  config.lr.decay = "multistep_decay"
  config.lr.boundaries = boundaries
  config.lr.decay_factors = factor
