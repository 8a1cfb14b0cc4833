"""The prefetching stream: the next batch drawn on a thread, the consumed position exact, the thread ended."""

import threading

import numpy as np
import pytest

from lbjax import data as lbdata
from lbjax.train import NonFiniteError, train_and_evaluate
from lbjax.train import hooks
from lbjax.train import prefetch
from lbjax.train import protocols
from lbjax.train.checkpointing import Checkpointer
from lbjax.train.prefetch import PrefetchingStream
from lbjax.train.run import Run
from tests.train import helpers


@pytest.fixture(autouse=True)
def prefetch_on_cpu(monkeypatch):
  """The trainer prefetches only for accelerators (`overlaps_placement`); these tests check it on CPU."""
  monkeypatch.setattr(prefetch, "overlaps_placement", lambda mesh: True)


def _stream():
  return lbdata.TrainStream(lbdata.ArraySource(x=np.arange(40)), seed=3)


def test_a_window_stream_stays_a_window_stream_and_an_epoch_counts_windows():
  """The wrapper follows the wrapped stream's protocols (checked with `getattr_static` on Python >= 3.12):
  a PTB epoch at B=8 rows of 1,000 tokens is (125 - 1) // 20 = 6 windows, not 1,000 // 8 = 125 steps, and a
  batch that leaves a row shorter than one window is refused as such."""
  ptb = prefetch.prefetching(lbdata.PtbStream(np.arange(1000) % 50, seq_len=20), _take)
  assert isinstance(ptb, protocols.WindowStream) and isinstance(ptb, protocols.TrainStream)
  assert protocols.steps_per_epoch(ptb, 8) == 6
  plain = prefetch.prefetching(_stream(), _take)
  assert isinstance(plain, protocols.TrainStream) and not isinstance(plain, protocols.WindowStream)
  assert protocols.steps_per_epoch(plain, 8) == 5


class _WindowsOnly:
  """A user's token stream with the `WindowStream` methods alone (no re-lays): it stays a window stream."""
  num_examples = 100

  def __init__(self):
    self.position = 0

  def epoch(self):
    return self.position / 10

  def next_batch(self, global_batch_size):
    self.position += 1
    return {"x": np.zeros((global_batch_size, 3))}

  def get_state(self):
    return {"position": self.position}

  def set_state(self, state):
    self.position = state["position"]

  def windows_per_epoch(self, global_batch_size):
    return 10


def test_a_window_stream_without_re_lays_counts_windows_and_its_batches_start_where_it_is():
  user = _WindowsOnly()
  assert isinstance(user, protocols.WindowStream) and not isinstance(user, protocols.RelayingWindowStream)
  wrapped = prefetch.prefetching(user, _take)
  try:
    wrapped.next_prepared(4)
    wrapped.prefetch(8)
    assert protocols.steps_per_epoch(wrapped, 4) == 10
    assert protocols.next_batch_start(wrapped, lambda epoch: 8) == (0.1, 8)  # the batch in flight's start
    assert protocols.next_batch_start(wrapped, lambda epoch: 2) == (0.1, 2)  # another size: at the consumed position
  finally:
    wrapped.close()


def test_where_the_next_batch_starts_is_read_at_the_consumed_position():
  """`start_epoch` with a batch in flight: the prefetched batch's start if the size is the prefetched one, else
  the stream's at the consumed position (the batch in flight dropped); `end_epoch` ends the consumed epoch."""
  tokens = np.arange(100) % 50  # 8 windows of 4 rows; after 7, the rest holds none of 8 rows
  plain = lbdata.PtbStream(tokens, seq_len=3)
  ptb = prefetch.prefetching(lbdata.PtbStream(tokens, seq_len=3), lambda batch, size: batch)
  try:
    for _ in range(7):
      plain.next_batch(4)
      ptb.next_prepared(4)
    ptb.prefetch(4)
    assert ptb.start_epoch(4) == plain.start_epoch(4) < 1.0
    assert ptb.start_epoch(8) == plain.start_epoch(8) == 1.0
    ptb.prefetch(4)
    ptb.end_epoch()
    plain.end_epoch()
    assert ptb.get_state() == plain.get_state() and ptb.epoch() == 1.0
  finally:
    ptb.close()


