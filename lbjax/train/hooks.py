"""What happens around the training steps of a `Run`: one small hook per concern.

Each hook's `after_step(run, metrics)` runs after every step (after every call of several steps,
with `config.steps_per_call` > 1: `lbjax.train.step_calls`), in the order `train_and_evaluate` lists
them (records land in `metrics.jsonl` in that order); `acts_at(clock)` says whether it acts after the
step that brings the run to `clock` (reading or saving the state then), where a call must end:

  WriteMetrics      every `log_every` steps, one step late: the `train` record and the progress
                    line, with the health check riding along, the gradient noise scale (from
                    accumulation) and, for layer-wise rates, the `trust_ratio` record
  RecordCompiles    a `compile` record (and a fresh throughput window) when a step was compiled
  Lipschitz         every `lipschitz_every` steps: the curvature along the gradient (papers/001 §4)
  EvaluateAndSave   at every `eval_every_epochs` boundary: evaluation (record, console, best so far)
                    and a checkpoint
  Checkpoint        every `checkpoint_every_steps` steps: a checkpoint
  SaveOnPreemption  on SIGTERM or SIGINT: metrics, a checkpoint on disk, and the loop stops

and `lbjax.train.profiling.Profile` traces a few steps with `jax.profiler` (`config.profile`).

No hook fetches from the device at every step: the metrics of each step stay on the device and
`WriteMetrics` fetches a window of them together, one step after it closed, when they are computed.
(`Run.step` itself waits, without a transfer, for the step before the previous one.)
"""

import math
import os
import signal
import threading
import time
from typing import Any, Callable

from absl import logging
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np

from lbjax import diagnostics
from lbjax import optim
from lbjax.optim.leaf_names import leaf_name
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train.protocols import RunClock, RunView

Metrics = dict[str, jax.Array]


def _flatten(tree: Any) -> dict[str, float]:
  flat = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    name = leaf_name(path)
    values = np.ravel(np.asarray(leaf, np.float64))
    for i, value in enumerate(values):
      if np.isfinite(value):
        flat[name if values.size == 1 else f"{name}[{i}]"] = float(value)
  return flat


def write_compression_bits(writer: MetricsWriter, step: int, params: Any, name: str,
                           compressor: optim.compression.GradientCompressor) -> None:
  """The `compression` record of compressor `name`: bits one device sends per step, compressed and not."""
  bits = optim.compression.bits_per_step(params, compressor)
  writer.write("compression", step, {
      "name": name, "bits_per_device_step": bits.compressed,
      "uncompressed_bits": bits.uncompressed, "ratio": bits.ratio})


class RecordCompiles:
  """A `compile` record (batch size, loss variant, seconds) for each newly compiled step, whose compile time is
  kept out of examples/s (`ProgressLine.exclude`: also where the window holding it has just closed)."""

  def __init__(self, writer: MetricsWriter, progress: ProgressLine):
    self.writer, self.progress = writer, progress

  def acts_at(self, clock: RunClock) -> bool:
    del clock
    return False

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    del metrics
    compiled = run.new_compile
    if compiled is None:
      return
    step = run.step_count - compiled.steps  # the first step it was compiled for
    record = {"batch_size": compiled.batch_size, "discard_fraction": compiled.discard_fraction,
              "seconds": compiled.seconds}
    if compiled.steps > 1:
      record["steps_per_call"] = compiled.steps
    self.writer.write("compile", step, record)
    self.progress.exclude(compiled.ended - compiled.seconds, compiled.ended)


# The steps of a window are stacked on the device `stack_size` at a time (32, or `log_every` when smaller;
# the last run padded with its last step): a few device calls and as many transfers per metric instead
# of one transfer per metric and step (half the host time per step on one CPU device:
# benchmarks/README.md, Findings 5), and one compiled shape per run and set of metric names.
_LONGEST_STACK = 32
_BOUNDARY_TOLERANCE = 1e-9  # in evaluation intervals: far below one step, far above float64's rounding


@jax.jit
def _stack_columns(columns: dict[str, list[jax.Array]]) -> dict[str, jax.Array]:
  return {name: jnp.stack(values) for name, values in columns.items()}


@jax.jit
def _copy(tree: Any) -> Any:
  return jax.tree.map(jnp.copy, tree)


