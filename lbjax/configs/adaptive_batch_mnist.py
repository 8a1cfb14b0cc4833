"""The batch from the gradient noise vs fixed and scheduled batches, on the MNIST LSTM (papers/001 §5.1.1).

Five runs of the same model and data (momentum 0.9, baseline LR 0.08 at B=128), each on the any-batch
step (micro-batches of `micro`, so every run compiles its train programs once and measures the
gradient noise scale B_noise = tr(Sigma)/|G|^2 from its micro-batches):

  baseline:   B = 128 throughout (papers/001's baseline)
  legw:       B = `large_batch` throughout, LEGW (LR x sqrt(k), warm-up x k; papers/001 §3)
  grow_batch: B = 128 -> 640 -> 3200 -> 16000 at 40/60/80% of training, LR held (papers/002)
  adaptive:   B = `multiple` x B_noise in [128, `max_batch`], never shrinking, LR by LEGW at the
              batch in force (lbjax.train.batch_policy)
  adascale:   the same batch policy, LR = AdaScale gain x 0.08, trained until the scale-invariant
              epochs (not the data epochs) reach `epochs` (Johnson et al. 2020, Algorithm 1)

  lbjax-train --config adaptive_batch_mnist:run=adaptive --workdir runs/adaptive
  python -m experiments.adaptive_batch --config adaptive_batch_mnist --variant epochs=2 \
      --out docs/results/adaptive_batch_mnist --workdir runs/adaptive_batch_mnist
"""

from lbjax import schedules
from lbjax.configs import mnist_lstm
from lbjax.train.config_files import Variant

RUNS = ("baseline", "legw", "grow_batch", "adaptive", "adascale")
# LEGW's baseline warm-up for short runs: 0.03125 epochs at 128, 0.625% of training as 0.15625 of the
# full recipe's 25 epochs is (at 8K: 2 of 5 epochs as 10 of 25).
SHORT_WARMUP_EPOCHS = 0.03125
NOISE_DECAY_FACTOR = 0.2  # papers/002: the noise scale falls by a factor of 5 at each step
STEP_FRACTIONS = (0.4, 0.6, 0.8)

VARIANTS = {
    "run": Variant("which batch policy: " + ", ".join(RUNS), default="adaptive", choices=RUNS),
    "epochs": Variant("number of epochs", field="num_epochs"),
    "seed": Variant("initialisation and shuffling seed", field="seed"),
    "micro": Variant("micro-batch of the any-batch step", field="batch.micro_batch_size"),
    "large_batch": Variant("legw's fixed batch", type=int, default=1024),
    "max_batch": Variant("adaptive/adascale's largest batch", field="batch.max_batch_size"),
    "multiple": Variant("adaptive: next batch = multiple x B_noise", field="batch.noise_multiple"),
    "warmup": Variant("LEGW's warm-up of the B=128 baseline in epochs", field="lr.warmup_epochs"),
}


def get_config():
  """The MNIST LSTM baseline on micro-batches of 64, evaluated every quarter epoch."""
  config = mnist_lstm.get_config()
  config.num_epochs = 5.0
  config.batch.micro_batch_size = 64
  config.batch.adapt_every = 10
  config.batch.ema_decay = 0.95
  config.eval_every_epochs = 0.25
  config.log_every = 50
  config.lr.warmup_epochs = SHORT_WARMUP_EPOCHS
  return config


def finalize(config, presets):
  """Sets the batch policy and LR recipe of `presets["run"]`."""
  run = presets["run"]
  warmup = config.lr.warmup_epochs
  config.lr.warmup_epochs = 0.0
  if run in ("legw", "adaptive"):
    config.scaling.rule = "legw"
    config.lr.warmup, config.lr.warmup_epochs = "linear_warmup", warmup
  if run == "legw":
    config.batch.policy = "fixed"
    config.batch_size = presets["large_batch"]
  elif run == "grow_batch":
    grow = schedules.batch_schedule_from_lr_decay(
        config.batch_size, tuple(f * config.num_epochs for f in STEP_FRACTIONS), NOISE_DECAY_FACTOR)
    config.batch_sizes, config.batch_size_boundaries = grow.sizes, grow.boundaries
  elif run in ("adaptive", "adascale"):
    config.batch.policy = "adaptive"
    config.batch.max_batch_size = config.batch.max_batch_size or 4096
    if run == "adascale":
      config.batch.learning_rate = "adascale"
  else:
    config.batch.policy = "fixed"
  if run not in ("adaptive", "adascale"):
    config.batch.max_batch_size = 0
    config.batch.noise_multiple = 1.0
