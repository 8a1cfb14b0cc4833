"""The device mesh, the shardings of batches, parameters and optimizer state, and model parallelism.

The mesh has four axes: `data` (pure data parallelism), `fsdp` (data parallelism whose members also
split the parameters and optimizer state between them), `stage` (GPipe pipeline stages,
`lbjax.parallel.pipeline`) and `model` (tensor-sharded layers). A batch is split over `data` and
`fsdp`, so the data-parallel size is `data * fsdp`; the devices along `stage` and `model` share each
batch shard. Axis types are set explicitly to `Auto`: shardings are stated at the step's boundary and
XLA's partitioner propagates them inside, as in big_vision and MaxText.

Model parallelism is driven by what a model class declares, so the trainer names no model:
* `PIPELINED_STACK` (with `mesh.stage` > 1): the attribute holding a stack of identical layers, which
  the model's `__call__(..., run_stack=...)` hands to `pipeline_runner`'s runner.
* `TENSOR_PARALLEL_SPECS` (with `mesh.model` > 1): parameter path suffix -> `PartitionSpec` over
  `model` (e.g. the PTB LSTM's embedding rows and softmax columns, the ResNet head's classes); the
  optimizer state of a parameter gets its sharding, and XLA partitions the computation.
"""

from collections.abc import Callable, Sequence
import math
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
import ml_collections

from lbjax.optim.leaf_names import leaf_name
from lbjax.parallel import pipeline
from lbjax.train import config as config_lib
from lbjax.train import names
from lbjax.train.errors import ConfigError

DATA_AXES = ("data", "fsdp")
STAGE_AXIS = pipeline.STAGE_AXIS
MODEL_AXIS = "model"
MESH_AXES = (*DATA_AXES, STAGE_AXIS, MODEL_AXIS)


def build_mesh(data: int = -1, fsdp: int = 1, devices: Sequence[jax.Device] | None = None, *, stage: int = 1,
               model: int = 1) -> Mesh:
  """Builds the (`data`, `fsdp`, `stage`, `model`) mesh over all devices (of all processes).

  Args:
    data: size of the `data` axis; -1 takes all devices left after `fsdp`, `stage` and `model`.
    fsdp: size of the `fsdp` axis (1 = parameters replicated).
    devices: defaults to `jax.devices()`.
    stage: number of pipeline stages (1 = no pipelining).
    model: size of the `model` axis (1 = no tensor sharding).

  Raises:
    ConfigError: if the sizes are not positive (or -1 for `data`) or do not multiply to the number of
      devices.
  """
  devices = list(devices) if devices is not None else jax.devices()
  if problems := size_problems(data, fsdp, stage, model):
    raise ConfigError(problems[0])
  others = fsdp * stage * model
  if data == -1:
    if len(devices) % others:
      named = [f"config.mesh.{n}={v}" for n, v in (("fsdp", fsdp), ("stage", stage), ("model", model)) if v > 1]
      raise ConfigError(f"{' * '.join(named)}{f' = {others}' if len(named) > 1 else ''} does not divide the "
                        f"{len(devices)} devices; choose sizes whose product divides it.")
    data = len(devices) // others
  if data * others != len(devices):
    factors = [("data", data), ("fsdp", fsdp)] + [(n, v) for n, v in (("stage", stage), ("model", model)) if v > 1]
    raise ConfigError(
        f"{' * '.join(f'config.mesh.{n}' for n, _ in factors)} = {' * '.join(str(v) for _, v in factors)} = "
        f"{data * others} but there are {len(devices)} devices; set config.mesh.data=-1 to use all devices.")
  return jax.make_mesh((data, fsdp, stage, model), MESH_AXES, axis_types=(AxisType.Auto,) * 4, devices=devices)


def size_problems(data: Any, fsdp: Any, stage: Any, model: Any) -> list[str]:
  """What is wrong with the mesh's axis sizes whatever the devices (`--dry-run` says it, `build_mesh` raises it)."""
  problems = [f"config.mesh.{name} must be an integer >= 1, got {size!r}."
              for name, size in (("fsdp", fsdp), ("stage", stage), ("model", model))
              if isinstance(size, bool) or not isinstance(size, int) or size < 1]
  if isinstance(data, bool) or not isinstance(data, int) or not (data == -1 or data >= 1):
    problems.append(f"config.mesh.data must be -1 (the devices left after fsdp, stage and model) or an integer "
                    f">= 1, got {data!r}.")
  return problems


