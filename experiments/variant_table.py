"""Named variants of one config, each run with seeds -> CSV, markdown table and plot.

  python -m experiments.variant_table experiments/tables/mnist_legw_8k_hypotheses.json \
      --out reproduced/mnist_legw_8k_hypotheses --workdir runs/mnist_legw_8k_hypotheses

A table file (JSON) names the config every row starts from and the rows: each row is the config with
its own variant keys and `field=value` overrides (the same as `--config.<field>=<value>` of
`lbjax-train`), and says what it tests. Hypothesis tables (does a longer warm-up close the gap?),
learning-rate grids at a fixed batch size and ablations are all such tables:

  {"title": "...", "config": "mnist_lstm:batch=8192,eval_split=validation",
   "overrides": ["max_device_batch=512"],          # for every row (optional)
   "seeds": [0],                                   # default seeds (optional; --seeds wins)
   "notes": "what the paper says, how to read the table (optional)",
   "rows": [{"name": "legw", "variant": "rule=legw", "tests": "the recipe of the headline table"},
            {"name": "lr_0.04", "overrides": ["lr.base=0.04"], "tests": "..."}]}

The first row is the reference the others are compared with (the `Δ` column). Each run goes to
`<workdir>/<name>_s<seed>`; after each run the outputs `<out>.csv` (one line per run), `<out>.md` and
`<out>.png` are rewritten (`--replot` rewrites the last two from the CSV alone). Runs already in `<out>.csv`
are skipped; an interrupted run resumes from its checkpoint and a finished one is read back from its directory
(to rerun a run, delete its line and its directory; a finished run of another recipe is refused). `--rows a,b`
runs only those rows (the table keeps every row already recorded). A run stopped by a non-finite loss is
recorded as `diverged`. The metric is reported on the split each row evaluates on (`data_options.eval_split`):
choose on `validation`, then report the chosen recipe's `test` metric once.

Several processes may work on one table at once (the same command started N times, e.g. several small
runs sharing one GPU, or one process per GPU): each takes the next run that is neither recorded nor
held by another process (a run directory's lock), and the CSV is merged under a lock and replaced
atomically, so no process loses another's lines.
"""

import argparse
import csv
import dataclasses
import fcntl
import functools
import json
import math
import pathlib
import re
import statistics
import sys
import textwrap
from typing import Sequence

import ml_collections

from experiments import config_spec
from experiments import run_records
from experiments import runner
from experiments import sweep_table
from experiments.runner import RunRow
from lbjax import config_files
from lbjax import train
from lbjax.train import workdir_lock
from lbjax.train.errors import exit_on_user_errors
from lbjax.train.errors import WorkdirInUseError

_NAME = re.compile(r"^[A-Za-z0-9_.+-]+$")
_TABLE_KEYS = {"title", "config", "rows", "overrides", "seeds", "notes", "metric", "x_label"}
_ROW_KEYS = {"name", "tests", "variant", "overrides", "series", "x"}
# In the workdir: held while a process rewrites the table's outputs (see `_record`).
_TABLE_LOCK = "table.lock"
CSV_FIELDS = ("name", "seed", "split", "metric", "value", "status", "learning_rate", "warmup_epochs",
              "epochs", "steps", "seconds", "device", "batch_size")  # the last two absent from older CSVs


@dataclasses.dataclass(frozen=True)
class TableRow:
  """One recipe of a table.

  Attributes:
    name: short identifier (letters, digits, `_.+-`), also the run directory's prefix.
    tests: what the row tests, in words.
    variant: variant keys added to the table's config (e.g. `"rule=legw,warmup=0.078125"`).
    overrides: `field=value` settings applied after the variant (`lr.decay=polynomial_decay`).
    series: with `x`, the line of the plot the row belongs to (e.g. "adam").
    x: with `series`, the row's position on the plot's x-axis (e.g. its batch size), > 0.
  """
  name: str
  tests: str
  variant: str = ""
  overrides: tuple[str, ...] = ()
  series: str = ""
  x: float | None = None


