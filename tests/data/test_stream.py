"""Tests of the resumable, process-sharded training stream and the padded eval batches."""

import json

import numpy as np
import pytest

from lbjax import data
from lbjax.data.stream import check_indices

N = 10


def make_source(num_examples: int = N) -> data.ArraySource:
  ids = np.arange(num_examples, dtype=np.int32)
  return data.ArraySource(ids=ids, features=np.stack([ids, -ids], axis=1).astype(np.float32))


def draw(stream: data.TrainStream, sizes: list[int]) -> list[dict[str, np.ndarray]]:
  return [stream.next_batch(size) for size in sizes]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def test_stream_positions_follow_epoch_permutations():
  stream = data.TrainStream(make_source(), seed=3)
  ids = np.concatenate([b["ids"] for b in draw(stream, [4, 7, 9, 5])])
  expected = np.concatenate([data.epoch_permutation(3, e, N) for e in range(3)])[:25]
  np.testing.assert_array_equal(ids, expected)
  assert stream.epoch() == 2.5


def test_epoch_permutation_is_default_rng_of_seed_and_epoch():
  np.testing.assert_array_equal(data.epoch_permutation(7, 2, 50),
                                np.random.default_rng([7, 2]).permutation(50))


def test_unshuffled_stream_reads_in_order_across_epochs():
  stream = data.TrainStream(make_source(), seed=0, shuffle=False)
  ids = np.concatenate([b["ids"] for b in draw(stream, [6, 6, 6])])
  np.testing.assert_array_equal(ids, np.arange(18) % N)


def test_same_seed_same_batches_other_seed_other_batches():
  a = draw(data.TrainStream(make_source(), seed=1), [4, 4, 4])
  b = draw(data.TrainStream(make_source(), seed=1), [4, 4, 4])
  c = draw(data.TrainStream(make_source(), seed=2), [4, 4, 4])
  assert_batches_equal(a, b)
  assert any((x["ids"] != y["ids"]).any() for x, y in zip(a, c))


def test_every_epoch_covers_every_example_exactly_once():
  stream = data.TrainStream(make_source(), seed=0)
  ids = np.concatenate([b["ids"] for b in draw(stream, [3, 3, 3, 3, 2, 6])])
  for epoch in range(2):
    np.testing.assert_array_equal(np.sort(ids[epoch * N:(epoch + 1) * N]), np.arange(N))
  assert stream.epoch() == 2.0


def test_examples_stay_aligned_across_fields():
  stream = data.TrainStream(make_source(), seed=0)
  batch = stream.next_batch(8)
  np.testing.assert_array_equal(batch["features"][:, 0], batch["ids"])
  np.testing.assert_array_equal(batch["features"][:, 1], -batch["ids"])


@pytest.mark.parametrize("split_after", [1, 3])
def test_resume_mid_epoch_is_exact_also_across_batch_size_change(split_after):
  sizes = [4, 4, 6, 2, 8, 8]
  reference = draw(data.TrainStream(make_source(), seed=5), sizes)
  first = data.TrainStream(make_source(), seed=5)
  draw(first, sizes[:split_after])
  state = json.loads(json.dumps(first.get_state()))
  resumed = data.TrainStream(make_source(), seed=5)
  resumed.set_state(state)
  assert resumed.epoch() == first.epoch()
  assert_batches_equal(draw(resumed, sizes[split_after:]), reference[split_after:])


def test_state_is_json_ints():
  stream = data.TrainStream(make_source(), seed=5)
  stream.next_batch(4)
  state = stream.get_state()
  assert state["examples_consumed"] == 4 and state["seed"] == 5
  assert all(type(v) is int for v in state.values())


def test_two_process_shards_are_disjoint_and_their_union_is_the_global_batch():
  sizes = [4, 8, 6, 10, 12]  # the last batch straddles the end of the first epoch (40 examples)
  single = draw(data.TrainStream(make_source(40), seed=9), sizes)
  shards = [draw(data.TrainStream(make_source(40), seed=9, process_index=p, process_count=2),
                 sizes) for p in range(2)]
  for i, batch in enumerate(single):
    first, second = shards[0][i], shards[1][i]
    assert len(first["ids"]) == len(second["ids"]) == sizes[i] // 2
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([first[key], second[key]]), batch[key])
  first_epoch = [np.concatenate([s[i]["ids"] for i in range(4)]) for s in shards]
  assert not set(first_epoch[0]) & set(first_epoch[1])


def test_resume_with_another_process_count():
  sizes = [4, 6, 8]
  reference = draw(data.TrainStream(make_source(), seed=2), sizes)
  two = [data.TrainStream(make_source(), seed=2, process_index=p, process_count=2)
         for p in range(2)]
  for stream in two:
    stream.next_batch(sizes[0])
  assert two[0].get_state() == two[1].get_state()
  single = data.TrainStream(make_source(), seed=2)
  single.set_state(two[0].get_state())
  assert_batches_equal(draw(single, sizes[1:]), reference[1:])


