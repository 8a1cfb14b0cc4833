"""A tiny PTB LSTM for the experiments tests: 8 units, 2 layers, 4,000 synthetic tokens, B=16, 6 steps."""

from lbjax.train import default_config


def get_config():
  config = default_config()
  config.model = "PtbLSTM"
  config.model_options = {"embed_size": 8, "hidden_size": 8, "num_layers": 2}
  config.dataset = "synthetic_ptb"
  config.data_options = {"vocab_size": 20, "num_train_tokens": 4000, "num_eval_tokens": 300, "seq_len": 10}
  config.batch_size = config.eval_batch_size = config.scaling.base_batch_size = 16
  config.num_steps = 6
  config.lr.base = 0.5
  config.log_every = 3
  config.progress = False
  return config
