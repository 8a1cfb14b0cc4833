"""The compiled train and eval steps.

One train step is compiled per distinct global batch size (a batch-size schedule has a handful). When a
device's share of the batch exceeds `max_device_batch`, the step splits the batch into `k` micro-batches
and accumulates their gradients inside the compiled step with `lax.scan` (the papers' `iter_size`):

  g = (1/k) * sum_j grad L(w; micro-batch j)

Each micro-batch takes an equal slice of every device's share, so no example crosses devices, and
BatchNorm groups (ghost batch norm) are the same as in the true batch. BatchNorm running statistics
are the mean over micro-batches of the statistics each micro-batch would write, which equals the one
update the true batch makes. Dropout draws the masks of row n of the global batch from the key

  k_n = fold_in(fold_in(key(seed), step), n)                                       (`dropout_keys`)

whichever micro-batch and device hold the row: each micro-batch carries its rows' global indices
(`jnp.arange(B)` split as the batch is), and the model draws a row's masks from its key alone. Hence
accumulation gives the same update as the true large batch, and D data-parallel devices the same as
one, dropout included (up to float rounding).
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import optax

from lbjax import diagnostics
from lbjax.optim import compression
from lbjax.train.mesh import DATA_AXES, data_parallel_size
from lbjax.train.protocols import Task
from lbjax.train.state import TrainState

Batch = dict[str, jax.Array]


def micro_batch_split(x: Any, num_microbatches: int, shards: int) -> Any:
  """[B, ...] -> [k, B/k, ...]: the one definition of which rows of a batch each micro-batch holds.

  The batch lies in D = `shards` equal shares (device d holds rows d*B/D .. (d+1)*B/D - 1), and
  micro-batch j holds the j-th slice of s = B/(kD) rows of every share, in device order:

    row r of micro-batch j  =  batch row (r // s)*k*s + j*s + r % s,

  so no example changes device. `x` is a numpy or a jax array: the step splits its batch on the
  device with it (`_split_microbatches`), a process its rows on the host
  (`lbjax.train.any_batch.split_local_batch`), and `micro_batch_rows` derives from it the rows for a
  traced j and k.
  """
  per_slice = x.shape[0] // (shards * num_microbatches)
  x = x.reshape(shards, num_microbatches, per_slice, *x.shape[1:])
  return x.swapaxes(0, 1).reshape(num_microbatches, shards * per_slice, *x.shape[3:])


def _split_microbatches(tree: Any, num_microbatches: int, mesh: Mesh | None) -> Any:
  """`micro_batch_split` of every leaf over the data-parallel devices, sharded as a batch is.

  `mesh` is the global mesh under GSPMD; None inside `shard_map`, where the batch is one device's share.
  """
  shards = data_parallel_size(mesh) if mesh is not None else 1

  def split(x):
    x = micro_batch_split(x, num_microbatches, shards)
    if mesh is None:
      return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, DATA_AXES)))

  return jax.tree.map(split, tree)


def merge_microbatches(tree: Any, mesh: Mesh | None) -> Any:
  """Inverse of `_split_microbatches`: [k, B/k, ...] -> [B, ...] in the batch's row order."""
  shards = data_parallel_size(mesh) if mesh is not None else 1

  def merge(x):
    num_microbatches, rows = x.shape[:2]
    x = x.reshape(num_microbatches, shards, rows // shards, *x.shape[2:])
    x = jnp.swapaxes(x, 0, 1).reshape(num_microbatches * rows, *x.shape[3:])
    if mesh is None:
      return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(DATA_AXES)))

  return jax.tree.map(merge, tree)


def loops_slow_down_convolutions(params: Any, mesh: jax.sharding.Mesh) -> bool:
  """Whether a loop body runs this model slowly on `mesh`'s devices: XLA's CPU backend runs convolutions
  inside a loop body on a slow path (about 10x slower for a ResNet), so on CPU devices a model with
  convolutions (4-D kernels) should not accumulate micro-batches in a rolled loop. The mesh's platform,
  not the host's: a CPU host compiling for a TPU topology (`--compile-only`) builds the TPU's step."""
  cpu = mesh.devices.flat[0].platform == "cpu"
  return cpu and any(jnp.ndim(p) == 4 for p in jax.tree.leaves(params))


def dropout_keys(step_key: jax.Array, rows: jax.Array) -> jax.Array:
  """[n] dropout keys of the batch rows `rows` (int32 [n], indices into the global batch):
  k_n = fold_in(step_key, rows[n]), a function of the step and the row alone."""
  return jax.vmap(jax.random.fold_in, (None, 0))(step_key, rows)


