"""Batch t+1 drawn from the training stream and placed on the devices while step t runs.

`PrefetchingStream` wraps a run's training stream. After the trainer takes the batch of step t
(`next_prepared(size)`), `prefetch(size)` hands the draw of the next batch and its preparation (the
carry-reset flag, the host -> device placement) to one background thread, so they overlap step t on
the device and the hooks on the host instead of following them.

Its guarantees:
- The stream position. `epoch()` and `get_state()` report the position after the batches handed out
  by `next_prepared`/`next_batch` (consumed by steps), never after a batch merely prefetched: a
  checkpoint records where the next step's batch starts, and a resumed run draws the same batches.
  So does the stream's count of skipped records (`undecodable_skipped`), which a draw raises: a
  prefetched batch's skips count once its step takes it, and a dropped batch's not at all.
  The wrapped stream is read only by the thread while a batch is in flight; the position is a
  snapshot taken before the thread starts.
- The batches. They are drawn in the same order and with the same sizes as without prefetching: a
  prefetched batch of another size than the one asked for is dropped and the stream rewound to the
  consumed position before the draw (`set_state`), so a wrong guess costs time, never correctness.
  The trainer asks only for sizes already decided (`decided_next_batch_size`): under the adaptive
  batch policy the batch after a decision step depends on that step's result, and there nothing is
  prefetched (the batch is drawn when it is needed, as without prefetching).
- Errors. An error of a prefetched draw (missing file, corrupt JPEG) is raised by the
  `next_prepared` that takes the batch, as the synchronous draw would have raised it; a batch that
  no step takes (the run ended, stopped or failed) is dropped with its error.
- Where it runs. Only where the batches go to accelerators (`overlaps_placement`): on CPU devices the
  placement is a copy within the same memory and the step computes on the very cores the thread
  would use, so there the batch is drawn and placed when its step needs it, as without prefetching.
- The thread's life. `close()` waits for the batch in flight (one draw at most) and ends the thread;
  `Run.close` calls it, so the thread ends with the run on every path out of the loop (end of data,
  SIGTERM/SIGINT, a non-finite stop, any exception).
"""

from collections.abc import Callable
import concurrent.futures
from typing import Any, Generic, NamedTuple, TypeVar

import jax

from lbjax.train import protocols

Prepared = TypeVar("Prepared")


class _InFlight(NamedTuple):
  size: int
  epoch: float  # the consumed position when the draw started
  state: Any
  undecodable_skipped: int | None  # the wrapped stream's count then (None: it keeps none)
  start_epoch: float  # where the batch starts (`RelayingWindowStream.start_epoch`; the consumed position for others)
  future: concurrent.futures.Future


class PrefetchingStream(Generic[Prepared]):
  """A training stream whose next batch is drawn and prepared on a background thread.

  Stream interface (`num_examples`, `epoch`, `get_state`, `set_state`, `next_batch`, and every other
  attribute of the wrapped stream, e.g. `undecodable_skipped`) at the consumed position, plus
  `next_prepared`, `prefetch` and `close`. Made by `prefetching`, which keeps a `WindowStream` one.
  """

  def __init__(self, stream: Any, prepare: Callable[[dict[str, Any], int], Prepared]):
    """Wraps `stream` at its current position.

    Args:
      stream: a training stream (`next_batch(size)`, `epoch()`, `get_state()`, `set_state(state)`).
      prepare: `prepare(host_batch, size)`, what the trainer needs of a drawn batch (e.g. its
        placed arrays); runs on the background thread for a prefetched batch, so it must touch
        nothing the main thread changes meanwhile.
    """
    self._stream = stream
    # Set here, not forwarded by `__getattr__`: Python >= 3.12 checks `isinstance(x, TrainStream)`
    # with `inspect.getattr_static`, which never calls `__getattr__`.
    self.num_examples = stream.num_examples
    self._prepare = prepare
    self._in_flight: _InFlight | None = None
    self._executor: concurrent.futures.ThreadPoolExecutor | None = None

  def __getattr__(self, name: str) -> Any:
    if name.startswith("_"):  # not forwarded (and no recursion before `_stream` is set)
      raise AttributeError(name)
    return getattr(self._stream, name)

  def epoch(self) -> float:
    """The consumed position in epochs (that of the next batch to hand out)."""
    return self._in_flight.epoch if self._in_flight is not None else self._stream.epoch()

  def get_state(self) -> Any:
    """The wrapped stream's state at the consumed position (what a checkpoint records)."""
    return self._in_flight.state if self._in_flight is not None else self._stream.get_state()

  @property
  def undecodable_skipped(self) -> int:
    """The records the wrapped stream skipped in the batches handed out (AttributeError if it counts none)."""
    if self._in_flight is not None and self._in_flight.undecodable_skipped is not None:
      return self._in_flight.undecodable_skipped
    return self._stream.undecodable_skipped

  def set_state(self, state: Any) -> None:
    """Drops the batch in flight and restores the wrapped stream's `state`."""
    self._drop_in_flight()
    self._stream.set_state(state)

  def next_batch(self, size: int) -> dict[str, Any]:
    """The next host batch of `size`, drawn now (a batch in flight is dropped first)."""
    self._drop_in_flight()
    return self._stream.next_batch(size)

  def next_prepared(self, size: int) -> Prepared:
    """The next batch of `size`, prepared: the prefetched one when it has that size (waiting for it
    if it is still being drawn; its error, if any, is raised here), else drawn and prepared now."""
    in_flight = self._in_flight
    if in_flight is not None and in_flight.size == size:
      self._in_flight = None
      return in_flight.future.result()
    self._drop_in_flight()
    return self._prepare(self._stream.next_batch(size), size)

  def prefetch(self, size: int | None) -> None:
    """Starts drawing and preparing the batch of `size` that follows those handed out (None: nothing
    to prefetch, e.g. a size not yet decided)."""
    self._drop_in_flight()
    if size is None:
      return
    if self._executor is None:
      self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lbjax-prefetch")
    epoch, state = self._stream.epoch(), self._stream.get_state()
    skipped = getattr(self._stream, "undecodable_skipped", None)
    start = self._stream.start_epoch(size) if isinstance(self._stream, protocols.RelayingWindowStream) else epoch
    self._in_flight = _InFlight(size, epoch, state, skipped, start, self._executor.submit(self._draw, size))

  def _draw(self, size: int) -> Prepared:
    return self._prepare(self._stream.next_batch(size), size)

  def _drop_in_flight(self) -> None:
    """Waits for the batch in flight, drops it (and its error) and rewinds the stream to the
    consumed position."""
    in_flight, self._in_flight = self._in_flight, None
    if in_flight is None:
      return
    concurrent.futures.wait([in_flight.future])
    self._stream.set_state(in_flight.state)
    if in_flight.undecodable_skipped is not None:
      self._stream.undecodable_skipped = in_flight.undecodable_skipped

  def close(self) -> None:
    """Drops the batch in flight, ends the background thread and closes the wrapped stream where it can be
    (`WorkerTrainStream`'s worker processes). The stream stays usable: a later `prefetch` starts a new thread,
    a later draw new workers."""
    try:
      self._drop_in_flight()
    finally:
      if self._executor is not None:
        self._executor.shutdown(wait=True)
        self._executor = None
      getattr(self._stream, "close", lambda: None)()


