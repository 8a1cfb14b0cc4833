"""Accuracy vs bytes sent: PowerSGD at ranks 1, 2, 4 beside 1-bit SGD, QSGD and no compression.

  JAX_NUM_CPU_DEVICES=8 python -m experiments.compression_bytes --config mnist_lstm --epochs 2 \
      --batch_size 128 --ranks 1,2,4 --out docs/results/powersgd_mnist_lstm \
      --workdir runs/compression_bytes
  JAX_NUM_CPU_DEVICES=8 python -m experiments.compression_bytes --config resnet_tiny_synthetic_cifar \
      --epochs 6 --batch_size 128 --ranks 1,2,4 --out docs/results/powersgd_resnet_cifar \
      --workdir runs/compression_bytes_resnet

papers/004 compresses each worker's gradient before the data-parallel all-reduce; PowerSGD
(Vogels et al. 2019) sends rank-r factors instead. Every variant trains the same config with the
same seed, batch size, epochs and learning-rate recipe (with `--lrs`: each its own LR, below) in the
per-device (`shard_map`) step, on all visible devices; only `config.compression` differs:

  none         no_compression (the float32 gradient, one pmean)
  one_bit      1-bit SGD with error feedback
  qsgd_s<S>    QSGD with S levels, fixed-length (dense) code
  powersgd_r<R> PowerSGD at rank R with error feedback and warm start

`--config` is a packaged config or a config file. Without `--lrs` every variant runs once, at the
config's learning rate, in `<workdir>/<variant>`. With `--lrs` (e.g. `--lrs 0.1,0.2,0.4`; the config's
dataset must take `data_options.eval_split="validation"`, as mnist and synthetic_images do), the
learning rate is chosen per variant on the validation split: each LR runs with
`eval_split=validation` in `<workdir>/<variant>/validation_lr_<lr>`, the one with the
highest final validation accuracy (a run that goes non-finite counts as diverged) runs again on the
test split in `<workdir>/<variant>/test_lr_<lr>`, and that run is reported.

Bytes are what one device sends per step (`lbjax.optim.compression.bits_per_step`, logged by the
trainer as the `compression` record) times the number of steps. A run whose workdir holds a final
evaluation (or a diverged run's marker) is not trained again, so an interrupted experiment resumes
where it stopped, and the outputs are rewritten after every variant.
Outputs:
  <out>.csv  variant, learning rate, validation accuracy (with --lrs), bits per device step, ratio,
             steps, MB sent per device, final train loss, final test accuracy
  <out>.md   the same as a table (and the validation accuracy of every LR), with the command
  <out>.png  final test accuracy vs MB sent per device (log scale)
"""

import argparse
import csv
import dataclasses
import functools
import math
import pathlib
from collections.abc import Callable
from typing import Any, Sequence

import jax
import ml_collections

from experiments import fields_the_experiment_sets, run_records, runner, simulated_devices, variant_fields
from lbjax import config_files
from lbjax.train.errors import exit_on_user_errors


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  compression: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Result:
  variant: str
  bits_per_step: float
  ratio: float
  steps: int
  final_train_loss: float
  final_test_accuracy: float
  learning_rate: float = math.nan
  validation_accuracy: dict[float, float] = dataclasses.field(default_factory=dict)  # LR -> (nan: diverged)

  @property
  def megabytes_sent(self) -> float:
    return self.bits_per_step * self.steps / 8 / 1e6


def variants(ranks: Sequence[int], qsgd_levels: int) -> list[Variant]:
  return [Variant("none", {"name": "no_compression"}),
          Variant("one_bit", {"name": "one_bit", "error_feedback": True}),
          Variant(f"qsgd_s{qsgd_levels}", {"name": "qsgd", "num_levels": qsgd_levels}),
          *(Variant(f"powersgd_r{r}", {"name": "powersgd", "rank": r}) for r in ranks)]


VALIDATION_SPLIT = "--config.data_options.eval_split=validation"
PREFIX = "[compression_bytes]"


def run_config(config_name: str, variant: Variant, batch_size: int, epochs: float, overrides: Sequence[str] = ()):
  config = config_files.load(config_name, [f"--config.batch_size={batch_size}",
                                           f"--config.num_epochs={float(epochs)!r}", *overrides]).config
  config.compression = variant.compression
  config.mesh.per_device_gradients = True
  config.progress = False
  return config


def read_result(run_dir: pathlib.Path, variant: str) -> Result | None:
  if not (run_dir / "metrics.jsonl").is_file():
    return None
  final = run_records.final_eval(run_dir)
  if final is None:
    return None
  bits = run_records.read_records(run_dir, "compression")[-1]
  train_records = run_records.read_records(run_dir, "train")
  return Result(variant, bits["bits_per_device_step"], bits["ratio"], final["step"],
                train_records[-1]["loss"], final["accuracy"])