@dataclasses.dataclass(frozen=True)
class Table:
  """A table file: a config and its rows.

  Attributes:
    title: the title of the markdown page and the plot.
    config: the config every row starts from (a packaged name or a file, optionally with `:variant`).
    rows: the recipes; the first is the reference.
    overrides: `field=value` settings for every row (before the row's own).
    seeds: the seeds each row runs with.
    notes: a paragraph printed under the title.
    metric: "accuracy" or "perplexity".
    x_label: the x-axis of a plot whose rows give `series` and `x` (log2 scale); empty: one bar per row.
  """
  title: str
  config: str
  rows: tuple[TableRow, ...]
  overrides: tuple[str, ...] = ()
  seeds: tuple[int, ...] = (0,)
  notes: str = ""
  metric: str = "accuracy"
  x_label: str = ""


def _strings(value, where: str, errors: list[str]) -> tuple[str, ...]:
  if isinstance(value, list) and all(isinstance(v, str) for v in value):
    return tuple(value)
  errors.append(f"{where} must be a list of strings such as [\"lr.base=0.04\"], got {value!r}.")
  return ()


def parse_table(data: dict, source: str = "table") -> Table:
  """The `Table` of a parsed table file; raises ValueError naming every problem."""
  errors = []
  if not isinstance(data, dict):
    raise ValueError(f"{source}: a table file holds a JSON object, got {type(data).__name__}.")
  for key in sorted(set(data) - _TABLE_KEYS):
    errors.append(f"unknown key {key!r}; a table has {', '.join(sorted(_TABLE_KEYS))}.")
  for key in ("title", "config"):
    if not isinstance(data.get(key), str) or not data.get(key):
      errors.append(f"{key!r} must be a non-empty string.")
  seeds = data.get("seeds", [0])
  if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and s >= 0 for s in seeds)
          and len(set(seeds)) == len(seeds)):
    errors.append(f"'seeds' must be a non-empty list of distinct integers >= 0, got {seeds!r}.")
    seeds = [0]
  metric = data.get("metric", "accuracy")
  if metric not in ("accuracy", "perplexity"):
    errors.append(f"'metric' must be 'accuracy' or 'perplexity', got {metric!r}.")
  overrides = _strings(data.get("overrides", []), "'overrides'", errors)
  rows = []
  raw_rows = data.get("rows")
  if not isinstance(raw_rows, list) or not raw_rows:
    errors.append("'rows' must be a non-empty list of {\"name\", \"tests\", \"variant\", \"overrides\"}.")
    raw_rows = []
  for index, raw in enumerate(raw_rows):
    where = f"rows[{index}]"
    if not isinstance(raw, dict):
      errors.append(f"{where} must be an object, got {raw!r}.")
      continue
    for key in sorted(set(raw) - _ROW_KEYS):
      errors.append(f"{where}: unknown key {key!r}; a row has {', '.join(sorted(_ROW_KEYS))}.")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
      errors.append(f"{where}: 'name' must be letters, digits and _.+- only, got {name!r}.")
      continue
    if not isinstance(raw.get("tests"), str) or not raw["tests"]:
      errors.append(f"{where} ({name}): 'tests' must say what the row tests.")
    if not isinstance(raw.get("variant", ""), str):
      errors.append(f"{where} ({name}): 'variant' must be a string such as \"rule=legw\".")
    series, x = raw.get("series", ""), raw.get("x")
    if not isinstance(series, str) or (x is not None and not (isinstance(x, (int, float)) and x > 0)):
      errors.append(f"{where} ({name}): 'series' must be a string and 'x' a number > 0, got {series!r}, {x!r}.")
    elif bool(series) != (x is not None) or bool(series) != bool(data.get("x_label")):
      errors.append(f"{where} ({name}): a line plot needs 'series' and 'x' on every row and the table's "
                    "'x_label'; a bar plot none of them.")
    rows.append(TableRow(name, str(raw.get("tests", "")), str(raw.get("variant", "")),
                         _strings(raw.get("overrides", []), f"{where} ({name}): 'overrides'", errors),
                         series if isinstance(series, str) else "", x))
  names = [r.name for r in rows]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    errors.append(f"row names must be distinct; repeated: {', '.join(duplicates)}.")
  if errors:
    raise ValueError(f"Invalid table {source}:\n  - " + "\n  - ".join(errors))
  return Table(title=data["title"], config=data["config"], rows=tuple(rows), overrides=overrides,
               seeds=tuple(seeds), notes=str(data.get("notes", "")), metric=metric,
               x_label=str(data.get("x_label", "")))


