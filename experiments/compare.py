"""A reproduced sweep table against the committed one, point by point.

  python -m experiments.compare reproduced/mnist_lstm_headline.csv docs/results/mnist_lstm_headline.csv

Both files are CSVs written by `experiments.sweep`. For every (rule, batch size) in either, prints the
new and the reference metric (mean ± sample standard deviation over seeds), their difference and a
verdict over the seeds that finished: `within spread` when the difference is at most twice the standard
error of the difference of the two means (both points need at least two seeds), `differs` when it is
larger, and `1 seed` when a side has a single seed, so no spread is known. Where every seed of one side
failed (diverged): `failed here` or `finished here, failed in the reference` (both differ), or `both failed`.
`not run`: a point only one side has (a partial reproduction). Exit status 1 if any point differs (the
verdicts in `FAILING`); with `--tolerance`, also if a single-seed difference exceeds it (accuracy as a
fraction, e.g. 0.003 for 0.3 points).
"""

import argparse
import math
import sys
from typing import Sequence

from experiments import sweep_table
from experiments.runner import RunRow


# Verdicts that fail the comparison (exit status 1).
FAILING = ("differs", "1 seed, beyond tolerance", "failed here", "finished here, failed in the reference")


def verdict(new: sweep_table.PointSummary, reference: sweep_table.PointSummary, tolerance: float) -> str:
  """`within spread`, `differs`, `1 seed` (or `1 seed, beyond tolerance`) from the finished seeds; where one
  side has none: `failed here`, `finished here, failed in the reference`, `both failed`, or `not run` (no row
  here, or none in the reference)."""
  if not new.finished or not reference.finished:
    if not (new.finished or new.failed) or not (reference.finished or reference.failed):
      return "not run"
    if new.finished:
      return "finished here, failed in the reference"
    return "failed here" if reference.finished else "both failed"
  difference = abs(new.mean - reference.mean)
  if new.finished > 1 and reference.finished > 1:
    standard_error = math.sqrt(new.std ** 2 / new.finished + reference.std ** 2 / reference.finished)
    return "within spread" if difference <= 2.0 * standard_error else "differs"
  if tolerance > 0 and difference > tolerance:
    return "1 seed, beyond tolerance"
  return "1 seed"


def comparison_table(new_rows: list[RunRow], reference_rows: list[RunRow],
                     metric: str, tolerance: float = 0.0) -> str:
  """A markdown table: rule, batch, new, reference, difference, verdict."""
  new, reference = sweep_table.summarize(new_rows), sweep_table.summarize(reference_rows)
  empty = sweep_table.PointSummary(math.nan, math.nan, 0, ())
  scale, unit = (100.0, " points") if metric == "accuracy" else (1.0, "")
  lines = [f"| rule | batch | new | reference | difference{unit} | verdict |", "|---|---:|---:|---:|---:|---|"]
  for rule, batch in sorted(set(new) | set(reference)):
    a, b = new.get((rule, batch), empty), reference.get((rule, batch), empty)
    difference = f"{scale * (a.mean - b.mean):+.2f}" if a.finished and b.finished else "–"
    lines.append(f"| {rule} | {batch} | {sweep_table.format_summary(a, metric)} | "
                 f"{sweep_table.format_summary(b, metric)} | {difference} | {verdict(a, b, tolerance)} |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  """Command-line entry; see the module docstring. Returns the exit status."""
  parser = argparse.ArgumentParser(prog="python -m experiments.compare", description=__doc__.split("\n")[0])
  parser.add_argument("new", help="the reproduced CSV")
  parser.add_argument("reference", help="the committed CSV, e.g. docs/results/mnist_lstm_headline.csv")
  parser.add_argument("--metric", default="accuracy", choices=("accuracy", "perplexity"))
  parser.add_argument("--tolerance", type=float, default=0.0,
                      help="largest accepted difference of single-seed points (0: no check)")
  args = parser.parse_args(argv)
  if not args.tolerance >= 0:
    parser.error(f"--tolerance must be >= 0 (0: no check of single-seed points), got {args.tolerance:g}")
  other = "perplexity" if args.metric == "accuracy" else "accuracy"
  advice = (f"compare CSVs written by `python -m experiments.sweep` (for sweeps that measured {other}, add "
            f"--metric {other})")
  try:
    new, reference = (sweep_table.read_csv(path, args.metric, advice) for path in (args.new, args.reference))
  except ValueError as error:
    print(f"error: {error}", file=sys.stderr)
    return 2
  for path, rows in ((args.new, new), (args.reference, reference)):
    if not rows:
      print(f"error: {path} not found or empty; pass CSVs written by `python -m experiments.sweep`.",
            file=sys.stderr)
      return 2
  if (split := sweep_table.rows_split(new)) != (other := sweep_table.rows_split(reference)):
    print(f"error: {args.new} holds {split} {args.metric}, {args.reference} {other} {args.metric}: compare tables of "
          "the same split.", file=sys.stderr)
    return 2
  table = comparison_table(new, reference, args.metric, args.tolerance)
  print(table)
  return 1 if any(line.endswith(tuple(f"| {v} |" for v in FAILING)) for line in table.splitlines()) else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
