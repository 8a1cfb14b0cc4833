"""A batch-size schedule with 4 sizes: how many programs compile, per-size steps vs the any-batch step.

Runs `train_and_evaluate` with a 4-size schedule (papers/002: grow the batch instead of decaying the
LR) and with one size, each twice: with today's per-size steps, and with the any-batch step
(`config.batch.micro_batch_size` = the smallest size, `lbjax.train.any_batch`). A JAX monitoring
listener counts every backend compilation in each run (train programs, eval step, initialisation,
small host-side helpers), so a stray recompile would show up; the `compile` records of metrics.jsonl
give the trainer's own compile timings.

    python -m benchmarks.compile_schedule [--model mnist_lstm] [--no-readme]
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


def measure(config) -> dict[str, float]:
  """Runs `config` from a cold compilation cache; its steps, compiles and seconds."""
  backend_compiles = []
  listener = lambda event, seconds, **_: backend_compiles.append(seconds) if event == BACKEND_COMPILE_EVENT else None
  jax.clear_caches()
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    with tempfile.TemporaryDirectory() as workdir:
      start = time.perf_counter()
      result = train.train_and_evaluate(config, workdir)
      total = time.perf_counter() - start
      records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  compiles = [r for r in records if r["kind"] == "compile"]
  return {"steps": result.step, "sizes": len({r["batch_size"] for r in records if r["kind"] == "train"}),
          "train_compiles": len(compiles), "train_compile_s": sum(r["seconds"] for r in compiles),
          "backend_compiles": len(backend_compiles), "backend_compile_s": sum(backend_compiles), "run_s": total}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="mnist_lstm", choices=workloads.MODELS[:-1])
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  rows = []
  for step_kind, micro in (("per-size steps", 0), ("any-batch step", SIZES[0])):
    for schedule in (SIZES, SIZES[:1]):
      config = workloads.trainer_config(args.model, SIZES[0], num_train_examples=2048)
      if len(schedule) > 1:
        config.batch_sizes = schedule
        config.batch_size_boundaries = (1.0, 2.0, 3.0)
      config.num_epochs = float(len(schedule))
      config.eval_every_epochs = config.num_epochs
      config.log_every = 1
      config.batch.micro_batch_size = micro
      if args.model == "ptb_lstm":
        config.data_options.num_train_tokens = 20 * 600
      m = measure(config)
      rows.append([args.model, step_kind, " -> ".join(map(str, schedule)), m["steps"], m["sizes"],
                   m["train_compiles"], m["backend_compiles"], f"{m['train_compile_s']:.2f}",
                   f"{m['backend_compile_s']:.2f}", f"{m['run_s']:.1f}"])
      print(rows[-1], flush=True)
  table = report.markdown_table(
      ["model", "step", "batch sizes", "steps", "distinct sizes run", "train-step compile records",
       "all backend compiles", "train-step compile s", "all backend compile s", "run s"], rows)
  notes = ("Schedule: batch 64 -> 128 -> 256 -> 512 at epochs 1, 2, 3 of a 2,048-example synthetic set "
           "(the 1-size run: batch 64 for 1 epoch), one CPU device, momentum SGD. 'all backend compiles' "
           f"counts every XLA compilation in the run (JAX monitoring event `{BACKEND_COMPILE_EVENT}`, "
           "cache cleared before each run), including the eval step, optimizer init and small helpers; "
           "'train-step compile records' are the trainer's `compile` records (the any-batch step's two "
           "programs make one record, at the first step). The any-batch step uses micro-batches of 64.")
  print(table)
  report.publish(args, "compile-schedule", "Batch-size schedule: compiles", table + "\n\n" + notes)


if __name__ == "__main__":
  main()
