"""The reference config of `measure` and its grid of branch points, batch sizes and LR multipliers."""

import dataclasses
import math
from typing import Sequence

import ml_collections

from experiments import runner
from lbjax import config_files
from lbjax import train
from lbjax.train import batch_plan
from lbjax.train import optimizer as optimizer_lib


def load_config(config: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """`config` (`name[:variant]` or a file) with `field=value` overrides, as `lbjax-train` loads it."""
  return config_files.load(config, [f"--config.{o}" for o in overrides]).config


def at_batch(config: ml_collections.ConfigDict, batch_size: int, lr_multiplier: float = 1.0
             ) -> ml_collections.ConfigDict:
  """The config as a fixed-batch run at `batch_size`, its baseline LR times `lr_multiplier` (the scaling
  rule maps it to `batch_size`)."""
  branch = ml_collections.ConfigDict(config.to_dict())
  branch.batch.policy = "fixed"
  branch.batch_size = batch_size
  branch.batch_sizes, branch.batch_size_boundaries = (), ()
  for field, default in batch_plan.ADAPTIVE_FIELDS.items():
    branch.batch[field] = default
  branch.lr.base = config.lr.base * lr_multiplier
  return branch


@dataclasses.dataclass(frozen=True)
class Grid:
  """What `measure` trains: branch points (epochs), batch sizes, LR multipliers and the budget.

  Attributes:
    checkpoints: epochs of the reference run to branch from, increasing, the first may be 0.
    batch_sizes: the grid, increasing; the first is the reference run's batch B0.
    lr_multipliers: each branch's LR is the scaling rule's at its batch times each of these.
    budget_examples: examples each branch trains on, a whole number of every batch of the grid (a multiple of
      their least common multiple), so that every branch sees the same examples.
    tolerance: relative; a batch is within the CBS while loss(B) <= (1 + tolerance) loss(B0).
    epoch_examples: examples in an epoch of the reference run's training stream (`train_examples`).
    split: the split the branches evaluate (`data_options.eval_split`, or the dataset's default).
  """
  checkpoints: tuple[float, ...]
  batch_sizes: tuple[int, ...]
  lr_multipliers: tuple[float, ...]
  budget_examples: int
  tolerance: float
  epoch_examples: int
  split: str


def make_grid(config: ml_collections.ConfigDict, checkpoints: Sequence[float], batch_sizes: Sequence[int],
              budget_epochs: float, tolerance: float, lr_multipliers: Sequence[float], num_examples: int) -> Grid:
  """The grid of `measure`, checked against the reference `config` before any training.

  Raises:
    ValueError: every problem, named (the reference not on the any-batch step, a batch that is not a
      whole number of micro-batches, checkpoints outside the reference run, a budget <= 0, batch sizes whose
      least common multiple exceeds the budget, ...).
  """
  errors = []
  micro = config.batch.micro_batch_size
  if not micro:
    errors.append("the branches run on the any-batch step: set config.batch.micro_batch_size > 0 (e.g. "
                  "--overrides batch.micro_batch_size=64).")
  if config.batch.policy == "adaptive" or config.batch_sizes:
    errors.append("the reference run trains at one batch (batch.policy 'fixed' or a schedule without sizes); "
                  f"got batch.policy={config.batch.policy!r}, batch_sizes={tuple(config.batch_sizes)}.")
  sizes = tuple(batch_sizes)
  if len(sizes) < 2 or list(sizes) != sorted(set(sizes)) or sizes[0] != config.batch_size:
    errors.append(f"--batch_sizes must be increasing, at least two, the first the reference batch "
                  f"config.batch_size={config.batch_size}; got {list(sizes)}.")
  elif micro and any(b % micro for b in sizes):
    errors.append(f"every batch size must be a multiple of the micro-batch {micro}; got {list(sizes)}.")
  elif sizes[-1] > num_examples:
    errors.append(f"the largest batch {sizes[-1]} exceeds the training set ({num_examples} examples).")
  points = tuple(float(c) for c in checkpoints)
  if not points or list(points) != sorted(set(points)) or points[0] < 0 or points[-1] > config.num_epochs:
    errors.append(f"--checkpoints must be increasing epochs in [0, {config.num_epochs}] (the reference run's "
                  f"num_epochs); got {list(points)}.")
  every = config.eval_every_epochs
  off_grid = [c for c in points if c > 0 and abs(c / every - round(c / every)) > 1e-9]
  if off_grid:
    errors.append(f"--checkpoints {off_grid} are not multiples of config.eval_every_epochs={every}, where the "
                  "reference run saves; change one or the other.")
  if not lr_multipliers or any(m <= 0 for m in lr_multipliers):
    errors.append(f"--lr_multipliers must be positive numbers; got {list(lr_multipliers)}.")
  if not tolerance >= 0:
    errors.append(f"--tolerance must be >= 0 (relative to the B0 branch's loss); got {tolerance}.")
  if not budget_epochs > 0:
    errors.append(f"--budget_epochs must be > 0 (the examples each branch trains on, in epochs); got {budget_epochs}.")
  for size in sizes if not errors else ():
    for multiplier in lr_multipliers:
      try:  # the rule's LR schedule at every batch (e.g. LEGW's warm-up must end within num_epochs)
        optimizer_lib.learning_rate_schedule(at_batch(config, size, multiplier))
      except train.ConfigError as e:
        errors.append(f"the branches at batch {size}: {e}")
  budget = 0
  if not errors:  # the nearest whole number of every batch: each branch sees the same examples
    whole = math.lcm(*sizes)
    budget = whole * round(budget_epochs * num_examples / whole)
    if not budget:
      errors.append(f"--budget_epochs {budget_epochs:g} ({budget_epochs * num_examples:g} examples) holds no whole "
                    f"number of every batch size {list(sizes)} (their least common multiple is {whole} examples, "
                    f"{whole / num_examples:g} epochs): give a budget of at least that, or batch sizes that divide "
                    "each other (e.g. B0 times powers of two).")
  if errors:
    raise ValueError("Invalid critical-batch grid:\n  - " + "\n  - ".join(errors))
  return Grid(points, sizes, tuple(float(m) for m in lr_multipliers), budget, float(tolerance), num_examples,
              runner.evaluated_split(config))


def train_examples(config: ml_collections.ConfigDict) -> int:
  """Examples in an epoch of `config`'s training stream, in the units of a batch: images (the MNIST
  training split less a held-out validation), or PTB's rows of `seq_len` tokens (windows x batch)."""
  stream = train.build_task(config).dataset.make_train_stream(0, 1)
  if hasattr(stream, "windows_per_epoch"):
    return stream.windows_per_epoch(config.batch_size) * config.batch_size
  return stream.num_examples