def load_table(path: str | pathlib.Path) -> Table:
  """Reads and checks a table file; raises ValueError (missing file, bad JSON, bad fields)."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise ValueError(f"table file {path} not found; the packaged ones are in experiments/tables/.")
  try:
    data = json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"table file {path} is not valid JSON: {e}") from None
  return parse_table(data, str(path))


def row_config(table: Table, row: TableRow, seed: int, extra: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config of `row` at `seed`: the table's config, the row's variant, then every override (the table's,
  the row's, the seed, then `extra`'s `field=value` settings)."""
  overrides = [f"--config.{o}" for o in (*table.overrides, *row.overrides)] + [f"--config.seed={seed}"]
  overrides += [f"--config.{o}" for o in extra]
  return config_files.load(config_spec(table.config, row.variant), overrides).config


def read_results(path: str | pathlib.Path) -> list[RunRow]:
  """The runs recorded in `<out>.csv` (none if it does not exist)."""
  path = pathlib.Path(path)
  if not path.is_file():
    return []
  with open(path, newline="") as f:
    return [RunRow(r["name"], int(r["seed"]), r["split"], r["metric"], float(r["value"]), r["status"],
                   float(r["learning_rate"]), float(r["warmup_epochs"]), float(r["epochs"]),
                   int(r["steps"]), float(r["seconds"]), r.get("device") or "",
                   int(r["batch_size"]) if r.get("batch_size") else None)
            for r in csv.DictReader(f)]


def _format(value: float, metric: str) -> str:
  return "–" if math.isnan(value) else (f"{100 * value:.2f}%" if metric == "accuracy" else f"{value:.2f}")


def _summary(results: list[RunRow]) -> tuple[float, float, int]:
  values = [r.value for r in results if r.status == "done"]
  mean = statistics.fmean(values) if values else math.nan
  return mean, statistics.stdev(values) if len(values) > 1 else math.nan, len(values)


def _describe(row: TableRow) -> str:
  return ", ".join(p for p in (row.variant, *row.overrides) if p) or "(the table's config)"


def _mean_sd(values: list[float]) -> str:
  return sweep_table.mean_sd([v for v in values if math.isfinite(v)])


def _evaluations_section(table: Table, evaluations: Sequence[run_records.Evaluation],
                         diverged: set[tuple[str, int]]) -> list[str]:
  """The page's lines for the runs evaluated again (`experiments.reevaluate`): one line per (row, label)
  with the metric as trained and under the label's settings over the seeds that did not diverge (the
  (name, seed) pairs in `diverged`), then one line per run."""
  lines = ["", "## Evaluated again", "",
           "The runs above, each evaluated once more from its final parameters under other settings "
           "(`python -m experiments.reevaluate`); `as trained` is the run's own final evaluation. Mean ± "
           "sample sd over the seeds that did not diverge.", "",
           f"| row | settings | split | {table.metric} as trained | {table.metric} re-evaluated | "
           "Δ (mean of per-seed differences) | seeds |",
           "|---|---|---|---:|---:|---:|---:|"]
  for row in table.rows:
    for label in dict.fromkeys(e.label for e in evaluations):
      runs = sorted((e for e in evaluations if e.name == row.name and e.label == label
                     and (e.name, e.seed) not in diverged), key=lambda e: e.seed)
      if runs:
        lines.append(f"| `{row.name}` | `{label}`: `{runs[0].settings}` | {runs[0].split} | "
                     f"{_mean_sd([e.trained_value for e in runs])} | {_mean_sd([e.value for e in runs])} | "
                     f"{_mean_sd([e.value - e.trained_value for e in runs])} | {len(runs)} |")
  lines += ["", f"| row | seed | label | {table.metric} as trained | re-evaluated |", "|---|---:|---|---:|---:|"]
  order = {row.name: i for i, row in enumerate(table.rows)}
  for e in sorted(evaluations, key=lambda e: (order.get(e.name, len(order)), e.label, e.seed)):
    lines.append(f"| `{e.name}` | {e.seed} | `{e.label}` | {e.trained_value:.2f} | {e.value:.2f} |")
  return lines


