"""A batch-size sweep: one baseline config, scaling rules, batch sizes -> CSV, markdown table, plot.

  python -m experiments.sweep --config mnist_lstm --rules none,linear,sqrt,legw \
      --batch_sizes 128,512,2048,8192 --seeds 0,1,2 --out reproduced/mnist_lstm_legw \
      --reference docs/results/mnist_lstm_headline.csv --workdir runs/sweeps/mnist

Each point (rule, batch size) is the config (`--config`: a packaged config such as `mnist_lstm`, or a
config file; `--variant` adds variant keys) with `--config.batch_size=B --config.scaling.rule=R`, i.e.
`lbjax-train --config mnist_lstm:batch=B,rule=R`, trained with `lbjax.train.train_and_evaluate` in
`<workdir>/<rule>_b<B>`. After each point the sweep rewrites `<out>.csv` (columns
`rule,batch_size,test_<metric>,...`), `<out>.md` and `<out>.png` (final test metric vs batch size, log2
x-axis, one line per rule: Figure 1 of papers/001). With `--seeds`, every point runs once per seed
(`--config.seed=S`, in `<workdir>/<rule>_b<B>_s<S>`) and the table and plot show mean and spread.

The committed results live in `docs/results`; a reproduction writes to a new `--out` (e.g.
`reproduced/...`). Before training the sweep prints what it will run and, given `--reference` (a
committed CSV), how long each point took there; at the end it prints the comparison with it
(`python -m experiments.compare` gives the same table for any two CSVs).

Resuming: points already in `<out>.csv` are skipped; an interrupted point resumes from the checkpoint in its
workdir, and a finished one there is read back, not trained again (to rerun a point, delete its row and its
directory; a finished run of another recipe is refused, `runner.recorded_recipe_problem`). Points whose recipe
is identical to an earlier point's (same config apart from the rule name, same learning rate at every epoch;
e.g. none/linear/sqrt at the baseline batch size) are run once and recorded for each rule with `same_as`. A
run stopped by a non-finite loss is recorded as `diverged` with a NaN metric.
"""

import argparse
import dataclasses
import functools
import json
import pathlib
import sys
from typing import Sequence

import ml_collections
import numpy as np

from experiments import compare
from experiments import config_spec
from experiments import fields_the_experiment_sets
from experiments import runner
from experiments import sweep_table
from experiments import variant_fields
from experiments.runner import RunRow
from lbjax import config_files
from lbjax import train
from lbjax.train.errors import exit_on_user_errors

RULES = ("none", "linear", "sqrt", "legw", "goyal")
_FINGERPRINT_SAMPLES = 4001
# The test metric of the packaged datasets (lbjax.train.datasets); a user's dataset is taken at --metric.
METRIC_KEYS = {"mnist": "accuracy", "synthetic_mnist": "accuracy", "imagenet": "accuracy",
               "cifar10": "accuracy", "synthetic_images": "accuracy", "ptb": "perplexity",
               "synthetic_ptb": "perplexity"}


@dataclasses.dataclass(frozen=True)
class SweepSpec:
  """What to sweep.

  Attributes:
    config: the config: a packaged name (`mnist_lstm`) or a config file, optionally with `:variant`.
    rules: scaling rules, each one of `RULES`.
    batch_sizes: global batch sizes, positive ints.
    out: path prefix of the outputs (`<out>.csv`, `<out>.md`, `<out>.png`).
    workdir: directory holding one run directory per point.
    variant: extra variant keys for every point, e.g. `"epochs=5"`; must not set the batch size or rule.
    metric: "accuracy" or "perplexity" (the eval metric of the task).
    title: title of the table and the plot.
    max_device_batch: if > 0, `config.max_device_batch` of every point: larger batches are computed as
      accumulated micro-batches of this size (the same update; much faster on CPU, where a whole 8K
      batch of the MNIST LSTM runs ~6x slower per example than micro-batches of 512).
    seeds: if not empty, each point runs once per seed (`config.seed`); empty: once, with the config's seed.
    reference: if not empty, a CSV written by an earlier sweep (e.g. the committed `docs/results/...csv`):
      its times give the plan's estimate and the new results are compared with it at the end.
  """
  config: str
  rules: tuple[str, ...]
  batch_sizes: tuple[int, ...]
  out: str
  workdir: str
  variant: str = ""
  metric: str = "accuracy"
  title: str = "Batch-size sweep"
  max_device_batch: int = 0
  seeds: tuple[int, ...] = ()
  reference: str = ""


