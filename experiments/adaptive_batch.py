"""The batch from the gradient noise vs fixed and scheduled batches: test metric, updates and wall time.

  python -m experiments.adaptive_batch --config adaptive_batch_mnist --variant epochs=2 --seeds 0 \
      --out docs/results/adaptive_batch_mnist --workdir runs/adaptive_batch_mnist
  python -m experiments.adaptive_batch --config adaptive_batch_ptb --variant epochs=2 --seeds 0 \
      --out docs/results/adaptive_batch_ptb --workdir runs/adaptive_batch_ptb

Trains `<config>:run=<r>,seed=<s>[,<variant>]` for each run r (baseline, legw, grow_batch, adaptive,
adascale; `lbjax.configs.adaptive_batch_mnist`, `lbjax.configs.adaptive_batch_ptb`) and seed s in
`<workdir>/<r>_seed<s>` (a finished run is not trained again; an interrupted one resumes), then writes
  `<out>.csv`: every evaluation and every `batch` record (batch size, noise scale, efficiency, goodput);
  `<out>.md`: per run, over seeds (mean, and min-max when several), the final test metric, optimizer
    updates, wall time, and the updates and wall time at the first evaluation that reached the
    baseline's final test metric (its mean over seeds), or "not reached";
  `<out>.png`: test metric vs updates, batch size and noise scale vs epochs.
The test metric is the dataset's (`experiments.sweep.METRIC_KEYS`): accuracy, reached when at least the
target, or perplexity, reached when at most the target; on the split the runs evaluate
(`data_options.eval_split`, "test" unless set), which the CSV column, the table and the plot name.
Wall time to the target is the `wall_seconds` of the run's `batch` record at or after that evaluation
(records every `batch.adapt_every` steps); it includes evaluations and compilation. A run stopped by a
non-finite loss or update is recorded as diverged (`<workdir>/<r>_seed<s>/diverged.txt`, the error) and
not trained again; the experiment goes on with the next run.
"""

import argparse
import csv
import pathlib
import shlex
import statistics
import sys
from typing import Any, Sequence

from experiments import config_spec
from experiments import fields_the_experiment_sets
from experiments import run_records
from experiments import run_specs
from experiments import runner
from experiments import sweep_table
from experiments import variant_fields
from experiments.sweep import METRIC_KEYS
from lbjax import config_files
from lbjax.configs import _adaptive_batch
from lbjax.train.errors import exit_on_user_errors

RUNS = _adaptive_batch.RUNS
LABELS = {"baseline": "baseline B={batch}", "legw": "LEGW, fixed B={batch}",
          "grow_batch": "increase the batch (papers/002)", "adaptive": "adaptive batch, LEGW LR",
          "adascale": "adaptive batch, AdaScale LR"}


def argument_problem(runs: Sequence[str], seeds: Sequence[int]) -> str:
  """What is wrong with these arguments of `load_configs`, or "" if nothing."""
  if any(r not in RUNS for r in runs) or not runs:
    return f"runs {list(runs)} must be a non-empty subset of {', '.join(RUNS)}."
  return runner.seeds_problem(seeds)


def target_problem(targets: Sequence[float], metric: str) -> str:
  """What is wrong with fixed targets of the test `metric`, or "" if nothing: an accuracy is a fraction in
  (0, 1] as the runs record it (0.975, not 97.5), a perplexity at least 1."""
  if metric == "accuracy":
    bad, rule = [t for t in targets if not 0 < t <= 1], "an accuracy target is a fraction in (0, 1], e.g. 0.975"
  else:
    bad, rule = [t for t in targets if not t >= 1], "a perplexity target is at least 1, e.g. 150"
  if not bad:
    return ""
  return f"--targets {', '.join(f'{t:g}' for t in bad)}: the test metric is {metric}, and {rule}."


