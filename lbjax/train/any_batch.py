"""Any global batch that is a multiple of the micro-batch, with no new compile: `AnyBatchStep`.

`config.batch.micro_batch_size = m > 0` turns it on. A step of k micro-batches runs two programs compiled
once per run: `accumulate` (`step.make_accumulate_step`) adds the gradients of up to S = SLOTS
micro-batches per call in a host loop, and `apply` (`step.make_apply_step`) takes k traced; each update
equals the true batch of k*m examples. The step, why a host loop of fixed-shape calls and why S slots per
call (with the measurements), the data sharding and the PTB carry per micro-batch: docs/design.md, "Any
batch, one compile".
"""

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lbjax.train.build import StepParts
from lbjax.train.state import TrainState
from lbjax.train.step import (Accumulator, loops_slow_down_convolutions, make_accumulate_step, make_apply_step,
                              make_micro_batch_terms, merge_microbatches, micro_batch_split)

SLOTS = 16  # micro-batches per call of the accumulation program (lbjax.train.step.make_accumulate_step)


def split_local_batch(local: dict[str, np.ndarray], num_microbatches: int, local_devices: int
                      ) -> list[dict[str, np.ndarray]]:
  """A process's rows [B/P, ...] as k micro-batches [m/P, ...]: `step.micro_batch_split` over its
  `local_devices` devices. The process's rows are the shares of its devices, a contiguous block of
  the global batch, so its micro-batch j is its devices' part of the global micro-batch j, which
  `jax.make_array_from_process_local_data` assembles in device order."""
  parts = {k: micro_batch_split(v, num_microbatches, local_devices) for k, v in local.items()}
  return [{k: np.ascontiguousarray(v[j]) for k, v in parts.items()} for j in range(num_microbatches)]


def whole_batch(arrays: dict[str, jax.Array] | list[dict[str, jax.Array]], carry: Any = None
                ) -> tuple[dict[str, jax.Array], Any]:
  """A `run.Batch`'s arrays and the carry of its step as one batch [B, ...] and one carry, whatever
  the layout: a dict and its carry are returned as they are; the any-batch step's micro-batches (a
  list) and their carries (a tuple, one per micro-batch) are joined back into the batch's row order
  (`step.merge_microbatches`: micro-batch j holds the j-th slice of each data-parallel device's
  share, so on D devices joining them end to end would interleave the devices' rows), and row i of
  the carry stays with row i of the batch."""
  if not isinstance(arrays, list):
    return arrays, carry
  mesh = jax.tree.leaves(arrays[0])[0].sharding.mesh  # the micro-batches lie on the run's batch sharding
  join = jax.jit(lambda parts: merge_microbatches(jax.tree.map(lambda *p: jnp.stack(p), *parts), mesh))
  return join(arrays), (None if carry is None else join(carry))


