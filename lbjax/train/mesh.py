"""The device mesh and the shardings of batches, parameters and optimizer state.

The mesh has two axes: `data` (pure data parallelism) and `fsdp` (data parallelism whose members also
split the parameters and optimizer state between them). A batch is split over both axes, so the
data-parallel size is `data * fsdp`. Axis types are set explicitly to `Auto`: shardings are stated at
the step's boundary and XLA's partitioner propagates them inside, as in big_vision and MaxText.
"""

from collections.abc import Sequence
import math

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from lbjax.train.errors import ConfigError

DATA_AXES = ("data", "fsdp")


def build_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (`data`, `fsdp`) mesh over all devices (of all processes).

  Args:
    data: size of the `data` axis; -1 takes all devices left after `fsdp`.
    fsdp: size of the `fsdp` axis (1 = parameters replicated).
    devices: defaults to `jax.devices()`.

  Raises:
    ConfigError: if the sizes are not positive (or -1 for `data`) or do not multiply to the number of
      devices.
  """
  devices = list(devices) if devices is not None else jax.devices()
  if fsdp < 1:
    raise ConfigError(f"config.mesh.fsdp must be >= 1, got {fsdp}.")
  if data == -1:
    if len(devices) % fsdp:
      raise ConfigError(f"config.mesh.fsdp={fsdp} does not divide the {len(devices)} devices; choose a divisor.")
    data = len(devices) // fsdp
  if data < 1:
    raise ConfigError(f"config.mesh.data must be -1 (the devices left after fsdp) or >= 1, got {data}.")
  if data * fsdp != len(devices):
    raise ConfigError(
        f"config.mesh.data * config.mesh.fsdp = {data} * {fsdp} = {data * fsdp} but there are {len(devices)} "
        "devices; set config.mesh.data=-1 to use all devices.")
  return jax.make_mesh((data, fsdp), DATA_AXES, axis_types=(AxisType.Auto, AxisType.Auto), devices=devices)


def data_parallel_size(mesh: Mesh) -> int:
  """Number of batch shards: the product of the `data` and `fsdp` axis sizes."""
  return math.prod(mesh.shape[a] for a in DATA_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (example) axis split over `data` x `fsdp`, other axes whole."""
  return NamedSharding(mesh, P(DATA_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def parameter_sharding(mesh: Mesh, shape: Sequence[int]) -> NamedSharding:
  """FSDP rule: split the largest axis divisible by the `fsdp` size; replicate the rest.

  With `fsdp == 1`, or for leaves with no divisible axis (scalars, small biases), the leaf is
  replicated.
  """
  size = mesh.shape["fsdp"]
  if size == 1 or not shape:
    return replicated(mesh)
  candidates = [i for i, n in enumerate(shape) if n % size == 0]
  if not candidates:
    return replicated(mesh)
  axis = max(candidates, key=lambda i: shape[i])
  spec = [None] * len(shape)
  spec[axis] = "fsdp"
  return NamedSharding(mesh, P(*spec))
