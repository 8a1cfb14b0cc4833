"""`lbjax-train --compile-only`: the run a config describes, compiled from abstract arrays, and its figures.

`compile_run(config, topology="v3:32x32")` builds the run as `lbjax.train.run.Run` does (the
`data`/`fsdp`/`stage`/`model` mesh, the model, the optimizer and its state, the gradient compressor,
the trainer's own train step per batch size of the schedule, or the any-batch pair, the eval step,
and the Lipschitz probe where `config.diagnostics.lipschitz_every` asks for it), but every array is
a `jax.ShapeDtypeStruct` carrying its sharding: no data is read
(`lbjax.train.abstract_data`), no parameter initialised, no checkpoint touched. Each step is lowered
and compiled for the devices of the TPU topology (`lbjax.train.topology`, needs libtpu) or for the
local devices, and measured (`lbjax.train.compile_report`): memory per device against the device's
HBM, FLOPs, the bytes of every collective in the compiled HLO (`lbjax.train.hlo_analysis`), and
XLA's estimated step time.

The one place that turns the trainer's parts into programs is `abstract_run`; everything else here
works on the `Program`s it returns.
"""

from collections.abc import Callable, Iterator
import contextlib
import dataclasses
import time
from typing import Any

import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections
import numpy as np

from lbjax.optim import compression
from lbjax.train import abstract_data
from lbjax.train import build
from lbjax.train import compile_report
from lbjax.train import determinism
from lbjax.train import device_data
from lbjax.train import evaluation
from lbjax.train import gpu_targets
from lbjax.train import hlo_analysis
from lbjax.train import mesh as mesh_lib
from lbjax.train import topology as topology_lib
from lbjax.train import validation
from lbjax.train.any_batch import SLOTS
from lbjax.train.errors import ConfigError
from lbjax.train.state import TrainState
from lbjax.train.step import (Accumulator, loops_slow_down_convolutions, make_accumulate_step, make_apply_step,
                              make_eval_step, make_micro_batch_terms)


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program of the run: `jax.jit(function, ...).lower(*arguments)`.

  `per_step` is how many times it runs per training step at `batch_size` (the any-batch step's
  accumulation program: once per micro-batch; a call of `steps_per_call` steps: 1/steps_per_call;
  0 for the eval step, which is not part of a step).
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
  steps_per_call: int = 1
  discard_fraction: float = 0.0  # the train step's loss variant: the fraction of smallest losses it discards
  resident_state: Any = None  # the train state's parts that stay on the devices while it runs, not its arguments
  # Around its lowering: what turns the compiler's refusal into the trainer's ConfigError (the Lipschitz probe's).
  lowering_refusals: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@dataclasses.dataclass(frozen=True)
class AbstractRun:
  """The parts of a run that the figures need, and its programs (`abstract_run`)."""
  mesh: jax.sharding.Mesh
  data: abstract_data.DataShapes
  state: TrainState  # of ShapeDtypeStructs with their shardings
  programs: tuple[Program, ...]
  stages: tuple[compile_report.Stage, ...]  # the recipe as the run trains it (`compile_report.recipe_stages`)
  holds_training_set: bool = False  # config.train_data_on_device (`lbjax.train.device_data`)
  compressor: compression.GradientCompressor | None = None  # the run's gradient compressor (config.compression)
  compression_name: str = ""  # config.compression.name, resolved

  @property
  def held_bytes(self) -> int:
    """The bytes of the training set each device holds besides the programs (0 unless it holds it)."""
    return self.data.train_bytes if self.holds_training_set else 0


def _shardings(tree: Any) -> Any:
  return jax.tree.map(lambda x: x.sharding, tree)


