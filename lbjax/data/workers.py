"""Training and evaluation batches computed on worker processes (grain `MapDataset` + `mp_prefetch`).

JPEG decoding and augmentation hold the GIL for part of their time, so threads stop scaling after
one or two cores; worker processes do not share a GIL. `WorkerTrainStream` wraps a `TrainStream`
and computes its batches ahead of time on `num_workers` grain worker processes:

    grain.MapDataset.range(num_batches)                    # batch j of the current run of equal sizes
        .map(lambda j: stream.batch_at(start + j * B, B))  # this process's share, decoded + augmented
        .to_iter_dataset(no read threads)
        .mp_prefetch(MultiprocessingOptions(num_workers))  # worker w computes batches w, w + W, ...

Batch `j` is a pure function of the stream's seed and position (`TrainStream.batch_at`: the
epoch permutation and `example_rngs(seed, position)`), so a batch is bit-identical with 0, 1 or
any number of workers, for any number of hosts, and after a resume.

The checkpoint state is the `TrainStream`'s (`examples_consumed`), not grain's iterator state: the
position of a `MapDataset` iterator is exactly `examples_consumed` here, but the pipeline is
rebuilt whenever the batch size changes (batch-size schedules change it mid-epoch), grain's state
would describe one pipeline of one process, and the one integer restores with any number of
processes and workers. Restoring rebuilds the pipeline at that position (exact mid-epoch resume).
"""

from collections.abc import Iterator, Mapping
import functools
import numbers
from typing import Any

import numpy as np

from lbjax.data import stream as stream_lib
from lbjax.data.sharding import process_slice

# Upper bound on the batches of one pipeline (a MapDataset needs a length); ~10^15 examples.
_MAX_BATCHES = 2**40


def check_num_workers(num_workers: Any) -> int:
  """`num_workers` as an int >= 0 (0: compute batches in the calling process)."""
  if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral):
    raise TypeError(f"num_workers must be a non-negative integer, got {num_workers!r}.")
  if num_workers < 0:
    raise ValueError(f"num_workers must be >= 0 (0 computes batches in this process), got "
                     f"{num_workers}.")
  return int(num_workers)


def _grain():
  """The grain module, with absl flags marked parsed: grain >= 0.2.12 reads its profiling flag's
  default when it starts workers, which absl refuses before flags are parsed (programs that do not
  use `absl.app`, tests). Marking them parsed keeps every flag at its default."""
  try:
    import grain  # pylint: disable=g-import-not-at-top
    from absl import flags  # pylint: disable=g-import-not-at-top
  except ImportError as err:
    raise ImportError("Worker processes need grain: pip install 'lbjax[tfds]'.") from err
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  return grain


def _batch_at(stream: stream_lib.TrainStream, start: int, global_batch_size: int,
              batch: int) -> tuple[stream_lib.Batch, int] | stream_lib.UndecodableRecordError:
  try:
    return stream.batch_and_skipped(start + batch * global_batch_size, global_batch_size)
  except stream_lib.UndecodableRecordError as e:
    return e  # handed over as the element and raised by the main process (`_raised`)


def _raised(element: Any) -> Any:
  """A worker's element, or its `UndecodableRecordError` raised here. The error travels as the element: grain
  before 0.2.12 hands a worker's exception back only as the text of a `RemoteWorkerError`."""
  if isinstance(element, stream_lib.UndecodableRecordError):
    raise element
  return element


def _prefetch_on_workers(dataset, num_workers: int, buffer_size: int) -> Iterator[Any]:
  """Iterator over a MapDataset whose elements are computed on `num_workers` processes."""
  grain = _grain()
  options = grain.multiprocessing.MultiprocessingOptions(num_workers=num_workers,
                                         per_worker_buffer_size=buffer_size)
  read_options = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
  return iter(dataset.to_iter_dataset(read_options).mp_prefetch(options))


def _plain_arrays(batch: Mapping[str, Any]) -> stream_lib.Batch:
  """The batch as plain `np.ndarray`s (views, no copy): grain hands out its shared-memory array
  subclass, which older NumPy-facing code (e.g. NumPy 2.0's testing with grain 0.2.9) warns about."""
  return {key: np.asarray(value) for key, value in batch.items()}


def _close(iterator: Any) -> None:
  """Stops a grain iterator's workers (grain >= 0.2.12 has `close`; older ones stop when dropped)."""
  close = getattr(iterator, "close", None)
  if close is not None:
    close()


