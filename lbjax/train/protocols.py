"""The trainer's seams, as protocols: what a training stream, a task and a hook must provide.

`lbjax.train.datasets` makes the streams, `lbjax.train.tasks` the tasks, `lbjax.train.hooks` the hooks;
a user's own dataset, model pairing or hook fits the trainer by having these methods.
"""

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from flax import nnx
import jax
import numpy as np

Batch = dict[str, jax.Array]
HostBatch = dict[str, np.ndarray]
# Keys a stream may put in a host batch that tell the trainer what to do, not what the model reads.
RESET_CARRY = "reset_carry"  # True where the rows of a token stream start again: the carry restarts at zero
MASK = "mask"  # evaluation: 1 for a real example, 0 for padding (the eval step sums with it)


@runtime_checkable
class TrainStream(Protocol):
  """One process's resumable training stream; its position in epochs is the run's clock."""
  num_examples: int

  def epoch(self) -> float:
    """Examples consumed (over all processes) / train-set size."""

  def next_batch(self, global_batch_size: int) -> HostBatch:
    """This process's rows of the next global batch."""

  def get_state(self) -> dict[str, Any]:
    """The position, JSON-ready (saved in every checkpoint)."""

  def set_state(self, state: dict[str, Any]) -> None:
    """Moves to a position `get_state` returned."""


@runtime_checkable
class WindowStream(TrainStream, Protocol):
  """A stream of token windows laid out in rows (truncated BPTT): a batch is one window per row."""

  def windows_per_epoch(self, global_batch_size: int) -> int:
    """The batches of one epoch at `global_batch_size` rows."""


@runtime_checkable
class RelayingWindowStream(WindowStream, Protocol):
  """A `WindowStream` that re-lays the rest of an epoch into the rows of a new batch size, and ends the epoch where
  the rest holds no window of them (`lbjax.data.PtbStream`); a window stream without these methods never does."""

  def start_epoch(self, global_batch_size: int) -> float:
    """Where the next batch of `global_batch_size` rows starts: `epoch()`, or the next epoch's start where the
    rest of this epoch holds no window of that many rows."""

  def end_epoch(self) -> None:
    """Ends the epoch at the current position: the next batch starts the next epoch."""


def next_batch_start(stream: TrainStream, batch_size_at: Callable[[float], int]) -> tuple[float, int]:
  """(epoch, size) of the next batch of `stream`, `batch_size_at(epoch)` being the size of a batch that starts at
  `epoch`: at the stream's position, unless a `RelayingWindowStream` finds the rest of its epoch too short for one
  window of that size; that batch starts the next epoch, and takes that epoch's size (the caller ends the epoch
  first, `RelayingWindowStream.end_epoch`, so that the stream does not go on with the rest at that size)."""
  epoch = stream.epoch()
  size = batch_size_at(epoch)
  if isinstance(stream, RelayingWindowStream):
    start = stream.start_epoch(size)
    if start != epoch:
      return start, batch_size_at(start)
  return epoch, size


def steps_per_epoch(stream: TrainStream, global_batch_size: int) -> int:
  """The steps of one epoch at `global_batch_size` (windows for a `WindowStream`)."""
  if isinstance(stream, WindowStream):
    return stream.windows_per_epoch(global_batch_size)
  return stream.num_examples // global_batch_size


def take_carry_reset(local_batch: HostBatch) -> bool:
  """Removes the stream's `RESET_CARRY` flag from a host batch; True where the carry starts again."""
  return bool(local_batch.pop(RESET_CARRY, False))


def model_inputs(local_batch: HostBatch) -> HostBatch:
  """The arrays of a host batch the model reads (the control keys left out)."""
  return {k: v for k, v in local_batch.items() if k not in (MASK, RESET_CARRY)}


class Task(Protocol):
  """What the trainer needs to know of a model and its data (`lbjax.train.tasks`): the steps call
  `train_loss` and `eval_sums`, the run the rest."""
  model_description: str  # the resolved constructor call, for the console

  def build_model(self, rngs: nnx.Rngs) -> nnx.Module:
    """A new model with parameters drawn from `rngs`."""

  def train_loss(self, model: nnx.Module, batch: Batch, carry: Any, dropout_key: jax.Array,
                 discard_fraction: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array], Any]:
    """Mean training loss, extra metrics (means over the batch) and the new carry.

    `discard_fraction` p > 0 drops the floor(p*B) smallest-loss examples of the batch (papers/003
    §3.1); tasks that cannot do this refuse it when the run is resolved.
    """

  def eval_sums(self, model: nnx.Module, batch: Batch, carry: Any) -> tuple[dict[str, jax.Array], Any]:
    """Sums over the (masked) batch, e.g. {'loss_sum', 'correct', 'count'}, and the new carry."""

  def summarize(self, sums: dict[str, float]) -> dict[str, float]:
    """The evaluation metrics from the sums over the whole split."""

  def zero_carry(self, model: nnx.Module, global_batch_size: int) -> Any:
    """The carried state at the start of a row of batches (host arrays), or None."""


class RunClock(Protocol):
  """Where a run stands (a `Run`), or would stand once the batches drawn ahead are stepped
  (`lbjax.train.step_calls.Clock`): what decides whether a hook acts."""
  step_count: int  # steps taken
  epoch: float  # the training stream's position in epochs
  trained_epochs: float  # training done in the epochs `num_epochs` counts (`BatchPolicy.progress`)


class RunView(RunClock, Protocol):
  """What the hooks see of a run (`lbjax.train.run.Run`): its clock, its state and what they may ask
  of it; whatever else a hook needs it gets when it is made."""
  examples_seen: int  # training examples consumed, over all processes
  batch_size: int  # the global batch of the latest step
  state: Any  # the `TrainState`
  new_compile: Any  # what the latest step or call compiled (`lbjax.train.run.NewCompile`), or None
  latest_call_steps: int  # the steps of the latest device call (`config.steps_per_call`; 1 for a step)
  drawn_ahead: int  # batches drawn and not yet stepped (between the single steps of one draw)

  def evaluate(self) -> dict[str, float]:
    """The task's metrics of the current state on the evaluation split."""

  def lipschitz(self) -> float:
    """The curvature along the gradient on the first evaluation examples (papers/001 §4)."""

  def check_health(self) -> None:
    """Raises `NonFiniteError` naming the first non-finite quantity, if a step went non-finite."""

  def save(self, *, durable: bool = False) -> None:
    """Checks the health and checkpoints the current step (on disk before returning with `durable`)."""


class Hook(Protocol):
  """Something done around the training steps (`lbjax.train.hooks`): called after every step, or every
  call of several steps (`lbjax.train.step_calls`)."""

  def acts_at(self, clock: RunClock) -> bool:
    """Whether the hook acts (reads or saves the state) after the step that brings the run to `clock`:
    a call of several steps ends there."""

  def after_step(self, run: RunView, metrics: dict[str, jax.Array]) -> None:
    """`run`: the run that took the step or call; `metrics`: the step's, still on the device (a call's:
    each stacked over its `run.latest_call_steps` steps)."""
