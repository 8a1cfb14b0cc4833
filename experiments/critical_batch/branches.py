"""The branches of `measure`: where they start (reference checkpoints), how one is trained on the shared
`Run`, and how finished ones are recorded in `<out>_branches.csv` by processes sharing the grid, with the
budget and reference recipe they were trained with beside it (`<out>_branches.json`)."""

import csv
import dataclasses
import fcntl
import json
import math
import pathlib
import time
from typing import Sequence

import jax
import ml_collections

from experiments import run_records
from experiments.critical_batch.grid import at_batch
from lbjax import train
from lbjax.train import batch_policy as batch_policy_lib
from lbjax.train import config as config_lib
from lbjax.train.checkpointing import Checkpointer

KEEP_ALL_CHECKPOINTS = 1_000_000  # config.keep_checkpoints of the reference run: every branch point stays
# What the reference config of recorded branches may differ in from the config now: how it is run, not what the
# branches compute (`lbjax.train.config.OPERATIONAL_FIELDS` but the length of training, which the LR schedule reads).
RUN_ONLY_FIELDS = tuple(f for f in config_lib.OPERATIONAL_FIELDS if f not in ("num_epochs", "num_steps"))
BRANCH_FIELDS = ("checkpoint_epoch", "start_epoch", "start_step", "batch_size", "lr_multiplier", "learning_rate",
                 "updates", "examples", "split", "loss", "metric", "value", "seconds", "device")


@dataclasses.dataclass(frozen=True)
class BranchPoint:
  """Where branches start: a reference checkpoint (or the initial state, `step` None) and its epoch."""
  epoch: float  # the requested epoch
  step: int | None


def branch_points(reference_dir: pathlib.Path, epochs: Sequence[float], step_epochs: float) -> list[BranchPoint]:
  """The reference checkpoint of each epoch (0: the initial state): the one saved there, at the first step
  boundary at or after it (less than `step_epochs`, one step of the reference run, after it).

  Raises:
    ValueError: an epoch the reference run has no checkpoint at, with the epochs it saved: it has not run
      that far, or it did not keep that checkpoint or save there (`config.keep_checkpoints`,
      `config.eval_every_epochs` of a reference run trained outside `measure`).
  """
  checkpointer = Checkpointer(reference_dir, max_to_keep=None)
  try:
    saved = sorted((checkpointer.read_meta_verified(step)["epoch"], step) for step in checkpointer.all_steps())
  finally:
    checkpointer.close()
  points, missing = [], []
  for epoch in epochs:
    if epoch == 0:
      points.append(BranchPoint(0.0, None))
      continue
    there = [step for e, step in saved if epoch - 1e-9 <= e < epoch + step_epochs - 1e-9]
    if there:
      points.append(BranchPoint(epoch, there[0]))
    else:
      missing.append(epoch)
  if missing:
    saved_epochs = ", ".join(f"{e:g}" for e, _ in saved) or "none"
    if saved and all(epoch > saved[-1][0] for epoch in missing):
      raise ValueError(f"{reference_dir} has no checkpoint at epochs {', '.join(f'{e:g}' for e in missing)}: the "
                       f"reference run has not run that far (it saved epochs {saved_epochs}); train it further.")
    raise ValueError(
        f"{reference_dir} has no checkpoint at epochs {', '.join(f'{e:g}' for e in missing)} (within a step, "
        f"{step_epochs:.4g} epochs, after each): it saved epochs {saved_epochs}. The reference run saves at every "
        "config.eval_every_epochs and keeps config.keep_checkpoints of them; `measure`'s own reference run keeps "
        f"them all (keep_checkpoints={KEEP_ALL_CHECKPOINTS}), a run trained there otherwise (e.g. by lbjax-train) "
        "may not: give --checkpoints among the saved epochs, or a new --workdir where `measure` trains the "
        "reference run.")
  return points


def branch_name(point: float, batch_size: int, lr_multiplier: float) -> str:
  return f"e{point:g}_b{batch_size}_lr{lr_multiplier:g}"


@dataclasses.dataclass(frozen=True)
class Branch:
  """One finished branch (a line of `<out>_branches.csv`)."""
  checkpoint_epoch: float
  start_epoch: float
  start_step: int
  batch_size: int
  lr_multiplier: float
  learning_rate: float  # at the branch's last update
  updates: int
  examples: int
  split: str
  loss: float
  metric: str
  value: float
  seconds: float
  device: str


class BranchTrainer:
  """Trains branches on one `Run` of the reference config (no workdir): one compile for the grid."""

  def __init__(self, config: ml_collections.ConfigDict, reference_dir: pathlib.Path):
    self.config = config
    self.run = train.Run(config)
    self.checkpointer = Checkpointer(reference_dir, max_to_keep=None)
    self._shardings = jax.tree.map(lambda x: x.sharding, self.run.state)
    self._initial = (jax.device_get(self.run.state), self.run.stream.get_state())

  def close(self) -> None:
    self.checkpointer.close()
    self.run.close()

  def _start(self, point: BranchPoint) -> None:
    """Puts the run at `point`: the state, data position and examples seen of the reference run there."""
    run = self.run
    if point.step is None:
      host_state, stream_state = self._initial
      run.state = jax.tree.map(jax.device_put, host_state, self._shardings)
      run.stream.set_state(stream_state)
      run.examples_seen, run.carry_batch_size = 0, None
      return
    run.restore_checkpoint(self.checkpointer, point.step)

  def train(self, point: BranchPoint, batch_size: int, lr_multiplier: float, budget_examples: int,
            metric: str) -> Branch:
    """Trains the branch from `point` at `batch_size` for `budget_examples` and evaluates it.

    Raises:
      lbjax.train.NonFiniteError: the branch diverged (a non-finite loss or update).
    """
    run = self.run
    start = time.time()
    self._start(point)
    start_epoch, start_step = run.epoch, int(jax.device_get(run.state.step))
    branch = train.validate(at_batch(self.config, batch_size, lr_multiplier), data_parallel_size=run.data_parallel_size)
    run.batch_policy = batch_policy_lib.BatchPolicy(branch.batch, branch.learning_rate)
    updates = budget_examples // batch_size
    learning_rate = math.nan
    for _ in range(updates):
      batch = run.next_batch()
      learning_rate = float(jax.device_get(batch.learning_rate))
      run.step(batch)
    run.check_health()
    evaluation = run.evaluate()
    return Branch(point.epoch, start_epoch, start_step, batch_size, lr_multiplier, learning_rate, updates,
                  updates * batch_size, run.task.dataset.eval_split, float(evaluation["loss"]), metric,
                  float(evaluation[metric]), time.time() - start, run_records.training_devices())


