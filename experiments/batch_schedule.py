"""papers/002: decaying LR vs increasing batch vs hybrid, compared by test accuracy and updates.

  python -m experiments.batch_schedule --config batch_schedule_mnist --seeds 0,1,2 \
      --out reproduced/batch_schedule_mnist --workdir runs/batch_schedule_mnist

Trains the config with the variant `schedule=<s>,seed=<k>[,<variant>]` (`lbjax-train --config
batch_schedule_mnist:schedule=<s>,seed=<k>`) for each realisation s and seed k in `<workdir>/<s>_seed<k>`
(a finished run is not trained again; an interrupted one resumes from its checkpoint), then writes
`<out>.csv` (every evaluation: schedule, seed, epoch, step, test_accuracy, final), `<out>.md` (per
realisation: its batch sizes, parameter updates and final test accuracy, mean ± sample sd over the seeds
and each seed's) and `<out>.png` (test accuracy vs epochs and vs parameter updates, side by side, a line
per seed).
"""

import argparse
import csv
import math
import pathlib
import shlex
import sys
from typing import Any, Sequence

from experiments import config_spec
from experiments import fields_the_experiment_sets
from experiments import run_records
from experiments import run_specs
from experiments import runner
from experiments import sweep_table
from experiments import variant_fields
from lbjax import config_files
from lbjax.train.errors import exit_on_user_errors

SCHEDULES = ("decay_lr", "grow_batch", "hybrid")
LABELS = {"decay_lr": "decaying learning rate", "grow_batch": "increasing batch size",
          "hybrid": "hybrid (batch up to B_max, then LR decay)"}


def argument_problem(schedules: Sequence[str], seeds: Sequence[int], max_device_batch: int) -> str:
  """What is wrong with these arguments of `run_schedules`, or "" if nothing."""
  if any(s not in SCHEDULES for s in schedules) or not schedules:
    return f"schedules {list(schedules)} must be a non-empty subset of {', '.join(SCHEDULES)}."
  if max_device_batch < 0:
    return f"max_device_batch must be >= 0 (0 = no accumulation), got {max_device_batch}."
  return runner.seeds_problem(seeds)


def run_schedules(config: str, workdir: str, schedules: Sequence[str] = SCHEDULES,
                  variant: str = "", max_device_batch: int = 0, seeds: Sequence[int] = (0,), dry_run: bool = False
                  ) -> dict[tuple[str, int], float]:
  """Trains each (realisation, seed) not yet finished in `<workdir>/<schedule>_seed<seed>`, seed by seed.

  `config` is a packaged config or a config file whose variant keys `schedule` and `seed` choose the
  realisation and the seed (`batch_schedule_mnist`); `variant` adds keys for every run (e.g.
  `"epochs=5"`). `max_device_batch` > 0 computes larger batches as accumulated micro-batches of that
  size (the same update; faster on CPU). `dry_run`: print what each run would train (`runner.print_dry_run`)
  and train nothing.

  Returns:
    The wall-clock seconds each run took in this call (0 for runs already finished).

  Raises:
    ValueError: what `argument_problem` finds wrong, or a run's config that does not validate (before any
      training).
  """
  if problem := argument_problem(schedules, seeds, max_device_batch):
    raise ValueError(problem)
  overrides = [f"--config.max_device_batch={max_device_batch}"] if max_device_batch else []
  specs = run_specs(config, variant, {(s, k): f"schedule={s},seed={k}" for k in seeds for s in schedules})
  configs = runner.load_runs({key: runner.config_loader(spec, overrides) for key, spec in specs.items()},
                             "batch-schedule experiment", label=lambda key: f"{key[0]} seed={key[1]}")
  if dry_run:
    runner.print_dry_run("[batch_schedule]", ((f"{schedule} seed={seed}", run_config,
                                               runner.run_dir(workdir, schedule, seed))
                                              for (schedule, seed), run_config in configs.items()))
    return {}
  seconds = {}
  for (schedule, seed), run_config in configs.items():
    row = runner.run_once(run_config, runner.run_dir(workdir, schedule, seed), name=schedule, prefix="[batch_schedule]")
    seconds[(schedule, seed)] = row.seconds
  return seconds


def curves(workdir: str, schedules: Sequence[str] = SCHEDULES, seeds: Sequence[int] = (0,)
           ) -> dict[tuple[str, int], list[dict[str, Any]]]:
  """The evaluation records of each (realisation, seed) whose run started in `workdir`."""
  return {(s, k): run_records.eval_curve(runner.run_dir(workdir, s, k)) for s in schedules for k in seeds
          if (runner.run_dir(workdir, s, k) / "metrics.jsonl").is_file()}


def _batch_history(workdir: str, schedule: str, seed: int) -> str:
  compiles = run_records.read_records(runner.run_dir(workdir, schedule, seed), "compile")
  sizes = [r["batch_size"] for r in compiles]  # one compile per batch size, in the order used
  return " → ".join(str(s) for s in dict.fromkeys(sizes))