def overlaps_placement(mesh: Any) -> bool:
  """Whether placing a batch on `mesh`'s devices can overlap their step: they are accelerators."""
  return any(device.platform != "cpu" for device in mesh.devices.flat)


def step_places_batches(mesh: Any) -> bool:
  """Whether the trainer hands each batch to the compiled step as numpy arrays, which the step's call places
  in its C++ dispatch (`Run.step_places_batches`): on one process of CPU devices, where no thread places
  batches ahead and `jax.device_put`'s Python would cost more than the call's placement."""
  return jax.process_count() == 1 and not overlaps_placement(mesh)


def decided_next_batch_size(run: Any) -> int | None:
  """The size of the batch after the one just handed out for step `run.step_count + run.drawn_ahead`,
  when it is decided now and worth prefetching (`overlaps_placement`); None when it is not, or when
  that step ends the run.

  "fixed" and "schedule": the schedule at the consumed position. "adaptive": the batch in force,
  unless that step is a decision step (`config.batch.adapt_every`), whose result chooses the next size.
  """
  resolved, policy = run.resolved, run.batch_policy
  step = run.step_count + run.drawn_ahead
  if not overlaps_placement(run.mesh) or 0 < resolved.num_steps <= step:
    return None
  if policy.policy != "adaptive":
    epoch, size = protocols.next_batch_start(run.stream, policy.batch_size)
    # A batch that starts a later epoch than the stream's position is drawn after `Run` ends the epoch.
    return None if epoch >= resolved.num_epochs or epoch != run.stream.epoch() else size
  return None if step % policy.every == 0 else policy.current


class PrefetchingWindowStream(PrefetchingStream[Prepared]):
  """A `PrefetchingStream` of a `protocols.WindowStream`, and a `RelayingWindowStream` itself (`isinstance`
  holds on every Python, so the trainer counts an epoch in windows, not tokens); a wrapped stream that does not
  relay has its batches start at the consumed position."""

  def windows_per_epoch(self, global_batch_size: int) -> int:
    """The wrapped stream's batches of one epoch at `global_batch_size` rows."""
    return self._stream.windows_per_epoch(global_batch_size)

  def start_epoch(self, global_batch_size: int) -> float:
    """Where the next batch of `global_batch_size` rows starts, from the consumed position: the prefetched
    batch's start if it has that size (else it is dropped first)."""
    in_flight = self._in_flight
    if in_flight is not None and in_flight.size == global_batch_size:
      return in_flight.start_epoch
    self._drop_in_flight()
    if isinstance(self._stream, protocols.RelayingWindowStream):
      return self._stream.start_epoch(global_batch_size)
    return self._stream.epoch()

  def end_epoch(self) -> None:
    """Drops the batch in flight and ends the wrapped stream's epoch at the consumed position."""
    self._drop_in_flight()
    self._stream.end_epoch()


def prefetching(stream: Any, prepare: Callable[[dict[str, Any], int], Prepared]) -> PrefetchingStream[Prepared]:
  """`stream` wrapped for prefetching, with every protocol of `lbjax.train.protocols` it follows."""
  if isinstance(stream, protocols.WindowStream):
    return PrefetchingWindowStream(stream, prepare)
  return PrefetchingStream(stream, prepare)
