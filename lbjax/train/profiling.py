"""`config.profile`: a `jax.profiler` trace of a few training steps, and how busy the device was in them.

With `profile.num_steps = n > 0`, each session of a run (a start or a resume) skips `profile.skip_steps`
steps (compilation and warm-up), then traces the next `n` with `jax.profiler` into `<workdir>/profile`
(`<workdir>/profile/process_<i>` for each process of a multi-process run): TensorBoard's profile plugin
or XProf (`xprof --logdir <workdir>/profile`) open it, and with `profile.perfetto_trace` also
ui.perfetto.dev (`perfetto_trace.json.gz`). Each step (each device call, with `config.steps_per_call`)
is a `jax.profiler.StepTraceAnnotation("train", step_num=...)`, XProf's steps. The device is waited for
before the trace starts and before it stops, so the trace holds exactly the traced steps' work.

The `profile` record (`metrics.jsonl`, process 0) gives the traced steps, their wall time per step, and
the device's busy time per step read back from the trace (`lbjax.train.trace_analysis`). A device is
idle between kernels even when fed (a GPU's launch gaps, the CPU runtime's work between XLA's thunks),
so the busy fraction reads against the bare step's, traced the same way (`benchmarks/loop_trace.py`); what
the loop's lacks of it is the host's (dispatch, input, hooks). A trace that cannot start (another one
runs in the process, e.g. a notebook's `jax.profiler.start_trace`), or a session that ends before its
trace starts, is a warning and a `profile` record saying so; the run goes on.
"""

import contextlib
import dataclasses
import pathlib
import time

from absl import logging
import jax
import ml_collections

