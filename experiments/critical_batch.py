"""The critical batch size measured directly (Merrill et al. 2025) against the gradient noise scale, and a
batch-size warm-up built on it.

  python -m experiments.critical_batch measure \
      --config adaptive_batch_mnist:run=legw,large_batch=128,epochs=4 --overrides data_options.eval_split=validation \
      --checkpoints 0,0.25,0.5,1,2,4 --batch_sizes 128,256,512,1024,2048,4096,8192 --budget_epochs 0.5 \
      --tolerance 0.02 --out docs/results/critical_batch_mnist --workdir runs/critical_batch_mnist
  python -m experiments.critical_batch warmup --config adaptive_batch_mnist:epochs=2 \
      --overrides data_options.eval_split=validation --cbs docs/results/critical_batch_mnist.csv --seeds 0,1,2 \
      --out docs/results/critical_batch_mnist_warmup --workdir runs/critical_batch_mnist_warmup

`measure` (the method of Merrill et al. 2025, arXiv 2505.23971, §3):
1. trains the reference run, the config at its smallest batch B0 (`<workdir>/reference`, resumable; it
   saves a checkpoint at every `config.eval_every_epochs`, all kept);
2. from the state of the reference run at each checkpoint epoch (epoch 0: its initial state), trains a
   branch at every batch size B of the grid for the same number of examples, `budget`: the restored
   parameters, optimizer and data position, so every branch reads the same examples in the same order;
   the learning rate at B is the config's scaling rule at B on the run's clock (as a fixed-batch run at
   B, or `batch.policy="adaptive"` at B, would use at that epoch), times each `--lr_multipliers` entry
   (the best branch of the grid counts);
3. takes each branch's loss on the evaluation split (the whole split, after the budget) and the
   critical batch size at that checkpoint: the largest B such that every branch with B' <= B ends
   within the relative `tolerance` of the B0 branch's loss, loss(B') <= (1 + tolerance) loss(B0).
The budget is rounded to a whole number of the largest batch, so every branch sees exactly the same
examples (at the largest batch, budget/B_max updates). Beside it, the gradient noise scale
B_noise = tr(Sigma)/|G|^2 the adaptive policy uses (`lbjax.train.batch_policy`: the EMA of the
estimates from the micro-batch and the whole batch) as the reference run recorded it at each checkpoint.

All branches of a process share one `Run` built from the reference config on the any-batch step
(`config.batch.micro_batch_size` > 0, required): every batch of the grid runs on the same two compiled
programs, so the grid costs no compile beyond the first. A branch is recorded in `<out>_branches.csv`
as it finishes (skipped when the command runs again; an interrupted branch starts again from its
checkpoint); several processes may share the grid (the same command started N times): each takes the
next branch neither recorded nor locked by another (`<workdir>/branches/<branch>.lock`), and the CSV is
merged under a lock. Outputs: `<out>_branches.csv` (every branch), `<out>.csv` and `<out>.md` (the
CBS table: per checkpoint the loss ratio of every batch, the CBS and B_noise), `<out>.png` (CBS and
B_noise over training).

`warmup` trains, with each seed, in `<workdir>/<run>_seed<s>` (resumable, `experiments.adaptive_batch`;
several processes may share the runs, each skipping a run another one holds):
  baseline:   the config's run=baseline (its smallest batch throughout);
  legw:       run=legw at the warm-up's final batch (LEGW, papers/001);
  adaptive:   run=adaptive with the warm-up's final batch as its largest (noise-scale policy);
  cbs_warmup: the batch of the measured CBS curve: from each checkpoint epoch on, the CBS measured
              there (never shrinking, within [B0, final batch]), and the LR of the scaling rule at the
              batch in force (`rule_at_batch_in_force`), as the adaptive policy sets it;
then writes `<out>.md`/`.csv`/`.png`: per run over seeds, the updates and examples to the first
evaluation at the baseline's final quality on the evaluation split (its mean over seeds; `--targets`
adds fixed ones), the final quality, and each finished run's final test metric (evaluated once, after
training: choices on validation, the test split only as the last figure). `--tolerance` builds the
warm-up from the CBS at another tolerance, read from the table's loss ratios.
"""

import argparse
import csv
import dataclasses
import fcntl
import json
import math
import os
import pathlib
import shlex
import statistics
import sys
import time
from typing import Any, Sequence

import jax
import ml_collections

from experiments import adaptive_batch
from experiments import config_spec
from experiments import run_records
from experiments.sweep import METRIC_KEYS
from lbjax.train.errors import exit_on_user_errors
from lbjax import schedules
from lbjax import train
from lbjax.train import batch_plan
from lbjax.train import batch_policy as batch_policy_lib
from lbjax import config_files
from lbjax.train import optimizer as optimizer_lib
from lbjax.train.checkpointing import Checkpointer, abstract_like
from lbjax.train.errors import WorkdirInUseError

REFERENCE = "reference"  # the reference run's directory in the workdir
KEEP_ALL_CHECKPOINTS = 1_000_000  # config.keep_checkpoints of the reference run: every branch point stays
BRANCH_FIELDS = ("checkpoint_epoch", "start_epoch", "start_step", "batch_size", "lr_multiplier", "learning_rate",
                 "updates", "examples", "split", "loss", "metric", "value", "seconds", "device")
