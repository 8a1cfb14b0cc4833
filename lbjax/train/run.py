"""`Run`: a resolved config made into everything one training run holds, built whole in its constructor.

`Run(config, workdir)` resolves the config (`lbjax.train.validation.validate`; a `ResolvedRun` is
taken as it is), builds the mesh and checks the run against it, takes the workdir's lock, opens the
task's data (refusing a batch larger than the training set or an empty evaluation split), builds the
step parts (`lbjax.train.build.StepParts`: model graph, optimizer, compressor, shardings), the batch
policy and the initial state (each parameter initialised straight onto its sharding); given a
workdir, it resumes from its newest good checkpoint (`lbjax.train.resume`). What is left to do is one
step at a time:

    run = Run(config, workdir)
    while not run.finished():
      metrics = run.step(run.next_batch())

(`lbjax.train.step_calls.take_steps` draws several batches on the host, `run.next_host_batch()`, and runs
them in one device call with `config.steps_per_call` > 1: `run.step_call(batches)`.)

`train_and_evaluate` (`lbjax.train.loop`) drives a `Run` with the hooks of `lbjax.train.hooks`
around its steps; `lbjax.train.layer_table` and the benchmarks use one to look at a step.

One clock: the data stream's position in epochs (`run.epoch`: examples consumed / train-set size; for a token
stream, where its next batch starts) decides the batch size, the learning rate, the loss variant and the end of
training.
"""