def abstract_run(config: ml_collections.ConfigDict, devices: list[Any]) -> AbstractRun:
  """The run `config` describes on `devices`, every array abstract: the trainer's own resolved run
  (`validation.validate`) and step parts (`build.StepParts`, as `Run` builds them), with the data's
  shapes from `abstract_data` instead of the data.

  Raises:
    ConfigError: as the trainer would, before any compile (validation against the mesh, a batch the
      data cannot fill, a model that does not build or does not split over the mesh).
  """
  resolved = validation.validate(config)
  if resolved.mesh.num_devices > len(devices):
    raise ConfigError(f"config.mesh.num_devices={resolved.mesh.num_devices} but there are {len(devices)} devices; "
                      "use at most that many (0 = all).")
  mesh = resolved.mesh.build(devices[:resolved.mesh.num_devices] if resolved.mesh.num_devices > 0 else devices)
  data_parallel = mesh_lib.data_parallel_size(mesh)
  validation.check_devices(resolved, data_parallel)
  data = abstract_data.data_shapes(resolved.dataset)
  parts = build.StepParts.create(resolved, abstract_data.check_data(resolved, data), mesh)
  graphdef, task, train_task, optimizer = parts.graphdef, parts.task, parts.train_task, parts.optimizer
  replicated, batch_sharding = parts.replicated, parts.batch_sharding
  state = parts.abstract_state()
  scalar = jax.ShapeDtypeStruct((), np.int32, sharding=replicated)
  carry = lambda size: (None if data.seq_len is None else
                        build.abstract(jax.eval_shape(lambda: parts.model.initial_carry(size)), batch_sharding))
  learning_rate = parts.abstract_learning_rate()

  def train_step(size: int, discard_fraction: float) -> Program:
    """The train step, or with `steps_per_call` k > 1 the call of k steps the run takes."""
    k = resolved.steps_per_call
    step = parts.train_function(size, discard_fraction, k)
    run_state = state._replace(carry=carry(size))
    if k > 1:  # the call's batches stacked [k, B, ...] (`build.global_call_batches`), one rate per step
      stacked = {name: jax.ShapeDtypeStruct((k, *x.shape), x.dtype) for name, x in data.train_batch(size).items()}
      batch, rate = build.abstract(stacked, parts.call_batch_sharding), (learning_rate,) * k
    else:
      batch, rate = build.abstract(data.train_batch(size), batch_sharding), learning_rate
    return Program("train", size, step, (run_state, batch, rate),
                   (_shardings(run_state), _shardings(batch), _shardings(rate)), (_shardings(run_state), replicated),
                   (0,), 1.0 / k, resolved.batch.num_microbatches(size, data_parallel), k, discard_fraction)

  def any_batch_steps(size: int, discard_fraction: float) -> tuple[Program, Program]:
    micro = resolved.batch.micro_batch_size
    slots = 1 if loops_slow_down_convolutions(state.params, mesh) else SLOTS
    micro_batch = build.abstract(data.train_batch(micro), batch_sharding)
    micro_carry = carry(micro)
    terms = make_micro_batch_terms(graphdef, train_task, data_parallel)
    shapes = jax.eval_shape(terms, state, micro_batch, micro_carry, 0, 1)[0]
    totals = build.abstract(shapes, Accumulator(replicated, jax.tree.map(lambda _: replicated, shapes.metrics),
                                           jax.tree.map(lambda _: replicated, shapes.model_state),
                                           _shardings(state.params), replicated))
    accumulate = make_accumulate_step(graphdef, train_task, data_parallel, discard_fraction, slots)
    micro_batches, carries = (micro_batch,) * slots, (micro_carry,) * slots
    count = size // micro
    return (Program("accumulate", size, accumulate,
                    (totals, state, micro_batches, carries, scalar, scalar, scalar),
                    (_shardings(totals), _shardings(state), _shardings(micro_batches), _shardings(carries),
                     replicated, replicated, replicated), (_shardings(totals), _shardings(carries)), (0,),
                    float(count), count, discard_fraction=discard_fraction),
            Program("apply", size, make_apply_step(optimizer, micro, discard_fraction),
                    (state, totals, scalar, learning_rate),
                    (_shardings(state), _shardings(totals), replicated, replicated),
                    (_shardings(state), replicated, _shardings(totals)), (0, 1), 1.0, count,
                    discard_fraction=discard_fraction))

  # The train state is not donated to the eval step (nor the probe): what it does not take (the optimizer and
  # compression state) stays on the devices beside it.
  beside = state._replace(params=None, model_state=None)
  programs = []
  if resolved.watch.lipschitz_every:  # the probe's program, as `evaluation.LipschitzProbe` lowers it: first, as the
    probe_size = resolved.watch.lipschitz_batch_size  # run builds it before its first step (and may refuse it)
    probe_arguments = (state.params, state.model_state, build.abstract(data.train_batch(probe_size), batch_sharding),
                       carry(probe_size))
    programs.append(Program("lipschitz", probe_size, evaluation.lipschitz_function(parts, resolved.seed),
                            probe_arguments, _shardings(probe_arguments), replicated, (), 0.0, resident_state=beside,
                            lowering_refusals=lambda: evaluation.forward_mode_refused(evaluation.LIPSCHITZ_FIELD)))
  stages = tuple(compile_report.recipe_stages(resolved, data.steps_per_epoch))
  # A schedule may come back to a size: one program per size and loss variant, as in a run.
  for size, discard in dict.fromkeys((stage.batch_size, stage.discard_fraction) for stage in stages):
    programs += any_batch_steps(size, discard) if resolved.batch.micro_batch_size else [train_step(size, discard)]
  eval_size = resolved.batch.eval_batch_size
  eval_batch = build.abstract(data.eval_batch(eval_size), batch_sharding)
  eval_arguments = (state.params, state.model_state, eval_batch, carry(eval_size))
  programs.append(Program("eval", eval_size, make_eval_step(graphdef, task), eval_arguments,
                          _shardings(eval_arguments), None, (), 0.0, resident_state=beside))
  return AbstractRun(mesh, data, state, tuple(programs), stages, holds_training_set=resolved.train_data_on_device,
                     compressor=parts.compressor,
                     compression_name=resolved.compressor.resolved.name if resolved.compressor else "")


