"""`lbjax-train --compile-only`: the run a config describes, compiled from abstract arrays, and its figures.

`compile_run(config, topology="v3:32x32")` builds the run as `lbjax.train.run.Run` does (the
`data`/`fsdp`/`stage`/`model` mesh, the model, the optimizer and its state, the gradient compressor,
the trainer's own train step per batch size of the schedule, or the any-batch pair, and the eval
step), but every array is a `jax.ShapeDtypeStruct` carrying its sharding: no data is read
(`lbjax.train.abstract_data`), no parameter initialised, no checkpoint touched. Each step is lowered
and compiled for the devices of the TPU topology (`lbjax.train.topology`, needs libtpu) or for the
local devices, and measured (`lbjax.train.compile_report`): memory per device against the device's
HBM, FLOPs, the bytes of every collective in the compiled HLO (`lbjax.train.hlo_analysis`), and
XLA's estimated step time.

The one place that knows how the trainer assembles a run is `abstract_run`; everything else here
works on the `Program`s it returns.
"""

from collections.abc import Callable
import dataclasses
import time
from typing import Any

from flax import nnx
import jax
import ml_collections
import numpy as np

from lbjax.train import abstract_data
from lbjax.train import compile_report
from lbjax.train import config as config_lib
from lbjax.train import hlo_analysis
from lbjax.train import mesh as mesh_lib
from lbjax.train import names
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import tasks
from lbjax.train import topology as topology_lib
from lbjax.train import validation
from lbjax.train.any_batch import SLOTS
from lbjax.train.errors import ConfigError
from lbjax.train.state import TrainState
from lbjax.train.step import (Accumulator, loops_slow_down_convolutions, make_accumulate_step, make_apply_step,
                              make_eval_step, make_micro_batch_terms, make_train_step, per_device_compression_state)


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program of the run: `jax.jit(function, ...).lower(*arguments)`.

  `per_step` is how many times it runs per training step at `batch_size` (the any-batch step's
  accumulation program: once per micro-batch; 0 for the eval step, which is not part of a step).
  """
  name: str
  batch_size: int
  function: Callable
  arguments: tuple
  in_shardings: Any
  out_shardings: Any
  donate_argnums: tuple[int, ...]
  per_step: float
  num_microbatches: int = 1


@dataclasses.dataclass(frozen=True)
class AbstractRun:
  """The parts of a run that the figures need, and its programs (`abstract_run`)."""
  mesh: jax.sharding.Mesh
  data: abstract_data.DataShapes
  state: TrainState  # of ShapeDtypeStructs with their shardings
  programs: tuple[Program, ...]


def _abstract(tree: Any, shardings: Any) -> Any:
  """`tree`'s arrays as ShapeDtypeStructs with the given shardings (one sharding for all, or a tree)."""
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=shardings), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _shardings(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.sharding, tree)


