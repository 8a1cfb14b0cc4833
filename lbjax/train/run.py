"""`Run`: a config made into everything one training run holds, built whole in its constructor.

`Run(config, workdir)` builds the mesh (and validates the config against it), takes the workdir's
lock, builds the task and the training stream (refusing a batch larger than the training set or an
empty evaluation split), the learning-rate and batch-size schedules, the optimizer and gradient
compressor, the initial state (each parameter initialised straight onto its sharding) and, given a
workdir, the checkpointer; then it resumes from the workdir's newest checkpoint that passes its
checksum, if there is one. What is left to do is one step at a time:

    run = Run(config, workdir)
    while not run.finished():
      metrics = run.step(run.next_batch())

`train_and_evaluate` (`lbjax.train.loop`) drives a `Run` with the hooks of `lbjax.train.hooks`
around its steps; `lbjax.train.layer_table` and the benchmarks use one to look at a step.

One clock: the data stream's position in epochs (`run.epoch`: examples consumed / train-set size)
decides the batch size, the learning rate, the loss variant and the end of training.
"""

import collections
import dataclasses
import json
import os
import pathlib
import socket
import time
from typing import Any, NamedTuple

from absl import logging
from flax import nnx
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from lbjax import diagnostics
from lbjax import optim
from lbjax.train import batch_policy as batch_policy_lib
from lbjax.train import config as config_lib
from lbjax.train import determinism
from lbjax.train import nonfinite
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import validation
from lbjax.train.any_batch import AnyBatchStep
from lbjax.train.checkpointing import Checkpointer, abstract_like, state_checksums
from lbjax.train.errors import (CheckpointCorruptError, CheckpointMismatchError, CheckpointSaveError, ConfigError,
                                DataMismatchError)
from lbjax.train import mesh as mesh_lib
from lbjax.train.mesh import batch_sharding, build_mesh, data_parallel_size, replicated
from lbjax.train.state import TrainState
from lbjax.train.step import make_eval_step, make_train_step, per_device_compression_state
from lbjax.train.tasks import build_task
from lbjax.train.workdir_lock import WorkdirLock

