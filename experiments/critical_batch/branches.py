"""The branches of `measure`: where they start (reference checkpoints), how one is trained on the shared
`Run`, and how finished ones are recorded in `<out>_branches.csv` by processes sharing the grid."""

import csv
import dataclasses
import fcntl
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
from lbjax.train.checkpointing import Checkpointer

KEEP_ALL_CHECKPOINTS = 1_000_000  # config.keep_checkpoints of the reference run: every branch point stays
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


def record_branch(branch: Branch, out: pathlib.Path, workdir: pathlib.Path) -> list[Branch]:
  """Adds `branch` to `<out>_branches.csv` under the workdir's lock (processes sharing the grid never
  lose each other's lines); returns every recorded branch."""
  path = branches_csv(out)
  with open(workdir / "table.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    branches = read_branches(path)
    if branch_key(branch) not in {branch_key(b) for b in branches}:
      branches.append(branch)
    branches.sort(key=branch_key)
    run_records.write_csv(path, BRANCH_FIELDS, branches)
  return branches


def branches_csv(out: pathlib.Path) -> pathlib.Path:
  return out.with_name(out.name + "_branches.csv")


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