def noisy_transform(seed):
  def transform(examples, positions):
    noise = np.array([rng.normal() for rng in data.example_rngs(seed, positions)], np.float32)
    return {"ids": examples["ids"], "noisy": examples["features"][:, 0] + noise}
  return transform


def test_transform_randomness_is_independent_of_process_count_and_resume():
  single = data.TrainStream(make_source(), seed=4, transform=noisy_transform(4))
  reference = draw(single, [4, 6])
  shards = [data.TrainStream(make_source(), seed=4, process_index=p, process_count=2,
                             transform=noisy_transform(4)) for p in range(2)]
  for batch_index, size in enumerate([4, 6]):
    noisy = np.concatenate([s.next_batch(size)["noisy"] for s in shards])
    np.testing.assert_array_equal(noisy, reference[batch_index]["noisy"])
  resumed = data.TrainStream(make_source(), seed=4, transform=noisy_transform(4))
  resumed.set_state({"examples_consumed": 4, "seed": 4, "num_examples": N, "shuffle": 1})
  np.testing.assert_array_equal(resumed.next_batch(6)["noisy"], reference[1]["noisy"])
  assert not np.array_equal(reference[0]["noisy"], reference[0]["ids"].astype(np.float32))


def test_example_rngs_differ_by_position_and_seed():
  draws = [rng.integers(1 << 30) for rng in data.example_rngs(0, np.arange(4))]
  assert len(set(draws)) == 4
  assert (data.example_rngs(0, np.array([2]))[0].integers(1 << 30)
          != data.example_rngs(1, np.array([2]))[0].integers(1 << 30))


def test_batches_feed_make_array_from_process_local_data():
  jax = pytest.importorskip("jax")
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  batch = data.TrainStream(make_source(), seed=0).next_batch(8)
  array = jax.make_array_from_process_local_data(sharding, batch["features"])
  assert array.shape == (8, 2)
  np.testing.assert_array_equal(np.asarray(array), batch["features"])


def test_batch_not_divisible_by_process_count_raises():
  stream = data.TrainStream(make_source(), seed=0, process_index=1, process_count=4)
  with pytest.raises(ValueError, match="not divisible by process_count=4"):
    stream.next_batch(6)
  with pytest.raises(ValueError, match="positive integer"):
    stream.next_batch(0)
  assert stream.get_state()["examples_consumed"] == 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"seed": -1}, ValueError, "seed must be a non-negative integer"),
    ({"seed": 1.5}, ValueError, "seed must be a non-negative integer"),
    ({"seed": 0, "process_index": 2, "process_count": 2}, ValueError, "process_index"),
    ({"seed": 0, "process_count": 0}, ValueError, "process_count must be >= 1"),
    ({"seed": 0, "transform": "flip"}, TypeError, "transform must be callable"),
])
def test_bad_stream_arguments_raise(kwargs, error, match):
  with pytest.raises(error, match=match):
    data.TrainStream(make_source(), **kwargs)


def test_non_source_raises():
  with pytest.raises(TypeError, match="take"):
    data.TrainStream([1, 2, 3], seed=0)


@pytest.mark.parametrize("change, match", [
    ({"seed": 1}, "seed"),
    ({"num_examples": 11}, "num_examples"),
    ({"shuffle": 0}, "shuffle"),
])
def test_state_of_another_stream_raises(change, match):
  stream = data.TrainStream(make_source(), seed=0)
  state = {**stream.get_state(), **change}
  with pytest.raises(ValueError, match=f"does not fit this stream: state {match}"):
    stream.set_state(state)


def test_malformed_state_raises():
  stream = data.TrainStream(make_source(), seed=0)
  with pytest.raises(ValueError, match="must be a dict with keys"):
    stream.set_state({"examples_consumed": 3})
  with pytest.raises(ValueError, match="non-negative integer"):
    stream.set_state({**stream.get_state(), "examples_consumed": -1})


def test_transform_with_wrong_leading_dimension_raises():
  stream = data.TrainStream(make_source(), seed=0,
                            transform=lambda examples, positions: {"ids": examples["ids"][:1]})
  with pytest.raises(ValueError, match="expected a leading dimension of 4"):
    stream.next_batch(4)


