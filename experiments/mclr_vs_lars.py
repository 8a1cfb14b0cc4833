"""MCLR vs LARS at one batch size (papers/003 Figure 16) -> CSV of curves, markdown table, plot.

  python -m experiments.mclr_vs_lars --config mnist_lstm --batch_size 1024 --epochs 2 \
      --lars_lrs 1,3,10 --mclr_lrs 0.0003,0.001,0.003 --out reproduced/mclr_vs_lars \
      --workdir runs/mclr_vs_lars

papers/003 §4.2 proposes the median-curvature learning rate (MCLR, eq. 20-22: a layer's rate is
gamma * |w_m| / (|g_m| + beta |w_m|) with medians of the magnitudes) and finds it on par with LARS at
batch 1024 (Figure 16, training accuracy). Here both optimizers train the config's model at the same
batch size with the same schedule family (linear warm-up, then polynomial decay of power 2 to 0),
the same momentum and weight decay; only the global LR gamma differs, each picked from its own grid
(the two rates differ in scale: LARS has the trust coefficient eta, MCLR none). The selected LR of each
optimizer is the one with the lowest final training loss (Figure 16 compares training curves).

Each (optimizer, LR) runs the config (a packaged name such as `mnist_lstm`, or a config file) with
`--config.batch_size=<B> --config.num_epochs=<E>`, its optimizer section replaced (`lbjax.optim.lars`
or `lbjax.optim.mclr` with these arguments) and its schedule set, in `<workdir>/<optimizer>_lr<LR>`. A
run whose workdir holds a final evaluation (or a divergence note) is not trained again; an interrupted
run resumes from its checkpoint.
Outputs (rewritten after each run):
  <out>.csv  one line per logged point of every run: optimizer,learning_rate,selected,split,step,epoch,
             loss,accuracy (split train: mean over the logging window; split test: an evaluation)
  <out>.md   the grid (final train loss, train and test accuracy per run) and the selected runs' curves
  <out>.png  train loss, train accuracy and test accuracy vs epochs of the selected LARS and MCLR runs
"""

import argparse
import csv
import dataclasses
import functools
import math
import pathlib
import sys
from typing import Any, Sequence

import ml_collections

from experiments import fields_the_experiment_sets
from experiments import run_records
from experiments import runner
from experiments import variant_fields
from lbjax import config_files
from lbjax import train
from lbjax.train.errors import exit_on_user_errors

OPTIMIZERS = ("lars", "mclr")
CSV_COLUMNS = ("optimizer", "learning_rate", "selected", "split", "step", "epoch", "loss", "accuracy")


@dataclasses.dataclass(frozen=True)
class ComparisonSpec:
  """What to compare.

  Attributes:
    config: a classification config: a packaged name (`mnist_lstm`) or a config file, optionally with
      `:variant`.
    learning_rates: {optimizer: global LRs to try}, optimizers from `OPTIMIZERS`.
    out: path prefix of the outputs (`<out>.csv`, `<out>.md`, `<out>.png`).
    workdir: directory holding one run directory per (optimizer, LR).
    batch_size: global batch size of every run.
    epochs: training length in epochs.
    warmup_epochs: linear warm-up from 0 to the LR, then polynomial decay (power 2) to 0.
    momentum: momentum of both optimizers.
    weight_decay: beta of both optimizers (LARS eq. of papers/000, MCLR eq. 22 of papers/003).
    trust_coefficient: LARS eta.
    eval_every_epochs: test evaluations per epoch (1 / this).
    log_every: steps per logged training point.
    max_device_batch: if > 0, accumulate micro-batches of this size (the same update, less memory).
    title: title of the table and the plot.
  """
  config: str
  learning_rates: dict[str, tuple[float, ...]]
  out: str
  workdir: str
  batch_size: int = 1024
  epochs: float = 2.0
  warmup_epochs: float = 0.2
  momentum: float = 0.9
  weight_decay: float = 0.0
  trust_coefficient: float = 0.001
  eval_every_epochs: float = 0.25
  log_every: int = 5
  max_device_batch: int = 0
  title: str = "MCLR vs LARS"