def markdown(table: Table, results: list[RunRow], evaluations: Sequence[run_records.Evaluation] = ()) -> str:
  """The page: one line per row (mean ± sample sd over seeds, difference to the reference), then runs, then
  the runs evaluated again under other settings, if any."""
  by_row = {row.name: [r for r in results if r.name == row.name] for row in table.rows}
  scale = 100.0 if table.metric == "accuracy" else 1.0
  reference, _, _ = _summary(by_row[table.rows[0].name])
  lines = [f"# {table.title}", ""] + ([table.notes, ""] if table.notes else [])
  lines += [f"Config `{table.config}`" + (f", with {', '.join(f'`{o}`' for o in table.overrides)}" if table.overrides
                                          else "") + f"; reference row: `{table.rows[0].name}`.", "",
            f"| row | tests | settings | split | {table.metric} | Δ vs reference | seeds | updates |",
            "|---|---|---|---|---:|---:|---:|---:|"]
  for row in table.rows:
    runs = by_row[row.name]
    if not runs:
      lines.append(f"| `{row.name}` | {row.tests} | `{_describe(row)}` | | not run | | 0 | |")
      continue
    mean, std, finished = _summary(runs)
    cell = _format(mean, table.metric) + ("" if math.isnan(std) else f" ± {scale * std:.2f}")
    failed = [r.status for r in runs if r.status != "done"]
    if failed:
      cell += f" ({len(failed)} {'/'.join(sorted(set(failed)))})"
    delta = "" if row is table.rows[0] or math.isnan(mean) or math.isnan(reference) else \
        f"{scale * (mean - reference):+.2f}"
    lines.append(f"| `{row.name}` | {row.tests} | `{_describe(row)}` | {runs[0].split} | {cell} | {delta} | "
                 f"{finished}/{len(runs)} | {runs[0].steps} |")
  if any(r.status == "diverged" for r in results):
    lines += ["", "A run diverged when a non-finite step stopped it or it ended a nat above a uniform guess's loss "
              "(ln K for K classes or words; perplexity e·K), having learned less than nothing; it is left out "
              "of its row's mean and listed below with its value."]
  lines += ["", "Runs (peak LR and warm-up as trained):", "",
            "| row | seed | peak LR | warm-up epochs | epochs | updates | seconds | device | "
            f"{table.metric} | status |",
            "|---|---:|---:|---:|---:|---:|---:|---|---:|---|"]
  order = {row.name: i for i, row in enumerate(table.rows)}
  for r in sorted(results, key=lambda r: (order.get(r.name, len(order)), r.seed)):
    lines.append(f"| `{r.name}` | {r.seed} | {r.learning_rate:.4g} | {r.warmup_epochs:.4g} | {r.epochs:.4g} | "
                 f"{r.steps} | {r.seconds:.0f} | {r.device or 'not recorded'} | {_format(r.value, table.metric)} | "
                 f"{r.status} |")
  if evaluations:
    lines += _evaluations_section(table, evaluations, {(r.name, r.seed) for r in results if r.status != "done"})
  return "\n".join(lines) + "\n"


# Ticks per decade of a log axis, densest first: `_plain_log_axis` takes the densest that puts at most
# `MAX_LOG_TICKS` labels on the axis.
LOG_TICK_STEPS = ((1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
                  (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))
MAX_LOG_TICKS = 8


def _plain_log_axis(axis) -> None:
  """A log axis labelled with plain numbers (125, 150, 200 rather than 1.25 x 10^2): the densest of
  `LOG_TICK_STEPS` that gives at most `MAX_LOG_TICKS` ticks over the axis (one per decade at the least),
  so that the labels never run into each other."""
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  low, high = sorted(axis.get_view_interval())
  decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)

  def ticks(subs):
    return [s * 10.0**d for d in decades for s in subs if low <= s * 10.0**d <= high]

  subs = next((subs for subs in LOG_TICK_STEPS if len(ticks(subs)) <= MAX_LOG_TICKS), LOG_TICK_STEPS[-1])
  axis.set_major_locator(ticker.FixedLocator(ticks(subs)))
  axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:,.10g}"))
  axis.set_minor_locator(ticker.NullLocator())


