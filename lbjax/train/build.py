"""From a resolved run and its task to the parts the compiled steps need, on a mesh: `StepParts`.

`Run` builds one and initialises the state from it; `--compile-only` (no data read, no parameter
initialised) builds the same from abstract arrays:

    resolved = validation.validate(config)
    mesh = resolved.mesh.build(devices)                  # e.g. a TPU topology's devices
    parts = build.StepParts.create(resolved, task, mesh)  # model graph, optimizer, shardings (shapes only)
    state = parts.abstract_state()                        # jax.ShapeDtypeStruct leaves with shardings
    step = parts.train_step(batch_size, discard_fraction, state, batch)   # jitted, shardings bound
    step.lower(state, batch, parts.abstract_learning_rate()).compile()
    parts.eval_step().lower(state.params, state.model_state, batch, carry).compile()

`batch` is a dict of arrays (or `jax.ShapeDtypeStruct`s) split by `parts.batch_sharding`; one train
step per batch size of `resolved.batch.sizes` and loss variant, or the any-batch pair
(`lbjax.train.any_batch.AnyBatchStep`) with `resolved.batch.micro_batch_size`.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from flax import nnx
import jax
import numpy as np
import optax

from lbjax import optim
from lbjax.optim import compression
from lbjax.train import mesh as mesh_lib
from lbjax.train import step_calls
from lbjax.train.batch_plan import BatchPlan
from lbjax.train.errors import ConfigError
from lbjax.train.protocols import HostBatch, Task
from lbjax.train.resolved import ResolvedRun
from lbjax.train.state import TrainState
from lbjax.train.step import make_eval_step, make_train_step


def global_batch(local: HostBatch, sharding) -> dict[str, jax.Array]:
  """Assembles every process's share of a batch into global arrays split by `sharding` (one call for
  all arrays: on one process a single batched `device_put`)."""
  count = jax.process_count()
  return jax.make_array_from_process_local_data(
      sharding, local, {k: (v.shape[0] * count,) + v.shape[1:] for k, v in local.items()})


def global_call_batches(local_batches: Sequence[HostBatch], sharding) -> dict[str, jax.Array]:
  """A call's batches (`config.steps_per_call`; every process's share of each) as global [k, B, ...]
  arrays split by `sharding` (`mesh.call_batch_sharding`), placed in one call: each input stacked over
  the k batches on the host, one copy of them for one transfer instead of k (benchmarks/README.md,
  section train-loop: per batch on a CPU 0.012-0.022 ms stacked against 0.068-0.074 placed alone)."""
  stacked = stacked_batches(local_batches)
  count = jax.process_count()
  return jax.make_array_from_process_local_data(
      sharding, stacked, {k: (v.shape[0], v.shape[1] * count) + v.shape[2:] for k, v in stacked.items()})


def stacked_batches(local_batches: Sequence[HostBatch]) -> HostBatch:
  """Each input of a call's host batches stacked into one [k, ...] array (one host copy)."""
  return {k: np.stack([local[k] for local in local_batches]) for k in local_batches[0]}


class MeshPlacement:
  """Batches placed on the mesh: one by `global_batch`, a call's stacked by `global_call_batches`."""
  batch = staticmethod(global_batch)
  call_batch = staticmethod(global_call_batches)


class CallPlacement:
  """Batches left as numpy arrays (a call's stacked, `stacked_batches`) that the compiled step's call places
  in its C++ dispatch (`Run.step_places_batches`); `sharding` is the one the step was compiled for."""

  @staticmethod
  def batch(local: HostBatch, sharding) -> HostBatch:
    del sharding
    return local

  @staticmethod
  def call_batch(local_batches: Sequence[HostBatch], sharding) -> HostBatch:
    del sharding
    return stacked_batches(local_batches)


def host_scalar(value: float, sharding) -> jax.Array:
  """A host number (the same on every process) as a float32 device scalar with `sharding`."""
  return jax.make_array_from_process_local_data(sharding, np.asarray(value, np.float32), ())