class _Window:
  """The steps of one closed log window, stacked on the device (`_stack_columns`, dispatched when the
  window closes, so it runs between the window's last step and the next), and the run's clock at its end.

  `entries`: (metrics, steps) in step order: one step's metrics (steps 1), or a call's, each metric
  stacked over its `steps` steps (kept as they are)."""

  def __init__(self, run: RunView, entries: list[tuple[Metrics, int]], progress_time: float, layerwise_rates: bool,
               stack_size: int):
    self.progress_time = progress_time
    self.step, self.epoch, self.examples_seen, self.batch_size = (run.step_count, run.epoch, run.examples_seen,
                                                                  run.batch_size)
    self.stacks: list[tuple[dict[str, jax.Array], dict[str, int]]] = []  # (stacked metrics, rows per metric)
    singles: list[Metrics] = []
    for metrics, steps in entries:
      if steps == 1:
        singles.append(metrics)
        continue
      self._stack_singles(singles, stack_size)
      singles = []
      self.stacks.append((metrics, {name: steps for name in metrics}))
    self._stack_singles(singles, stack_size)
    # A copy: the next step donates the optimizer state the ratios live in.
    self.trust_ratios = _copy(optim.trust_ratios(run.state.opt_state)) if layerwise_rates else None

  def _stack_singles(self, metrics: list[Metrics], stack_size: int) -> None:
    """Stacks single steps' metrics `stack_size` at a time (the last run padded with its last step)."""
    columns = {name: [m[name] for m in metrics if name in m] for name in dict.fromkeys(k for m in metrics for k in m)}
    for start in range(0, max(map(len, columns.values()), default=0), stack_size):
      chunk = {name: values[start:start + stack_size] for name, values in columns.items() if len(values) > start}
      self.stacks.append((_stack_columns(
          {name: values + values[-1:] * (stack_size - len(values)) for name, values in chunk.items()}),
          {name: len(values) for name, values in chunk.items()}))

  def fetch(self) -> tuple[dict[str, np.ndarray], Any]:
    """Every metric's values over the window's steps that report it, in step order (one transfer per
    stack and metric), and the trust ratios."""
    stacks, trust_ratios = jax.device_get(([stack for stack, _ in self.stacks], self.trust_ratios))
    values: dict[str, list[np.ndarray]] = {}
    for stack, (_, rows) in zip(stacks, self.stacks):
      for name, count in rows.items():
        values.setdefault(name, []).append(stack[name][:count])
    return {name: np.concatenate(parts) for name, parts in values.items()}, trust_ratios


class WriteMetrics:
  """Every `log_every` steps (and at every `flush`): the `train` record (means over the steps; the
  latest learning rate; the gradient noise scale when the step accumulates), the progress line, and
  trust ratios for layer-wise rates, after a health check.

  A window closed at step N is fetched (one transfer) at step N + 1, once `Run.step` has dispatched
  step N + 1 and waited for step N: the transfer finds its values computed and the device busy with
  the next step, where fetching at step N would wait for step N with nothing queued behind it. The
  health check reads the values fetched: a non-finite loss or update norm (a step the compiled step
  refused) asks `Run.check_health` for the first non-finite quantity and stops the run, before the
  window is written. `flush` fetches every step not yet written (waiting for the device). With several
  steps per call, the same one call later; a window ends where a call ends (`acts_at`).
  """

  def __init__(self, writer: MetricsWriter, progress: ProgressLine, log_every: int, *, layerwise_rates: bool):
    """`layerwise_rates`: the optimizer state holds layer-wise trust ratios (`StepParts.has_layerwise_rates`)."""
    self.writer, self.progress, self.log_every, self.layerwise_rates = writer, progress, log_every, layerwise_rates
    self._pending: list[tuple[Metrics, int]] = []  # the open window: (metrics, steps) of each step or call
    self._closed: _Window | None = None  # closed at the previous step, not yet fetched

  def acts_at(self, clock: RunClock) -> bool:
    return clock.step_count % self.log_every == 0

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    if self._closed is not None:
      self._write(run, self._closed)
      self._closed = None
    self._pending.append((metrics, run.latest_call_steps))
    if self.acts_at(run):
      self._closed = self._close(run)
  def flush(self, run: RunView) -> None:
    """Writes the steps not yet written (raises `NonFiniteError` if one of them went bad)."""
    if self._closed is not None:
      self._write(run, self._closed)
      self._closed = None
    if self._pending:
      self._write(run, self._close(run))

  def _close(self, run: RunView) -> _Window:
    window = _Window(run, self._pending, time.perf_counter(), self.layerwise_rates,
                     stack_size=min(_LONGEST_STACK, self.log_every))
    self._pending = []
    return window

  def _write(self, run: RunView, window: _Window) -> None:
    values, trust_ratios = window.fetch()
    if not (np.all(np.isfinite(values["loss"])) and np.all(np.isfinite(values["update_norm"]))):
      run.check_health()  # raises NonFiniteError, naming the first non-finite quantity
    # Each metric averaged over the steps that report it: a batch-size schedule can put steps that
    # accumulate micro-batches (with the noise-scale ingredients) and steps that do not in one window
    # (the any-batch step reports nan ingredients for one micro-batch).
    reported = {name: column[~np.isnan(column)] if name.startswith("noise_scale_") else column
                for name, column in values.items() if name != "learning_rate"}
    record = {name: float(np.mean(column)) for name, column in reported.items() if column.size}
    record["learning_rate"] = float(values["learning_rate"][-1])
    if "noise_scale_grad_norm_sq" in record:  # a ratio of averages, as McCandlish et al. advise
      record["gradient_noise_scale"] = float(diagnostics.simple_noise_scale(diagnostics.NoiseScaleEstimate(
          record["noise_scale_grad_norm_sq"], record["noise_scale_trace_sigma"])))
    record["examples_per_second"] = self.progress.show(window.step, window.epoch, window.examples_seen,
                                                       record["loss"], record["learning_rate"], window.batch_size,
                                                       now=window.progress_time)
    record.update(epoch=window.epoch, examples_seen=window.examples_seen, batch_size=window.batch_size)
    if getattr(run.stream, "undecodable_skipped", 0):  # records skipped so far (data_options.skip_undecodable)
      record["undecodable_skipped"] = run.stream.undecodable_skipped
    self.writer.write("train", window.step, record)
    if trust_ratios is not None:
      self.writer.write("trust_ratio", window.step, _flatten(trust_ratios))


