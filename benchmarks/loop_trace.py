"""How busy the device is while the whole training loop runs: traced steps of the trainer itself.

For each model (the loop benchmark's cases: the MNIST LSTM at B=128 and ResNet-tiny at B=32, synthetic twins,
momentum SGD) and each way of feeding the steps, one `train_and_evaluate` run traces `--traced` steps after
`--skip` with `jax.profiler` (`config.profile`, `lbjax.train.profiling`). Its `profile` record gives the traced
wall time per step and the device's busy time per step read from the trace (the union of its kernels'
intervals: `lbjax.train.trace_analysis`). A device is idle between its kernels even when the host keeps it
fed (a GPU's launch gaps, the CPU runtime's work between XLA's thunks), so the baseline is the same share
in a trace of the bare step: the trainer's compiled step called back to back on one placed batch, traced
the same way (`bare step`). The loop's share over the bare step's is what the loop keeps of the step's
speed under the profiler (1: all of it; the host's dispatch, input, placement and hooks cost the rest).

  bare step         `workloads.TrainerStep` called back to back: no input, no hooks (the baseline)
  loop              as configured (on accelerators batch t+1 is drawn and placed on a thread during step t)
  data on device    `config.train_data_on_device`: the training set held on the device, B int32 indices sent
  k per call        `config.steps_per_call` = k (`--steps-per-call`)
  both              the two together

    python -m benchmarks.loop_trace [--repeats 3] [--skip 50] [--traced 50] [--steps-per-call 10]
                                    [--models mnist_lstm,resnet_tiny] [--keep-traces DIR] [--no-readme]

Each variant runs `--repeats` times, the variants interleaved; the table gives medians [min, max]. Tracing
costs the host time (the profiler records every kernel; on a CPU device every XLA thunk), so traced steps
are slower than untraced ones: read the busy fraction, not the wall time, as the loop's figure.
`--keep-traces DIR` copies each model's first `bare step` and `loop` traces there (`DIR/<model>/<variant>/plugins/
profile/...`), for TensorBoard, XProf or a second reading (`lbjax.train.trace_analysis.read_device_busy`).
"""

import argparse
import json
import pathlib
import shutil
import statistics
import tempfile

import jax

from benchmarks import report
from benchmarks import workloads
from lbjax import train

CASES = {"mnist_lstm": 128, "resnet_tiny": 32}
VARIANTS = ("bare step", "loop", "data on device", "k per call", "both")


def traced_bare_step(model: str, batch_size: int, args, workdir: pathlib.Path) -> dict:
  """The trainer's compiled step called back to back, `args.skip` steps, then `args.traced` traced as the
  trainer traces them (`workloads.trace_steps`); returns a record like the trainer's."""
  step = workloads.TrainerStep(workloads.trainer_config(model, batch_size, num_train_examples=8192))
  for _ in range(args.skip):
    step()
  record = workloads.trace_steps(step, args.traced, workdir / "profile")
  if "device_busy_fraction" not in record:
    raise RuntimeError(f"{model}, bare step: {record['device_time']}")
  return record


