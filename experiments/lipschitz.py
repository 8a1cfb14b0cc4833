"""The local Lipschitz estimate L(x, g) over the first iterations, per batch size (papers/001 Figure 3).

  python -m experiments.lipschitz --config mnist_lstm --batch_sizes 128,512,2048 \
      --steps 100 --every 2 --out reproduced/lipschitz --workdir runs/lipschitz

papers/001 §4: along the gradient g the best step of a quadratic model is 1/L(x, g) with
L(x, g) = |g^T H g| / ||g||^2; L "usually has a peak in the early iterations" and the peak "tends to
shift toward right (almost linearly) when batch size grows", which motivates a warm-up whose length
grows with the batch size (LEGW). Each batch size B runs the config (a packaged name such as
`mnist_lstm`, or a config file; `--variant` adds keys) with `--config.batch_size=<B>` for `steps`
iterations (`config.num_epochs` follows) with `config.diagnostics.lipschitz_every = every`: the trainer
computes L at the current weights on a fixed small batch (the first `lipschitz_batch_size` test
examples; the Hessian-vector product is exact, forward-over-reverse, where the paper uses a finite
difference) and logs it as `lipschitz` records. The run's directory is `<workdir>/b<B>`; one whose
workdir holds a final evaluation is not trained again.

Outputs (rewritten after each batch size):
  <out>.csv  batch_size,step,epoch,examples_seen,lipschitz
  <out>.md   per batch size: L at the first logged step, its mean over each quarter of the
             iterations, its peak and the step of the peak
  <out>.png  L(x, g) vs iteration, one line per batch size (log y-axis; raw and running mean)
"""

import argparse
import csv
import dataclasses
import functools
import math
import pathlib
import sys
from typing import Sequence

import ml_collections
import numpy as np

from experiments import config_spec
from experiments import fields_the_experiment_sets
from experiments import run_records
from experiments import runner
from experiments import variant_fields
from lbjax import config_files
from lbjax import train
from lbjax.train import config as config_lib
from lbjax.train import names
from lbjax.train import tasks
from lbjax.train.errors import exit_on_user_errors

CSV_COLUMNS = ("batch_size", "step", "epoch", "examples_seen", "lipschitz")
# Training-set sizes of the datasets with fixed splits; synthetic ones take their num_train_examples.
TRAIN_SET_SIZES = {"mnist": 60000, "cifar10": 50000, "imagenet": 1281167}
SMOOTHING_POINTS = 5


@dataclasses.dataclass(frozen=True)
class LipschitzSpec:
  """What to measure.

  Attributes:
    config: a classification config: a packaged name (`mnist_lstm`) or a config file, optionally with
      `:variant` (which must not set the batch size or epochs).
    batch_sizes: global batch sizes, positive ints.
    out: path prefix of the outputs (`<out>.csv`, `<out>.md`, `<out>.png`).
    workdir: directory holding one run directory per batch size.
    steps: iterations to train at every batch size.
    every: L is computed every this many steps (1 = every step).
    lipschitz_batch_size: test examples on which the Hessian is taken.
    variant: extra variant keys for every run, e.g. `"rule=sqrt"`; must not set batch or epochs.
    max_device_batch: if > 0, accumulate micro-batches of this size (the same update, less memory).
    title: title of the table and the plot.
  """
  config: str
  batch_sizes: tuple[int, ...]
  out: str
  workdir: str
  steps: int = 100
  every: int = 2
  lipschitz_batch_size: int = 128
  variant: str = ""
  max_device_batch: int = 0
  title: str = "Local Lipschitz estimate L(x, g) along the gradient"


def check_spec(spec: LipschitzSpec) -> None:
  """Raises ConfigError naming every problem of `spec` before any training."""
  errors = []
  config = config_spec(spec.config, spec.variant)
  try:
    set_by = {"batch_size": "--batch_sizes", "batch_sizes": "--batch_sizes", "num_epochs": "--steps",
              "num_steps": "--steps"}
    if refusal := fields_the_experiment_sets(variant_fields(config), set_by, f"the variant of {config!r}"):
      errors.append(refusal)
  except train.ConfigError as e:  # an unknown config or variant key
    errors.append(str(e))
  if not spec.batch_sizes:
    errors.append("no batch sizes given; pass e.g. --batch_sizes 128,512,2048.")
  bad = [b for b in spec.batch_sizes if not isinstance(b, int) or b <= 0]
  if bad:
    errors.append(f"batch sizes must be positive integers, got {bad}.")
  if not isinstance(spec.steps, int) or spec.steps < 1:
    errors.append(f"steps must be an integer >= 1, got {spec.steps!r}.")
  if not isinstance(spec.every, int) or not 1 <= spec.every <= max(spec.steps, 1):
    errors.append(f"every must be an integer in [1, steps={spec.steps}], got {spec.every!r}.")
  if not isinstance(spec.lipschitz_batch_size, int) or spec.lipschitz_batch_size < 1:
    errors.append(f"lipschitz_batch_size must be a positive integer, got {spec.lipschitz_batch_size!r}.")
  if not isinstance(spec.max_device_batch, int) or spec.max_device_batch < 0:
    errors.append(f"max_device_batch must be an integer >= 0 (0 = no accumulation), got {spec.max_device_batch!r}.")
  if errors:
    raise train.ConfigError("Invalid Lipschitz experiment:\n  - " + "\n  - ".join(errors))


