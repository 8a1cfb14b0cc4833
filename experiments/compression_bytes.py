"""Accuracy vs bytes sent: PowerSGD at ranks 1, 2, 4 beside 1-bit SGD, QSGD and no compression.

  JAX_NUM_CPU_DEVICES=8 python -m experiments.compression_bytes --config mnist_lstm --epochs 1 \
      --batch_size 128 --ranks 1,2,4 --out docs/results/powersgd_mnist_lstm \
      --workdir runs/compression_bytes

papers/004 compresses each worker's gradient before the data-parallel all-reduce; PowerSGD
(Vogels et al. 2019) sends rank-r factors instead. Every variant trains the same config with the
same seed, batch size, epochs and learning-rate recipe in the per-device (`shard_map`) step, on all
visible devices; only `config.compression` differs:

  none         no_compression (the float32 gradient, one pmean)
  one_bit      1-bit SGD with error feedback
  qsgd_s<S>    QSGD with S levels, fixed-length (dense) code
  powersgd_r<R> PowerSGD at rank R with error feedback and warm start

Bytes are what one device sends per step (`lbjax.optim.compression.bits_per_step`, logged by the
trainer as the `compression` record) times the number of steps. A run whose workdir holds a final
evaluation is not trained again.
Outputs:
  <out>.csv  variant, bits per device step, ratio, steps, MB sent per device, final train loss,
             final test accuracy
  <out>.md   the same as a table, with the command
  <out>.png  final test accuracy vs MB sent per device (log scale)
"""

import argparse
import csv
import dataclasses
import pathlib
import sys
from typing import Any, Sequence

from experiments import run_records
from lbjax import train
from lbjax.train import config_files


@dataclasses.dataclass(frozen=True)
class Variant:
  name: str
  compression: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Result:
  variant: str
  bits_per_step: float
  ratio: float
  steps: int
  final_train_loss: float
  final_test_accuracy: float

  @property
  def megabytes_sent(self) -> float:
    return self.bits_per_step * self.steps / 8 / 1e6


def variants(ranks: Sequence[int], qsgd_levels: int) -> list[Variant]:
  return [Variant("none", {"name": "no_compression"}),
          Variant("one_bit", {"name": "one_bit", "error_feedback": True}),
          Variant(f"qsgd_s{qsgd_levels}", {"name": "qsgd", "num_levels": qsgd_levels}),
          *(Variant(f"powersgd_r{r}", {"name": "powersgd", "rank": r}) for r in ranks)]


def run_config(config_name: str, variant: Variant, batch_size: int, epochs: float):
  config = config_files.load(config_name, [f"--config.batch_size={batch_size}",
                                           f"--config.num_epochs={float(epochs)!r}"]).config
  config.compression = variant.compression
  config.mesh.per_device_gradients = True
  config.progress = False
  return config


def read_result(run_dir: pathlib.Path, variant: str) -> Result | None:
  if not (run_dir / "metrics.jsonl").is_file():
    return None
  final = run_records.final_eval(run_dir)
  if final is None:
    return None
  bits = run_records.read_records(run_dir, "compression")[-1]
  train_records = run_records.read_records(run_dir, "train")
  return Result(variant, bits["bits_per_device_step"], bits["ratio"], final["step"],
                train_records[-1]["loss"], final["accuracy"])


def write_outputs(results: list[Result], out: str, command: str, batch_size: int, epochs: float,
                  config_name: str, num_devices: int) -> None:
  with open(f"{out}.csv", "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(("variant", "bits_per_device_step", "ratio", "steps", "megabytes_per_device",
                     "final_train_loss", "final_test_accuracy"))
    for r in results:
      writer.writerow((r.variant, f"{r.bits_per_step:.0f}", f"{r.ratio:.4g}", r.steps, f"{r.megabytes_sent:.4g}",
                       f"{r.final_train_loss:.4f}", f"{r.final_test_accuracy:.4f}"))
  lines = [f"# Accuracy vs bytes sent: {config_name}, PowerSGD beside 1-bit SGD and QSGD", "",
           f"Global batch {batch_size} over {num_devices} devices (per-device gradients in `shard_map`, one "
           f"compressed all-reduce per step), {epochs:g} epoch(s), the config's learning-rate recipe, same seed. "
           "Bytes: what one device sends per step (`bits_per_step`) times the steps.", "",
           "```", command, "```", "",
           "| variant | bits / device step | compression ratio | steps | MB sent / device | final train loss "
           "| final test accuracy |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for r in results:
    lines.append(f"| {r.variant} | {r.bits_per_step:,.0f} | {r.ratio:.1f}x | {r.steps} | {r.megabytes_sent:.3f} | "
                 f"{r.final_train_loss:.4f} | {100 * r.final_test_accuracy:.2f}% |")
  lines += ["", "One run per variant (one seed) on simulated CPU devices of a loaded 2-core host, so differences of a "
            "few tenths of a percent are within seed-to-seed noise, which this table does not measure. 1-bit SGD "
            "and PowerSGD carry their compression error to the next step (error feedback); QSGD is unbiased but "
            "its variance grows with the leaf size n (E||Q(v)||^2 <= (1 + min(n/s^2, sqrt(n)/s)) ||v||^2, "
            "papers/004) and nothing corrects it. MB sent counts the messages one device sends (PowerSGD: the P "
            "and Q factors of each compressed matrix and the small leaves whole), as `bits_per_step` counts it; how "
            "a collective would move the messages (all-gather of quantized ones, all-reduce of PowerSGD's "
            "factors) is not modelled."]
  pathlib.Path(f"{out}.md").write_text("\n".join(lines) + "\n")
  plot(results, f"{out}.png", f"{config_name}, batch {batch_size}, {epochs:g} epoch(s)")


def plot(results: list[Result], path: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for index, r in enumerate(results):
    ax.scatter(r.megabytes_sent, 100 * r.final_test_accuracy)
    ax.annotate(r.variant, (r.megabytes_sent, 100 * r.final_test_accuracy), textcoords="offset points",
                xytext=(4, 4 if index % 2 else -12), fontsize=8)  # alternate sides: nearby labels overlap
  ax.set_xscale("log")
  ax.set_xlabel("MB sent per device (log scale)")
  ax.set_ylabel("final test accuracy (%)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _ints(text: str) -> tuple[int, ...]:
  return tuple(int(x) for x in text.split(",") if x)


def main(argv: Sequence[str] | None = None) -> list[Result]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--config", default="mnist_lstm")
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--ranks", type=_ints, default=(1, 2, 4))
  parser.add_argument("--qsgd_levels", type=int, default=4)
  parser.add_argument("--out", required=True)
  parser.add_argument("--workdir", required=True)
  args = parser.parse_args(argv)
  import jax
  command = "JAX_NUM_CPU_DEVICES=8 python -m experiments.compression_bytes " + " ".join(
      sys.argv[1:] if argv is None else argv)
  results = []
  for variant in variants(args.ranks, args.qsgd_levels):
    run_dir = pathlib.Path(args.workdir) / variant.name
    result = read_result(run_dir, variant.name)
    if result is None:
      print(f"training {variant.name} in {run_dir}", flush=True)
      config = run_config(args.config, variant, args.batch_size, args.epochs)
      train.train_and_evaluate(config, run_dir)
      result = read_result(run_dir, variant.name)
    results.append(result)
    write_outputs(results, args.out, command, args.batch_size, args.epochs, args.config, jax.device_count())
  return results


if __name__ == "__main__":
  main()
