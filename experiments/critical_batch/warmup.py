"""`warmup`: a batch-size warm-up from a measured CBS curve against the baseline, LEGW and the noise-scale
policy, each with seeds, and its table of updates and examples to a target quality."""

import dataclasses
import functools
import json
import pathlib
from typing import Sequence

import ml_collections

from experiments import adaptive_batch
from experiments import config_spec
from experiments import run_records
from experiments import runner
from experiments.critical_batch.grid import at_batch, load_config, train_examples
from experiments.sweep import METRIC_KEYS
from experiments.sweep_table import mean_sd
from lbjax import schedules
from lbjax import train
from lbjax.train import config as config_lib
from lbjax.train import optimizer as optimizer_lib

WARMUP_RUNS = ("baseline", "legw", "adaptive", "cbs_warmup")
TEST_FILE = "test_metrics.json"  # in a warm-up run's directory: its final state on the test split


def rule_at_batch_in_force(value: float, *, batch_sizes: Sequence[int], boundaries: Sequence[float],
                           recipe: str) -> schedules.Schedule:
  """The learning rate of the scaling rule at the batch a batch-size schedule has in force (an `lr.decay`).

  With batch B_i on [b_{i-1}, b_i) (b_0 = 0), the LR at epoch e is that of a fixed-batch run at B_i
  at epoch e: the baseline recipe scaled by `config.scaling.rule` to B_i (LEGW: LR x sqrt(B_i/B0),
  warm-up x B_i/B0; papers/001 §3), with its warm-up and decay on the run's clock,

    v(e) = lr_{B_i}(e)   for e in [b_{i-1}, b_i),

  which is what `batch.policy="adaptive"` sets at a batch (`BatchPolicy.learning_rate`) and what each
  branch of `measure` trained at. `batch.policy="schedule"` holds the first batch's LR instead
  (papers/002); naming this function as `config.lr.decay` makes the schedule follow the rule.

  Args:
    value: the first batch's peak LR, which the trainer passes; each batch's comes from `recipe`.
    batch_sizes: B_0, B_1, ... as in `config.batch_sizes`.
    boundaries: b_1, b_2, ... as in `config.batch_size_boundaries` (epochs).
    recipe: JSON of the run's `lr` and `scaling` sections and `num_epochs` as they were before this
      function replaced the decay (`recipe_json`).
  """
  del value
  if len(batch_sizes) != len(boundaries) + 1:
    raise ValueError(f"rule_at_batch_in_force needs one more batch size than boundaries, got {list(batch_sizes)} "
                     f"and {list(boundaries)}.")
  fields = json.loads(recipe)
  config = train.default_config()
  config.lr = ml_collections.ConfigDict(fields["lr"])
  config.scaling = ml_collections.ConfigDict(fields["scaling"])
  config.num_epochs = fields["num_epochs"]
  pieces = [optimizer_lib.learning_rate_schedule(at_batch(config, size)) for size in batch_sizes]
  return schedules.join_schedules(pieces, boundaries) if boundaries else pieces[0]


def recipe_json(config: ml_collections.ConfigDict) -> str:
  """The `recipe` argument of `rule_at_batch_in_force`: the LR recipe, its scaling rule and length."""
  return json.dumps({"lr": config.lr.to_dict(), "scaling": config.scaling.to_dict(), "num_epochs": config.num_epochs})


def warmup_schedule(curve: Sequence[tuple[float, int]], base_batch_size: int, max_batch_size: int,
                    num_epochs: float) -> tuple[tuple[int, ...], tuple[float, ...]]:
  """(batch sizes, boundaries) of the batch warm-up from a measured CBS curve: from each checkpoint
  epoch (before `num_epochs`) on, the CBS measured there, never shrinking, within [base, max]; a
  checkpoint that changes nothing adds no boundary."""
  sizes, boundaries = [base_batch_size], []
  for epoch, cbs in sorted(curve):
    size = min(max_batch_size, max(sizes[-1], cbs))
    if epoch >= num_epochs or size == sizes[-1]:
      continue
    if epoch == 0:
      sizes[0] = size
      continue
    sizes.append(size)
    boundaries.append(epoch)
  return tuple(sizes), tuple(boundaries)