def _dataset_argument(config: ml_collections.ConfigDict, name: str):
  """An argument of the config's dataset function: its `data_options` field, else the default."""
  dataset = tasks.resolve_dataset(config_lib.FieldReads(config))
  if name in dataset.arguments:
    return dataset.arguments[name]
  return names.parameters(dataset.resolved.function)[name].default


def train_set_size(config: ml_collections.ConfigDict) -> int:
  """Examples in one epoch of the config's training set.

  Raises:
    ConfigError: for a dataset whose size is not known here (language models count tokens, not examples).
  """
  if config.dataset in ("synthetic_mnist", "synthetic_images"):
    return int(_dataset_argument(config, "num_train_examples"))
  if config.dataset == "mnist" and _dataset_argument(config, "eval_split") == "validation":
    return TRAIN_SET_SIZES["mnist"] - int(_dataset_argument(config, "num_validation_examples"))
  if config.dataset in TRAIN_SET_SIZES:
    return TRAIN_SET_SIZES[config.dataset]
  raise train.ConfigError(f"the Lipschitz experiment counts iterations of classification datasets "
                          f"({', '.join(TRAIN_SET_SIZES)} or synthetic images); "
                          f"got config.dataset={config.dataset!r}.")


def run_config(spec: LipschitzSpec, batch_size: int) -> ml_collections.ConfigDict:
  """The config of one batch size: `spec.steps` iterations, L every `spec.every` steps, no mid-run eval."""
  spec_string = config_spec(spec.config, spec.variant)
  overrides = [f"--config.batch_size={batch_size}"]
  epochs = spec.steps * batch_size / train_set_size(config_files.load(spec_string, overrides).config)
  config = config_files.load(spec_string, overrides + [f"--config.num_epochs={float(epochs)!r}"]).config
  config.eval_every_epochs = config.num_epochs  # only the final evaluation
  config.diagnostics.lipschitz_every = spec.every
  config.diagnostics.lipschitz_batch_size = spec.lipschitz_batch_size
  config.log_every = min(config.log_every, spec.steps)
  config.checkpoint_every_steps = 0
  if spec.max_device_batch:
    config.max_device_batch = spec.max_device_batch
  return config


def curve(workdir: str | pathlib.Path) -> list[dict[str, float]]:
  """The `lipschitz` records of a run (step, epoch, lipschitz, batch_size), by step."""
  return run_records.read_records(workdir, "lipschitz")


def write_csv(curves: dict[int, list[dict[str, float]]], path: str | pathlib.Path) -> None:
  """One line per (batch size, logged step) with the columns `CSV_COLUMNS`."""
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(CSV_COLUMNS)
    for batch_size, records in sorted(curves.items()):
      for r in records:
        writer.writerow((batch_size, r["step"], f"{r['epoch']:.6g}", r["step"] * batch_size,
                         f"{r['lipschitz']:.6g}"))


def window_means(records: list[dict[str, float]], steps: int, windows: int = 4) -> list[float]:
  """Mean L over each of `windows` equal ranges of iterations 1..`steps` (NaN for an empty range)."""
  edges = np.linspace(0, steps, windows + 1)
  means = []
  for low, high in zip(edges[:-1], edges[1:]):
    values = [r["lipschitz"] for r in records if low < r["step"] <= high and math.isfinite(r["lipschitz"])]
    means.append(float(np.mean(values)) if values else math.nan)
  return means


def markdown_table(curves: dict[int, list[dict[str, float]]], spec: LipschitzSpec) -> str:
  """Per batch size: L at the first logged step, its mean over each quarter of the iterations, the peak
  value and the step where it is."""
  edges = np.linspace(0, spec.steps, 5)
  quarters = [f"mean L, iters {int(low) + 1}–{int(high)}" for low, high in zip(edges[:-1], edges[1:])]
  lines = [f"# {spec.title}", "",
           f"L(x, g) = |g^T H g| / ||g||^2 on the first {spec.lipschitz_batch_size} test examples, every "
           f"{spec.every} of the first {spec.steps} iterations (papers/001 §4, Figure 3).", "",
           "| batch size | L at first step | " + " | ".join(quarters) + " | peak L | step of peak | epoch of peak |",
           "|---:|---:|" + "---:|" * len(quarters) + "---:|---:|---:|"]
  for batch_size, records in sorted(curves.items()):
    finite = [r for r in records if math.isfinite(r["lipschitz"])]
    if not finite:
      lines.append(f"| {batch_size} | – |" + " – |" * (len(quarters) + 3))
      continue
    peak = max(finite, key=lambda r: r["lipschitz"])
    means = " | ".join(f"{m:.4g}" for m in window_means(finite, spec.steps))
    lines.append(f"| {batch_size} | {finite[0]['lipschitz']:.4g} (step {finite[0]['step']}) | {means} | "
                 f"{peak['lipschitz']:.4g} | {peak['step']} | {peak['epoch']:.3g} |")
  return "\n".join(lines) + "\n"