def _draw_lines(axes, rows: list[TableRow], stats: list[tuple[float, float, int]], scale: float, x_label: str,
                diverged: list[int]):
  """One line per series; a point whose row has diverged runs (`diverged`, per row) says how many."""
  for series in dict.fromkeys(row.series for row in rows):
    points = sorted((row.x, mean, std, lost) for row, (mean, std, _), lost in zip(rows, stats, diverged)
                    if row.series == series and not math.isnan(mean))
    line = axes.errorbar([p[0] for p in points], [scale * p[1] for p in points], marker="o", capsize=3,
                         label=series, yerr=[0.0 if math.isnan(p[2]) else scale * p[2] for p in points])
    for x, mean, _, lost in points:
      if lost:
        axes.annotate(f"{lost} diverged", (x, scale * mean), textcoords="offset points", xytext=(-8, 6), ha="right",
                      fontsize=8, color=line.lines[0].get_color())
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  axes.set_xscale("log", base=2)
  sizes = sorted({row.x for row, (mean, _, _) in zip(rows, stats) if not math.isnan(mean)})
  axes.set_xticks(sizes, [f"{x:g}" for x in sizes])  # the values run, not 2^5, 2^6, ...
  axes.xaxis.set_minor_locator(ticker.NullLocator())
  axes.set_xlabel(x_label)
  axes.legend()
  axes.grid(alpha=0.3)


def _draw_bars(axes, rows: list[TableRow], stats: list[tuple[float, float, int]], scale: float,
               values: list[list[float]]):
  positions = list(range(len(rows)))[::-1]
  for position, row_values in zip(positions, values):  # each seed's run, so one outlier seed is visible
    finished = [scale * v for v in row_values if not math.isnan(v)]
    if len(finished) > 1:
      axes.plot(finished, [position] * len(finished), "x", color="gray", markersize=5)
  means = [scale * m for m, _, _ in stats]
  finite = [m for m in means if not math.isnan(m)]
  floor = min(finite) if finite else 0.0
  axes.errorbar([floor if math.isnan(m) else m for m in means], positions,
                xerr=[0.0 if math.isnan(s) else scale * s for _, s, _ in stats], fmt="o", capsize=3)
  for position, mean in zip(positions, means):
    if math.isnan(mean):
      axes.annotate("diverged", (floor, position), textcoords="offset points", xytext=(6, -3))
  if finite and not math.isnan(means[0]):
    axes.axvline(means[0], linestyle="--", color="gray", linewidth=1)
  axes.set_yticks(positions, [row.name for row in rows])
  axes.grid(axis="x", alpha=0.3)


def plot(table: Table, results: list[RunRow], path: str | pathlib.Path) -> None:
  """The table as a figure: lines of the metric vs `x` per series when the table has `x_label` (log2
  x-axis, e.g. papers/001 Figure 5), else one horizontal bar per row with the reference as a dashed
  line and each seed's run as a cross; error bars: sample sd over seeds. Perplexity is drawn on a log
  axis (it is exp of the loss, and a diverged run's can be millions)."""
  import matplotlib  # pylint: disable=g-import-not-at-top  (plots only: matplotlib is an extra)
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  scale = 100.0 if table.metric == "accuracy" else 1.0
  rows = [row for row in table.rows if any(r.name == row.name for r in results)]
  stats = [_summary([r for r in results if r.name == row.name]) for row in rows]
  label = f"{results[0].split if results else 'test'} {table.metric}" + (" (%)" if table.metric == "accuracy" else "")
  if table.x_label:
    figure, axes = plt.subplots(figsize=(6, 4))
    _draw_lines(axes, rows, stats, scale, table.x_label,
                [sum(r.name == row.name and r.status != "done" for r in results) for row in rows])
    axes.set_ylabel(label)
    if table.metric == "perplexity":
      axes.set_yscale("log")
      _plain_log_axis(axes.yaxis)
  else:
    figure, axes = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    _draw_bars(axes, rows, stats, scale,
               [[r.value for r in results if r.name == row.name and r.status == "done"] for row in rows])
    axes.set_xlabel(label)
    if table.metric == "perplexity":
      axes.set_xscale("log")
      _plain_log_axis(axes.xaxis)
  # Wrapped to the axes' width at 9 pt (about 13 characters per inch), so no title is cut: the width once the
  # layout has made room for the tick labels (long row names narrow the axes).
  figure.tight_layout()
  width = axes.get_position().width * figure.get_figwidth()
  axes.set_title(textwrap.fill(table.title, int(13 * width)), fontsize=9)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def write_outputs(table: Table, results: list[RunRow], out: str | pathlib.Path) -> None:
  """Writes `<out>.csv`, `<out>.md` (with the re-evaluations in `<out>.reevaluated.csv`) and `<out>.png`."""
  out = pathlib.Path(out)
  out.parent.mkdir(parents=True, exist_ok=True)
  run_records.write_csv(out.with_suffix(".csv"), CSV_FIELDS, results)
  write_pages(table, results, out)