def data_parallel_size(mesh: Mesh) -> int:
  """Number of batch shards: the product of the `data` and `fsdp` axis sizes."""
  return math.prod(mesh.shape[a] for a in DATA_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (example) axis split over `data` x `fsdp`, other axes whole."""
  return NamedSharding(mesh, P(DATA_AXES))


def call_batch_sharding(mesh: Mesh) -> NamedSharding:
  """A call's batches stacked [k, B, ...] (`config.steps_per_call`): the step axis whole, the example
  axis split as a batch's."""
  return NamedSharding(mesh, P(None, DATA_AXES))


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


def _is_under(name: str, suffix: str) -> bool:
  """Whether the parameter path `name` ends with the path `suffix` ('softmax/kernel')."""
  return name == suffix or name.endswith("/" + suffix)


def _divides(mesh: Mesh, spec: P, shape: Sequence[int]) -> bool:
  """Whether every dimension `spec` splits is a multiple of the devices it is split over."""
  for axes, size in zip(spec, shape):
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    if size % math.prod(mesh.shape[name] for name in names):
      return False
  return True


def parameter_shardings(mesh: Mesh, tree: Any, specs: dict[str, P]) -> Any:
  """The shardings of a parameter tree, or of optimizer state that mirrors it: a leaf whose path ends
  with a key of `specs`, has its rank and the sizes it splits (`_divides`) gets that spec, every other
  leaf `parameter_sharding`. (Optimizer state need not mirror a parameter's shape: Adafactor keeps a
  (1,)-shaped statistic of a 1-D bias.)"""

  def sharding(path, leaf):
    name = leaf_name(path)
    for suffix, spec in specs.items():
      if _is_under(name, suffix) and len(spec) == len(leaf.shape) and _divides(mesh, spec, leaf.shape):
        return NamedSharding(mesh, spec)
    return parameter_sharding(mesh, leaf.shape)

  return jax.tree_util.tree_map_with_path(sharding, tree)


def tensor_parallel_specs(mesh: Mesh, model: Any) -> dict[str, P]:
  """The model's `TENSOR_PARALLEL_SPECS` when the mesh has a `model` axis of more than one device."""
  return dict(getattr(model, "TENSOR_PARALLEL_SPECS", {})) if mesh.shape[MODEL_AXIS] > 1 else {}


def model_parallel_problems(config: ml_collections.ConfigDict, data_parallel_size: int, model_class: Any) -> list[str]:
  """What refuses `mesh.stage`, `mesh.model` and `pipeline.*` before compute (the model's class, or
  None when its name does not resolve: that is reported elsewhere)."""
  stage, model, pipe = config.mesh.stage, config.mesh.model, config.pipeline
  micro = pipe.num_microbatches
  problems = []
  if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
    return [f"config.pipeline.num_microbatches must be an integer >= 1, got {micro!r}."]
  if not isinstance(stage, int) or not isinstance(model, int) or stage < 1 or model < 1:
    return problems  # build_mesh refuses them
  if stage == 1 and (micro != 1 or pipe.remat):
    problems.append(f"config.pipeline.num_microbatches={micro} / remat={pipe.remat} pipeline the model over "
                    "config.mesh.stage stages, but mesh.stage=1: set mesh.stage >= 2 or leave pipeline.* at 1 / False.")
  if stage == 1 and model == 1:
    return problems
  parallel = f"config.mesh.stage={stage}" if stage > 1 else f"config.mesh.model={model}"
  if stage > 1 and model > 1:
    problems.append(f"config.mesh.stage={stage} and config.mesh.model={model}: lbjax composes either pipelining or "
                    "tensor sharding with data parallelism, not both; set one of them to 1.")
  if config.mesh.fsdp != 1:
    problems.append(f"{parallel} with config.mesh.fsdp={config.mesh.fsdp}: model parallelism composes with plain "
                    "data parallelism (mesh.data); set mesh.fsdp=1.")
  if config.compression.name != "none" or config.mesh.per_device_gradients:
    what = (f"config.compression.name={config.compression.name!r}" if config.compression.name != "none"
            else "config.mesh.per_device_gradients=True")
    problems.append(f"{what} computes whole per-device gradients in shard_map, which {parallel} splits over "
                    f"devices; set compression.name='none' and mesh.per_device_gradients=False, or "
                    f"{parallel.split('=')[0]}=1.")
  if config.batch.micro_batch_size:
    problems.append(f"config.batch.micro_batch_size={config.batch.micro_batch_size} (the any-batch step) is not "
                    f"model-parallel; set it to 0 (batch.policy 'schedule' or 'fixed') or {parallel.split('=')[0]}=1.")
  attribute = "PIPELINED_STACK" if stage > 1 else "TENSOR_PARALLEL_SPECS"
  declared = names.declared_class(model_class)
  if declared is not None and not hasattr(declared, attribute):
    problems.append(_undeclared(parallel, repr(config.model), attribute))
  if stage > 1:
    if config.max_device_batch:
      problems.append(f"config.max_device_batch={config.max_device_batch} with {parallel}: the pipeline already "
                      "splits each batch into config.pipeline.num_microbatches micro-batches; set max_device_batch=0 "
                      "and raise pipeline.num_microbatches to hold less at once.")
    for size in config_lib.batch_sizes(config):
      if isinstance(size, int) and size > 0 and size % (data_parallel_size * micro):
        problems.append(f"global batch size {size} does not split into {data_parallel_size} data shard(s) of "
                        f"config.pipeline.num_microbatches={micro} micro-batches; use a multiple of "
                        f"{data_parallel_size * micro} or change num_microbatches.")
  return problems


def _undeclared(parallel: str, model: str, attribute: str) -> str:
  return (f"{parallel}: config.model={model} declares no {attribute} (a stack of identical layers to pipeline, or "
          f"parameters to shard over 'model'); use a model that does (PtbLSTM; the ResNets for mesh.model) or "
          f"{parallel.split('=')[0]}=1.")


def check_model_parallelism(mesh: Mesh, model: Any, params: Any) -> None:
  """Refuses, from the model's abstract parameters, a stack whose layers differ or do not split into
  the stages, and a sharded dimension the `model` axis does not divide.

  Raises:
    ConfigError: naming the model option to change.
  """
  stages, size = mesh.shape[STAGE_AXIS], mesh.shape[MODEL_AXIS]
  for axis, attribute in ((STAGE_AXIS, "PIPELINED_STACK"), (MODEL_AXIS, "TENSOR_PARALLEL_SPECS")):
    if mesh.shape[axis] > 1 and not hasattr(model, attribute):
      raise ConfigError(_undeclared(f"config.mesh.{axis}={mesh.shape[axis]}", type(model).__name__, attribute))
  if stages > 1:
    stack = params[model.PIPELINED_STACK]
    layers = [jax.tree.map(lambda x: x.shape, stack[k]) for k in sorted(stack)]
    if any(layer != layers[0] for layer in layers):
      raise ConfigError(f"config.mesh.stage={stages}: {type(model).__name__}'s {len(layers)} layers are not identical "
                        f"(shapes {layers}); pipelining stacks them (for PtbLSTM set model_options.embed_size equal "
                        "to hidden_size).")
    if len(layers) % stages:
      raise ConfigError(f"config.mesh.stage={stages} does not divide the {len(layers)} layers of "
                        f"{type(model).__name__}; choose a divisor, or set model_options.num_layers to a multiple.")
  for suffix, spec in tensor_parallel_specs(mesh, model).items():
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
      name = leaf_name(path)
      if not _is_under(name, suffix):
        continue
      for dim, axis in zip(leaf.shape, spec):
        if axis == MODEL_AXIS and dim % size:
          raise ConfigError(f"config.mesh.model={size} does not divide {name}'s dimension of {dim} "
                            f"({type(model).__name__} shards it over 'model'); choose a divisor of {dim}.")


def pipeline_runner(mesh: Mesh, config: ml_collections.ConfigDict) -> Callable | None:
  """The `run_stack` a model with `PIPELINED_STACK` is called with in training, or None without stages."""
  if mesh.shape[STAGE_AXIS] == 1:
    return None
  return pipeline.stack_runner(mesh, config.pipeline.num_microbatches, stage_axis=STAGE_AXIS, batch_axis=DATA_AXES,
                               remat=config.pipeline.remat)
