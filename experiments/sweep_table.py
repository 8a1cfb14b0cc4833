"""The results of a batch-size sweep: the CSV file that records its rows (`runner.RunRow`, whose `name` is
the scaling rule and `value` the final metric on the split the runs evaluate), markdown table and plot. The
split names the metric's column (`test_accuracy`, `validation_accuracy`) and the page's words.

A point (rule, batch size) may have several rows, one per seed; the table and the plot show their mean
and sample standard deviation.
"""

import csv
import dataclasses
import math
import pathlib
import statistics
from typing import Sequence

from experiments.runner import RunRow

FIELDS = ("rule", "batch_size", "status", "learning_rate", "warmup_epochs", "epochs", "steps", "seconds",
          "same_as", "seed", "device")
# Columns a CSV written before they existed may lack (read with their defaults).
LATER_FIELDS = {"seed", "device"}
# The seed of rows in CSVs written before the column existed: the packaged configs' default seed.
DEFAULT_SEED = 0


SPLITS = ("test", "validation", "valid")  # the evaluation splits of lbjax's datasets (`data_options.eval_split`)


def metric_column(metric: str, split: str = "test") -> str:
  """The CSV column of a metric on a split: `test_accuracy`, `validation_accuracy`, `valid_perplexity`."""
  return f"{split}_{metric}"


def rows_split(rows: list[RunRow]) -> str:
  """The split all `rows` evaluate ("test" for none).

  Raises:
    ValueError: they evaluate different splits (one table holds one split's metric).
  """
  splits = sorted({r.split for r in rows})
  if len(splits) > 1:
    raise ValueError(f"the rows evaluate different splits ({', '.join(splits)}); a table holds one split's metric: "
                     "write each split's runs to their own --out.")
  return splits[0] if splits else "test"


def write_csv(rows: list[RunRow], path: str | pathlib.Path, metric: str) -> None:
  """Writes `rule,batch_size,<split>_<metric>,status,...`, one line per row, sorted by rule and batch."""
  column = metric_column(metric, rows_split(rows))
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("rule", "batch_size", column) + FIELDS[2:])
    for r in sorted(rows, key=lambda r: (r.name, r.batch_size, r.seed)):
      writer.writerow((r.name, r.batch_size, f"{r.value:.6g}", r.status, f"{r.learning_rate:.6g}",
                       f"{r.warmup_epochs:.6g}", f"{r.epochs:.6g}", r.steps, f"{r.seconds:.1f}", r.same_as,
                       r.seed, r.device))


def read_csv(path: str | pathlib.Path, metric: str,
             advice: str = "move it away or choose another --out") -> list[RunRow]:
  """The rows of a CSV written by `write_csv`; [] if the file does not exist.

  Raises:
    ValueError: if the file exists but lacks the columns `write_csv` writes for `metric`; the message ends
      with `advice`, what the caller's user can do (the default: a sweep's own `<out>.csv`).
  """
  path = pathlib.Path(path)
  if not path.is_file():
    return []
  with open(path, newline="") as f:
    reader = csv.DictReader(f)
    split = next((s for s in SPLITS if metric_column(metric, s) in (reader.fieldnames or ())), "test")
    column = metric_column(metric, split)
    missing = {"rule", "batch_size", column, *FIELDS} - LATER_FIELDS - set(reader.fieldnames or ())
    if missing:
      raise ValueError(f"{path} lacks the column(s) {sorted(missing)}: it was not written by a sweep "
                       f"measuring {metric!r}; {advice}.")
    return [RunRow(name=d["rule"], batch_size=int(d["batch_size"]), split=split, metric=metric, value=float(d[column]),
                   status=d["status"], learning_rate=float(d["learning_rate"]),
                   warmup_epochs=float(d["warmup_epochs"]), epochs=float(d["epochs"]),
                   steps=int(d["steps"]), seconds=float(d["seconds"]), same_as=d["same_as"],
                   seed=int(d.get("seed") or DEFAULT_SEED), device=d.get("device") or "")
            for d in reader]


@dataclasses.dataclass(frozen=True)
class PointSummary:
  """The seeds of one point: mean and sample standard deviation of the finished ones.

  Attributes:
    mean: mean metric of the finished seeds (NaN if none finished).
    std: sample standard deviation (NaN with fewer than two finished seeds).
    finished: number of seeds that finished.
    failed: statuses of the seeds that did not (e.g. ["diverged"]).
  """
  mean: float
  std: float
  finished: int
  failed: tuple[str, ...]


def summarize(rows: list[RunRow]) -> dict[tuple[str, int], PointSummary]:
  """{(rule, batch size): PointSummary} over the seeds of each point."""
  points: dict[tuple[str, int], list[RunRow]] = {}
  for r in rows:
    points.setdefault((r.name, r.batch_size), []).append(r)
  summaries = {}
  for key, seeds in points.items():
    values = [r.value for r in seeds if r.status == "done" and not math.isnan(r.value)]
    summaries[key] = PointSummary(
        mean=statistics.fmean(values) if values else math.nan,
        std=statistics.stdev(values) if len(values) > 1 else math.nan,
        finished=len(values), failed=tuple(r.status for r in seeds if r.status != "done" or math.isnan(r.value)))
  return summaries


def format_value(value: float, metric: str) -> str:
  """An accuracy in percent with two decimals, a perplexity with two decimals."""
  return f"{100 * value:.2f}%" if metric == "accuracy" else f"{value:.2f}"


