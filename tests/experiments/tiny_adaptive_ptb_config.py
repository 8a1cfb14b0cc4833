"""A tiny adaptive_batch_ptb: an 8-unit PTB LSTM on 8,000 synthetic tokens, B=16 on micro-batches of 8.

The runs of lbjax/configs/adaptive_batch_ptb.py, for the experiment's tests."""

from lbjax.configs import adaptive_batch_ptb

VARIANTS = dict(adaptive_batch_ptb.VARIANTS)
finalize = adaptive_batch_ptb.finalize


def get_config():
  config = adaptive_batch_ptb.get_config()
  config.model_options = {"embed_size": 8, "hidden_size": 8, "num_layers": 2}
  config.dataset = "synthetic_ptb"
  config.data_options = {"vocab_size": 20, "num_train_tokens": 8000, "num_eval_tokens": 800, "seq_len": 10}
  config.num_epochs = 1.0
  config.batch_size = config.eval_batch_size = config.scaling.base_batch_size = 16
  config.lr.base = 0.5
  config.lr.warmup_epochs = 0.125
  config.batch.micro_batch_size = 8
  config.batch.max_batch_size = 64
  config.batch.adapt_every = 2
  config.batch.ema_decay = 0.5
  config.eval_every_epochs = 0.5
  config.log_every = 4
  config.checkpoint_every_steps = 0
  config.progress = False
  return config