def load_configs(config: str, runs: Sequence[str], seeds: Sequence[int], variant: str = "") -> dict:
  """The config of every (run, seed), validated before any training as lbjax-train does (what depends on
  the devices is checked at each run's start).

  Raises:
    ValueError: what `argument_problem` finds wrong, invalid configs (every problem named), or a dataset
      without a known test metric.
  """
  if problem := argument_problem(runs, seeds):
    raise ValueError(problem)
  specs = run_specs(config, variant, {(run, seed): f"run={run},seed={seed}" for run in runs for seed in seeds})
  configs = runner.load_runs({key: runner.config_loader(spec) for key, spec in specs.items()},
                             "experiment", label=lambda key: f"run {key[0]} seed {key[1]}")
  datasets = {c.dataset for c in configs.values()}
  if len(datasets) != 1 or not datasets <= set(METRIC_KEYS):
    raise ValueError(f"{config} trains on {sorted(datasets)}; the experiment needs one dataset with a known "
                     f"test metric: {', '.join(sorted(METRIC_KEYS))}.")
  return configs


def split_of(configs: dict) -> str:
  """The split the runs of `configs` evaluate: the config's `data_options.eval_split`, which no run changes."""
  return runner.evaluated_split(next(iter(configs.values())))


def metric_of(configs: dict) -> str:
  """"accuracy" or "perplexity": the test metric of the configs' dataset."""
  return METRIC_KEYS[next(iter(configs.values())).dataset]


def labels(configs: dict) -> dict[str, str]:
  """The table's name of each run, with the batch of the fixed-batch runs."""
  return {run: LABELS[run].format(batch=config.batch_size) for (run, _), config in configs.items()}


def _logged(directory: pathlib.Path, kind: str) -> list[dict[str, Any]]:
  """The run's records of `kind`, by step; none for a run that diverged before writing any."""
  return run_records.read_records(directory, kind) if (directory / "metrics.jsonl").is_file() else []


def _final(directory: pathlib.Path, diverged_above: float) -> dict[str, Any] | None:
  """The run's final evaluation; None for a run that has not finished, or diverged: a non-finite step stopped it,
  or it ended at a loss above `diverged_above` (`runner.learned`, as every experiment counts it)."""
  final = next((r for r in reversed(_logged(directory, "eval")) if r.get("final")), None)
  return final if runner.learned(final, diverged_above) else None


def train_runs(configs: dict, workdir: str) -> None:
  """Trains every (run, seed) of `configs` (`load_configs`) neither finished nor diverged in `workdir`;
  stops at a preempted run (`RunPreempted`), which resumes from its checkpoint on the next call."""
  for (run, seed), run_config in configs.items():
    row = runner.run_once(run_config, runner.run_dir(workdir, run, seed), name=run, prefix="[adaptive_batch]")
    if row.seconds:
      print(f"[adaptive_batch] {run} seed {seed}: {row.status}, {row.seconds:.0f} s", flush=True)


def meets(value: float, target: float, metric: str) -> bool:
  """Whether a test `metric` value reached `target`: accuracy >= target, perplexity <= target."""
  return value >= target if metric == "accuracy" else value <= target


def _reached(evals: list[dict[str, Any]], batches: list[dict[str, Any]], target: float, metric: str
             ) -> tuple[int, float] | None:
  """(updates, wall seconds) at the first evaluation whose `metric` meets the target, or None."""
  for record in evals:
    if meets(record[metric], target, metric):
      later = [b for b in batches if b["step"] >= record["step"]] or batches[-1:]
      return record["step"], later[0]["wall_seconds"] if later else float("nan")
  return None


def _cell(values: Sequence[float], fmt: str) -> str:
  if not values:
    return "not reached"
  mean = fmt.format(statistics.fmean(values))
  return mean if len(values) == 1 else f"{mean} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def baseline_target(workdir: str, seeds: Sequence[int], metric: str, diverged_above: float) -> float | None:
  """The baseline's final test `metric`, its mean over the seeds that finished; None if none did."""
  finals = [_final(runner.run_dir(workdir, "baseline", s), diverged_above) for s in seeds]
  values = [final[metric] for final in finals if final is not None]
  return statistics.fmean(values) if values else None


