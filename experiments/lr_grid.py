"""Tuning the baseline learning rate: one run per LR at the baseline batch size -> CSV and markdown.

  python -m experiments.lr_grid --config mnist_lstm --lrs 0.01,0.02,0.04,0.08,0.16 \
      --variant epochs=5 --out reproduced/mnist_lstm_lr_grid --workdir runs/lr_grid

Each LR runs the config (a packaged name or a config file, `--variant` keys added) with
`--config.lr.base=<lr>` in `<workdir>/lr_<lr>` (a finished run is not trained again, an interrupted one
resumes). Writes `<out>.csv` (`learning_rate,<split>_<metric>,steps`) and
`<out>.md` with the best LR marked (highest accuracy, or lowest perplexity); `<split>` is the split the
runs evaluate on: choose learning rates on `validation` (`--variant eval_split=validation` for MNIST),
then report the chosen one's test metric once.
"""

import argparse
import csv
import math
import pathlib
import sys
from typing import Sequence

from experiments import config_spec
from experiments import fields_the_experiment_sets
from experiments import run_records
from experiments import runner
from experiments import variant_fields
from lbjax import config_files
from lbjax.train.errors import exit_on_user_errors


def argument_problem(learning_rates: Sequence[float], metric: str) -> str:
  """What is wrong with these arguments of `run_grid`, or "" if nothing."""
  if not learning_rates or any(not lr > 0 for lr in learning_rates):
    return f"learning rates must be a non-empty list of positive numbers, got {list(learning_rates)}."
  if metric not in ("accuracy", "perplexity"):
    return f"metric must be 'accuracy' or 'perplexity', got {metric!r}."
  return ""


def run_grid(config: str, learning_rates: Sequence[float], workdir: str, variant: str = "",
             metric: str = "accuracy", dry_run: bool = False) -> dict[float, dict]:
  """Trains each LR not yet finished and returns {lr: final eval record} (NaN for a run that diverged).

  Args:
    config: a packaged config (`mnist_lstm`) or a config file, optionally with `:variant`.
    learning_rates: the baseline learning rates (`config.lr.base`) to try.
    workdir: directory holding one run directory per LR.
    variant: extra variant keys for every run, e.g. `"epochs=5"`.
    metric: "accuracy" or "perplexity".
    dry_run: print what each run would train (`runner.print_dry_run`), train nothing and return {}.

  Raises:
    ValueError: what `argument_problem` finds wrong (no learning rates, a non-positive one, or an unknown
      metric), or a run's config that does not validate, before any training.
  """
  if problem := argument_problem(learning_rates, metric):
    raise ValueError(problem)
  configs = runner.load_runs({lr: runner.config_loader(config_spec(config, variant), [f"--config.lr.base={lr!r}"])
                              for lr in learning_rates}, "learning-rate grid", label=lambda lr: f"lr={lr:g}")
  if dry_run:
    runner.print_dry_run("[lr_grid]", ((f"lr={lr:g}", configs[lr], pathlib.Path(workdir) / f"lr_{lr:g}")
                                       for lr in learning_rates))
    return {}
  finals = {}
  for lr, run_config in configs.items():
    run_dir = pathlib.Path(workdir) / f"lr_{lr:g}"
    row = runner.run_once(run_config, run_dir, name=f"lr={lr:g}", metric=metric, prefix="[lr_grid]")
    finals[lr] = run_records.final_eval(run_dir) if row.status == "done" else {metric: math.nan, "step": row.steps}
  return finals


def write_outputs(finals: dict[float, dict], out: str, metric: str, title: str, split: str = "test") -> float:
  """Writes `<out>.csv` and `<out>.md` (metric columns named after `split`); returns the best LR."""
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  pick = max if metric == "accuracy" else min
  best = pick((lr for lr in finals if not math.isnan(finals[lr][metric])), key=lambda lr: finals[lr][metric],
              default=math.nan)
  with open(out_path.with_suffix(".csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("learning_rate", f"{split}_{metric}", "steps"))
    for lr, record in sorted(finals.items()):
      writer.writerow((f"{lr:g}", f"{record[metric]:.6g}", record["step"]))
  lines = [f"# {title}", "", f"| learning rate | {split} {metric} | steps |", "|---:|---:|---:|"]
  for lr, record in sorted(finals.items()):
    value = f"{100 * record[metric]:.2f}%" if metric == "accuracy" else f"{record[metric]:.2f}"
    lines.append(f"| {lr:g}{' (best)' if lr == best else ''} | {value} | {record['step']} |")
  out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
  return best


def main(argv: Sequence[str] | None = None) -> float | None:
  """Command-line entry; see the module docstring. Returns the best learning rate (None for `--dry-run`)."""
  parser = argparse.ArgumentParser(prog="python -m experiments.lr_grid", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True,
                      help="a packaged config (e.g. mnist_lstm) or a config file, optionally with :variant")
  parser.add_argument("--lrs", required=True, type=runner.floats, help="comma-separated learning rates")
  parser.add_argument("--out", required=True)
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--variant", default="", help="extra variant keys, e.g. epochs=5")
  parser.add_argument("--metric", default="accuracy", choices=("accuracy", "perplexity"))
  parser.add_argument("--title", default="Baseline learning-rate grid")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  spec = config_spec(args.config, args.variant)
  if refusal := fields_the_experiment_sets(variant_fields(spec), {"lr.base": "--lrs"}, f"the variant of {spec!r}"):
    parser.error(refusal)
  if problem := argument_problem(args.lrs, args.metric):
    parser.error(problem)
  finals = run_grid(args.config, args.lrs, args.workdir, args.variant, args.metric, dry_run=args.dry_run)
  if args.dry_run:
    return None
  split = runner.evaluated_split(config_files.load(config_spec(args.config, args.variant)).config)
  best = write_outputs(finals, args.out, args.metric, args.title, split)
  print(f"[lr_grid] best learning rate {best:g}", flush=True)
  return best


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.lr_grid"):
    main(sys.argv[1:])