def spec_problem(spec: SweepSpec) -> str:
  """What is wrong with `spec` (every problem, one per line), or "" if nothing; loads the config, trains nothing."""
  errors = []
  config = config_spec(spec.config, spec.variant)
  try:
    fields = variant_fields(config)
  except train.ConfigError as e:  # an unknown config or variant key
    errors.append(str(e))
    fields = set()
  set_by = {"batch_size": "--batch_sizes", "batch_sizes": "--batch_sizes", "scaling.rule": "--rules",
            **({"seed": "--seeds"} if spec.seeds else {})}
  if refusal := fields_the_experiment_sets(fields, set_by, f"the variant of {config!r}"):
    errors.append(refusal)
  if not spec.rules:
    errors.append("no scaling rules given; pass e.g. --rules none,linear,sqrt,legw.")
  unknown = [r for r in spec.rules if r not in RULES]
  if unknown:
    errors.append(f"unknown scaling rule(s) {unknown}; choose from {', '.join(RULES)}.")
  if not spec.batch_sizes:
    errors.append("no batch sizes given; pass e.g. --batch_sizes 128,512,2048.")
  bad = [b for b in spec.batch_sizes if not isinstance(b, int) or b <= 0]
  if bad:
    errors.append(f"batch sizes must be positive integers, got {bad}.")
  if spec.metric not in ("accuracy", "perplexity"):
    errors.append(f"metric must be 'accuracy' or 'perplexity', got {spec.metric!r}.")
  if not isinstance(spec.max_device_batch, int) or spec.max_device_batch < 0:
    errors.append(f"max_device_batch must be an integer >= 0 (0 = no accumulation), got "
                  f"{spec.max_device_batch!r}.")
  if spec.seeds and (problem := runner.seeds_problem(spec.seeds)):  # none: the config's seed
    errors.append(problem)
  if spec.reference and not pathlib.Path(spec.reference).is_file():
    errors.append(f"reference {spec.reference} not found; pass a CSV written by a sweep, e.g. "
                  "docs/results/mnist_lstm_headline.csv.")
  csvs = {pathlib.Path(spec.out).with_suffix(".csv"): "move it away or choose another --out"}  # rows recorded
  if spec.reference:
    csvs[pathlib.Path(spec.reference)] = f"pass a --reference of a sweep that measured {spec.metric}"
  recorded = {}
  for path, advice in csvs.items() if spec.metric in ("accuracy", "perplexity") else ():
    try:  # a sweep's CSV, of this metric
      recorded[path] = sweep_table.read_csv(path, spec.metric, advice)
    except ValueError as e:
      errors.append(str(e))
  if not errors:  # the config loads: its dataset's test metric must be the one the sweep measures
    try:
      loaded = config_files.load(config).config
      split = runner.evaluated_split(loaded)
    except train.ConfigError as e:
      errors.append(str(e))
    else:
      if METRIC_KEYS.get(loaded.dataset, spec.metric) != spec.metric:
        errors.append(f"{spec.config} trains on {loaded.dataset!r}, whose test metric is "
                      f"{METRIC_KEYS[loaded.dataset]!r}, but the sweep measures {spec.metric!r}; pass --metric "
                      f"{METRIC_KEYS[loaded.dataset]}.")
      for path, rows in recorded.items():  # one split per table, and compared with the same split
        if rows and (other := sweep_table.rows_split(rows)) != split:
          what = "the reference" if str(path) == str(spec.reference) else "the recorded rows of --out"
          errors.append(f"{path} ({what}) holds {other} {spec.metric}, but this sweep evaluates the {split} split; "
                        f"pass a {'--reference' if what == 'the reference' else '--out'} of the {split} split.")
  return "Invalid sweep:\n  - " + "\n  - ".join(errors) if errors else ""


def check_spec(spec: SweepSpec) -> None:
  """Raises ValueError naming every problem of `spec` (`spec_problem`) before any training."""
  if problem := spec_problem(spec):
    raise ValueError(problem)


def point_config(spec: SweepSpec, rule: str, batch_size: int, seed: int | None = None
                 ) -> ml_collections.ConfigDict:
  """The config of one point: the spec's config with `batch_size=<B>`, `scaling.rule=<R>` and, if
  given, `seed=<S>`."""
  overrides = [f"--config.batch_size={batch_size}", f"--config.scaling.rule={rule}"]
  if seed is not None:
    overrides.append(f"--config.seed={seed}")
  config = config_files.load(config_spec(spec.config, spec.variant), overrides).config
  if spec.max_device_batch:
    config.max_device_batch = spec.max_device_batch
  return config