def mean_sd(values: Sequence[float], fmt: str = "{:.2f}", scale: float = 1.0, unit: str = "") -> str:
  """Mean ± sample standard deviation of `values` (times `scale`, each formatted by `fmt`, then `unit`);
  the mean alone for one value, "–" for none."""
  if not values:
    return "–"
  values = [scale * v for v in values]
  mean = fmt.format(statistics.fmean(values))
  return (mean if len(values) == 1 else f"{mean} ± {fmt.format(statistics.stdev(values))}") + unit


def format_summary(point: PointSummary | None, metric: str) -> str:
  """`98.87%` for one seed, `98.87% ± 0.05 (3 seeds)` for several; failed seeds are named."""
  if point is None or not (point.finished or point.failed):
    return "–"
  if not point.finished:
    return "/".join(point.failed)
  text = format_value(point.mean, metric)
  if point.finished > 1:
    spread = 100 * point.std if metric == "accuracy" else point.std
    text += f" ± {spread:.2f} ({point.finished} seeds)"
  if point.failed:
    text += f", {len(point.failed)} {'/'.join(sorted(set(point.failed)))}"
  return text


def markdown_table(rows: list[RunRow], metric: str, title: str) -> str:
  """A markdown page: the metric by batch size (rows) and rule (columns), then every run's recipe."""
  rules = list(dict.fromkeys(r.name for r in rows))
  sizes = sorted({r.batch_size for r in rows})
  split = rows_split(rows)
  cell = summarize(rows)
  spread = " (mean ± sample standard deviation over seeds)" if any(p.finished > 1 for p in cell.values()) else ""
  lines = [f"# {title}", "", f"Final {split} {metric} by batch size and scaling rule{spread}.", "",
           "| batch size | " + " | ".join(rules) + " |", "|---:|" + "---:|" * len(rules)]
  for size in sizes:
    lines.append(f"| {size} | " + " | ".join(format_summary(cell.get((rule, size)), metric)
                                              for rule in rules) + " |")
  lines += ["", "Runs (peak LR and warm-up after the scaling rule; `same as`: identical recipe, one run):", "",
            f"| rule | batch | seed | peak LR | warm-up epochs | epochs | steps | seconds | device | {split} {metric} "
            "| status | same as |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|"]
  for r in sorted(rows, key=lambda r: (rules.index(r.name), r.batch_size, r.seed)):
    lines.append(f"| {r.name} | {r.batch_size} | {r.seed} | {r.learning_rate:.4g} | {r.warmup_epochs:.4g} | "
                 f"{r.epochs:g} | {r.steps} | {r.seconds:.0f} | {r.device or 'not recorded'} | "
                 f"{format_value(r.value, metric)} | {r.status} | {r.same_as} |")
  return "\n".join(lines) + "\n"


MARKERS = "osD^v<>"


def _zoom_limits(values: list[float], metric: str) -> tuple[float, float] | None:
  """y-limits around the best points when the spread would flatten them (accuracy in %)."""
  if len(values) < 2:
    return None
  if metric == "accuracy":
    best = max(values)
    return (best - 3.0, best + 0.5) if best - min(values) > 5.0 else None
  best = min(values)
  return (best * 0.97, best * 1.5) if max(values) > 2.0 * best else None


def plot(rows: list[RunRow], metric: str, title: str, path: str | pathlib.Path) -> None:
  """Final metric (on the rows' split) vs batch size (log2 x-axis), one line per rule, like papers/001 Figure 1.

  A point with several seeds is drawn at their mean with a bar of one standard deviation. Points none
  of whose seeds finished are drawn as crosses at the bottom of the axes. When collapsed runs stretch the
  y-axis so far that the good points overlap, a second panel zooms in on the best ones.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  scale = 100.0 if metric == "accuracy" else 1.0
  summaries = summarize(rows)
  finished = {key: point for key, point in summaries.items() if point.finished}
  zoom = _zoom_limits([scale * point.mean for point in finished.values()], metric)
  figure, panels = plt.subplots(1, 2 if zoom else 1, figsize=(11 if zoom else 6, 4), squeeze=False)
  sizes = sorted({r.batch_size for r in rows})
  for index, axes in enumerate(panels[0]):
    for number, rule in enumerate(dict.fromkeys(r.name for r in rows)):
      points = sorted(size for (other, size) in summaries if other == rule)
      done = [size for size in points if (rule, size) in finished]
      line = axes.errorbar(done, [scale * finished[(rule, s)].mean for s in done],
                           yerr=[scale * finished[(rule, s)].std if finished[(rule, s)].finished > 1 else 0.0
                                 for s in done],
                           marker=MARKERS[number % len(MARKERS)], label=rule, alpha=0.85, capsize=3)
      failed = [size for size in points if size not in done]
      if failed:
        axes.plot(failed, [0] * len(failed), marker="x", linestyle="none", color=line.lines[0].get_color(),
                  transform=axes.get_xaxis_transform(), clip_on=False)
    axes.set_xscale("log", base=2)
    axes.set_xticks(sizes, [str(s) for s in sizes])
    axes.set_xlabel("batch size")
    axes.set_ylabel(f"{rows_split(rows)} {metric}" + (" (%)" if metric == "accuracy" else ""))
    axes.grid(alpha=0.3)
    if index == 1:
      axes.set_ylim(*zoom)
      axes.set_title("zoom on the best points")
    else:
      axes.set_title(title)
      axes.legend(title="scaling rule")
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)
