"""Several training steps in one device call: `config.steps_per_call` = k.

Each device call costs the host a dispatch (the Python call, flattening the state's pytree, the
runtime's launch). At steps of about a millisecond on a GPU that host time is of the step's order and
the loop cannot keep the device busy (benchmarks/README.md, "train loop"). With k > 1 one compiled
program runs k steps in a `lax.scan` over k batches and their learning rates and returns each metric
stacked over the k steps: the host dispatches once per k steps (Keras' `steps_per_execution`,
TPUEstimator's `iterations_per_loop`).

The run stays the run of k = 1, step for step. `take_steps` draws a call's batches one at a time, on
the host (`Run.next_host_batch`), and stops drawing after the step where the host must act:

- a hook acts there (`acts_at`: a metrics window closes, an evaluation, a checkpoint, a curvature probe),
- the run ends there (`Run.finished`),
- the batch drawn differs in size or loss variant from the call's first (a batch-size schedule's
  boundary), or starts a new row of the carried state (`Batch.reset_carry`).

A call of k batches that share size and loss variant, with no carry reset after its first, runs as one
program (`Run.step_call`), its batches stacked [k, B, ...] on the host and placed in one transfer
(`build.global_call_batches`: placing them one by one took the loop more time than the program
itself on an H200, benchmarks/README.md Findings 11); any other draw runs one step per batch
(`Run.step`, the single-step program, each batch placed when its step starts). Nothing is prefetched
on a thread: the host draws the next call while the device runs this one.

So the steps, batches, learning rates, records, evaluations and checkpoints are those of k = 1; the
state agrees up to float rounding (the scanned program is compiled apart from the single step). The
hooks run once per call, with each metric stacked over its steps (`Run.latest_call_steps` of them);
SIGTERM is acted on at the end of a call, at most k steps late.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from lbjax.train.step import loops_slow_down_convolutions


class Clock(NamedTuple):
  """Where a run would stand after the batches drawn so far were stepped: what `acts_at` reads."""
  step_count: int
  epoch: float
  trained_epochs: float


def make_step_call(step: Callable[..., Any], mesh: Mesh) -> Callable[..., Any]:
  """`call(state, batches, learning_rates) -> (state, metrics)`: `step` (a `make_train_step` step)
  over each row of `batches` (every input stacked [k, B, ...], `mesh.call_batch_sharding`) with the
  matching scalar of the tuple `learning_rates`, in one `lax.scan`; each metric stacked over the steps.
  Not yet jitted. The scan is unrolled where a loop body would run the model's convolutions slowly
  (`loops_slow_down_convolutions`: on CPU devices)."""

  def call(state, batches: dict[str, jax.Array], learning_rates: tuple[jax.Array, ...]):
    unroll = len(learning_rates) if loops_slow_down_convolutions(state.params, mesh) else 1
    return jax.lax.scan(lambda state, x: step(state, *x), state, (batches, jnp.stack(learning_rates)), unroll=unroll)

  return call


class StepRow(Mapping):
  """Step `index` of a call's stacked metrics, each metric sliced only when read (the batch policy
  reads a few metrics of a few steps)."""

  def __init__(self, stacked: dict[str, jax.Array], index: int):
    self._stacked, self._index = stacked, index

  def __getitem__(self, name: str) -> jax.Array:
    return self._stacked[name][self._index]

  def __iter__(self) -> Iterator[str]:
    return iter(self._stacked)

  def __len__(self) -> int:
    return len(self._stacked)


def _call_batches(run: Any, hooks: Sequence[Any]) -> tuple[list[Any], bool]:
  """The batches of the next call, drawn one at a time until the call holds `steps_per_call`, or
  until the step after the latest drawn is one where the host must act (see the module doc); and
  whether they make one call (`steps_per_call` > 1 batches of one size and loss variant, no carry
  reset after the first). With `steps_per_call` 1, the one batch comes placed (and the next prefetched,
  `Run.next_batch`); with more, every batch stays on the host until its call or step places it."""
  count = run.resolved.steps_per_call
  draw = run.next_batch if count == 1 else run.next_host_batch
  batches = [draw()]
  first = batches[0]
  while len(batches) < count:
    epoch = run.next_batch_epoch()  # after the batches drawn
    clock = Clock(run.step_count + len(batches), epoch, run.batch_policy.progress(epoch))
    if run.finished(clock) or any(hook.acts_at(clock) for hook in hooks):
      return batches, False
    batch = draw()
    batches.append(batch)
    if batch.reset_carry or (batch.size, batch.discard_fraction) != (first.size, first.discard_fraction):
      return batches, False
  return batches, count > 1


def take_steps(run: Any, hooks: Sequence[Any]) -> Iterator[dict[str, jax.Array]]:
  """The next call's steps on `run`: yields the metrics of the one call that runs them all (stacked
  over the steps), or of each single step, after it is dispatched. `hooks`: the loop's hooks, whose
  `acts_at` ends a call."""
  batches, one_call = _call_batches(run, hooks)
  if one_call:
    yield run.step_call(batches)
    return
  for batch in batches:
    yield run.step(batch)
