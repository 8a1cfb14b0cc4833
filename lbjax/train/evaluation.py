"""Measurements of a run's state on the evaluation split: `Evaluator` (the task's metrics on the whole
split) and `LipschitzProbe` (papers/001 §4: the curvature along the gradient on its first examples)."""

import collections

import jax
from flax import nnx

from lbjax import diagnostics
from lbjax.train import protocols
from lbjax.train.build import StepParts, global_batch
from lbjax.train.state import TrainState


class Evaluator:
  """The task's metrics of a state on the whole evaluation split, in batches of `batch_size`."""

  def __init__(self, parts: StepParts, batch_size: int):
    self._parts, self._batch_size = parts, batch_size
    self._step = parts.eval_step()

  def __call__(self, state: TrainState) -> dict[str, float]:
    parts = self._parts
    zero = carry = parts.zero_carry(self._batch_size)  # the eval step does not donate it: reusable
    totals = None
    batches = parts.task.dataset.make_eval_batches(self._batch_size, jax.process_index(), jax.process_count())
    in_flight = collections.deque()  # the totals of the latest steps, not yet waited for
    for local in batches:
      if protocols.take_carry_reset(local):  # the rows start again (every window with carry_state=False)
        carry = zero
      sums, carry = self._step(state.params, state.model_state, global_batch(local, parts.batch_sharding), carry)
      totals = sums if totals is None else jax.tree.map(lambda a, b: a + b, totals, sums)
      # At most two steps in flight, as in training. Queued without bound, XLA:CPU's launch of a device's
      # part blocks a worker thread while that device's queue is full, and the other devices' parts, in a
      # collective, block the rest waiting for it: a deadlock (pipelined evaluation on 4 CPU devices, issue 30).
      in_flight.append(totals)
      if len(in_flight) > 2:
        jax.block_until_ready(in_flight.popleft())
    totals = {k: float(v) for k, v in jax.device_get(totals).items()}
    return parts.task.summarize(totals)


class LipschitzProbe:
  """L(x, g) = |g^T H g| / ||g||^2 along the gradient on the first `batch_size` evaluation examples."""

  def __init__(self, parts: StepParts, batch_size: int, seed: int):
    local = next(iter(parts.task.dataset.make_eval_batches(batch_size, jax.process_index(), jax.process_count())))
    batch = global_batch(protocols.model_inputs(local), parts.batch_sharding)
    carry = parts.zero_carry(batch_size)
    key = jax.random.key(seed)

    def loss_fn(params, batch, model_state):
      model = nnx.merge(parts.graphdef, params, model_state)
      return parts.task.train_loss(model, batch, carry, key)[0]

    self._fn = jax.jit(lambda params, model_state: diagnostics.lipschitz_along_gradient(
        lambda p, b: loss_fn(p, b, model_state), params, batch))

  def __call__(self, state: TrainState) -> float:
    return float(jax.device_get(self._fn(state.params, state.model_state)))