@dataclasses.dataclass(frozen=True)
class RunResult:
  """One finished (optimizer, LR) run.

  Attributes:
    optimizer: "lars" or "mclr".
    learning_rate: the global LR gamma.
    status: "done" or "diverged".
    train: the `train` records of the run (step, epoch, loss, accuracy, ...), by step.
    test: the `eval` records (step, epoch, loss, accuracy), by step; the last one is the final one.
  """
  optimizer: str
  learning_rate: float
  status: str
  train: tuple[dict[str, Any], ...]
  test: tuple[dict[str, Any], ...]

  @property
  def final_train_loss(self) -> float:
    """Mean training loss of the last logging window; NaN if the run diverged or logged nothing."""
    return float(self.train[-1]["loss"]) if self.status == "done" and self.train else math.nan

  @property
  def final_train_accuracy(self) -> float:
    """Mean training accuracy of the last logging window; NaN if diverged."""
    return float(self.train[-1]["accuracy"]) if self.status == "done" and self.train else math.nan

  @property
  def final_test_accuracy(self) -> float:
    """Test accuracy of the final evaluation; NaN if diverged."""
    return float(self.test[-1]["accuracy"]) if self.status == "done" and self.test else math.nan


def check_spec(spec: ComparisonSpec) -> None:
  """Raises ConfigError naming every problem of `spec` before any training."""
  errors = []
  try:
    config_files.config_module(spec.config.partition(":")[0])
  except train.ConfigError as e:
    errors.append(str(e))
  unknown = sorted(set(spec.learning_rates) - set(OPTIMIZERS))
  if unknown:
    errors.append(f"unknown optimizer(s) {unknown}; compare {' and '.join(OPTIMIZERS)}.")
  for name in OPTIMIZERS:
    lrs = spec.learning_rates.get(name, ())
    if not lrs:
      errors.append(f"no learning rates for {name}; pass e.g. --{name}_lrs 0.1,0.3.")
    elif any(not lr > 0 for lr in lrs):
      errors.append(f"learning rates of {name} must be positive, got {list(lrs)}.")
  if not isinstance(spec.batch_size, int) or spec.batch_size <= 0:
    errors.append(f"batch_size must be a positive integer, got {spec.batch_size!r}.")
  if not spec.epochs > 0:
    errors.append(f"epochs must be > 0, got {spec.epochs}.")
  if not 0 <= spec.warmup_epochs < spec.epochs:
    errors.append(f"warmup_epochs must be in [0, epochs={spec.epochs}), got {spec.warmup_epochs}.")
  if not 0 < spec.eval_every_epochs <= spec.epochs:
    errors.append(f"eval_every_epochs must be in (0, epochs={spec.epochs}], got {spec.eval_every_epochs}.")
  if not isinstance(spec.log_every, int) or spec.log_every < 1:
    errors.append(f"log_every must be an integer >= 1, got {spec.log_every!r}.")
  if not isinstance(spec.max_device_batch, int) or spec.max_device_batch < 0:
    errors.append(f"max_device_batch must be an integer >= 0 (0 = no accumulation), got {spec.max_device_batch!r}.")
  if errors:
    raise train.ConfigError("Invalid comparison:\n  - " + "\n  - ".join(errors))


def run_config(spec: ComparisonSpec, optimizer: str, learning_rate: float) -> ml_collections.ConfigDict:
  """The config of one run: the spec's config at `batch`/`epochs`, with the optimizer and schedule set.

  The optimizer section is replaced: `lbjax.optim.lars(momentum, weight_decay, trust_coefficient)` or
  `lbjax.optim.mclr(momentum, weight_decay)`; the LR recipe becomes a linear warm-up and polynomial
  (power 2) decay to 0, unscaled. The config's own clipping is kept.
  """
  config = config_files.load(spec.config, [f"--config.batch_size={spec.batch_size}",
                                           f"--config.num_epochs={float(spec.epochs)!r}"]).config
  config.optimizer = {"name": optimizer, "momentum": spec.momentum, "weight_decay": spec.weight_decay}
  if optimizer == "lars":
    config.optimizer.trust_coefficient = spec.trust_coefficient
  config.scaling = {"rule": "none", "base_batch_size": spec.batch_size}
  config.lr = {"base": learning_rate, "warmup": "linear_warmup" if spec.warmup_epochs > 0 else "none",
               "warmup_epochs": float(spec.warmup_epochs), "decay": "polynomial_decay", "power": 2.0,
               "end_value": 0.0}
  config.eval_every_epochs = spec.eval_every_epochs
  config.log_every = spec.log_every
  if spec.max_device_batch:
    config.max_device_batch = spec.max_device_batch
  return config


def run_directory(spec: ComparisonSpec, optimizer: str, learning_rate: float) -> pathlib.Path:
  """`<workdir>/<optimizer>_lr<LR>`."""
  return pathlib.Path(spec.workdir) / f"{optimizer}_lr{learning_rate:g}"


