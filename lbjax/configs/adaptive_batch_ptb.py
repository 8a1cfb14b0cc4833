"""The batch from the gradient noise vs fixed and scheduled batches, on the PTB LSTM (papers/001 §5.1.2).

Five runs of the same model and data (lbjax/configs/ptb_lstm.py's paper recipe: momentum 0.9, LR 1.0 at
B=20, no clipping, test perplexity), each on the any-batch step (micro-batches of `micro`, so every run
compiles its train programs once and measures the gradient noise scale B_noise = tr(Sigma)/|G|^2 from
its micro-batches; lbjax.configs._adaptive_batch):

  baseline:   B = 20 throughout (papers/001's baseline)
  legw:       B = `large_batch` throughout, LEGW (LR x sqrt(k), warm-up x k; papers/001 §3)
  grow_batch: B = 20 -> 40 -> ... -> 1280, doubling where the recipe halves the LR, LR held at 1.0
              (papers/002)
  adaptive:   B = `multiple` x B_noise in [20, `max_batch`], never shrinking, LR by LEGW at the batch
              in force (lbjax.train.batch_policy)
  adascale:   the same batch policy, LR = AdaScale gain x the recipe's LR, trained until the
              scale-invariant epochs reach `epochs` (Johnson et al. 2020, Algorithm 1)

The recipe's schedule is kept in proportion to `epochs`: the LR is constant for 7/13 of training, then
halved 6 times, every 1/13 of training (at 13 epochs: papers/001's "constant for 7 epochs, then halved
after each epoch"), and LEGW's baseline warm-up is ptb_lstm's 1/32 epoch of 13 (at 2 epochs: 11 steps of
B=20, i.e. 0.15 epochs at 640; `warmup=` gives it in epochs as it is). Evaluation (test perplexity) every
quarter epoch.

Micro-batch 10, half the baseline batch: the noise scale needs two batch sizes, a micro-batch and the
batch (k >= 2 micro-batches), and every batch of every run must be a whole number of micro-batches. The
LSTM carry is kept per micro-batch (a [10, 200] cell and hidden state per layer) from update to update;
at each batch change the carries restart from zero and the rest of the epoch is re-laid into the new
number of rows (docs/results/adaptive_batch_notes.md, "The PTB LSTM on the any-batch step").

  lbjax-train --config adaptive_batch_ptb:run=adaptive,epochs=2 --workdir runs/adaptive_ptb
  python -m experiments.adaptive_batch --config adaptive_batch_ptb --variant epochs=2 \
      --runs baseline,legw,grow_batch,adaptive,adascale --seeds 0 \
      --out docs/results/adaptive_batch_ptb --workdir runs/adaptive_batch_ptb

Time on this repository's shared 2-core CPU, seed 0, `--variant epochs=0.3` (startup, compiles and 2
evaluations included), at load average 5-7: baseline 156 s, legw 110 s, grow_batch 131 s, adaptive 154 s,
adascale 153 s (it trains until its scale-invariant epochs reach 0.3: 0.36 data epochs); at load 12-16
the baseline took 294 s, legw 235 s, grow_batch 371 s. So `epochs=2` (8 evaluations of about 15 s each)
takes about 9-17 min per run at load 5-7, about 1.2 h for the five, and about twice that at load 12-16
(an estimate from those; measured: 5-17 min per run, 56 min for the five, the wall s of
docs/results/adaptive_batch_ptb.md).
"""

from lbjax import schedules
from lbjax.configs import _adaptive_batch
from lbjax.configs import ptb_lstm

RUNS = _adaptive_batch.RUNS
RECIPE_EPOCHS = 13.0  # papers/001 §5.1.2: constant LR for 7 epochs, then halved after each of 6 epochs
CONSTANT_EPOCHS = 7.0

VARIANTS = _adaptive_batch.variants(ptb_lstm.BASE_BATCH_SIZE, large_batch_size=160)


def get_config():
  """The PTB LSTM baseline (B=20) on micro-batches of 10, evaluated every quarter epoch."""
  config = ptb_lstm.get_config()
  config.num_epochs = RECIPE_EPOCHS
  config.batch.micro_batch_size = 10
  config.batch.max_batch_size = 640
  config.batch.adapt_every = 20
  config.batch.ema_decay = 0.95
  config.eval_every_epochs = 0.25
  config.lr.warmup_epochs = ptb_lstm.BASE_WARMUP_EPOCHS
  return config


def finalize(config, presets):
  """Scales the recipe's LR decay and warm-up to `num_epochs` and sets the batch policy of
  `presets["run"]`; grow_batch doubles the batch at each of the recipe's halvings."""
  every = config.num_epochs / RECIPE_EPOCHS
  config.lr.warmup_epochs *= every
  config.lr.decay_begin_epoch = CONSTANT_EPOCHS * every
  config.lr.decay_every_epochs = every
  halvings = tuple((CONSTANT_EPOCHS + i) * every for i in range(int(RECIPE_EPOCHS - CONSTANT_EPOCHS)))
  grow = schedules.batch_schedule_from_lr_decay(config.batch_size, halvings, config.lr.decay_factor)
  _adaptive_batch.set_run(config, presets["run"], presets["large_batch"], grow)