def micro_batch_rows(index: jax.Array, num_microbatches: jax.Array, micro_batch_size: int,
                     data_parallel_size: int) -> jax.Array:
  """int32 [m]: the global-batch rows that `micro_batch_split` puts in micro-batch j = `index` of
  k = `num_microbatches` (both may be traced) when it splits a batch of k*m rows over D =
  `data_parallel_size` devices.

  Those rows are affine in j and k (see `micro_batch_split`), so the split of the rows 0..m-1
  (k = 1) and 0..2m-1 (k = 2) gives them for every j and k:

    rows(j, k) = rows(0, 1) + (k - 1)*(rows(0, 2) - rows(0, 1)) + j*(rows(1, 2) - rows(0, 2)).
  """
  one = micro_batch_split(np.arange(micro_batch_size, dtype=np.int32), 1, data_parallel_size)[0]
  two = micro_batch_split(np.arange(2 * micro_batch_size, dtype=np.int32), 2, data_parallel_size)
  return jnp.asarray(one) + (num_microbatches - 1) * (two[0] - one) + index * (two[1] - two[0])


def _accumulation_unroll(num_microbatches: int, params: Any, mesh: jax.sharding.Mesh) -> int:
  """How many micro-batches the accumulation loop unrolls: all of them, or 1 (a rolled loop).

  A rolled loop holds one micro-batch's activations at a time, so memory falls as 1/k: that is what
  `max_device_batch` is for, and the LSTMs also run faster that way on CPU (benchmarks/README.md,
  "accumulation"). Where `loops_slow_down_convolutions`, loops of up to 16 micro-batches unroll: as
  fast as one batch or faster, without the memory saving.
  """
  if loops_slow_down_convolutions(params, mesh) and num_microbatches <= 16:
    return num_microbatches
  return 1