class _ClosableStream(lbdata.TrainStream):
  """A stream with a `close`, as `WorkerTrainStream` has for its worker processes."""
  closed = 0

  def close(self):
    self.closed += 1


def test_closing_closes_the_wrapped_stream_which_stays_usable():
  """`Run.close` closes its stream; the worker processes of a `WorkerTrainStream` under the prefetching one ran on
  until the stream was garbage-collected."""
  wrapped = _ClosableStream(lbdata.ArraySource(x=np.arange(40)), seed=3)
  stream = PrefetchingStream(wrapped, _take)
  stream.next_prepared(4)
  stream.prefetch(4)
  stream.close()
  assert wrapped.closed == 1 and stream.epoch() == 0.1
  np.testing.assert_array_equal(stream.next_prepared(4), _stream().batch_at(4, 4)["x"])


def _prefetch_threads():
  return [t for t in threading.enumerate() if t.name.startswith("lbjax-prefetch")]


def _take(batch, size):
  return batch["x"].copy()


def test_prefetched_batches_are_the_streams_batches_in_order_whatever_the_guesses():
  """Right guesses, wrong guesses (dropped and rewound) and no guess all give the plain stream's batches."""
  sizes = [4, 4, 8, 8, 2, 4, 4, 16, 4]
  guesses = [4, 8, 8, 3, None, 4, 16, 4, 4]
  plain = _stream()
  expected = [plain.next_batch(size)["x"] for size in sizes]
  stream = PrefetchingStream(_stream(), _take)
  try:
    taken = []
    for size, guess in zip(sizes, guesses):
      taken.append(stream.next_prepared(size))
      stream.prefetch(guess)
    assert stream.get_state() == plain.get_state() and stream.epoch() == plain.epoch()
  finally:
    stream.close()
  for got, want in zip(taken, expected):
    np.testing.assert_array_equal(got, want)


class _SkippingStream(lbdata.TrainStream):
  """A stream that counts every example of a value divisible by 5 as a skipped record, as an ImageNet
  stream counts the records it cannot decode (`undecodable_skipped`: not part of the position)."""

  def next_batch(self, global_batch_size):
    batch = super().next_batch(global_batch_size)
    self.undecodable_skipped += int(np.sum(batch["x"] % 5 == 0))
    return batch


def test_the_count_of_skipped_records_is_that_of_the_batches_handed_out():
  """A found bug: it counted the batch in flight, and a dropped batch again when it was drawn anew."""
  sizes, guesses = [4, 4, 8, 4, 4, 4], [4, 8, 4, 8, 4, None]
  plain = _SkippingStream(lbdata.ArraySource(x=np.arange(40)), seed=3)
  stream = PrefetchingStream(_SkippingStream(lbdata.ArraySource(x=np.arange(40)), seed=3), _take)
  try:
    for size, guess in zip(sizes, guesses):
      stream.next_prepared(size)
      plain.next_batch(size)
      stream.prefetch(guess)
      assert stream.undecodable_skipped == plain.undecodable_skipped
    assert plain.undecodable_skipped > 0
  finally:
    stream.close()


def test_the_position_is_the_consumed_one_while_a_batch_is_in_flight():
  release = threading.Event()

  def slow_take(batch, size):
    assert release.wait(10)
    return _take(batch, size)

  plain = _stream()
  plain.next_batch(8)
  stream = PrefetchingStream(_stream(), slow_take)
  try:
    stream.next_batch(8)
    stream.prefetch(8)  # drawn on the thread, held in `slow_take`
    assert stream.get_state() == plain.get_state() and stream.epoch() == plain.epoch() == 0.2
    release.set()
    np.testing.assert_array_equal(stream.next_prepared(8), plain.next_batch(8)["x"])
    assert stream.get_state() == plain.get_state()
  finally:
    release.set()
    stream.close()


