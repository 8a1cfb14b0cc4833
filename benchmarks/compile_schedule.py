"""A batch-size schedule with 4 sizes: how many train steps compile, and how long compiling takes.

Runs `train_and_evaluate` with a 4-size schedule (papers/002: grow the batch instead of decaying the
LR) and reads the `compile` records of metrics.jsonl; a JAX monitoring listener counts every backend
compilation in the run (train steps, eval step, initialisation, small host-side helpers), so a
stray per-step recompile would show up.

    python -m benchmarks.compile_schedule [--model resnet_tiny] [--no-readme]
"""

import argparse
import json
import pathlib
import tempfile
import time

import jax

from benchmarks import report
from benchmarks import workloads
from lbjax import train

SIZES = (64, 128, 256, 512)
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="resnet_tiny", choices=workloads.MODELS[:-1])
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()

  backend_compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda event, seconds, **_: backend_compiles.append(seconds)
      if event == BACKEND_COMPILE_EVENT else None)
  config = workloads.trainer_config(args.model, SIZES[0], num_train_examples=2048)
  config.batch_sizes = SIZES
  config.batch_size_boundaries = (1.0, 2.0, 3.0)
  config.num_epochs = 4.0
  config.eval_every_epochs = 4.0
  config.log_every = 5
  if args.model == "ptb_lstm":
    config.data_options.num_train_tokens = 20 * 600
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    result = train.train_and_evaluate(config, workdir)
    total = time.perf_counter() - start
    records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]
  compiles = [r for r in records if r["kind"] == "compile"]
  rows = [[r["step"], r["batch_size"], f"{r['seconds']:.2f}"] for r in compiles]
  compile_seconds = sum(r["seconds"] for r in compiles)
  table = report.markdown_table(["first step", "global batch", "compile s"], rows)
  summary = report.markdown_table(
      ["model", "steps", "distinct batch sizes", "train-step compiles", "all backend compiles",
       "train-step compile s", "all backend compile s", "run s", "compile share of run"],
      [[args.model, result.step, len(set(SIZES)), len(compiles), len(backend_compiles),
        f"{compile_seconds:.2f}", f"{sum(backend_compiles):.2f}", f"{total:.1f}",
        f"{compile_seconds / total:.2f}"]])
  notes = ("Schedule: batch 64 -> 128 -> 256 -> 512 at epochs 1, 2, 3 of a 2,048-example synthetic "
           "set, one CPU device, momentum SGD. 'train-step compile s' is the trainer's own timing "
           "(trace + lower + compile) from the `compile` records; 'all backend compiles' counts "
           "every XLA compilation in the process during the run (JAX monitoring event "
           f"`{BACKEND_COMPILE_EVENT}`), including the eval step, optimizer init and small helpers.")
  print(summary + "\n\n" + table)
  if not args.no_readme:
    report.write_section("compile-schedule", "Batch-size schedule: compiles",
                         report.header_lines() + "\n" + summary + "\n\n" + table + "\n\n" + notes)


if __name__ == "__main__":
  main()
