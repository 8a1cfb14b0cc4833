"""Gradient accumulation: k micro-batches inside the compiled step vs one true batch.

For a fixed global batch, `config.max_device_batch = batch / k` makes the trainer split each step
into k micro-batches accumulated with `lax.scan` (the papers' `iter_size`). The table gives, per k,
the throughput relative to k = 1 (interleaved rounds in one process; per-round ratios, median and
quartiles; exit status 3 and README untouched when the 95% interval of a median is wider than
--max-spread of it) and the compiled step's memory from `compiled.memory_analysis()`: temporaries
(activations, gradients in flight) and the peak estimate (arguments + outputs + temporaries -
donated aliases).

    python -m benchmarks.accumulation [--rounds 9] [--max-spread 0.1] [--no-readme]
"""

import argparse

from benchmarks import report
from benchmarks import workloads

CASES = (("resnet_tiny", 512, (1, 2, 4, 8)), ("mnist_lstm", 2048, (1, 2, 4, 8)))


def memory_bytes(compiled) -> tuple[int, int]:
  """(temporary bytes, peak estimate) of a compiled executable."""
  analysis = compiled.memory_analysis()
  temp = analysis.temp_size_in_bytes
  peak = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes + temp
          - analysis.alias_size_in_bytes)
  return temp, peak


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  report.add_spread_arguments(parser, rounds=9)
  parser.add_argument("--seconds-per-round", type=float, default=1.0)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  check = report.SpreadCheck(args.max_spread)
  rows = []
  for model, batch_size, splits in CASES:
    steps = {}
    for k in splits:
      config = workloads.trainer_config(model, batch_size)
      config.max_device_batch = batch_size // k if k > 1 else 0
      steps[k] = workloads.TrainerStep(config)
    repeats = report.repeats_for(steps[1], args.seconds_per_round)
    times = report.round_seconds(steps, rounds=args.rounds, repeats=repeats)
    base_temp, base_peak = memory_bytes(steps[1].compiled)
    for k in splits:
      temp, peak = memory_bytes(steps[k].compiled)
      speedup = report.paired_ratios(times, 1, k)
      if k != 1:
        check.record(f"{model} k={k}: time at k=1 / time at k", speedup)
      rows.append([model, batch_size, k, batch_size // k,
                   f"{batch_size / report.Spread.of(times[k]).median:,.0f}",
                   speedup.format(digits=3), f"{temp / 2**20:.1f}", f"{temp / base_temp:.2f}",
                   f"{peak / 2**20:.1f}", f"{peak / base_peak:.2f}"])
      print(rows[-1], flush=True)
    for step in steps.values():
      step.close()
  table = report.markdown_table(
      ["model", "global batch", "k", "micro-batch", "ex/s", "throughput vs k=1", "temp MiB",
       "temp vs k=1", "peak MiB", "peak vs k=1"], rows)
  notes = ("One CPU device, momentum SGD, synthetic data on the device. On XLA:CPU a convolution "
           "inside the accumulation loop (`lax.scan`, a `while` loop) runs ~10x slower than outside "
           "it, so on CPU models with convolutions unroll the loop (ResNet rows: fast, but memory "
           "as for k = 1) and the others keep it rolled (LSTM rows: memory 1/k); see Findings 7. "
           "Throughput vs k=1: per-round ratios, median [quartiles]. Memory is XLA's static "
           "estimate for the compiled step (CPU backend); peak = arguments + outputs + temporaries "
           "- donated aliases.")
  print(table)
  if not args.no_readme and check.should_write(args.write_noisy):
    report.write_section("accumulation", "Gradient accumulation: k micro-batches vs one batch",
                         report.header_lines() + "\n" + check.warning() + table + "\n\n" + notes)
  check.exit_if_noisy()


if __name__ == "__main__":
  main()