def _point_label(point: tuple[str, int, int | None]) -> str:
  """The point's name in a message, "rule=<R> batch=<B> seed=<S>"; without the seed where the spec names none
  (each point trains with its config's own)."""
  rule, batch_size, seed = point
  return f"rule={rule} batch={batch_size}" + ("" if seed is None else f" seed={seed}")


def recipe_fingerprint(config: ml_collections.ConfigDict) -> str:
  """What the run computes, apart from how the recipe was named: config minus `scaling`/`lr`, plus
  the learning rate at `_FINGERPRINT_SAMPLES` epochs over training (warm-up included)."""
  fields = json.loads(config.to_json())
  for name in ("scaling", "lr", *train.config.OPERATIONAL_FIELDS):
    fields.pop(name, None)
  schedule = train.learning_rate_schedule(config)
  epochs = np.linspace(0.0, config.num_epochs, _FINGERPRINT_SAMPLES)
  fields["learning_rate"] = [float(f"{float(schedule(float(e))):.9g}") for e in epochs]
  return json.dumps(fields, sort_keys=True)


def write_outputs(rows: list[RunRow], spec: SweepSpec) -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from `rows`."""
  out = pathlib.Path(spec.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  sweep_table.write_csv(rows, out.with_suffix(".csv"), spec.metric)
  out.with_suffix(".md").write_text(sweep_table.markdown_table(rows, spec.metric, spec.title))
  sweep_table.plot(rows, spec.metric, spec.title, out.with_suffix(".png"))


def _twins(order: list[tuple[str, int, int]], done: dict, fingerprints: dict) -> dict:
  """The points to run that will copy the row of a point with the same batch size, seed and recipe
  (`same_as`) instead of training: point -> that point's rule (a recorded point, or the first in `order`)."""
  trained = {(b, seed, fingerprints[(rule, b, seed)]): rule for rule, b, seed in order
             if (rule, b, seed) in done and not done[(rule, b, seed)].same_as}
  twins = {}
  for rule, b, seed in (point for point in order if point not in done):
    key = (b, seed, fingerprints[(rule, b, seed)])
    if key in trained:
      twins[(rule, b, seed)] = trained[key]
    else:
      trained[key] = rule
  return twins


def _plan(spec: SweepSpec, points: list[tuple[str, int, int]], done: dict, reference: list,
          configs: dict | None = None, twins: dict | None = None) -> str:
  """What the sweep will run, what it skips, and the time each point took in the reference run; with the
  points' `configs` (a dry run), what each would train (`runner.planned_run`) or whose row it copies (`twins`)."""
  seconds = {}
  for r in reference:
    seconds.setdefault((r.name, r.batch_size), []).append(r.seconds)
  to_run = [p for p in points if p not in done]
  lines = [f"[sweep] {len(points)} runs ({len(spec.rules)} rules x {len(spec.batch_sizes)} batch sizes x "
           f"{max(1, len(spec.seeds))} seeds): {len(points) - len(to_run)} recorded in "
           f"{pathlib.Path(spec.out).with_suffix('.csv')} (skipped), {len(to_run)} to run."]
  known = [sum(seconds[p[:2]]) / len(seconds[p[:2]]) for p in to_run if p[:2] in seconds]
  if to_run and reference:
    lines.append(f"[sweep] in {spec.reference}, these points took {sum(known) / 60:.0f} min in all"
                 + (f" ({len(to_run) - len(known)} points have no time there)" if len(known) < len(to_run) else "")
                 + "; identical recipes (same_as) run once.")
  for rule, b, seed in to_run:
    took = f", {sum(seconds[(rule, b)]) / len(seconds[(rule, b)]) / 60:.1f} min in the reference" \
        if (rule, b) in seconds else ""
    planned = ""
    if configs and (rule, b, seed) in (twins or {}):
      planned = f": the recipe of rule={twins[(rule, b, seed)]} at this batch: its row is copied (same_as), not trained"
    elif configs:
      planned = f": {runner.planned_run(configs[(rule, b, seed)], _point_dir(spec, rule, b, seed))}"
    lines.append(f"[sweep]   rule={rule} batch={b} seed={seed}{took}{planned}")
  return "\n".join(lines)


def _point_dir(spec: SweepSpec, rule: str, batch_size: int, seed: int) -> pathlib.Path:
  """Where a point trains: `<workdir>/<rule>_b<batch>` (`_s<seed>` added when the sweep has `seeds`)."""
  return pathlib.Path(spec.workdir) / (f"{rule}_b{batch_size}" + (f"_s{seed}" if spec.seeds else ""))