class Lipschitz:
  """Every `every` steps (0: never), the `lipschitz` record: L along the gradient (papers/001 §4)."""

  def __init__(self, writer: MetricsWriter, every: int):
    self.writer, self.every = writer, every

  def acts_at(self, clock: RunClock) -> bool:
    return bool(self.every) and clock.step_count % self.every == 0

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    del metrics
    if self.acts_at(run):
      self.writer.write("lipschitz", run.step_count, {"lipschitz": run.lipschitz(), "epoch": run.epoch,
                                                      "batch_size": run.batch_size})


class EvaluateAndSave:
  """At each multiple of `every_epochs` before the end: the metrics so far, an evaluation (record,
  console line, best so far) and a checkpoint, so an interrupted run loses at most that much."""

  def __init__(self, writer: MetricsWriter, progress: ProgressLine, flush: Callable[[RunView], None],
               every_epochs: float, start_epoch: float, *, num_epochs: float, eval_split: str, num_steps: int = 0):
    """`num_epochs`, `num_steps` (when > 0): the run's length (no evaluation at its end: the loop evaluates
    then); `eval_split`: the split evaluated, for the console."""
    self.writer, self.progress, self.flush, self.every_epochs = writer, progress, flush, every_epochs
    self.num_epochs, self.num_steps, self.eval_split = num_epochs, num_steps, eval_split
    self.next_boundary = self._boundary_after(start_epoch)
    self.last: dict[str, float] = {}  # the latest evaluation
    self.best: dict[str, float] = {}  # the best (accuracy, else loss) so far

  def _boundaries(self, epoch: float) -> float:
    """`epoch` in multiples of `every_epochs`, a hair above where floating point puts a boundary below
    itself (0.3 / 0.1 is 2.9999999999999996)."""
    return epoch / self.every_epochs + _BOUNDARY_TOLERANCE

  def _boundary_after(self, epoch: float) -> int:
    return math.floor(self._boundaries(epoch)) + 1

  def acts_at(self, clock: RunClock) -> bool:
    ends = clock.trained_epochs >= self.num_epochs or 0 < self.num_steps <= clock.step_count
    return self._boundaries(clock.epoch) >= self.next_boundary and not ends

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    del metrics
    if self.acts_at(run):
      self.flush(run)
      self.evaluate(run)
      self.next_boundary = self._boundary_after(run.epoch)
      run.save()
      self.progress.reset_window(run.examples_seen, run.epoch, run.step_count)

  def evaluate(self, run: RunView, **extra) -> dict[str, float]:
    """Evaluates the run now and records it: metrics file, console line, best so far."""
    metrics = run.evaluate()
    self.writer.write("eval", run.step_count, dict(metrics, epoch=run.epoch, **extra))
    self.progress.evaluation(run.step_count, run.epoch, metrics, self.eval_split)
    self._record(metrics)
    return metrics

  def recall(self, evaluations: list[tuple[int, dict[str, float]]], step: int | None) -> None:
    """On a resume from `step`: `evaluations`, the `(step, metrics)` the run recorded up to it, count
    for the best so far, and the one at `step` (if any) is the latest."""
    for _, metrics in evaluations:
      self._record(metrics)
    self.last = evaluations[-1][1] if evaluations and evaluations[-1][0] == step else {}

  def _record(self, metrics: dict[str, float]) -> None:
    key, better = ("accuracy", max) if "accuracy" in metrics else ("loss", min)
    if not self.best or better(metrics[key], self.best[key]) == metrics[key]:
      self.best = dict(metrics)
    self.last = metrics


