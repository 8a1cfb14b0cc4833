"""Tests of the PTB corpus, the stateful window stream and the evaluation windows."""

import json

import numpy as np
import pytest

from lbjax import data
from lbjax import schedules


@pytest.fixture(scope="module")
def corpus(shared_data):
  return data.PtbCorpus.from_dir(shared_data)


def test_vocabulary_and_token_counts_match_mikolovs_ptb(corpus):
  assert corpus.vocab_size == 10000
  assert "<unk>" in corpus.word_to_id and "<eos>" in corpus.word_to_id
  assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (929589, 73760, 82430)
  eos = corpus.word_to_id["<eos>"]
  assert [int((split == eos).sum()) for split in (corpus.train, corpus.valid, corpus.test)] == [
      42068, 3370, 3761]  # one <eos> per line
  assert all(split.dtype == np.int32 for split in (corpus.train, corpus.valid, corpus.test))
  assert corpus.train.max() == 9999 and corpus.train.min() == 0


def test_ids_are_by_descending_frequency(corpus):
  counts = np.bincount(corpus.train, minlength=corpus.vocab_size)
  assert (np.diff(counts) <= 0).all()
  assert corpus.vocab[:3] == ("the", "<unk>", "<eos>")


def test_tokens_decode_to_the_text(corpus):
  assert corpus.decode(corpus.train[:4]) == ["aer", "banknote", "berlitz", "calloway"]
  assert corpus.decode(corpus.valid[:6]) == ["consumers", "may", "want", "to", "move", "their"]


def test_ties_are_alphabetical_and_unknown_words_map_to_unk():
  corpus = data.PtbCorpus.from_texts(" b a <unk> \n a c b \n", " a zz \n", " c \n")
  assert corpus.vocab == ("<eos>", "a", "b", "<unk>", "c")
  assert corpus.decode(corpus.train) == ["b", "a", "<unk>", "<eos>", "a", "c", "b", "<eos>"]
  assert corpus.decode(corpus.valid) == ["a", "<unk>", "<eos>"]
  with pytest.raises(ValueError, match="no <unk>"):
    data.PtbCorpus.from_texts(" a \n", " b \n", " a \n")


def test_missing_files_say_where_to_get_ptb(tmp_path):
  (tmp_path / "ptb.train.txt").write_text(" a \n")
  with pytest.raises(FileNotFoundError, match=r"ptb.valid.txt not found in the data folder .* \(set by data_dir, "
                                              r"lbjax-train's config.data_dir\)\. PTB is read from <data folder>/ptb/: "
                                              r".*to the folder that holds ptb/\..*simple-examples"):
    data.PtbCorpus.from_dir(tmp_path)
  with pytest.raises(FileNotFoundError, match="not a directory"):
    data.PtbCorpus.from_dir(tmp_path / "absent")


def test_non_utf8_file_raises(tmp_path):
  for name in ("train", "valid", "test"):
    (tmp_path / f"ptb.{name}.txt").write_text(" a \n")
  (tmp_path / "ptb.test.txt").write_bytes(b"\xff\xfe a \n")
  with pytest.raises(ValueError, match="ptb.test.txt is not UTF-8"):
    data.PtbCorpus.from_dir(tmp_path)


TOKENS = np.arange(103, dtype=np.int32)  # distinct ids show exactly where each window comes from


def test_windows_follow_the_standard_row_layout():
  stream = data.PtbStream(TOKENS, seq_len=3)
  rows = TOKENS[:100].reshape(4, 25)
  assert stream.windows_per_epoch(4) == 8  # (25 - 1) // 3
  for i in range(8):
    batch = stream.next_batch(4)
    np.testing.assert_array_equal(batch["inputs"], rows[:, 3 * i:3 * i + 3])
    np.testing.assert_array_equal(batch["targets"], rows[:, 3 * i + 1:3 * i + 4])
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
    assert batch["reset_carry"] == (i == 0) and batch["reset_carry"].dtype == np.bool_
    assert batch["inputs"].dtype == batch["targets"].dtype == np.int32
  assert stream.epoch() == 1.0
  assert stream.next_batch(4)["reset_carry"]  # the next epoch starts over and resets the carry
  assert stream.get_state()["epochs_completed"] == 1


def test_epoch_is_exact_within_an_epoch():
  stream = data.PtbStream(TOKENS, seq_len=3)
  for _ in range(3):
    stream.next_batch(4)
  assert stream.epoch() == 3 / 8


def test_two_process_rows_make_up_the_single_process_window():
  single = data.PtbStream(TOKENS, seq_len=5)
  shards = [data.PtbStream(TOKENS, seq_len=5, process_index=p, process_count=2) for p in range(2)]
  for _ in range(6):
    batch = single.next_batch(4)
    parts = [s.next_batch(4) for s in shards]
    for key in ("inputs", "targets"):
      assert parts[0][key].shape == (2, 5)
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), batch[key])
    assert parts[0]["reset_carry"] == parts[1]["reset_carry"] == batch["reset_carry"]