from lbjax.train import trace_analysis
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train.protocols import RunClock, RunView

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class TraceRequest:
  """`config.profile`: trace `num_steps` steps (0: none) after `skip_steps` steps of each session; with
  `python_calls`, every Python call too (jax's Python tracer); with `perfetto_trace`, also a Perfetto file."""
  num_steps: int
  skip_steps: int
  python_calls: bool
  perfetto_trace: bool

  def describe(self) -> str:
    if not self.num_steps:
      return "off"
    return (f"{self.num_steps} steps traced after the first {self.skip_steps} of each session"
            + (", Python calls included" if self.python_calls else "")
            + (", with a Perfetto trace" if self.perfetto_trace else ""))

  def options(self) -> jax.profiler.ProfileOptions:
    """jax's profiler options: its Python tracer on only with `python_calls`."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = int(self.python_calls)
    return options


def problems(profile: ml_collections.ConfigDict) -> list[str]:
  """What is wrong with `config.profile`'s fields (before any compute)."""
  found = []
  for name in ("num_steps", "skip_steps"):
    value = profile[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
      found.append(f"config.profile.{name} must be an integer >= 0, got {value!r}"
                   + (" (0 = no trace)." if name == "num_steps" else " (steps of each session before the trace)."))
  for name in ("python_calls", "perfetto_trace"):
    if not isinstance(profile[name], bool):
      found.append(f"config.profile.{name} must be True or False, got {profile[name]!r}.")
  return found


def trace_directory(workdir: pathlib.Path, process_index: int, process_count: int) -> pathlib.Path:
  """Where this process writes its trace."""
  return workdir / "profile" / (f"process_{process_index}" if process_count > 1 else "")


class Profile:
  """The hook that traces `request.num_steps` steps after the first `request.skip_steps` of this session.

  `after_step` starts the trace after step `skip_steps` of the session (`begin(run)` before its first step
  when that is 0). The loop runs each step (or device call) and its hooks inside `annotate(run)`: while
  the trace runs, a `StepTraceAnnotation` of the step, and the trace stops when the annotation of its
  last step has ended (so that it holds that annotation too). `close(run)` stops a trace the run left
  running (it ended or stopped before the last traced step)."""

  def __init__(self, request: TraceRequest, writer: MetricsWriter, progress: ProgressLine, directory: pathlib.Path,
               *, platform: str, start_step: int, read_back: bool, announce: bool):
    """`progress`: the time the profiler takes to start, and to write and read back the trace, is kept out of
    its examples/s (the waits for the device around the trace and the traced steps, slower, are not);
    `platform`: the run's devices' ("cpu", "gpu", "tpu"), whose kernels the trace is read for; `start_step`: the
    run's step count when this session began; `read_back`: read the device's busy time back from the trace for
    the `profile` record (the process that writes records); `announce`: print where the trace went (process 0,
    with `config.progress`)."""
    self.request, self.writer, self.progress, self.directory = request, writer, progress, directory
    self.platform, self.read_back, self.announce = platform, read_back, announce
    self.first = start_step + request.skip_steps  # the trace starts after this step
    self.last = self.first + request.num_steps  # and stops after this one
    self._started_at: tuple[int, float] | None = None  # (step count, perf_counter) when the trace began
    self._done = not request.num_steps

  def acts_at(self, clock: RunClock) -> bool:
    """A device call ends where the trace starts and where it stops."""
    return bool(self.request.num_steps) and clock.step_count in (self.first, self.last)

  def annotate(self, run: RunView):
    """While the trace runs, the next step's `StepTraceAnnotation`, which stops the trace after the last
    traced step; else nothing."""
    if self._started_at is None:
      return contextlib.nullcontext()
    return _TracedStep(self, run)

  def begin(self, run: RunView) -> None:
    """Before the session's first step: starts the trace there when `skip_steps` is 0."""
    if not self._done and run.step_count == self.first:
      self._start(run, run.state)

  def after_step(self, run: RunView, metrics: Metrics) -> None:
    if not self._done and self._started_at is None and self.first <= run.step_count < self.last:
      self._start(run, metrics)

  def close(self, run: RunView) -> None:
    """Stops the trace if it still runs (the run ended or stopped before its last traced step); says so
    when the session ended before its trace would have started."""
    if self._started_at is not None:
      self._stop(run)
    elif not self._done:
      self._done = True
      self._note(run, f"config.profile: no steps traced: this session ended after step {run.step_count}, before "
                      f"step {self.first + 1}, where its trace would have started (profile.skip_steps="
                      f"{self.request.skip_steps}). Lower profile.skip_steps or train longer.")

  def _start(self, run: RunView, computed) -> None:
    jax.block_until_ready(computed)  # the steps before the trace stay out of it
    began = time.perf_counter()
    self.directory.mkdir(parents=True, exist_ok=True)
    try:
      jax.profiler.start_trace(str(self.directory), create_perfetto_trace=self.request.perfetto_trace,
                               profiler_options=self.request.options())
    except RuntimeError as error:  # a trace already runs in this process
      self._done = True
      self._note(run, f"config.profile: no trace of this run's steps: jax.profiler could not start one ({error}). "
                      "A trace started outside the run (jax.profiler.start_trace) holds them; stop it first "
                      "(jax.profiler.stop_trace()) for a trace of the run's own.")
      return
    self._started_at = (run.step_count, time.perf_counter())
    self.progress.exclude(began, self._started_at[1])

  def _stop(self, run: RunView) -> None:
    jax.block_until_ready(run.state)  # the traced steps' device work is in the trace
    started_step, started = self._started_at
    began = time.perf_counter()
    seconds = began - started
    self._started_at, self._done = None, True
    jax.profiler.stop_trace()
    steps = run.step_count - started_step
    if not steps:
      self._note(run, f"config.profile: no steps traced: the run ended at step {run.step_count}, where its trace "
                      "started. Lower profile.skip_steps or train longer.")
      return
    record = {"first_step": started_step + 1, "steps": steps, "directory": str(self.directory),
              "wall_ms_per_step": 1e3 * seconds / steps}
    if self.read_back:
      record.update(self._device_time(steps, seconds))
    self.writer.write("profile", run.step_count, record)
    if self.announce:
      busy_text = (f", the device busy {record['device_busy_ms_per_step']:.3g} ms of it "
                   f"({100 * record['device_busy_fraction']:.0f}%)" if "device_busy_fraction" in record else
                   f"; device time {record['device_time']}")
      print(f"Traced steps {started_step + 1}-{run.step_count} into {self.directory}: "
            f"{record['wall_ms_per_step']:.3g} ms per step{busy_text}.", flush=True)
    self.progress.exclude(began, time.perf_counter())

  def _device_time(self, steps: int, seconds: float) -> dict[str, object]:
    """The `profile` record's fields read back from the trace file: the device's busy time, or why not."""
    trace_file = trace_analysis.latest_trace_file(self.directory)
    if trace_file is None:
      return {"device_time": f"not read: no trace file under {self.directory}"}
    try:
      busy = trace_analysis.read_device_busy(trace_file, self.platform)
    except Exception as error:  # pylint: disable=broad-except  # the trace is written; only its reading failed
      return {"trace": str(trace_file), "device_time": f"not read: {type(error).__name__}: {error}"}
    if busy is None:
      return {"trace": str(trace_file), "device_time": f"not in the trace: no {self.platform} kernels recorded" + (
          " (on GPUs the profiler needs NVIDIA's CUPTI library, e.g. the nvidia-cuda-cupti wheel)"
          if self.platform == "gpu" else "")}
    return {"trace": str(trace_file), **busy.per_step(steps, seconds)}

  def _note(self, run: RunView, message: str) -> None:
    """A trace that could not be taken: a warning and a `profile` record with `error`."""
    logging.warning("%s", message)
    self.writer.write("profile", run.step_count, {"error": message})


class _TracedStep:
  """One traced step's (or call's) annotation; on leaving it after the last traced step, the trace stops."""

  def __init__(self, profile: Profile, run: RunView):
    self.profile, self.run = profile, run
    self.annotation = jax.profiler.StepTraceAnnotation("train", step_num=run.step_count + 1)

  def __enter__(self):
    self.annotation.__enter__()

  def __exit__(self, *exception):
    self.annotation.__exit__(*exception)
    if self.run.step_count >= self.profile.last:
      self.profile.close(self.run)
