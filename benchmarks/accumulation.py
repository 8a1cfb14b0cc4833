"""Gradient accumulation: k micro-batches inside the compiled step vs one true batch.

For a fixed global batch, `config.max_device_batch = batch / k` makes the trainer split each step
into k micro-batches accumulated with `lax.scan` (the papers' `iter_size`). The table gives, per k,
the throughput relative to k = 1 (interleaved rounds in one process; per-round ratios, median and
quartiles; exit status 3 and README untouched when the 95% interval of a median is wider than
--max-spread of it) and the compiled step's memory from `compiled.memory_analysis()`: temporaries
(activations, gradients in flight) and the peak estimate (arguments + outputs + temporaries -
donated aliases).

    python -m benchmarks.accumulation [--rounds 9] [--max-spread 0.1] [--no-readme]

`--any-batch` instead compares, at a fixed global batch, the any-batch step (`config.batch.
micro_batch_size`: a host loop over one compiled micro-batch program plus one compiled update whose
micro-batch count is traced, `lbjax.train.any_batch`) with today's per-size steps: the same k
micro-batches accumulated by `lax.scan` inside one compiled step (`max_device_batch`), and the
whole batch at once (k = 1). Variants are interleaved round by round; the table gives the median
seconds per update and the median and range over rounds of each per-size step's time divided by
the any-batch step's (> 1: the any-batch step is faster).

    python -m benchmarks.accumulation --any-batch [--rounds 15] [--no-readme]

`--any-batch --loop` times the same variants in the trainer's host loop instead of on one placed
batch: each update is `Run.step(Run.next_batch())` (data stream, placement, the batch policy's
bookkeeping and records, two steps in flight), as `train_and_evaluate` runs it without its hooks, with
a `batch` record every `--adapt-every` updates (default 1: every update).

    python -m benchmarks.accumulation --any-batch --loop [--adapt-every 1] [--rounds 10] [--no-readme]
"""

import argparse
import statistics
import time

import jax

from benchmarks import report
from benchmarks import workloads
from lbjax.train import build
from lbjax.train import any_batch as any_batch_lib
from lbjax.train import run as run_lib

CASES = (("resnet_tiny", 512, (1, 2, 4, 8)), ("mnist_lstm", 2048, (1, 2, 4, 8)))
ANY_BATCH_CASES = (("mnist_lstm", 512, 128), ("mnist_lstm", 2048, 512), ("resnet_tiny", 512, 128))


class AnyBatchStep:
  """The trainer's any-batch step (`Run.any_batch`) on one placed batch, ready to call repeatedly."""

  def __init__(self, config):
    self.run = run_lib.Run(config)
    self.batch_size = config.batch_size
    self.state = self.run.state
    local = self.run.stream.next_batch(self.batch_size)
    self.micro_batches = self.run.any_batch.place(local, self.batch_size)
    self.learning_rate = build.host_scalar(workloads.LEARNING_RATE, self.run.parts.replicated)

  def __call__(self):
    self.state, metrics, _ = self.run.any_batch.step(self.state, self.micro_batches, self.learning_rate, 0.0)
    return metrics

  def close(self) -> None:
    for leaf in jax.tree.leaves((self.state, self.micro_batches)):
      leaf.delete()


class LoopStep:
  """One update of the trainer's host loop: `Run.step(Run.next_batch())` on the synthetic stream, the
  batch policy's records dropped (the hook that writes them is not timed)."""

  def __init__(self, config):
    self.run = run_lib.Run(config)

  def __call__(self):
    metrics = self.run.step(self.run.next_batch())
    self.run.batch_policy.records.clear()
    return metrics

  def close(self) -> None:
    for leaf in jax.tree.leaves(self.run.state):
      leaf.delete()


def _round_times(steps: dict, rounds: int, repeats: int) -> dict[str, tuple[list[float], list[float]]]:
  """Per variant, (wall seconds, process CPU seconds) per update in each interleaved round (`report.round_order`).

  CPU seconds (all threads of this process) are the work a step costs, less sensitive than wall
  time to other jobs on a loaded machine; both are reported."""
  for step in steps.values():
    jax.block_until_ready(step())
  times = {name: ([], []) for name in steps}
  for round_index in range(rounds):
    for name in report.round_order(list(steps), round_index):
      step = steps[name]
      wall, cpu = time.perf_counter(), time.process_time()
      for _ in range(repeats):
        result = step()
      jax.block_until_ready(result)
      times[name][0].append((time.perf_counter() - wall) / repeats)
      times[name][1].append((time.process_time() - cpu) / repeats)
  return times


def _ratio_cell(numerator: list[float], denominator: list[float]) -> str:
  ratios = [n / d for n, d in zip(numerator, denominator)]
  return f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"


