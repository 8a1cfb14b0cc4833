"""`measure`: the reference run, every branch of the grid, and the critical batch size per checkpoint
beside the gradient noise scale (`<out>.csv`, `.md`, `.png`)."""

import csv
import dataclasses
import math
import pathlib
import time
from typing import Sequence

import ml_collections

from experiments import run_records
from experiments import runner
from experiments.critical_batch.branches import (Branch, BranchTrainer, branch_key, branch_name, branch_points,
                                                 branches_csv, lock_branch, read_branches, record_branch,
                                                 recorded_branches_problem)
from experiments.critical_batch.grid import Grid
from experiments.sweep import METRIC_KEYS
from lbjax import train
from lbjax.train.errors import RunPreempted
from lbjax.train.errors import WorkdirInUseError

REFERENCE = "reference"  # the reference run's directory in the workdir
RATIO_PREFIX = "loss_ratio_b"  # the CBS table's column of batch B: loss_ratio_b<B>


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


def noise_scale_at(reference_dir: pathlib.Path, step: int | None) -> tuple[float, float, float] | None:
  """(B_noise, its epoch, the |G|^2 average it divides by): the reference run's `batch` record at the latest
  step <= `step` (the first record for the initial state), or None when the run recorded none. B_noise is nan
  while undetermined: before any estimate (the average 0), or while the |G|^2 average is not positive."""
  records = run_records.read_records(reference_dir, "batch") if (reference_dir / "metrics.jsonl").is_file() else []
  if not records:
    return None
  before = [r for r in records if step is not None and r["step"] <= step]
  record = before[-1] if before else records[0]
  return float(record["noise_scale"]), float(record["epoch"]), float(record["grad_norm_sq"])


@dataclasses.dataclass(frozen=True)
class CbsRow:
  """The CBS table's line of one checkpoint."""
  checkpoint_epoch: float
  reference_loss: float
  losses: dict[int, float]  # batch -> best loss over the LR multipliers (only measured batches)
  critical_batch_size: int | None  # None until every batch of the grid has a branch
  noise_scale: float | None
  noise_scale_epoch: float | None
  noise_grad_norm_sq: float | None  # the |G|^2 average under B_noise: where it is not positive, B_noise is nan


def cbs_rows(grid: Grid, branches: Sequence[Branch], reference_dir: pathlib.Path,
             steps: dict[float, int | None]) -> list[CbsRow]:
  """One row per checkpoint with at least one branch; the CBS once every batch of the grid has all its
  LR multipliers (a diverged branch counts as an infinite loss). Branches of other multipliers (recorded by
  a measurement of another grid) do not count."""
  rows = []
  for point in grid.checkpoints:
    mine = [b for b in branches if b.checkpoint_epoch == point and b.lr_multiplier in grid.lr_multipliers]
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
                       *(noise if noise else (None, None, None))))
  return rows


def read_cbs_curve(path: str | pathlib.Path, tolerance: float | None = None) -> list[tuple[float, int]]:
  """(checkpoint epoch, CBS) of a `measure` table `<out>.csv`, for the checkpoints with a CBS: the
  table's, or with `tolerance` the CBS at that tolerance from the table's loss ratios.

  Raises:
    ValueError: `path` is not a `measure` table: a column of it missing (`checkpoint_epoch`, `loss_ratio_b<B>`
      per batch B, `critical_batch_size`), or a cell that is not what `measure` writes there.
  """
  try:
    with open(path, newline="") as f:
      reader = csv.DictReader(f)
      columns, rows = reader.fieldnames or [], list(reader)
  except UnicodeDecodeError:
    raise ValueError(f"{path} is not a `measure` table (<out>.csv): it is not text.") from None
  ratio_columns = {c: int(c[len(RATIO_PREFIX):]) for c in columns
                   if c.startswith(RATIO_PREFIX) and c[len(RATIO_PREFIX):].isdigit()}
  if not ratio_columns or any(c not in columns for c in ("checkpoint_epoch", "critical_batch_size")):
    raise ValueError(f"{path} is not a `measure` table (<out>.csv, with the columns checkpoint_epoch, "
                     f"{RATIO_PREFIX}<B> for each batch B, critical_batch_size); its columns: {', '.join(columns)}.")
  curve = []
  for line, row in enumerate(rows, start=2):  # line 1 is the header
    if None in row or None in row.values():
      raise ValueError(f"{path} line {line} has not one cell per column of its header; not a `measure` table "
                       "(<out>.csv).")
    if not row["critical_batch_size"]:
      continue  # an incomplete checkpoint
    epoch = _cell(path, line, "checkpoint_epoch", row, _epoch)
    critical = _cell(path, line, "critical_batch_size", row, int)
    if critical not in ratio_columns.values():
      raise ValueError(f"{path} line {line}: critical_batch_size {critical} is none of the table's batch sizes "
                       f"{sorted(ratio_columns.values())}; not a `measure` table (<out>.csv).")
    if tolerance is not None:
      ratios = {size: _cell(path, line, column, row, _loss_ratio) for column, size in ratio_columns.items()}
      critical = critical_batch_size(ratios, tolerance)
    curve.append((epoch, critical))
  return curve