WARMUP_RUNS = ("baseline", "legw", "adaptive", "cbs_warmup")
TEST_FILE = "test_metrics.json"  # in a warm-up run's directory: its final state on the test split


# ---------------------------------------------------------------------------------------------- configs

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
    budget_examples: examples each branch trains on, a whole number of the largest batch.
    tolerance: relative; a batch is within the CBS while loss(B) <= (1 + tolerance) loss(B0).
  """
  checkpoints: tuple[float, ...]
  batch_sizes: tuple[int, ...]
  lr_multipliers: tuple[float, ...]
  budget_examples: int
  tolerance: float


def make_grid(config: ml_collections.ConfigDict, checkpoints: Sequence[float], batch_sizes: Sequence[int],
              budget_epochs: float, tolerance: float, lr_multipliers: Sequence[float], num_examples: int) -> Grid:
  """The grid of `measure`, checked against the reference `config` before any training.

  Raises:
    ValueError: every problem, named (the reference not on the any-batch step, a batch that is not a
      whole number of micro-batches, checkpoints outside the reference run, ...).
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
  for size in sizes if not errors else ():
    for multiplier in lr_multipliers:
      try:  # the rule's LR schedule at every batch (e.g. LEGW's warm-up must end within num_epochs)
        optimizer_lib.learning_rate_schedule(at_batch(config, size, multiplier))
      except train.ConfigError as e:
        errors.append(f"the branches at batch {size}: {e}")
  budget = 0
  if not errors:
    budget = sizes[-1] * max(1, round(budget_epochs * num_examples / sizes[-1]))
  if errors:
    raise ValueError("Invalid critical-batch grid:\n  - " + "\n  - ".join(errors))
  return Grid(points, sizes, tuple(float(m) for m in lr_multipliers), budget, float(tolerance))


# ---------------------------------------------------------------------------------------------- branches

@dataclasses.dataclass(frozen=True)
class BranchPoint:
  """Where branches start: a reference checkpoint (or the initial state, `step` None) and its epoch."""
  epoch: float  # the requested epoch
  step: int | None
  meta: dict[str, Any] | None


def branch_points(reference_dir: pathlib.Path, epochs: Sequence[float]) -> list[BranchPoint]:
  """The reference checkpoint of each epoch: the first saved at or after it (0: the initial state).

  Raises:
    ValueError: an epoch the reference run has no checkpoint at (it has not run that far).
  """
  checkpointer = Checkpointer(reference_dir, max_to_keep=None)
  try:
    saved = sorted((checkpointer.read_meta_verified(step)["epoch"], step) for step in checkpointer.all_steps())
    metas = {step: checkpointer.read_meta_verified(step) for _, step in saved}
  finally:
    checkpointer.close()
  points = []
  for epoch in epochs:
    if epoch == 0:
      points.append(BranchPoint(0.0, None, None))
      continue
    later = [(e, step) for e, step in saved if e >= epoch - 1e-9]
    if not later:
      raise ValueError(f"{reference_dir} has no checkpoint at epoch {epoch} (its last: "
                       f"{saved[-1][0] if saved else 'none'}); train the reference run further.")
    points.append(BranchPoint(epoch, later[0][1], metas[later[0][1]]))
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
    meta = point.meta
    carry_batch_size = meta["carry_batch_size"]
    target = run.state._replace(carry=run.train_carry(carry_batch_size, meta.get("carry_micro_batches"))
                                if carry_batch_size else None)
    run.state = self.checkpointer.restore_verified(point.step, meta, abstract_like(target), run.parts.replicated)
    run.stream.set_state(meta["stream"])
    run.examples_seen, run.carry_batch_size = meta["examples_seen"], carry_batch_size

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


