"""Measurements of a run's state on the evaluation split: `Evaluator` (the task's metrics on the whole
split) and `LipschitzProbe` (papers/001 §4: the curvature along the gradient on its first examples)."""

import collections
from collections.abc import Callable, Iterator
import contextlib

import jax
from flax import nnx
from jax.experimental import multihost_utils
import numpy as np

from lbjax import diagnostics
from lbjax.train import protocols
from lbjax.train.build import StepParts, global_batch
from lbjax.train.errors import ConfigError
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


def _real_rows(mask: np.ndarray) -> int:
  """The rows of an evaluation batch's `mask` ([N] per example, [N, T] per token) that hold data: PTB's stream
  evaluation fills row 0 only, and its tokens are not rows."""
  return int(np.sum(np.any(mask.reshape(mask.shape[0], -1) > 0, axis=1)))


LIPSCHITZ_FIELD = "config.diagnostics.lipschitz_every"  # the config field that asks for the probe


def lipschitz_function(parts: StepParts, seed: int) -> Callable[..., jax.Array]:
  """The probe's program, (params, model_state, batch, carry) -> L(x, g) on `batch` (a batch's model inputs),
  as `LipschitzProbe` runs it and `--compile-only` compiles it (each lowering it in `forward_mode_refused`)."""
  key = jax.random.key(seed)

  def probe(params, model_state, batch, carry):
    def loss_fn(params, batch):
      model = nnx.merge(parts.graphdef, params, model_state)
      return parts.task.train_loss(model, batch, carry, key)[0]

    return diagnostics.lipschitz_along_gradient(loss_fn, params, batch)

  return probe


@contextlib.contextmanager
def forward_mode_refused(field: str) -> Iterator[None]:
  """Lowering the probe (`lipschitz_function`) inside: JAX's refusal of a layer it cannot differentiate forward
  (a `custom_vjp`, found when lowering), which the Hessian-vector product needs, raised as the ConfigError naming
  `field`, the config field that asked for the probe."""
  try:
    yield
  except TypeError as e:
    if "forward-mode" not in str(e):
      raise
    raise ConfigError(
        f"{field}: the Lipschitz estimate (papers/001 §4) takes a Hessian-vector product, forward-mode over "
        f"reverse-mode differentiation, and this model has a layer whose derivative is written for reverse "
        f"mode only (JAX: {e}). Of lbjax's models' options, model_options.param_dtype_gradients=True writes its "
        f"layers' kernel gradients so: turn it off for runs with the estimate, or set {field}=0. In a model "
        f"of your own, a jax.custom_vjp is such a layer (a jax.custom_jvp differentiates both ways)."
    ) from None


class LipschitzProbe:
  """L(x, g) = |g^T H g| / ||g||^2 along the gradient on the first `batch_size` evaluation examples."""

  def __init__(self, parts: StepParts, batch_size: int, seed: int, state: TrainState, field: str):
    """Builds the probe for states like `state` (lowered here, not run).

    Raises:
      ConfigError: the model has a layer JAX cannot differentiate forward (a `custom_vjp`), which the
        Hessian-vector product needs; `field` is the config field that asked for the probe.
    """
    local = next(iter(parts.task.dataset.make_eval_batches(batch_size, jax.process_index(), jax.process_count())))
    real = _real_rows(local[protocols.MASK]) if protocols.MASK in local else batch_size // jax.process_count()
    if jax.process_count() > 1:  # the same decision on every process
      real = int(np.sum(multihost_utils.process_allgather(np.int32(real))))
    if real < batch_size:
      raise ConfigError(
          f"config.diagnostics.lipschitz_batch_size={batch_size}: the evaluation split's first batch holds {real} "
          f"real examples; the rest would be padding (copies or empty rows) taken for data. Use at most {real}.")
    self._batch = global_batch(protocols.model_inputs(local), parts.batch_sharding)
    self._carry = parts.zero_carry(batch_size)
    self._fn = jax.jit(lipschitz_function(parts, seed))
    with forward_mode_refused(field):  # lowered before any step: refused before training
      self._fn.trace(state.params, state.model_state, self._batch, self._carry).lower()

  def __call__(self, state: TrainState) -> float:
    return float(jax.device_get(self._fn(state.params, state.model_state, self._batch, self._carry)))