def _epoch_targets_and_rows(stream, sizes):
  """The targets of the windows at `sizes`, and each layout's rows as the windows rebuild them."""
  targets, layouts = [], []
  for size in sizes:
    batch = stream.next_batch(size)
    if batch["reset_carry"]:
      layouts.append([batch["inputs"][:, :1]])
    layouts[-1].append(batch["targets"])
    targets.append(batch["targets"].reshape(-1))
  return np.concatenate(targets), [np.concatenate(parts, axis=1) for parts in layouts]


def test_a_batch_change_mid_epoch_relays_every_unpredicted_token_once():
  """Epoch of 103 distinct ids: 3 windows of 4 rows (T = 3), then 2 rows, then 3 rows. Each
  re-lay lays out, in the standard row layout, exactly the tokens the previous rows had not yet
  predicted (row after row); no token is predicted twice in the epoch; the carry resets at each."""
  stream = data.PtbStream(TOKENS, seq_len=3)
  targets, layouts = _epoch_targets_and_rows(stream, [4] * 3 + [2] * 2 + [3] * 2)
  rest = TOKENS[:100].reshape(4, 25)[:, 10:].reshape(-1)  # the 60 tokens after each row's 9 targets
  assert len(layouts) == 3
  np.testing.assert_array_equal(layouts[1], rest.reshape(2, 30)[:, :7])
  rest = rest.reshape(2, 30)[:, 7:].reshape(-1)  # 46 tokens left
  np.testing.assert_array_equal(layouts[2], rest[:45].reshape(3, 15)[:, :7])
  assert len(np.unique(targets)) == len(targets)
  assert stream.get_state()["relays"] == [[4, 3], [2, 2]]


def test_epoch_never_jumps_at_a_relay_and_ends_at_the_layouts_last_window():
  stream = data.PtbStream(TOKENS, seq_len=3)
  for _ in range(4):
    stream.next_batch(4)
  assert stream.epoch() == 4 / 8
  stream.next_batch(2)  # the rest: 4 x 12 tokens as 2 rows of 24, 7 windows
  assert stream.epoch() == 4 / 8 + (1 - 4 / 8) / 7
  for _ in range(6):
    stream.next_batch(2)
  assert stream.epoch() == 1.0 and stream.get_state()["relays"] == []
  assert stream.next_batch(2)["reset_carry"] and stream.get_state()["windows_done"] == 1


def test_epoch_after_a_relay_is_the_exact_fraction_rounded_once():
  """Half an epoch at 2 rows (83 of 166 windows), then 35 of the rest's 55 windows at 3 rows: 9/11 of the epoch.
  Summed in floats it was 0.8181818181818181, below a boundary at epoch 9/11, whose batch size (or LR) then
  began a step late."""
  stream = data.PtbStream(np.arange(1000, dtype=np.int32), seq_len=3)
  for size, windows in ((2, 83), (3, 35)):
    for _ in range(windows):
      stream.next_batch(size)
  assert stream.epoch() == 9 / 11
  assert schedules.BatchSizeSchedule((3, 6), (9 / 11,))(stream.epoch()) == 6


def test_a_rest_too_short_for_the_new_rows_ends_the_epoch():
  stream = data.PtbStream(TOKENS, seq_len=3)
  for _ in range(7):
    stream.next_batch(4)  # 4 rows x 4 tokens left: too few for one window of 8 rows
  batch = stream.next_batch(8)
  assert batch["reset_carry"] and stream.get_state()["epochs_completed"] == 1
  np.testing.assert_array_equal(batch["inputs"], TOKENS[:96].reshape(8, 12)[:, :3])


def test_start_epoch_says_where_a_batch_of_that_size_starts_and_end_epoch_skips_the_rest():
  stream = data.PtbStream(TOKENS, seq_len=3)
  for _ in range(7):
    stream.next_batch(4)
  at = stream.epoch()
  assert stream.start_epoch(4) == stream.start_epoch(2) == at < 1.0  # the same rows go on; 2 rows fit the rest
  assert stream.start_epoch(8) == 1.0  # what next_batch(8) would do: the rest holds no window of 8 rows
  stream.end_epoch()
  assert stream.epoch() == stream.start_epoch(8) == 1.0 and stream.get_state()["windows_done"] == 0
  stream.end_epoch()  # at an epoch's start: nothing to end
  assert stream.epoch() == 1.0
  batch = stream.next_batch(4)
  assert batch["reset_carry"]
  np.testing.assert_array_equal(batch["inputs"], TOKENS[:100].reshape(4, 25)[:, :3])


def test_resume_mid_epoch_is_exact_also_across_batch_size_change():
  def run(stream, sizes):
    return [stream.next_batch(size) for size in sizes]

  sizes = [4] * 5 + [2] * 3 + [3] * 4 + [4] * 3
  reference = run(data.PtbStream(TOKENS, seq_len=3), sizes)
  for split in (3, 5, 6, 9, 13):
    first = data.PtbStream(TOKENS, seq_len=3)
    run(first, sizes[:split])
    resumed = data.PtbStream(TOKENS, seq_len=3)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    assert resumed.epoch() == first.epoch()
    for got, want in zip(run(resumed, sizes[split:]), reference[split:]):
      for key in want:
        np.testing.assert_array_equal(got[key], want[key])


