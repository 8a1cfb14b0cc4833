"""Every config field is consumed: the resolved run reads it, and set away from its default it changes
the resolved run or is refused.

The resolved run (`lbjax.train.resolved`) reads each field it holds through `config.FieldReads`, so its
`consumed_fields` are what the run reads: a field added to the config and never read fails
`test_the_resolved_run_reads_every_field`. A field must also show in `lbjax.train.summary.resolved_run`
(what the run computes) or be one of the operational fields that only change how the run is watched or
stored.
"""

import ml_collections
import pytest

from lbjax.train import config as config_lib
from lbjax.train import summary
from lbjax.train import validation
from lbjax.train.errors import ConfigError
from tests.train import helpers

# Watched or stored, not computed: each is exercised by the trainer tests (metrics cadence, evaluation,
# checkpoints, TensorBoard, console).
WATCHING_FIELDS = {"log_every", "eval_every_epochs", "checkpoint_every_steps", "keep_checkpoints", "tensorboard",
                   "progress", "resume_with_changed_optimizer", "resume_with_changed_data",
                   # how XLA and the multi-host runtime run it: tests/train/test_determinism.py, test_lost_host.py
                   "deterministic", "heartbeat_timeout_seconds",
                   # a trace of a few steps: tests/train/test_profiling.py
                   "profile.num_steps", "profile.skip_steps", "profile.python_calls", "profile.perfetto_trace"}
STRING_VALUES = {"model": "ResNetTiny", "dataset": "synthetic_mnist", "data_dir": "/elsewhere",
                 "optimizer.name": "lars", "lr.warmup": "linear_warmup", "lr.decay": "cosine_decay",
                 "scaling.rule": "sqrt", "compression.name": "one_bit",
                 "init_from": "/elsewhere/run", "batch.policy": "adaptive", "batch.learning_rate": "adascale"}
TOGETHER = {"batch_sizes": {"batch_sizes": (128, 256), "batch_size_boundaries": (0.5,)},
            "batch_size_boundaries": {"batch_sizes": (128, 256), "batch_size_boundaries": (0.5,)},
            "lr.warmup": {"lr.warmup": "linear_warmup", "lr.warmup_epochs": 0.1},
            "compression.name": {"compression.name": "one_bit", "mesh.per_device_gradients": False}}


def _fields(config: ml_collections.ConfigDict, prefix=""):
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _changed(path, value):
  if path in TOGETHER:
    return TOGETHER[path]
  if isinstance(value, bool):
    return {path: not value}
  if isinstance(value, (int, float)):
    new = value * 2 + 1
    return {path: type(value)(new if new != value else value + 2)}
  if isinstance(value, str):
    return {path: STRING_VALUES[path]}
  raise AssertionError(f"no changed value for {path}={value!r}; extend the test")


def _resolved(config):
  return summary.resolved_run(validation.validate(config, data_parallel_size=1))


@pytest.mark.parametrize("name", ["default", "tiny_language_model"])
def test_the_resolved_run_reads_every_field(name):
  config = config_lib.default_config() if name == "default" else helpers.tiny_language_model_config()
  unread = config_lib.field_paths(config) - validation.validate(config).consumed_fields
  assert not unread, f"config fields the resolved run never reads: {', '.join(sorted(unread))}"


@pytest.mark.parametrize("path", [p for p, _ in _fields(config_lib.default_config()) if p not in WATCHING_FIELDS])
def test_a_field_away_from_its_default_changes_the_run_or_is_refused(path):
  baseline = config_lib.default_config()
  before = _resolved(baseline)
  changed = config_lib.default_config()
  helpers.set_fields(changed, _changed(path, dict(_fields(baseline))[path]))
  try:
    after = _resolved(changed)
  except ConfigError:
    return  # refused before any compute, with a message
  assert after != before, f"config.{path} changed neither the resolved run nor was it refused"


def test_the_watching_fields_exist():
  assert WATCHING_FIELDS <= {p for p, _ in _fields(config_lib.default_config())}
