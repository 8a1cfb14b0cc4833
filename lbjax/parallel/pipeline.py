r"""GPipe pipeline parallelism (Huang et al. 2019) with `jax.shard_map` and `jax.lax.ppermute`.

A stack of L identical layers h <- f(w_l, h), l = 1..L, is split into S stages of L/S consecutive
layers over the mesh axis `stage` (stage s holds layers sL/S+1 .. (s+1)L/S). A batch is split into
M micro-batches. Time advances in ticks t = 0 .. M+S-2: at tick t stage s applies its layers to
micro-batch t - s (if 0 <= t - s < M), then `ppermute` passes the result to stage s+1. Stage 0
reads micro-batch t from the input; the last stage's output at tick t is micro-batch t - (S-1).

The backward pass is the transpose of the same program: reverse-mode differentiation turns the
tick loop into a reversed loop and each `ppermute` s -> s+1 into s+1 -> s, so the micro-batches'
gradients flow back through the stages in the same pipelined schedule (GPipe's all-forward then
all-backward). Gradients are sums over micro-batches of the per-micro-batch gradients, hence equal
to the unpipelined model's. With `remat=True` each stage's activations are recomputed in the
backward pass (GPipe's re-materialization): memory per stage O(B + (L/S) B/M) instead of O((L/S) B).

Layers may carry a per-example state (`pipeline_with_state`: an LSTM layer's recurrent carry across
batches, a dropout mask): stage s keeps its layers' states and, at the tick it holds micro-batch m,
reads and updates the rows of micro-batch m, so the states leave the step as the unpipelined stack
leaves them. `stack_runner` is that pipeline in the form a model's `run_stack` argument takes
(`lbjax.models.PtbLSTM`; the trainer's `mesh.stage`).

Each stage is busy M of the M+S-1 ticks of each pass, so the idle fraction (the bubble) is

  (S - 1) / (M + S - 1)                                   (GPipe, Huang et al. 2019, §2.3)

papers/004 ("Loss factor with pipelining") counts idle time slots for k devices and m
micro-batches as 2(b/m)(1 + ... + (k-1)) / (2(b + (k-1) b/m) k) = ½ (1 - m/(k-1+m)), which is
½ (k-1)/(m+k-1): its numerator counts one triangle of idle slots per pass (the fill), while each
stage also idles k-1 slots while the pipeline drains, so the measured fraction is twice the
lecture's value and equals GPipe's.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, Mesh, PartitionSpec as P

STAGE_AXIS = "stage"

LayerFn = Callable[[Any, jax.Array], jax.Array]
StatefulLayerFn = Callable[[Any, Any, jax.Array], tuple[Any, jax.Array]]


class PipelineOutput(NamedTuple):
  """What a pipelined forward pass returns.

  Attributes:
    outputs: [B, ...] the last stage's outputs, micro-batches back in batch order.
    active: [S, M+S-1] bool: whether stage s held a real micro-batch at tick t, carried with the
      activations through the ppermutes (so it is the executed schedule, not a formula).
  """

  outputs: jax.Array
  active: jax.Array


def sequential(layer_fn: LayerFn, params: Any, x: jax.Array) -> jax.Array:
  """The unpipelined reference: the L stacked layers of `params` applied in order with `lax.scan`."""
  return jax.lax.scan(lambda h, w: (layer_fn(w, h), None), x, params)[0]


def gpipe_stage(layer_fn: StatefulLayerFn, stage_params: Any, stage_states: Any, inputs: jax.Array,
                num_microbatches: int, axis_name: str = STAGE_AXIS, batch_axes: tuple[str, ...] = (),
                remat: bool = False) -> tuple[jax.Array, jax.Array, Any]:
  """One stage's part of the GPipe forward pass; call inside `shard_map` over `axis_name`.

  Args:
    layer_fn: `layer_fn(w, state, h) -> (state', h')` for one layer, shape-preserving in h.
    stage_params: this stage's layers, stacked on a leading axis.
    stage_states: this stage's layers' per-example states (or `()`), see below.
    inputs: [b, ...] the (local) batch; only stage 0 reads it.
    num_microbatches: M, dividing b.
    axis_name: the pipeline axis.
    batch_axes: the data-parallel axes `inputs` is split over (none if it is replicated).
    remat: recompute this stage's activations in the backward pass.

  A layer may hold a per-example state (an LSTM layer's recurrent carry, a dropout mask):
  `stage_states` stacks this stage's layers' states on a leading axis, each leaf [L/S, b, ...] with the
  (local) batch second. At tick t the stage reads the rows of micro-batch t - s from them and, when it
  holds a real micro-batch, writes them back, so each layer's state advances exactly once per example,
  as in the unpipelined stack.

  Returns:
    (outputs [b, ...] valid on the last stage; active [M+S-1]; the new `stage_states`).
  """
  num_stages = jax.lax.axis_size(axis_name)
  stage = jax.lax.axis_index(axis_name)
  rows = inputs.shape[0] // num_microbatches
  if batch_axes:
    # The parameters are the same on every data shard. Used as such inside the loops, their gradient
    # would be all-reduced over the data axes inside them, once per tick and time step; cast to
    # per-shard values here, it is all-reduced once, where this cast is transposed.
    stage_params = jax.lax.pcast(stage_params, batch_axes, to="varying")
  micro = inputs.reshape(num_microbatches, rows, *inputs.shape[1:])

  def apply_stage(h, states):
    def one_layer(h, layer):
      w, state = layer
      state, h = layer_fn(w, state, h)
      return h, state
    return jax.lax.scan(one_layer, h, (stage_params, states))

  if remat:
    apply_stage = jax.checkpoint(apply_stage)
  shift = [(s, s + 1) for s in range(num_stages - 1)]  # stage 0 receives zeros, which it ignores

  def tick(carry, t):
    (received, received_valid), states = carry
    first = stage == 0
    h = jnp.where(first, micro[jnp.minimum(t, num_microbatches - 1)], received)
    valid = jnp.where(first, t < num_microbatches, received_valid)
    start = jnp.clip(t - stage, 0, num_microbatches - 1) * rows
    local = jax.tree.map(lambda s: jax.lax.dynamic_slice_in_dim(s, start, rows, axis=1), states)
    # A tick without a micro-batch (the fill and drain bubbles) skips the layers: their placeholder input would
    # be differentiated too, and 0 * nan is nan where a layer's derivative is undefined there (e.g. a norm of 0).
    out, new_local = jax.lax.cond(valid, apply_stage, lambda h, states: (h, states), h, local)
    states = jax.tree.map(lambda s, new: jax.lax.dynamic_update_slice_in_dim(s, new, start, axis=1), states, new_local)
    sent, sent_valid = jax.lax.ppermute((out, valid), axis_name, shift)
    return ((sent, sent_valid), states), (out, valid)

  # The scan carry must have the type the ppermutes give it: varying over the stage and batch axes.
  start = jax.lax.pcast((jnp.zeros(micro.shape[1:], micro.dtype), jnp.array(False)), (axis_name, *batch_axes),
                        to="varying")
  num_ticks = num_microbatches + num_stages - 1
  (_, states), (outs, active) = jax.lax.scan(tick, (start, stage_states), jnp.arange(num_ticks))
  outputs = outs[num_stages - 1:]  # on the last stage: micro-batches 0 .. M-1 in order
  return outputs.reshape(inputs.shape), active, states


def pipeline(layer_fn: LayerFn, mesh: Mesh, num_microbatches: int, *, stage_axis: str = STAGE_AXIS,
             batch_axis: str | tuple[str, ...] | None = None, remat: bool = False
             ) -> Callable[[Any, jax.Array], PipelineOutput]:
  """GPipe over `mesh`: `apply(params, x) -> PipelineOutput` for L stacked layers and a batch x.

  `params` is a pytree whose leaves have the layer axis first (L, divisible by the `stage_axis`
  size S); it is split into S stages of L/S layers. `x` is [B, ...]; with `batch_axis` it is also
  split over that data-parallel axis (B divisible by its size times M), without it it is replicated.
  Differentiate `apply` with `jax.grad` for the pipelined backward pass.

  Raises:
    ValueError: before compute, if `layer_fn` is not a function, `mesh` not a mesh or it lacks an axis, M is
      not an int >= 1, `remat` not a bool, `x` not a batch, L is not divisible by S, or the batch is not
      divisible into M micro-batches per data shard.

  References:
    Huang, Y., Cheng, Y., Bapna, A., Firat, O., Chen, M. X., Chen, D., Lee, H., Ngiam, J., Le, Q. V.,
      Wu, Y., and Chen, Z. GPipe: Efficient Training of Giant Neural Networks using Pipeline
      Parallelism. NeurIPS 2019. arXiv:1811.06965. (§2.2 the micro-batch schedule and
      re-materialization; §2.3 the bubble overhead O((K-1)/(M+K-1)).)
    Vojnovic, M. Scaling up distributed machine learning. ST446 Distributed Computing for Big Data,
      Lecture 9, London School of Economics, 2021 (papers/004, "Loss factor" and "Loss factor with
      pipelining").
  """
  _check_layer_fn(layer_fn)
  apply = pipeline_with_state(lambda w, state, h: (state, layer_fn(w, h)), mesh, num_microbatches,
                              stage_axis=stage_axis, batch_axis=batch_axis, remat=remat)
  return lambda params, x: apply(params, (), x)[0]


def pipeline_with_state(layer_fn: StatefulLayerFn, mesh: Mesh, num_microbatches: int, *,
                        stage_axis: str = STAGE_AXIS, batch_axis: str | tuple[str, ...] | None = None,
                        remat: bool = False) -> Callable[[Any, Any, jax.Array], tuple[PipelineOutput, Any]]:
  """`pipeline` for layers with a per-example state: `apply(params, states, x) -> (PipelineOutput, states)`.

  `layer_fn(w, state, h) -> (state', h')`; every leaf of `states` is [L, B, ...] (layer, then batch),
  split over the stages like `params` and over `batch_axis` like `x`. Stage s updates the states of
  its layers for each micro-batch it holds (`gpipe_stage`), so the returned states are
  those the unpipelined stack leaves. The states are not differentiated (an LSTM's incoming carry is
  a constant of the step; truncated back-propagation through time).

  Raises:
    ValueError: as `pipeline`.
  """
  _check_layer_fn(layer_fn)
  batch_axes = _checked_batch_axes(mesh, num_microbatches, stage_axis, batch_axis, remat)
  num_stages = mesh.shape[stage_axis]
  data_shards = 1
  for axis in batch_axes:
    data_shards *= mesh.shape[axis]
  batch_spec = P(batch_axis) if batch_axes else P()
  per_stage_spec = P(stage_axis, batch_axis) if batch_axes else P(stage_axis)

  def run_stage(stage_params, stage_states, x):
    outputs, active, stage_states = gpipe_stage(layer_fn, stage_params, stage_states, x, num_microbatches,
                                                           stage_axis, batch_axes, remat)
    return outputs[None], active[None, None], stage_states

  stage = jax.shard_map(run_stage, mesh=mesh, in_specs=(P(stage_axis), per_stage_spec, batch_spec),
                        out_specs=(per_stage_spec, per_stage_spec, per_stage_spec))

  def apply(params: Any, states: Any, x: jax.Array) -> tuple[PipelineOutput, Any]:
    if jnp.ndim(x) < 1:
      raise ValueError(f"pipeline: x must be a batch [B, ...], got shape {jnp.shape(x)}.")
    num_layers = {jnp.shape(leaf)[0] for leaf in jax.tree.leaves(params)}
    if len(num_layers) != 1 or next(iter(num_layers)) % num_stages:
      raise ValueError(f"pipeline: every parameter leaf must stack the L layers on its first axis, with L "
                       f"divisible by the {num_stages} stages; got leading sizes {sorted(num_layers)}.")
    if x.shape[0] % (data_shards * num_microbatches):
      raise ValueError(f"pipeline: the batch of {x.shape[0]} does not split into {data_shards} data shard(s) of "
                       f"num_microbatches={num_microbatches} equal micro-batches; use a multiple of "
                       f"{data_shards * num_microbatches}.")
    per_stage, active, states = stage(params, states, x)
    return PipelineOutput(per_stage[-1], active[:, 0]), states

  return apply


def _check_layer_fn(layer_fn: Any) -> None:
  if not callable(layer_fn):
    raise ValueError(f"pipeline: layer_fn must be a function of (w, h) (with a state: (w, state, h)), got "
                     f"{layer_fn!r}.")


def _checked_batch_axes(mesh: Any, num_microbatches: Any, stage_axis: str, batch_axis: Any, remat: Any
                        ) -> tuple[str, ...]:
  """The data-parallel axes of `batch_axis`, after checking the pipeline's arguments (`ValueError`s naming the
  fix)."""
  if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
    raise ValueError(f"pipeline: num_microbatches (M) must be an int >= 1, got {num_microbatches!r}.")
  if not isinstance(mesh, (Mesh, AbstractMesh)):
    raise ValueError(f"pipeline: mesh must be a jax.sharding.Mesh, e.g. jax.make_mesh((2, 4), ('data', 'stage')); "
                     f"got {mesh!r}.")
  if not isinstance(remat, bool):
    raise ValueError(f"pipeline: remat must be True or False, got {remat!r}.")
  batch_axes = (batch_axis,) if isinstance(batch_axis, str) else tuple(batch_axis or ())
  for axis in (stage_axis, *batch_axes):
    if axis not in mesh.shape:
      raise ValueError(f"pipeline: the mesh has axes {tuple(mesh.shape)} but not {axis!r}; build it with a "
                       f"{axis!r} axis, e.g. jax.make_mesh((2, 4), ('data', 'stage')).")
  return batch_axes


def stack_runner(mesh: Mesh, num_microbatches: int, *, stage_axis: str = STAGE_AXIS,
                 batch_axis: str | tuple[str, ...] | None = None, remat: bool = False
                 ) -> Callable[[StatefulLayerFn, Any, Any, jax.Array], tuple[Any, jax.Array]]:
  """`run(layer_fn, params, states, x) -> (states, outputs)`: `pipeline_with_state` for a model that
  hands its stack of layers to a runner (e.g. `lbjax.models.PtbLSTM`'s `run_stack`). Raises `ValueError` as
  `pipeline`, when built."""
  _checked_batch_axes(mesh, num_microbatches, stage_axis, batch_axis, remat)

  def run(layer_fn, params, states, x):
    output, states = pipeline_with_state(layer_fn, mesh, num_microbatches, stage_axis=stage_axis,
                                         batch_axis=batch_axis, remat=remat)(params, states, x)
    return states, output.outputs

  return run
