"""The gradient noise scale B_simple over training, from an accumulating run -> CSV, markdown, plot.

  python -m experiments.noise_scale --config mnist_lstm --variant batch=1024,epochs=2 \
      --max_device_batch 128 --out reproduced/noise_scale --workdir runs/noise_scale

B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018) is the batch size above which a larger batch
stops paying for itself: below it the step is noise-dominated. When a step accumulates k micro-batches
(`config.max_device_batch` below the per-device batch), the trainer has gradients at two batch sizes
for free, B/k (each micro-batch) and B (their mean), and logs unbiased estimates of |G|^2 and
tr(Sigma) with every `train` record (averaged over the logging window, then divided:
`gradient_noise_scale`). The run lives in `<workdir>`; a finished run (final evaluation present) is not
trained again.

Outputs:
  <out>.csv  step,epoch,batch_size,learning_rate,loss,accuracy,grad_norm_sq,trace_sigma,gradient_noise_scale
  <out>.md   B_simple at the start, middle and end of training, and over the last quarter, vs the batch
  <out>.png  B_simple (log scale, with the run's batch size) and the training loss vs epochs
"""

import argparse
import csv
import dataclasses
import math
import pathlib
import sys
from typing import Any, Sequence

import ml_collections
import numpy as np

from experiments import config_spec
from experiments import run_records
from experiments import runner
from lbjax import config_files
from lbjax import train
from lbjax.train.errors import exit_on_user_errors

CSV_COLUMNS = ("step", "epoch", "batch_size", "learning_rate", "loss", "accuracy", "grad_norm_sq", "trace_sigma",
               "gradient_noise_scale")


@dataclasses.dataclass(frozen=True)
class NoiseScaleSpec:
  """What to measure.

  Attributes:
    config: a packaged config (`mnist_lstm`) or a config file, optionally with `:variant`.
    out: path prefix of the outputs (`<out>.csv`, `<out>.md`, `<out>.png`).
    workdir: the run's directory.
    max_device_batch: micro-batch size; must be below the (per-device) batch so that steps accumulate.
    variant: variant keys added to the config's, e.g. `"batch=1024,epochs=2"`.
    log_every: steps per logged point (each point's B_simple is a ratio of window averages).
    title: title of the table and the plot.
  """
  config: str
  out: str
  workdir: str
  max_device_batch: int
  variant: str = ""
  log_every: int = 5
  title: str = "Gradient noise scale B_simple during training"


def run_config(spec: NoiseScaleSpec) -> ml_collections.ConfigDict:
  """The config with its variant, accumulating over micro-batches of `max_device_batch`."""
  config = config_files.load(config_spec(spec.config, spec.variant)).config
  config.max_device_batch = spec.max_device_batch
  config.log_every = spec.log_every
  return config


