"""The whole training loop vs a bare jitted step on the same model and batch: the trainer's overhead.

The ways to take training steps, timed in interleaved rounds in one process:

  hand step     a minimal hand-written `jax.jit` step (`workloads.HandStep`: value_and_grad, optax
                momentum SGD, donated buffers) called back to back on one batch already on the device
  trainer step  the trainer's own compiled step (`workloads.TrainerStep`), called the same way
  trainer call  the trainer's call of k steps (`workloads.TrainerCall`, the program `config.steps_per_call`
                = k runs: a `lax.scan` of the step), called the same way, its time divided by k: whether
                the scanned program itself is slower per step than the step (a device cost the host
                cannot hide)
  trainer call, unrolled  the same k steps with the scan unrolled (no device-side loop; the trainer
                unrolls only on CPU devices): whether the loop is what costs
  loop          `train_and_evaluate` on the model's synthetic twin for `--steps` steps: input
                pipeline, host -> device transfer, LR schedule, metrics, hooks; on accelerators
                batch t+1 is drawn and placed on a background thread while step t runs
                (`lbjax.train.prefetch`; not on CPU devices, where the two loops are the same)
  loop, no prefetch  the loop as it runs on CPU devices: every batch drawn when its step needs it and
                handed to the step as numpy arrays, which the step's own call places (`Run.step_places_batches`;
                since 2026-11-30: before, the batch was placed with `global_batch` on the main thread)
  loop, step places  the loop with batch t+1 drawn on the thread (on accelerators) but handed to the step
                as numpy arrays, which the step's call places (`prefetch.step_places_batches` forced true;
                what one process of CPU devices does, there without the thread): the thread or the
                step's dispatch, which places a batch at less cost on an accelerator?
  loop, k per call  the loop with `config.steps_per_call` = k (`--steps-per-call`): k steps in one
                device call (`lbjax.train.step_calls`), the host dispatching once per k steps and placing
                the call's k batches in one transfer (stacked on the host)
  loop, data on device  the loop with the training set held on the device (`config.train_data_on_device`,
                `lbjax.train.device_data`): per step the host places the batch's B int32 indices and the
                device gathers the rows

The loop's time per step comes from its `train` records (each covers `--log-every` steps; the first
window, which holds the first step after compilation, is dropped). Each round gives the ratios
loop / trainer step, loop / hand step and loop / loop without prefetching under the same load; the
table gives their medians and quartiles. Compilation is kept out of every timing, and JAX's
persistent compilation cache (in a temporary directory) spares the loop runs after the first their
compile. The host work of one loop iteration is then timed piece by piece:

  next_batch      the input pipeline (`stream.next_batch`, index gather and transform)
  global_batch    host -> device (`build.global_batch`: one `make_array_from_process_local_data` call)
  k in one call   the same for the k batches of one call (`--steps-per-call`) in one call, per batch
  k stacked       the k batches copied into one [k, B, ...] array per input on the host and placed as
                  such, per batch (`build.global_call_batches`: what the loop with k per call does since
                  2026-11-30; before, it placed them one by one, `global_batch` each)
  by index        the batch's indices drawn (`next_batch` of the stream of indices), placed and gathered
                  from the training set held on the device (what the loop, data on device does per step)
  as uint8        `global_batch` with the float32 inputs as uint8 arrays of the same shape: a quarter of
                  the bytes, what handing over uint8 pixels (normalised in the step, as the ImageNet,
                  CIFAR-10 and MNIST streams do) would cost the ResNet's float32 synthetic images (the
                  MNIST LSTM's batch is uint8 already: there it is `global_batch` again)
  lr_scalar       the learning rate as the step's device scalar (`Run.learning_rate_scalar`: placed
                  only when its value changes, so at the constant LR of these runs a lookup)
  schedules       the host learning-rate and batch-size schedules
  metrics         the `train` record of one window of `--log-every` steps (`hooks.WriteMetrics`: the
                  window's metrics stacked on the device, fetched, averaged and written), per step

    python -m benchmarks.train_loop [--rounds 15] [--steps 100] [--log-every 50] [--steps-per-call 10]
                                    [--max-spread 0.1] [--no-readme]

Exits with status 3 (README untouched) when the 95% confidence interval of a ratio's
median is wider than --max-spread of it.
"""