def write_pages(table: Table, results: list[RunRow], out: pathlib.Path) -> None:
  """Writes `<out>.md` (with the re-evaluations in `<out>.reevaluated.csv`) and `<out>.png`."""
  out.with_suffix(".md").write_text(markdown(table, results, run_records.read_evaluations(out)))
  plot(table, results, out.with_suffix(".png"))


def row_run_dir(workdir: str | pathlib.Path, row: str, seed: int) -> pathlib.Path:
  """Where a row's run of one seed trains: `<workdir>/<row>_s<seed>`."""
  return pathlib.Path(workdir) / f"{row}_s{seed}"


def run_table(table: Table, out: str, workdir: str, seeds: Sequence[int] = (),
              only: Sequence[str] = (), dry_run: bool = False) -> list[RunRow]:
  """Runs every (row, seed) not yet in `<out>.csv`; returns all recorded runs.

  Args:
    table: the table.
    out: output prefix (`<out>.csv`, `.md`, `.png`).
    workdir: directory holding one run directory per (row, seed).
    seeds: the seeds to run (default: the table's).
    only: if not empty, the names of the rows to run.
    dry_run: print what each run to do would train (`runner.planned_run`) after the checks, and train nothing
      (nor create `workdir`).

  Raises:
    ValueError: unknown row names in `only`, bad seeds, a row whose config does not load, or a workdir that
      cannot hold the runs (`workdir_lock.check_workdir`), all checked before any training.
  """
  seeds = tuple(seeds) or table.seeds
  names = [row.name for row in table.rows]
  errors = [f"--rows names {n!r}, which the table does not have; its rows: {', '.join(names)}."
            for n in only if n not in names]
  if problem := runner.seeds_problem(seeds):
    errors.append(problem)
  # Names, arguments and values now, as lbjax-train does; what depends on the devices at each run's start.
  configs, problems = runner.run_problems({(row.name, seed): functools.partial(row_config, table, row, seed)
                                           for row in table.rows if not only or row.name in only for seed in seeds},
                                          label=lambda key: f"row {key[0]}")
  errors += problems
  if not errors and dry_run:
    errors += [problem] if (problem := workdir_lock.workdir_problem(workdir)) else []
  elif not errors:  # the runs' directory (made now, so only once nothing else is wrong)
    try:
      workdir_lock.check_workdir(workdir)
    except train.ConfigError as e:
      errors.append(str(e))
  if errors:
    raise ValueError("Invalid table run:\n  - " + "\n  - ".join(errors))
  csv_path = pathlib.Path(out).with_suffix(".csv")
  results = read_results(csv_path)
  done = {(r.name, r.seed) for r in results}
  order = sorted(configs, key=lambda key: (seeds.index(key[1]), names.index(key[0])))
  to_run = [key for key in order if key not in done]
  print(f"[variant_table] {len(order)} runs ({len(order) // len(seeds)} rows x {len(seeds)} seeds): "
        f"{len(order) - len(to_run)} recorded in {csv_path} (skipped), {len(to_run)} to run.", flush=True)
  if dry_run:
    runner.print_dry_run("[variant_table]", ((f"{name} seed={seed}", configs[(name, seed)],
                                              row_run_dir(workdir, name, seed)) for name, seed in to_run))
    return results
  for name, seed in to_run:
    if (name, seed) in {(r.name, r.seed) for r in read_results(csv_path)}:
      continue  # another process working on the table recorded it meanwhile
    run_dir = row_run_dir(workdir, name, seed)
    print(f"[variant_table] {name} seed={seed} -> {run_dir}", flush=True)
    try:
      result = runner.run_once(configs[(name, seed)], run_dir, name=name, metric=table.metric,
                               prefix="[variant_table]")
    except WorkdirInUseError as e:
      print(f"[variant_table] {name} seed={seed}: skipped, another process is training it ({e})", flush=True)
      continue
    results, added = _record(table, result, out, workdir)
    if added:
      print(f"[variant_table] {name} seed={seed}: {result.split} {table.metric}={result.value:.4f} "
            f"({result.status}, {result.seconds:.0f} s)", flush=True)
    else:  # it finished in another process between our check and its record; this one only resumed it
      print(f"[variant_table] {name} seed={seed}: recorded by another process", flush=True)
  if not to_run and results:
    write_outputs(table, results, out)
  return results


