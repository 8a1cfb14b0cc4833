"""The trained runs of a variant table, evaluated again under other evaluation settings.

  python -m experiments.variant_table experiments/tables/ptb_lstm_headline.json --workdir runs/ptb_headline \
      --out docs/results/ptb_lstm_headline
  python -m experiments.reevaluate experiments/tables/ptb_lstm_headline.json --workdir runs/ptb_headline \
      --label stream --set data_options.eval_protocol=stream --set eval_batch_size=1 \
      --out docs/results/ptb_lstm_headline

For every run of the table (`<workdir>/<row>_s<seed>`, as `experiments.variant_table` trained it: the table
file's seeds and those `<out>.csv` records, e.g. from variant_table's `--seeds`) that finished, the row's
config with the `--set` overrides starts from the run's final parameters (`init_from`) and evaluates them
once: nothing is trained, and the run directory is only read. `--out` is the table's results prefix
(variant_table's `--out`): each evaluation is a line of `<out>.reevaluated.csv` next to the run's own final
metric, and the table's page `<out>.md` gains a section with the two side by side (mean ± sample sd over
seeds). Runs already recorded under the label are skipped, so the command resumes, and several labels can
share one table.

The use it was made for: papers/001's PTB baseline is TensorFlow `ptb_word_lm`'s, which evaluates one
stream from a zero state (`data_options.eval_protocol=stream`), while the tables evaluate in batched
windows (the default): the same trained models under both protocols.
"""

import argparse
import pathlib
import sys
from typing import Sequence

from experiments import run_records
from experiments import runner
from experiments import variant_table
from lbjax.train.errors import exit_on_user_errors


def evaluate_run(table: variant_table.Table, row: variant_table.TableRow, seed: int, run_dir: pathlib.Path,
                 overrides: Sequence[str]) -> dict[str, float]:
  """The metrics of the run in `run_dir` (its final checkpoint) under the row's config with `overrides`."""
  metrics = runner.evaluate_final_state(variant_table.row_config(table, row, seed, overrides), run_dir)
  del metrics["step"]
  return metrics


def _write(table: variant_table.Table, out: pathlib.Path, evaluations: list[run_records.Evaluation]) -> None:
  """`<out>.reevaluated.csv`, and the table's page `<out>.md` with them (its CSV and plot are not touched)."""
  run_records.write_csv(run_records.evaluations_path(out), run_records.EVALUATION_FIELDS, evaluations)
  results = variant_table.read_results(out.with_suffix(".csv"))
  out.with_suffix(".md").write_text(variant_table.markdown(table, results, evaluations))


def reevaluate(table: variant_table.Table, workdir: str | pathlib.Path, out: str | pathlib.Path, label: str,
               overrides: Sequence[str]) -> list[run_records.Evaluation]:
  """Evaluates every finished run of `table` in `workdir` not yet recorded under `label`; returns all.

  Raises:
    ValueError: `out` is not the table's results prefix (no `<out>.csv`), or no run of it finished.
  """
  out, workdir = pathlib.Path(out), pathlib.Path(workdir)
  if not out.with_suffix(".csv").is_file():
    raise ValueError(f"{out.with_suffix('.csv')} does not exist: --out is the table's results prefix, "
                     "experiments.variant_table's --out (e.g. docs/results/ptb_lstm_headline).")
  evaluations = run_records.read_evaluations(out)
  done = {(e.name, e.seed, e.label) for e in evaluations}
  recorded = variant_table.read_results(out.with_suffix(".csv"))
  for row in table.rows:  # the table file's seeds, and those its runs were given (variant_table's --seeds)
    for seed in sorted(set(table.seeds) | {r.seed for r in recorded if r.name == row.name}):
      run_dir = variant_table.row_run_dir(workdir, row.name, seed)
      final = run_records.final_eval(run_dir) if (run_dir / "metrics.jsonl").is_file() else None
      if (row.name, seed, label) in done or final is None or not (run_dir / "checkpoints").is_dir():
        continue
      split = variant_table.row_config(table, row, seed).data_options.get("eval_split", "test")
      metrics = evaluate_run(table, row, seed, run_dir, overrides)
      evaluations.append(run_records.Evaluation(row.name, seed, split, table.metric, label,
                                                float(metrics[table.metric]), float(final[table.metric]),
                                                " ".join(overrides)))
      print(f"[reevaluate] {row.name} seed={seed} {label}: {table.metric}={metrics[table.metric]:.4f} "
            f"(as trained {final[table.metric]:.4f})", flush=True)
      _write(table, out, evaluations)
  if not evaluations:
    raise ValueError(f"no finished run of the table in {workdir} (run directories <row>_s<seed> with a "
                     "final evaluation and checkpoints): train it with experiments.variant_table first.")
  _write(table, out, evaluations)
  return evaluations


def main(argv: Sequence[str] | None = None) -> list[run_records.Evaluation]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.reevaluate", description=__doc__.split("\n")[0])
  parser.add_argument("table", help="the table file the runs were trained from")
  parser.add_argument("--workdir", required=True, help="the table's run directory (variant_table's --workdir)")
  parser.add_argument("--out", required=True, help="the table's results prefix (variant_table's --out): adds "
                      "<out>.reevaluated.csv and a section of <out>.md")
  parser.add_argument("--label", required=True, help="a short name for the settings, e.g. stream")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                      help="an evaluation setting, as --config.FIELD=VALUE of lbjax-train (repeatable)")
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out)
  if not args.overrides:
    parser.error("give at least one --set FIELD=VALUE: the settings to evaluate under")
  try:
    return reevaluate(variant_table.load_table(args.table), args.workdir, args.out, args.label, args.overrides)
  except ValueError as e:
    parser.exit(2, f"{e}\n")


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.reevaluate"):
    main(sys.argv[1:])
