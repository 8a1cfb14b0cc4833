"""The resolved run: a config validated and turned, once, into the typed parts a run is built from.

`lbjax.train.validation.validate(config)` checks the config's values and, here (`resolve_parts`,
`assemble`), resolves every name the config uses to the function it imports, binds each section to
that function's signature, and reads every other field into a typed value, all before any compute:

  model, model_options      a lbjax.models constructor, options checked   `model` (`tasks.ModelChoice`)
  dataset, data_options     a lbjax.train.datasets function, bound         `dataset` (`names.Call`)
  optimizer.*               lbjax.optim or optax, bound                    `optimizer` (`names.Call`)
  lr.*, scaling.*           rule, decay, warm-up: the LR of (epoch, B)     `learning_rate` (`optimizer.LearningRate`)
  compression.*             lbjax.optim.compression, bound                 `compressor` (`names.Call` or None)
  batch*, max_device_batch  the batch-size plan                            `batch` (`batch_plan.BatchPlan`)
  mesh.*, pipeline.*        the mesh and the pipeline                      `mesh` (`MeshPlan`)

`Run`, `BatchPolicy`, the summary (`--dry-run`, the console, `config.json`) and `--compile-only`
(`lbjax.train.build.StepParts`) read the `ResolvedRun`; nothing resolves a name again.
`consumed_fields` lists the config fields the resolution read: every field of the config must be
among them (tests/train/test_every_field_is_consumed.py)."""

import copy
import dataclasses
from typing import Any, Sequence

import jax
import ml_collections
import optax

