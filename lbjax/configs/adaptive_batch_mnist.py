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
from lbjax.configs import _adaptive_batch
from lbjax.configs import mnist_lstm

RUNS = _adaptive_batch.RUNS
# LEGW's baseline warm-up for short runs: 0.03125 epochs at 128, 0.625% of training as 0.15625 of the
# full recipe's 25 epochs is (at 8K: 2 of 5 epochs as 10 of 25).
SHORT_WARMUP_EPOCHS = 0.03125
NOISE_DECAY_FACTOR = 0.2  # papers/002: the noise scale falls by a factor of 5 at each step
STEP_FRACTIONS = (0.4, 0.6, 0.8)

VARIANTS = _adaptive_batch.variants(base_batch_size=128, large_batch_size=1024)


def get_config():
  """The MNIST LSTM baseline on micro-batches of 64, evaluated every quarter epoch."""
  config = mnist_lstm.get_config()
  config.num_epochs = 5.0
  config.batch.micro_batch_size = 64
  config.batch.max_batch_size = 4096
  config.batch.adapt_every = 10
  config.batch.ema_decay = 0.95
  config.eval_every_epochs = 0.25
  config.log_every = 50
  config.lr.warmup_epochs = SHORT_WARMUP_EPOCHS
  return config


def finalize(config, presets):
  """Sets the batch policy and LR recipe of `presets["run"]`; grow_batch: x5 at 40/60/80% of training."""
  grow = schedules.batch_schedule_from_lr_decay(
      config.batch_size, tuple(f * config.num_epochs for f in STEP_FRACTIONS), NOISE_DECAY_FACTOR)
  _adaptive_batch.set_run(config, presets["run"], presets["large_batch"], grow)
