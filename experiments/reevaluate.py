"""The trained runs of a variant table, evaluated again under other evaluation settings.

  python -m experiments.reevaluate experiments/tables/ptb_lstm_headline.json --workdir runs/ptb_headline \
      --label stream --set data_options.eval_protocol=stream --set eval_batch_size=1 \
      --out docs/results/ptb_lstm_headline_protocols

For every run of the table (`<workdir>/<row>_s<seed>`, as `experiments.variant_table` trained it) that
finished, the row's config with the `--set` overrides starts from the run's final parameters
(`init_from`) and evaluates them once: nothing is trained, and the run directory is only read. Each
evaluation is a line of `<out>.csv` next to the run's own final metric; `<out>.md` puts the two side by
side (mean ± sample sd over seeds). Runs already recorded under the label are skipped, so the command
resumes, and several labels can share one output.

The use it was made for: papers/001's PTB baseline is TensorFlow `ptb_word_lm`'s, which evaluates one
stream from a zero state (`data_options.eval_protocol=stream`), while the tables evaluate in batched
windows (the default): the same trained models under both protocols.
"""

import argparse
import csv
import dataclasses
import math
import pathlib
import statistics
import sys
import tempfile
from typing import Sequence

from experiments import run_records
from experiments import variant_table
from lbjax.train.errors import exit_on_user_errors
from lbjax.train.run import Run

CSV_FIELDS = ("name", "seed", "split", "metric", "label", "value", "trained_value", "settings")


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """A finished run of the table evaluated under `settings` (a line of `<out>.csv`)."""
  name: str
  seed: int
  split: str
  metric: str
  label: str  # names the settings, e.g. "stream"
  value: float  # the metric under `settings`
  trained_value: float  # the run's own final metric, under the table's settings
  settings: str  # the overrides, space-separated


def read_evaluations(path: str | pathlib.Path) -> list[Evaluation]:
  """The evaluations recorded in `<out>.csv` (none if it does not exist)."""
  path = pathlib.Path(path)
  if not path.is_file():
    return []
  with open(path, newline="") as f:
    return [Evaluation(r["name"], int(r["seed"]), r["split"], r["metric"], r["label"], float(r["value"]),
                       float(r["trained_value"]), r["settings"]) for r in csv.DictReader(f)]


def evaluate_run(table: variant_table.Table, row: variant_table.TableRow, seed: int, run_dir: pathlib.Path,
                 overrides: Sequence[str]) -> dict[str, float]:
  """The metrics of the run in `run_dir` (its final checkpoint) under the row's config with `overrides`."""
  config = variant_table.row_config(table, row, seed, overrides)
  config.init_from = str(run_dir)
  config.progress = False
  with tempfile.TemporaryDirectory(prefix="reevaluate-") as scratch:
    run = Run(config, scratch)
    try:
      return run.evaluate()
    finally:
      run.close()


def _write(evaluations: list[Evaluation], table: variant_table.Table, out: pathlib.Path) -> None:
  out.parent.mkdir(parents=True, exist_ok=True)
  run_records.write_csv(out.with_suffix(".csv"), CSV_FIELDS, evaluations)
  out.with_suffix(".md").write_text(markdown(table, evaluations))


def _mean_sd(values: list[float]) -> str:
  finite = [v for v in values if math.isfinite(v)]
  if not finite:
    return "–"
  text = f"{statistics.fmean(finite):.2f}"
  return text + (f" ± {statistics.stdev(finite):.2f}" if len(finite) > 1 else "")