HISTORY_FILE = "history.jsonl"


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss or update; the state and checkpoints stay the last good ones."""


def global_batch(local: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  """Assembles every process's share of a batch into global arrays split by `sharding` (one call for
  all arrays: on one process a single batched `device_put`)."""
  count = jax.process_count()
  return jax.make_array_from_process_local_data(
      sharding, local, {k: (v.shape[0] * count,) + v.shape[1:] for k, v in local.items()})


def host_scalar(value: float, sharding) -> jax.Array:
  """A host number (the same on every process) as a float32 device scalar with `sharding`."""
  return jax.make_array_from_process_local_data(sharding, np.asarray(value, np.float32), ())


def _place(tree: Any, shardings: Any) -> Any:
  """Puts host values (identical on every process) onto the mesh with the given shardings.

  `make_array_from_callback` lets each process fill only its own devices, so this works for any
  sharding in single- and multi-process runs alike.
  """
  def place(value, sharding):
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda v: place(v, shardings), tree)
  return jax.tree.map(place, tree, shardings)


class Batch(NamedTuple):
  """One training batch, placed on the mesh, and what its step needs besides (`Run.next_batch`)."""
  size: int  # the global batch size
  arrays: dict[str, jax.Array] | list[dict[str, jax.Array]]  # the batch, or its micro-batches (any-batch step)
  learning_rate: jax.Array  # a replicated float32 scalar
  discard_fraction: float  # papers/003 §3.1: the fraction of smallest losses the step drops


class Run:
  """A validated config turned into its parts, its state and its data, ready to step.

  Attributes:
    config, mesh, task, lr_schedule, batch_size_schedule, optimizer, compressor: the run's parts.
    batch_policy: who chooses each step's batch size and learning rate (`lbjax.train.batch_policy`).
    any_batch: the any-batch step (`lbjax.train.any_batch`) with `config.batch.micro_batch_size`, else None.
    state: the `TrainState` (restored from the workdir's latest checkpoint when there is one).
    stream: the training data stream (its position is the run's clock, `epoch`).
    step_count: steps taken (the restored checkpoint's step on resume).
    examples_seen: training examples consumed, over all processes.
    batch_size: the global batch size of the latest step (the schedule's at the start).
    carry_batch_size: the batch size the carried state (PTB's LSTM state) was made for, or None.
    checkpointer: the workdir's `Checkpointer`, or None without a workdir.
    lock: the workdir's `WorkdirLock` (held by process 0 until `close`), or None.
    resumed_from: the step of the checkpoint this run resumed from, or None.
    skipped_checkpoints: (step, reason) of each newer checkpoint that failed its checksum or could
      not be read, set aside before resuming.
    saved_data_parallel_size: the data-parallel size the resumed checkpoint was saved on, if known.
    compiled, compile_seconds: the compiled train steps and their compile times, by
      (global batch size, discard fraction), in the order they were compiled.
    new_compile: the key of the step the latest `step()` compiled, or None.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir=None):
    """Builds the run; with a `workdir`, takes its lock and resumes from its newest good checkpoint
    (or, with none, starts from `config.init_from`'s parameters when set).

    Raises:
      ConfigError: invalid config, a batch larger than the training set or an empty evaluation
        split (all before any compute).
      WorkdirInUseError: another run holds the workdir.
      CheckpointMismatchError, DataMismatchError: the workdir's checkpoint is of a different recipe
        (`config_lib.check_resumable`) or was trained on other data.
      CheckpointCorruptError: no checkpoint in the workdir passes its checksum.
      FileNotFoundError: missing data (the message says where to get it).
    """
    self.config = config
    determinism.request(config)  # config.deterministic: XLA's flags, before the backend starts
    if config.mesh.num_devices > jax.device_count():
      raise ConfigError(f"config.mesh.num_devices={config.mesh.num_devices} but there are {jax.device_count()} "
                        "devices; use at most that many (0 = all).")
    devices = jax.devices()[:config.mesh.num_devices] if config.mesh.num_devices > 0 else None
    self.mesh = build_mesh(config.mesh.data, config.mesh.fsdp, devices, stage=config.mesh.stage,
                           model=config.mesh.model)
    validation.validate(config, data_parallel_size=data_parallel_size(self.mesh))
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.workdir = pathlib.Path(workdir).absolute() if workdir is not None else None
    self.lock = WorkdirLock(workdir) if workdir is not None and self.process_index == 0 else None
    self.checkpointer = None
    self._save_in_flight: int | None = None  # the step of a background save not yet known to be written
    self.save_failed = False  # a save failed (reported by `CheckpointSaveError`)
    if self.lock is not None:
      self.lock.acquire()
    try:
      self._build(config)
    except BaseException:
      self.close()
      raise

  def _build(self, config: ml_collections.ConfigDict) -> None:
    self.task = build_task(config)
    self.stream = self.task.dataset.make_train_stream(self.process_index, self.process_count)
    self._check_data_sizes()
    self.lr_schedule = optimizer_lib.learning_rate_schedule(config)
    self.batch_size_schedule = optimizer_lib.batch_size_schedule(config)
    self.batch_policy = batch_policy_lib.BatchPolicy(config)
    self.optimizer = optimizer_lib.build_optimizer(config)
    self.compressor = optimizer_lib.build_compressor(config)
    self.batch_sharding = batch_sharding(self.mesh)
    self.replicated = replicated(self.mesh)
    self.compiled: dict[tuple[int, float], Any] = {}
    self.compile_seconds: dict[tuple[int, float], float] = {}
    self.new_compile: tuple[int, float] | None = None
    self._in_flight = None  # the loss of the latest step, not yet waited for
    self._learning_rate: tuple[bytes, jax.Array] | None = None  # the latest LR: float32 bytes, placed scalar
    # The batches of the latest two steps, kept to name the first non-finite quantity (the metrics
    # that show it reach the host one step late).
    self._previous_batch: Batch | None = None
    self._latest_batch: Batch | None = None
    self.state = self._initial_state()
    self.any_batch = AnyBatchStep(self, config.batch.micro_batch_size) if config.batch.micro_batch_size else None
    self.examples_seen, self.carry_batch_size, self.resumed_from = 0, None, None
    self.saved_data_parallel_size: int | None = None
    self.skipped_checkpoints: list[tuple[int, str]] = []
    if self.workdir is not None:
      self.checkpointer = Checkpointer(self.workdir, max_to_keep=config.keep_checkpoints)
      changes = self._restore_latest()
      if self.resumed_from is None and config.init_from:
        self._start_from(config.init_from)
      self._record_history(changes)
    self.step_count = int(jax.device_get(self.state.step))
    self.batch_size = self.batch_policy.batch_size(self.epoch)

  def _check_data_sizes(self) -> None:
    """Refuses, before any compute, a batch larger than the training set and an empty evaluation split."""
    config, name = self.config, f"config.dataset={self.config.dataset!r}"
    field = "config.batch_sizes" if config.batch_sizes else "config.batch_size"
    for size in config_lib.batch_sizes(config):
      if hasattr(self.stream, "windows_per_epoch"):
        try:
          windows = self.stream.windows_per_epoch(size)
        except ValueError:
          windows = 0
        if windows < 1:
          raise ConfigError(f"{field}: a batch of {size} rows leaves the training tokens of {name} too short for "
                            "one window per row; use a smaller batch size or seq_len.")
      elif size > self.stream.num_examples:
        raise ConfigError(f"{field}: a batch of {size} is larger than the training set of {name} "
                          f"({self.stream.num_examples} examples); use at most {self.stream.num_examples}.")
    try:
      first = next(iter(self.task.dataset.make_eval_batches(config.eval_batch_size, self.process_index,
                                                            self.process_count)), None)
    except (ValueError, MemoryError) as e:
      raise ConfigError(f"The evaluation split ({self.task.dataset.eval_split}) of {name} cannot be evaluated "
                        f"with config.eval_batch_size={config.eval_batch_size}: {e or type(e).__name__}") from e
    if first is None or ("mask" in first and not np.any(first["mask"])):
      raise ConfigError(f"The evaluation split ({self.task.dataset.eval_split}) of {name} is empty; check the "
                        "data files (config.data_dir) before training.")

  def _initial_state(self) -> TrainState:
    """Initialises the model inside one jitted program that writes each parameter straight to its
    sharding (eager NNX initialisation compiles one program per parameter shape: minutes for
    ResNet-50 on a CPU)."""
    build = lambda: self.task.build_model(nnx.Rngs(self.config.seed))
    try:  # shapes only: a constructor's refusal (e.g. a negative size) is a config error, before compute
      self.model = nnx.eval_shape(build)
    except (ValueError, TypeError) as e:
      raise ConfigError(f"config.model / config.model_options: {self.task.model_description} fails: {e}") from e
    self.graphdef, abstract_params, abstract_model_state = nnx.split(self.model, nnx.Param, nnx.BatchStat)
    mesh_lib.check_model_parallelism(self.mesh, self.model, nnx.to_pure_dict(abstract_params))
    specs = mesh_lib.tensor_parallel_specs(self.mesh, self.model)
    param_shardings = mesh_lib.parameter_shardings(self.mesh, nnx.to_pure_dict(abstract_params), specs)
    model_state_shardings = jax.tree.map(lambda _: self.replicated, nnx.to_pure_dict(abstract_model_state))

    def init():
      _, params, model_state = nnx.split(build(), nnx.Param, nnx.BatchStat)
      return nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)

    params, model_state = jax.jit(init, out_shardings=(param_shardings, model_state_shardings))()
    abstract_opt_state = jax.eval_shape(self.optimizer.init, params)
    is_rate_state = lambda x: isinstance(x, optim.LayerwiseRateState)
    self.has_layerwise_rates = any(map(is_rate_state, jax.tree.leaves(abstract_opt_state, is_leaf=is_rate_state)))
    opt_state = jax.jit(self.optimizer.init, out_shardings=mesh_lib.parameter_shardings(
        self.mesh, abstract_opt_state, specs))(params)
    rng = jax.random.key_data(jax.random.key(self.config.seed))
    step, first_nonfinite_step, rng = _place((np.int32(0), np.int32(-1), rng), self.replicated)
    return TrainState(step, params, opt_state, model_state, rng, None, first_nonfinite_step,
                      self.initial_compression_state(params))

  def initial_compression_state(self, params) -> Any:
    if self.compressor is None:
      return None
    state = jax.device_get(jax.jit(self.compressor.init)(params))
    if not per_device_compression_state(state):
      return _place(state, self.replicated)
    devices = data_parallel_size(self.mesh)
    per_device = jax.tree.map(lambda x: np.broadcast_to(x, (devices,) + x.shape), state)
    return _place(per_device, self.batch_sharding)

  def _restore_latest(self) -> dict[str, list]:
    """Resumes from the newest good checkpoint in the workdir: state, stream position, examples seen,
    carry. A checkpoint that cannot be read or fails its checksum is skipped with a warning (and set
    aside in `<workdir>/skipped_checkpoints`); the one before it is tried.

    Returns:
      The optimizer settings changed on purpose (`config.resume_with_changed_optimizer`).
    """
    steps = self.checkpointer.all_steps()
    for step in steps:
      try:
        meta = self.checkpointer.read_meta_verified(step)
        changes = config_lib.check_resumable(meta["config"], self.config, str(self.workdir))
        self._check_same_data(meta)
        carry_batch_size = meta["carry_batch_size"]
        state = self.state._replace(carry=self.train_carry(carry_batch_size, meta.get("carry_micro_batches"))
                                    if carry_batch_size else None)
        state = self._compression_state_for(meta, state)
        state = self.checkpointer.restore_verified(step, meta, abstract_like(state), self.replicated)
      except CheckpointCorruptError as e:
        self._skip_checkpoint(step, str(e))
        continue
      self.state, self.carry_batch_size = state, carry_batch_size
      self.stream.set_state(meta["stream"])
      self.examples_seen = meta["examples_seen"]
      if "batch_policy" in meta:  # checkpoints written before lbjax had batch policies have none
        self.batch_policy.load_state_dict(meta["batch_policy"])
      self.resumed_from = step
      self.saved_data_parallel_size = meta.get("data_parallel_size")
      return changes
    if steps:
      raise CheckpointCorruptError(
          f"No checkpoint in {self.checkpointer.directory} can be restored: "
          + "; ".join(f"step {step}: {reason}" for step, reason in self.skipped_checkpoints)
          + f". They are kept in {self.workdir / 'skipped_checkpoints'}; use a new --workdir, or start from "
          "one's parameters with --config.init_from=<its folder> if you trust it.")
    return {}

  def _skip_checkpoint(self, step: int, reason: str) -> None:
    self.skipped_checkpoints.append((step, reason))
    if self.process_count > 1:  # every process has read it before process 0 moves it
      multihost_utils.sync_global_devices(f"lbjax_skip_checkpoint_{step}")
    where = self.checkpointer.set_aside(step, reason) if self.process_index == 0 else None
    if self.process_count > 1:
      multihost_utils.sync_global_devices(f"lbjax_skipped_checkpoint_{step}")
      self.checkpointer.reload()
    logging.warning("Skipped checkpoint %d in %s: %s. Moved it to %s; trying the one before it.", step,
                    self.checkpointer.directory, reason, where)
    if self.config.progress and self.process_index == 0:
      print(f"Warning: skipped checkpoint {step}: {reason}. Moved it to {where}.", flush=True)

  def _check_same_data(self, meta: dict[str, Any]) -> None:
    saved = meta.get("data_fingerprint")
    if saved is None or not self.task.dataset.fingerprint or self.config.resume_with_changed_data:
      return
    now = self.task.dataset.fingerprint_like(saved)  # taken again in the checkpoint's kind where it differs
    if saved == now:
      return
    differing = "; ".join(f"{split}: checkpoint {saved.get(split)} vs now {now.get(split)}"
                          for split in sorted(set(saved) | set(now)) if saved.get(split) != now.get(split))
    raise DataMismatchError(
        f"The checkpoint in {self.checkpointer.directory} was trained on other data ({differing}). Point "
        "config.data_dir at the data it was trained on, or pass --config.resume_with_changed_data=True to resume "
        "on this data anyway.")

  def _compression_state_for(self, meta: dict[str, Any], state: TrainState) -> TrainState:
    """The restore target's compression state; refuses a per-device state saved on another device count."""
    saved, now = meta.get("data_parallel_size"), data_parallel_size(self.mesh)
    if saved is None or saved == now or not per_device_compression_state(state.compression_state):
      return state
    raise CheckpointMismatchError(
        f"config.compression.name={self.config.compression.name!r} keeps an error-feedback residual per device; the "
        f"checkpoint in {self.checkpointer.directory} holds {saved} of them, this run has {now} data-parallel "
        f"devices. Resume on {saved} devices (config.mesh.num_devices={saved}), or start a new run from its "
        f"parameters: --config.init_from={self.workdir} --workdir=<a new workdir>.")

  def _start_from(self, source: str) -> None:
    """Loads the parameters and BatchNorm statistics of the checkpoint `source` (a workdir, its
    `checkpoints/` folder or one step folder); optimizer, step and data start afresh."""
    path = pathlib.Path(source).expanduser().absolute()
    step = None
    if path.name.isdigit() and path.parent.name == "checkpoints":
      path, step = path.parent.parent, int(path.name)
    elif path.name == "checkpoints":
      path = path.parent
    if not (path / "checkpoints").is_dir():
      raise ConfigError(f"config.init_from={source!r}: no checkpoints/ folder there; give a workdir, its "
                        "checkpoints/ folder or one step folder in it.")
    source_checkpointer = Checkpointer(path, max_to_keep=None)
    try:
      steps = [step] if step is not None else source_checkpointer.all_steps()
      if not steps:
        raise ConfigError(f"config.init_from={source!r}: {path / 'checkpoints'} holds no complete checkpoint.")
      fields = abstract_like({"params": self.state.params, "model_state": self.state.model_state})
      try:
        restored = source_checkpointer.restore_fields(steps[0], fields)
      except Exception as e:  # pylint: disable=broad-except  (shapes differ, files unreadable, ...)
        raise ConfigError(f"config.init_from={source!r}: the parameters of checkpoint {steps[0]} do not fit this "
                          f"run's model {self.task.model_description}: {str(e).strip().splitlines()[-1][:300]}") from e
    finally:
      source_checkpointer.close()
    self.state = self.state._replace(params=restored["params"], model_state=restored["model_state"])
    self.initialized_from = (path, steps[0])

  def _record_history(self, changes: dict[str, list]) -> None:
    """Appends this start to `<workdir>/history.jsonl`: resumed or new, from where, what changed."""
    if self.process_index != 0:
      return
    record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
              "pid": os.getpid(), "event": "resume" if self.resumed_from is not None else "start",
              "step": self.resumed_from or 0, "data_parallel_size": data_parallel_size(self.mesh)}
    if changes:
      record["changed_optimizer"] = changes
    if self.skipped_checkpoints:
      record["skipped_checkpoints"] = [{"step": step, "reason": reason} for step, reason in self.skipped_checkpoints]
    if getattr(self, "initialized_from", None):
      record["init_from"] = {"workdir": str(self.initialized_from[0]), "step": self.initialized_from[1]}
    if self.saved_data_parallel_size not in (None, record["data_parallel_size"]):
      record["saved_data_parallel_size"] = self.saved_data_parallel_size
    if self.lock is not None and self.lock.stale_holder is not None:
      record["stale_lock"] = self.lock.stale_holder
    with open(self.workdir / HISTORY_FILE, "a") as f:
      f.write(json.dumps(record) + "\n")

  @property
  def epoch(self) -> float:
    """The run's clock: the training stream's position in epochs."""
    return self.stream.epoch()

  def finished(self) -> bool:
    """Whether training is over: `num_epochs` reached (scale-invariant epochs under AdaScale,
    `BatchPolicy.progress`), or `num_steps` (when > 0) taken."""
    return (self.batch_policy.progress(self.epoch) >= self.config.num_epochs
            or 0 < self.config.num_steps <= self.step_count)

  def zero_carry(self, global_batch_size: int) -> Any:
    carry = self.task.zero_carry(self.model, global_batch_size)
    if carry is None:
      return None
    per_process = global_batch_size // self.process_count
    start = self.process_index * per_process
    local = jax.tree.map(lambda x: x[start:start + per_process], carry)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        self.batch_sharding, x, (global_batch_size,) + x.shape[1:]), local)

  def train_carry(self, global_batch_size: int, num_microbatches: int | None) -> Any:
    """The zero carry of a training step: one [B, ...] carry (`num_microbatches` None), or one
    [m, ...] carry per micro-batch of the any-batch step."""
    if num_microbatches is None:
      return self.zero_carry(global_batch_size)
    return self.any_batch.zero_carries(num_microbatches)

  def num_microbatches(self, global_batch_size: int) -> int:
    share = global_batch_size // data_parallel_size(self.mesh)
    limit = self.config.max_device_batch
    return share // limit if 0 < limit < share else 1

  def next_batch(self) -> Batch:
    """The next training batch at the current epoch: its size from the batch-size schedule, the
    learning rate from the LR schedule, the loss variant; resets the carried state where the
    stream starts a new row of batches or the batch size changed (the stream then re-lays the rest
    of the epoch into the new rows, where the old carries have no meaning)."""
    epoch = self.epoch
    size = self.batch_policy.batch_size(epoch)
    local = self.stream.next_batch(size)
    if self.task.take_carry_reset(local) or (self.state.carry is not None and self.carry_batch_size != size):
      count = self.any_batch.num_microbatches(size) if self.any_batch else None
      self.state = self.state._replace(carry=self.train_carry(size, count))
      self.carry_batch_size = size
    config = self.config.loss
    discard_fraction = config.discard_fraction if epoch < config.discard_until_epoch else 0.0
    arrays = self.any_batch.place(local, size) if self.any_batch else global_batch(local, self.batch_sharding)
    return Batch(size, arrays, self.learning_rate_scalar(self.batch_policy.learning_rate(epoch, size)),
                 discard_fraction)

  def learning_rate_scalar(self, value: float) -> jax.Array:
    """`value` as the step's replicated float32 device scalar, placed again only when its float32 bits
    change: a constant-LR phase takes no host -> device transfer per step. The scalar is never donated."""
    bits = np.float32(value).tobytes()
    if self._learning_rate is None or self._learning_rate[0] != bits:
      self._learning_rate = (bits, host_scalar(value, self.replicated))
    return self._learning_rate[1]

  def train_step(self, global_batch_size: int, discard_fraction: float, state: TrainState, batch,
                 learning_rate):
    """The compiled step for this global batch size (and loss variant), compiled once, on first use."""
    key = (global_batch_size, discard_fraction)
    if key not in self.compiled:
      start = time.perf_counter()
      task = dataclasses.replace(self.task, run_stack=mesh_lib.pipeline_runner(self.mesh, self.config))
      step = make_train_step(self.graphdef, task, self.optimizer, self.mesh,
                             self.num_microbatches(global_batch_size), discard_fraction, self.compressor)
      state_shardings = jax.tree.map(lambda x: x.sharding, state)
      batch_shardings = jax.tree.map(lambda x: x.sharding, batch)
      self.compiled[key] = jax.jit(
          step, in_shardings=(state_shardings, batch_shardings, self.replicated),
          out_shardings=(state_shardings, self.replicated), donate_argnums=(0,),
      ).lower(state, batch, learning_rate).compile()
      self.compile_seconds[key] = time.perf_counter() - start
    return self.compiled[key]

  def step(self, batch: Batch) -> dict[str, jax.Array]:
    """Takes one training step on `batch`; returns its metrics, still on the device.

    Raises:
      CheckpointSaveError: the background save started before this step failed.
    """
    if self._save_in_flight is not None:
      self.check_background_save()
    if self.any_batch:
      self.state, metrics, seconds = self.any_batch.step(self.state, batch.arrays, batch.learning_rate,
                                                         batch.discard_fraction)
      self.new_compile = (batch.size, batch.discard_fraction) if seconds else None
      if seconds:  # the any-batch programs compiled (once per run and loss variant), at this batch size
        self.compiled[self.new_compile], self.compile_seconds[self.new_compile] = self.any_batch, seconds
    else:
      key = (batch.size, batch.discard_fraction)
      self.new_compile = None if key in self.compiled else key
      train_step = self.train_step(batch.size, batch.discard_fraction, self.state, batch.arrays,
                                   batch.learning_rate)
      self.state, metrics = train_step(self.state, batch.arrays, batch.learning_rate)
    # At most two steps in flight: the host prepares the next batch while the device works, but
    # never runs far ahead of it, so a SIGTERM or a non-finite loss is acted on within two steps
    # (unbounded, it ran 51 steps ahead on a slow CPU step and the save came 83 s after SIGTERM).
    if self._in_flight is not None:
      self._in_flight.block_until_ready()
    self._in_flight = metrics["loss"]
    self._previous_batch, self._latest_batch = self._latest_batch, batch
    self.step_count += 1
    self.examples_seen += batch.size
    self.batch_size = batch.size
    self.batch_policy.after_step(self.step_count, batch.size, self.epoch, metrics)
    return metrics

  def evaluate(self) -> dict[str, float]:
    """The task's metrics of the current state on the whole evaluation split."""
    if not hasattr(self, "_eval_step"):
      self._eval_step = jax.jit(make_eval_step(self.graphdef, self.task))
    batch_size = self.config.eval_batch_size
    zero = carry = self.zero_carry(batch_size)  # the eval step does not donate it: reusable
    totals = None
    in_flight = collections.deque()  # the totals of the latest steps, not yet waited for
    for local in self.task.dataset.make_eval_batches(batch_size, self.process_index, self.process_count):
      if local.pop("reset_carry", False):  # the rows start again (every window with carry_state=False)
        carry = zero
      sums, carry = self._eval_step(self.state.params, self.state.model_state,
                                    global_batch(local, self.batch_sharding), carry)
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
      # At most two steps in flight, as in training. Queued without bound, XLA:CPU's launch of a device's
      # part blocks a worker thread while that device's queue is full, and the other devices' parts, in a
      # collective, block the rest waiting for it: a deadlock (pipelined evaluation on 4 CPU devices, issue 30).
      in_flight.append(totals)
      if len(in_flight) > 2:
        jax.block_until_ready(in_flight.popleft())
    totals = {k: float(v) for k, v in jax.device_get(totals).items()}
    return self.task.summarize(totals)

  def lipschitz(self) -> float:
    """L(x, g) = |g^T H g| / ||g||^2 along the gradient on the first eval examples (papers/001 §4)."""
    if not hasattr(self, "_lipschitz"):
      size = self.config.diagnostics.lipschitz_batch_size
      local = next(iter(self.task.dataset.make_eval_batches(size, self.process_index, self.process_count)))
      local = {k: v for k, v in local.items() if k not in ("mask", "reset_carry")}
      batch = global_batch(local, self.batch_sharding)
      carry = self.zero_carry(size)
      key = jax.random.key(self.config.seed)

      def loss_fn(params, batch, model_state):
        model = nnx.merge(self.graphdef, params, model_state)
        return self.task.train_loss(model, batch, carry, key)[0]

      fn = jax.jit(lambda params, model_state: diagnostics.lipschitz_along_gradient(
          lambda p, b: loss_fn(p, b, model_state), params, batch))
      self._lipschitz = lambda s: fn(s.params, s.model_state)
    return float(jax.device_get(self._lipschitz(self.state)))

  def check_health(self) -> None:
    """Raises `NonFiniteError` if a step produced a non-finite loss or update (waits for the device).

    The message names the step, the first non-finite quantity (`nonfinite.first_nonfinite`) and the
    ways on.
    """
    bad_step = int(jax.device_get(self.state.first_nonfinite_step))
    if bad_step < 0:
      return
    last = None
    if self.checkpointer is not None:
      self.wait_for_save()
      last = self.checkpointer.latest_step()
    try:
      bad_batch = self._previous_batch if bad_step == self.step_count - 2 else self._latest_batch
      quantity, advice = nonfinite.first_nonfinite(self.state, bad_batch, graphdef=self.graphdef,
                                                   task=self.task, optimizer=self.optimizer,
                                                   replicated=self.replicated)
    except Exception as e:  # pylint: disable=broad-except  (the diagnosis must not hide the stop)
      quantity, advice = (f"the first non-finite quantity could not be found ({type(e).__name__})",
                          "Lower config.lr.base or lengthen the warm-up, and check the data.")
    if last is None:
      raise NonFiniteError(f"Non-finite loss or update at step {bad_step}: {quantity}. Training stopped; no checkpoint was "
                           f"written. {advice}")
    workdir = self.workdir
    raise NonFiniteError(
        f"Non-finite loss or update at step {bad_step}: {quantity}. Training stopped and the state was not updated from "
        f"that step on; the last good checkpoint (step {last}) in {self.checkpointer.directory} is unharmed. "
        f"{advice} Then either resume it with the changed settings, --config.resume_with_changed_optimizer=True "
        f"(recorded in {workdir / HISTORY_FILE}), or start a new run from its parameters, "
        f"--config.init_from={workdir} --workdir=<a new workdir>.")

  def save(self, *, durable: bool = False) -> None:
    """Checks the health, then checkpoints the current step, once (a SIGTERM right after an evaluation
    finds it saved). With `durable`, returns only once the checkpoint is on disk. Without a workdir,
    only the health check.

    Raises:
      CheckpointSaveError: a save failed (e.g. a full disk); the previous checkpoints are kept.
    """
    self.check_health()
    if self.checkpointer is None:
      return
    if self.checkpointer.latest_step() != self.step_count and self._save_in_flight != self.step_count:
      self.wait_for_save()
      meta = {"stream": self.stream.get_state(), "examples_seen": self.examples_seen, "epoch": self.epoch,
              "carry_batch_size": self.carry_batch_size, "config": self.config.to_json(),
              "carry_micro_batches": (len(self.state.carry) if self.any_batch and self.state.carry is not None
                                      else None),
              "data_fingerprint": self.task.dataset.fingerprint, "data_parallel_size": data_parallel_size(self.mesh),
              "checksums": state_checksums(self.state, self.replicated),
              "batch_policy": self.batch_policy.state_dict()}
      self._save_in_flight = self.step_count
      try:
        self.checkpointer.save(self.step_count, self.state, meta)
      except Exception as e:  # pylint: disable=broad-except  (written synchronously: directories, meta)
        raise self._save_error(e) from e
    if durable:
      self.wait_for_save()

  def check_background_save(self) -> None:
    """Raises `CheckpointSaveError` if the background save has failed (no waiting when it is running)."""
    if self._save_in_flight is None:
      return
    try:
      self.checkpointer.check_for_errors()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(e) from e
    if not self.checkpointer.is_saving():
      self.wait_for_save()  # finished: joins the writer at once and raises what it left

  def wait_for_save(self) -> None:
    """Blocks until the save in flight is on disk; raises `CheckpointSaveError` if it failed."""
    if self._save_in_flight is None:
      return
    try:
      self.checkpointer.wait()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(e) from e
    self._save_in_flight = None

  def _save_error(self, error: Exception) -> CheckpointSaveError:
    step, self._save_in_flight = self._save_in_flight, None
    self.save_failed = True
    return CheckpointSaveError(self.checkpointer.failed_save_message(step, error))

  def close(self) -> None:
    """Waits for checkpoints in flight, closes the checkpointer and releases the workdir lock. After a
    failed save (already reported as `CheckpointSaveError`), what else Orbax raises on closing is dropped."""
    try:
      if self.checkpointer is not None:
        try:
          self.checkpointer.close()
        except Exception as e:  # pylint: disable=broad-except
          if not self.save_failed:
            raise self._save_error(e) from e
    finally:
      if self.lock is not None:
        self.lock.release()