def summarize(workdir: str, runs: Sequence[str], seeds: Sequence[int], target: float, metric: str,
              diverged_above: float) -> list[dict[str, Any]]:
  """Per run: final test `metric` (accuracy in %), updates, wall time, and updates/wall time to the
  `target`."""
  scale = 100.0 if metric == "accuracy" else 1.0
  rows = []
  for run in runs:
    row = {"run": run, "metric": [], "updates": [], "wall": [], "updates_to_target": [], "wall_to_target": [],
           "sizes": set(), "diverged": 0}
    for seed in seeds:
      directory = runner.run_dir(workdir, run, seed)
      batches, final = _logged(directory, "batch"), _final(directory, diverged_above)
      if final is None:  # diverged: its updates up to the last step it logged
        row["diverged"] += 1
        row["updates"].append(max((r["step"] for r in _logged(directory, "train") + batches), default=0))
      else:
        row["metric"].append(scale * final[metric])
        row["updates"].append(final["step"])
      row["wall"].append(batches[-1]["wall_seconds"] if batches else float("nan"))
      row["sizes"] |= {r["batch_size"] for r in batches + _logged(directory, "train")}
      reached = _reached(_logged(directory, "eval"), batches, target, metric)
      if reached:
        row["updates_to_target"].append(reached[0])
        row["wall_to_target"].append(reached[1])
    rows.append(row)
  return rows