@pytest.mark.parametrize("batch_size", [3, 5, 10, 16])
def test_eval_covers_every_example_once_with_masks(batch_size):
  batches = list(data.eval_batches(make_source(), batch_size))
  assert len(batches) == -(-N // batch_size)
  assert all(len(b["ids"]) == batch_size and b["mask"].dtype == np.float32 for b in batches)
  ids = np.concatenate([b["ids"] for b in batches])
  mask = np.concatenate([b["mask"] for b in batches])
  np.testing.assert_array_equal(ids[mask == 1], np.arange(N))
  assert mask.sum() == N and set(np.unique(mask)) <= {0.0, 1.0}
  np.testing.assert_array_equal(mask, np.arange(len(mask)) < N)


def test_eval_shards_of_two_processes_make_up_the_single_process_batches():
  single = list(data.eval_batches(make_source(), 8))
  shards = [list(data.eval_batches(make_source(), 8, process_index=p, process_count=2))
            for p in range(2)]
  assert len(shards[0]) == len(shards[1]) == len(single) == 2
  for i, batch in enumerate(single):
    for key in ("ids", "mask"):
      np.testing.assert_array_equal(
          np.concatenate([shards[0][i][key], shards[1][i][key]]), batch[key])
  # The second process's last share is all padding, but it still yields it (same step count).
  np.testing.assert_array_equal(shards[1][1]["mask"], np.zeros(4))


def test_eval_transform_sees_dataset_indices():
  seen = []

  def transform(examples, indices):
    seen.append(indices)
    return examples

  list(data.eval_batches(make_source(), 4, transform=transform))
  np.testing.assert_array_equal(np.concatenate(seen)[:N], np.arange(N))


def test_eval_bad_arguments_raise():
  with pytest.raises(ValueError, match="not divisible by process_count=3"):
    data.eval_batches(make_source(), 4, process_count=3)
  with pytest.raises(ValueError, match="already have one"):
    next(data.eval_batches(data.ArraySource(mask=np.ones(4)), 2))


def test_array_source_gathers_rows():
  source = make_source()
  assert len(source) == N
  taken = source.take(np.array([3, 0, 3]))
  np.testing.assert_array_equal(taken["ids"], [3, 0, 3])
  assert taken["features"].shape == (3, 2)
  assert isinstance(source, data.RandomAccessSource)


@pytest.mark.parametrize("arrays, match", [
    ({}, "at least one named array"),
    ({"x": np.zeros(3), "y": np.zeros(4)}, "equal leading dimensions"),
    ({"x": np.zeros((0, 2))}, "empty"),
    ({"x": np.float32(1)}, "scalar"),
])
def test_array_source_bad_arrays_raise(arrays, match):
  with pytest.raises(ValueError, match=match):
    data.ArraySource(**arrays)


def test_array_source_bad_indices_raise():
  source = make_source()
  with pytest.raises(IndexError, match=r"\[0, 10\)"):
    source.take(np.array([0, 10]))
  with pytest.raises(ValueError, match="1-D integer"):
    source.take(np.array([0.0, 1.0]))


def test_check_indices_names_the_source_and_accepts_empty_requests():
  with pytest.raises(IndexError, match=r"\[0, 5\) for imagenet2012/train, got range \[-1, 2\]"):
    check_indices([2, -1], 5, "imagenet2012/train")
  with pytest.raises(ValueError, match="1-D integer index array, got shape \\(2, 1\\)"):
    check_indices([[0], [1]], 5)
  assert check_indices(np.array([], np.int64), 0).size == 0
  np.testing.assert_array_equal(check_indices([4, 0], 5), [4, 0])


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_stream_of_indices_names_the_rows_of_each_batch_from_its_position(shuffle):
  """Over batch-size changes, an epoch boundary and two processes: each index batch picks out of the
  dataset exactly the batch the stream of examples hands out; it starts where the stream is."""
  sizes = [4, 8, 6, 10, 12]
  for process in range(2):
    examples = data.TrainStream(make_source(40), seed=9, process_index=process, process_count=2, shuffle=shuffle)
    examples.next_batch(2)
    indices = examples.of_indices()
    assert indices.get_state() == examples.get_state() and indices.process_index == process
    for size in sizes:
      index = indices.next_batch(size)
      assert set(index) == {data.INDEX} and index[data.INDEX].dtype == np.int32
      assert_batches_equal([make_source(40).take(index[data.INDEX])], [examples.next_batch(size)])
    assert indices.get_state() == examples.get_state()


def test_the_stream_of_indices_of_a_transforming_stream_is_refused():
  stream = data.TrainStream(make_source(), seed=0, transform=noisy_transform(0))
  with pytest.raises(ValueError, match="transforms its examples on the host"):
    stream.of_indices()


@pytest.mark.parametrize("num_examples", [0, -1, 2**31, True, 2.0])
def test_an_index_source_of_no_or_too_many_examples_raises(num_examples):
  with pytest.raises(ValueError, match=r"IndexSource needs a number of examples in \[1, 2\*\*31\)"):
    data.IndexSource(num_examples)


def test_an_index_source_checks_its_indices():
  source = data.IndexSource(5)
  assert len(source) == 5 and repr(source) == "IndexSource(5)"
  np.testing.assert_array_equal(source.take(np.array([4, 0]))[data.INDEX], [4, 0])
  with pytest.raises(IndexError, match=r"must lie in \[0, 5\)"):
    source.take(np.array([5]))
