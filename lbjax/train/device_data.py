"""The training set held on the devices (`config.train_data_on_device`): placed once, each batch gathered
there from its examples' indices.

A small training set of in-memory arrays (MNIST: 47 MB of uint8 pixels) fits on every device. The host's
stream then hands out each batch's dataset indices (`lbjax.data.TrainStream.of_indices`: the same examples
in the same order, the same checkpointed position), and one small jitted program gathers the batch's rows
from the copy on each device, split as the batch is (on one process its call places the host's indices
itself; on several each process's share is placed first, as a batch is). A step's host -> device transfer is
B int32 indices instead of the batch (MNIST at B=128: 512 bytes instead of 100 KB) and no host thread
copies pixels, which is what the loop of a small model waits for on an accelerator (benchmarks/README.md,
Findings 11). The batches are bit for bit the host stream's; evaluation reads the host's eval split as
always. Every device holds the whole training set, so it is for data much smaller than a device's memory
(refused above half of it), read by a stream without host transforms (no augmentation on the host).
"""

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from lbjax import data as lbdata
from lbjax.train.build import global_batch, global_call_batches, place
from lbjax.train.errors import ConfigError
from lbjax.train.protocols import HostBatch

FIELD = "config.train_data_on_device"
MAX_MEMORY_FRACTION = 0.5  # of a device's memory, the most the training set may take


class DeviceTrainingSet:
  """A run's training set, held on every device of its mesh, and the gather of a batch from it.

  Attributes:
    stream: the run's index stream (`TrainStream.of_indices` of the dataset's stream), at its position.
    nbytes: the bytes of the training set, held by each device.
  """

  def __init__(self, stream: Any, dataset_name: str):
    """Takes the training set's arrays from `stream` (the dataset's training stream) and makes its index
    stream; nothing is placed yet (`place`).

    Raises:
      ConfigError: the stream is not one of in-memory arrays read without host transforms.
    """
    self.stream = index_stream(stream, dataset_name)
    self._host_arrays: Mapping[str, np.ndarray] | None = stream.source.arrays
    self.nbytes = sum(array.nbytes for array in self._host_arrays.values())
    self._arrays: dict[str, jax.Array] | None = None
    self._replicated: jax.sharding.Sharding | None = None
    self._one_process = jax.process_count() == 1  # the jitted gather then places the host's indices itself
    self._gathers: dict[jax.sharding.Sharding, Any] = {}

  def place(self, replicated: jax.sharding.Sharding) -> None:
    """Puts the training set on every device of `replicated` (once; the host's copy is let go).

    Raises:
      ConfigError: it would take more than half of a device's memory.
    """
    for device in replicated.addressable_devices:  # the others' memory is not this process's to read
      check_fits(self.nbytes, (device.memory_stats() or {}).get("bytes_limit"), str(device))
    self._arrays, self._host_arrays = place(dict(self._host_arrays), replicated), None
    self._replicated = replicated

  def batch(self, local: HostBatch, sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
    """The global batch whose rows this process names in `local` (`{"index": [B/P]}`), split by `sharding`."""
    if self._one_process:  # one dispatch, not a placement and a dispatch
      return self._gather(sharding)(self._arrays, local[lbdata.INDEX])
    return self.gather(global_batch(local, sharding))

  def call_batch(self, local_batches: list[HostBatch], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
    """A call's batches stacked [k, B, ...] (`build.global_call_batches` of their rows), split by `sharding`."""
    if self._one_process:
      return self._gather(sharding)(self._arrays, np.stack([local[lbdata.INDEX] for local in local_batches]))
    return self.gather(global_call_batches(local_batches, sharding))

  def gather(self, placed: dict[str, jax.Array] | list[dict[str, jax.Array]]) -> Any:
    """The batch (or each micro-batch of a list) whose indices are placed in `placed` (`{"index": [..., B]}`),
    each array split as the indices are."""
    if isinstance(placed, list):
      return [self.gather(micro_batch) for micro_batch in placed]
    index = placed[lbdata.INDEX]
    return self._gather(index.sharding)(self._arrays, index)

  def _gather(self, sharding: jax.sharding.Sharding) -> Any:
    """The jitted gather of rows by indices split by `sharding`, the rows split the same way."""
    if sharding not in self._gathers:
      self._gathers[sharding] = jax.jit(_rows, in_shardings=(self._replicated, sharding),
                                        out_shardings={name: sharding for name in self._arrays})
    return self._gathers[sharding]


def index_stream(stream: Any, dataset_name: str) -> lbdata.TrainStream:
  """`stream.of_indices()`, for a stream of in-memory arrays read without host transforms.

  Raises:
    ConfigError: any other stream (the message says which kind it is).
  """
  if not isinstance(stream, lbdata.TrainStream) or not isinstance(stream.source, lbdata.ArraySource):
    kind = type(stream).__name__ + (f" of a {type(stream.source).__name__}" if isinstance(stream, lbdata.TrainStream)
                                    else "")
    raise refusal(dataset_name, f"does not read in-memory arrays (it is a {kind})")
  try:
    return stream.of_indices()
  except ValueError:
    raise refusal(dataset_name, "transforms its examples on the host (e.g. augmentation), which a gather of the "
                                "dataset's rows on the devices cannot do") from None


def check_fits(nbytes: int, device_bytes: int | None, device: str) -> None:
  """Raises ConfigError if a training set of `nbytes` takes more than half of `device_bytes` (None: unknown)."""
  if device_bytes and nbytes > MAX_MEMORY_FRACTION * device_bytes:
    raise ConfigError(f"{FIELD}=True would hold the training set ({nbytes / 2**30:.2f} GiB) on each device, more "
                      f"than half of {device}'s memory ({device_bytes / 2**30:.2f} GiB). Set {FIELD}=False.")


def refusal(dataset_name: str, why: str) -> ConfigError:
  """The error of a training set that cannot be held on the devices: `why` says what its stream does."""
  return ConfigError(f"{FIELD}=True holds the training set on the devices, but the training stream of "
                     f"{dataset_name!r} {why}; mnist's, synthetic_mnist's, synthetic_images' and the synthetic image "
                     f"twins' can be, and a user's lbjax.data.TrainStream of an ArraySource. Set {FIELD}=False (the "
                     "batches then travel from the host).")


def _rows(arrays: dict[str, jax.Array], index: jax.Array) -> dict[str, jax.Array]:
  """Each array's rows `index` ([..., B] -> [..., B, ...]); the stream's indices are in range."""
  return {name: array.at[index].get(mode="promise_in_bounds") for name, array in arrays.items()}