def markdown(table: variant_table.Table, evaluations: list[Evaluation]) -> str:
  """One line per (row, label): the metric as trained and under the label's settings, over seeds."""
  lines = [f"# {table.title}: evaluated again", "",
           f"The runs of `{table.config}`'s table, each evaluated once more from its final parameters "
           "(`python -m experiments.reevaluate`); `as trained` is the run's own final evaluation. Mean ± "
           "sample sd over seeds.", "",
           f"| row | tests | settings | split | {table.metric} as trained | {table.metric} re-evaluated | "
           "Δ (mean of per-seed differences) | seeds |",
           "|---|---|---|---|---:|---:|---:|---:|"]
  for row in table.rows:
    for label in dict.fromkeys(e.label for e in evaluations):
      runs = sorted((e for e in evaluations if e.name == row.name and e.label == label), key=lambda e: e.seed)
      if not runs:
        continue
      differences = [e.value - e.trained_value for e in runs]
      lines.append(f"| `{row.name}` | {row.tests} | `{label}`: `{runs[0].settings}` | {runs[0].split} | "
                   f"{_mean_sd([e.trained_value for e in runs])} | {_mean_sd([e.value for e in runs])} | "
                   f"{_mean_sd(differences)} | {len(runs)} |")
  lines += ["", "Runs:", "", f"| row | seed | label | {table.metric} as trained | re-evaluated |",
            "|---|---:|---|---:|---:|"]
  for e in sorted(evaluations, key=lambda e: ([r.name for r in table.rows].index(e.name), e.label, e.seed)):
    lines.append(f"| `{e.name}` | {e.seed} | `{e.label}` | {e.trained_value:.2f} | {e.value:.2f} |")
  return "\n".join(lines) + "\n"


def reevaluate(table: variant_table.Table, workdir: str | pathlib.Path, out: str | pathlib.Path, label: str,
               overrides: Sequence[str]) -> list[Evaluation]:
  """Evaluates every finished run of `table` in `workdir` not yet recorded under `label`; returns all."""
  out, workdir = pathlib.Path(out), pathlib.Path(workdir)
  evaluations = read_evaluations(out.with_suffix(".csv"))
  done = {(e.name, e.seed, e.label) for e in evaluations}
  for row in table.rows:
    for seed in table.seeds:
      run_dir = workdir / f"{row.name}_s{seed}"
      final = run_records.final_eval(run_dir) if (run_dir / "metrics.jsonl").is_file() else None
      if (row.name, seed, label) in done or final is None or not (run_dir / "checkpoints").is_dir():
        continue
      split = variant_table.row_config(table, row, seed).data_options.get("eval_split", "test")
      metrics = evaluate_run(table, row, seed, run_dir, overrides)
      evaluations.append(Evaluation(row.name, seed, split, table.metric, label, float(metrics[table.metric]),
                                    float(final[table.metric]), " ".join(overrides)))
      print(f"[reevaluate] {row.name} seed={seed} {label}: {table.metric}={metrics[table.metric]:.4f} "
            f"(as trained {final[table.metric]:.4f})", flush=True)
      _write(evaluations, table, out)
  if not evaluations:
    raise ValueError(f"no finished run of the table in {workdir} (run directories <row>_s<seed> with a "
                     "final evaluation and checkpoints): train it with experiments.variant_table first.")
  _write(evaluations, table, out)
  return evaluations


def main(argv: Sequence[str] | None = None) -> list[Evaluation]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.reevaluate", description=__doc__.split("\n")[0])
  parser.add_argument("table", help="the table file the runs were trained from")
  parser.add_argument("--workdir", required=True, help="the table's run directory (variant_table's --workdir)")
  parser.add_argument("--out", required=True, help="output prefix: <out>.csv and <out>.md")
  parser.add_argument("--label", required=True, help="a short name for the settings, e.g. stream")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                      help="an evaluation setting, as --config.FIELD=VALUE of lbjax-train (repeatable)")
  args = parser.parse_args(argv)
  if not args.overrides:
    parser.error("give at least one --set FIELD=VALUE: the settings to evaluate under")
  try:
    return reevaluate(variant_table.load_table(args.table), args.workdir, args.out, args.label, args.overrides)
  except ValueError as e:
    parser.exit(2, f"{e}\n")


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.reevaluate"):
    main(sys.argv[1:])