def run_sweep(spec: SweepSpec) -> list[RunRow]:
  """Runs every point of `spec` not yet recorded in `<out>.csv`, writing the outputs after each.

  Returns:
    All rows of `<out>.csv` (earlier ones included), after the sweep.

  Raises:
    ValueError: an invalid spec (`spec_problem`: a metric that does not match the config's dataset too) or an
      invalid point config, all checked before any training.
  """
  check_spec(spec)
  return _run_checked(spec)


def _run_checked(spec: SweepSpec, dry_run: bool = False) -> list[RunRow]:
  """`run_sweep` of a spec already checked (`spec_problem`); `dry_run`: print what each point to run would
  train (`runner.planned_run`), train nothing and return the recorded rows."""
  csv_path = pathlib.Path(spec.out).with_suffix(".csv")
  rows = sweep_table.read_csv(csv_path, spec.metric)
  reference = sweep_table.read_csv(spec.reference, spec.metric) if spec.reference else []
  done = {(r.name, r.batch_size, r.seed): r for r in rows}
  seeds = spec.seeds or (None,)
  configs = runner.load_runs({(rule, b, seed): functools.partial(point_config, spec, rule, b, seed)
                              for rule in spec.rules for b in spec.batch_sizes for seed in seeds}, "sweep",
                             label=_point_label)
  configs = {(rule, b, config.seed): config for (rule, b, _), config in configs.items()}
  fingerprints = {point: recipe_fingerprint(config) for point, config in configs.items()}
  # Seed-major: a complete one-seed table first, then the spread.
  order = sorted(configs, key=lambda p: (p[2], spec.batch_sizes.index(p[1]), spec.rules.index(p[0])))
  twins = _twins(order, done, fingerprints)
  if dry_run:
    print(_plan(spec, order, done, reference, configs, twins), flush=True)
    return list(done.values())
  print(_plan(spec, order, done, reference), flush=True)
  for rule, b, seed in order:
    if (rule, b, seed) in done:
      continue
    if (rule, b, seed) in twins:  # trained earlier in `order` or recorded: in `done` by now
      twin = done[(twins[(rule, b, seed)], b, seed)]
      row = dataclasses.replace(twin, name=rule, same_as=twin.name)
    else:
      row = runner.run_once(configs[(rule, b, seed)], _point_dir(spec, rule, b, seed), name=rule,
                            metric=spec.metric, prefix=f"[sweep] batch={b}")
      print(f"[sweep] rule={rule} batch={b} seed={seed}: {spec.metric}={row.value:.4f} ({row.status}, "
            f"{row.seconds:.0f} s)", flush=True)
    done[(rule, b, seed)] = row
    write_outputs(list(done.values()), spec)
  if reference:
    print(compare.comparison_table(list(done.values()), reference, spec.metric), flush=True)
  return list(done.values())


def main(argv: Sequence[str] | None = None) -> list[RunRow]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.sweep", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True,
                      help="a packaged config (e.g. mnist_lstm) or a config file, optionally with :variant")
  parser.add_argument("--rules", required=True, help="comma-separated scaling rules: " + ",".join(RULES))
  parser.add_argument("--batch_sizes", required=True, type=runner.ints, help="comma-separated batch sizes")
  parser.add_argument("--out", required=True, help="output prefix, e.g. reproduced/mnist_lstm_legw")
  parser.add_argument("--workdir", required=True, help="directory for the runs, e.g. runs/sweeps/mnist")
  parser.add_argument("--variant", default="", help="extra variant keys for every point, e.g. epochs=5")
  parser.add_argument("--metric", default="accuracy", choices=("accuracy", "perplexity"))
  parser.add_argument("--title", default="Batch-size sweep")
  parser.add_argument("--max_device_batch", type=int, default=0,
                      help="accumulate micro-batches of this size (0 = off); the same update, less memory")
  parser.add_argument("--seeds", type=runner.ints, default=(),
                      help="comma-separated seeds, one run per seed and point (default: the config's seed)")
  parser.add_argument("--reference", default="",
                      help="a committed CSV (e.g. docs/results/mnist_lstm_headline.csv): its times for the plan, "
                           "and a comparison at the end")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  spec = SweepSpec(config=args.config, rules=tuple(r.strip() for r in args.rules.split(",") if r.strip()),
                   batch_sizes=args.batch_sizes, out=args.out, workdir=args.workdir, variant=args.variant,
                   metric=args.metric, title=args.title,
                   max_device_batch=args.max_device_batch, seeds=args.seeds, reference=args.reference)
  if problem := spec_problem(spec):
    parser.error(problem)
  return _run_checked(spec, dry_run=args.dry_run)


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.sweep"):
    main(sys.argv[1:])