import argparse
import contextlib
import json
import pathlib
import statistics
import tempfile
import time
from unittest import mock

import jax
import numpy as np

from benchmarks import report
from benchmarks import workloads
from lbjax import train
from lbjax.train import build
from lbjax.train import hooks
from lbjax.train import prefetch
from lbjax.train.device_data import DeviceTrainingSet
from lbjax.train.metrics import MetricsWriter, ProgressLine

CASES = {"mnist_lstm": 128, "resnet_tiny": 32}


class Loop:
  """One `train_and_evaluate` run of `steps` steps per call; returns its seconds per step. With
  `prefetch=False`, the run takes its devices for CPUs (`prefetch.overlaps_placement` false): no batch is
  drawn ahead, and the step's call places each."""

  def __init__(self, config, steps: int, log_every: int, prefetch: bool = True, steps_per_call: int = 1,
               data_on_device: bool = False, step_places: bool = False):
    config = config.copy_and_resolve_references()
    config.steps_per_call = steps_per_call
    config.train_data_on_device = data_on_device
    config.num_steps = steps
    config.num_epochs = 1000.0  # num_steps ends the run
    config.eval_every_epochs = config.num_epochs
    config.log_every = log_every
    self.config = config
    self.batch_size = config.batch_size
    self.prefetch = prefetch
    self.step_places = step_places

  def __call__(self) -> float:
    with tempfile.TemporaryDirectory() as workdir:
      with contextlib.ExitStack() as patches:
        if not self.prefetch:
          patches.enter_context(mock.patch.object(prefetch, "overlaps_placement", lambda mesh: False))
        if self.step_places:
          patches.enter_context(mock.patch.object(prefetch, "step_places_batches", lambda mesh: True))
        train.train_and_evaluate(self.config, workdir)
      records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").open()]
    rates = [r["examples_per_second"] for r in records if r["kind"] == "train"][1:]
    if not rates:
      raise ValueError("Too few steps for a timed window: raise --steps or lower --log-every.")
    return statistics.fmean(self.batch_size / rate for rate in rates)


def step_seconds(step, repeats: int) -> float:
  """Mean seconds per call of `repeats` back-to-back calls of a step (synchronised at the end)."""
  start = time.perf_counter()
  for _ in range(repeats):
    result = step()
  jax.block_until_ready(result)
  return (time.perf_counter() - start) / repeats