def warmup_configs(config: str, overrides: Sequence[str], seeds: Sequence[int], sizes: Sequence[int],
                   boundaries: Sequence[float]) -> dict[tuple[str, int], ml_collections.ConfigDict]:
  """The config of every (run, seed) of the warm-up comparison (`WARMUP_RUNS`), validated.

  `config` is an adaptive-batch config (`lbjax.configs.adaptive_batch_mnist`: variant keys run,
  large_batch, max_batch, seed).

  Raises:
    train.ConfigError: every run whose config does not load or is invalid, named (`runner.load_runs`).
  """
  final = sizes[-1]
  variants = {"baseline": "run=baseline", "legw": f"run=legw,large_batch={final}",
              "adaptive": f"run=adaptive,max_batch={final}"}

  def load(run: str, seed: int) -> ml_collections.ConfigDict:
    if run != "cbs_warmup":
      return load_config(config_spec(config, variants[run], f"seed={seed}"), overrides)
    run_config = load_config(config_spec(config, f"run=legw,large_batch={sizes[0]}", f"seed={seed}"), overrides)
    recipe = recipe_json(run_config)
    run_config.batch.policy = "schedule"
    run_config.batch_size, run_config.batch_sizes = sizes[0], tuple(sizes)
    run_config.batch_size_boundaries = tuple(boundaries)
    # The decay's own arguments go with it into `recipe`; the section keeps the recipe's peak and warm-up.
    run_config.lr = ml_collections.ConfigDict(
        {k: run_config.lr[k] for k in config_lib.trainer_fields("lr")}
        | {"decay": "experiments.critical_batch.warmup:rule_at_batch_in_force", "batch_sizes": tuple(sizes),
           "boundaries": tuple(boundaries), "recipe": recipe})
    return run_config

  # Every run of a seed before the next seed: a cut-short experiment has whole seeds.
  return runner.load_runs({(run, seed): functools.partial(load, run, seed) for seed in seeds for run in WARMUP_RUNS},
                          "warm-up comparison", label=lambda key: f"run {key[0]} seed {key[1]}")


def final_test_metrics(config: ml_collections.ConfigDict, run_dir: pathlib.Path) -> dict[str, float]:
  """The run's final state on the test split: its final evaluation when it evaluated on the test split,
  else evaluated once (`<run_dir>/test_metrics.json`)."""
  if config.data_options.get("eval_split", "test") == "test":
    return run_records.final_eval(run_dir)
  path = run_dir / TEST_FILE
  if path.is_file():
    return json.loads(path.read_text())
  test_config = ml_collections.ConfigDict(config.to_dict())
  test_config.data_options.eval_split = "test"
  metrics = runner.evaluate_final_state(test_config, run_dir)
  path.write_text(json.dumps(metrics) + "\n")
  return metrics


@dataclasses.dataclass
class WarmupSummary:
  """One run of the comparison over its seeds."""
  run: str
  final: list[float] = dataclasses.field(default_factory=list)  # the evaluation split's metric, finished seeds
  test: list[float] = dataclasses.field(default_factory=list)
  updates: list[int] = dataclasses.field(default_factory=list)
  updates_to_target: list[int] = dataclasses.field(default_factory=list)
  examples_to_target: list[float] = dataclasses.field(default_factory=list)
  seeds: int = 0


def summarize_warmup(configs: dict, workdir: pathlib.Path, seeds: Sequence[int], target: float, metric: str,
                     num_examples: int) -> list[WarmupSummary]:
  """Per run: final metric, test metric, updates, and updates/examples to the first evaluation that meets
  `target` (mean over seeds of the baseline)."""
  summaries = []
  for run in WARMUP_RUNS:
    summary = WarmupSummary(run)
    for seed in seeds:
      directory = runner.run_dir(workdir, run, seed)
      if not (directory / "metrics.jsonl").is_file():
        continue
      summary.seeds += 1
      evals = run_records.read_records(directory, "eval")
      final = run_records.final_eval(directory)
      if final is not None:
        summary.final.append(final[metric])
        summary.updates.append(final["step"])
        summary.test.append(final_test_metrics(configs[(run, seed)], directory)[metric])
      reached = next((r for r in evals if adaptive_batch.meets(r[metric], target, metric)), None)
      if reached is not None:
        summary.updates_to_target.append(reached["step"])
        summary.examples_to_target.append(reached["epoch"] * num_examples)
    summaries.append(summary)
  return summaries


