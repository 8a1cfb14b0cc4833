"""`train_and_evaluate`: the training loop from a config to a trained, evaluated, checkpointed run.

One clock: the data stream's position in epochs (examples consumed / train-set size) decides the batch
size (a batch-size schedule), the learning rate (warm-up and decay in epochs), evaluation and the end of
training, so every recipe stays right when the batch size changes mid-run.

The loop never waits for the device between steps: metrics of each step stay on the device and are
fetched together every `log_every` steps; the health check (non-finite loss or update) rides along.
"""

import dataclasses
import json
import math
import pathlib
import signal
import threading
import time
from typing import Any

from absl import logging
from flax import nnx
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from lbjax import diagnostics
from lbjax import optim
from lbjax.train import config as config_lib
from lbjax.train import summary
from lbjax.train import validation
from lbjax.train import optimizer as optimizer_lib
from lbjax.train.checkpointing import Checkpointer, abstract_like
from lbjax.train.mesh import batch_sharding, build_mesh, data_parallel_size, parameter_sharding, replicated
from lbjax.train.metrics import MetricsWriter, ProgressLine
from lbjax.train.state import TrainState
from lbjax.train.step import make_eval_step, make_train_step, per_device_compression_state
from lbjax.train.tasks import build_task


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss or update; the state and checkpoints stay the last good ones."""


@dataclasses.dataclass
class TrainResult:
  """What a finished (or preempted) run returns."""
  state: TrainState
  eval_metrics: dict[str, float]
  step: int
  epoch: float
  examples_seen: int
  compiled_batch_sizes: tuple[int, ...]  # one entry per compiled train step, in order
  preempted: bool


class _PreemptionFlag:
  """Whether a SIGTERM asks the run to save and stop, read at step boundaries.

  One process: a Python SIGTERM handler sets a flag. Several processes must stop at the same step (a
  process that stops alone leaves the others waiting in the next collective): there JAX's preemption
  service catches SIGTERM on any host, and `reached_preemption_sync_point(step)` turns true on every
  host at the same step, so no Python handler is installed.
  """

  def __init__(self):
    self._event = threading.Event()
    self._previous = None
    self._multi_process = jax.process_count() > 1
    self._preemption_service = bool(jax.config.jax_enable_preemption_service)
    if self._multi_process:
      if not self._preemption_service:
        logging.warning("jax_enable_preemption_service is off: a SIGTERM will kill this process "
                        "without a checkpoint and leave the others waiting; the last periodic "
                        "checkpoint is what a restart resumes from.")
    elif threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, lambda *_: self._event.set())

  def should_stop(self, step: int) -> bool:
    if self._multi_process:
      return self._preemption_service and multihost_utils.reached_preemption_sync_point(step)
    return self._event.is_set()

  def restore(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def global_batch(local: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  """Assembles every process's share of a batch into global arrays split by `sharding`."""
  count = jax.process_count()
  return {k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0] * count,) + v.shape[1:])
          for k, v in local.items()}


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


def _host_scalar(value: float, sharding) -> jax.Array:
  return jax.make_array_from_process_local_data(sharding, np.asarray(value, np.float32), ())


def _flatten(tree: Any) -> dict[str, float]:
  flat = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    name = "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)
    values = np.ravel(np.asarray(leaf, np.float64))
    for i, value in enumerate(values):
      if np.isfinite(value):
        flat[name if values.size == 1 else f"{name}[{i}]"] = float(value)
  return flat


class Run:
  """A validated config turned into its parts: mesh, task, schedules, optimizer, compiled steps.

  `train_and_evaluate` drives one; `lbjax.train.layer_table` uses one to look at the first step.
  """

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    devices = jax.devices()[:config.mesh.num_devices] if config.mesh.num_devices > 0 else None
    self.mesh = build_mesh(config.mesh.data, config.mesh.fsdp, devices)
    validation.validate(config, data_parallel_size=data_parallel_size(self.mesh))
    self.task = build_task(config)
    self.lr_schedule = optimizer_lib.learning_rate_schedule(config)
    self.batch_size_schedule = optimizer_lib.batch_size_schedule(config)
    self.optimizer = optimizer_lib.build_optimizer(config)
    self.compressor = optimizer_lib.build_compressor(config)
    self.batch_sharding = batch_sharding(self.mesh)
    self.replicated = replicated(self.mesh)
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.compiled: dict[int, Any] = {}
    self.compile_seconds: dict[int, float] = {}

  def initial_state(self) -> TrainState:
    """Initialises the model inside one jitted program that writes each parameter straight to its
    sharding (eager NNX initialisation compiles one program per parameter shape: minutes for
    ResNet-50 on a CPU)."""
    build = lambda: self.task.build_model(nnx.Rngs(self.config.seed))
    self.model = nnx.eval_shape(build)
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

  def lipschitz(self, state: TrainState) -> float:
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
    return float(jax.device_get(self._lipschitz(state)))

  def evaluate(self, state: TrainState) -> dict[str, float]:
    if not hasattr(self, "_eval_step"):
      self._eval_step = jax.jit(make_eval_step(self.graphdef, self.task))
    batch_size = self.config.eval_batch_size
    carry = self.zero_carry(batch_size)
    totals = None
    for local in self.task.dataset.make_eval_batches(batch_size, self.process_index, self.process_count):
      local.pop("reset_carry", None)  # the carry starts at zero and runs through the whole split
      sums, carry = self._eval_step(state.params, state.model_state,
                                    global_batch(local, self.batch_sharding), carry)
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
    totals = {k: float(v) for k, v in jax.device_get(totals).items()}
    return self.task.summarize(totals)


