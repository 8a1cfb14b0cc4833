"""Checks every augmenting training stream must pass (used by the CIFAR and ImageNet tests)."""

import numpy as np

from lbjax.data import stream


def check_augmented_stream(source, transform, seed: int, process_count: int, resume_after: int):
  """Three batches of 8 from one process equal the concatenated shares of `process_count` processes,
  and a stream restored after `resume_after` batches continues with the same augmented images.

  Returns:
    The three reference batches.
  """
  single = stream.TrainStream(source, seed=seed, transform=transform)
  reference = [single.next_batch(8) for _ in range(3)]
  shares_by_process = [stream.TrainStream(source, seed=seed, process_index=p, process_count=process_count,
                                          transform=transform) for p in range(process_count)]
  for batch in reference:
    shares = [share.next_batch(8) for share in shares_by_process]
    for key in ("images", "labels"):
      np.testing.assert_array_equal(batch[key], np.concatenate([s[key] for s in shares]))
  resumed = stream.TrainStream(source, seed=seed, transform=transform)
  resumed.set_state({**single.get_state(), "examples_consumed": 8 * resume_after})
  np.testing.assert_array_equal(resumed.next_batch(8)["images"], reference[resume_after]["images"])
  return reference