def read_branches(path: pathlib.Path) -> list[Branch]:
  """The branches recorded in `<out>_branches.csv` (none if it does not exist)."""
  if not path.is_file():
    return []
  types = {f.name: f.type for f in dataclasses.fields(Branch)}  # float, int, str: each converts its text
  with open(path, newline="") as f:
    return [Branch(**{k: types[k](v) for k, v in row.items()}) for row in csv.DictReader(f)]


def branch_key(branch: Branch) -> tuple[float, int, float]:
  return branch.checkpoint_epoch, branch.batch_size, branch.lr_multiplier


def record_branch(branch: Branch, out: pathlib.Path, workdir: pathlib.Path, config: ml_collections.ConfigDict,
                  budget_examples: int) -> list[Branch]:
  """Adds `branch`, trained from the reference run of `config` on `budget_examples`, to `<out>_branches.csv`
  under the workdir's lock (processes sharing the grid never lose each other's lines), and the budget and
  recipe to `<out>_branches.json` with the first branch; returns every recorded branch.

  Raises:
    ValueError: the branches recorded meanwhile are of another budget or recipe (`recorded_branches_problem`).
  """
  path = branches_csv(out)
  with open(workdir / "table.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if problem := recorded_branches_problem(out, config, budget_examples):
      raise ValueError(f"{branch_name(branch.checkpoint_epoch, branch.batch_size, branch.lr_multiplier)} is not "
                       f"recorded: {problem}")
    branches = read_branches(path)
    if not branches:
      measurement_file(out).write_text(json.dumps({"budget_examples": budget_examples,
                                                   "config": json.loads(config.to_json())}, indent=1) + "\n")
    if branch_key(branch) not in {branch_key(b) for b in branches}:
      branches.append(branch)
    branches.sort(key=branch_key)
    run_records.write_csv(path, BRANCH_FIELDS, branches)
  return branches


def recorded_branches_problem(out: pathlib.Path, config: ml_collections.ConfigDict, budget_examples: int) -> str:
  """Why the branches in `<out>_branches.csv` are not branches of `config`'s reference run on `budget_examples`
  each (`<out>_branches.json` records another budget or recipe, or none), or "" where they are, or where there
  are none. Adding to them would mix two measurements in one table."""
  path, record = branches_csv(out), measurement_file(out)
  if not read_branches(path):
    return ""
  if not record.is_file():
    return (f"{path} holds branches without {record}, the budget and reference recipe they were trained with "
            f"(written before `measure` recorded them), so they cannot be checked against this measurement: give "
            f"another --out, or delete {path} to train the branches again.")
  advice = f"give another --out, or delete {path} and {record} to train the branches again."
  try:
    recorded = json.loads(record.read_text())
    recorded_budget, recorded_config = recorded["budget_examples"], json.dumps(recorded["config"])
  except (ValueError, KeyError, TypeError):
    return f"{record} is not the record `measure` writes beside {path} (budget_examples, config): {advice}"
  recipe = [line for field, (there, now) in config_lib.recipe_differences(recorded_config, config,
                                                                           RUN_ONLY_FIELDS).items()
            for line in _leaf_differences(field, there, now)]
  budget = [f"budget: {recorded_budget} examples a branch there, {budget_examples} now"] if (
      recorded_budget != budget_examples) else []
  if not budget and not recipe:
    return ""
  return (f"{path} holds branches of another measurement ({'; '.join(budget + recipe)}): {advice}"
          + (" (Their reference run was of another recipe: this one needs its own --workdir too.)" if recipe else ""))


def _leaf_differences(name: str, there: object, now: object) -> list[str]:
  """`name: <there> there, <now> now` for each leaf field in which two config values differ."""
  if isinstance(there, dict) and isinstance(now, dict):
    return [line for key in sorted(set(there) | set(now))
            for line in _leaf_differences(f"{name}.{key}", there.get(key), now.get(key))]
  return [] if there == now else [f"{name}: {there!r} there, {now!r} now"]


def branches_csv(out: pathlib.Path) -> pathlib.Path:
  return out.with_name(out.name + "_branches.csv")


def measurement_file(out: pathlib.Path) -> pathlib.Path:
  """`<out>_branches.json`: the budget and the reference config of the branches in `<out>_branches.csv`."""
  return out.with_name(out.name + "_branches.json")


def lock_branch(workdir: pathlib.Path, name: str):
  """An exclusive, non-blocking lock of a branch (released when the process ends), or None if held."""
  directory = workdir / "branches"
  directory.mkdir(parents=True, exist_ok=True)
  handle = open(directory / f"{name}.lock", "w")  # pylint: disable=consider-using-with
  try:
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    handle.close()
    return None
  return handle
