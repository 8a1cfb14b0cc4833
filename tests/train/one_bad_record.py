"""A user dataset for the multi-host tests: `synthetic_mnist` whose training example `BAD_POSITION` of epoch 0
cannot be decoded. At batch 32 on 2 processes it is row 20 of step 4, in process 1's half of the batch: only
process 1 stops on it (`--config.dataset=tests.train.one_bad_record:bad_mnist`)."""

import dataclasses

import numpy as np

from lbjax import data as lbdata
from lbjax.data import stream
from lbjax.train import datasets

BAD_POSITION = 3 * 32 + 20  # in the stream of epoch 0: step 4 (1-based), row 20 of 32


class _SourceWithABadRecord(lbdata.ArraySource):
  """An `ArraySource` whose record `bad` raises `UndecodableExample`, as a truncated JPEG does."""

  def __init__(self, bad: int, **arrays):
    super().__init__(**arrays)
    self.bad = bad

  def take(self, indices):
    rows = {int(row): "truncated JPEG (simulated)" for row in np.flatnonzero(np.asarray(indices) == self.bad)}
    if rows:
      raise stream.UndecodableExample(rows)
    return super().take(indices)


def bad_mnist(data_dir=None, *, seed=0, num_train_examples=256, num_eval_examples=64):
  del data_dir
  dataset = datasets.synthetic_mnist(seed=seed, num_train_examples=num_train_examples,
                                     num_eval_examples=num_eval_examples)
  bad = int(stream.epoch_permutation(seed, 0, num_train_examples)[BAD_POSITION])
  source = _SourceWithABadRecord(bad, **lbdata.synthetic_mnist(num_train_examples, seed=seed, split="train").arrays)

  def make_train_stream(process_index, process_count):
    return lbdata.TrainStream(source, seed=seed, process_index=process_index, process_count=process_count)

  return dataclasses.replace(dataset, make_train_stream=make_train_stream)