def validation_run_dir(args: argparse.Namespace, variant: str, lr: float) -> pathlib.Path:
  """Where the variant's run at `lr` on the validation split trains (with `--lrs`)."""
  return pathlib.Path(args.workdir) / variant / f"validation_lr_{lr:g}"


def run_loaders(args: argparse.Namespace, common: Sequence[str]
                ) -> dict[tuple[str, str, pathlib.Path], Callable[[], ml_collections.ConfigDict]]:
  """Every run the experiment trains before it chooses, by (variant, role, run directory): without `--lrs`,
  each variant's run at the config's LR ("run"); with them, its run at each LR on the validation split
  ("validation LR <lr>"). (With `--lrs`, each variant's test run at its best LR follows them.)"""
  loaders = {}
  for variant in variants(args.ranks, args.qsgd_levels):
    runs = ([(f"validation LR {lr:g}", validation_run_dir(args, variant.name, lr),
              [f"--config.lr.base={lr!r}", VALIDATION_SPLIT]) for lr in args.lrs]
            or [("run", pathlib.Path(args.workdir) / variant.name, [])])
    for role, run_dir, overrides in runs:
      loaders[(variant.name, role, run_dir)] = functools.partial(run_config, args.config, variant, args.batch_size,
                                                                 args.epochs, (*common, *overrides))
  return loaders


def variant_result(variant: Variant, args: argparse.Namespace, common: Sequence[str]) -> Result:
  """The variant's reported run: at the config's LR, or at the LR that is best on the validation split."""
  def config(overrides=()):
    return run_config(args.config, variant, args.batch_size, args.epochs, (*common, *overrides))

  if not args.lrs:
    run_dir = pathlib.Path(args.workdir) / variant.name
    runner.run_once(config(), run_dir, name=variant.name, prefix=PREFIX)
    return dataclasses.replace(read_result(run_dir, variant.name), learning_rate=config().lr.base)
  validation = {}
  for lr in args.lrs:
    run_dir = validation_run_dir(args, variant.name, lr)
    runner.run_once(config([f"--config.lr.base={lr!r}", VALIDATION_SPLIT]), run_dir, name=variant.name, prefix=PREFIX)
    result = read_result(run_dir, variant.name)
    validation[lr] = math.nan if result is None else result.final_test_accuracy
  if all(math.isnan(a) for a in validation.values()):
    raise SystemExit(f"{variant.name}: every learning rate of {list(args.lrs)} diverged; try smaller ones.")
  best = max((lr for lr in args.lrs if not math.isnan(validation[lr])), key=lambda lr: validation[lr])
  run_dir = pathlib.Path(args.workdir) / variant.name / f"test_lr_{best:g}"
  runner.run_once(config([f"--config.lr.base={best!r}"]), run_dir, name=variant.name, prefix=PREFIX)
  result = read_result(run_dir, variant.name)
  if result is None:
    raise SystemExit(f"{variant.name}: the test run at the chosen LR {best:g} diverged "
                     f"({run_dir / runner.DIVERGED_NOTE}).")
  return dataclasses.replace(result, learning_rate=best, validation_accuracy=validation)


def _percent(accuracy: float) -> str:
  return "diverged" if math.isnan(accuracy) else f"{100 * accuracy:.2f}%"