def _steps_per_epoch(stream, batch_size: int) -> int:
  if hasattr(stream, "windows_per_epoch"):
    return stream.windows_per_epoch(batch_size)
  return stream.num_examples // batch_size


def _describe_start(run: "Run", state: TrainState, stream, workdir: pathlib.Path, origin: str) -> None:
  """Prints the resolved run (process 0, with `config.progress`) and writes `<workdir>/config.json`."""
  resolved = summary.resolved_run(run.config)
  sizes = config_lib.batch_sizes(run.config)
  resolved["devices"] = (f"{jax.device_count()} {jax.devices()[0].platform} on {jax.process_count()} "
                         f"process(es); mesh {dict(run.mesh.shape)}")
  resolved["steps_per_epoch"] = ", ".join(f"{_steps_per_epoch(stream, b)} at batch {b}" for b in sizes)
  resolved["parameters"] = f"{sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params)):,}"
  if run.process_index != 0:
    return
  workdir.mkdir(parents=True, exist_ok=True)
  record = {"origin": origin, "resolved": resolved, "config": json.loads(run.config.to_json())}
  (workdir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
  if run.config.progress:
    print("\n".join(summary.format_run(resolved, origin)), flush=True)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str | pathlib.Path, *,
                       origin: str = "") -> TrainResult:
  """Trains and evaluates the run `config` describes, checkpointing into `workdir`.

  If `workdir` already holds a checkpoint of the same recipe, the run resumes from it exactly (same
  parameters, optimizer state, RNG, data position); a checkpoint of a different recipe is an error.
  SIGTERM saves a checkpoint at the next step boundary and returns with `preempted=True`.

  Raises:
    ValueError: invalid config (before any compute) or an incompatible checkpoint in `workdir`.
    FileNotFoundError: missing data (the message says where to get it).
    NonFiniteError: a non-finite loss or update; nothing after the last good step is written.
  """
  workdir = pathlib.Path(workdir)
  run = Run(config)
  checkpointer = Checkpointer(workdir, max_to_keep=config.keep_checkpoints)
  state = run.initial_state()
  stream = run.task.dataset.make_train_stream(run.process_index, run.process_count)
  _describe_start(run, state, stream, workdir, origin)
  examples_seen, carry_batch_size = 0, None
  latest = checkpointer.latest_step()
  if latest is not None:
    meta = checkpointer.restore_meta(latest)
    config_lib.check_resumable(meta["config"], config, str(workdir))
    carry_batch_size = meta["carry_batch_size"]
    state = state._replace(carry=run.zero_carry(carry_batch_size) if carry_batch_size else None)
    state = checkpointer.restore_state(latest, abstract_like(state))
    stream.set_state(meta["stream"])
    examples_seen = meta["examples_seen"]
    if run.process_index == 0 and config.progress:
      print(f"Resumed from {checkpointer.directory} at step {latest} (epoch {stream.epoch():.4f}).",
            flush=True)

  writer = MetricsWriter(workdir, enabled=run.process_index == 0, tensorboard=config.tensorboard)
  progress = ProgressLine(config.num_epochs, config.num_steps, enabled=run.process_index == 0 and config.progress)
  start_examples = examples_seen
  preemption = _PreemptionFlag()
  step = int(jax.device_get(state.step))
  progress.reset_window(examples_seen, stream.epoch(), step)
  best: dict[str, float] = {}

  def evaluated(metrics: dict[str, float], **extra) -> dict[str, float]:
    """Records an evaluation: metrics file, console line, best so far."""
    nonlocal best
    writer.write("eval", step, dict(metrics, epoch=stream.epoch(), **extra))
    progress.evaluation(step, stream.epoch(), metrics, run.task.dataset.eval_split)
    key, better = ("accuracy", max) if "accuracy" in metrics else ("loss", min)
    if not best or better(metrics[key], best[key]) == metrics[key]:
      best = dict(metrics)
    return metrics
  if config.compression.name != "none":
    bits = optim.compression.bits_per_step(state.params, run.compressor)
    writer.write("compression", step, {
        "name": config.compression.name, "bits_per_device_step": bits.compressed,
        "uncompressed_bits": bits.uncompressed, "ratio": bits.ratio})
  pending: list[dict[str, jax.Array]] = []
  next_eval = (math.floor(stream.epoch() / config.eval_every_epochs) + 1) * config.eval_every_epochs
  eval_metrics: dict[str, float] = {}
  preempted = False

  def save() -> None:
    """Checkpoints the current step (once: a SIGTERM right after an evaluation finds it saved)."""
    check_health()
    if checkpointer.latest_step() == step:
      return
    meta = {"stream": stream.get_state(), "examples_seen": examples_seen, "epoch": stream.epoch(),
            "carry_batch_size": carry_batch_size, "config": config.to_json()}
    checkpointer.save(step, state, meta)

  def check_health() -> None:
    bad_step = int(jax.device_get(state.first_nonfinite_step))
    if bad_step >= 0:
      checkpointer.wait()
      last = checkpointer.latest_step()
      kept = f"the last good checkpoint (step {last}) in {checkpointer.directory} is unharmed" \
          if last is not None else "no checkpoint was written"
      raise NonFiniteError(
          f"Non-finite loss or update at step {bad_step}: training stopped and the state was not "
          f"updated from that step on; {kept}. Lower the learning rate, lengthen the warm-up, or check "
          "the data.")

  def flush_metrics() -> None:
    nonlocal pending
    if not pending:
      return
    values = jax.device_get(pending)
    check_health()
    record = {k: float(np.mean([v[k] for v in values])) for k in values[0] if k != "learning_rate"}
    record["learning_rate"] = float(values[-1]["learning_rate"])
    if "noise_scale_grad_norm_sq" in record:  # a ratio of averages, as McCandlish et al. advise
      record["gradient_noise_scale"] = float(diagnostics.simple_noise_scale(diagnostics.NoiseScaleEstimate(
          record["noise_scale_grad_norm_sq"], record["noise_scale_trace_sigma"])))
    record["examples_per_second"] = progress.show(step, stream.epoch(), examples_seen, record["loss"],
                                                  record["learning_rate"], current_batch_size)
    record.update(epoch=stream.epoch(), examples_seen=examples_seen, batch_size=current_batch_size)
    writer.write("train", step, record)
    if run.has_layerwise_rates:
      writer.write("trust_ratio", step, _flatten(jax.device_get(optim.trust_ratios(state.opt_state))))
    pending = []

  current_batch_size = run.batch_size_schedule(stream.epoch())
  previous_loss = None
  try:
    while stream.epoch() < config.num_epochs and not 0 < config.num_steps <= step:
      epoch = stream.epoch()
      current_batch_size = run.batch_size_schedule(epoch)
      local = stream.next_batch(current_batch_size)
      if run.task.take_carry_reset(local) or (state.carry is not None and carry_batch_size != current_batch_size):
        state = state._replace(carry=run.zero_carry(current_batch_size))
        carry_batch_size = current_batch_size
      batch = global_batch(local, run.batch_sharding)
      learning_rate = _host_scalar(run.lr_schedule(epoch), run.replicated)
      discard_fraction = config.loss.discard_fraction if epoch < config.loss.discard_until_epoch else 0.0
      compiled_before = len(run.compiled)
      train_step = run.train_step(current_batch_size, discard_fraction, state, batch, learning_rate)
      if len(run.compiled) > compiled_before:
        writer.write("compile", step, {
            "batch_size": current_batch_size, "discard_fraction": discard_fraction,
            "seconds": run.compile_seconds[(current_batch_size, discard_fraction)]})
      state, metrics = train_step(state, batch, learning_rate)
      # At most two steps in flight: the host prepares the next batch while the device works, but
      # never runs far ahead of it, so a SIGTERM or a non-finite loss is acted on within two steps
      # (unbounded, it ran 51 steps ahead on a slow CPU step and the save came 83 s after SIGTERM).
      if previous_loss is not None:
        previous_loss.block_until_ready()
      previous_loss = metrics["loss"]
      if len(run.compiled) > compiled_before:
        progress.reset_window(examples_seen, stream.epoch(), step)
      step += 1
      examples_seen += current_batch_size
      pending.append(metrics)
      if step % config.log_every == 0:
        flush_metrics()
      if config.diagnostics.lipschitz_every and step % config.diagnostics.lipschitz_every == 0:
        writer.write("lipschitz", step, {"lipschitz": run.lipschitz(state), "epoch": stream.epoch(),
                                         "batch_size": current_batch_size})
      if stream.epoch() >= next_eval and stream.epoch() < config.num_epochs:
        flush_metrics()
        eval_metrics = evaluated(run.evaluate(state))
        next_eval = (math.floor(stream.epoch() / config.eval_every_epochs) + 1) * config.eval_every_epochs
        save()  # every evaluated point is also a checkpoint: an interrupted run loses at most an epoch
        progress.reset_window(examples_seen, stream.epoch(), step)
      elif config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0:
        save()
      if preemption.should_stop(step):
        flush_metrics()
        save()
        preempted = True
        logging.warning("SIGTERM: saved a checkpoint at step %d; exiting.", step)
        break
    flush_metrics()
    if not preempted:
      eval_metrics = evaluated(run.evaluate(state), final=True)
      save()
  finally:
    preemption.restore()
    checkpointer.close()
    writer.close()
  progress.summary(step=step, epoch=stream.epoch(), examples_seen=examples_seen - start_examples,
                   final=eval_metrics, best=best, preempted=preempted)
  return TrainResult(state, eval_metrics, step, stream.epoch(), examples_seen,
                     tuple(batch_size for batch_size, _ in run.compiled), preempted)
