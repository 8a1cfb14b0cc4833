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
from jax.sharding import Mesh, PartitionSpec as P

STAGE_AXIS = "stage"

LayerFn = Callable[[Any, jax.Array], jax.Array]


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


def gpipe_stage(layer_fn: LayerFn, stage_params: Any, inputs: jax.Array, num_microbatches: int,
                axis_name: str = STAGE_AXIS, batch_axes: tuple[str, ...] = (), remat: bool = False
                ) -> tuple[jax.Array, jax.Array]:
  """One stage's part of the GPipe forward pass; call inside `shard_map` over `axis_name`.

  Args:
    layer_fn: `layer_fn(w, h) -> h'` for one layer, shape-preserving.
    stage_params: this stage's layers, stacked on a leading axis.
    inputs: [b, ...] the (local) batch; only stage 0 reads it.
    num_microbatches: M, dividing b.
    axis_name: the pipeline axis.
    batch_axes: the data-parallel axes `inputs` is split over (none if it is replicated).
    remat: recompute this stage's activations in the backward pass.

  Returns:
    (outputs [b, ...], valid on the last stage; active [M+S-1] bool of this stage).
  """
  num_stages = jax.lax.axis_size(axis_name)
  stage = jax.lax.axis_index(axis_name)
  micro = inputs.reshape(num_microbatches, inputs.shape[0] // num_microbatches, *inputs.shape[1:])
  apply_stage = lambda h: sequential(layer_fn, stage_params, h)
  if remat:
    apply_stage = jax.checkpoint(apply_stage)
  shift = [(s, s + 1) for s in range(num_stages - 1)]  # stage 0 receives zeros, which it ignores

  def tick(carry, t):
    received, received_valid = carry
    first = stage == 0
    h = jnp.where(first, micro[jnp.minimum(t, num_microbatches - 1)], received)
    valid = jnp.where(first, t < num_microbatches, received_valid)
    out = apply_stage(h)
    sent, sent_valid = jax.lax.ppermute((out, valid), axis_name, shift)
    return (sent, sent_valid), (out, valid)

  # The scan carry must have the type the ppermutes give it: varying over the stage and batch axes.
  start = jax.lax.pcast((jnp.zeros(micro.shape[1:], micro.dtype), jnp.array(False)), (axis_name, *batch_axes),
                        to="varying")
  num_ticks = num_microbatches + num_stages - 1
  _, (outs, active) = jax.lax.scan(tick, start, jnp.arange(num_ticks))
  outputs = outs[num_stages - 1:]  # on the last stage: micro-batches 0 .. M-1 in order
  return outputs.reshape(inputs.shape), active


def pipeline(layer_fn: LayerFn, mesh: Mesh, num_microbatches: int, *, stage_axis: str = STAGE_AXIS,
             batch_axis: str | tuple[str, ...] | None = None, remat: bool = False
             ) -> Callable[[Any, jax.Array], PipelineOutput]:
  """GPipe over `mesh`: `apply(params, x) -> PipelineOutput` for L stacked layers and a batch x.

  `params` is a pytree whose leaves have the layer axis first (L, divisible by the `stage_axis`
  size S); it is split into S stages of L/S layers. `x` is [B, ...]; with `batch_axis` it is also
  split over that data-parallel axis (B divisible by its size times M), without it it is replicated.
  Differentiate `apply` with `jax.grad` for the pipelined backward pass.

  Raises:
    ValueError: before compute, if the mesh lacks an axis, L is not divisible by S, or the batch is
      not divisible into M micro-batches per data shard.

  References:
    Huang, Y., Cheng, Y., Bapna, A., Firat, O., Chen, M. X., Chen, D., Lee, H., Ngiam, J., Le, Q. V.,
      Wu, Y., and Chen, Z. GPipe: Efficient Training of Giant Neural Networks using Pipeline
      Parallelism. NeurIPS 2019. arXiv:1811.06965. (§2.2 the micro-batch schedule and
      re-materialization; §2.3 the bubble overhead O((K-1)/(M+K-1)).)
    Vojnovic, M. Scaling up distributed machine learning. ST446 Distributed Computing for Big Data,
      Lecture 9, London School of Economics, 2021 (papers/004, "Loss factor" and "Loss factor with
      pipelining").
  """
  if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
    raise ValueError(f"pipeline: num_microbatches (M) must be an int >= 1, got {num_microbatches!r}.")
  batch_axes = (batch_axis,) if isinstance(batch_axis, str) else tuple(batch_axis or ())
  for axis in (stage_axis, *batch_axes):
    if axis not in mesh.shape:
      raise ValueError(f"pipeline: the mesh has axes {tuple(mesh.shape)} but not {axis!r}; build it with a "
                       f"{axis!r} axis, e.g. jax.make_mesh((2, 4), ('data', 'stage')).")
  num_stages = mesh.shape[stage_axis]
  data_shards = 1
  for axis in batch_axes:
    data_shards *= mesh.shape[axis]
  batch_spec = P(batch_axis) if batch_axes else P()

  def run_stage(stage_params, x):
    outputs, active = gpipe_stage(layer_fn, stage_params, x, num_microbatches, stage_axis, batch_axes, remat)
    return outputs[None], active[None, None]

  out_spec = P(stage_axis, batch_axis) if batch_axes else P(stage_axis)
  stage = jax.shard_map(run_stage, mesh=mesh, in_specs=(P(stage_axis), batch_spec),
                        out_specs=(out_spec, P(stage_axis, batch_axis) if batch_axes else P(stage_axis)))

  def apply(params: Any, x: jax.Array) -> PipelineOutput:
    num_layers = {jnp.shape(leaf)[0] for leaf in jax.tree.leaves(params)}
    if len(num_layers) != 1 or next(iter(num_layers)) % num_stages:
      raise ValueError(f"pipeline: every parameter leaf must stack the L layers on its first axis, with L "
                       f"divisible by the {num_stages} stages; got leading sizes {sorted(num_layers)}.")
    if x.shape[0] % (data_shards * num_microbatches):
      raise ValueError(f"pipeline: the batch of {x.shape[0]} does not split into {data_shards} data shard(s) of "
                       f"num_microbatches={num_microbatches} equal micro-batches; use a multiple of "
                       f"{data_shards * num_microbatches}.")
    per_stage, active = stage(params, x)
    return PipelineOutput(per_stage[-1], active[:, 0])

  return apply
