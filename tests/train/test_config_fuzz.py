"""A fuzz of config values: each bad value is refused before any compute with a message naming its
field, or it is a valid value; none gives a raw exception, none hangs.

"Before any compute" is checked literally: `Run` is stopped where it would first compile (the
initialisation of the parameters), so every refusal must come from validation, the names, the mesh
or the data checks that precede it.
"""

import math
import random

import pytest

from lbjax import config_files
from lbjax.train import Run
from lbjax.train import build
from lbjax.train.errors import ConfigError
from tests.train import helpers


class ReachedCompute(Exception):
  """Raised where the run would compile its first program: the config was accepted."""


@pytest.fixture(autouse=True)
def stop_before_compute(monkeypatch):
  def initial_state(self):
    raise ReachedCompute()
  monkeypatch.setattr(build.StepParts, "initial_state", initial_state)


def _numeric_fields(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _numeric_fields(value, f"{prefix}{key}.")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      yield f"{prefix}{key}", value


def _outcome(overrides: dict) -> str | None:
  """None if accepted; the message if refused with a `ConfigError`; anything else fails the test."""
  config = helpers.tiny_classifier_config(**overrides)
  try:
    Run(config, None)  # never returns: stopped at `ReachedCompute`
  except ConfigError as e:
    return str(e)
  except ReachedCompute:
    return None


def _names_field(message: str, path: str) -> bool:
  return f"config.{path}" in message or f"--config.{path}" in message


# The values the issue found accepted silently, giving raw exceptions, or hanging: each must be refused.
MUST_REFUSE = [
    {"num_epochs": math.inf},
    {"optimizer.momentum": -3.0},
    {"optimizer.weight_decay": -1.0, "optimizer.name": "lars"},
    {"optimizer.b2": 1.5, "optimizer.name": "lamb"},
    {"lr.warmup_epochs": -0.5, "lr.warmup": "linear_warmup"},
    {"lr.warmup_epochs": math.nan, "lr.warmup": "linear_warmup"},
    {"lr.boundaries": (0.5, 3.0), "lr.decay": "multistep_decay"},
    {"keep_checkpoints": 0},
    {"mesh.num_devices": 16},
    {"mesh.num_devices": -3},
    {"eval_every_epochs": -1.0},
    {"eval_every_epochs": 0.0},
    {"eval_every_epochs": math.nan},
    {"data_options.num_train_examples": 16},  # below the batch size of 32
    {"batch_size": 100_000_000},  # hung building permutations; larger than the training set
    {"batch_size": 100_000},
]


@pytest.mark.parametrize("overrides", MUST_REFUSE, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_each_bad_value_the_issue_found_is_refused_naming_its_field(overrides):
  message = _outcome(overrides)
  assert message is not None, f"{overrides} was accepted"
  field = [k for k in overrides if k not in ("optimizer.name", "lr.warmup", "lr.decay")][0]
  expected = "batch_size" if field.startswith("data_options") else field
  assert _names_field(message, expected) or _names_field(message, field), message


def test_a_misspelled_field_is_refused_naming_the_closest():
  with pytest.raises(ConfigError, match=r"--config.num_epoch: config has no field 'num_epoch'. Did you mean "
                                        r"'num_epochs'"):
    config_files.load("mnist_lstm", ["--config.num_epoch=3"])


def _bad_values(value):
  if isinstance(value, int):
    return [-3, -1, 0, 10**8]
  return [math.nan, math.inf, -math.inf, -1.0, 0.0, 1e8]


# Every numeric field of the tiny config with every bad value, plus a seeded sample of the others.
CASES = [(path, bad) for path, value in _numeric_fields(helpers.tiny_classifier_config())
         for bad in _bad_values(value)]


@pytest.mark.parametrize("path, bad", CASES, ids=[f"{p}={v}" for p, v in CASES])
def test_a_bad_value_is_refused_naming_its_field_or_is_valid(path, bad):
  message = _outcome({path: bad})
  if message is None:  # accepted: a valid value for this field (non-finite numbers never are)
    assert not (isinstance(bad, float) and not math.isfinite(bad)), f"config.{path}={bad} was accepted"
    return
  assert _names_field(message, path), f"config.{path}={bad}: the message names another field:\n{message}"


def test_random_combinations_are_refused_naming_a_field_they_set():
  """Two bad values at once: the message names at least one of them (a seeded sample of pairs)."""
  rng = random.Random(0)
  for _ in range(20):
    (path_a, bad_a), (path_b, bad_b) = rng.sample(CASES, 2)
    message = _outcome({path_a: bad_a, path_b: bad_b})
    if message is not None:
      assert _names_field(message, path_a) or _names_field(message, path_b), (path_a, bad_a, path_b, bad_b, message)


@pytest.mark.parametrize("mask, refusal", [
    ("kernel$", None),
    ("kernal", "config.optimizer (lbjax.optim.lars(mask='kernal')) does not fit the model's parameters: mask "
               "'kernal' matches no parameter; their names: "),
    ("k(", "lbjax.optim.lars refuses its arguments: mask 'k(' is not a regular expression"),
])
def test_an_optimizer_mask_is_a_regular_expression_on_the_parameters_names_checked_before_compute(mask, refusal):
  """`--config.optimizer.mask='kernel$'` chooses the layers LARS scales by their names; one that names no
  parameter, or is not a regular expression, is refused before the first program compiles."""
  outcome = _outcome({"optimizer": {"name": "lars", "mask": mask}})
  assert outcome is None if refusal is None else refusal in outcome, outcome


@pytest.mark.parametrize("sizes, boundaries, refusal", [
    ((32, 64, 128), (0.5, 0.2), "boundaries must be strictly increasing, got 0.5 followed by 0.2"),
    ((32, 64), (0.0,), "boundaries must be epochs > 0, got boundaries[0] = 0.0"),
    ((32, 32), (0.5,), "consecutive batch sizes must differ"),
    ((32, 64), (1.0,), "config.batch_size_boundaries [1.0] lie at or past the end of training (config.num_epochs=1)"),
    ((32, 64), (0.5,), None),
])
def test_a_batch_size_schedule_the_run_could_not_follow_is_refused_before_compute(sizes, boundaries, refusal):
  """It was a ValueError traceback after the data loaded and the model was built (past the end: silently never)."""
  outcome = _outcome({"batch_sizes": sizes, "batch_size_boundaries": boundaries, "batch.policy": "schedule"})
  assert outcome is None if refusal is None else refusal in outcome, outcome


def test_the_adaptive_policy_s_largest_batch_must_fit_the_training_set_before_compute():
  """256 training examples: a policy that may choose 512 would fail mid-run, once the noise scale asked for it."""
  adaptive = {"batch.policy": "adaptive", "batch.micro_batch_size": 8, "batch_size": 16}
  assert _outcome({**adaptive, "batch.max_batch_size": 256}) is None
  assert ("config.batch.max_batch_size (the adaptive policy's largest batch): a batch of 512 is larger than the "
          "training set of config.dataset='synthetic_mnist' (256 examples)" in
          _outcome({**adaptive, "batch.max_batch_size": 512}))