class AnyBatchStep:
  """The train step for any multiple of `micro_batch_size`: two programs, each compiled once.

  Attributes:
    micro_batch_size: m, the global micro-batch.
    slots: micro-batches per call of the accumulation program: `SLOTS`, or 1 where
      `loops_slow_down_convolutions`.
    compiled: the compiled programs by name (`"accumulate"` and `"apply"` per loss variant).
    compile_seconds: their compile times, by the same keys.
  """

  def __init__(self, parts: StepParts, micro_batch_size: int):
    """`parts`: the run's model graph, task, optimizer and shardings (GSPMD: no compressor)."""
    self.micro_batch_size = micro_batch_size
    self.slots = 1 if loops_slow_down_convolutions(parts.abstract_params, parts.mesh) else SLOTS
    self._parts = parts
    self._local_devices = parts.data_parallel_size // jax.process_count()
    self.compiled: dict[Any, Any] = {}
    self.compile_seconds: dict[Any, float] = {}
    self._totals: Accumulator | None = None
    self._indices: dict[int, jax.Array] = {}

  def num_microbatches(self, global_batch_size: int) -> int:
    return global_batch_size // self.micro_batch_size

  def zero_carries(self, num_microbatches: int) -> tuple[Any, ...] | None:
    """The carry an update of `num_microbatches` starts from after a reset: one zero [m, ...]
    carry per micro-batch, or None for a task without one."""
    if self._parts.task.zero_carry(self._parts.model, self.micro_batch_size) is None:
      return None
    return tuple(self._parts.zero_carry(self.micro_batch_size) for _ in range(num_microbatches))

  def place(self, local: dict[str, np.ndarray], global_batch_size: int) -> list[dict[str, jax.Array]]:
    """This process's rows of a global batch as k global micro-batches on the mesh."""
    micro_batches = split_local_batch(local, self.num_microbatches(global_batch_size), self._local_devices)
    count = jax.process_count()
    shapes = [{k: (v.shape[0] * count,) + v.shape[1:] for k, v in micro.items()} for micro in micro_batches]
    return jax.make_array_from_process_local_data(self._parts.batch_sharding, micro_batches, shapes)

  def _compile(self, key, build):
    if key not in self.compiled:
      start = time.perf_counter()
      self.compiled[key] = build()
      self.compile_seconds[key] = time.perf_counter() - start
    return self.compiled[key]

  def _zero_totals(self, state: TrainState, micro_batch) -> Accumulator:
    """A zero accumulator with the shapes of one micro-batch's terms, on their shardings."""
    parts = self._parts
    carry = None if state.carry is None else state.carry[0]
    terms = make_micro_batch_terms(parts.graphdef, parts.task, parts.data_parallel_size)
    shapes = jax.eval_shape(terms, state, micro_batch, carry, 0, 1)[0]
    return jax.tree.map(lambda s, sharding: jax.device_put(np.zeros(s.shape, s.dtype), sharding),
                        shapes, self._totals_shardings(state, shapes))

  def _index(self, j: int) -> jax.Array:
    """Micro-batch index j (or a count) as a replicated int32, placed once."""
    if j not in self._indices:
      self._indices[j] = jax.device_put(np.int32(j), self._parts.replicated)
    return self._indices[j]

  def _totals_shardings(self, state: TrainState, totals) -> Accumulator:
    replicated = self._parts.replicated
    return Accumulator(replicated, jax.tree.map(lambda _: replicated, totals.metrics),
                       jax.tree.map(lambda _: replicated, totals.model_state),
                       jax.tree.map(lambda x: x.sharding, state.params), replicated)

  def step(self, state: TrainState, micro_batches: list[dict[str, jax.Array]], learning_rate: jax.Array,
           discard_fraction: float) -> tuple[TrainState, dict[str, jax.Array], float]:
    """One update over the micro-batches; returns the new state, its metrics and the seconds spent
    compiling during this call (0.0 when nothing compiled: any batch after the first).

    `state.carry` is None or one carry per micro-batch (`zero_carries`); each micro-batch's new
    carry replaces its own.
    """
    parts = self._parts
    before = set(self.compiled)
    carries = state.carry if state.carry is not None else (None,) * len(micro_batches)
    if len(carries) != len(micro_batches):
      raise ValueError(f"The any-batch step got {len(carries)} carries for {len(micro_batches)} micro-batches; "
                       "reset them with AnyBatchStep.zero_carries at a batch change (Run.next_batch does).")
    if self._totals is None:
      self._totals = self._zero_totals(state, micro_batches[0])
    state = state._replace(carry=None)  # the carries travel beside the state, so its shapes never change
    totals_shardings = self._totals_shardings(state, self._totals)
    state_shardings = jax.tree.map(lambda x: x.sharding, state)
    micro_shardings = jax.tree.map(lambda x: x.sharding, micro_batches[0])
    carry_shardings = jax.tree.map(lambda x: x.sharding, carries[0])
    index = self._index
    slots = self.slots
    count = index(len(micro_batches))
    accumulate = self._compile(("accumulate", discard_fraction), lambda: jax.jit(
        make_accumulate_step(parts.graphdef, parts.task, parts.data_parallel_size, discard_fraction, slots),
        in_shardings=(totals_shardings, state_shardings, (micro_shardings,) * slots, (carry_shardings,) * slots,
                      parts.replicated, parts.replicated, parts.replicated),
        out_shardings=(totals_shardings, (carry_shardings,) * slots), donate_argnums=(0,),
    ).lower(self._totals, state, (micro_batches[0],) * slots, (carries[0],) * slots, index(0), index(1),
            count).compile())
    apply = self._compile(("apply", discard_fraction), lambda: jax.jit(
        make_apply_step(parts.optimizer, self.micro_batch_size, discard_fraction),
        in_shardings=(state_shardings, totals_shardings, parts.replicated, parts.replicated),
        out_shardings=(state_shardings, parts.replicated, totals_shardings), donate_argnums=(0, 1),
    ).lower(state, self._totals, count, learning_rate).compile())
    totals, new_carries = self._totals, []
    for start in range(0, len(micro_batches), self.slots):
      used = micro_batches[start:start + self.slots]
      unused = self.slots - len(used)  # filled with repeats of the first: no new arrays
      totals, chunk_carries = accumulate(totals, state, tuple(used) + (used[0],) * unused,
                                         tuple(carries[start:start + len(used)]) + (carries[start],) * unused,
                                         index(start), index(len(used)), count)
      new_carries.extend(chunk_carries[:len(used)])
    state, metrics, self._totals = apply(state, totals, count, learning_rate)
    state = state._replace(carry=None if new_carries[0] is None else tuple(new_carries))
    return state, metrics, sum(self.compile_seconds[key] for key in self.compiled if key not in before)