def plot(curves: dict[int, list[dict[str, float]]], title: str, path: str | pathlib.Path) -> None:
  """L(x, g) vs iteration, one line per batch size, log y-axis (papers/001 Figure 3).

  Each batch size is drawn raw (thin) and as a running geometric mean over `SMOOTHING_POINTS` logged
  points (thick): L on one small batch jumps by a decade from one step to the next.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  figure, axes = plt.subplots(figsize=(6.5, 4))
  for batch_size, records in sorted(curves.items()):
    steps = np.array([r["step"] for r in records])
    values = np.array([r["lipschitz"] for r in records], dtype=float)
    line, = axes.plot(steps, values, alpha=0.35, linewidth=0.8)
    width = min(SMOOTHING_POINTS, len(values))  # running geometric mean: L spans decades
    smooth = np.exp(np.convolve(np.log(np.maximum(values, 1e-30)), np.ones(width) / width, mode="valid"))
    axes.plot(steps[width - 1:], smooth, color=line.get_color(), linewidth=2, label=f"B={batch_size}")
  axes.set_yscale("log")
  axes.set_xlabel("iteration")
  axes.set_ylabel("L(x, g) = |gᵀHg| / ‖g‖²")
  axes.set_title(title, fontsize=10)
  axes.grid(alpha=0.3, which="both")
  axes.legend(title="batch size")
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def write_outputs(curves: dict[int, list[dict[str, float]]], spec: LipschitzSpec) -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from `curves` ({batch size: lipschitz records})."""
  out = pathlib.Path(spec.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_csv(curves, out.with_suffix(".csv"))
  out.with_suffix(".md").write_text(markdown_table(curves, spec))
  plot(curves, spec.title, out.with_suffix(".png"))


def run_experiment(spec: LipschitzSpec, dry_run: bool = False) -> dict[int, list[dict[str, float]]]:
  """Trains every batch size not yet finished, rewriting the outputs after each; `dry_run`: print what each
  run would train (`runner.print_dry_run`), train nothing and return {}.

  Returns:
    {batch size: its `lipschitz` records}.

  Raises:
    ConfigError: an invalid spec or run config (all checked before any training).
    train.NonFiniteError: a run diverged (L is not defined past that point; lower the LR).
  """
  check_spec(spec)
  configs = runner.load_runs({b: functools.partial(run_config, spec, b) for b in spec.batch_sizes},
                             "Lipschitz experiment", label=lambda b: f"batch={b}")
  run_dirs = {b: pathlib.Path(spec.workdir) / f"b{b}" for b in spec.batch_sizes}
  if dry_run:
    runner.print_dry_run("[lipschitz]", ((f"batch={b}", config, run_dirs[b]) for b, config in configs.items()))
    return {}
  curves = {}
  for batch_size, config in configs.items():
    run_dir = run_dirs[batch_size]
    if runner.run_once(config, run_dir, name=f"batch={batch_size}", prefix="[lipschitz]").status == "diverged":
      raise train.NonFiniteError(f"batch {batch_size} diverged ({run_dir / runner.DIVERGED_NOTE}): L is not defined "
                                 "past a non-finite step; lower the learning rate.")
    curves[batch_size] = curve(run_dir)
    write_outputs(curves, spec)
  return curves


def main(argv: Sequence[str] | None = None) -> dict[int, list[dict[str, float]]]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.lipschitz", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True,
                      help="a packaged config (e.g. mnist_lstm) or a config file, optionally with :variant")
  parser.add_argument("--batch_sizes", required=True, type=runner.ints, help="comma-separated batch sizes")
  parser.add_argument("--out", required=True, help="output prefix, e.g. docs/results/lipschitz")
  parser.add_argument("--workdir", required=True, help="directory for the runs")
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--every", type=int, default=2)
  parser.add_argument("--lipschitz_batch_size", type=int, default=128)
  parser.add_argument("--variant", default="", help="extra variant keys for every run, e.g. rule=sqrt")
  parser.add_argument("--max_device_batch", type=int, default=0)
  parser.add_argument("--title", default="Local Lipschitz estimate L(x, g) along the gradient")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  spec = LipschitzSpec(config=args.config, batch_sizes=args.batch_sizes, out=args.out, workdir=args.workdir,
                       steps=args.steps, every=args.every, lipschitz_batch_size=args.lipschitz_batch_size,
                       variant=args.variant, max_device_batch=args.max_device_batch, title=args.title)
  return run_experiment(spec, dry_run=args.dry_run)


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.lipschitz"):
    main(sys.argv[1:])