def test_a_prefetched_draws_error_is_raised_where_the_batch_is_taken_and_dropped_with_it():
  def failing_take(batch, size):
    raise OSError(f"unreadable batch of {size}")

  stream = PrefetchingStream(_stream(), failing_take)
  stream.prefetch(4)
  with pytest.raises(OSError, match="unreadable batch of 4"):
    stream.next_prepared(4)
  stream.prefetch(4)
  stream.close()  # the batch no one takes: its error is dropped, the stream is back at 4 examples
  assert stream.get_state()["examples_consumed"] == 4 and not _prefetch_threads()


def test_set_state_drops_the_batch_in_flight():
  stream = PrefetchingStream(_stream(), _take)
  try:
    stream.next_prepared(4)
    stream.prefetch(4)
    stream.set_state({**stream.get_state(), "examples_consumed": 12})
    plain = _stream()
    plain.set_state(stream.get_state())
    np.testing.assert_array_equal(stream.next_prepared(4), plain.next_batch(4)["x"])
  finally:
    stream.close()
  assert not _prefetch_threads()


def test_checkpoints_hold_the_position_of_the_batches_steps_consumed(tmp_path):
  """Every checkpoint's stream position is steps x batch, never one batch ahead, though one is drawn ahead."""
  config = helpers.tiny_classifier_config(checkpoint_every_steps=3, keep_checkpoints=10)
  result = train_and_evaluate(config, tmp_path)
  checkpointer = Checkpointer(tmp_path)
  for step in checkpointer.all_steps():
    meta = checkpointer.restore_meta(step)
    assert meta["stream"]["examples_consumed"] == meta["examples_seen"] == step * 32
  assert result.step == 8 and not _prefetch_threads()


def _without_prefetching(monkeypatch):
  """Every batch drawn when its step needs it, as before prefetching."""
  prefetch = PrefetchingStream.prefetch
  monkeypatch.setattr(PrefetchingStream, "prefetch", lambda self, size: prefetch(self, None))


@pytest.mark.parametrize("overrides", [
    {"batch_sizes": (16, 32, 64), "batch_size_boundaries": (0.25, 0.5)},
    {"batch_sizes": (16, 32, 64), "batch_size_boundaries": (0.25, 0.5), "batch.micro_batch_size": 16}])
def test_a_batch_schedule_trains_as_without_prefetching(tmp_path, monkeypatch, overrides):
  """Per-size steps and the any-batch step: the same updates as batches drawn when needed."""
  config = helpers.tiny_classifier_config(**overrides)
  prefetched = train_and_evaluate(config, tmp_path / "prefetched")
  _without_prefetching(monkeypatch)
  plain = train_and_evaluate(config, tmp_path / "plain")
  assert prefetched.step == plain.step == 8 and prefetched.examples_seen == 256
  helpers.assert_trees_equal(prefetched.state, plain.state)


def test_adaptive_batches_are_prefetched_only_between_decisions(tmp_path, monkeypatch):
  """With decisions every 2 steps, the batch after a decision step is drawn when it is needed."""
  prefetched = []
  prefetch = PrefetchingStream.prefetch
  monkeypatch.setattr(PrefetchingStream, "prefetch", lambda self, size: prefetched.append(size) or prefetch(self, size))
  config = helpers.tiny_classifier_config(**{
      "batch.policy": "adaptive", "batch.micro_batch_size": 16, "batch.max_batch_size": 64, "batch.adapt_every": 2,
      "num_steps": 6, "num_epochs": 10.0})
  train_and_evaluate(config, tmp_path)
  assert [size is None for size in prefetched] == [False, True, False, True, False, True]


