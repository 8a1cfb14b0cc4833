"""The evaluated metric by epoch for several runs side by side -> CSV and markdown (from their metrics.jsonl).

  python -m experiments.by_epoch --metric perplexity --out reproduced/ptb_lstm_by_epoch \
      --title "PTB LSTM: test perplexity by epoch" \
      --run "B=20 baseline=runs/sweeps/ptb/none_b20" --run "B=640 LEGW=runs/sweeps/ptb/legw_b640"

Each `--run "label=workdir"` adds a column with the run's evaluations (`lbjax.train` logs one per
`eval_every_epochs`, and the final one); rows are epochs rounded to 3 decimals. Unfinished runs are
included as far as they got, and marked so in the header. The page names the split the runs evaluated
(their `config.json`: `data_options.eval_split` or the dataset's default). Writes `<out>.csv`
(`epoch,<label>,...`) and `<out>.md`.
"""

import argparse
import csv
import json
import pathlib
import sys
from typing import NamedTuple, Sequence

import ml_collections

from experiments import run_records
from experiments import runner
from lbjax.train.errors import exit_on_user_errors

METRICS = ("accuracy", "perplexity", "loss")


class Curve(NamedTuple):
  values: dict[float, float]  # {epoch (rounded to 3 decimals): the evaluated metric}
  finished: bool  # the run wrote its final evaluation


def curves(runs: Sequence[tuple[str, str]], metric: str) -> dict[str, Curve]:
  """{label: Curve} of each (label, workdir), from one read of its metrics.jsonl.

  Raises:
    ValueError: no runs, a repeated label, or an unknown metric (before reading anything).
    FileNotFoundError: a workdir without metrics.jsonl.
  """
  if not runs:
    raise ValueError('no runs given; pass --run "label=workdir" at least once.')
  labels = [label for label, _ in runs]
  if len(set(labels)) != len(labels):
    raise ValueError(f"run labels must be distinct, got {labels}.")
  if metric not in METRICS:
    raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}.")
  result = {}
  for label, workdir in runs:
    records = run_records.eval_curve(workdir)
    missing = [r["step"] for r in records if metric not in r]
    if missing:
      raise ValueError(f"the evaluations of {workdir} have no {metric!r} (steps {missing[:3]}); pick the "
                       "metric the run's task reports.")
    result[label] = Curve({round(r["epoch"], 3): r[metric] for r in records},
                          any(r.get("final") for r in records))
  return result


def evaluated_split(workdir: str) -> str:
  """The split the run in `workdir` evaluated (`runner.evaluated_split` of its `config.json`), or "evaluation"
  where its config is not recorded."""
  path = pathlib.Path(workdir) / "config.json"
  if not path.is_file():
    return "evaluation"
  return runner.evaluated_split(ml_collections.ConfigDict(json.loads(path.read_text())["config"]))


def write_outputs(runs: Sequence[tuple[str, str]], metric: str, out: str, title: str) -> None:
  """Writes `<out>.csv` and `<out>.md` for `runs` (see `curves`)."""
  by_curve = curves(runs, metric)
  by_label = {label: curve.values for label, curve in by_curve.items()}
  finished = {label: curve.finished for label, curve in by_curve.items()}
  epochs = sorted({e for values in by_label.values() for e in values})
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  with open(out_path.with_suffix(".csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["epoch", *by_label])
    for epoch in epochs:
      writer.writerow([f"{epoch:g}", *(f"{v[epoch]:.6g}" if epoch in v else "" for v in by_label.values())])
  fmt = (lambda x: f"{100 * x:.2f}%") if metric == "accuracy" else (lambda x: f"{x:.2f}")
  header = [label + ("" if finished[label] else " (unfinished)") for label in by_label]
  split = "/".join(dict.fromkeys(evaluated_split(workdir) for _, workdir in runs))
  lines = [f"# {title}", "", f"{split.capitalize()} {metric} after each evaluated epoch; runs:", ""]
  lines += [f"- {label}: `{workdir}`" for label, workdir in runs]
  lines += ["", "| epoch | " + " | ".join(header) + " |", "|---:|" + "---:|" * len(header)]
  for epoch in epochs:
    cells = [fmt(v[epoch]) if epoch in v else "–" for v in by_label.values()]
    lines.append(f"| {epoch:g} | " + " | ".join(cells) + " |")
  out_path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def _run(text: str) -> tuple[str, str]:
  label, sep, workdir = text.rpartition("=")  # labels may hold "=" (B=20); paths rarely do
  if not sep or not label.strip() or not workdir.strip():
    raise argparse.ArgumentTypeError(f'expected "label=workdir", got {text!r}.')
  return label.strip(), workdir.strip()


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--run", type=_run, action="append", default=[], help='"label=workdir", repeatable')
  parser.add_argument("--metric", default="accuracy", help="accuracy | perplexity | loss")
  parser.add_argument("--out", required=True, help="output path without extension")
  parser.add_argument("--title", default="Metric by epoch")
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out)
  try:
    write_outputs(args.run, args.metric, args.out, args.title)
  except ValueError as e:  # no runs, a repeated label, an unknown metric, a metric the runs did not log
    parser.error(str(e))


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.by_epoch"):
    main(sys.argv[1:])