def place(tree: Any, shardings: Any) -> Any:
  """Puts host values (identical on every process) onto the mesh with the given shardings.

  `make_array_from_callback` lets each process fill only its own devices, so this works for any
  sharding in single- and multi-process runs alike.
  """
  def place_one(value, sharding):
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda v: place_one(v, shardings), tree)
  return jax.tree.map(place_one, tree, shardings)


def described(tree: Any, sharding: jax.sharding.Sharding) -> Any:
  """`tree` with its host (numpy) arrays described as `jax.ShapeDtypeStruct`s split by `sharding`, its placed
  arrays as they are: what a step is compiled for when its call places the host arrays itself."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
                      if isinstance(x, np.ndarray) else x, tree)


def abstract(tree: Any, shardings: Any) -> Any:
  """`tree`'s arrays as `jax.ShapeDtypeStruct`s with the given shardings (one sharding for all, or a tree):
  what `place` would put on the mesh, described and not placed."""
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def abstract_model(resolved: ResolvedRun, task: Task) -> nnx.Module:
  """The run's model in shapes only (`nnx.eval_shape`: no compute).

  Raises:
    ConfigError: its constructor refuses its options (e.g. a negative size).
  """
  try:
    return nnx.eval_shape(lambda: task.build_model(nnx.Rngs(resolved.seed)))
  except (ValueError, TypeError) as e:
    named = [f"config.model_options.{k}={v!r}" for k, v in resolved.model.options.items() if repr(v) in str(e)]
    raise ConfigError(f"{', '.join(named) or 'config.model / config.model_options'}: {task.model_description} "
                      f"fails: {e}") from e


def check_model_takes_batches(resolved: ResolvedRun, task: Task, model: nnx.Module,
                              example: dict[str, tuple[tuple[int, ...], Any]]) -> None:
  """Traces the training loss of `model` (abstract, `abstract_model`) on a batch of the run's first size whose
  examples have `example`'s shapes and dtypes (`DataShapes.example`), in shapes only.

  Raises:
    ConfigError: the model does not take the dataset's batches (an MNIST LSTM given 32x32 RGB images); the
      run would fail tracing its first step.
  """
  size = resolved.batch.first
  batch = {k: jax.ShapeDtypeStruct((size, *shape), dtype) for k, (shape, dtype) in example.items()}
  graphdef, state = nnx.split(model)
  carry = task.zero_carry(model, size)
  try:
    jax.eval_shape(lambda state, batch: task.train_loss(nnx.merge(graphdef, state), batch, carry,
                                                        jax.random.key(0))[0], state, batch)
  except (ValueError, TypeError) as e:
    shapes = ", ".join(f"{k} {tuple(v.shape[1:])} {v.dtype}" for k, v in batch.items())
    raise ConfigError(f"config.model / config.dataset: {task.model_description} does not take the batches of "
                      f"{resolved.dataset_name} ({shapes} per example): {e}") from e


def abstract_optimizer_state(resolved: ResolvedRun, optimizer: optax.GradientTransformation,
                             abstract_params: Any) -> Any:
  """The optimizer's state for `abstract_params`, in shapes only.

  Raises:
    ConfigError: its options do not fit the model's parameters (a mask of none of them).
  """
  try:
    return jax.eval_shape(optimizer.init, abstract_params)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.optimizer ({resolved.optimizer.describe()}) does not fit the model's parameters: {e}"
                      ) from e


@dataclasses.dataclass(frozen=True)
class StepParts:
  """What the train and eval steps of a run need, built from shapes alone (nothing initialised).

  Attributes:
    task: the task; `train_task` the same with the pipeline's `run_stack` (mesh.stage > 1).
    model: the abstract model (`nnx.eval_shape`), `graphdef` its graph.
    optimizer, compressor: the run's optimizer (learning rate injected) and gradient compressor.
    mesh, batch_sharding, replicated: the mesh, a batch's sharding, the replicated sharding.
    call_batch_sharding: that of a call's batches stacked [k, B, ...] (`config.steps_per_call`).
    param_shardings, model_state_shardings, opt_state_shardings: the state's shardings.
    abstract_params, abstract_opt_state: their shapes.
    has_layerwise_rates: whether the optimizer state holds layer-wise trust ratios (for the metrics).
    batch: the batch-size plan (micro-batches of each step).
    seed: the run's seed (parameters and the dropout key).
  """
  task: Task
  train_task: Task
  model: nnx.Module
  graphdef: nnx.GraphDef
  optimizer: optax.GradientTransformation
  compressor: compression.GradientCompressor | None
  mesh: jax.sharding.Mesh
  batch_sharding: jax.sharding.Sharding
  call_batch_sharding: jax.sharding.Sharding
  replicated: jax.sharding.Sharding
  param_shardings: Any
  model_state_shardings: Any
  opt_state_shardings: Any
  abstract_params: Any
  abstract_opt_state: Any
  has_layerwise_rates: bool
  batch: BatchPlan
  seed: int

  @classmethod
  def create(cls, resolved: ResolvedRun, task: Task, mesh: jax.sharding.Mesh) -> "StepParts":
    """Raises ConfigError where the model's constructor refuses its options or the mesh cannot split it."""
    model = abstract_model(resolved, task)
    graphdef, abstract_params, abstract_model_state = nnx.split(model, nnx.Param, nnx.BatchStat)
    abstract_params, abstract_model_state = nnx.to_pure_dict(abstract_params), nnx.to_pure_dict(abstract_model_state)
    mesh_lib.check_model_parallelism(mesh, model, abstract_params)
    specs = mesh_lib.tensor_parallel_specs(mesh, model)
    replicated = mesh_lib.replicated(mesh)
    optimizer = resolved.build_optimizer()
    abstract_opt_state = abstract_optimizer_state(resolved, optimizer, abstract_params)
    is_rate_state = lambda x: isinstance(x, optim.LayerwiseRateState)
    return cls(
        task=task, train_task=dataclasses.replace(task, run_stack=resolved.mesh.pipeline_runner(mesh)), model=model,
        graphdef=graphdef, optimizer=optimizer, compressor=resolved.build_compressor(), mesh=mesh,
        batch_sharding=mesh_lib.batch_sharding(mesh), call_batch_sharding=mesh_lib.call_batch_sharding(mesh),
        replicated=replicated,
        param_shardings=mesh_lib.parameter_shardings(mesh, abstract_params, specs),
        model_state_shardings=jax.tree.map(lambda _: replicated, abstract_model_state),
        opt_state_shardings=mesh_lib.parameter_shardings(mesh, abstract_opt_state, specs),
        abstract_params=abstract_params, abstract_opt_state=abstract_opt_state,
        has_layerwise_rates=any(map(is_rate_state, jax.tree.leaves(abstract_opt_state, is_leaf=is_rate_state))),
        batch=resolved.batch, seed=resolved.seed)

  @property
  def data_parallel_size(self) -> int:
    return mesh_lib.data_parallel_size(self.mesh)

  def initial_state(self) -> TrainState:
    """Initialises the model inside one jitted program that writes each parameter straight to its
    sharding (eager NNX initialisation compiles one program per parameter shape: minutes for
    ResNet-50 on a CPU), then the optimizer and compressor states."""
    def init():
      _, params, model_state = nnx.split(self.task.build_model(nnx.Rngs(self.seed)), nnx.Param, nnx.BatchStat)
      return nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)

    params, model_state = jax.jit(init, out_shardings=(self.param_shardings, self.model_state_shardings))()
    opt_state = jax.jit(self.optimizer.init, out_shardings=self.opt_state_shardings)(params)
    rng = jax.random.key_data(jax.random.key(self.seed))
    step, first_nonfinite_step, rng = place((np.int32(0), np.int32(-1), rng), self.replicated)
    return TrainState(step, params, opt_state, model_state, rng, None, first_nonfinite_step,
                      self.initial_compression_state(params))

  def initial_compression_state(self, params) -> Any:
    if self.compressor is None:
      return None
    state = jax.device_get(jax.jit(self.compressor.init)(params))
    if not self.compressor.per_device_state:
      return place(state, self.replicated)
    per_device = jax.tree.map(lambda x: np.broadcast_to(x, (self.data_parallel_size,) + x.shape), state)
    return place(per_device, self.batch_sharding)

  def abstract_state(self) -> TrainState:
    """The initial state's shapes and shardings (`jax.ShapeDtypeStruct` leaves), nothing initialised."""
    scalar = jax.ShapeDtypeStruct((), np.int32)
    rng = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    model_state = jax.eval_shape(lambda: nnx.to_pure_dict(nnx.state(self.model, nnx.BatchStat)))
    compression_state = None
    if self.compressor is not None:
      shapes = jax.eval_shape(self.compressor.init, self.abstract_params)
      if self.compressor.per_device_state:
        per_device = jax.tree.map(lambda x: jax.ShapeDtypeStruct((self.data_parallel_size,) + x.shape, x.dtype),
                                  shapes)
        compression_state = abstract(per_device, self.batch_sharding)
      else:
        compression_state = abstract(shapes, self.replicated)
    return TrainState(abstract(scalar, self.replicated), abstract(self.abstract_params, self.param_shardings),
                      abstract(self.abstract_opt_state, self.opt_state_shardings),
                      abstract(model_state, self.replicated), abstract(rng, self.replicated), None,
                      abstract(scalar, self.replicated), compression_state)

  def abstract_learning_rate(self) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct((), np.float32, sharding=self.replicated)

  def zero_carry(self, global_batch_size: int) -> Any:
    """The task's zero carry for a batch of `global_batch_size` rows, split over the mesh as a batch
    is (each process places its rows), or None for a task without one."""
    carry = self.task.zero_carry(self.model, global_batch_size)
    if carry is None:
      return None
    process_index, process_count = jax.process_index(), jax.process_count()
    per_process = global_batch_size // process_count
    start = process_index * per_process
    local = jax.tree.map(lambda x: x[start:start + per_process], carry)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        self.batch_sharding, x, (global_batch_size,) + x.shape[1:]), local)

  def train_step(self, global_batch_size: int, discard_fraction: float, state: Any, batch: Any
                 ) -> Callable[..., Any]:
    """The jitted train step of one global batch size and loss variant (`train_function`), its shardings
    those of `state` and `batch` (arrays or ShapeDtypeStructs); the state is donated. Lower it with
    (state, batch, learning rate)."""
    return self._jit_step(self.train_function(global_batch_size, discard_fraction), state, batch, self.replicated)

  def train_step_call(self, global_batch_size: int, discard_fraction: float, steps: int, state: Any, batches: Any
                      ) -> Callable[..., Any]:
    """The jitted call of `steps` such train steps (`train_function`), its shardings those of `state` and
    of `batches`, the call's batches stacked [steps, B, ...] (`global_call_batches`; arrays or
    ShapeDtypeStructs); the state is donated. Lower it with (state, batches, a tuple of `steps` learning
    rates)."""
    return self._jit_step(self.train_function(global_batch_size, discard_fraction, steps), state,
                          batches, (self.replicated,) * steps)

  def train_function(self, global_batch_size: int, discard_fraction: float, steps: int = 1) -> Callable[..., Any]:
    """The train step of one global batch size and loss variant, not jitted: `make_train_step` with the
    plan's micro-batches, called (state, batch, learning rate); with `steps` > 1 the call of that many
    (`lbjax.train.step_calls.make_step_call`), called with the `steps` batches stacked and a tuple of
    their learning rates."""
    step = make_train_step(self.graphdef, self.train_task, self.optimizer, self.mesh,
                           self.batch.num_microbatches(global_batch_size, self.data_parallel_size),
                           discard_fraction, self.compressor)
    return step if steps == 1 else step_calls.make_step_call(step, self.mesh)

  def _jit_step(self, step: Callable[..., Any], state: Any, batch: Any, learning_rate_shardings: Any
                ) -> Callable[..., Any]:
    """`step(state, batch, learning rate)` jitted with the shardings of `state`, of `batch` and the
    learning rates', the state donated and the metrics replicated."""
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    batch_shardings = jax.tree.map(lambda x: x.sharding, batch)
    return jax.jit(step, in_shardings=(state_shardings, batch_shardings, learning_rate_shardings),
                   out_shardings=(state_shardings, self.replicated), donate_argnums=(0,))

  def eval_step(self) -> Callable[..., Any]:
    """The jitted eval step: (params, model_state, batch, carry) -> (sums, carry)."""
    return jax.jit(make_eval_step(self.graphdef, self.task))