class Checkpoint:
  """Every `every_steps` steps (0: never), a checkpoint (none twice for one step), after the metrics of the
  steps it holds are written (`flush`): a run killed before the next record would otherwise lose them for
  good, since a resume keeps the records up to the checkpoint's step and redoes only the steps after it."""

  def __init__(self, every_steps: int, flush: Callable[[RunView], None]):
    self.every_steps, self.flush = every_steps, flush

  def acts_at(self, clock: RunClock) -> bool:
    return bool(self.every_steps) and clock.step_count % self.every_steps == 0

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    del metrics
    if self.acts_at(run):
      self.flush(run)
      run.save()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _as_sigterm(signum, frame) -> None:
  """A Ctrl-C in a process of a multi-process run: the SIGTERM that JAX's preemption service acts on."""
  del signum, frame
  os.kill(os.getpid(), signal.SIGTERM)


class PreemptionFlag:
  """Whether a SIGTERM or SIGINT (Ctrl-C) asks the run to save and stop, read at step boundaries.

  One process: a Python handler for both signals sets a flag; a second signal while the run is
  stopping says that the checkpoint is being written and that it waits for it (the handlers stay
  installed until the checkpoint is on disk, so no signal can cut a save short). Several processes
  must stop at the same step (a process that stops alone leaves the others waiting in the next
  collective): there JAX's preemption service catches SIGTERM on any host, and
  `reached_preemption_sync_point(step)` turns true on every host at the same step. The service knows
  no SIGINT, which would raise KeyboardInterrupt in the middle of a step of one process only: a Ctrl-C
  is turned into a SIGTERM to this process (the only Python handler installed there).
  """

  def __init__(self):
    self._event = threading.Event()
    self._previous: dict[int, Any] = {}
    self.signal_name: str | None = None
    self._multi_process = jax.process_count() > 1
    self._preemption_service = bool(jax.config.jax_enable_preemption_service)
    on_main_thread = threading.current_thread() is threading.main_thread()
    if self._multi_process:
      if not self._preemption_service:
        logging.warning("jax_enable_preemption_service is off: a SIGTERM will kill this process "
                        "without a checkpoint and leave the others waiting; the last periodic "
                        "checkpoint is what a restart resumes from.")
      elif on_main_thread:
        self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, _as_sigterm)
    elif on_main_thread:
      for signum in STOP_SIGNALS:
        self._previous[signum] = signal.signal(signum, self._handle)

  def _handle(self, signum, frame) -> None:
    del frame
    if self._event.is_set():
      os.write(2, f"{signal.Signals(signum).name} again: the run is saving its checkpoint and exits once it is "
                  "written.\n".encode())
      return
    self.signal_name = signal.Signals(signum).name
    self._event.set()

  def should_stop(self, boundary: int) -> bool:
    """Whether to stop at the `boundary`-th step boundary checked (1, 2, ... on every process alike:
    JAX's sync point is the step id after the largest any process reported, so the ids go up by one)."""
    if self._multi_process:
      if self._preemption_service and multihost_utils.reached_preemption_sync_point(boundary):
        self.signal_name = "preemption"
        return True
      return False
    return self._event.is_set()

  def restore(self) -> None:
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}


class SaveOnPreemption:
  """On SIGTERM or SIGINT (`PreemptionFlag`), at the next step boundary (the next call's end, with
  several steps per call): the metrics so far and a checkpoint, logged as saved once it is on disk;
  then `stopped` is True and the loop ends. Construction installs the handlers; `restore` removes them
  (after the run has closed)."""

  def __init__(self, flush: Callable[[RunView], None], *, checkpoint_directory: Any, announce: bool):
    """`checkpoint_directory`: where the run's checkpoints go (None without a workdir); `announce`:
    print the exit on the console (process 0, with `config.progress`)."""
    self.flush, self.checkpoint_directory, self.announce = flush, checkpoint_directory, announce
    self.stopped = False
    self._flag = PreemptionFlag()
    self._boundaries = 0  # step boundaries checked

  def acts_at(self, clock: RunClock) -> bool:
    del clock  # a signal comes when it comes: the run stops at the end of the call it interrupts
    return False

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    del metrics
    if run.drawn_ahead:  # between the single steps of one draw: the stream is past their batches
      return
    self._boundaries += 1
    if self._flag.should_stop(self._boundaries):
      self.flush(run)
      run.save(durable=True)
      self.stopped = True
      where = f" in {self.checkpoint_directory}" if self.checkpoint_directory is not None else ""
      logging.warning("%s: saved checkpoint %d%s (written to disk); exiting.", self._flag.signal_name,
                      run.step_count, where)
      if self.announce:
        print(f"{self._flag.signal_name}: saved checkpoint {run.step_count}{where}; exiting.", flush=True)

  def restore(self) -> None:
    self._flag.restore()
