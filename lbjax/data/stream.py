"""Deterministic, resumable, process-sharded streams over random-access sources.

The training input of lbjax is one global stream of examples: the concatenation of one
permutation of the dataset per epoch. Stream position `k` holds example
`perm(seed, k // N)[k % N]`, where `N` is the dataset size and
`perm(seed, e) = np.random.default_rng([seed, e]).permutation(N)` (the identity when shuffling is
off). A global batch of size `B` is the next `B` stream positions; it may straddle an epoch
boundary, and `B` may change from one batch to the next (batch-size schedules). Process `p` of `P`
receives positions `[p*B/P, (p+1)*B/P)` of each batch, so the content of the global batch does
not depend on how many processes read it, and the whole state of the stream is one integer
(examples consumed) plus the seed.

Sources are anything with `__len__` and a vectorised `take(indices)`; `ArraySource` wraps
in-memory numpy arrays. Per-example randomness (augmentation) is seeded from
`(seed, stream position)` with `example_rngs`, so it is independent of the number of processes
and of resumption.

A record that cannot be decoded (a truncated JPEG, bytes that are no image) makes the source's
`take` or the transform raise `UndecodableExample` with its row; the stream turns it into
`UndecodableRecordError`, which names the source (dataset and split) and the example's index. With
`skip_undecodable=True` the stream instead reads the next record of the dataset (index + 1, wrapping)
in its place, with the same stream position and so the same augmentation draws: which records are
skipped depends on the data alone, so it is the same on every host, for any process count and on a
resume. It warns once per record and counts them (`TrainStream.undecodable_skipped`); evaluation
masks such a row out instead (`mask` 0).

lbjax does not use grain's samplers here: a batch size that changes between steps (and mid-epoch)
with an exact one-integer resume point is simpler to state and test directly. Batches are computed
on worker processes by `lbjax.data.workers`, which runs `TrainStream.batch_at` in grain's
`mp_prefetch` workers.
"""

from collections.abc import Callable, Iterator, Mapping
import math
import numbers
from typing import Any, Protocol, runtime_checkable

from absl import logging
import numpy as np

from lbjax.data.sharding import check_process
from lbjax.data.sharding import process_slice

Batch = dict[str, np.ndarray]
Transform = Callable[[Batch, np.ndarray], Batch]

# Domain tag that separates augmentation seeds from the epoch-permutation seeds `[seed, epoch]`.
_EXAMPLE_RNG_TAG = 0x6C626A61


@runtime_checkable
class RandomAccessSource(Protocol):
  """A dataset that can gather any set of examples at once.

  `take(indices)` returns a dict of arrays whose leading dimension is `len(indices)`; row `i` is
  example `indices[i]`.
  """

  def __len__(self) -> int:
    ...

  def take(self, indices: np.ndarray) -> Batch:
    ...


class UndecodableExample(ValueError):
  """Raised by a source's `take` or a transform: rows of the batch it was given whose record cannot be
  decoded, with the reason for each (`reasons`: row -> text)."""

  def __init__(self, reasons: Mapping[int, str]):
    self.reasons = dict(reasons)
    super().__init__("; ".join(f"row {row}: {reason}" for row, reason in sorted(self.reasons.items())))

  def __reduce__(self):  # rebuilt from its fields where it is unpickled (a grain worker's error in the main process)
    return type(self), (self.reasons,)


class UndecodableRecordError(Exception):
  """A record of the dataset cannot be decoded: the message names the dataset and split (`source`),
  the example's index and why, and how to go on. Not a `ValueError`: nothing about the arguments is
  wrong, the data is (a trainer stops on it, keeping its checkpoints, rather than taking it for a
  config error)."""

  def __init__(self, source: str, index: int, reason: str):
    self.source, self.index, self.reason = source, index, reason
    super().__init__(
        f"{source}: example {index} cannot be decoded ({reason}). To skip such records, pass "
        "skip_undecodable=True (lbjax-train: --config.data_options.skip_undecodable=True; training stops here "
        "with its checkpoints kept, and the same command with that option resumes from the newest one, "
        "skipping the same records on every host and counting them in the metrics), or repair the dataset.")

  def __reduce__(self):  # rebuilt from its fields where it is unpickled (a grain worker's error in the main process)
    return type(self), (self.source, self.index, self.reason)