def traced_run(model: str, batch_size: int, variant: str, args, workdir: pathlib.Path) -> dict:
  """One run of `variant` with its traced steps; returns its `profile` record."""
  if variant == "bare step":
    return traced_bare_step(model, batch_size, args, workdir)
  config = workloads.trainer_config(model, batch_size, num_train_examples=8192)
  config.train_data_on_device = variant in ("data on device", "both")
  config.steps_per_call = args.steps_per_call if variant in ("k per call", "both") else 1
  config.num_steps = args.skip + args.traced
  config.num_epochs = 1000.0  # num_steps ends the run
  config.eval_every_epochs = config.num_epochs
  config.log_every = args.log_every
  config.profile.num_steps, config.profile.skip_steps = args.traced, args.skip
  train.train_and_evaluate(config, workdir)
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").open()]
  [record] = [r for r in records if r["kind"] == "profile"]
  if "error" in record or "device_busy_fraction" not in record:
    raise RuntimeError(f"{model}, {variant}: no device time in the trace: {record}")
  return record


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=report.positive_int, default=3, help="runs of each variant")
  parser.add_argument("--skip", type=report.positive_int, default=50, help="steps before the trace")
  parser.add_argument("--traced", type=report.positive_int, default=50, help="steps traced")
  parser.add_argument("--log-every", type=report.positive_int, default=50, help="metrics window")
  parser.add_argument("--steps-per-call", type=report.positive_int, default=10,
                      help="config.steps_per_call of 'k per call' and 'both' (a divisor of --skip, --traced and "
                           "--log-every keeps every call whole)")
  parser.add_argument("--models", default=",".join(CASES), help=f"from {', '.join(CASES)}")
  parser.add_argument("--keep-traces", type=pathlib.Path, help="copy each model's first bare-step and loop traces here")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  models = [m.strip() for m in args.models.split(",") if m.strip()]
  if not models or any(m not in CASES for m in models):
    parser.error(f"--models takes names from {', '.join(CASES)}, got {args.models!r}")
  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="lbjax-bench-cache-"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

  rows = []
  for model in models:
    batch_size = CASES[model]
    records: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for repeat in range(args.repeats):
      for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as workdir:
          records[variant].append(traced_run(model, batch_size, variant, args, pathlib.Path(workdir)))
          if args.keep_traces and variant in ("bare step", "loop") and repeat == 0:
            shutil.copytree(pathlib.Path(workdir) / "profile", args.keep_traces / model / variant.replace(" ", "_"))
    bare = statistics.median(r["device_busy_fraction"] for r in records["bare step"])
    for variant in VARIANTS:
      column = lambda key: [r[key] for r in records[variant]]
      spread = lambda key, scale=1.0, digits=3: (
          f"{scale * statistics.median(column(key)):.{digits}f} "
          f"[{scale * min(column(key)):.{digits}f}, {scale * max(column(key)):.{digits}f}]")
      label = variant.replace("k per call", f"{args.steps_per_call} per call")
      rows.append([model, batch_size, label, spread("wall_ms_per_step"), spread("device_busy_ms_per_step"),
                   spread("device_busy_fraction", 100, 1),
                   f"{statistics.median(column('device_busy_fraction')) / bare:.3f}",
                   f"{statistics.median(column('kernels_per_step')):.0f}"])
      print(rows[-1], flush=True)
  table = report.markdown_table(
      ["model", "global batch", "variant", "traced wall ms per step", "device busy ms per step",
       "device busy % of the wall time", "busy share / the bare step's", "kernels per step"], rows)
  device = jax.devices()[0]
  notes = (
      f"One {device.device_kind} device, momentum SGD, synthetic twins. Each run: `train_and_evaluate` of "
      f"{args.skip + args.traced} steps, metrics every {args.log_every}, no checkpoint; steps {args.skip + 1}-"
      f"{args.skip + args.traced} traced (`config.profile`); the device waited for before the trace starts and "
      f"before it stops; the bare step: the trainer's compiled step called back to back on one placed batch, "
      f"{args.traced} calls traced after {args.skip}. Medians [min, max] over {args.repeats} runs per variant, "
      "interleaved. Device busy: the union of the device's kernel intervals in the trace (on a CPU device, XLA's "
      "thunks on the host's threads), per traced step, and its share of the traced wall time; over the bare "
      "step's share (ratio of medians), the share of the bare step's speed the loop keeps under the profiler. "
      "Traced steps are slower than untraced ones (the profiler's own recording), so the wall times here are not "
      "the loop's speed (section train-loop is); the kernel events per step are what the profiler recorded.")
  print(table)
  report.publish(args, "loop-trace", "Whole loop: how busy the device is (traced steps)", table + "\n\n" + notes)


if __name__ == "__main__":
  main()