def _read_result(run_dir: pathlib.Path, optimizer: str, learning_rate: float) -> RunResult | None:
  """The result recorded in `run_dir`, or None if the run has not ended."""
  if not runner.finished(run_dir):
    return None
  if (run_dir / runner.DIVERGED_NOTE).is_file():
    return RunResult(optimizer, learning_rate, "diverged", (), ())
  return RunResult(optimizer, learning_rate, "done", tuple(run_records.read_records(run_dir, "train")),
                   tuple(run_records.eval_curve(run_dir)))


def select(results: list[RunResult]) -> dict[str, RunResult]:
  """{optimizer: its run with the lowest final training loss}, among runs that did not diverge."""
  chosen = {}
  for name in OPTIMIZERS:
    done = [r for r in results if r.optimizer == name and r.status == "done"]
    if done:
      chosen[name] = min(done, key=lambda r: r.final_train_loss)
  return chosen


def write_csv(results: list[RunResult], path: str | pathlib.Path) -> None:
  """One line per logged point of every run (columns `CSV_COLUMNS`)."""
  chosen = select(results)
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(CSV_COLUMNS)
    for r in sorted(results, key=lambda r: (r.optimizer, r.learning_rate)):
      selected = int(chosen.get(r.optimizer) is r)
      for split, records in (("train", r.train), ("test", r.test)):
        for record in records:
          writer.writerow((r.optimizer, f"{r.learning_rate:g}", selected, split, record["step"],
                           f"{record['epoch']:.6g}", f"{record['loss']:.6g}", f"{record['accuracy']:.6g}"))


def _percent(value: float) -> str:
  return "–" if math.isnan(value) else f"{100 * value:.2f}%"


def markdown_table(results: list[RunResult], spec: ComparisonSpec) -> str:
  """The grid of runs, then the selected LARS and MCLR runs' test accuracy at each evaluation."""
  chosen = select(results)
  lines = [f"# {spec.title}", "",
           f"Batch size {spec.batch_size}, {spec.epochs:g} epochs, linear warm-up {spec.warmup_epochs:g} "
           f"epochs then poly(2) decay to 0, momentum {spec.momentum:g}, weight decay {spec.weight_decay:g}, "
           f"LARS eta {spec.trust_coefficient:g}. Selected LR (**bold**): lowest final training loss.", "",
           "| optimizer | LR | status | final train loss | final train accuracy | final test accuracy |",
           "|---|---:|---|---:|---:|---:|"]
  for r in sorted(results, key=lambda r: (r.optimizer, r.learning_rate)):
    lr = f"**{r.learning_rate:g}**" if chosen.get(r.optimizer) is r else f"{r.learning_rate:g}"
    loss = "–" if math.isnan(r.final_train_loss) else f"{r.final_train_loss:.4f}"
    lines.append(f"| {r.optimizer} | {lr} | {r.status} | {loss} | {_percent(r.final_train_accuracy)} | "
                 f"{_percent(r.final_test_accuracy)} |")
  if chosen:
    names = [n for n in OPTIMIZERS if n in chosen]
    by_epoch = {name: {round(e["epoch"], 4): e["accuracy"] for e in chosen[name].test} for name in names}
    epochs = sorted(set().union(*by_epoch.values()))
    lines += ["", "Test accuracy of the selected runs during training:", "",
              "| epoch | " + " | ".join(f"{n} (LR {chosen[n].learning_rate:g})" for n in names) + " |",
              "|---:|" + "---:|" * len(names)]
    for epoch in epochs:
      lines.append(f"| {epoch:g} | " + " | ".join(_percent(by_epoch[n].get(epoch, math.nan)) for n in names) + " |")
  return "\n".join(lines) + "\n"