def write_warmup(configs: dict, workdir: pathlib.Path, seeds: Sequence[int], out: pathlib.Path, command: str,
                 title: str, sizes: Sequence[int], boundaries: Sequence[float], source: str,
                 extra_targets: Sequence[float] = ()) -> None:
  """Writes `<out>.csv` (every evaluation), `<out>.md` and `<out>.png` from the finished runs; the table
  once for the baseline's final metric and once for each of `extra_targets` (as the runs record the
  metric: accuracy as a fraction)."""
  first = next(iter(configs.values()))
  metric = METRIC_KEYS[first.dataset]
  split = first.data_options.get("eval_split", "test")
  num_examples = train_examples(first)
  baseline = adaptive_batch.baseline_target(str(workdir), seeds, metric, runner.diverged_above(first))
  scale = 100.0 if metric == "accuracy" else 1.0
  unit = "%" if metric == "accuracy" else ""
  schedule = " → ".join(f"{b} from epoch {e:g}" for b, e in zip(sizes, (0.0, *boundaries)))
  lines = [f"# {title}", "", f"Command: `{command}`", "",
           f"CBS warm-up batch schedule ({source}): {schedule}. Seeds {', '.join(map(str, seeds))}; mean ± sample "
           f"sd over seeds. 'to target': the first periodic evaluation on the {split} split at least as good as the "
           f"target ('(k of n)': reached by k of the n seeds). Test {metric}: each run's final state on the test "
           "split, evaluated once after training.", ""]
  targets = ([(f"the baseline's final {split} {metric} (mean over its seeds)", baseline)] if baseline is not None
             else []) + [(f"a fixed {split} {metric}", t) for t in extra_targets]
  for name, target in targets:
    lines += [f"## Target: {name}, {scale * target:.2f}{unit}", "",
              f"| run | seeds | final {split} {metric} | final test {metric} | updates | updates to target | "
              "examples to target |", "|---|---:|---:|---:|---:|---:|---:|"]
    for s in summarize_warmup(configs, workdir, seeds, target, metric, num_examples):
      reached = f" ({len(s.updates_to_target)} of {s.seeds})" if len(s.updates_to_target) < s.seeds else ""
      lines.append(f"| {s.run} | {len(s.final)}/{len(seeds)} | {mean_sd(s.final, '{:.2f}', scale, unit)} | "
                   f"{mean_sd(s.test, '{:.2f}', scale, unit)} | {mean_sd(s.updates, '{:.0f}')} | "
                   f"{mean_sd(s.updates_to_target, '{:.0f}')}{reached} | {mean_sd(s.examples_to_target, '{:.0f}')}"
                   f"{reached} |")
    lines.append("")
  out.with_suffix(".md").write_text("\n".join(lines) + "\n")
  rows = []
  for (run, seed) in configs:
    directory = runner.run_dir(workdir, run, seed)
    if (directory / "metrics.jsonl").is_file():
      rows += [[run, seed, r["step"], f"{r['epoch']:.4f}", f"{r[metric]:.4f}", bool(r.get("final"))]
               for r in run_records.read_records(directory, "eval")]
  run_records.write_csv_rows(out.with_suffix(".csv"), ("run", "seed", "step", "epoch", f"{split}_{metric}", "final"),
                             rows)
  _plot_warmup(configs, workdir, seeds, metric, split, out.with_suffix(".png"), title)


def _plot_warmup(configs: dict, workdir: pathlib.Path, seeds: Sequence[int], metric: str, split: str,
                 path: pathlib.Path, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  scale = 100.0 if metric == "accuracy" else 1.0
  figure, (quality, batch) = plt.subplots(1, 2, figsize=(11, 4))
  for index, run in enumerate(WARMUP_RUNS):
    for seed in seeds:
      directory = runner.run_dir(workdir, run, seed)
      if (run, seed) not in configs or not (directory / "metrics.jsonl").is_file():
        continue
      label = run if seed == seeds[0] else None
      evals = run_records.read_records(directory, "eval")
      quality.plot([r["step"] for r in evals], [scale * r[metric] for r in evals], marker=".", color=f"C{index}",
                   label=label, alpha=0.8)
      trained = run_records.read_records(directory, "train")
      batch.plot([r["epoch"] for r in trained], [r["batch_size"] for r in trained], color=f"C{index}", label=label)
  quality.set(xlabel="optimizer updates", ylabel=f"{split} {metric}" + (" (%)" if metric == "accuracy" else ""),
              xscale="log")
  quality.xaxis.set_minor_formatter(ticker.NullFormatter())  # the minor labels of a short log axis overlap
  batch.set(xlabel="epochs", ylabel="batch size", yscale="log")
  for axes in (quality, batch):
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
  figure.suptitle(title, fontsize=10)
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)
