"""`Run`: a config made into everything one training run holds, built whole in its constructor.

`Run(config, workdir)` builds the mesh (and validates the config against it), the task, the
learning-rate and batch-size schedules, the optimizer and gradient compressor, the initial state
(each parameter initialised straight onto its sharding), the training stream and, given a workdir,
the checkpointer; then it resumes from the workdir's latest checkpoint, if there is one. What is
left to do is one step at a time:

    run = Run(config, workdir)
    while not run.finished():
      metrics = run.step(run.next_batch())

`train_and_evaluate` (`lbjax.train.loop`) drives a `Run` with the hooks of `lbjax.train.hooks`
around its steps; `lbjax.train.layer_table` and the benchmarks use one to look at a step.

One clock: the data stream's position in epochs (`run.epoch`: examples consumed / train-set size)
decides the batch size, the learning rate, the loss variant and the end of training.
"""

import time
from typing import Any, NamedTuple

from flax import nnx
import jax
import ml_collections
import numpy as np

from lbjax import diagnostics
from lbjax import optim
from lbjax.train import batch_policy as batch_policy_lib
from lbjax.train import config as config_lib
from lbjax.train import optimizer as optimizer_lib
from lbjax.train import validation
from lbjax.train.errors import ConfigError
from lbjax.train.any_batch import AnyBatchStep
from lbjax.train.checkpointing import Checkpointer, abstract_like
from lbjax.train.mesh import batch_sharding, build_mesh, data_parallel_size, parameter_sharding, replicated
from lbjax.train.state import TrainState
from lbjax.train.step import make_eval_step, make_train_step, per_device_compression_state
from lbjax.train.tasks import build_task


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss or update; the state and checkpoints stay the last good ones."""


def global_batch(local: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  """Assembles every process's share of a batch into global arrays split by `sharding`."""
  count = jax.process_count()
  return {k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0] * count,) + v.shape[1:])
          for k, v in local.items()}


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
    resumed_from: the step of the checkpoint this run resumed from, or None.
    compiled, compile_seconds: the compiled train steps and their compile times, by
      (global batch size, discard fraction), in the order they were compiled.
    new_compile: the key of the step the latest `step()` compiled, or None.
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir=None):
    """Builds the run; with a `workdir`, resumes from its latest checkpoint.

    Raises:
      ValueError: invalid config (before any compute) or, with a workdir, a checkpoint in it of a
        different recipe (`config_lib.check_resumable`).
      FileNotFoundError: missing data (the message says where to get it).
    """
    self.config = config
    devices = jax.devices()[:config.mesh.num_devices] if config.mesh.num_devices > 0 else None
    self.mesh = build_mesh(config.mesh.data, config.mesh.fsdp, devices)
    validation.validate(config, data_parallel_size=data_parallel_size(self.mesh))
    self.task = build_task(config)
    self.lr_schedule = optimizer_lib.learning_rate_schedule(config)
    self.batch_size_schedule = optimizer_lib.batch_size_schedule(config)
    self.batch_policy = batch_policy_lib.BatchPolicy(config)
    self.optimizer = optimizer_lib.build_optimizer(config)
    self.compressor = optimizer_lib.build_compressor(config)
    self.batch_sharding = batch_sharding(self.mesh)
    self.replicated = replicated(self.mesh)
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.compiled: dict[tuple[int, float], Any] = {}
    self.compile_seconds: dict[tuple[int, float], float] = {}
    self.new_compile: tuple[int, float] | None = None
    self._in_flight = None  # the loss of the latest step, not yet waited for
    self.state = self._initial_state()
    self.any_batch = AnyBatchStep(self, config.batch.micro_batch_size) if config.batch.micro_batch_size else None
    self.stream = self.task.dataset.make_train_stream(self.process_index, self.process_count)
    self.examples_seen, self.carry_batch_size, self.resumed_from = 0, None, None
    self.checkpointer = None
    if workdir is not None:
      self.checkpointer = Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
      try:
        self._restore_latest(str(workdir))
      except BaseException:
        self.checkpointer.close()
        raise
    self.step_count = int(jax.device_get(self.state.step))
    self.batch_size = self.batch_policy.batch_size(self.epoch)

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
    param_shardings = jax.tree.map(lambda x: parameter_sharding(self.mesh, x.shape),
                                   nnx.to_pure_dict(abstract_params))
    model_state_shardings = jax.tree.map(lambda _: self.replicated, nnx.to_pure_dict(abstract_model_state))

    def init():
      _, params, model_state = nnx.split(build(), nnx.Param, nnx.BatchStat)
      return nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)

    params, model_state = jax.jit(init, out_shardings=(param_shardings, model_state_shardings))()
    abstract_opt_state = jax.eval_shape(self.optimizer.init, params)
    is_rate_state = lambda x: isinstance(x, optim.LayerwiseRateState)
    self.has_layerwise_rates = any(map(is_rate_state, jax.tree.leaves(abstract_opt_state, is_leaf=is_rate_state)))
    opt_state = jax.jit(self.optimizer.init, out_shardings=jax.tree.map(
        lambda x: parameter_sharding(self.mesh, x.shape), abstract_opt_state))(params)
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

  def _restore_latest(self, workdir: str) -> None:
    """Resumes from the workdir's latest checkpoint: state, stream position, examples seen, carry."""
    latest = self.checkpointer.latest_step()
    if latest is None:
      return
    meta = self.checkpointer.restore_meta(latest)
    config_lib.check_resumable(meta["config"], self.config, workdir)
    self.carry_batch_size = meta["carry_batch_size"]
    state = self.state._replace(carry=self.zero_carry(self.carry_batch_size) if self.carry_batch_size else None)
    self.state = self.checkpointer.restore_state(latest, abstract_like(state))
    self.stream.set_state(meta["stream"])
    self.examples_seen = meta["examples_seen"]
    if "batch_policy" in meta:  # checkpoints written before lbjax had batch policies have none
      self.batch_policy.load_state_dict(meta["batch_policy"])
    self.resumed_from = latest

  @property
  def epoch(self) -> float:
    """The run's clock: the training stream's position in epochs."""
    return self.stream.epoch()

  def finished(self) -> bool:
    """Whether training is over: `num_epochs` reached, or `num_steps` (when > 0) taken."""
    return self.epoch >= self.config.num_epochs or 0 < self.config.num_steps <= self.step_count

  def zero_carry(self, global_batch_size: int) -> Any:
    carry = self.task.zero_carry(self.model, global_batch_size)
    if carry is None:
      return None
    per_process = global_batch_size // self.process_count
    start = self.process_index * per_process
    local = jax.tree.map(lambda x: x[start:start + per_process], carry)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        self.batch_sharding, x, (global_batch_size,) + x.shape[1:]), local)

  def num_microbatches(self, global_batch_size: int) -> int:
    share = global_batch_size // data_parallel_size(self.mesh)
    limit = self.config.max_device_batch
    return share // limit if 0 < limit < share else 1

  def next_batch(self) -> Batch:
    """The next training batch at the current epoch: its size from the batch-size schedule, the
    learning rate from the LR schedule, the loss variant; resets the carried state where the
    stream starts a new row of batches or the batch size changed."""
    epoch = self.epoch
    size = self.batch_policy.batch_size(epoch)
    local = self.stream.next_batch(size)
    if self.task.take_carry_reset(local) or (self.state.carry is not None and self.carry_batch_size != size):
      self.state = self.state._replace(carry=self.zero_carry(size))
      self.carry_batch_size = size
    config = self.config.loss
    discard_fraction = config.discard_fraction if epoch < config.discard_until_epoch else 0.0
    arrays = self.any_batch.place(local, size) if self.any_batch else global_batch(local, self.batch_sharding)
    return Batch(size, arrays, host_scalar(self.batch_policy.learning_rate(epoch, size), self.replicated),
                 discard_fraction)

  def train_step(self, global_batch_size: int, discard_fraction: float, state: TrainState, batch,
                 learning_rate):
    """The compiled step for this global batch size (and loss variant), compiled once, on first use."""
    key = (global_batch_size, discard_fraction)
    if key not in self.compiled:
      start = time.perf_counter()
      step = make_train_step(self.graphdef, self.task, self.optimizer, self.mesh,
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
    """Takes one training step on `batch`; returns its metrics, still on the device."""
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
    carry = self.zero_carry(batch_size)
    totals = None
    for local in self.task.dataset.make_eval_batches(batch_size, self.process_index, self.process_count):
      local.pop("reset_carry", None)  # the carry starts at zero and runs through the whole split
      sums, carry = self._eval_step(self.state.params, self.state.model_state,
                                    global_batch(local, self.batch_sharding), carry)
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
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
    """Raises `NonFiniteError` if a step produced a non-finite loss or update (waits for the device)."""
    bad_step = int(jax.device_get(self.state.first_nonfinite_step))
    if bad_step < 0:
      return
    last = None
    if self.checkpointer is not None:
      self.checkpointer.wait()
      last = self.checkpointer.latest_step()
    kept = f"the last good checkpoint (step {last}) in {self.checkpointer.directory} is unharmed" \
        if last is not None else "no checkpoint was written"
    raise NonFiniteError(
        f"Non-finite loss or update at step {bad_step}: training stopped and the state was not "
        f"updated from that step on; {kept}. Lower the learning rate, lengthen the warm-up, or check "
        "the data.")

  def save(self) -> None:
    """Checks the health, then checkpoints the current step, once (a SIGTERM right after an
    evaluation finds it saved). Without a workdir, only the health check."""
    self.check_health()
    if self.checkpointer is None or self.checkpointer.latest_step() == self.step_count:
      return
    meta = {"stream": self.stream.get_state(), "examples_seen": self.examples_seen, "epoch": self.epoch,
            "carry_batch_size": self.carry_batch_size, "config": self.config.to_json(),
            "batch_policy": self.batch_policy.state_dict()}
    self.checkpointer.save(self.step_count, self.state, meta)

  def close(self) -> None:
    """Waits for checkpoints in flight and closes the checkpointer."""
    if self.checkpointer is not None:
      self.checkpointer.close()