def any_batch_rows(rounds: int, seconds_per_round: float, cases=ANY_BATCH_CASES, adapt_every: int = 0
                   ) -> list[list[object]]:
  """One row per (model, batch, micro-batch) case: the any-batch step against the per-size steps
  (scan over k, and k = 1); with `adapt_every` > 0, each in the trainer's host loop (`LoopStep`)
  with a `batch` record every `adapt_every` updates."""
  rows = []
  for model, batch_size, micro in cases:
    configs = {name: workloads.trainer_config(model, batch_size) for name in ("any", "scan", "whole")}
    configs["scan"].max_device_batch = micro
    configs["any"].batch.micro_batch_size = micro
    if adapt_every:
      for config in configs.values():
        config.batch.adapt_every = adapt_every
      steps = {name: LoopStep(config) for name, config in configs.items()}
    else:
      steps = {"any": AnyBatchStep(configs["any"]), "scan": workloads.TrainerStep(configs["scan"]),
               "whole": workloads.TrainerStep(configs["whole"])}
    probe = report.median_seconds({"any": steps["any"]}, rounds=1, repeats=1)["any"]
    repeats = max(1, round(seconds_per_round / max(probe, 1e-6)))
    times = _round_times(steps, rounds, repeats)
    cells = [model, batch_size, micro, batch_size // micro]
    cells += [f"{statistics.median(times[n][0]) * 1e3:.1f}" for n in ("any", "scan", "whole")]
    for clock in (0, 1):
      cells += [_ratio_cell(times[n][clock], times["any"][clock]) for n in ("scan", "whole")]
    rows.append(cells)
    print(cells, flush=True)
    for step in steps.values():
      step.close()
  return rows


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
  parser.add_argument("--seconds-per-round", type=report.positive_float, default=1.0)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  parser.add_argument("--any-batch", action="store_true", help="the any-batch step vs the per-size steps")
  parser.add_argument("--case", action="append", default=[], type=any_batch_case, metavar="MODEL:BATCH:MICRO",
                      help="--any-batch cases instead of the default ones, e.g. mnist_lstm:512:512")
  parser.add_argument("--loop", action="store_true",
                      help="--any-batch in the trainer's host loop (data, batch policy) instead of one placed batch")
  parser.add_argument("--adapt-every", type=report.positive_int, default=1,
                      help="--loop: updates between `batch` records (default 1)")
  args = parser.parse_args()
  if not args.any_batch and (args.case or args.loop):
    parser.error("--case and --loop choose what --any-batch measures; add --any-batch.")
  if report.flags_given(parser, args, ["adapt_every"]) and not args.loop:
    parser.error("--adapt-every sets how often --loop writes `batch` records; add --any-batch --loop, or drop it.")
  unchecked = report.flags_given(parser, args, ["max_spread", "write_noisy"])
  if args.any_batch and unchecked:
    parser.error(f"--any-batch reports its ratios without a spread check: drop {', '.join(unchecked)}.")
  if args.any_batch:
    any_batch_main(args)
    return
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
  check.finish(args, "accumulation", "Gradient accumulation: k micro-batches vs one batch", table + "\n\n" + notes)


def any_batch_case(text: str) -> tuple[str, int, int]:
  """An argparse type: `MODEL:BATCH:MICRO` -> (model, batch, micro), BATCH a whole number of micro-batches."""
  model, batch_size, micro = workloads.parse_case(text, ("BATCH", "MICRO"))
  if batch_size % micro:
    raise argparse.ArgumentTypeError(f"{text!r}: BATCH {batch_size} is not a whole number of micro-batches of "
                                     f"MICRO {micro}; use a BATCH that is a multiple of MICRO.")
  return model, batch_size, micro


def any_batch_main(args) -> None:
  table = report.markdown_table(
      ["model", "global batch", "micro-batch", "k", "any-batch ms", "scan ms", "k=1 ms",
       "wall: scan / any-batch", "wall: k=1 / any-batch", "CPU: scan / any-batch", "CPU: k=1 / any-batch"],
      any_batch_rows(args.rounds, args.seconds_per_round, tuple(args.case) or ANY_BATCH_CASES,
                     args.adapt_every if args.loop else 0))
  if args.loop:
    notes = ("One CPU device (the machine's 2 cores shared with other jobs), momentum SGD, synthetic data. "
             "Each update is the trainer's host loop, `Run.step(Run.next_batch())`: the data stream, the "
             "placement, the batch policy ('schedule' at one size) with a `batch` record every "
             f"{args.adapt_every} update(s), two steps in flight. Variants and ratios as in the 'any-batch' "
             "section (median [min, max] over the interleaved rounds, > 1: the any-batch step is faster).")
    print(table)
    report.publish(args, "any-batch-loop", "Any batch, one compile: the trainer's host loop at a fixed batch",
                   table + "\n\n" + notes)
    return
  notes = ("One CPU device (the machine's 2 cores shared with other jobs and a background training run), "
           "momentum SGD, synthetic data placed once. 'any-batch': `config.batch.micro_batch_size` = the "
           "micro-batch; the same two programs serve every multiple of it, the accumulation program taking up "
           f"to {any_batch_lib.SLOTS} micro-batches per call in a rolled loop over a traced count (one per call "
           "for the ResNet on CPU, whose convolutions a loop body slows down; Findings 9: why one call per "
           "micro-batch was slower). 'scan': today's per-size step with `max_device_batch` = the micro-batch "
           "(k micro-batches in one compiled `lax.scan`, unrolled for the ResNet on CPU). 'k=1': today's "
           "per-size step on the whole batch. ms: median wall time per update. Ratios (median [min, max] over "
           "the interleaved rounds, > 1: the any-batch step is faster) of wall time and of the process's CPU "
           "time (all threads), the latter less disturbed by the other jobs on the machine.")
  print(table)
  report.publish(args, "any-batch", "Any batch, one compile: the any-batch step vs the per-size steps",
                 table + "\n\n" + notes)


if __name__ == "__main__":
  main()