def replot(table: Table, out: str | pathlib.Path) -> list[RunRow]:
  """Rewrites `<out>.md` and `<out>.png` from the runs recorded in `<out>.csv` (none is trained; the CSV,
  the record of the runs, is left as it is)."""
  csv_path = pathlib.Path(out).with_suffix(".csv")
  results = read_results(csv_path)
  if not results:
    raise ValueError(f"{csv_path} records no run: nothing to plot. Run the table first (without --replot).")
  write_pages(table, results, pathlib.Path(out))
  return results


def _record(table: Table, result: RunRow, out: str | pathlib.Path, workdir: str
            ) -> tuple[list[RunRow], bool]:
  """Adds `result` to `<out>.csv` unless a process sharing the table recorded the run already, and
  rewrites the outputs; the CSV is re-read and written under an exclusive lock of the workdir, so
  processes working on one table never lose each other's lines. Returns every recorded run and
  whether `result` was added."""
  pathlib.Path(workdir).mkdir(parents=True, exist_ok=True)
  with open(pathlib.Path(workdir) / _TABLE_LOCK, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    results = read_results(pathlib.Path(out).with_suffix(".csv"))
    added = (result.name, result.seed) not in {(r.name, r.seed) for r in results}
    if added:
      results.append(result)
    write_outputs(table, results, out)
  return results, added


def main(argv: Sequence[str] | None = None) -> list[RunRow]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.variant_table",
                                   description=__doc__.split("\n")[0])
  parser.add_argument("table", help="a table file (JSON), e.g. experiments/tables/mnist_legw_8k_hypotheses.json")
  parser.add_argument("--out", required=True, help="output prefix, e.g. reproduced/mnist_legw_8k_hypotheses")
  parser.add_argument("--workdir", help="directory for the runs (required unless --replot)")
  parser.add_argument("--seeds", type=runner.ints, default=(), help="comma-separated seeds (default: the table's)")
  parser.add_argument("--rows", default="", help="comma-separated row names to run (default: all)")
  parser.add_argument("--replot", action="store_true",
                      help="rewrite <out>.md and <out>.png from <out>.csv, training nothing")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  if args.replot:
    unused = [flag for flag, given in (("--workdir", args.workdir), ("--seeds", args.seeds), ("--rows", args.rows),
                                       ("--dry-run", args.dry_run)) if given]
    if unused:
      parser.error(f"--replot rewrites <out>.md and <out>.png from <out>.csv and runs nothing: drop "
                   f"{', '.join(unused)}.")
    try:
      return replot(load_table(args.table), args.out)
    except ValueError as e:
      parser.exit(2, f"{e}\n")
  if not args.workdir:
    parser.error("--workdir is required to run a table (only --replot goes without it)")
  try:
    table = load_table(args.table)
    return run_table(table, args.out, args.workdir, args.seeds, [n for n in args.rows.split(",") if n.strip()],
                     dry_run=args.dry_run)
  except ValueError as e:
    parser.exit(2, f"{e}\n")


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.variant_table"):
    main(sys.argv[1:])