def _epoch(text: str) -> float:
  epoch = float(text)
  if not 0 <= epoch < math.inf:
    raise ValueError(text)
  return epoch


def _loss_ratio(text: str) -> float:
  return math.inf if text == "diverged" else float(text)


def _cell(path: str | pathlib.Path, line: int, column: str, row: dict[str, str], parse):
  """`parse(row[column])`, or a ValueError naming the cell when it is not what `measure` writes there."""
  try:
    return parse(row[column])
  except ValueError:
    raise ValueError(f"{path} line {line}: {column} {row[column]!r} is not what `measure` writes there (an epoch, a "
                     "batch size, a loss ratio or 'diverged'); not a `measure` table (<out>.csv).") from None


def write_measurement(grid: Grid, branches: Sequence[Branch], reference_dir: pathlib.Path,
                      steps: dict[float, int | None], out: pathlib.Path, command: str, title: str) -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from the recorded branches."""
  rows = cbs_rows(grid, branches, reference_dir, steps)
  header = (["checkpoint_epoch", "reference_loss"] + [f"{RATIO_PREFIX}{b}" for b in grid.batch_sizes]
            + ["critical_batch_size", "noise_scale", "noise_scale_epoch", "noise_grad_norm_sq"])
  run_records.write_csv_rows(out.with_suffix(".csv"), header, [
      [r.checkpoint_epoch, r.reference_loss] + [_ratio(r, b) for b in grid.batch_sizes]
      + [r.critical_batch_size or ""]
      + ["" if v is None else v for v in (r.noise_scale, r.noise_scale_epoch, r.noise_grad_norm_sq)] for r in rows])
  out.with_suffix(".md").write_text(measurement_markdown(grid, rows, branches, command, title))
  _plot_measurement(grid, rows, out.with_suffix(".png"), title)


def _ratio(row: CbsRow, size: int) -> str:
  if size not in row.losses:
    return ""
  return f"{row.losses[size] / row.reference_loss:.4f}" if math.isfinite(row.losses[size]) else "diverged"


def _noise_scale_cell(row: CbsRow) -> str:
  if row.noise_scale is None:
    return "–"
  if math.isnan(row.noise_scale):
    why = f"|G|^2 average {row.noise_grad_norm_sq:.3g} <= 0" if row.noise_grad_norm_sq else "no estimate yet"
    return f"n/a: {why} (epoch {row.noise_scale_epoch:.3g})"
  return f"{row.noise_scale:.0f} (epoch {row.noise_scale_epoch:.3g})"


def measurement_markdown(grid: Grid, rows: Sequence[CbsRow], branches: Sequence[Branch], command: str,
                         title: str) -> str:
  split = grid.split
  multipliers = ", ".join(f"{m:g}" for m in grid.lr_multipliers)
  lines = [f"# {title}", "", f"Command: `{command}`", "",
           f"Branches of {grid.budget_examples} examples each from the reference run's state at each checkpoint "
           f"epoch; batch grid {', '.join(map(str, grid.batch_sizes))}; LR: the config's scaling rule at each batch "
           f"on the run's clock, times {multipliers} (the lowest loss counts). Cells: the branch's {split} loss "
           f"after the budget over the B={grid.batch_sizes[0]} branch's. CBS: the largest B with every B' <= B "
           f"at a ratio <= {1 + grid.tolerance:g} (tolerance {grid.tolerance:g}). B_noise: the gradient noise "
           "scale B_simple = tr(Sigma)/|G|^2 as the reference run recorded it (EMA, `batch` record at or before "
           "the checkpoint; at epoch 0 the first record, at the epoch shown); n/a where it is undetermined: before "
           "any two-batch estimate, or while the |G|^2 average is not positive (the gradient's signal is below what "
           "the averages resolve).", "",
           f"| epoch | B0 {split} loss | " + " | ".join(f"B={b}" for b in grid.batch_sizes) + " | CBS | B_noise |",
           "|---:|---:|" + "---:|" * len(grid.batch_sizes) + "---:|---:|"]
  for row in rows:
    cells = [_ratio(row, b) or "–" for b in grid.batch_sizes]
    cbs = str(row.critical_batch_size) if row.critical_batch_size else "(incomplete)"
    lines.append(f"| {row.checkpoint_epoch:g} | {row.reference_loss:.4f} | " + " | ".join(cells)
                 + f" | {cbs} | {_noise_scale_cell(row)} |")
  lines += ["", "Branches (as trained; those of another grid's checkpoints, batches or LR multipliers count for "
            "nothing above):", "",
            f"| epoch | start epoch | B | LR multiplier | LR at end | updates | examples | {split} loss | "
            f"{split} {branches[0].metric if branches else 'metric'} | seconds | device |",
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


def train_reference(config: ml_collections.ConfigDict, reference_dir: pathlib.Path) -> None:
  """Trains the reference run unless finished; waits while another process trains it. (`measure` refuses a
  finished one of another recipe before; an unfinished one the trainer refuses to resume.)"""
  while not ((reference_dir / "metrics.jsonl").is_file() and run_records.final_eval(reference_dir)):
    print(f"[critical_batch] reference run -> {reference_dir}", flush=True)
    try:
      result = train.train_and_evaluate(config, reference_dir)
    except WorkdirInUseError:
      print("[critical_batch] another process trains the reference run; waiting for it", flush=True)
      time.sleep(30)
      continue
    if result.preempted:
      raise RunPreempted(f"the reference run was preempted; its checkpoint in {reference_dir} resumes when "
                         "the command runs again.")


def measure(config: ml_collections.ConfigDict, grid: Grid, workdir: pathlib.Path, out: pathlib.Path,
            command: str, title: str) -> list[Branch]:
  """Trains the reference run and every branch of `grid` not yet recorded; writes the outputs.

  Raises:
    ValueError: before any training, a finished reference run of another recipe in `workdir`
      (`runner.recorded_recipe_problem`) or branches of another budget or recipe in `<out>_branches.csv`
      (`recorded_branches_problem`).
  """
  reference_dir = workdir / REFERENCE
  problems = [runner.recorded_recipe_problem(config, reference_dir) if runner.finished(reference_dir) else "",
              recorded_branches_problem(out, config, grid.budget_examples)]
  if any(problems):
    raise ValueError("\n".join(p for p in problems if p))
  workdir.mkdir(parents=True, exist_ok=True)
  out.parent.mkdir(parents=True, exist_ok=True)
  train_reference(config, reference_dir)
  points = branch_points(reference_dir, grid.checkpoints, config.batch_size / grid.epoch_examples)
  steps = {p.epoch: p.step for p in points}
  metric = METRIC_KEYS[config.dataset]
  work = [(p, b, m) for p in points for b in grid.batch_sizes for m in grid.lr_multipliers]
  done = {branch_key(b) for b in read_branches(branches_csv(out))}
  todo = [w for w in work if (w[0].epoch, w[1], w[2]) not in done]
  print(f"[critical_batch] {len(work)} branches ({len(points)} checkpoints x {len(grid.batch_sizes)} batches x "
        f"{len(grid.lr_multipliers)} LRs) of {grid.budget_examples} examples: {len(work) - len(todo)} recorded, "
        f"{len(todo)} to train.", flush=True)
  trainer = BranchTrainer(config, reference_dir) if todo else None
  try:
    for point, size, multiplier in todo:
      name = branch_name(point.epoch, size, multiplier)
      if (point.epoch, size, multiplier) in {branch_key(b) for b in read_branches(branches_csv(out))}:
        continue  # another process recorded it meanwhile
      lock = lock_branch(workdir, name)
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
        branches = record_branch(branch, out, workdir, config, grid.budget_examples)
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