from lbjax.optim import compression
from lbjax.train import batch_plan
from lbjax.train import config as config_lib
from lbjax.train import mesh as mesh_lib
from lbjax.train import names
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import profiling
from lbjax.train import tasks
from lbjax.train.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class MeshPlan:
  """`config.mesh` and `config.pipeline`: the device mesh and how the model is split over it."""
  data: int
  fsdp: int
  num_devices: int  # 0: all devices
  stage: int
  model: int
  per_device_gradients: bool
  pipeline_microbatches: int
  pipeline_remat: bool

  @classmethod
  def read(cls, read: config_lib.FieldReads) -> "MeshPlan":
    return cls(read("mesh.data"), read("mesh.fsdp"), read("mesh.num_devices"), read("mesh.stage"), read("mesh.model"),
               read("mesh.per_device_gradients"), read("pipeline.num_microbatches"), read("pipeline.remat"))

  def devices(self) -> list[jax.Device] | None:
    """The devices the run uses: the first `num_devices`, or None for all. In a multi-host run they must hold
    the same number of every process's devices: each process feeds its own."""
    if self.num_devices > jax.device_count():
      raise ConfigError(f"config.mesh.num_devices={self.num_devices} but there are {jax.device_count()} "
                        "devices; use at most that many (0 = all).")
    if self.num_devices <= 0:
      return None
    chosen = jax.devices()[:self.num_devices]
    counts = [sum(d.process_index == p for d in chosen) for p in range(jax.process_count())]
    if len(set(counts)) > 1:
      raise ConfigError(f"config.mesh.num_devices={self.num_devices} takes the first {self.num_devices} of the "
                        f"{jax.device_count()} devices of {jax.process_count()} processes: {counts} of each process's. "
                        "Every process feeds its own devices, so each needs as many in the mesh; in a multi-host run "
                        "use config.mesh.num_devices=0 (all devices).")
    return chosen

  def build(self, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
    """The mesh over `devices` (default: `devices()`; for compile-only, e.g. a TPU topology's)."""
    devices = self.devices() if devices is None else devices
    return mesh_lib.build_mesh(self.data, self.fsdp, devices, stage=self.stage, model=self.model)

  def pipeline_runner(self, mesh: jax.sharding.Mesh):
    """The `run_stack` a pipelined model is called with in training (None without stages)."""
    pipeline = ml_collections.ConfigDict({"pipeline": {"num_microbatches": self.pipeline_microbatches,
                                                       "remat": self.pipeline_remat}})
    return mesh_lib.pipeline_runner(mesh, pipeline)


@dataclasses.dataclass(frozen=True)
class Watch:
  """How the run is watched and stored, not what it computes."""
  log_every: int
  eval_every_epochs: float
  checkpoint_every_steps: int
  keep_checkpoints: int
  tensorboard: bool
  progress: bool
  lipschitz_every: int  # papers/001 §4 diagnostics: steps between measurements (0: never)
  lipschitz_batch_size: int
  profile: profiling.TraceRequest  # the steps traced with jax.profiler


@dataclasses.dataclass(frozen=True)
class ResolvedRun:
  """A validated config as the typed parts of one run. Frozen: a run reads it, never changes it.

  Attributes:
    source_config: a locked copy of the config, read only as a record (checkpoints and `config.json`
      hold its JSON; a resume compares it) and by `validation.check_devices`; the run reads the
      typed fields below.
    model, dataset: the model constructor with its options, the dataset call with its arguments.
    optimizer, clip_global_norm: the optimizer call (learning rate injected) and the gradient clip.
    learning_rate: the LR as one function of (epoch, batch size in force).
    compressor: the gradient compressor call, or None.
    batch: the batch-size plan.
    mesh: the mesh and pipeline.
    seed, num_epochs, num_steps: the run's seed and length (epochs; also steps when > 0).
    discard_fraction, discard_until_epoch: papers/003 §3.1, the smallest losses dropped until an epoch.
    watch: logging, evaluation, checkpoint cadence, console, diagnostics.
    init_from, resume_with_changed_optimizer, resume_with_changed_data: how the run starts.
    deterministic: XLA's deterministic GPU kernels asked for (`lbjax.train.determinism`).
    heartbeat_timeout_seconds: how long a process of a multi-host job may be silent before the others stop
      (`lbjax.train.distributed`).
    steps_per_call: training steps one device call runs (`lbjax.train.step_calls`).
    train_data_on_device: the training set held on the devices, batches gathered there (`lbjax.train.device_data`).
    consumed_fields: the config fields read to build this (every field of the config).
  """
  source_config: ml_collections.ConfigDict = dataclasses.field(repr=False, compare=False)
  model: tasks.ModelChoice
  dataset: names.Call
  optimizer: names.Call
  clip_global_norm: float
  learning_rate: optimizer_lib.LearningRate
  compressor: names.Call | None
  batch: batch_plan.BatchPlan
  mesh: MeshPlan
  seed: int
  num_epochs: float
  num_steps: int
  discard_fraction: float
  discard_until_epoch: float
  watch: Watch
  init_from: str
  resume_with_changed_optimizer: bool
  resume_with_changed_data: bool
  deterministic: bool
  heartbeat_timeout_seconds: int
  steps_per_call: int
  train_data_on_device: bool
  consumed_fields: frozenset[str]

  @property
  def dataset_name(self) -> str:
    return self.dataset.resolved.name

  @property
  def micro_batches_change_the_update(self) -> bool:
    """Whether accumulating micro-batches (`config.max_device_batch`) changes the update: the smallest losses
    are discarded within each micro-batch, or the model normalises over the batch a call sees."""
    return self.discard_fraction > 0 or self.model.normalizes_over_the_batch()

  def discard_fraction_at(self, epoch: float) -> float:
    """The loss variant of a step that starts at `epoch` (papers/003 §3.1)."""
    return self.discard_fraction if epoch < self.discard_until_epoch else 0.0

  def build_optimizer(self) -> optax.GradientTransformation:
    return optimizer_lib.make_optimizer(self.optimizer, self.clip_global_norm)

  def build_compressor(self) -> compression.GradientCompressor | None:
    return optimizer_lib.make_compressor(self.compressor, self.mesh.per_device_gradients)

  def open_task(self) -> tasks.ClassificationTask | tasks.LanguageModelTask:
    """Opens the dataset (missing data fails here) and pairs it with the model."""
    return tasks.make_task(self.model, tasks.open_dataset(self.dataset), self.dataset_name)


def resolve_parts(read: config_lib.FieldReads) -> tuple[dict[str, Any], list[str]]:
  """Resolves each named part of the run (`read` records the fields read); one problem per part
  that fails. `lbjax.train.validation.validate` adds them to the value problems it finds."""
  parts, problems = {}, []
  plan = batch_plan.plan(read)
  recipe_batch_size = None if plan.adaptive else plan.first
  builders = {
      "optimizer": ("config.optimizer", lambda: optimizer_lib.resolve_optimizer(read)),
      "learning_rate": ("config.lr", lambda: optimizer_lib.resolve_learning_rate(read, recipe_batch_size, plan.first)),
      "compressor": ("config.compression", lambda: optimizer_lib.resolve_compressor(read)),
      "dataset": ("config.data_options", lambda: tasks.resolve_dataset(read)),
      "model": ("config.model_options", lambda: tasks.resolve_model(read)),
  }
  for part, (section, build) in builders.items():
    try:
      parts[part] = build()
    except ConfigError as e:
      problems.append(str(e))
    except (ValueError, TypeError) as e:  # a function of the section refuses its arguments
      problems.append(f"{section}: {e}")
  parts["batch"] = plan
  split = {axis: read(f"mesh.{axis}") for axis in ("fsdp", "model", "stage")}
  split = {axis: size for axis, size in split.items() if size > 1}
  if "optimizer" in parts and parts["optimizer"].arguments.get("layout") == "flat" and split:
    axes = ", ".join(f"mesh.{axis}={size}" for axis, size in split.items())
    problems.append(f"config.optimizer.layout='flat' lays every parameter out in a few flat buffers, which with "
                    f"the parameters split over devices ({axes}) would gather them whole on every device. Use "
                    "layout='per_leaf' (the default) with a split mesh, or the flat layout with pure data "
                    "parallelism (mesh.data).")
  if "optimizer" in parts and parts["optimizer"].arguments.get("layout") == "fused":
    problems.append("config.optimizer.layout='fused' updates the momentum in place in its own GPU kernels, while the "
                    "trainer's step keeps the previous state until it knows the update is finite: XLA would copy "
                    "the momentum and select every leaf, more kernels than the per-leaf layout (docs/running.md, "
                    "optimizer.layout). Use layout='flat' on GPUs, 'per_leaf' elsewhere; the fused layout is for "
                    "your own optax loops, with lbjax.optim.fused.apply_updates.")
  if "model" in parts and parts["model"].language_model and read("loss.discard_fraction") > 0:
    problems.append("config.loss.discard_fraction applies to classification; a language model has no "
                    "per-example loss to rank. Set it to 0.")
  return parts, problems


def assemble(config: ml_collections.ConfigDict, read: config_lib.FieldReads, parts: dict[str, Any]) -> ResolvedRun:
  """The `ResolvedRun` of a validated config from its resolved parts; reads the remaining fields."""
  mesh = MeshPlan.read(read)
  watch = Watch(read("log_every"), read("eval_every_epochs"), read("checkpoint_every_steps"),
                read("keep_checkpoints"), read("tensorboard"), read("progress"),
                read("diagnostics.lipschitz_every"), read("diagnostics.lipschitz_batch_size"),
                profiling.TraceRequest(read("profile.num_steps"), read("profile.skip_steps"),
                                       read("profile.python_calls"), read("profile.perfetto_trace")))
  source = copy.deepcopy(config)
  source.lock()
  return ResolvedRun(
      source_config=source, clip_global_norm=read("clip_global_norm"), mesh=mesh, seed=read("seed"),
      num_epochs=read("num_epochs"), num_steps=read("num_steps"), discard_fraction=read("loss.discard_fraction"),
      discard_until_epoch=read("loss.discard_until_epoch"), watch=watch, init_from=read("init_from"),
      resume_with_changed_optimizer=read("resume_with_changed_optimizer"),
      resume_with_changed_data=read("resume_with_changed_data"), deterministic=read("deterministic"),
      heartbeat_timeout_seconds=read("heartbeat_timeout_seconds"), steps_per_call=read("steps_per_call"),
      train_data_on_device=read("train_data_on_device"), consumed_fields=frozenset(read.paths), **parts)