def check_indices(indices: Any, num_examples: int, source: str = "") -> np.ndarray:
  """The `take()` argument as a 1-D integer array with every entry in [0, num_examples).

  Raises:
    ValueError: if `indices` is not a 1-D integer array.
    IndexError: if an index is out of range (the message names `source` when given).
  """
  indices = np.asarray(indices)
  if indices.ndim != 1 or not (indices.size == 0 or np.issubdtype(indices.dtype, np.integer)):
    raise ValueError(
        f"take() expects a 1-D integer index array, got shape {indices.shape} and dtype "
        f"{indices.dtype}.")
  if indices.size and (indices.min() < 0 or indices.max() >= num_examples):
    where = f" for {source}" if source else ""
    raise IndexError(
        f"take() indices must lie in [0, {num_examples}){where}, got range "
        f"[{indices.min()}, {indices.max()}].")
  return indices


class ArraySource:
  """Random-access source over in-memory arrays with equal leading dimensions.

  Example: `ArraySource(images=x, labels=y)` with `x` of shape [N, 28, 28] and `y` of shape [N].
  """

  def __init__(self, **arrays: np.ndarray):
    """Wraps `arrays` (name -> array, all with the same leading dimension N >= 1)."""
    if not arrays:
      raise ValueError(
          "ArraySource needs at least one named array, e.g. ArraySource(images=x, labels=y).")
    converted = {}
    for name, array in arrays.items():
      array = np.asarray(array)
      if array.ndim == 0:
        raise ValueError(
            f"ArraySource array {name!r} is a scalar; every array needs a leading example "
            "dimension.")
      converted[name] = array
    sizes = {name: array.shape[0] for name, array in converted.items()}
    if len(set(sizes.values())) != 1:
      raise ValueError(
          f"ArraySource arrays must have equal leading dimensions (one row per example), got "
          f"{sizes}.")
    num_examples = next(iter(sizes.values()))
    if num_examples == 0:
      raise ValueError("ArraySource arrays are empty (leading dimension 0); a source needs "
                       "at least one example.")
    self._arrays = converted
    self._num_examples = num_examples

  @property
  def arrays(self) -> Mapping[str, np.ndarray]:
    """The wrapped arrays, by name (a new dict; the arrays themselves are not copied)."""
    return dict(self._arrays)

  def __len__(self) -> int:
    return self._num_examples

  def take(self, indices: np.ndarray) -> Batch:
    """Gathers examples `indices` (1-D integer array, each in [0, N)) from every array."""
    indices = check_indices(indices, self._num_examples).astype(np.int64, copy=False)
    return {name: array[indices] for name, array in self._arrays.items()}

  def __repr__(self) -> str:
    fields = ", ".join(f"{k}={v.dtype}{list(v.shape)}" for k, v in self._arrays.items())
    return f"ArraySource({fields})"


INDEX = "index"  # the one field of an `IndexSource`'s examples


class IndexSource:
  """The examples of a dataset of `num_examples` by their index alone: `take(indices)` is
  `{"index": indices}` as int32, so a stream over it hands out which examples each batch holds instead
  of the examples (a device holding the training set gathers them: `lbjax.train.device_data`)."""

  def __init__(self, num_examples: int):
    if isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral) or not (
        0 < num_examples <= np.iinfo(np.int32).max):
      raise ValueError(f"IndexSource needs a number of examples in [1, 2**31), got {num_examples!r}.")
    self._num_examples = int(num_examples)

  def __len__(self) -> int:
    return self._num_examples

  def take(self, indices: np.ndarray) -> Batch:
    return {INDEX: check_indices(indices, self._num_examples).astype(np.int32)}

  def __repr__(self) -> str:
    return f"IndexSource({self._num_examples})"


def epoch_permutation(seed: int, epoch: int, num_examples: int) -> np.ndarray:
  """Order of the examples in `epoch`: `np.random.default_rng([seed, epoch]).permutation(N)`."""
  return np.random.default_rng([seed, epoch]).permutation(num_examples)