def test_the_thread_ends_with_the_run_on_a_non_finite_stop(tmp_path, monkeypatch):
  """The third batch, drawn on the thread, has a NaN loss: the run stops naming its step (2, counted from 0), and the
  thread ends with it."""
  next_batch = lbdata.TrainStream.next_batch
  draws = []

  def poisoned_next_batch(self, global_batch_size):
    batch = next_batch(self, global_batch_size)
    draws.append(threading.current_thread().name)
    return helpers.poisoned(batch) if len(draws) == 3 else batch

  monkeypatch.setattr(lbdata.TrainStream, "next_batch", poisoned_next_batch)
  with pytest.raises(NonFiniteError, match="Non-finite loss or update at step 2: the loss"):
    train_and_evaluate(helpers.tiny_classifier_config(log_every=1), tmp_path)
  assert draws[2].startswith("lbjax-prefetch") and not _prefetch_threads()


def test_cpu_devices_draw_each_batch_when_its_step_needs_it(tmp_path, monkeypatch):
  monkeypatch.undo()
  run = Run(helpers.tiny_classifier_config())
  try:
    assert not prefetch.overlaps_placement(run.mesh)
    run.step(run.next_batch())
    assert not _prefetch_threads() and run.stream.get_state()["examples_consumed"] == 32
  finally:
    run.close()


@pytest.mark.parametrize("steps_per_call", [1, 3])
def test_on_cpu_devices_the_steps_call_places_the_host_batch_and_trains_as_batches_placed_ahead(
    tmp_path, monkeypatch, steps_per_call):
  """One process of CPU devices hands each batch (or a call's stack) to the compiled step as numpy arrays, which
  its call places (as it places a learning rate that changes, here every step): the same run, bit for bit, as
  batches placed on the mesh ahead of their step, and as batches drawn ahead on the thread and placed by the
  step's call (`benchmarks.train_loop`'s `loop, step places`)."""
  config = helpers.tiny_classifier_config(steps_per_call=steps_per_call, batch_sizes=(16, 32),
                                          batch_size_boundaries=(0.5,),
                                          **{"lr.warmup": "linear_warmup", "lr.warmup_epochs": 0.75})
  placed_ahead = train_and_evaluate(config, tmp_path / "ahead")
  monkeypatch.setattr(prefetch, "step_places_batches", lambda mesh: True)
  drawn_ahead = train_and_evaluate(config, tmp_path / "drawn")
  helpers.assert_trees_equal(placed_ahead.state, drawn_ahead.state)
  monkeypatch.undo()
  run = Run(config)
  try:
    batch = run.next_batch()
    assert run.step_places_batches and isinstance(batch.arrays["images"], np.ndarray)
    assert isinstance(batch.learning_rate, np.ndarray) and batch.learning_rate.dtype == np.float32  # a new value
  finally:
    run.close()
  by_the_call = train_and_evaluate(config, tmp_path / "call")
  assert by_the_call.step == placed_ahead.step == 12
  helpers.assert_trees_equal(placed_ahead.state, by_the_call.state)
  assert placed_ahead.eval_metrics == by_the_call.eval_metrics


def test_a_preempted_run_saves_the_consumed_position_and_resumes_bit_identically(tmp_path, monkeypatch):
  full = train_and_evaluate(helpers.tiny_language_model_config(), tmp_path / "full")
  should_stop = hooks.PreemptionFlag.should_stop
  monkeypatch.setattr(hooks.PreemptionFlag, "should_stop", lambda self, step: step == 5)
  preempted = train_and_evaluate(helpers.tiny_language_model_config(), tmp_path / "resumed")
  assert preempted.preempted and not _prefetch_threads()
  meta = Checkpointer(tmp_path / "resumed").restore_meta(5)
  run = Run(helpers.tiny_language_model_config())
  try:
    for _ in range(5):
      run.stream.next_batch(16)
    assert meta["stream"] == run.stream.get_state()
  finally:
    run.close()
  monkeypatch.setattr(hooks.PreemptionFlag, "should_stop", should_stop)
  resumed = train_and_evaluate(helpers.tiny_language_model_config(), tmp_path / "resumed")
  assert resumed.step == full.step
  helpers.assert_trees_equal(resumed.state, full.state)