def _all_finite(tree: Any) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def make_train_step(graphdef: nnx.GraphDef, task: Task, optimizer: optax.GradientTransformation,
                    mesh: Mesh, num_microbatches: int, discard_fraction: float = 0.0,
                    compressor: compression.GradientCompressor | None = None
                    ) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict[str, jax.Array]]]:
  """Returns `step(state, batch, learning_rate) -> (state, metrics)` (not yet jitted).

  `learning_rate` is the value of the run's epoch schedule at this batch, computed on the host and
  written into the `inject_hyperparams` state, so warm-up and decay follow epochs whatever the batch
  size. A non-finite loss or update leaves the state unchanged and records the step in
  `first_nonfinite_step`; every later step is then a no-op, so the state stays the last good one.

  With `num_microbatches = k >= 2` the step also reports, nearly for free, the two ingredients of the
  gradient noise scale B_simple = tr(Sigma)/|G|^2 (McCandlish et al. 2018, appendix A.1), from the
  micro-batch gradients (B/k examples) and their mean (B examples): `noise_scale_grad_norm_sq` and
  `noise_scale_trace_sigma`. Average each over steps before dividing.
  With `discard_fraction > 0` the smallest-loss examples are dropped within each micro-batch, and
  the noise scale counts the kept ones (`diagnostics.kept_examples`) as its batch sizes.
  The task gets one dropout key per row of its (micro-)batch, `dropout_keys` of the rows' global
  indices, so the masks are the same at any micro-batch count and on any number of devices.

  With a `compressor` the gradient is computed per device inside `jax.shard_map`: each device
  compresses its own gradient and the decoded values are averaged in one all-reduce
  (`lbjax.optim.compression.compressed_pmean`), which is what a compressed all-reduce delivers
  (papers/004: 1-bit SGD, QSGD; `no_compression` sends raw gradients). BatchNorm statistics are then
  per device, as in the papers' per-replica BN. Accumulation then runs on each device's share (the
  same micro-batches as above) and the accumulated gradient is reduced once; the noise-scale
  ingredients are estimated per device (B/(kD) and B/D examples) and averaged over the D devices.
  """

  def loss_fn(params, model_state, batch, carry, key):
    model = nnx.merge(graphdef, params, model_state)
    loss, metrics, new_carry = task.train_loss(model, batch, carry, key, discard_fraction)
    new_model_state = nnx.to_pure_dict(nnx.state(model, nnx.BatchStat))
    return loss, (metrics, new_model_state, new_carry)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def gradients(params, model_state, batch: Batch, carry, key: jax.Array, rows: jax.Array,
                split_mesh: Mesh | None):
    """Loss, metrics, BN state, carry and gradient of `batch`, accumulated over the micro-batches.

    `rows`: the global-batch indices of `batch`'s rows, for their dropout keys. `split_mesh`: the
    mesh whose device shares the micro-batches slice (GSPMD), or None for one device's share inside
    `shard_map`.
    """
    if num_microbatches == 1:
      (loss, (metrics, model_state, carry)), grads = grad_fn(params, model_state, batch, carry,
                                                             dropout_keys(key, rows))
      return loss, metrics, model_state, carry, grads
    micro_batches = _split_microbatches(batch, num_microbatches, split_mesh)
    micro_carries = _split_microbatches(carry, num_microbatches, split_mesh)
    micro_rows = _split_microbatches(rows, num_microbatches, split_mesh)

    def accumulate(totals, inputs):
      rows, micro_batch, micro_carry = inputs
      (loss, (metrics, new_model_state, new_carry)), grads = grad_fn(
          params, model_state, micro_batch, micro_carry, dropout_keys(key, rows))
      metrics = dict(metrics, micro_grad_norm_sq=optax.tree.norm(grads, squared=True))
      totals = jax.tree.map(jnp.add, totals, (loss, metrics, new_model_state, grads))
      return totals, new_carry

    first = jax.tree.map(lambda x: x[0], (micro_batches, micro_carries, micro_rows))
    shapes = jax.eval_shape(lambda b, c, r: grad_fn(params, model_state, b, c, dropout_keys(key, r)), *first)
    (_, (metric_shapes, model_state_shapes, _)), grad_shapes = shapes
    metric_shapes = dict(metric_shapes, micro_grad_norm_sq=shapes[0][0])
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                         (shapes[0][0], metric_shapes, model_state_shapes, grad_shapes))
    totals, carries = jax.lax.scan(
        accumulate, zeros, (micro_rows, micro_batches, micro_carries),
        unroll=_accumulation_unroll(num_microbatches, params, mesh))
    loss, metrics, model_state, grads = jax.tree.map(lambda t: t / num_microbatches, totals)
    micro_batch_kept = diagnostics.kept_examples(jax.tree.leaves(batch)[0].shape[0] // num_microbatches,
                                                 discard_fraction)
    estimate = diagnostics.noise_scale_estimates(
        metrics.pop("micro_grad_norm_sq"), optax.tree.norm(grads, squared=True),
        micro_batch_kept, num_microbatches * micro_batch_kept)
    metrics = dict(metrics, noise_scale_grad_norm_sq=estimate.grad_norm_sq,
                   noise_scale_trace_sigma=estimate.trace_sigma)
    return loss, metrics, model_state, merge_microbatches(carries, split_mesh), grads

  def per_device_gradients(state: TrainState, batch: Batch, key: jax.Array, rows: jax.Array):
    per_device = compressor.per_device_state  # an error-feedback residual per device: sharded, one row each
    state_spec = P(DATA_AXES) if per_device else P()

    def local(params, model_state, batch, carry, key, rows, compression_state):
      loss, metrics, model_state, carry, grads = gradients(params, model_state, batch, carry, key, rows, None)
      if per_device:
        compression_state = jax.tree.map(lambda x: x[0], compression_state)
      grads, compression_state = compression.compressed_pmean(grads, compression_state, compressor, DATA_AXES)
      if per_device:
        compression_state = jax.tree.map(lambda x: x[None], compression_state)
      loss, metrics, model_state = jax.lax.pmean((loss, metrics, model_state), DATA_AXES)
      return loss, metrics, model_state, carry, grads, compression_state

    sharded = jax.shard_map(
        local, mesh=mesh, in_specs=(P(), P(), P(DATA_AXES), P(DATA_AXES), P(), P(DATA_AXES), state_spec),
        out_specs=(P(), P(), P(), P(DATA_AXES), P(), state_spec), check_vma=False)
    return sharded(state.params, state.model_state, batch, state.carry, key, rows, state.compression_state)

  def step(state: TrainState, batch: Batch, learning_rate: jax.Array):
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    batch_size = jax.tree.leaves(batch)[0].shape[0]
    rows = jax.lax.with_sharding_constraint(jnp.arange(batch_size, dtype=jnp.int32),
                                            NamedSharding(mesh, P(DATA_AXES)))
    compression_state = state.compression_state
    if compressor is None:
      loss, metrics, model_state, carry, grads = gradients(
          state.params, state.model_state, batch, state.carry, key, rows, mesh)
    else:
      loss, metrics, model_state, carry, grads, compression_state = per_device_gradients(state, batch, key, rows)
    return _apply_gradients(optimizer, state, loss, metrics, model_state, carry, grads, compression_state,
                            learning_rate)

  return step