@pytest.mark.parametrize("change, match", [
    ({"num_tokens": 50}, "does not fit this stream: state num_tokens"),
    ({"seq_len": 4}, "does not fit this stream: state seq_len"),
    ({"windows_done": 8, "batch_size": 4}, "not below the 8 windows"),
    ({"epochs_completed": -1}, "non-negative integer"),
    ({"relays": [[4, 0]], "windows_done": 1, "batch_size": 2}, "pairs of positive integers"),
    ({"relays": [[4, 3]]}, "no window done after the last one"),
])
def test_state_mismatch_raises(change, match):
  stream = data.PtbStream(TOKENS, seq_len=3)
  with pytest.raises(ValueError, match=match):
    stream.set_state({**stream.get_state(), **change})


def test_state_of_a_train_stream_raises():
  stream = data.PtbStream(TOKENS, seq_len=3)
  with pytest.raises(ValueError, match="must be a dict with keys"):
    stream.set_state({"examples_consumed": 0, "seed": 0, "num_examples": 103, "shuffle": 0})


@pytest.mark.parametrize("kwargs, batch_size, error, match", [
    ({"seq_len": 3, "process_count": 2}, 3, ValueError, "not divisible by process_count=2"),
    ({"seq_len": 30}, 4, ValueError, "too few for batch size 4 and seq_len 30"),
    ({"seq_len": 0}, 4, ValueError, "seq_len must be a positive integer"),
    ({"process_index": 1}, 4, ValueError, "process_index"),
])
def test_bad_stream_arguments_raise(kwargs, batch_size, error, match):
  with pytest.raises(error, match=match):
    data.PtbStream(TOKENS, **kwargs).next_batch(batch_size)


def test_non_token_input_raises():
  with pytest.raises(ValueError, match="1-D integer array"):
    data.PtbStream(np.zeros((3, 4), np.int32))


def test_eval_with_one_row_scores_every_prediction_once():
  batches = list(data.ptb_eval_batches(TOKENS, 1, seq_len=5))
  assert len(batches) == 21  # ceil(102 / 5)
  mask = np.concatenate([b["mask"][0] for b in batches])
  targets = np.concatenate([b["targets"][0] for b in batches])
  inputs = np.concatenate([b["inputs"][0] for b in batches])
  np.testing.assert_array_equal(targets[mask == 1], TOKENS[1:])
  np.testing.assert_array_equal(inputs[mask == 1], TOKENS[:-1])
  assert [bool(b["reset_carry"]) for b in batches] == [True] + [False] * 20


def test_eval_rows_and_processes():
  single = list(data.ptb_eval_batches(TOKENS, 4, seq_len=7))
  rows = TOKENS[:100].reshape(4, 25)
  assert sum(b["mask"].sum() for b in single) == 4 * 24
  targets = np.concatenate([b["targets"] for b in single], axis=1)
  mask = np.concatenate([b["mask"] for b in single], axis=1)
  np.testing.assert_array_equal(targets[mask == 1].reshape(4, 24), rows[:, 1:])
  shards = [list(data.ptb_eval_batches(TOKENS, 4, seq_len=7, process_index=p, process_count=2))
            for p in range(2)]
  for i, batch in enumerate(single):
    for key in ("inputs", "targets", "mask"):
      np.testing.assert_array_equal(
          np.concatenate([shards[0][i][key], shards[1][i][key]]), batch[key])


def test_eval_perplexity_equals_the_full_corpus_perplexity():
  tokens = data.synthetic_ptb_tokens(500, 13, seed=0)
  rng = np.random.default_rng(0)
  log_probs = np.log(rng.dirichlet(np.ones(13), size=13))  # a fixed bigram model p(next | current)
  direct = -log_probs[tokens[:-1], tokens[1:]].mean()
  total_ce, total_tokens = 0.0, 0.0
  for batch in data.ptb_eval_batches(tokens, 1, seq_len=20):
    ce = -log_probs[batch["inputs"], batch["targets"]]
    total_ce += float((ce * batch["mask"]).sum())
    total_tokens += float(batch["mask"].sum())
  assert total_tokens == 499
  np.testing.assert_allclose(np.exp(total_ce / total_tokens), np.exp(direct), rtol=1e-12)


def test_real_validation_set_is_covered(corpus):
  stream = data.PtbStream(corpus.train, seq_len=20)
  assert stream.windows_per_epoch(20) == 2323  # (929589 // 20 - 1) // 20
  scored = sum(b["mask"].sum() for b in data.ptb_eval_batches(corpus.valid, 10, seq_len=20))
  assert scored == 10 * (73760 // 10 - 1)


def test_eval_bad_arguments_raise():
  with pytest.raises(ValueError, match="too few for 60 evaluation rows"):
    data.ptb_eval_batches(TOKENS, 60)
  with pytest.raises(ValueError, match="not divisible by process_count=3"):
    data.ptb_eval_batches(TOKENS, 4, process_count=3)