def write_outputs(results: list[Result], out: str, command: str, args: argparse.Namespace, num_devices: int) -> None:
  tuned = bool(args.lrs)
  pathlib.Path(out).parent.mkdir(parents=True, exist_ok=True)
  with open(f"{out}.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("variant", "learning_rate", "validation_accuracy", "bits_per_device_step", "ratio", "steps",
                     "megabytes_per_device", "final_train_loss", "final_test_accuracy"))
    for r in results:
      validation = f"{r.validation_accuracy[r.learning_rate]:.4f}" if tuned else ""
      writer.writerow((r.variant, f"{r.learning_rate:g}", validation, f"{r.bits_per_step:.0f}", f"{r.ratio:.4g}",
                       r.steps, f"{r.megabytes_sent:.4g}", f"{r.final_train_loss:.4f}", f"{r.final_test_accuracy:.4f}"))
  if tuned:
    grid = ", ".join(f"{lr:g}" for lr in args.lrs)
    recipe = (f"the learning rate chosen per variant on the validation split among {grid} (highest final "
              "validation accuracy; every LR's in the second table), then one run on the test split")
  else:
    recipe = "the config's learning-rate recipe"
  lines = [f"# Accuracy vs bytes sent: {args.config}, PowerSGD beside 1-bit SGD and QSGD", "",
           f"Global batch {args.batch_size} over {num_devices} devices (per-device gradients in `shard_map`, one "
           f"compressed all-reduce per step), {args.epochs:g} epoch(s), {recipe}, seed {args.seed} for every run. "
           "Bytes: what one device sends per step (`bits_per_step`) times the steps.", "",
           "```", command, "```", "",
           "| variant | LR | bits / device step | compression ratio | steps | MB sent / device | final train loss "
           f"| {'validation accuracy | ' if tuned else ''}final test accuracy |",
           f"|---|---:|---:|---:|---:|---:|---:|{'---:|' if tuned else ''}---:|"]
  for r in results:
    validation = f"{_percent(r.validation_accuracy[r.learning_rate])} | " if tuned else ""
    lines.append(f"| {r.variant} | {r.learning_rate:g} | {r.bits_per_step:,.0f} | {r.ratio:.1f}x | {r.steps} | "
                 f"{r.megabytes_sent:.3f} | {r.final_train_loss:.4f} | {validation}{_percent(r.final_test_accuracy)} |")
  if tuned:
    lines += ["", "Final validation accuracy of every learning rate:", "",
              "| variant | " + " | ".join(f"LR {lr:g}" for lr in args.lrs) + " |",
              "|---|" + "---:|" * len(args.lrs)]
    lines += [f"| {r.variant} | " + " | ".join(_percent(r.validation_accuracy[lr]) for lr in args.lrs) + " |"
              for r in results]
  lines += ["", "One run per variant (one seed) on simulated CPU devices of a loaded 2-core host, so differences of a "
            "few tenths of a percent are within seed-to-seed noise, which this table does not measure. 1-bit SGD "
            "and PowerSGD carry their compression error to the next step (error feedback); QSGD is unbiased but "
            "its variance grows with the leaf size n (E||Q(v)||^2 <= (1 + min(n/s^2, sqrt(n)/s)) ||v||^2, "
            "papers/004) and nothing corrects it. MB sent counts the messages one device sends (PowerSGD: the P "
            "and Q factors of each compressed matrix and the small leaves whole), as `bits_per_step` counts it; how "
            "a collective would move the messages (all-gather of quantized ones, all-reduce of PowerSGD's "
            "factors) is not modelled."]
  pathlib.Path(f"{out}.md").write_text("\n".join(lines) + "\n")
  plot(results, f"{out}.png", f"{args.config}, batch {args.batch_size}, {args.epochs:g} epoch(s)")


def plot(results: list[Result], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  from matplotlib import ticker
  fig, ax = plt.subplots(figsize=(6, 4))
  for r in results:  # a legend, not labels at the points: nearby points' labels overlap
    ax.scatter(r.megabytes_sent, 100 * r.final_test_accuracy, label=r.variant)
  ax.set_xscale("log")
  ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax.legend(fontsize=8)
  ax.set_xlabel("MB sent per device (log scale)")
  ax.set_ylabel("final test accuracy (%)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv: Sequence[str] | None = None) -> list[Result]:
  parser = argparse.ArgumentParser(prog="python -m experiments.compression_bytes",
                                   description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="mnist_lstm", help="a packaged config or a config file")
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--ranks", type=runner.ints, default=(1, 2, 4))
  parser.add_argument("--qsgd_levels", type=int, default=4)
  parser.add_argument("--lrs", type=runner.floats, default=(),
                      help="learning rates to choose from on the validation split, per variant (none: the config's)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", required=True)
  parser.add_argument("--workdir", required=True)
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  if any(not lr > 0 for lr in args.lrs):
    parser.error(f"--lrs must be positive numbers, got {','.join(f'{lr:g}' for lr in args.lrs)}.")
  set_by = {"batch_size": "--batch_size", "num_epochs": "--epochs", "seed": "--seed",
            **({"lr.base": "--lrs"} if args.lrs else {})}
  if refusal := fields_the_experiment_sets(variant_fields(args.config), set_by, f"the variant of {args.config!r}"):
    parser.error(refusal)
  common = [f"--config.seed={args.seed}"]
  # Every run's config checked as lbjax-train checks it, before the first trains.
  configs, problems = runner.run_problems(run_loaders(args, common), label=lambda key: key[0])
  if problems:
    parser.error("\n".join(dict.fromkeys(problems)))
  if args.dry_run:
    runner.print_dry_run(PREFIX, ((f"{variant} {role}", config, run_dir)
                                  for (variant, role, run_dir), config in configs.items()))
    if args.lrs:
      print(f"{PREFIX} then each variant's test run at its best validation LR, in "
            f"{pathlib.Path(args.workdir) / '<variant>' / 'test_lr_<lr>'}", flush=True)
    return []
  command = simulated_devices.command("experiments.compression_bytes", argv)
  results = []
  for variant in variants(args.ranks, args.qsgd_levels):
    results.append(variant_result(variant, args, common))
    write_outputs(results, args.out, command, args, jax.device_count())
  return results


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.compression_bytes"):
    main()