class WorkerTrainStream:
  """A `TrainStream` whose batches are computed ahead on grain worker processes.

  Same interface and state as `TrainStream` (`next_batch`, `get_state`, `set_state`, `epoch`,
  `examples_consumed`, `num_examples`, `seed`, `example_indices`) and the same batches. While the
  batch size stays the same, up to `num_workers * buffer_size` batches are computed ahead; a new
  batch size or a restored state starts a new pipeline at the current position.
  """

  def __init__(self, stream: stream_lib.TrainStream, *, num_workers: int, buffer_size: int = 2):
    """Wraps `stream` (at its current position).

    Args:
      stream: the `TrainStream`; its source and transform must be picklable by cloudpickle (they
        are sent to the workers) and should use one thread each.
      num_workers: worker processes, >= 1.
      buffer_size: batches each worker computes ahead.
    """
    if not isinstance(stream, stream_lib.TrainStream):
      raise TypeError(f"stream must be a lbjax.data.TrainStream, got {type(stream).__name__}.")
    if check_num_workers(num_workers) < 1:
      raise ValueError("WorkerTrainStream needs num_workers >= 1; use the TrainStream itself for 0.")
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, numbers.Integral) or (
        buffer_size < 1):
      raise ValueError(f"buffer_size must be a positive integer, got {buffer_size!r}.")
    _grain()
    self._stream = stream
    self._num_workers = int(num_workers)
    self._buffer_size = int(buffer_size)
    self._iterator: Iterator[tuple[stream_lib.Batch, int]] | None = None
    self._pipeline_key: tuple[int, int] | None = None  # (next position, batch size) it yields
    self.undecodable_skipped = 0  # records the workers skipped for this process's batches

  @property
  def num_examples(self) -> int:
    return self._stream.num_examples

  @property
  def seed(self) -> int:
    return self._stream.seed

  @property
  def num_workers(self) -> int:
    return self._num_workers

  @property
  def examples_consumed(self) -> int:
    return self._stream.examples_consumed

  def epoch(self) -> float:
    """Exact position of the next batch in epochs: examples consumed / num_examples."""
    return self._stream.epoch()

  def example_indices(self, positions: np.ndarray) -> np.ndarray:
    return self._stream.example_indices(positions)

  def next_batch(self, global_batch_size: int) -> stream_lib.Batch:
    """This process's share of the next `global_batch_size` positions (as `TrainStream`)."""
    # Validates the size before any worker starts.
    process_slice(global_batch_size, self._stream.process_index, self._stream.process_count)
    global_batch_size = int(global_batch_size)
    start = self._stream.examples_consumed
    if self._pipeline_key != (start, global_batch_size):
      self.close()
      dataset = _grain().MapDataset.range(_MAX_BATCHES).map(
          functools.partial(_batch_at, self._stream, start, global_batch_size))
      self._iterator = _prefetch_on_workers(dataset, self._num_workers, self._buffer_size)
    batch, skipped = _raised(next(self._iterator))
    batch = _plain_arrays(batch)
    self.undecodable_skipped += int(skipped)
    self._stream.set_state({**self._stream.get_state(),
                            "examples_consumed": start + global_batch_size})
    self._pipeline_key = (start + global_batch_size, global_batch_size)
    return batch

  def get_state(self) -> dict[str, int]:
    """The wrapped `TrainStream`'s state (interchangeable with it, for any worker count)."""
    return self._stream.get_state()

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores a `get_state` dict; the next batch starts a pipeline at that position."""
    self._stream.set_state(state)
    self.close()

  def close(self) -> None:
    """Stops the worker processes (a later `next_batch` starts new ones)."""
    if self._iterator is not None:
      _close(self._iterator)
    self._iterator = None
    self._pipeline_key = None

  def __repr__(self) -> str:
    return f"WorkerTrainStream(num_workers={self._num_workers}, stream={self._stream!r})"


def _eval_batch(source, global_batch_size: int, mine: slice, transform, skip_undecodable: bool, batch: int):
  try:
    return stream_lib.eval_batch(source, batch, global_batch_size, mine, transform, skip_undecodable)
  except stream_lib.UndecodableRecordError as e:
    return e  # raised by the main process (`_raised`)


def worker_eval_batches(source: stream_lib.RandomAccessSource, global_batch_size: int, *,
                        num_workers: int, process_index: int = 0, process_count: int = 1,
                        transform: stream_lib.Transform | None = None, buffer_size: int = 2,
                        skip_undecodable: bool = False) -> Iterator[stream_lib.Batch]:
  """`stream.eval_batches`, the same batches in the same order, computed on grain worker processes.

  Args:
    source: a picklable `RandomAccessSource`.
    global_batch_size: B, divisible by process_count.
    num_workers: worker processes (0: `stream.eval_batches` in this process).
    process_index: this process's index p.
    process_count: number of processes P.
    transform: deterministic preprocessing, picklable by cloudpickle.
    buffer_size: batches each worker computes ahead.
    skip_undecodable: mask out examples whose record cannot be decoded (`stream.eval_batches`).
  """
  if check_num_workers(num_workers) == 0:
    return stream_lib.eval_batches(source, global_batch_size, process_index=process_index,
                                   process_count=process_count, transform=transform,
                                   skip_undecodable=skip_undecodable)
  skip_undecodable = stream_lib.check_skip_undecodable(skip_undecodable)
  mine = process_slice(global_batch_size, process_index, process_count)
  num_batches = -(-len(source) // int(global_batch_size))
  dataset = _grain().MapDataset.range(num_batches).map(
      functools.partial(_eval_batch, source, int(global_batch_size), mine, transform, skip_undecodable))
  return (_plain_arrays(_raised(element)) for element in _prefetch_on_workers(dataset, int(num_workers), buffer_size))