def check_spec(spec: NoiseScaleSpec, config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming every problem of `spec` (its `config` built) before any training."""
  errors = []
  if not isinstance(spec.max_device_batch, int) or spec.max_device_batch < 1:
    errors.append(f"max_device_batch must be a positive integer, got {spec.max_device_batch!r}.")
  else:
    sizes = tuple(config.batch_sizes) or (config.batch_size,)
    too_small = [b for b in sizes if b <= spec.max_device_batch]
    if too_small:  # the per-device share is checked by the run: without accumulation it logs no estimate
      errors.append(f"batch size(s) {too_small} do not exceed max_device_batch={spec.max_device_batch}: those "
                    "steps would not accumulate and give no noise-scale estimate; choose a smaller "
                    "max_device_batch (a divisor of the per-device batch).")
  if not isinstance(spec.log_every, int) or spec.log_every < 1:
    errors.append(f"log_every must be an integer >= 1, got {spec.log_every!r}.")
  if errors:
    raise train.ConfigError("Invalid noise-scale experiment:\n  - " + "\n  - ".join(errors))


def noise_scale_records(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """The run's `train` records that carry a noise-scale estimate (as floats, `inf` kept), by step.

  Raises:
    ConfigError: if the run logged none (it did not accumulate micro-batches).
  """
  records = [r for r in run_records.read_records(workdir, "train") if "gradient_noise_scale" in r]
  for r in records:  # the metrics writer stores non-finite values (B_simple when |G|^2 <= 0) as strings
    for key in ("gradient_noise_scale", "noise_scale_grad_norm_sq", "noise_scale_trace_sigma"):
      r[key] = float(r[key])
  if not records:
    raise train.ConfigError(f"the run in {workdir} logged no gradient noise scale: it did not accumulate "
                            "micro-batches (set config.max_device_batch below the per-device batch).")
  return records


def write_csv(records: list[dict[str, Any]], path: str | pathlib.Path) -> None:
  """One line per logged step with the columns `CSV_COLUMNS`."""
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(CSV_COLUMNS)
    for r in records:
      writer.writerow((r["step"], f"{r['epoch']:.6g}", r["batch_size"], f"{r['learning_rate']:.6g}",
                       f"{r['loss']:.6g}", f"{r['accuracy']:.6g}", f"{r['noise_scale_grad_norm_sq']:.6g}",
                       f"{r['noise_scale_trace_sigma']:.6g}", f"{r['gradient_noise_scale']:.6g}"))


def quarter_summary(records: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
  """(label, mean loss, B_simple as a ratio of averages) over each quarter of the logged points."""
  parts = np.array_split(np.arange(len(records)), min(4, len(records)))
  rows = []
  for part in parts:
    chunk = [records[j] for j in part]
    g2 = float(np.mean([r["noise_scale_grad_norm_sq"] for r in chunk]))
    trace = float(np.mean([r["noise_scale_trace_sigma"] for r in chunk]))
    b_simple = trace / g2 if g2 > 0 else math.inf
    label = f"epochs {chunk[0]['epoch']:.3g}–{chunk[-1]['epoch']:.3g} (steps {chunk[0]['step']}–{chunk[-1]['step']})"
    rows.append((label, float(np.mean([r["loss"] for r in chunk])), b_simple))
  return rows


def markdown_table(records: list[dict[str, Any]], spec: NoiseScaleSpec) -> str:
  """B_simple (ratio of averages) per quarter of training, next to the training loss and batch size."""
  batch = records[-1]["batch_size"]
  lines = [f"# {spec.title}", "",
           f"Config `{config_spec(spec.config, spec.variant)}`, batch {batch} accumulated from micro-batches of "
           f"{spec.max_device_batch}; B_simple = tr(Σ)/|G|² from the micro-batch and full-batch gradient norms "
           "(McCandlish et al. 2018, App. A.1), averaged numerator and denominator per quarter of training.", "",
           "| part of training | mean train loss | B_simple | B_simple / batch |", "|---|---:|---:|---:|"]
  for label, loss, b_simple in quarter_summary(records):
    lines.append(f"| {label} | {loss:.4f} | {b_simple:.4g} | {b_simple / batch:.3g} |")
  return "\n".join(lines) + "\n"


def plot(records: list[dict[str, Any]], title: str, path: str | pathlib.Path) -> None:
  """B_simple (log y) with the run's batch size, and the training loss, vs epochs."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  epochs = [r["epoch"] for r in records]
  figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
  positive = [(e, r["gradient_noise_scale"]) for e, r in zip(epochs, records)
              if math.isfinite(r["gradient_noise_scale"]) and r["gradient_noise_scale"] > 0]
  left.plot([e for e, _ in positive], [b for _, b in positive], marker=".", label="B_simple")
  left.plot(epochs, [r["batch_size"] for r in records], linestyle="--", color="gray", label="batch size")
  left.set_yscale("log")
  left.set_xlabel("epoch")
  left.set_ylabel("examples")
  left.grid(alpha=0.3, which="both")
  left.legend()
  right.plot(epochs, [r["loss"] for r in records])
  right.set_xlabel("epoch")
  right.set_ylabel("train loss")
  right.grid(alpha=0.3)
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)
  plt.close(figure)


def write_outputs(records: list[dict[str, Any]], spec: NoiseScaleSpec) -> None:
  """Writes `<out>.csv`, `<out>.md` and `<out>.png` from the noise-scale `records`."""
  out = pathlib.Path(spec.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_csv(records, out.with_suffix(".csv"))
  out.with_suffix(".md").write_text(markdown_table(records, spec))
  plot(records, spec.title, out.with_suffix(".png"))


def run_experiment(spec: NoiseScaleSpec, dry_run: bool = False) -> list[dict[str, Any]]:
  """Trains the accumulating run unless finished, then writes the outputs; returns its records. `dry_run`:
  print what the run would train (`runner.print_dry_run`), train nothing and return [].

  Raises:
    ConfigError: an invalid spec or config (before any training), or a run without estimates.
  """
  config = run_config(spec)
  check_spec(spec, config)
  train.validate(config)
  workdir = pathlib.Path(spec.workdir)
  if dry_run:
    runner.print_dry_run("[noise_scale]", [("accumulating run", config, workdir)])
    return []
  if runner.run_once(config, workdir, name="accumulating run", prefix="[noise_scale]").status == "diverged":
    raise train.NonFiniteError(f"the run diverged ({workdir / runner.DIVERGED_NOTE}); lower the learning rate.")
  records = noise_scale_records(workdir)
  write_outputs(records, spec)
  return records


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Command-line entry; see the module docstring."""
  parser = argparse.ArgumentParser(prog="python -m experiments.noise_scale", description=__doc__.split("\n")[0])
  parser.add_argument("--config", required=True,
                      help="a packaged config (e.g. mnist_lstm) or a config file, optionally with :variant")
  parser.add_argument("--max_device_batch", required=True, type=int, help="micro-batch size, e.g. 128")
  parser.add_argument("--out", required=True, help="output prefix, e.g. docs/results/noise_scale")
  parser.add_argument("--workdir", required=True, help="the run's directory")
  parser.add_argument("--variant", default="", help="variant keys, e.g. batch=1024,epochs=2")
  parser.add_argument("--log_every", type=int, default=5)
  parser.add_argument("--title", default="Gradient noise scale B_simple during training")
  runner.add_dry_run(parser)
  args = parser.parse_args(argv)
  runner.check_paths(parser, out=args.out, workdir=args.workdir)
  spec = NoiseScaleSpec(config=args.config, out=args.out, workdir=args.workdir,
                        max_device_batch=args.max_device_batch, variant=args.variant, log_every=args.log_every,
                        title=args.title)
  return run_experiment(spec, dry_run=args.dry_run)


if __name__ == "__main__":
  with exit_on_user_errors("python -m experiments.noise_scale"):
    main(sys.argv[1:])