def _is_out_of_memory(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text or "out of memory" in text.lower()


def compile_program(program: Program) -> tuple[Any, float]:
  """The compiled executable of `program` and the seconds lowering and compiling took."""
  start = time.perf_counter()
  first = jax.tree.leaves(program.in_shardings)[0]  # a sharding, or a Format of a layout and a sharding
  with gpu_targets.lowering_for(getattr(first, "sharding", first).device_set):
    lowered = jax.jit(program.function, in_shardings=program.in_shardings, out_shardings=program.out_shardings,
                      donate_argnums=program.donate_argnums).lower(*program.arguments)
  return lowered.compile(), time.perf_counter() - start


@contextlib.contextmanager
def persistent_cache_set_aside() -> Iterator[None]:
  """Compiles inside neither read nor write JAX's persistent compilation cache; after, it is as before.

  A compile for devices that are not here (a TPU topology, named GPUs) runs on a compile-only client: it
  cannot load a cached executable (JAX warns `Error reading persistent compilation cache entry ...
  PjRtCompiler must be constructed with a Client to call DeserializeLoadedExecutable` for every program
  found) and would write entries that no process on this machine can load. JAX decides at a process's
  first compile whether it uses the cache, and keeps that decision until `reset_cache`.
  """
  if not (jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir):
    yield
    return
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", True)
    compilation_cache.reset_cache()


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
  if not topology:  # the local devices compile what the run would: with its XLA flags
    determinism.request(config)
  devices = topology_lib.topology_devices(topology) if topology else jax.devices()
  run = abstract_run(config, devices)
  device = run.mesh.devices.flat[0]
  memory = topology_lib.device_memory(device, local_devices=len(jax.local_devices()) if not topology else 1)
  if run.holds_training_set:
    device_data.check_fits(run.data.train_bytes, memory.bytes, device.device_kind)
  figures = []
  with persistent_cache_set_aside() if topology else contextlib.nullcontext():
    for program in run.programs:
      if program.name == "eval" and not evaluation:
        continue
      log(f"compiling the {program.name} step at batch {program.batch_size} for {run.mesh.size} "
          f"{device.device_kind} device(s)...")
      try:
        with program.lowering_refusals():
          compiled, seconds = compile_program(program)
      except Exception as e:  # pylint: disable=broad-except  (XLA's out-of-memory is a JaxRuntimeError)
        if not _is_out_of_memory(e):
          raise
        figures.append(compile_report.out_of_memory_figures(program, str(e), run.state))
        continue
      figures.append(compile_report.program_figures(program, compiled, hlo_analysis.analyze(compiled.as_text()),
                                                    run.state, seconds))
  notes = (_unapplied_settings(config, topology, device) + _held_training_set(run, memory.bytes)
           + _simulated_compression(run))
  return compile_report.CompileReport.build(config, topology, run, device, memory, figures, notes=notes)


def _held_training_set(run: AbstractRun, hbm: int | None) -> list[str]:
  """What `config.train_data_on_device` takes of each device's memory before the programs."""
  if not run.held_bytes:
    return []
  note = (f"config.train_data_on_device=True: each device also holds the training set, {run.held_bytes / 2**20:.1f} "
          "MiB, so the programs above must fit in the rest of its memory")
  return [note + (f" ({(hbm - run.held_bytes) / 2**30:.2f} of {hbm / 2**30:.2f} GiB)." if hbm else ".")]


def _simulated_compression(run: AbstractRun) -> list[str]:
  """What a compressor that lbjax simulates would send: its all-reduce in the programs is of decoded float32
  gradients (`compression.compressed_pmean`), not of the encoded messages. A compressor whose own all-reduces are
  of its compressed factors (`aggregates`: PowerSGD's) is measured as it is."""
  if run.compressor is None or run.compressor.aggregates:
    return []
  bits = compression.bits_per_step(run.state.params, run.compressor)
  if bits.compressed >= bits.uncompressed:
    return []
  return [f"config.compression {run.compression_name!r} is simulated: each device encodes and decodes its gradient "
          "and the devices all-reduce the decoded float32 values (lbjax.optim.compression.compressed_pmean), so the "
          "all-reduce bytes above are those of the uncompressed gradient; a real encoder would send "
          f"{bits.compressed / 8 / 2**20:.3f} MiB per device per step, {bits.ratio:.1f}x less than the float32 "
          f"gradient's {bits.uncompressed / 8 / 2**20:.3f} MiB (lbjax.optim.compression.bits_per_step)."]


def _unapplied_settings(config: ml_collections.ConfigDict, topology: str | None, device: Any) -> list[str]:
  """What of the run a compile leaves out: a trace of its steps (`config.profile`), and for named devices
  `config.deterministic`'s XLA flags."""
  notes = []
  if config.profile.num_steps:
    notes.append(f"config.profile.num_steps={config.profile.num_steps} traces steps of the run; a compile runs none "
                 "(the trace is taken when the run trains).")
  if not topology or config.deterministic is not True:
    return notes
  if device.platform == "tpu":
    return notes + ["config.deterministic=True sets XLA's GPU flags; a TPU program is compiled without them, as the "
                    "run would be."]
  return notes + ["config.deterministic=True is not applied: XLA picks its deterministic GPU kernels only when it "
                  "compiles on a GPU (a compile without one is refused), so these figures are those of the program "
                  "without them; on GPUs the deterministic program can be slower (docs/faults.md)."]
