"""Tiny run configs shared by the trainer tests."""

import jax
import numpy as np

from lbjax import data as lbdata
from lbjax.train import default_config


def set_fields(config, overrides):
  """Sets dotted fields, adding keyword arguments to the argument sections as a command line can."""
  for path, value in overrides.items():
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
      node = node[part]
    with node.ignore_type():
      node[leaf] = value
  return config


def tiny_classifier_config(**overrides):
  """A 16-unit MNIST LSTM on 256 synthetic digits: 8 steps of 32 per epoch."""
  config = default_config()
  config.model = "MnistLSTM"
  config.model_options.transform_size = 16
  config.model_options.hidden_size = 16
  config.dataset = "synthetic_mnist"
  config.data_options = {"num_train_examples": 256, "num_eval_examples": 64}
  config.batch_size = 32
  config.eval_batch_size = 32
  config.num_epochs = 1.0
  config.lr.base = 0.05
  config.log_every = 4
  config.progress = False
  return set_fields(config, overrides)


def tiny_resnet_config(**overrides):
  """ResNetTiny with ghost BN (groups of 8) on 8x8 synthetic images."""
  config = tiny_classifier_config()
  config.model = "ResNetTiny"
  config.model_options = {"bn_group_size": 8, "num_filters": 4}
  config.dataset = "synthetic_images"
  config.data_options = {"num_train_examples": 256, "num_eval_examples": 64, "image_size": 8}
  return set_fields(config, overrides)


def tiny_language_model_config(**overrides):
  """An 8-unit 2-layer PTB LSTM on 4,000 synthetic tokens (vocabulary 20)."""
  config = default_config()
  config.model = "PtbLSTM"
  config.model_options = {"embed_size": 8, "hidden_size": 8, "dropout_rate": 0.1}
  config.dataset = "synthetic_ptb"
  config.data_options = {"vocab_size": 20, "num_train_tokens": 4000, "num_eval_tokens": 800, "seq_len": 10}
  config.batch_size = 16
  config.eval_batch_size = 16
  config.num_epochs = 2.0
  config.lr.base = 0.5
  config.log_every = 4
  config.progress = False
  return set_fields(config, overrides)


def host_tree(tree):
  """A pytree of device arrays as numpy arrays."""
  return jax.tree.map(np.asarray, jax.device_get(tree))


def assert_trees_equal(a, b):
  """Bit-identical pytrees."""
  jax.tree.map(np.testing.assert_array_equal, host_tree(a), host_tree(b))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=rtol, atol=atol), host_tree(a), host_tree(b))


def poisoned(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """`batch` with every label one past the last of the 10 classes: its loss is NaN (`lbjax.models.losses`
  makes a label outside [0, K) NaN, so that the trainer stops at it); the digits' uint8 pixels cannot be."""
  return {**batch, "labels": np.full_like(batch["labels"], 10)}


def poison_train_batch(monkeypatch, draw: int) -> list[None]:
  """Makes the `draw`-th training batch drawn (1-based) `poisoned`; returns the list of draws so far."""
  next_batch = lbdata.TrainStream.next_batch
  draws = []

  def poisoned_next_batch(self, global_batch_size):
    batch = next_batch(self, global_batch_size)
    draws.append(None)
    return poisoned(batch) if len(draws) == draw else batch

  monkeypatch.setattr(lbdata.TrainStream, "next_batch", poisoned_next_batch)
  return draws


class MetricsRunView:
  """What `hooks.WriteMetrics` reads of a run, set by hand."""

  def __init__(self):
    self.step_count, self.epoch, self.examples_seen, self.batch_size = 0, 0.5, 800, 16
    self.stream, self.latest_call_steps = None, 1


def window_steps(count: int, accumulating_from: int) -> list[dict[str, float]]:
  """`count` steps' metric values (loss, update norm, a learning rate rising by 1 a step), and from the
  step `accumulating_from` (0-based) on the two gradient noise-scale ingredients too."""
  rng = np.random.default_rng(0)
  steps = [{"loss": rng.normal(), "update_norm": rng.random(), "learning_rate": 0.1 + i} for i in range(count)]
  for values in steps[accumulating_from:]:
    values.update(noise_scale_grad_norm_sq=rng.random(), noise_scale_trace_sigma=rng.random())
  return steps
