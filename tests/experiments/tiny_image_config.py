"""A tiny image config for the experiments tests: a 4-filter ResNetTiny on 64 synthetic 8x8 images, B=16.

Like lbjax/configs/resnet_tiny_synthetic_cifar.py, `data_options.eval_split` may be "validation".
"""

from lbjax.train import default_config


def get_config():
  config = default_config()
  config.model = "ResNetTiny"
  config.model_options.num_filters = 4
  config.model_options.bn_group_size = 2
  config.dataset = "synthetic_images"
  config.data_options = {"image_size": 8, "num_train_examples": 64, "num_eval_examples": 32, "eval_split": "test"}
  config.batch_size = 16
  config.eval_batch_size = 32
  config.num_epochs = 1.0
  config.scaling.base_batch_size = 16
  config.lr.base = 0.1
  config.log_every = 1
  config.checkpoint_every_steps = 0
  config.progress = False
  return config