import collections
import pathlib
import time
from typing import Any, NamedTuple

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from lbjax.train import batch_plan
from lbjax.train import config as config_lib
from lbjax.train import determinism
from lbjax.train import nonfinite
from lbjax.train import prefetch
from lbjax.train import protocols
from lbjax.train import step_calls
from lbjax.train import validation
from lbjax.train.any_batch import AnyBatchStep
from lbjax.train.batch_policy import BatchPolicy
from lbjax.train.build import CallPlacement, MeshPlacement, StepParts, described, host_scalar
from lbjax.train.checkpointing import Checkpointer, abstract_like, state_checksums
from lbjax.train.device_data import DeviceTrainingSet
from lbjax.train.errors import ConfigError
from lbjax.train.evaluation import LIPSCHITZ_FIELD, Evaluator, LipschitzProbe
from lbjax.train.mesh import data_parallel_size
from lbjax.train.resolved import MeshPlan, ResolvedRun
from lbjax.train.resume import HISTORY_FILE, Checkpoints, Start
from lbjax.train.state import TrainState
from lbjax.train.workdir_lock import WorkdirLock


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss or update; the state and checkpoints stay the last good ones."""


class Batch(NamedTuple):
  """One training batch, placed on the mesh (`Run.next_batch`) or still on the host (`Run.next_host_batch`),
  and what its step needs besides."""
  size: int  # the global batch size
  # Placed: the batch, or its micro-batches (any-batch step), as the step takes them: on the mesh, or numpy
  # arrays that the step's call places (`Run.step_places_batches`); None while the batch is on the host.
  arrays: dict[str, jax.Array | np.ndarray] | list[dict[str, jax.Array]] | None
  learning_rate: jax.Array | np.ndarray  # a float32 scalar: replicated, or numpy's that the step's call places
  discard_fraction: float  # papers/003 §3.1: the fraction of smallest losses the step drops
  reset_carry: bool  # the step starts from the zero carry (a new row of batches, or a new batch size)
  start_epoch: float  # the run's clock when the batch was chosen
  end_epoch: float  # the clock once it was drawn (after its step, the run's epoch)
  host_arrays: protocols.HostBatch | None = None  # this process's share, for a batch left on the host


class NewCompile(NamedTuple):
  """A train program the latest step or call compiled (for the `compile` record)."""
  batch_size: int
  discard_fraction: float
  steps: int  # the steps one call of it runs
  seconds: float
  ended: float  # `time.perf_counter()` when it was compiled (the compile took the `seconds` before)


class Run:
  """A resolved config turned into its parts, its state and its data, ready to step.

  Attributes:
    resolved: the `ResolvedRun` (every name resolved, every field typed).
    mesh, task, stream: the device mesh, the task (model and data), the training data stream in a
      `prefetch.PrefetchingStream` (its consumed position is the run's clock, `epoch`).
    parts: what the compiled steps need (`StepParts`: graph, optimizer, compressor, shardings).
    batch_policy: who chooses each step's batch size and learning rate (`lbjax.train.batch_policy`).
    any_batch: the any-batch step (`lbjax.train.any_batch`) with `batch.micro_batch_size`, else None.
    training_set: the training set held on the devices (`config.train_data_on_device`; the stream then
      hands out indices), else None.
    state: the `TrainState` (restored from the workdir's latest checkpoint when there is one).
    step_count: steps taken (the restored checkpoint's step on resume).
    examples_seen: training examples consumed, over all processes.
    batch_size: the global batch size of the latest step (the schedule's at the start).
    carry_batch_size: the batch size the carried state (PTB's LSTM state) was made for, or None.
    checkpoints: the workdir's `resume.Checkpoints`, or None without a workdir.
    lock: the workdir's `WorkdirLock` (held by process 0 until `close`), or None.
    start: where the run started (`resume.Start`: resumed from, skipped checkpoints, init_from).
    compiled: the compiled train steps by (global batch size, discard fraction), in the order they
      were compiled; `compiled_calls` the same of the programs of `steps_per_call` steps.
    new_compile: what the latest `step()` or `step_call()` compiled (`NewCompile`), or None.
    latest_call_steps: the steps the latest `step()` (1) or `step_call()` took.
    drawn_ahead: batches handed out by `next_batch` and not yet stepped (a call's, while it is drawn).
    step_places_batches: whether a batch is handed to the compiled step (or call) as numpy arrays, which
      its call places (`prefetch.step_places_batches`: one process of CPU devices): the call's C++ dispatch
      instead of `jax.device_put`'s Python (on 2 CPU cores a jitted call taking 128 uint8 digits dispatched
      in 0.010 ms, `jax.device_put` of them 0.055; benchmarks/README.md, Findings 11).
  """

  def __init__(self, config: ml_collections.ConfigDict | ResolvedRun, workdir=None):
    """Builds the run; with a `workdir`, takes its lock and resumes from its newest good checkpoint
    (or, with none, starts from `init_from`'s parameters when set).

    Raises:
      ConfigError: invalid config, a batch larger than the training set or an empty evaluation
        split (all before any compute).
      WorkdirInUseError: another run holds the workdir.
      CheckpointMismatchError, DataMismatchError: the workdir's checkpoint is of a different recipe
        (`config.check_resumable`) or was trained on other data.
      CheckpointCorruptError: no checkpoint in the workdir passes its checksum.
      FileNotFoundError: missing data (the message says where to get it).
    """
    determinism.request(config)  # config.deterministic: XLA's flags, before the backend starts
    if isinstance(config, ResolvedRun):  # resolved before the devices were known: checked on them now
      self.mesh, resolved = config.mesh.build(), config
      validation.check_devices(config, self.data_parallel_size)
    else:
      self.mesh = MeshPlan.read(config_lib.FieldReads(config)).build()
      resolved = validation.validate(config, data_parallel_size=self.data_parallel_size)
    self.resolved = resolved
    self.process_index, self.process_count = jax.process_index(), jax.process_count()
    self.step_places_batches = prefetch.step_places_batches(self.mesh)
    self.workdir = pathlib.Path(workdir).absolute() if workdir is not None else None
    self.lock = WorkdirLock(workdir) if workdir is not None and self.process_index == 0 else None
    self.checkpoints: Checkpoints | None = None
    self.stream: prefetch.PrefetchingStream | None = None
    self.compiled: dict[tuple[int, float], Any] = {}
    self.compiled_calls: dict[tuple[int, float], Any] = {}
    self.new_compile: NewCompile | None = None
    self.latest_call_steps = 1
    self.drawn_ahead = 0
    self._stepped_epoch = 0.0  # `epoch` while batches are drawn ahead (set when the first is drawn)
    self._in_flight = None  # the loss of the latest step or call, not yet waited for
    self._learning_rate: tuple[bytes, jax.Array | np.ndarray] | None = None  # the latest LR: float32 bytes, scalar
    # The batches of the latest two steps or calls, by step (0-based): the first non-finite quantity is
    # named from its step's batch (the metrics that reveal it come a step or call late).
    self._recent_batches: collections.deque[dict[int, Batch]] = collections.deque(maxlen=2)
    if self.lock is not None:
      self.lock.acquire()
    try:
      self.task = resolved.open_task()
      stream = self.task.dataset.make_train_stream(self.process_index, self.process_count)
      self.training_set = DeviceTrainingSet(stream, resolved.dataset_name) if resolved.train_data_on_device else None
      self.stream = prefetch.prefetching(  # batch t+1 drawn during step t
          self.training_set.stream if self.training_set else stream, self._prepare_batch)
      self._check_data_sizes()
      self.parts = StepParts.create(resolved, self.task, self.mesh)
      if self.training_set:
        self.training_set.place(self.parts.replicated)
      # How a host batch (`batch`) or a call's (`call_batch`) becomes what the step takes: decided once.
      self._placement = self.training_set or (CallPlacement() if self.step_places_batches else MeshPlacement())
      self.batch_policy = BatchPolicy(resolved.batch, resolved.learning_rate)
      micro_batch_size = resolved.batch.micro_batch_size
      self.any_batch = AnyBatchStep(self.parts, micro_batch_size) if micro_batch_size else None
      self._evaluate = Evaluator(self.parts, resolved.batch.eval_batch_size)
      watch = resolved.watch
      initial = self.parts.initial_state()
      self._lipschitz = (LipschitzProbe(self.parts, watch.lipschitz_batch_size, resolved.seed, initial,
                                        LIPSCHITZ_FIELD) if watch.lipschitz_every else None)
      if self.workdir is not None:
        self.checkpoints = Checkpoints(self.workdir, resolved, self.task.dataset, self.data_parallel_size,
                                       self.parts.replicated, self.lock)
        self.start = self.checkpoints.start(initial, self.train_carry, self.task.model_description)
      else:
        self.start = Start(initial)
      self.state = self.start.state
      self._take_position(self.start.meta)
    except BaseException:
      self.close()
      raise

  def _take_position(self, meta: dict[str, Any]) -> None:
    """The run's clock from a checkpoint's `meta` (or the start of training, `meta` {}): the stream's
    position, the batch policy's state, examples seen, the carry's batch size, the state's step."""
    if meta:
      self.stream.set_state(meta["stream"])
      if "batch_policy" in meta:  # checkpoints written before lbjax had batch policies have none
        self.batch_policy.load_state_dict(meta["batch_policy"])
    self.examples_seen, self.carry_batch_size = meta.get("examples_seen", 0), meta.get("carry_batch_size")
    self.step_count = int(jax.device_get(self.state.step))
    self.batch_size = self.batch_policy.batch_size(self.epoch)

  def restore_checkpoint(self, checkpointer: Checkpointer, step: int) -> dict[str, Any]:
    """Puts the run at checkpoint `step` of `checkpointer`, another run's of the same recipe (a branch
    point, a finished run to evaluate again): its state (the carried state at the batch size it was
    saved for), the data position, the batch policy's state and the examples seen, as a resume would;
    this run's workdir and its checkpoints are not touched. Returns the checkpoint's meta.

    Raises:
      CheckpointCorruptError: the checkpoint fails its checksum or cannot be read.
    """
    meta = checkpointer.read_meta_verified(step)
    carry_batch_size = meta["carry_batch_size"]
    target = self.state._replace(carry=self.train_carry(carry_batch_size, meta.get("carry_micro_batches"))
                                 if carry_batch_size else None)
    self.state = checkpointer.restore_verified(step, meta, abstract_like(target), self.parts.replicated)
    self._take_position(meta)
    return meta

  def _check_data_sizes(self) -> None:
    """Refuses, before any compute, a batch larger than the training set and an empty evaluation split."""
    resolved, dataset = self.resolved, self.task.dataset
    batch_plan.check_fits_data(resolved.batch, self.stream, resolved.dataset_name)
    name, size = f"config.dataset={resolved.dataset_name!r}", resolved.batch.eval_batch_size
    try:
      first = next(iter(dataset.make_eval_batches(size, self.process_index, self.process_count)), None)
    except (ValueError, MemoryError) as e:
      raise ConfigError(f"The evaluation split ({dataset.eval_split}) of {name} cannot be evaluated "
                        f"with config.eval_batch_size={size}: {e or type(e).__name__}") from e
    has_examples = first is not None and (protocols.MASK not in first or bool(np.any(first[protocols.MASK])))
    if self.process_count > 1:  # a process's share may be all padding (PTB's stream evaluation fills row 0 only)
      has_examples = bool(np.any(multihost_utils.process_allgather(np.bool_(has_examples))))
    if not has_examples:
      raise ConfigError(f"The evaluation split ({dataset.eval_split}) of {name} is empty; check the "
                        "data files (config.data_dir) before training.")

  @property
  def data_parallel_size(self) -> int:
    return data_parallel_size(self.mesh)

  @property
  def resumed_from(self) -> int | None:
    return self.start.resumed_from

  @property
  def skipped_checkpoints(self) -> list[tuple[int, str]]:
    return self.checkpoints.skipped if self.checkpoints is not None else []

  @property
  def epoch(self) -> float:
    """The run's clock: where the next batch starts, in epochs of the training stream, after the batches stepped
    (batches drawn ahead for a call not counted). It is the stream's position, or the next epoch's start where
    the next batch's size finds the rest of a token stream's epoch too short (`protocols.next_batch_start`)."""
    return self._stepped_epoch if self.drawn_ahead else self.next_batch_epoch()

  def next_batch_epoch(self) -> float:
    """Where the next batch drawn starts, in epochs, after the batches drawn so far (`protocols.next_batch_start`)."""
    return protocols.next_batch_start(self.stream, self.batch_policy.batch_size)[0]

  @property
  def trained_epochs(self) -> float:
    """Training done in the epochs `num_epochs` counts: scale-invariant epochs under AdaScale
    (`BatchPolicy.progress`), else `epoch`."""
    return self.batch_policy.progress(self.epoch)

  def finished(self, clock: step_calls.Clock | None = None) -> bool:
    """Whether training is over: `num_epochs` reached (`trained_epochs`), or `num_steps` (when > 0) taken;
    now, or at `clock` (`lbjax.train.step_calls.Clock`: where the batches drawn ahead would take the run)."""
    clock = self if clock is None else clock
    return clock.trained_epochs >= self.resolved.num_epochs or 0 < self.resolved.num_steps <= clock.step_count

  def train_carry(self, global_batch_size: int, num_microbatches: int | None) -> Any:
    """The zero carry of a training step: one [B, ...] carry (`num_microbatches` None), or one
    [m, ...] carry per micro-batch of the any-batch step."""
    if num_microbatches is None:
      return self.parts.zero_carry(global_batch_size)
    return self.any_batch.zero_carries(num_microbatches)

  def next_batch(self) -> Batch:
    """The next training batch at the current epoch, placed on the mesh (on accelerators drawn and placed
    while the previous step ran, and the next one started: `lbjax.train.prefetch`; on one process of CPU
    devices numpy arrays that the step's call places, `step_places_batches`): its size and learning rate
    from the batch policy, the loss variant; its step resets the carried state where the stream starts
    a new row of batches or the batch size changed (the stream then re-lays the rest of the epoch into
    the new rows, where the old carries have no meaning)."""
    return self._next(placed=True)

  def next_host_batch(self) -> Batch:
    """The next training batch as `next_batch` gives it, but left on the host (`arrays` None,
    `host_arrays` this process's share) and nothing prefetched: a call's batches, which `step_call`
    places together (`step` places one alone)."""
    return self._next(placed=False)

  def _next(self, placed: bool) -> Batch:
    epoch, size = protocols.next_batch_start(self.stream, self.batch_policy.batch_size)  # after the batches drawn
    if epoch != self.stream.epoch():  # the rest of a token stream's epoch holds no window of the size in force
      self.stream.end_epoch()
    if not self.drawn_ahead:
      self._stepped_epoch = epoch
    if placed:
      host_arrays, (reset_carry, arrays) = None, self.stream.next_prepared(size)
    else:
      host_arrays = self.stream.next_batch(size)
      reset_carry, arrays = protocols.take_carry_reset(host_arrays), None
    self.drawn_ahead += 1
    if placed:
      self.stream.prefetch(prefetch.decided_next_batch_size(self))
    # `carry_batch_size` is that of the carry once the batches drawn so far are stepped (None: no carry yet).
    reset_carry = reset_carry or self.carry_batch_size not in (None, size)
    if reset_carry:
      self.carry_batch_size = size
    return Batch(size, arrays, self.learning_rate_scalar(self.batch_policy.learning_rate(epoch, size)),
                 self.resolved.discard_fraction_at(epoch), reset_carry, epoch, self.stream.epoch(), host_arrays)

  def _prepare_batch(self, local: dict[str, np.ndarray], size: int) -> tuple[bool, Any]:
    """A drawn host batch's carry-reset flag and its arrays placed on the mesh (on the prefetch thread)."""
    reset_carry = protocols.take_carry_reset(local)
    return reset_carry, self._place(local, size)

  def _place(self, local: dict[str, np.ndarray], size: int) -> Any:
    """A host batch as the step takes it: its micro-batches (any-batch step) or the batch on the mesh, the rows
    gathered on the devices when they hold the training set; or the numpy arrays themselves where the step's
    call places them (`step_places_batches`)."""
    if self.any_batch:
      placed = self.any_batch.place(local, size)
      return self.training_set.gather(placed) if self.training_set else placed
    return self._placement.batch(local, self.parts.batch_sharding)

  def placed(self, batch: Batch) -> Batch:
    """`batch` with its arrays as the step takes them (`_place`d now if it was left on the host)."""
    return batch if batch.arrays is not None else batch._replace(arrays=self._place(batch.host_arrays, batch.size))

  def learning_rate_scalar(self, value: float) -> jax.Array | np.ndarray:
    """`value` as the step's float32 scalar, never donated. A value that repeats the previous step's float32
    bits is a replicated device scalar, placed once, so a constant-LR phase takes no host -> device transfer
    per step. A new value (a warm-up or decay changes it every step) is, on one process, a numpy scalar that
    the step's call places in its C++ dispatch (`host_scalar`'s Python cost about 0.06 ms a step on 2 CPU
    cores; benchmarks/README.md, Findings 11); on several, where a call takes only placed arrays, placed now."""
    bits = np.float32(value).tobytes()
    latest = self._learning_rate
    if latest is not None and latest[0] == bits:
      if isinstance(latest[1], np.ndarray):  # repeated: placed, once
        self._learning_rate = (bits, host_scalar(value, self.parts.replicated))
    elif self.process_count == 1:
      self._learning_rate = (bits, np.asarray(value, np.float32))
    else:
      self._learning_rate = (bits, host_scalar(value, self.parts.replicated))
    return self._learning_rate[1]

  def train_step(self, global_batch_size: int, discard_fraction: float, state: TrainState, batch,
                 learning_rate):
    """The compiled step for this global batch size (and loss variant), compiled once, on first use."""
    key = (global_batch_size, discard_fraction)
    if key not in self.compiled:
      start = time.perf_counter()
      batch = described(batch, self.parts.batch_sharding)
      self.compiled[key] = self.parts.train_step(global_batch_size, discard_fraction, state, batch).lower(
          state, batch, learning_rate).compile()
      ended = time.perf_counter()
      self.new_compile = NewCompile(global_batch_size, discard_fraction, 1, ended - start, ended)
    return self.compiled[key]

  def step(self, batch: Batch) -> dict[str, jax.Array]:
    """Takes one training step on `batch`; returns its metrics, still on the device.

    Raises:
      CheckpointSaveError: the background save started before this step failed.
    """
    batch = self.placed(batch)
    self._start(batch)
    if self.any_batch:
      self.state, metrics, seconds = self.any_batch.step(self.state, batch.arrays, batch.learning_rate,
                                                         batch.discard_fraction)
      if seconds:  # the any-batch programs compiled (once per run and loss variant), at this batch size
        self.compiled[(batch.size, batch.discard_fraction)] = self.any_batch
        self.new_compile = NewCompile(batch.size, batch.discard_fraction, 1, seconds, time.perf_counter())
    else:
      train_step = self.train_step(batch.size, batch.discard_fraction, self.state, batch.arrays,
                                   batch.learning_rate)
      self.state, metrics = train_step(self.state, batch.arrays, batch.learning_rate)
    self._finish([batch], metrics["loss"])
    self.batch_policy.after_step(self.step_count, batch.size, batch.start_epoch, batch.end_epoch, metrics)
    return metrics

  def step_call(self, batches: list[Batch]) -> dict[str, jax.Array]:
    """Takes the steps of `batches` (from `next_host_batch`: one size and loss variant, no carry reset after
    the first) in one device call (`lbjax.train.step_calls`), compiled once per size and loss variant, their
    arrays stacked and placed in one transfer; returns their metrics, each stacked over the steps, still on
    the device.

    Raises:
      CheckpointSaveError: the background save started before this call failed.
    """
    first = batches[0]
    self._start(first)
    key = (first.size, first.discard_fraction)
    sharding = self.parts.call_batch_sharding
    arrays = self._placement.call_batch([b.host_arrays for b in batches], sharding)
    learning_rates = tuple(b.learning_rate for b in batches)
    if key not in self.compiled_calls:
      start = time.perf_counter()
      described_arrays = described(arrays, sharding)
      self.compiled_calls[key] = self.parts.train_step_call(
          first.size, first.discard_fraction, len(batches), self.state, described_arrays).lower(
              self.state, described_arrays, learning_rates).compile()
      ended = time.perf_counter()
      self.new_compile = NewCompile(first.size, first.discard_fraction, len(batches), ended - start, ended)
    self.state, metrics = self.compiled_calls[key](self.state, arrays, learning_rates)
    first_step = self.step_count
    self._finish(batches, metrics["loss"])
    for index, batch in enumerate(batches):
      self.batch_policy.after_step(first_step + index + 1, batch.size, batch.start_epoch, batch.end_epoch,
                                   step_calls.StepRow(metrics, index))
    return metrics

  def _start(self, batch: Batch) -> None:
    """Before a step or call whose first batch is `batch`: a failed background save is raised, and the
    carry starts again where the batch says so."""
    if self.checkpoints is not None:
      self.checkpoints.check_background_save()
    self.new_compile = None
    if batch.reset_carry:
      count = self.any_batch.num_microbatches(batch.size) if self.any_batch else None
      self.state = self.state._replace(carry=self.train_carry(batch.size, count))

  def _finish(self, batches: list[Batch], loss: jax.Array) -> None:
    """After a step or call of `batches` is dispatched: waits for the one before (at most two in
    flight) and advances the run's counters."""
    # At most two steps (or calls) in flight: the host prepares the next batch while the device works,
    # but never runs far ahead of it, so a SIGTERM or a non-finite loss is acted on within two steps or
    # calls (unbounded, it ran 51 steps ahead on a slow CPU step and the save came 83 s after SIGTERM).
    if self._in_flight is not None:
      self._in_flight.block_until_ready()
    self._in_flight = loss
    self._recent_batches.append({self.step_count + i: batch for i, batch in enumerate(batches)})
    self.latest_call_steps = len(batches)
    self.drawn_ahead -= len(batches)
    self._stepped_epoch = batches[-1].end_epoch
    self.step_count += len(batches)
    self.examples_seen += sum(batch.size for batch in batches)
    self.batch_size = batches[-1].size

  def evaluate(self) -> dict[str, float]:
    """The task's metrics of the current state on the whole evaluation split."""
    return self._evaluate(self.state)

  def lipschitz(self) -> float:
    """L(x, g) = |g^T H g| / ||g||^2 along the gradient on the first eval examples (papers/001 §4)."""
    return self._lipschitz(self.state)

  def check_health(self) -> None:
    """Raises `NonFiniteError` if a step produced a non-finite loss or update (waits for the device).

    The message names the step, the first non-finite quantity (`nonfinite.first_nonfinite`) and the
    ways on.
    """
    bad_step = int(jax.device_get(self.state.first_nonfinite_step))
    if bad_step < 0:
      return
    last = None
    if self.checkpoints is not None:
      self.checkpoints.wait_for_save()
      last = self.checkpoints.latest_step()
    try:
      recent = {step: batch for batches in self._recent_batches for step, batch in batches.items()}
      bad_batch = self.placed(recent.get(bad_step, recent[max(recent)]))
      quantity, advice = nonfinite.first_nonfinite(self.state, bad_batch, graphdef=self.parts.graphdef,
                                                   task=self.task, optimizer=self.parts.optimizer,
                                                   replicated=self.parts.replicated)
    except Exception as e:  # pylint: disable=broad-except  (the diagnosis must not hide the stop)
      quantity, advice = (f"the first non-finite quantity could not be found ({type(e).__name__})",
                          "Lower config.lr.base or lengthen the warm-up, and check the data.")
    if last is None:
      raise NonFiniteError(f"Non-finite loss or update at step {bad_step}: {quantity}. Training stopped; no "
                           f"checkpoint was written. {advice}")
    workdir = self.workdir
    raise NonFiniteError(
        f"Non-finite loss or update at step {bad_step}: {quantity}. Training stopped and the state was not updated "
        f"from that step on; the last good checkpoint (step {last}) in {self.checkpoints.directory} is unharmed. "
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
    if self.drawn_ahead:  # the stream's position would skip batches drawn and not yet stepped
      raise RuntimeError(f"lbjax bug: a checkpoint at step {self.step_count} with {self.drawn_ahead} batch(es) "
                         "drawn and not stepped; please report it.")
    self.check_health()
    if self.checkpoints is None:
      return
    if self.checkpoints.needs_save(self.step_count):
      self.checkpoints.wait_for_save()
      carried = self.any_batch and self.state.carry is not None
      self.checkpoints.save(self.step_count, self.state, {
          "stream": self.stream.get_state(), "examples_seen": self.examples_seen, "epoch": self.epoch,
          "carry_batch_size": self.carry_batch_size, "config": self.resolved.source_config.to_json(),
          "carry_micro_batches": len(self.state.carry) if carried else None,
          "data_fingerprint": self.task.dataset.fingerprint, "data_parallel_size": self.data_parallel_size,
          "checksums": state_checksums(self.state, self.parts.replicated),
          "batch_policy": self.batch_policy.state_dict()})
    if durable:
      self.checkpoints.wait_for_save()

  def close(self) -> None:
    """Waits for checkpoints in flight, closes the checkpointer and releases the workdir lock. After a
    failed save (already reported as `CheckpointSaveError`), what else Orbax raises on closing is dropped."""
    try:
      if self.stream is not None:
        self.stream.close()  # the prefetch thread ends with the run
      if self.checkpoints is not None:
        self.checkpoints.close()
    finally:
      if self.lock is not None:
        self.lock.release()