def _write_csv(path: pathlib.Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  partial = path.with_suffix(".csv.partial")  # replaced atomically: a reader never sees half a file
  with open(partial, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(header)
    writer.writerows(rows)
  os.replace(partial, path)


def _branch_key(branch: Branch) -> tuple[float, int, float]:
  return branch.checkpoint_epoch, branch.batch_size, branch.lr_multiplier


def record_branch(branch: Branch, out: pathlib.Path, workdir: pathlib.Path) -> list[Branch]:
  """Adds `branch` to `<out>_branches.csv` under the workdir's lock (processes sharing the grid never
  lose each other's lines); returns every recorded branch."""
  path = branches_csv(out)
  with open(workdir / "table.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    branches = read_branches(path)
    if _branch_key(branch) not in {_branch_key(b) for b in branches}:
      branches.append(branch)
    branches.sort(key=_branch_key)
    _write_csv(path, BRANCH_FIELDS, [[getattr(b, f) for f in BRANCH_FIELDS] for b in branches])
  return branches


def branches_csv(out: pathlib.Path) -> pathlib.Path:
  return out.with_name(out.name + "_branches.csv")


# ---------------------------------------------------------------------------------------------- the CBS

def critical_batch_size(losses: dict[int, float], tolerance: float) -> int | None:
  """The largest B such that every B' <= B in `losses` (batch -> best branch loss, all measured) ends
  within `tolerance` of the smallest batch's loss; None when the smallest batch's branch diverged."""
  sizes = sorted(losses)
  reference = losses[sizes[0]]
  if not math.isfinite(reference):
    return None
  critical = sizes[0]
  for size in sizes[1:]:
    if not losses[size] <= (1.0 + tolerance) * reference:
      break
    critical = size
  return critical


def noise_scale_at(reference_dir: pathlib.Path, step: int | None) -> tuple[float, float] | None:
  """(B_noise, its epoch): the reference run's `batch` record at the latest step <= `step` (the first
  record for the initial state), or None when the run recorded none."""
  records = run_records.read_records(reference_dir, "batch") if (reference_dir / "metrics.jsonl").is_file() else []
  if not records:
    return None
  before = [r for r in records if step is not None and r["step"] <= step]
  record = before[-1] if before else records[0]
  return float(record["noise_scale"]), float(record["epoch"])


@dataclasses.dataclass(frozen=True)
class CbsRow:
  """The CBS table's line of one checkpoint."""
  checkpoint_epoch: float
  reference_loss: float
  losses: dict[int, float]  # batch -> best loss over the LR multipliers (only measured batches)
  critical_batch_size: int | None  # None until every batch of the grid has a branch
  noise_scale: float | None
  noise_scale_epoch: float | None


def cbs_rows(grid: Grid, branches: Sequence[Branch], reference_dir: pathlib.Path,
             steps: dict[float, int | None]) -> list[CbsRow]:
  """One row per checkpoint with at least one branch; the CBS once every batch of the grid has all its
  LR multipliers (a diverged branch counts as an infinite loss)."""
  rows = []
  for point in grid.checkpoints:
    mine = [b for b in branches if b.checkpoint_epoch == point]
    if not mine:
      continue
    losses, complete = {}, True
    for size in grid.batch_sizes:
      runs = [b for b in mine if b.batch_size == size]
      if len(runs) < len(grid.lr_multipliers):
        complete = False
      if runs:
        finite = [b.loss for b in runs if math.isfinite(b.loss)]
        losses[size] = min(finite) if finite else math.inf
    noise = noise_scale_at(reference_dir, steps.get(point))
    rows.append(CbsRow(point, losses.get(grid.batch_sizes[0], math.nan), losses,
                       critical_batch_size(losses, grid.tolerance) if complete else None,
                       noise[0] if noise else None, noise[1] if noise else None))
  return rows


def read_cbs_curve(path: str | pathlib.Path, tolerance: float | None = None) -> list[tuple[float, int]]:
  """(checkpoint epoch, CBS) of a `measure` table `<out>.csv`, for the checkpoints with a CBS: the
  table's, or with `tolerance` the CBS at that tolerance from the table's loss ratios."""
  with open(path, newline="") as f:
    rows = [r for r in csv.DictReader(f) if r["critical_batch_size"]]
  if tolerance is None:
    return [(float(r["checkpoint_epoch"]), int(r["critical_batch_size"])) for r in rows]
  curve = []
  for row in rows:
    ratios = {int(k[len("loss_ratio_b"):]): float("inf") if v == "diverged" else float(v)
              for k, v in row.items() if k.startswith("loss_ratio_b")}
    curve.append((float(row["checkpoint_epoch"]), critical_batch_size(ratios, tolerance)))
  return curve


def write_measurement(grid: Grid, branches: Sequence[Branch], reference_dir: pathlib.Path,
                      steps: dict[float, int | None], out: pathlib.Path, command: str, title: str) -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from the recorded branches."""
  rows = cbs_rows(grid, branches, reference_dir, steps)
  header = (["checkpoint_epoch", "reference_loss"] + [f"loss_ratio_b{b}" for b in grid.batch_sizes]
            + ["critical_batch_size", "noise_scale", "noise_scale_epoch"])
  _write_csv(out.with_suffix(".csv"), header, [
      [r.checkpoint_epoch, r.reference_loss] + [_ratio(r, b) for b in grid.batch_sizes]
      + [r.critical_batch_size or "", "" if r.noise_scale is None else r.noise_scale,
         "" if r.noise_scale_epoch is None else r.noise_scale_epoch] for r in rows])
  out.with_suffix(".md").write_text(measurement_markdown(grid, rows, branches, command, title))
  _plot_measurement(grid, rows, out.with_suffix(".png"), title)


def _ratio(row: CbsRow, size: int) -> str:
  if size not in row.losses:
    return ""
  return f"{row.losses[size] / row.reference_loss:.4f}" if math.isfinite(row.losses[size]) else "diverged"


def measurement_markdown(grid: Grid, rows: Sequence[CbsRow], branches: Sequence[Branch], command: str,
                         title: str) -> str:
  split = branches[0].split if branches else "validation"
  multipliers = ", ".join(f"{m:g}" for m in grid.lr_multipliers)
  lines = [f"# {title}", "", f"Command: `{command}`", "",
           f"Branches of {grid.budget_examples} examples each from the reference run's state at each checkpoint "
           f"epoch; batch grid {', '.join(map(str, grid.batch_sizes))}; LR: the config's scaling rule at each batch "
           f"on the run's clock, times {multipliers} (the lowest loss counts). Cells: the branch's {split} loss "
           f"after the budget over the B={grid.batch_sizes[0]} branch's. CBS: the largest B with every B' <= B "
           f"at a ratio <= {1 + grid.tolerance:g} (tolerance {grid.tolerance:g}). B_noise: the gradient noise "
           "scale B_simple = tr(Sigma)/|G|^2 as the reference run recorded it (EMA, `batch` record at or before "
           "the checkpoint; at epoch 0 the first record, at the epoch shown).", "",
           f"| epoch | B0 {split} loss | " + " | ".join(f"B={b}" for b in grid.batch_sizes) + " | CBS | B_noise |",
           "|---:|---:|" + "---:|" * len(grid.batch_sizes) + "---:|---:|"]
  for row in rows:
    cells = [_ratio(row, b) or "–" for b in grid.batch_sizes]
    cbs = str(row.critical_batch_size) if row.critical_batch_size else "(incomplete)"
    noise = "–" if row.noise_scale is None else f"{row.noise_scale:.0f} (epoch {row.noise_scale_epoch:.3g})"
    lines.append(f"| {row.checkpoint_epoch:g} | {row.reference_loss:.4f} | " + " | ".join(cells)
                 + f" | {cbs} | {noise} |")
  lines += ["", "Branches (as trained):", "",
            "| epoch | start epoch | B | LR multiplier | LR at end | updates | examples | loss | "
            f"{branches[0].metric if branches else 'metric'} | seconds | device |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
  for b in branches:
    lines.append(f"| {b.checkpoint_epoch:g} | {b.start_epoch:.4f} | {b.batch_size} | {b.lr_multiplier:g} | "
                 f"{b.learning_rate:.4g} | {b.updates} | {b.examples} | {b.loss:.4f} | {b.value:.4f} | "
                 f"{b.seconds:.0f} | {b.device} |")
  return "\n".join(lines) + "\n"


def _plot_measurement(grid: Grid, rows: Sequence[CbsRow], path: pathlib.Path, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  figure, (curve, ratios) = plt.subplots(1, 2, figsize=(11, 4))
  measured = [r for r in rows if r.critical_batch_size]
  curve.plot([r.checkpoint_epoch for r in measured], [r.critical_batch_size for r in measured], marker="o",
             label=f"CBS (branches, tolerance {grid.tolerance:g})")
  noisy = [r for r in rows if r.noise_scale is not None and r.noise_scale > 0]
  curve.plot([r.checkpoint_epoch for r in noisy], [r.noise_scale for r in noisy], marker="s", linestyle="--",
             label="B_noise (reference run, EMA)")
  curve.axhline(grid.batch_sizes[-1], color="gray", linewidth=0.8, linestyle=":", label="largest batch of the grid")
  curve.set(xlabel="epoch (checkpoint)", ylabel="batch size", yscale="log")
  curve.legend(fontsize=8)
  for index, row in enumerate(rows):
    sizes = [b for b in grid.batch_sizes if b in row.losses and math.isfinite(row.losses[b])]
    ratios.plot(sizes, [row.losses[b] / row.reference_loss for b in sizes], marker=".", color=f"C{index}",
                label=f"epoch {row.checkpoint_epoch:g}")
  ratios.axhline(1 + grid.tolerance, color="gray", linewidth=0.8, linestyle="--", label="tolerance")
  ratios.set(xlabel="batch size of the branch", ylabel="loss / loss of the B0 branch", xscale="log", yscale="log")
  ratios.set_xscale("log", base=2)
  ratios.legend(fontsize=8)
  for axes in (curve, ratios):
    axes.grid(alpha=0.3)
  figure.suptitle(title, fontsize=10)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def _lock_branch(workdir: pathlib.Path, name: str):
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


def train_reference(config: ml_collections.ConfigDict, reference_dir: pathlib.Path) -> None:
  """Trains the reference run unless finished; waits while another process trains it."""
  while not ((reference_dir / "metrics.jsonl").is_file() and run_records.final_eval(reference_dir)):
    print(f"[critical_batch] reference run -> {reference_dir}", flush=True)
    try:
      result = train.train_and_evaluate(config, reference_dir)
    except WorkdirInUseError:
      print("[critical_batch] another process trains the reference run; waiting for it", flush=True)
      time.sleep(30)
      continue
    if result.preempted:
      raise KeyboardInterrupt(f"the reference run was preempted; its checkpoint in {reference_dir} resumes when "
                              "the command runs again.")


def measure(config: ml_collections.ConfigDict, grid: Grid, workdir: pathlib.Path, out: pathlib.Path,
            command: str, title: str) -> list[Branch]:
  """Trains the reference run and every branch of `grid` not yet recorded; writes the outputs."""
  workdir.mkdir(parents=True, exist_ok=True)
  out.parent.mkdir(parents=True, exist_ok=True)
  reference_dir = workdir / REFERENCE
  train_reference(config, reference_dir)
  points = branch_points(reference_dir, grid.checkpoints)
  steps = {p.epoch: p.step for p in points}
  metric = METRIC_KEYS[config.dataset]
  work = [(p, b, m) for p in points for b in grid.batch_sizes for m in grid.lr_multipliers]
  done = {_branch_key(b) for b in read_branches(branches_csv(out))}
  todo = [w for w in work if (w[0].epoch, w[1], w[2]) not in done]
  print(f"[critical_batch] {len(work)} branches ({len(points)} checkpoints x {len(grid.batch_sizes)} batches x "
        f"{len(grid.lr_multipliers)} LRs) of {grid.budget_examples} examples: {len(work) - len(todo)} recorded, "
        f"{len(todo)} to train.", flush=True)
  trainer = BranchTrainer(config, reference_dir) if todo else None
  try:
    for point, size, multiplier in todo:
      name = branch_name(point.epoch, size, multiplier)
      if (point.epoch, size, multiplier) in {_branch_key(b) for b in read_branches(branches_csv(out))}:
        continue  # another process recorded it meanwhile
      lock = _lock_branch(workdir, name)
      if lock is None:
        print(f"[critical_batch] {name}: another process trains it", flush=True)
        continue
      try:
        try:
          branch = trainer.train(point, size, multiplier, grid.budget_examples, metric)
        except train.NonFiniteError as error:
          print(f"[critical_batch] {name} diverged: {str(error).splitlines()[0][:200]}", flush=True)
          branch = Branch(point.epoch, math.nan, 0, size, multiplier, math.nan, 0, 0,
                          trainer.run.task.dataset.eval_split, math.inf, metric, math.nan, 0.0,
                          run_records.training_devices())
        branches = record_branch(branch, out, workdir)
      finally:
        lock.close()
      print(f"[critical_batch] {name}: loss {branch.loss:.4f}, {metric} {branch.value:.4f} "
            f"({branch.updates} updates, {branch.seconds:.0f} s)", flush=True)
      write_measurement(grid, branches, reference_dir, steps, out, command, title)
  finally:
    if trainer is not None:
      trainer.close()
  branches = read_branches(branches_csv(out))
  write_measurement(grid, branches, reference_dir, steps, out, command, title)
  return branches


# ---------------------------------------------------------------------------------------------- warm-up

def rule_at_batch_in_force(value: float, *, batch_sizes: Sequence[int], boundaries: Sequence[float],
                           recipe: str) -> schedules.Schedule:
  """The learning rate of the scaling rule at the batch a batch-size schedule has in force (an `lr.decay`).

  With batch B_i on [b_{i-1}, b_i) (b_0 = 0), the LR at epoch e is that of a fixed-batch run at B_i
  at epoch e: the baseline recipe scaled by `config.scaling.rule` to B_i (LEGW: LR x sqrt(B_i/B0),
  warm-up x B_i/B0; papers/001 §3), with its warm-up and decay on the run's clock,

    v(e) = lr_{B_i}(e)   for e in [b_{i-1}, b_i),

  which is what `batch.policy="adaptive"` sets at a batch (`BatchPolicy.learning_rate`) and what each
  branch of `measure` trained at. `batch.policy="schedule"` holds the first batch's LR instead
  (papers/002); naming this function as `config.lr.decay` makes the schedule follow the rule.

  Args:
    value: the first batch's peak LR, which the trainer passes; each batch's comes from `recipe`.
    batch_sizes: B_0, B_1, ... as in `config.batch_sizes`.
    boundaries: b_1, b_2, ... as in `config.batch_size_boundaries` (epochs).
    recipe: JSON of the run's `lr` and `scaling` sections and `num_epochs` as they were before this
      function replaced the decay (`recipe_json`).
  """
  del value
  if len(batch_sizes) != len(boundaries) + 1:
    raise ValueError(f"rule_at_batch_in_force needs one more batch size than boundaries, got {list(batch_sizes)} "
                     f"and {list(boundaries)}.")
  fields = json.loads(recipe)
  config = train.default_config()
  config.lr = ml_collections.ConfigDict(fields["lr"])
  config.scaling = ml_collections.ConfigDict(fields["scaling"])
  config.num_epochs = fields["num_epochs"]
  pieces = [optimizer_lib.learning_rate_schedule(at_batch(config, size)) for size in batch_sizes]
  return schedules.join_schedules(pieces, boundaries) if boundaries else pieces[0]


def recipe_json(config: ml_collections.ConfigDict) -> str:
  """The `recipe` argument of `rule_at_batch_in_force`: the LR recipe, its scaling rule and length."""
  return json.dumps({"lr": config.lr.to_dict(), "scaling": config.scaling.to_dict(), "num_epochs": config.num_epochs})


def warmup_schedule(curve: Sequence[tuple[float, int]], base_batch_size: int, max_batch_size: int,
                    num_epochs: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
  """(batch sizes, boundaries) of the batch warm-up from a measured CBS curve: from each checkpoint
  epoch (before `num_epochs`) on, the CBS measured there, never shrinking, within [base, max]; a
  checkpoint that changes nothing adds no boundary."""
  sizes, boundaries = [base_batch_size], []
  for epoch, cbs in sorted(curve):
    size = min(max_batch_size, max(sizes[-1], cbs))
    if epoch >= num_epochs or size == sizes[-1]:
      continue
    if epoch == 0:
      sizes[0] = size
      continue
    sizes.append(size)
    boundaries.append(epoch)
  return tuple(sizes), tuple(boundaries)


def warmup_configs(config: str, overrides: Sequence[str], seeds: Sequence[int], sizes: Sequence[int],
                   boundaries: Sequence[float]) -> dict[tuple[str, int], ml_collections.ConfigDict]:
  """The config of every (run, seed) of the warm-up comparison (`WARMUP_RUNS`), validated.

  `config` is an adaptive-batch config (`lbjax.configs.adaptive_batch_mnist`: variant keys run,
  large_batch, max_batch, seed).

  Raises:
    ValueError: every invalid config, named.
  """
  final = sizes[-1]
  variants = {"baseline": "run=baseline", "legw": f"run=legw,large_batch={final}",
              "adaptive": f"run=adaptive,max_batch={final}"}
  configs, errors = {}, []
  for seed in seeds:  # every run of a seed before the next seed: a cut-short experiment has whole seeds
    for run in WARMUP_RUNS:
      try:
        if run == "cbs_warmup":
          run_config = load_config(config_spec(config, f"run=legw,large_batch={sizes[0]}", f"seed={seed}"),
                                   overrides)
          recipe = recipe_json(run_config)
          run_config.batch.policy = "schedule"
          run_config.batch_size, run_config.batch_sizes = sizes[0], tuple(sizes)
          run_config.batch_size_boundaries = tuple(boundaries)
          # The decay's own arguments go with it into `recipe`; the section keeps the recipe's peak and warm-up.
          run_config.lr = ml_collections.ConfigDict(
              {k: run_config.lr[k] for k in optimizer_lib.LR_RECIPE_FIELDS}
              | {"decay": "experiments.critical_batch:rule_at_batch_in_force", "batch_sizes": tuple(sizes),
                 "boundaries": tuple(boundaries), "recipe": recipe})
        else:
          run_config = load_config(config_spec(config, variants[run], f"seed={seed}"), overrides)
        train.validate(run_config, data_parallel_size=1)
        configs[(run, seed)] = run_config
      except (train.ConfigError, ValueError) as e:
        errors.append(f"run {run} seed {seed}: {e}")
  if errors:
    raise ValueError("Invalid warm-up comparison:\n  - " + "\n  - ".join(errors))
  return configs


def test_metrics(config: ml_collections.ConfigDict, run_dir: pathlib.Path) -> dict[str, float]:
  """The run's final state on the test split: its final evaluation when it evaluated on the test split,
  else evaluated once (`<run_dir>/test_metrics.json`)."""
  if config.data_options.get("eval_split", "test") == "test":
    return run_records.final_eval(run_dir)
  path = run_dir / TEST_FILE
  if path.is_file():
    return json.loads(path.read_text())
  test_config = ml_collections.ConfigDict(config.to_dict())
  test_config.data_options.eval_split = "test"
  run = train.Run(test_config)
  checkpointer = Checkpointer(run_dir, max_to_keep=None)
  try:
    step = checkpointer.latest_step()
    meta = checkpointer.read_meta_verified(step)
    carry_batch_size = meta["carry_batch_size"]
    target = run.state._replace(carry=run.train_carry(carry_batch_size, meta.get("carry_micro_batches"))
                                if carry_batch_size else None)
    run.state = checkpointer.restore_verified(step, meta, abstract_like(target), run.parts.replicated)
    metrics = dict(run.evaluate(), step=step)
  finally:
    checkpointer.close()
    run.close()
  path.write_text(json.dumps(metrics) + "\n")
  return metrics


@dataclasses.dataclass
class WarmupSummary:
  """One run of the comparison over its seeds."""
  run: str
  final: list[float] = dataclasses.field(default_factory=list)  # the evaluation split's metric, finished seeds
  test: list[float] = dataclasses.field(default_factory=list)
  updates: list[int] = dataclasses.field(default_factory=list)
  updates_to_target: list[int] = dataclasses.field(default_factory=list)
  examples_to_target: list[float] = dataclasses.field(default_factory=list)
  seeds: int = 0


def summarize_warmup(configs: dict, workdir: pathlib.Path, seeds: Sequence[int], target: float, metric: str,
                     num_examples: int) -> list[WarmupSummary]:
  """Per run: final metric, test metric, updates, and updates/examples to the first evaluation that meets
  `target` (mean over seeds of the baseline)."""
  summaries = []
  for run in WARMUP_RUNS:
    summary = WarmupSummary(run)
    for seed in seeds:
      directory = adaptive_batch.run_dir(str(workdir), run, seed)
      if not (directory / "metrics.jsonl").is_file():
        continue
      summary.seeds += 1
      evals = run_records.read_records(directory, "eval")
      final = run_records.final_eval(directory)
      if final is not None:
        summary.final.append(final[metric])
        summary.updates.append(final["step"])
        summary.test.append(test_metrics(configs[(run, seed)], directory)[metric])
      reached = next((r for r in evals if adaptive_batch.meets(r[metric], target, metric)), None)
      if reached is not None:
        summary.updates_to_target.append(reached["step"])
        summary.examples_to_target.append(reached["epoch"] * num_examples)
    summaries.append(summary)
  return summaries


def _spread(values: Sequence[float], fmt: str, scale: float = 1.0, unit: str = "") -> str:
  """Mean ± sample sd of `values` (times `scale`), or "–" when there are none."""
  if not values:
    return "–"
  values = [scale * v for v in values]
  mean = fmt.format(statistics.fmean(values))
  return (mean if len(values) == 1 else f"{mean} ± {fmt.format(statistics.stdev(values))}") + unit


def write_warmup(configs: dict, workdir: pathlib.Path, seeds: Sequence[int], out: pathlib.Path, command: str,
                 title: str, sizes: Sequence[int], boundaries: Sequence[float], source: str,
                 extra_targets: Sequence[float] = ()) -> None:
  """Writes `<out>.csv` (every evaluation), `<out>.md` and `<out>.png` from the finished runs; the table
  once for the baseline's final metric and once for each of `extra_targets` (as the runs record the
  metric: accuracy as a fraction)."""
  first = next(iter(configs.values()))
  metric = METRIC_KEYS[first.dataset]
  split = first.data_options.get("eval_split", "test")
  num_examples = _train_examples(first)
  baseline = adaptive_batch.baseline_target(str(workdir), seeds, metric)
  scale = 100.0 if metric == "accuracy" else 1.0
  unit = "%" if metric == "accuracy" else ""
  schedule = " → ".join(f"{b} from epoch {e:g}" for b, e in zip(sizes, (0.0, *boundaries)))
  lines = [f"# {title}", "", f"Command: `{command}`", "",
           f"CBS warm-up batch schedule ({source}): {schedule}. Seeds {', '.join(map(str, seeds))}; mean ± sample "
           f"sd over seeds. 'to target': the first periodic evaluation on the {split} split at least as good as the "
           f"target ('(k of n)': reached by k of the n seeds). Test {metric}: each run's final state on the test "
           "split, evaluated once after training.", ""]
  targets = ([(f"the baseline's final {split} {metric} (mean over its seeds)", baseline)] if baseline is not None
             else []) + [(f"a fixed {split} {metric}", t) for t in extra_targets]
  for name, target in targets:
    lines += [f"## Target: {name}, {scale * target:.2f}{unit}", "",
              f"| run | seeds | final {split} {metric} | final test {metric} | updates | updates to target | "
              "examples to target |", "|---|---:|---:|---:|---:|---:|---:|"]
    for s in summarize_warmup(configs, workdir, seeds, target, metric, num_examples):
      reached = f" ({len(s.updates_to_target)} of {s.seeds})" if len(s.updates_to_target) < s.seeds else ""
      lines.append(f"| {s.run} | {len(s.final)}/{len(seeds)} | {_spread(s.final, '{:.2f}', scale, unit)} | "
                   f"{_spread(s.test, '{:.2f}', scale, unit)} | {_spread(s.updates, '{:.0f}')} | "
                   f"{_spread(s.updates_to_target, '{:.0f}')}{reached} | {_spread(s.examples_to_target, '{:.0f}')}"
                   f"{reached} |")
    lines.append("")
  out.with_suffix(".md").write_text("\n".join(lines) + "\n")
  rows = []
  for (run, seed) in configs:
    directory = adaptive_batch.run_dir(str(workdir), run, seed)
    if (directory / "metrics.jsonl").is_file():
      rows += [[run, seed, r["step"], f"{r['epoch']:.4f}", f"{r[metric]:.4f}", bool(r.get("final"))]
               for r in run_records.read_records(directory, "eval")]
  _write_csv(out.with_suffix(".csv"), ("run", "seed", "step", "epoch", f"{split}_{metric}", "final"), rows)
  _plot_warmup(configs, workdir, seeds, metric, split, out.with_suffix(".png"), title)


def _train_examples(config: ml_collections.ConfigDict) -> int:
  """Examples in an epoch of `config`'s training stream, in the units of a batch: images (the MNIST
  training split less a held-out validation), or PTB's rows of `seq_len` tokens (windows x batch)."""
  stream = train.build_task(config).dataset.make_train_stream(0, 1)
  if hasattr(stream, "windows_per_epoch"):
    return stream.windows_per_epoch(config.batch_size) * config.batch_size
  return stream.num_examples


def _plot_warmup(configs: dict, workdir: pathlib.Path, seeds: Sequence[int], metric: str, split: str,
                 path: pathlib.Path, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  scale = 100.0 if metric == "accuracy" else 1.0
  figure, (quality, batch) = plt.subplots(1, 2, figsize=(11, 4))
  for index, run in enumerate(WARMUP_RUNS):
    for seed in seeds:
      directory = adaptive_batch.run_dir(str(workdir), run, seed)
      if (run, seed) not in configs or not (directory / "metrics.jsonl").is_file():
        continue
      label = run if seed == seeds[0] else None
      evals = run_records.read_records(directory, "eval")
      quality.plot([r["step"] for r in evals], [scale * r[metric] for r in evals], marker=".", color=f"C{index}",
                   label=label, alpha=0.8)
      trained = run_records.read_records(directory, "train")
      batch.plot([r["epoch"] for r in trained], [r["batch_size"] for r in trained], color=f"C{index}", label=label)
  quality.set(xlabel="optimizer updates", ylabel=f"{split} {metric}" + (" (%)" if metric == "accuracy" else ""),
              xscale="log")
  quality.xaxis.set_minor_formatter(ticker.NullFormatter())  # the minor labels of a short log axis overlap
  batch.set(xlabel="epochs", ylabel="batch size", yscale="log")
  for axes in (quality, batch):
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
  figure.suptitle(title, fontsize=10)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


# ---------------------------------------------------------------------------------------------- CLI

def _numbers(text: str, kind, flag: str, parser: argparse.ArgumentParser) -> tuple:
  try:
    return tuple(kind(v) for v in text.split(",") if v.strip())
  except ValueError:
    parser.error(f"{flag} must be comma-separated numbers, got {text!r}")


def main(argv: Sequence[str] | None = None) -> None:
  """Command-line entry; see the module docstring."""
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = argparse.ArgumentParser(prog="python -m experiments.critical_batch", description=__doc__.split("\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  for name in ("measure", "warmup"):
    sub = commands.add_parser(name)
    sub.add_argument("--config", required=True)
    sub.add_argument("--overrides", default="", help="field=value settings, space-separated, e.g. "
                     "'data_options.eval_split=validation batch.micro_batch_size=64'")
    sub.add_argument("--out", required=True, help="output prefix, e.g. docs/results/critical_batch_mnist")
    sub.add_argument("--workdir", required=True)
    sub.add_argument("--title", default="")
  measure_parser, warmup_parser = commands.choices["measure"], commands.choices["warmup"]
  measure_parser.add_argument("--checkpoints", default="0,0.25,0.5,1,2,4", help="epochs of the reference run")
  measure_parser.add_argument("--batch_sizes", default="128,256,512,1024,2048,4096,8192",
                              help="the grid; the first is the reference batch")
  measure_parser.add_argument("--budget_epochs", type=float, default=0.5,
                              help="examples per branch, in epochs (rounded to a whole number of the largest batch)")
  measure_parser.add_argument("--tolerance", type=float, default=0.02,
                              help="relative: B is within the CBS while loss(B) <= (1 + tolerance) loss(B0)")
  measure_parser.add_argument("--lr_multipliers", default="1", help="e.g. 0.5,1,2: the best LR per branch")
  warmup_parser.add_argument("--cbs", required=True,
                             help="a `measure` table, e.g. docs/results/critical_batch_mnist.csv")
  warmup_parser.add_argument("--seeds", default="0,1,2")
  warmup_parser.add_argument("--max_batch", type=int, default=0, help="cap of the warm-up's batch (0: none)")
  warmup_parser.add_argument("--targets", default="", help="more targets besides the baseline's final metric: "
                             "accuracy as a fraction (0.97), perplexity as it is")
  warmup_parser.add_argument("--tolerance", type=float, default=None,
                             help="the CBS at this tolerance from the table's loss ratios (default: the table's CBS)")
  args = parser.parse_args(argv)
  command = "python -m experiments.critical_batch " + shlex.join(argv)
  try:  # a bad grid, config or table: the message and exit status 2, as lbjax-train does
    (_measure_command if args.command == "measure" else _warmup_command)(args, parser, command)
  except ValueError as e:
    parser.exit(2, f"{e}\n")


def _measure_command(args: argparse.Namespace, parser: argparse.ArgumentParser, command: str) -> None:
  config = load_config(args.config, shlex.split(args.overrides) + [f"keep_checkpoints={KEEP_ALL_CHECKPOINTS}"])
  train.validate(config, data_parallel_size=1)
  grid = make_grid(config, _numbers(args.checkpoints, float, "--checkpoints", parser),
                   _numbers(args.batch_sizes, int, "--batch_sizes", parser), args.budget_epochs, args.tolerance,
                   _numbers(args.lr_multipliers, float, "--lr_multipliers", parser), _train_examples(config))
  measure(config, grid, pathlib.Path(args.workdir), pathlib.Path(args.out), command,
          args.title or "Critical batch size vs the gradient noise scale")


def _warmup_command(args: argparse.Namespace, parser: argparse.ArgumentParser, command: str) -> None:
  overrides = shlex.split(args.overrides)
  out, workdir = pathlib.Path(args.out), pathlib.Path(args.workdir)
  if not pathlib.Path(args.cbs).is_file():
    raise ValueError(f"--cbs {args.cbs} not found: give the table `measure` wrote (<out>.csv).")
  seeds = _numbers(args.seeds, int, "--seeds", parser)
  extra_targets = _numbers(args.targets, float, "--targets", parser)
  if args.tolerance is not None and not args.tolerance >= 0:
    parser.error(f"--tolerance must be >= 0, got {args.tolerance}")
  curve = read_cbs_curve(args.cbs, args.tolerance)
  source = f"the CBS of {args.cbs}" + ("" if args.tolerance is None else f" at tolerance {args.tolerance:g}")
  if not curve:
    parser.exit(2, f"{args.cbs} holds no measured CBS yet; run `measure` first.\n")
  probe = load_config(config_spec(args.config, "run=baseline"), overrides)
  sizes, boundaries = warmup_schedule(curve, probe.batch_size, args.max_batch or max(c for _, c in curve),
                                      probe.num_epochs)
  if len(sizes) < 2:
    parser.exit(2, f"the CBS curve of {args.cbs} never exceeds the baseline batch {probe.batch_size} before "
                   f"epoch {probe.num_epochs}: there is no warm-up to compare.\n")
  configs = warmup_configs(args.config, overrides, seeds, sizes, boundaries)
  out.parent.mkdir(parents=True, exist_ok=True)
  title = args.title or "Batch warm-up from the measured CBS"
  for key, run_config in configs.items():  # the outputs after each run, from every run finished so far
    try:
      adaptive_batch.train_runs({key: run_config}, str(workdir))
    except WorkdirInUseError:
      print(f"[critical_batch] {key[0]} seed {key[1]}: another process trains it", flush=True)
      continue
    write_warmup(configs, workdir, seeds, out, command, title, sizes, boundaries, source, extra_targets)


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.critical_batch"):
    main(sys.argv[1:])