def plot(results: list[RunResult], title: str, path: str | pathlib.Path) -> None:
  """Train loss, train accuracy and test accuracy vs epochs of the selected run of each optimizer."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  chosen = select(results)
  figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
  panels = (("train", "loss", "train loss"), ("train", "accuracy", "train accuracy (%)"),
            ("test", "accuracy", "test accuracy (%)"))
  for ax, (split, key, label) in zip(axes, panels):
    scale = 100.0 if key == "accuracy" else 1.0
    for name, r in chosen.items():
      records = r.train if split == "train" else r.test
      ax.plot([p["epoch"] for p in records], [scale * p[key] for p in records],
              marker="o" if split == "test" else None, label=f"{name.upper()} (LR {r.learning_rate:g})")
    ax.set_xlabel("epoch")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend()
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def write_outputs(results: list[RunResult], spec: ComparisonSpec) -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from `results`."""
  out = pathlib.Path(spec.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_csv(results, out.with_suffix(".csv"))
  out.with_suffix(".md").write_text(markdown_table(results, spec))
  plot(results, spec.title, out.with_suffix(".png"))


def run_comparison(spec: ComparisonSpec, dry_run: bool = False) -> list[RunResult]:
  """Trains every (optimizer, LR) not yet finished, rewriting the outputs after each run; `dry_run`: print
  what each run would train (`runner.print_dry_run`), train nothing and return [].

  Returns:
    The results of all runs of the grid, finished earlier or now.

  Raises:
    ConfigError: an invalid spec or run config (all checked before any training).
  """
  check_spec(spec)
  points = [(name, lr) for name in OPTIMIZERS for lr in spec.learning_rates[name]]
  configs = runner.load_runs({point: functools.partial(run_config, spec, *point) for point in points},
                             "comparison", label=lambda point: f"{point[0]} lr={point[1]:g}")
  if any(config.dataset in ("ptb", "synthetic_ptb") for config in configs.values()):
    raise train.ConfigError(f"{spec.config} trains a language model; the comparison reports accuracy and "
                            "needs a classification config.")
  if dry_run:
    runner.print_dry_run("[mclr_vs_lars]", ((f"{name} lr={lr:g}", configs[(name, lr)], run_directory(spec, name, lr))
                                            for name, lr in points))
    return []
  results = []
  for point in points:
    run_dir = run_directory(spec, *point)
    trained_now = not runner.finished(run_dir)
    row = runner.run_once(configs[point], run_dir, name=f"{point[0]} lr={point[1]:g}", prefix="[mclr_vs_lars]")
    result = _read_result(run_dir, *point)
    if trained_now:
      print(f"[mclr_vs_lars] {point[0]} lr={point[1]:g}: {result.status}, train loss "
            f"{result.final_train_loss:.4f}, test accuracy {result.final_test_accuracy:.4f} "
            f"({row.seconds:.0f} s)", flush=True)
    results.append(result)
    write_outputs(results, spec)
  return results


def main(argv: Sequence[str] | None = None) -> list[RunResult]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.mclr_vs_lars", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True,
                      help="a packaged config (e.g. mnist_lstm) or a config file, optionally with :variant")
  parser.add_argument("--lars_lrs", required=True, type=runner.floats, help="LARS global LRs, e.g. 1,3,10")
  parser.add_argument("--mclr_lrs", required=True, type=runner.floats, help="MCLR global LRs, e.g. 0.001,0.003")
  parser.add_argument("--out", required=True, help="output prefix, e.g. docs/results/mclr_vs_lars")
  parser.add_argument("--workdir", required=True, help="directory for the runs")
  parser.add_argument("--batch_size", type=int, default=1024)
  parser.add_argument("--epochs", type=float, default=2.0)
  parser.add_argument("--warmup_epochs", type=float, default=0.2)
  parser.add_argument("--momentum", type=float, default=0.9)
  parser.add_argument("--weight_decay", type=float, default=0.0)
  parser.add_argument("--trust_coefficient", type=float, default=0.001)
  parser.add_argument("--eval_every_epochs", type=float, default=0.25)
  parser.add_argument("--log_every", type=int, default=5)
  parser.add_argument("--max_device_batch", type=int, default=0)
  parser.add_argument("--title", default="MCLR vs LARS")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  set_by = {"batch_size": "--batch_size", "num_epochs": "--epochs", "optimizer": "--lars_lrs/--mclr_lrs and the "
            "optimizer flags", "scaling": "the LR recipe flags", "lr": "the LR recipe flags"}
  if refusal := fields_the_experiment_sets(variant_fields(args.config), set_by, f"the variant of {args.config!r}"):
    parser.error(refusal)
  spec = ComparisonSpec(
      config=args.config, learning_rates={"lars": args.lars_lrs, "mclr": args.mclr_lrs}, out=args.out,
      workdir=args.workdir, batch_size=args.batch_size, epochs=args.epochs, warmup_epochs=args.warmup_epochs,
      momentum=args.momentum, weight_decay=args.weight_decay, trust_coefficient=args.trust_coefficient,
      eval_every_epochs=args.eval_every_epochs, log_every=args.log_every,
      max_device_batch=args.max_device_batch, title=args.title)
  return run_comparison(spec, dry_run=args.dry_run)


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.mclr_vs_lars"):
    main(sys.argv[1:])