def _apply_gradients(optimizer: optax.GradientTransformation, state: TrainState, loss, metrics, model_state,
                     carry, grads, compression_state, learning_rate) -> tuple[TrainState, dict[str, jax.Array]]:
  """The optimizer update from `grads`, kept only if the loss and update are finite (see `make_train_step`)."""
  hyperparams = dict(state.opt_state.hyperparams, learning_rate=jnp.asarray(learning_rate, jnp.float32))
  opt_state = state.opt_state._replace(hyperparams=hyperparams)
  updates, opt_state = optimizer.update(grads, opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  finite = jnp.isfinite(loss) & _all_finite(updates)
  healthy = state.first_nonfinite_step < 0
  accept = finite & healthy
  updated = TrainState(state.step + 1, params, opt_state, model_state, state.rng, carry,
                       state.first_nonfinite_step, compression_state)
  new_state = jax.tree.map(lambda new, old: jnp.where(accept, new, old), updated, state)
  new_state = new_state._replace(first_nonfinite_step=jnp.where(
      healthy & ~finite, state.step, state.first_nonfinite_step))
  metrics = dict(metrics, loss=loss, learning_rate=learning_rate, grad_norm=optax.tree.norm(grads),
                 update_norm=optax.tree.norm(updates))
  return new_state, metrics


class Accumulator(NamedTuple):
  """Sums over the micro-batches of one update (`make_accumulate_step`), zero at its start."""
  loss: jax.Array
  metrics: dict[str, jax.Array]
  model_state: Any
  grads: Any
  micro_grad_norm_sq: jax.Array  # sum over micro-batches of |g_j|^2, for the noise scale


def make_micro_batch_terms(graphdef: nnx.GraphDef, task: Task, data_parallel_size: int,
                           discard_fraction: float = 0.0
                           ) -> Callable[[TrainState, Batch, Any, jax.Array, jax.Array], tuple[Accumulator, Any]]:
  """Returns `terms(state, micro_batch, carry, index, num_microbatches) -> (Accumulator, new carry)` of
  one micro-batch (not yet jitted).

  Its loss, metrics, BatchNorm statistics (from `state.model_state`, as in the scan of
  `make_train_step`), gradient at `state.params` and squared gradient norm, and the recurrent carry
  it leaves (`carry`: this micro-batch's rows of the carried state, or None). Micro-batch `index` of
  `num_microbatches` (traced int32 scalars) holds the global-batch rows `micro_batch_rows` gives for
  `data_parallel_size` devices, and its dropout keys are theirs (`dropout_keys`), as in `make_train_step`.
  """

  def loss_fn(params, model_state, batch, carry, key):
    model = nnx.merge(graphdef, params, model_state)
    loss, metrics, new_carry = task.train_loss(model, batch, carry, key, discard_fraction)
    return loss, (metrics, nnx.to_pure_dict(nnx.state(model, nnx.BatchStat)), new_carry)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def terms(state: TrainState, micro_batch: Batch, carry: Any, index: jax.Array, num_microbatches: jax.Array
            ) -> tuple[Accumulator, Any]:
    key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    micro_batch_size = jax.tree.leaves(micro_batch)[0].shape[0]
    rows = micro_batch_rows(index, num_microbatches, micro_batch_size, data_parallel_size)
    (loss, (metrics, model_state, carry)), grads = grad_fn(state.params, state.model_state, micro_batch, carry,
                                                           dropout_keys(key, rows))
    return Accumulator(loss, metrics, model_state, grads, optax.tree.norm(grads, squared=True)), carry

  return terms


def make_accumulate_step(graphdef: nnx.GraphDef, task: Task, data_parallel_size: int, discard_fraction: float = 0.0,
                         slots: int = 1) -> Callable[..., tuple[Accumulator, tuple[Any, ...]]]:
  """Returns `accumulate(totals, state, micro_batches, carries, first_index, count, num_microbatches)
  -> (totals, carries)` (not yet jitted).

  The first half of the step whose micro-batch count is a runtime value (`lbjax.train.any_batch`):
  `micro_batches` and `carries` are tuples of `slots` micro-batches [m, ...] and their carries, of
  which the first `count` (a traced int32, 1 <= count <= slots) are used; the others are ignored
  (any arrays of the same shapes, e.g. repeats of the first). Micro-batch j in [0, count) has index
  `first_index + j` of the update's `num_microbatches` (traced; with the index it names the global
  batch rows whose dropout keys the micro-batch draws) and adds `make_micro_batch_terms` to the sums,

    totals + sum_{j < count} terms_j,

  in a rolled `lax.fori_loop` (one micro-batch's activations at a time) when `slots > 1`; the
  returned carries are the new ones in the used slots and the given ones elsewhere. Its shapes are
  those of `slots` micro-batches whatever the batch, so it compiles once. With `slots = 1` there is
  no loop (`count` must be 1): what a model with convolutions needs on CPU
  (`loops_slow_down_convolutions`).
  """
  terms = make_micro_batch_terms(graphdef, task, data_parallel_size, discard_fraction)

  def add(totals: Accumulator, state: TrainState, micro_batch: Batch, carry: Any, index: jax.Array,
          num_microbatches: jax.Array):
    micro_terms, carry = terms(state, micro_batch, carry, index, num_microbatches)
    return jax.tree.map(jnp.add, totals, micro_terms), carry

  def accumulate(totals: Accumulator, state: TrainState, micro_batches: tuple[Batch, ...],
                 carries: tuple[Any, ...], first_index: jax.Array, count: jax.Array, num_microbatches: jax.Array
                 ) -> tuple[Accumulator, tuple[Any, ...]]:
    if slots == 1:
      totals, carry = add(totals, state, micro_batches[0], carries[0], first_index, num_microbatches)
      return totals, (carry,)
    stacked_carries = jax.tree.map(lambda *c: jnp.stack(c), *carries)

    def body(j, loop):
      totals, stacked_carries = loop
      micro_batch = jax.lax.switch(j, [lambda i=i: micro_batches[i] for i in range(slots)])
      carry = jax.tree.map(lambda c: c[j], stacked_carries)
      totals, carry = add(totals, state, micro_batch, carry, first_index + j, num_microbatches)
      return totals, jax.tree.map(lambda c, new: c.at[j].set(new), stacked_carries, carry)

    totals, stacked_carries = jax.lax.fori_loop(0, count, body, (totals, stacked_carries))
    return totals, tuple(jax.tree.map(lambda c: c[i], stacked_carries) for i in range(slots))

  return accumulate


def make_apply_step(optimizer: optax.GradientTransformation, micro_batch_size: int, discard_fraction: float = 0.0
                    ) -> Callable[..., tuple[TrainState, dict[str, jax.Array], Accumulator]]:
  """Returns `apply(state, totals, num_microbatches, learning_rate) -> (state, metrics, zeros)`.

  The second half of the any-batch step: with k = `num_microbatches` a traced int32 scalar, the
  update of the true batch of k * `micro_batch_size` examples,

    g = (1/k) sum_j g_j,   BN statistics = (1/k) sum_j s_j,   loss = (1/k) sum_j L_j,

  exactly as `make_train_step` accumulates them, then the optimizer update with the same finite-value
  guard. The gradient noise-scale ingredients (McCandlish et al. 2018, appendix A.1) come from the
  two batch sizes B_small = micro-batch and B_big = k micro-batches, counting the examples
  `discard_fraction` keeps (nan when k = 1: one batch size gives no estimate). `zeros` is a zeroed
  accumulator for the next update (the donated `totals` buffers reused).
  """

  def apply(state: TrainState, totals: Accumulator, num_microbatches: jax.Array, learning_rate: jax.Array):
    count = num_microbatches.astype(jnp.float32)
    loss, metrics, model_state, grads, micro_norm_sq = jax.tree.map(lambda t: t / count, totals)
    micro_batch_kept = diagnostics.kept_examples(micro_batch_size, discard_fraction)
    estimate = diagnostics.noise_scale_estimates(
        micro_norm_sq, optax.tree.norm(grads, squared=True), jnp.int32(micro_batch_kept),
        num_microbatches * micro_batch_kept)
    defined = num_microbatches > 1
    metrics = dict(metrics,
                   noise_scale_grad_norm_sq=jnp.where(defined, estimate.grad_norm_sq, jnp.nan),
                   noise_scale_trace_sigma=jnp.where(defined, estimate.trace_sigma, jnp.nan))
    state, metrics = _apply_gradients(optimizer, state, loss, metrics, model_state, state.carry, grads,
                                      state.compression_state, learning_rate)
    return state, metrics, jax.tree.map(jnp.zeros_like, totals)

  return apply


def make_eval_step(graphdef: nnx.GraphDef, task: Task):
  """Returns `eval_step(params, model_state, batch, carry) -> (sums, carry)` (not yet jitted)."""

  def eval_step(params, model_state, batch, carry):
    model = nnx.merge(graphdef, params, model_state)
    return task.eval_sums(model, batch, carry)

  return eval_step