def example_rngs(seed: int, positions: np.ndarray) -> list[np.random.Generator]:
  """One independent generator per stream position, seeded from `(seed, position)` only.

  Use inside a `TrainStream` transform for per-example augmentation: the random draws of an
  example then depend only on the seed and its stream position, not on the number of processes,
  the batch it landed in, or whether the run was resumed.

  Args:
    seed: a non-negative integer, normally the stream's seed.
    positions: 1-D integer array of stream positions (the transform's second argument).

  Returns:
    A list of `np.random.Generator`, one per position, in order.
  """
  check_seed(seed)
  positions = np.asarray(positions)
  if positions.ndim != 1:
    raise ValueError(f"positions must be a 1-D array, got shape {positions.shape}.")
  return [np.random.default_rng([seed, _EXAMPLE_RNG_TAG, int(p)]) for p in positions]


def check_seed(seed: Any) -> int:
  """`seed` as an int; raises unless it is a non-negative integer."""
  if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
    raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
  return int(seed)


def _check_source(source: Any) -> int:
  if not (hasattr(source, "take") and hasattr(source, "__len__")):
    raise TypeError(
        f"source must have __len__ and take(indices) (see lbjax.data.RandomAccessSource), got "
        f"{type(source).__name__}. Wrap in-memory arrays with lbjax.data.ArraySource(...).")
  num_examples = len(source)
  if num_examples <= 0:
    raise ValueError(f"source is empty (len(source) == {num_examples}).")
  return num_examples


def _apply_transform(transform: Transform | None, examples: Batch, positions: np.ndarray) -> Batch:
  if transform is None:
    return examples
  out = transform(examples, positions)
  if not isinstance(out, Mapping):
    raise TypeError(
        f"transform must return a dict of arrays, got {type(out).__name__}.")
  out = {name: np.asarray(value) for name, value in out.items()}
  for name, value in out.items():
    if value.ndim == 0 or value.shape[0] != len(positions):
      raise ValueError(
          f"transform output {name!r} has shape {value.shape}; expected a leading dimension of "
          f"{len(positions)} (one row per example).")
  return out