def measure(model: str, batch_size: int, args) -> dict[str, list[float]]:
  """Per-round seconds per step of the hand step, the trainer step and the loop."""
  config = workloads.trainer_config(model, batch_size, num_train_examples=8192)
  trainer_step = workloads.TrainerStep(config)
  hand_step = workloads.HandStep(trainer_step)
  trainer_call = workloads.TrainerCall(trainer_step, args.steps_per_call)
  unrolled_call = workloads.TrainerCall(trainer_step, args.steps_per_call, unrolled=True)
  repeats = args.steps - args.log_every  # as many steps as the loop's timed windows hold
  calls = max(1, repeats // args.steps_per_call)
  variants = {"hand step": lambda: step_seconds(hand_step, repeats),
              "trainer step": lambda: step_seconds(trainer_step, repeats),
              "trainer call": lambda: step_seconds(trainer_call, calls) / args.steps_per_call,
              "trainer call, unrolled": lambda: step_seconds(unrolled_call, calls) / args.steps_per_call,
              "loop": Loop(config, args.steps, args.log_every),
              "loop, no prefetch": Loop(config, args.steps, args.log_every, prefetch=False),
              "loop, step places": Loop(config, args.steps, args.log_every, step_places=True),
              "loop, k per call": Loop(config, args.steps, args.log_every, steps_per_call=args.steps_per_call),
              "loop, data on device": Loop(config, args.steps, args.log_every, data_on_device=True)}
  for function in variants.values():  # compile, warm up, fill the compilation cache
    function()
  names = list(variants)
  times = {name: [] for name in names}
  for round_index in range(args.rounds):
    shift = round_index % len(names)
    for name in names[shift:] + names[:shift]:
      times[name].append(variants[name]())
  times["host"] = host_seconds(model, trainer_step, args.steps_per_call, repeats=50)
  times["host"]["metrics"] = metrics_seconds(trainer_step, args.log_every, repeats=10)
  trainer_step.close()
  return times


def host_seconds(model: str, trainer_step: workloads.TrainerStep, steps_per_call: int, repeats: int
                 ) -> dict[str, float]:
  """Median seconds of each piece of one loop iteration's host work (the placements of a call's
  `steps_per_call` batches per batch)."""
  run, size = trainer_step.run, trainer_step.batch_size
  stream = run.task.dataset.make_train_stream(0, 1)
  local = stream.next_batch(size)
  local.pop("reset_carry", None)
  sharding = run.parts.batch_sharding
  call = [local] * steps_per_call
  as_uint8 = {name: value.astype(np.uint8) if value.dtype == np.float32 else value for name, value in local.items()}
  training_set = DeviceTrainingSet(run.task.dataset.make_train_stream(0, 1), model)
  training_set.place(run.parts.replicated)

  pieces = {
      "next_batch": lambda: stream.next_batch(size),
      "global_batch": lambda: build.global_batch(local, sharding),
      "k in one call": lambda: jax.make_array_from_process_local_data(sharding, call),
      "k stacked": lambda: build.global_call_batches(call, run.parts.call_batch_sharding),
      "by index": lambda: training_set.batch(training_set.stream.next_batch(size), sharding),
      "as uint8": lambda: build.global_batch(as_uint8, sharding),
      "lr_scalar": lambda: run.learning_rate_scalar(0.1),
      "schedules": lambda: (run.batch_policy.learning_rate(0.5, size), run.batch_policy.batch_size(0.5)),
  }
  times = {}
  for name, function in pieces.items():
    samples = []
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(function())
      samples.append(time.perf_counter() - start)
    times[name] = statistics.median(samples)
  for name in ("k in one call", "k stacked"):
    times[name] /= steps_per_call
  return times


def metrics_seconds(trainer_step: workloads.TrainerStep, log_every: int, repeats: int) -> float:
  """Median seconds per step of writing one window of `log_every` steps' metrics, each window's metrics
  fresh from the trainer step (a fetched array keeps its host copy)."""
  samples = []
  with tempfile.TemporaryDirectory() as workdir:
    writer = MetricsWriter(workdir, tensorboard=False)
    for _ in range(repeats + 1):  # the first compiles the stacking
      window = [trainer_step() for _ in range(log_every)]
      jax.block_until_ready(window)
      write = hooks.WriteMetrics(writer, ProgressLine(1.0, 0, enabled=False), log_every, layerwise_rates=False)
      start = time.perf_counter()
      for step, metrics in enumerate(window, 1):
        trainer_step.run.step_count = step  # the window closes at its last step, as in a run
        write.after_step(trainer_step.run, metrics)
      write.flush(trainer_step.run)
      samples.append((time.perf_counter() - start) / log_every)
    writer.close()
  return statistics.median(samples[1:])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  report.add_spread_arguments(parser, rounds=15)
  parser.add_argument("--steps", type=int, default=100, help="steps per loop run")
  parser.add_argument("--log-every", type=int, default=50,
                      help="metrics window (a real run's default is 50; a window ends with a fetch)")
  parser.add_argument("--steps-per-call", type=int, default=10,
                      help="config.steps_per_call of the 'loop, k per call' variant (a divisor of --log-every "
                           "keeps every call whole)")
  parser.add_argument("--models", default=",".join(CASES), help=f"from {', '.join(CASES)}")
  parser.add_argument("--no-readme", action="store_true", help="print only")
  args = parser.parse_args()
  models = [m.strip() for m in args.models.split(",") if m.strip()]
  if not models or any(m not in CASES for m in models):
    parser.error(f"--models takes names from {', '.join(CASES)}, got {args.models!r}")
  if args.rounds < 2 or args.log_every < 1 or args.steps < 2 * args.log_every or args.steps_per_call < 1:
    parser.error("need --rounds >= 2, --log-every >= 1, --steps >= 2 x --log-every and --steps-per-call >= 1")
  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="lbjax-bench-cache-"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

  check = report.SpreadCheck(args.max_spread)
  rate_rows, host_rows = [], []
  for model in models:
    batch_size = CASES[model]
    times = measure(model, batch_size, args)
    host = times.pop("host")
    spreads = {name: report.Spread.of(values) for name, values in times.items()}
    vs_trainer = check.record(f"{model}: loop / trainer step",
                              report.paired_ratios(times, "loop", "trainer step"))
    vs_hand = check.record(f"{model}: loop / hand step",
                           report.paired_ratios(times, "loop", "hand step"))
    vs_plain = check.record(f"{model}: loop / loop without prefetching",
                            report.paired_ratios(times, "loop", "loop, no prefetch"))
    plain_vs_trainer = report.paired_ratios(times, "loop, no prefetch", "trainer step")
    step_places_vs_trainer = check.record(f"{model}: loop, the step placing its batch / trainer step",
                                          report.paired_ratios(times, "loop, step places", "trainer step"))
    call_vs_step = check.record(f"{model}: trainer call of {args.steps_per_call} steps, per step / trainer step",
                                report.paired_ratios(times, "trainer call", "trainer step"))
    unrolled_vs_step = check.record(
        f"{model}: trainer call of {args.steps_per_call} steps unrolled, per step / trainer step",
        report.paired_ratios(times, "trainer call, unrolled", "trainer step"))
    calls_vs_trainer = check.record(f"{model}: loop with {args.steps_per_call} steps per call / trainer step",
                                    report.paired_ratios(times, "loop, k per call", "trainer step"))
    on_device_vs_trainer = check.record(f"{model}: loop with the data on the device / trainer step",
                                        report.paired_ratios(times, "loop, data on device", "trainer step"))
    rate_rows.append([model, batch_size, spreads["hand step"].format(1e3), spreads["trainer step"].format(1e3),
                      spreads["trainer call"].format(1e3), spreads["trainer call, unrolled"].format(1e3),
                      spreads["loop"].format(1e3),
                      spreads["loop, no prefetch"].format(1e3), spreads["loop, step places"].format(1e3),
                      spreads["loop, k per call"].format(1e3), spreads["loop, data on device"].format(1e3),
                      vs_trainer.format(digits=3),
                      plain_vs_trainer.format(digits=3), step_places_vs_trainer.format(digits=3),
                      call_vs_step.format(digits=3),
                      unrolled_vs_step.format(digits=3),
                      calls_vs_trainer.format(digits=3), on_device_vs_trainer.format(digits=3),
                      vs_hand.format(digits=3),
                      vs_plain.format(digits=3)])
    host_rows.append([model, batch_size, f"{1e3 * spreads['trainer step'].median:.2f}"] +
                     [f"{1e3 * host[k]:.3f}" for k in ("next_batch", "global_batch", "k in one call", "k stacked",
                                                       "by index", "as uint8", "lr_scalar", "schedules", "metrics")])
    print(rate_rows[-1], host_rows[-1], flush=True)
  rates = report.markdown_table(
      ["model", "global batch", "hand step ms", "trainer step ms",
       f"trainer call of {args.steps_per_call} steps, ms per step", "the same unrolled, ms per step",
       "loop ms per step",
       "loop without prefetching ms per step", "loop, the step placing its batch, ms per step",
       f"loop, {args.steps_per_call} steps per call, ms per step",
       "loop, data on the device, ms per step", "loop / trainer step", "loop without prefetching / trainer step",
       "loop, the step placing its batch / trainer step",
       f"trainer call of {args.steps_per_call} steps / trainer step", "the same unrolled / trainer step",
       f"loop, {args.steps_per_call} steps per call / trainer step", "loop, data on the device / trainer step",
       "loop / hand step",
       "loop / loop without prefetching"], rate_rows)
  pieces = report.markdown_table(
      ["model", "global batch", "trainer step ms", "next_batch ms", "global_batch ms",
       f"{args.steps_per_call} batches in one call, ms per batch",
       f"{args.steps_per_call} batches stacked, ms per batch", "by index ms", "global_batch as uint8 ms",
       "lr_scalar ms", "schedules ms", "metrics ms"],
      host_rows)
  notes = (
      f"One {jax.devices()[0].device_kind} device, momentum SGD, synthetic twins. Times per step: median over "
      f"{args.rounds} interleaved rounds [first and third quartiles], in ms; ratios: per-round ratios, median "
      f"[quartiles]; above 1 the loop is slower. A loop run takes {args.steps} steps with metrics "
      f"every {args.log_every} steps (the first window dropped), no checkpoint during the run; "
      f"a bare-step round takes {args.steps - args.log_every} steps. Per step the loop takes the batch "
      "a background thread drew and placed during the previous step (on accelerators), starts the next "
      "one's, dispatches the step and waits for the step before the previous one (at most two in "
      "flight); metrics reach the host once per window, fetched one step after it closed (no wait for "
      "the step just dispatched). Without prefetching the loop runs as on CPU devices: the batch is drawn on the main "
      "thread when its step needs it and the step's own call places it (one C++ dispatch; since 2026-11-30, "
      "before, `global_batch` on the main thread). The loop with the step placing its batch draws batch t+1 on the "
      "thread as the loop does (on accelerators) but hands it to the step as numpy arrays, placed by the step's call. "
      "With several steps per call (`config.steps_per_call`) the loop "
      "draws their batches one by one on the host, stacks them and places them in one transfer (since 2026-11-30; "
      "before, one placement per batch), and dispatches one program that scans the steps; the trainer "
      "call times that program alone, called back to back on one placed batch, and unrolled (no loop on "
      "the device) (on CPU devices the call's stacked arrays go to its call as numpy arrays too). Host "
      "pieces are medians of 50 calls each, measured alone (in the loop they overlap the device "
      "work, but on a CPU device they compete with it for the cores). lr_scalar: placing the "
      "learning rate when its value changed (`Run.learning_rate_scalar`; a constant LR, as here, "
      "is placed once). metrics: one window's `train` record (`hooks.WriteMetrics`) per step of the window. "
      f"{args.steps_per_call} batches in one call: the placement of a call's batches in one "
      "`make_array_from_process_local_data` call; stacked: copied into one [k, B, ...] array per input on the "
      "host (`np.stack`) and placed as such (`build.global_call_batches`, what the loop does); both per batch. "
      "By index: the batch's B indices drawn, placed and its rows gathered on the device from the training set "
      "held there (`config.train_data_on_device`, what the loop with the data on the device does per step). "
      "As uint8: the same batch with its float32 inputs as uint8 arrays of "
      "the same shape, a quarter of the bytes (the ResNet's synthetic images are float32; the ImageNet, CIFAR-10 "
      "and, since 2026-11-30, MNIST streams hand over uint8, normalised in the step, so for the MNIST LSTM it is "
      "global_batch again).")
  print(rates + "\n\n" + pieces)
  check.finish(args, "train-loop", "Whole loop vs bare step",
               rates + "\n\nHost work of one loop iteration:\n\n" + pieces + "\n\n" + notes)


if __name__ == "__main__":
  main()
