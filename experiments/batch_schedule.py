"""papers/002: decaying LR vs increasing batch vs hybrid, compared by test accuracy and updates.

  python -m experiments.batch_schedule --config batch_schedule_mnist \
      --out reproduced/batch_schedule_mnist --workdir runs/batch_schedule_mnist

Trains the config with the variant `schedule=<s>[,<variant>]` (`lbjax-train --config
batch_schedule_mnist:schedule=<s>`) for each realisation s in `<workdir>/<s>` (a finished
run is not trained again; an interrupted one resumes from its checkpoint), then writes
`<out>.csv` (every evaluation: schedule, epoch, step, examples_seen, test_accuracy), `<out>.md` (final
accuracy and number of parameter updates per realisation) and `<out>.png` (test accuracy vs epochs and
vs parameter updates, side by side).
"""

import argparse
import csv
import pathlib
import sys
from typing import Any, Sequence

from experiments import config_spec
from experiments import fields_the_experiment_sets
from experiments import run_records
from experiments import runner
from experiments import variant_fields
from lbjax import config_files
from lbjax.train.errors import exit_on_user_errors

SCHEDULES = ("decay_lr", "grow_batch", "hybrid")
LABELS = {"decay_lr": "decaying learning rate", "grow_batch": "increasing batch size",
          "hybrid": "hybrid (batch up to B_max, then LR decay)"}


def run_schedules(config: str, workdir: str, schedules: Sequence[str] = SCHEDULES,
                  variant: str = "", max_device_batch: int = 0) -> dict[str, float]:
  """Trains each realisation not yet finished in `<workdir>/<schedule>`.

  `config` is a packaged config or a config file whose variant key `schedule` chooses the realisation
  (`batch_schedule_mnist`); `variant` adds keys for every run (e.g. `"epochs=5"`).
  `max_device_batch` > 0 computes larger batches as accumulated micro-batches of that size (the same
  update; faster on CPU).

  Returns:
    The wall-clock seconds each run took in this call (0 for runs already finished).

  Raises:
    ValueError: an unknown schedule name (before any training).
  """
  unknown = [s for s in schedules if s not in SCHEDULES]
  if unknown or not schedules:
    raise ValueError(f"schedules {list(schedules)} must be a non-empty subset of {', '.join(SCHEDULES)}.")
  if max_device_batch < 0:
    raise ValueError(f"max_device_batch must be >= 0 (0 = no accumulation), got {max_device_batch}.")
  configs = {s: config_files.load(config_spec(config, f"schedule={s}", variant)).config for s in schedules}
  seconds = {}
  for schedule, run_config in configs.items():
    if max_device_batch:
      run_config.max_device_batch = max_device_batch
    row = runner.run_once(run_config, pathlib.Path(workdir) / schedule, name=schedule, prefix="[batch_schedule]")
    seconds[schedule] = row.seconds
  return seconds


def curves(workdir: str, schedules: Sequence[str] = SCHEDULES) -> dict[str, list[dict[str, Any]]]:
  """The evaluation records of each finished realisation in `workdir`."""
  return {s: run_records.eval_curve(pathlib.Path(workdir) / s) for s in schedules}


def _batch_history(workdir: str, schedule: str) -> str:
  compiles = run_records.read_records(pathlib.Path(workdir) / schedule, "compile")
  sizes = [r["batch_size"] for r in compiles]  # one compile per batch size, in the order used
  return " → ".join(str(s) for s in dict.fromkeys(sizes))


def write_outputs(workdir: str, out: str, schedules: Sequence[str] = SCHEDULES, title: str = "") -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from the runs in `workdir`."""
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  data = curves(workdir, schedules)
  with open(out_path.with_suffix(".csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("schedule", "epoch", "step", "test_accuracy", "final"))
    for schedule, records in data.items():
      for r in records:
        writer.writerow((schedule, f"{r['epoch']:.4f}", r["step"], f"{r['accuracy']:.4f}", bool(r.get("final"))))
  title = title or "Decaying LR vs increasing batch (papers/002)"
  lines = [f"# {title}", "", "| realisation | batch sizes | parameter updates | final test accuracy |",
           "|---|---|---:|---:|"]
  for schedule, records in data.items():
    final = records[-1]
    lines.append(f"| {LABELS[schedule]} | {_batch_history(workdir, schedule)} | {final['step']} | "
                 f"{100 * final['accuracy']:.2f}% |")
  out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")
  _plot(data, title, out_path.with_suffix(".png"))


def _plot(data: dict[str, list[dict[str, Any]]], title: str, path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  figure, (by_epoch, by_step) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for schedule, records in data.items():
    accuracy = [100 * r["accuracy"] for r in records]
    by_epoch.plot([r["epoch"] for r in records], accuracy, marker=".", label=LABELS[schedule])
    by_step.plot([r["step"] for r in records], accuracy, marker=".", label=LABELS[schedule])
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
  args = parser.parse_args(argv)
  spec = config_spec(args.config, args.variant)
  if refusal := fields_the_experiment_sets(variant_fields(spec), {"schedule": "--schedules"},
                                           f"the variant of {spec!r}"):
    parser.error(refusal)
  schedules = tuple(s.strip() for s in args.schedules.split(",") if s.strip())
  run_schedules(args.config, args.workdir, schedules, args.variant, args.max_device_batch)
  write_outputs(args.workdir, args.out, schedules, args.title)


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.batch_schedule"):
    main(sys.argv[1:])