def abstract_run(config: ml_collections.ConfigDict, devices: list[Any]) -> AbstractRun:
  """The run `config` describes on `devices`, every array abstract: what `Run.__init__`,
  `Run._initial_state`, `Run.train_step`, `AnyBatchStep.step` and `Run.evaluate` build, from the same
  building blocks (this is the function to re-point when the trainer's assembly changes).

  Raises:
    ConfigError: as the trainer would, before any compile (validation against the mesh, a batch the
      data cannot fill, a model that does not build or does not split over the mesh).
  """
  if config.mesh.num_devices > len(devices):
    raise ConfigError(f"config.mesh.num_devices={config.mesh.num_devices} but there are {len(devices)} devices; "
                      "use at most that many (0 = all).")
  devices = devices[:config.mesh.num_devices] if config.mesh.num_devices > 0 else devices
  mesh = mesh_lib.build_mesh(config.mesh.data, config.mesh.fsdp, devices, stage=config.mesh.stage,
                             model=config.mesh.model)
  data_parallel = mesh_lib.data_parallel_size(mesh)
  validation.validate(config, data_parallel_size=data_parallel)
  data = abstract_data.data_shapes(config)
  for size in config_lib.batch_sizes(config):
    if (problem := data.refuse_impossible(size)) is not None:
      raise ConfigError(f"config.batch_size(s): {problem}")
  resolved, arguments = tasks.resolve_model(config, data.dataset.model_arguments)
  factory = lambda rngs: resolved.function(**arguments, rngs=rngs)
  task_class = tasks.LanguageModelTask if data.dataset.kind == "language_model" else tasks.ClassificationTask
  options = {"uses_dropout": arguments.get("dropout_rate", 0.0) > 0} if task_class is tasks.LanguageModelTask else {}
  task = task_class(factory, data.dataset, names.describe(resolved, arguments), **options)
  try:
    model = nnx.eval_shape(lambda: task.build_model(nnx.Rngs(config.seed)))
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.model / config.model_options: {task.model_description} fails: {e}") from e
  graphdef, params, model_state = nnx.split(model, nnx.Param, nnx.BatchStat)
  params, model_state = nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)
  mesh_lib.check_model_parallelism(mesh, model, params)
  specs = mesh_lib.tensor_parallel_specs(mesh, model)
  replicated, batch_sharding = mesh_lib.replicated(mesh), mesh_lib.batch_sharding(mesh)
  params = _abstract(params, mesh_lib.parameter_shardings(mesh, params, specs))
  optimizer, compressor = optimizer_lib.build_optimizer(config), optimizer_lib.build_compressor(config)
  opt_state = jax.eval_shape(optimizer.init, params)
  compression_state = None
  if compressor is not None:
    compression_state = jax.eval_shape(compressor.init, params)
    if per_device_compression_state(compression_state):
      compression_state = _abstract(jax.tree.map(lambda x: jax.ShapeDtypeStruct((data_parallel, *x.shape), x.dtype),
                                                 compression_state), batch_sharding)
    else:
      compression_state = _abstract(compression_state, replicated)
  scalar = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
  rng = _abstract(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(config.seed))), replicated)
  state = TrainState(scalar, params, _abstract(opt_state, mesh_lib.parameter_shardings(mesh, opt_state, specs)),
                     _abstract(model_state, replicated), rng, None, scalar, compression_state)
  carry = lambda size: (None if data.seq_len is None else
                        _abstract(jax.eval_shape(lambda: model.initial_carry(size)), batch_sharding))
  learning_rate = jax.ShapeDtypeStruct((), np.float32, sharding=replicated)
  train_task = dataclasses.replace(task, run_stack=mesh_lib.pipeline_runner(mesh, config))

  def train_step(size: int) -> Program:
    share, limit = size // data_parallel, config.max_device_batch
    count = share // limit if 0 < limit < share else 1
    step = make_train_step(graphdef, train_task, optimizer, mesh, count, 0.0, compressor)
    run_state = state._replace(carry=carry(size))
    batch = _abstract(data.train_batch(size), batch_sharding)
    return Program("train", size, step, (run_state, batch, learning_rate),
                   (_shardings(run_state), _shardings(batch), replicated), (_shardings(run_state), replicated),
                   (0,), 1.0, count)

  def any_batch_steps(size: int) -> tuple[Program, Program]:
    micro = config.batch.micro_batch_size
    slots = 1 if loops_slow_down_convolutions(params) else SLOTS
    micro_batch = _abstract(data.train_batch(micro), batch_sharding)
    micro_carry = carry(micro)
    terms = make_micro_batch_terms(graphdef, train_task, data_parallel)
    shapes = jax.eval_shape(terms, state, micro_batch, micro_carry, 0, 1)[0]
    totals = _abstract(shapes, Accumulator(replicated, jax.tree.map(lambda _: replicated, shapes.metrics),
                                           jax.tree.map(lambda _: replicated, shapes.model_state),
                                           _shardings(params), replicated))
    accumulate = make_accumulate_step(graphdef, train_task, data_parallel, 0.0, slots)
    micro_batches, carries = (micro_batch,) * slots, (micro_carry,) * slots
    count = size // micro
    return (Program("accumulate", size, accumulate,
                    (totals, state, micro_batches, carries, scalar, scalar, scalar),
                    (_shardings(totals), _shardings(state), _shardings(micro_batches), _shardings(carries),
                     replicated, replicated, replicated), (_shardings(totals), _shardings(carries)), (0,),
                    float(count), count),
            Program("apply", size, make_apply_step(optimizer, micro), (state, totals, scalar, learning_rate),
                    (_shardings(state), _shardings(totals), replicated, replicated),
                    (_shardings(state), replicated, _shardings(totals)), (0, 1), 1.0, count))

  programs = []
  for size in config_lib.batch_sizes(config):
    programs += any_batch_steps(size) if config.batch.micro_batch_size else [train_step(size)]
  eval_batch = _abstract(data.eval_batch(config.eval_batch_size), batch_sharding)
  eval_arguments = (state.params, state.model_state, eval_batch, carry(config.eval_batch_size))
  programs.append(Program("eval", config.eval_batch_size, make_eval_step(graphdef, task), eval_arguments,
                          _shardings(eval_arguments), None, (), 0.0))
  return AbstractRun(mesh, data, state, tuple(programs))


def _is_out_of_memory(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text.lower()


def compile_program(program: Program) -> tuple[Any, float]:
  """The compiled executable of `program` and the seconds lowering and compiling took."""
  start = time.perf_counter()
  lowered = jax.jit(program.function, in_shardings=program.in_shardings, out_shardings=program.out_shardings,
                    donate_argnums=program.donate_argnums).lower(*program.arguments)
  return lowered.compile(), time.perf_counter() - start


def compile_run(config: ml_collections.ConfigDict, topology: str | None = None,
                log: Callable[[str], None] = lambda line: None, *, evaluation: bool = True
                ) -> compile_report.CompileReport:
  """Compiles every program of the run for the TPU `topology` (or the local devices) and measures it.

  A program the compiler refuses for lack of memory is reported as not fitting, with the compiler's
  figures, and the others are still compiled. `log` gets a line as each program starts compiling.
  `evaluation=False` leaves out the eval step.

  Raises:
    ConfigError: a config the trainer would refuse, or a topology libtpu does not know (or no libtpu).
  """
  devices = topology_lib.topology_devices(topology) if topology else jax.devices()
  run = abstract_run(config, devices)
  device = run.mesh.devices.flat[0]
  memory = topology_lib.device_memory(device, local_devices=len(jax.local_devices()) if not topology else 1)
  figures = []
  for program in run.programs:
    if program.name == "eval" and not evaluation:
      continue
    log(f"compiling the {program.name} step at batch {program.batch_size} for {run.mesh.size} {device.device_kind} "
        "device(s)...")
    try:
      compiled, seconds = compile_program(program)
    except Exception as e:  # pylint: disable=broad-except  (XLA's out-of-memory is a JaxRuntimeError)
      if not _is_out_of_memory(e):
        raise
      figures.append(compile_report.out_of_memory_figures(program, str(e)))
      continue
    figures.append(compile_report.program_figures(program, compiled, hlo_analysis.analyze(compiled.as_text()),
                                                  run.state, seconds))
  return compile_report.CompileReport.build(config, topology, run, device, memory, figures)
