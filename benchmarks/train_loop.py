"""The whole training loop vs its bare compiled step, and where the difference goes.

`train_and_evaluate` is run on a synthetic twin; its examples/s comes from the `train` records of
metrics.jsonl (each covers the `log_every` steps since the previous record; the window is reset
after compilation and evaluation, so compile time is excluded). The bare rate is the trainer's own
compiled step called back to back on one placed batch, measured in the same process between loop
runs. The host work of one loop iteration is then timed piece by piece:

  next_batch      the input pipeline (`stream.next_batch`, index gather and transform)
  global_batch    host -> device (`run.global_batch`: `make_array_from_process_local_data` per array)
  device_put      the same transfer with `jax.device_put(batch, sharding)`, for comparison
  lr_scalar       the learning rate placed as a device scalar (`run.host_scalar`)
  schedules       the host learning-rate and batch-size schedules

    python -m benchmarks.train_loop [--rounds 3] [--steps 60] [--no-readme]
"""

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import jax

from benchmarks import report
from benchmarks import workloads
from lbjax import train
from lbjax.train import run as run_lib

CASES = (("mnist_lstm", 512), ("resnet_tiny", 128), ("ptb_lstm", 16))


def loop_examples_per_second(config, steps: int, log_every: int) -> float:
  """Median examples/s over the `train` records of one `train_and_evaluate` run (first dropped)."""
  config = config.copy_and_resolve_references()
  examples_per_epoch = _examples_per_epoch(config)
  config.num_epochs = steps * config.batch_size / examples_per_epoch
  config.eval_every_epochs = config.num_epochs
  config.log_every = log_every
  with tempfile.TemporaryDirectory() as workdir:
    train.train_and_evaluate(config, workdir)
    records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]
  rates = [r["examples_per_second"] for r in records if r["kind"] == "train"]
  return statistics.median(rates[1:] if len(rates) > 1 else rates)


def _examples_per_epoch(config) -> float:
  """Examples one epoch of the config's train stream holds (rows x windows for PTB)."""
  task = train.build_task(config)
  stream = task.dataset.make_train_stream(0, 1)
  if hasattr(stream, "windows_per_epoch"):
    return stream.windows_per_epoch(config.batch_size) * config.batch_size
  return stream.num_examples


def host_seconds(trainer_step: workloads.TrainerStep, repeats: int) -> dict[str, float]:
  """Median seconds of each piece of one loop iteration's host work."""
  run, size = trainer_step.run, trainer_step.batch_size
  stream = run.task.dataset.make_train_stream(0, 1)
  local = stream.next_batch(size)
  local.pop("reset_carry", None)

  pieces = {
      "next_batch": lambda: stream.next_batch(size),
      "global_batch": lambda: run_lib.global_batch(local, run.batch_sharding),
      "device_put": lambda: jax.device_put(local, run.batch_sharding),
      "lr_scalar": lambda: run_lib.host_scalar(0.1, run.replicated),
      "schedules": lambda: (run.lr_schedule(0.5), run.batch_size_schedule(0.5)),
  }
  times = {}
  for name, function in pieces.items():
    samples = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(function())
      samples.append(time.perf_counter() - start)
    times[name] = statistics.median(samples)
  return times


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--log-every", type=int, default=10)
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()

  rate_rows, host_rows = [], []
  for model, batch_size in CASES:
    config = workloads.trainer_config(model, batch_size, num_train_examples=8192)
    trainer_step = workloads.TrainerStep(config)
    probe = report.median_seconds({"step": trainer_step}, rounds=1, repeats=1)["step"]
    repeats = max(2, round(1.0 / max(probe, 1e-6)))
    bare, looped = [], []
    for _ in range(args.rounds):
      bare.append(report.median_seconds({"step": trainer_step}, rounds=1, repeats=repeats)["step"])
      looped.append(loop_examples_per_second(config, args.steps, args.log_every))
    bare_rate = batch_size / statistics.median(bare)
    loop_rate = statistics.median(looped)
    host = host_seconds(trainer_step, repeats=50)
    trainer_step.close()
    step_ms = 1000 * statistics.median(bare)
    rate_rows.append([model, batch_size, f"{bare_rate:,.0f}", f"{loop_rate:,.0f}",
                      f"{loop_rate / bare_rate:.3f}",
                      f"{1000 * batch_size / loop_rate - step_ms:+.2f}"])
    host_rows.append([model, batch_size, f"{step_ms:.2f}"] +
                     [f"{1000 * host[k]:.3f}" for k in ("next_batch", "global_batch", "device_put",
                                                        "lr_scalar", "schedules")])
    print(rate_rows[-1], host_rows[-1], flush=True)
  rates = report.markdown_table(
      ["model", "global batch", "bare step ex/s", "train_and_evaluate ex/s", "loop / bare",
       "extra ms per step"], rate_rows)
  pieces = report.markdown_table(
      ["model", "global batch", "bare step ms", "next_batch ms", "global_batch ms", "device_put ms",
       "lr_scalar ms", "schedules ms"], host_rows)
  notes = (
      f"One CPU device, momentum SGD, synthetic twins, {args.steps} steps per run, metrics every "
      f"{args.log_every} steps, no checkpoints during the run; loop rate = median of the run's "
      f"`examples_per_second` records (first dropped), median over {args.rounds} runs interleaved "
      "with the bare-step measurements. Host pieces are medians of 50 calls each, measured alone "
      "(in the loop they overlap the previous step's device work through async dispatch, but on a "
      "2-core CPU they compete with it for cores).")
  body = (report.header_lines() + "\n" + rates + "\n\nHost work of one loop iteration:\n\n" +
          pieces + "\n\n" + notes)
  print(rates + "\n\n" + pieces)
  if not args.no_readme:
    report.write_section("train-loop", "Whole loop vs bare step", body)


if __name__ == "__main__":
  main()