class TrainStream:
  """Deterministic, resumable, process-sharded stream of training batches whose size may change.

  Stream position `k` is example `perm(seed, k // N)[k % N]` with `perm` from `epoch_permutation`
  (identity if `shuffle=False`). `next_batch(B)` consumes the next `B` positions; this process gets
  positions `[p*B/P, (p+1)*B/P)` of them. The state is `examples_consumed` (global), so a stream
  saved with `P` processes resumes exactly with any other process count.
  """

  def __init__(self, source: RandomAccessSource, *, seed: int, process_index: int = 0,
               process_count: int = 1, shuffle: bool = True, transform: Transform | None = None,
               skip_undecodable: bool = False):
    """Creates the stream at position 0.

    Args:
      source: a `RandomAccessSource` (e.g. `ArraySource`).
      seed: non-negative integer; determines the epoch permutations.
      process_index: this process's index p in [0, process_count).
      process_count: number of processes P reading the same global stream.
      shuffle: permute each epoch (True) or read examples in order (False).
      transform: optional `transform(examples, stream_positions) -> examples`, applied to this
        process's share of each batch; seed per-example randomness with `example_rngs`.
      skip_undecodable: read the next record in place of one that cannot be decoded (module
        docstring) instead of raising `UndecodableRecordError`.
    """
    self.num_examples: int = _check_source(source)
    check_seed(seed)
    check_process(process_index, process_count)
    if transform is not None and not callable(transform):
      raise TypeError(f"transform must be callable or None, got {type(transform).__name__}.")
    self._source = source
    self._seed = int(seed)
    self._process_index = int(process_index)
    self._process_count = int(process_count)
    self._shuffle = bool(shuffle)
    self._transform = transform
    self._skip_undecodable = check_skip_undecodable(skip_undecodable)
    self._warned: set[int] = set()
    self._examples_consumed = 0
    self._permutations: dict[int, np.ndarray] = {}
    self.undecodable_skipped = 0  # records this process skipped since the stream was made

  @property
  def seed(self) -> int:
    """The seed of the epoch permutations."""
    return self._seed

  @property
  def source(self) -> RandomAccessSource:
    """The dataset the stream reads."""
    return self._source

  @property
  def process_index(self) -> int:
    return self._process_index

  @property
  def process_count(self) -> int:
    return self._process_count

  @property
  def examples_consumed(self) -> int:
    """Global number of stream positions consumed so far (all processes together)."""
    return self._examples_consumed

  def epoch(self) -> float:
    """Exact position of the next batch in epochs: examples consumed / num_examples."""
    return self._examples_consumed / self.num_examples

  def example_indices(self, positions: np.ndarray) -> np.ndarray:
    """Dataset indices of the examples at global stream `positions` (1-D non-negative ints)."""
    positions = np.asarray(positions, dtype=np.int64)
    if not self._shuffle:
      return positions % self.num_examples
    epochs = positions // self.num_examples
    offsets = positions % self.num_examples
    indices = np.empty_like(positions)
    for epoch in np.unique(epochs):
      in_epoch = epochs == epoch
      indices[in_epoch] = self._permutation(int(epoch))[offsets[in_epoch]]
    return indices

  def _permutation(self, epoch: int) -> np.ndarray:
    if epoch not in self._permutations:
      if len(self._permutations) >= 2:
        del self._permutations[min(self._permutations)]
      self._permutations[epoch] = epoch_permutation(self._seed, epoch, self.num_examples)
    return self._permutations[epoch]

  def next_batch(self, global_batch_size: int) -> Batch:
    """Consumes the next `global_batch_size` positions; returns this process's share.

    Args:
      global_batch_size: size B of the global batch; must be divisible by process_count.

    Returns:
      Dict of host-local numpy arrays with leading dimension B / process_count, ready for
      `jax.make_array_from_process_local_data`.
    """
    examples, skipped = self.batch_and_skipped(self._examples_consumed, global_batch_size)
    self._examples_consumed += int(global_batch_size)
    self.undecodable_skipped += skipped
    return examples

  def batch_at(self, examples_consumed: int, global_batch_size: int) -> Batch:
    """This process's share of the global batch of `global_batch_size` positions starting at
    `examples_consumed`, without changing the stream's state (what `next_batch` returns there)."""
    return self.batch_and_skipped(examples_consumed, global_batch_size)[0]

  def batch_and_skipped(self, examples_consumed: int, global_batch_size: int) -> tuple[Batch, int]:
    """`batch_at` and the number of records that could not be decoded and were skipped for it."""
    mine = process_slice(global_batch_size, self._process_index, self._process_count)
    positions = np.arange(examples_consumed + mine.start, examples_consumed + mine.stop,
                          dtype=np.int64)
    examples, skipped = take_decodable(self._source, self.example_indices(positions), positions,
                                       self._transform, self._skip_undecodable, self._warned)
    return examples, int(skipped.sum())

  def of_indices(self) -> "TrainStream":
    """This stream, at its position, handing out each batch's dataset indices (`IndexSource`: this process's
    share as `{"index": int32 [B/P]}`) instead of its examples: the same examples in the same order, and the
    same state, so a checkpoint of either stream resumes the other.

    Raises:
      ValueError: the stream has a transform (its per-example work, e.g. augmentation, is done on the host
        and cannot be skipped).
    """
    if self._transform is not None:
      raise ValueError("This stream transforms its examples on the host (e.g. augmentation), which a stream of "
                       "their indices would leave out.")
    stream = TrainStream(IndexSource(self.num_examples), seed=self._seed, process_index=self._process_index,
                         process_count=self._process_count, shuffle=self._shuffle)
    stream.set_state(self.get_state())
    return stream

  def get_state(self) -> dict[str, int]:
    """JSON-serialisable state: examples consumed plus what the positions depend on."""
    return {
        "examples_consumed": self._examples_consumed,
        "seed": self._seed,
        "num_examples": self.num_examples,
        "shuffle": int(self._shuffle),
    }

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores a state from `get_state`; raises if it belongs to another seed/dataset/order."""
    expected = self.get_state()
    if not isinstance(state, Mapping) or set(state) != set(expected):
      raise ValueError(
          f"TrainStream state must be a dict with keys {sorted(expected)}, got "
          f"{state!r}. Pass the dict returned by TrainStream.get_state().")
    for key in ("seed", "num_examples", "shuffle"):
      if int(state[key]) != expected[key]:
        raise ValueError(
            f"TrainStream state does not fit this stream: state {key}={state[key]!r} but the "
            f"stream has {key}={expected[key]!r}. Restore it into a stream built with the same "
            "dataset, seed and shuffle setting.")
    consumed = state["examples_consumed"]
    if isinstance(consumed, bool) or not isinstance(consumed, numbers.Integral) or consumed < 0:
      raise ValueError(
          f"TrainStream state examples_consumed must be a non-negative integer, got {consumed!r}.")
    self._examples_consumed = int(consumed)


def check_skip_undecodable(skip_undecodable: Any) -> bool:
  if not isinstance(skip_undecodable, (bool, np.bool_)):
    raise ValueError(f"skip_undecodable must be True or False, got {skip_undecodable!r}.")
  return bool(skip_undecodable)


def take_decodable(source: RandomAccessSource, indices: np.ndarray, positions: np.ndarray,
                   transform: Transform | None, skip_undecodable: bool,
                   warned: set[int]) -> tuple[Batch, np.ndarray]:
  """`transform(source.take(indices), positions)`, and per row the number of records skipped for it.

  A row whose record cannot be decoded (`UndecodableExample`) raises `UndecodableRecordError`, or with
  `skip_undecodable` is read again from the next index (wrapping), until a record decodes; `warned`
  holds the indices already warned about (each is warned once).
  """
  indices = np.array(indices, dtype=np.int64)
  skipped = np.zeros(len(indices), np.int64)
  num_examples = len(source)
  while True:
    try:
      return _apply_transform(transform, source.take(indices), positions), skipped
    except UndecodableExample as bad:
      for row, reason in sorted(bad.reasons.items()):
        index = int(indices[row])
        if not skip_undecodable:
          raise UndecodableRecordError(str(source), index, reason) from None
        if skipped[row] >= num_examples - 1:
          raise UndecodableRecordError(str(source), index, f"{reason}; and so is every other record") from None
        if index not in warned:
          warned.add(index)
          logging.warning("Skipping %s example %d, which cannot be decoded (%s); reading example %d in its "
                          "place.", source, index, reason, (index + 1) % num_examples)
        indices[row] = (index + 1) % num_examples
        skipped[row] += 1


def eval_batches(source: RandomAccessSource, global_batch_size: int, *, process_index: int = 0,
                 process_count: int = 1, transform: Transform | None = None,
                 skip_undecodable: bool = False) -> Iterator[Batch]:
  """Every example of `source` exactly once, in order, in padded fixed-size batches.

  Global batch `i` covers dataset indices `[i*B, (i+1)*B)`; this process gets `[p*B/P, (p+1)*B/P)`
  of it. Indices past the end are padding: they repeat the last example and have `mask` 0. All
  processes yield the same number of batches, `ceil(N / B)`.

  Args:
    source: a `RandomAccessSource`; must not already have a field named `mask`.
    global_batch_size: B, divisible by process_count.
    process_index: this process's index p.
    process_count: number of processes P.
    transform: optional `transform(examples, indices) -> examples` (deterministic preprocessing).
    skip_undecodable: mask out (`mask` 0) an example whose record cannot be decoded instead of raising
      `UndecodableRecordError` (module docstring).

  Yields:
    This process's share of each batch plus `mask`, float32 [B/P] (1 real, 0 padding).
  """
  num_examples = _check_source(source)
  mine = process_slice(global_batch_size, process_index, process_count)
  if transform is not None and not callable(transform):
    raise TypeError(f"transform must be callable or None, got {type(transform).__name__}.")
  skip_undecodable = check_skip_undecodable(skip_undecodable)
  return _eval_batches(source, num_examples, global_batch_size, mine, transform, skip_undecodable)


def _eval_batches(source: RandomAccessSource, num_examples: int, global_batch_size: int,
                  mine: slice, transform: Transform | None, skip_undecodable: bool) -> Iterator[Batch]:
  for batch in range(math.ceil(num_examples / global_batch_size)):
    yield eval_batch(source, batch, global_batch_size, mine, transform, skip_undecodable)


def eval_batch(source: RandomAccessSource, batch: int, global_batch_size: int, mine: slice,
               transform: Transform | None, skip_undecodable: bool = False) -> Batch:
  """Evaluation batch number `batch` of `eval_batches` (this process's rows `mine` of it)."""
  num_examples = len(source)
  offset = batch * global_batch_size
  indices = np.arange(offset + mine.start, offset + mine.stop, dtype=np.int64)
  real = indices < num_examples
  indices = np.minimum(indices, num_examples - 1)
  examples, skipped = take_decodable(source, indices, indices, transform, skip_undecodable, set())
  if "mask" in examples:
    raise ValueError("eval_batches adds a 'mask' field, but the examples already have one; "
                     "rename the source's 'mask' field.")
  examples["mask"] = (real & (skipped == 0)).astype(np.float32)
  return examples