def write_outputs(workdir: str, out: str, runs: Sequence[str], seeds: Sequence[int], title: str, command: str,
                  metric: str, run_labels: dict[str, str], diverged_above: float,
                  extra_targets: Sequence[float] = (), split: str = "test") -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from the finished runs, which evaluated `metric` on `split`
  (`split_of`); `extra_targets` are `metric` values as the runs record them (accuracy as a fraction); a run that
  ended at a loss above `diverged_above` (`runner.diverged_above`) diverged."""
  out_path = pathlib.Path(out)
  out_path.parent.mkdir(parents=True, exist_ok=True)
  with open(out_path.with_suffix(".csv"), "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("run", "seed", "kind", "step", "epoch", sweep_table.metric_column(metric, split), "batch_size",
                     "noise_scale", "statistical_efficiency", "examples_per_second", "goodput", "learning_rate",
                     "wall_seconds"))
    for run in runs:
      for seed in seeds:
        directory = runner.run_dir(workdir, run, seed)
        for r in _logged(directory, "eval"):
          writer.writerow((run, seed, "eval", r["step"], f"{r['epoch']:.4f}", f"{r[metric]:.4f}",
                           "", "", "", "", "", "", ""))
        for r in _logged(directory, "batch"):
          writer.writerow((run, seed, "batch", r["step"], f"{r['epoch']:.4f}", "", r["batch_size"], r["noise_scale"],
                           r["statistical_efficiency"], r["examples_per_second"], r["goodput"],
                           r["learning_rate"], f"{r['wall_seconds']:.1f}"))
  baseline = baseline_target(workdir, seeds, metric, diverged_above) if "baseline" in runs else None
  targets = [(f"the baseline's final {metric}", baseline)] if baseline is not None else []
  targets += [(f"a fixed {metric}", t) for t in extra_targets]
  reached = "at least" if metric == "accuracy" else "at most"
  lines = [f"# {title}", "", f"Command: `{command}`", "",
           f"Seeds: {', '.join(map(str, seeds))}; mean over seeds, [min-max] when several. 'wall s': the run's "
           "wall-clock time to its last `batch` record (training, periodic evaluations and compilation; not "
           "the final evaluation), on a shared, loaded 2-core CPU. 'to target': the updates and wall time at "
           f"the first periodic evaluation whose {split} {metric} was {reached} the target.", ""]
  for name, target in targets:
    lines += [f"## Target: {name} ({sweep_table.format_value(target, metric)})", "",
              f"| run | batch sizes used | final {split} {metric} | optimizer updates | wall s | updates to target "
              "| wall s to target |", "|---|---|---:|---:|---:|---:|---:|"]
    lines += _table_rows(summarize(workdir, runs, seeds, target, metric, diverged_above), metric, run_labels) + [""]
  out_path.with_suffix(".md").write_text("\n".join(lines))
  _plot(workdir, runs, seeds, title, metric, split, run_labels, out_path.with_suffix(".png"))


def _table_rows(rows: list[dict[str, Any]], metric: str, run_labels: dict[str, str]) -> list[str]:
  unit = "%" if metric == "accuracy" else ""
  lines = []
  for row in rows:
    sizes = sorted(row["sizes"])
    shown = f"{sizes[0]}-{sizes[-1]} ({len(sizes)} sizes)" if len(sizes) > 1 else (str(sizes[0]) if sizes else "")
    reached, seeds = len(row["updates_to_target"]), len(row["updates"])
    partly = f" ({reached} of {seeds} seeds)" if 0 < reached < seeds else ""
    final = "diverged" if not row["metric"] else _cell(row["metric"], "{:.2f}") + unit + (
        f" ({row['diverged']} of {seeds} seeds diverged)" if row["diverged"] else "")
    lines.append(f"| {run_labels[row['run']]} | {shown} | {final} | "
                 f"{_cell(row['updates'], '{:.0f}')} | {_cell(row['wall'], '{:.0f}')} | "
                 f"{_cell(row['updates_to_target'], '{:.0f}')}{partly} | "
                 f"{_cell(row['wall_to_target'], '{:.0f}')}{partly} |")
  return lines


def _plot(workdir: str, runs: Sequence[str], seeds: Sequence[int], title: str, metric: str, split: str,
          run_labels: dict[str, str], path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  scale = 100.0 if metric == "accuracy" else 1.0
  figure, (quality, batch, noise) = plt.subplots(1, 3, figsize=(15, 4))
  for index, run in enumerate(runs):
    color = f"C{index}"
    for seed in seeds:
      directory = runner.run_dir(workdir, run, seed)
      evals, records = _logged(directory, "eval"), _logged(directory, "batch")
      label = run_labels[run] if seed == seeds[0] else None
      quality.plot([r["step"] for r in evals], [scale * r[metric] for r in evals], marker=".", color=color,
                   label=label)
      epochs = [r["epoch"] for r in records]
      batch.plot(epochs, [r["batch_size"] for r in records], color=color, label=label)
      noise.plot(epochs, [float(r["noise_scale"]) for r in records], color=color, label=label)
  quality.set(xlabel="optimizer updates",
              ylabel=f"{split} accuracy (%)" if metric == "accuracy" else f"{split} perplexity",
              xscale="log", yscale="linear" if metric == "accuracy" else "log")
  batch.set(xlabel="epochs", ylabel="batch size", yscale="log")
  noise.set(xlabel="epochs", ylabel="noise scale B_noise (EMA)", yscale="log")
  for axes in (quality, batch, noise):
    axes.grid(alpha=0.3)
  quality.legend(fontsize=8)
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(prog="python -m experiments.adaptive_batch", description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="adaptive_batch_mnist")
  parser.add_argument("--out", required=True, help="output prefix, e.g. docs/results/adaptive_batch_mnist")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--runs", default=",".join(RUNS), help="subset of " + ",".join(RUNS))
  parser.add_argument("--seeds", type=runner.ints, default=(0,), help="comma-separated seeds, e.g. 0,1,2")
  parser.add_argument("--variant", default="", help="extra variant keys, e.g. epochs=2")
  parser.add_argument("--targets", type=runner.floats, default=(),
                      help="more test-metric targets besides the baseline's: accuracy as a fraction (e.g. 0.975), "
                           "perplexity as it is (e.g. 150); met at >= for accuracy, <= for perplexity")
  parser.add_argument("--title", default="", help="default: the first line of the config's docstring")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  spec = config_spec(args.config, args.variant)
  if refusal := fields_the_experiment_sets(variant_fields(spec), {"run": "--runs", "seed": "--seeds"},
                                           f"the variant of {spec!r}"):
    parser.error(refusal)
  runs, seeds = tuple(r.strip() for r in args.runs.split(",") if r.strip()), args.seeds
  try:
    configs = load_configs(args.config, runs, seeds, args.variant)
  except ValueError as e:  # bad --runs/--seeds, a config that does not validate, or a dataset without a test metric
    parser.error(str(e))
  if problem := target_problem(args.targets, metric_of(configs)):
    parser.error(problem)
  if args.dry_run:
    runner.print_dry_run("[adaptive_batch]", ((f"{run} seed={seed}", config, runner.run_dir(args.workdir, run, seed))
                                              for (run, seed), config in configs.items()))
    return
  train_runs(configs, args.workdir)
  command = "python -m experiments.adaptive_batch " + shlex.join(argv if argv is not None else sys.argv[1:])
  title = (args.title or config_files.describe_module(config_files.config_module(args.config.partition(":")[0]))
           or "Adaptive batch vs fixed and scheduled batches")
  write_outputs(args.workdir, args.out, runs, seeds, title.rstrip("."), command, metric_of(configs),
                labels(configs), runner.diverged_above(next(iter(configs.values()))), args.targets, split_of(configs))


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.adaptive_batch"):
    main(sys.argv[1:])
