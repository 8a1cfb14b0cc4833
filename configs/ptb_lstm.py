"""PTB LSTM of papers/001 §5.1.2: 2 layers of 200, 20-step windows, momentum 0.9, 13 epochs.

The LR is constant for 7 epochs, then halved after each epoch (epochs 7..12). Baseline B=20 (the paper
reaches test perplexity 115.91); LEGW's goal is B=640 without re-tuning. The baseline LR is 1.0, the
value of Zaremba et al.'s small model, inside the 0.1..1.6 range papers/001 §5.3 calls effective.
Evaluation is on the test split (`--config.data_options.eval_split=valid` for validation).

  python -m lbjax.main --config configs/ptb_lstm.py --workdir runs/ptb_b20
  python -m lbjax.main --config configs/ptb_lstm.py:batch=640,rule=legw --workdir runs/ptb_b640_legw

Variant keys (`get_config("key=value,...")`):
  batch:  global batch size (default 20).
  rule:   none | linear | goyal | sqrt | legw: how the B=20 recipe is scaled to `batch`.
  lr:     baseline learning rate at B=20 (default 1.0).
  epochs: number of epochs (default 13); the decay still starts at epoch 7.
  warmup: LEGW warm-up of the B=20 baseline in epochs (default 1/32; scaled x k by legw).
  clip:   global-norm gradient clipping of the per-token mean loss (default 0: off). Zaremba et al.
          clip at 5 on the loss summed over the 20 time steps, i.e. clip=0.25 here.
"""

from lbjax.train import check_variant_keys, default_config, parse_variant

BASE_BATCH_SIZE = 20
BASE_LEARNING_RATE = 1.0  # Zaremba et al. (2014), small model
# LEGW warm-up of the baseline: 1/32 epoch at B=20 (~73 steps), i.e. one epoch at B=640. papers/001
# gives no PTB warm-up; this is the MNIST choice (73 baseline steps) carried over.
BASE_WARMUP_EPOCHS = 0.03125
DECAY_START_EPOCH = 7.0
DECAY_RATE = 0.5


def get_config(arg: str | None = None):
  variant = parse_variant(arg)
  check_variant_keys(variant, ("batch", "rule", "lr", "epochs", "warmup", "clip"), "configs/ptb_lstm.py")
  config = default_config()
  config.model = "ptb_lstm"
  config.model_options.embed_size = 200
  config.model_options.hidden_size = 200
  config.model_options.num_layers = 2
  config.dataset = "ptb"
  config.data_options.seq_len = 20
  config.data_options.eval_split = "test"
  config.num_epochs = float(variant.get("epochs", 13))
  config.batch_size = int(variant.get("batch", BASE_BATCH_SIZE))
  config.eval_batch_size = 20
  config.scaling.base_batch_size = BASE_BATCH_SIZE
  config.scaling.rule = variant.get("rule", "none")
  config.optimizer.name = "momentum"
  config.optimizer.momentum = 0.9
  config.optimizer.clip_global_norm = float(variant.get("clip", 0.0))
  config.lr.base = float(variant.get("lr", BASE_LEARNING_RATE))
  config.lr.decay = "exponential"
  config.lr.decay_start_epoch = DECAY_START_EPOCH
  config.lr.decay_rate = DECAY_RATE
  if config.scaling.rule == "legw":
    config.lr.warmup = "linear"
    config.lr.warmup_epochs = float(variant.get("warmup", BASE_WARMUP_EPOCHS))
  config.log_every = 100
  config.checkpoint_every_steps = 2000
  return config
