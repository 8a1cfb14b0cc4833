"""Records that cannot be decoded (a truncated JPEG, bytes that are no image) in a mock TFDS ImageNet split:
named by dataset, split and index; or skipped the same way on every process layout and on a resume."""

import json
import logging

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("cv2")
pytest.importorskip("simplejpeg")

from lbjax.data import imagenet  # pylint: disable=g-import-not-at-top
from lbjax.data import stream  # pylint: disable=g-import-not-at-top
from lbjax.data import synthetic_jpeg  # pylint: disable=g-import-not-at-top

NUM_RECORDS = 16
SEED = 0
# Stream positions 8..15 (the second batch of 8 of epoch 0) hold these dataset indices.
TRUNCATED, NOT_AN_IMAGE = (int(i) for i in stream.epoch_permutation(SEED, 0, NUM_RECORDS)[[9, 13]])


def _records() -> list[dict]:
  jpegs = synthetic_jpeg.imagenet_like_jpegs(NUM_RECORDS, seed=1, large_fraction=0.0)
  truncated = jpegs[TRUNCATED]
  jpegs[TRUNCATED] = truncated[:truncated.index(b"\xff\xda") + 40]  # the header and 40 bytes of the scan
  jpegs[NOT_AN_IMAGE] = b"<html>this is no image</html>"
  return [{"image": image, "label": index} for index, image in enumerate(jpegs)]


@pytest.fixture
def mock_imagenet():
  """`tfds.data_source("imagenet2012", ...)` hands out the records above as JPEG bytes: the train and
  validation splits; the test split holds the same JPEGs without the two bad ones."""
  records = _records()
  good = [dict(record, image=image) for record, image in
          zip(records, synthetic_jpeg.imagenet_like_jpegs(NUM_RECORDS, seed=1, large_fraction=0.0))]

  def as_data_source(builder, split=None, **kwargs):
    del builder, kwargs
    return good if split == "test" else records

  with tfds.testing.mock_data(as_data_source_fn=as_data_source):
    yield


def _train_stream(**kwargs):
  return imagenet.imagenet_train_stream(seed=SEED, image_size=16, num_threads=2, **kwargs)


def test_a_record_that_cannot_be_decoded_names_dataset_split_and_index(mock_imagenet):
  del mock_imagenet
  train = _train_stream()
  train.next_batch(8)  # positions 0..7 decode
  with pytest.raises(stream.UndecodableRecordError) as error:
    train.next_batch(8)
  message = str(error.value)
  assert message.startswith(f"imagenet2012 split 'train': example {TRUNCATED} cannot be decoded (")
  assert "--config.data_options.skip_undecodable=True" in message
  assert error.value.index == TRUNCATED
  evaluation = imagenet.imagenet_eval_batches(NUM_RECORDS, split="validation", image_size=16, num_threads=1)
  with pytest.raises(stream.UndecodableRecordError,
                     match=rf"imagenet2012 split 'validation': example {min(TRUNCATED, NOT_AN_IMAGE)} cannot"):
    next(evaluation)


def test_skipped_records_are_replaced_by_the_next_the_same_on_any_layout_and_resume(mock_imagenet, caplog):
  del mock_imagenet
  caplog.set_level(logging.WARNING)
  train = _train_stream(skip_undecodable=True)
  train.next_batch(8)
  second = train.next_batch(8)
  assert train.undecodable_skipped == 2
  warnings = [r.getMessage() for r in caplog.records if "cannot be decoded" in r.getMessage()]
  assert sorted(warnings) == sorted(
      f"Skipping imagenet2012 split 'train' example {index}, which cannot be decoded ({reason}); reading example "
      f"{index + 1} in its place." for index, reason in (
          (TRUNCATED, "cannot decode a JPEG from 649 encoded bytes: Premature end of JPEG file"),
          (NOT_AN_IMAGE, "cannot read an image from 29 encoded bytes: no JPEG, nor another format Pillow reads")))
  expected_labels = stream.epoch_permutation(SEED, 0, NUM_RECORDS)[8:].copy()
  expected_labels[[1, 5]] = [(TRUNCATED + 1) % NUM_RECORDS, (NOT_AN_IMAGE + 1) % NUM_RECORDS]
  np.testing.assert_array_equal(second["labels"], expected_labels)
  # A second epoch meets them again: skipped and counted again, not warned about again.
  caplog.clear()
  train.next_batch(16)
  assert train.undecodable_skipped == 4
  assert not [r for r in caplog.records if "cannot be decoded" in r.getMessage()]
  # Two processes read the same global batch; a resumed stream reads it again.
  halves = [_train_stream(skip_undecodable=True, process_index=p, process_count=2) for p in (0, 1)]
  for half in halves:
    half.set_state(train.get_state() | {"examples_consumed": 8})
  np.testing.assert_array_equal(np.concatenate([half.next_batch(8)["images"] for half in halves]), second["images"])
  resumed = _train_stream(skip_undecodable=True)
  resumed.set_state(train.get_state() | {"examples_consumed": 8})
  np.testing.assert_array_equal(resumed.next_batch(8)["images"], second["images"])


def test_evaluation_masks_out_the_records_it_skips(mock_imagenet):
  del mock_imagenet
  (batch,) = imagenet.imagenet_eval_batches(NUM_RECORDS, split="validation", image_size=16, num_threads=1,
                                            skip_undecodable=True)
  expected = np.ones(NUM_RECORDS, np.float32)
  expected[[TRUNCATED, NOT_AN_IMAGE]] = 0
  np.testing.assert_array_equal(batch["mask"], expected)


def test_training_stops_keeping_its_checkpoint_then_resumes_skipping(mock_imagenet, tmp_path, monkeypatch, capsys):
  """The CLI: the default run stops at the second step with the first one's checkpoint and says how to go on;
  the same command with skip_undecodable resumes from it, finishes and reports the count."""
  del mock_imagenet
  from lbjax import main as cli  # pylint: disable=g-import-not-at-top
  from lbjax.train import datasets  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(datasets, "_tfds_fingerprint", lambda name, data_dir, splits: {
      role: f"tfds:{name}:5.1.0:{split} ({NUM_RECORDS} rows)" for role, split in zip(("train", "eval"), splits)})
  config_file = tmp_path / "tiny_imagenet.py"
  config_file.write_text(
      "from tests.train import helpers\n\n"
      "def get_config():\n"
      "  return helpers.tiny_resnet_config(dataset='imagenet', data_options={'image_size': 16},\n"
      f"                                   data_dir={str(tmp_path / 'tfds')!r}, batch_size=8, eval_batch_size=16,\n"
      "                                   num_epochs=1.0, checkpoint_every_steps=1, log_every=1, seed=0,\n"
      "                                   **{'data_options.eval_split': 'test'})\n")
  command = ["--config", str(config_file), "--workdir", str(tmp_path / "run")]
  assert cli.main(command) == 1
  stderr = capsys.readouterr().err
  assert f"imagenet2012 split 'train': example {TRUNCATED} cannot be decoded" in stderr
  assert "Traceback" not in stderr
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == ["1"]
  assert cli.main(command + ["--config.data_options.skip_undecodable=True"]) == 0
  records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  skipped = [(r["step"], r.get("undecodable_skipped")) for r in records if r["kind"] == "train"]
  assert skipped[-1] == (2, 2), skipped  # step 2 of the resumed run, the two records of its batch