def write_outputs(workdir: str, out: str, schedules: Sequence[str] = SCHEDULES, title: str = "",
                  seeds: Sequence[int] = (0,), command: str = "", diverged_above: float = math.inf) -> None:
  """Writes `<out>.csv`, `<out>.md` (under `command`, the one that made it, if given) and `<out>.png` from the
  runs in `workdir` (a run not started is left out; the table counts each realisation's finished seeds). A run
  diverged when a non-finite step stopped it or it ended at a loss above `diverged_above`
  (`runner.diverged_above`, as every experiment counts it): named, and out of the mean."""
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  data = curves(workdir, schedules, seeds)
  with open(out_path.with_suffix(".csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("schedule", "seed", "epoch", "step", "test_accuracy", "final"))
    for (schedule, seed), records in data.items():
      for r in records:
        writer.writerow((schedule, seed, f"{r['epoch']:.4f}", r["step"], f"{r['accuracy']:.4f}",
                         bool(r.get("final"))))
  title = title or "Decaying LR vs increasing batch (papers/002)"
  seed_list = f"Seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
  lines = [f"# {title}", "", *([f"Command: `{command}`", ""] if command else []),
           f"{seed_list}: final test accuracy as mean ± sample sd over the seeds that finished, then each seed's.", "",
           "| realisation | batch sizes | parameter updates | final test accuracy | seeds | per seed |",
           "|---|---|---:|---:|---:|---|"]
  for schedule in schedules:
    ended = {seed: records[-1] if records and records[-1].get("final") else None
             for (s, seed), records in data.items() if s == schedule}
    diverged = [seed for seed, final in ended.items() if (final is not None or (
        runner.run_dir(workdir, schedule, seed) / runner.DIVERGED_NOTE).is_file()) and not runner.learned(
            final, diverged_above)]
    finals = {seed: final for seed, final in ended.items() if final is not None and seed not in diverged}
    failed = ", ".join(f"diverged (seed {seed})" for seed in diverged)
    if not finals:
      lines.append(f"| {LABELS[schedule]} | | | {'diverged' if diverged else 'not run'} | 0/{len(seeds)} | {failed} |")
      continue
    histories = {_batch_history(workdir, schedule, seed) for seed in finals}
    updates = sorted({r["step"] for r in finals.values()})
    accuracies = [r["accuracy"] for r in finals.values()]
    per_seed = ", ".join([f"{100 * value:.2f}% (seed {seed})" for seed, value in zip(finals, accuracies)]
                         + ([failed] if failed else []))
    lines.append(f"| {LABELS[schedule]} | {' / '.join(sorted(histories))} | {' / '.join(map(str, updates))} | "
                 f"{sweep_table.mean_sd(accuracies, scale=100.0, unit='%')} | {len(finals)}/{len(seeds)} | "
                 f"{per_seed} |")
  out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
  _plot(data, title, out_path.with_suffix(".png"))


def _plot(data: dict[tuple[str, int], list[dict[str, Any]]], title: str, path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  figure, (by_epoch, by_step) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  labelled = set()
  for (schedule, _), records in data.items():
    accuracy = [100 * r["accuracy"] for r in records]
    color = f"C{SCHEDULES.index(schedule)}"
    label = None if schedule in labelled else LABELS[schedule]
    labelled.add(schedule)
    by_epoch.plot([r["epoch"] for r in records], accuracy, marker=".", color=color, alpha=0.8, label=label)
    by_step.plot([r["step"] for r in records], accuracy, marker=".", color=color, alpha=0.8, label=label)
  by_epoch.set_xlabel("epochs")
  by_step.set_xlabel("parameter updates")
  by_step.set_xscale("log")
  by_epoch.set_ylabel("test accuracy (%)")
  for axes in (by_epoch, by_step):
    axes.grid(alpha=0.3)
  by_epoch.legend()
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def main(argv: Sequence[str] | None = None) -> None:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.batch_schedule",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True, help="e.g. batch_schedule_mnist (or a config file)")
  parser.add_argument("--out", required=True, help="output prefix, e.g. docs/results/batch_schedule_mnist")
  parser.add_argument("--workdir", required=True, help="directory for the runs")
  parser.add_argument("--schedules", default=",".join(SCHEDULES), help="subset of " + ",".join(SCHEDULES))
  parser.add_argument("--variant", default="", help="extra variant keys, e.g. epochs=5")
  parser.add_argument("--title", default="")
  parser.add_argument("--max_device_batch", type=int, default=0,
                      help="accumulate micro-batches of this size (0 = off); the same update, less memory")
  parser.add_argument("--seeds", type=runner.ints, default=(0, 1, 2), help="comma-separated, e.g. 0,1,2")
  runner.add_dry_run(parser)
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  spec = config_spec(args.config, args.variant)
  if refusal := fields_the_experiment_sets(variant_fields(spec), {"schedule": "--schedules", "seed": "--seeds"},
                                           f"the variant of {spec!r}"):
    parser.error(refusal)
  schedules = tuple(s.strip() for s in args.schedules.split(",") if s.strip())
  if problem := argument_problem(schedules, args.seeds, args.max_device_batch):
    parser.error(problem)
  run_schedules(args.config, args.workdir, schedules, args.variant, args.max_device_batch, args.seeds,
                dry_run=args.dry_run)
  if args.dry_run:
    return
  shared = config_files.load(config_files.without_keys(spec, config_files.moot_keys(spec))).config
  write_outputs(args.workdir, args.out, schedules, args.title, args.seeds,
                "python -m experiments.batch_schedule " + shlex.join(argv), runner.diverged_above(shared))


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.batch_schedule"):
    main(sys.argv[1:])
