"""The fused layout: a LARS-family update over every leaf in two Pallas kernels on NVIDIA GPUs.

On a GPU an optimizer update is launch-bound (`multi_tensor`). The flat layout brings LARS on the
ResNet-50 tree from 324 kernels to 32, but no further within XLA: the flat buffers are concatenations
(4 kernels) and the leaves are written back by one kernel per group of equally shaped leaves (22 on
ResNet-50), since XLA:GPU fuses sibling loops only when their outputs have the same shape
(benchmarks/README.md, Findings 11). A kernel written for the job has no such limit: like apex's
`multi_tensor_apply`, each program of a Pallas kernel takes one chunk of `CHUNK` values of one leaf,
whichever leaf it is, so one launch covers the whole tree:

1. `chunk_sums`: every program reduces its chunk of `w` and `g` to the rate's sums (LARS: `|w|^2` and
   `|g|^2`); a `segment_sum` of the chunk sums by layer and the rate's formula give every layer's rate
   as one vector (a few small XLA kernels; one `psum` across devices with `axis_name`).
2. `momentum_step`: every program reads its chunk of `w`, `g` and the momentum `v` and writes the
   update and the new momentum (papers/000 Algorithm 1):

       u = rate^l * (g + beta * w)   (selected layers; u = g elsewhere)
       v' = m * v - gamma_t * u,     returns v'   (Nesterov: m * v' - gamma_t * u)

   with the arithmetic, dtypes and rounding of `layerwise.layerwise_sgd` (the per-leaf layout), whose
   state this layout keeps: the same `LayerwiseRateState`, learning-rate count and per-leaf momentum,
   so a checkpoint moves between layouts and `trust_ratios` reads it.

The kernels run on CUDA only (`lax.platform_dependent`); on every other platform the same update runs
in the per-leaf layout, so a config with `layout="fused"` trains anywhere and differs only by the order
of summation of the norms. Like the flat layout, the kernels see whole arrays: with parameters sharded
under `jit` the partitioner would gather them; use it with replicated parameters or inside
`shard_map`/`pmap` with `axis_name`. Leaves must be real floating point of at most 32 bits (Triton has
no complex type); float64 and complex trees need the per-leaf layout. The kernels are written for
Pallas's Triton backend, which JAX has deprecated in favour of Mosaic GPU (Hopper and newer only); it
is what JAX 0.10 to 0.12 compile for every NVIDIA GPU.

References:
  NVIDIA apex, `multi_tensor_apply` (csrc/multi_tensor_apply.cuh) and `multi_tensor_lamb.cu`: every
    tensor's chunks in one launch.
  You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
    arXiv:1708.03888, 2017. (papers/000: eq. 4-6, Algorithm 1.)
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from lbjax.optim import layerwise

CHUNK = 4096  # values per program: ResNet-50's 25.6M parameters are 6,300 programs
_KERNEL_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class LeafChunks:
  """The programs that cover one leaf (of `layers` layers of `layer_size` values each, each layer cut
  into chunks of `CHUNK`): ids `first` to `first + count - 1`."""

  first: int
  layers: int
  layer_size: int

  @property
  def per_layer(self) -> int:
    return -(-self.layer_size // CHUNK)

  @property
  def count(self) -> int:
    return self.layers * self.per_layer


def chunks(sizes: list[tuple[int, int] | None]) -> tuple[list[LeafChunks | None], int]:
  """Each leaf's programs, for leaves of `(layers, layer_size)` (None: not in the kernel), and their
  total."""
  places, first = [], 0
  for size in sizes:
    if size is None:
      places.append(None)
      continue
    place = LeafChunks(first, *size)
    places.append(place)
    first += place.count
  return places, first


def _for_my_chunk(places: list[LeafChunks | None], body: Callable[[Any, int, Any, Any, Any], None]) -> None:
  """Inside a kernel: `body(program, leaf, layer, start, valid)` for the chunk of the program that runs
  it: `start` is the chunk's first value in the flattened leaf, `valid` which of its `CHUNK` values lie
  in the layer. (The program id is read here, outside the branches: Pallas's interpreter substitutes
  it only there.)"""
  program = pl.program_id(0)
  for leaf, place in enumerate(places):
    if place is None:
      continue

    @pl.when((program >= place.first) & (program < place.first + place.count))
    def _():
      local = program - place.first
      layer, offset = local // place.per_layer, (local % place.per_layer) * CHUNK
      valid = offset + jnp.arange(CHUNK) < place.layer_size
      body(program, leaf, layer, layer * place.layer_size + offset, valid)


def _load(ref: Any, start: Any, valid: Any) -> jax.Array:
  return plgpu.load(ref.at[pl.ds(start, CHUNK)], mask=valid, other=0)


def _store(ref: Any, start: Any, value: jax.Array, valid: Any) -> None:
  plgpu.store(ref.at[pl.ds(start, CHUNK)], value.astype(ref.dtype), mask=valid)


class _Scalars:
  """Hyper-parameters a kernel reads: Python numbers stay constants of the kernel (weakly typed, as in
  the per-leaf code); arrays (`inject_hyperparams`, schedules) become inputs of shape (1,)."""

  def __init__(self, **values: Any):
    self.constants = {k: v for k, v in values.items() if isinstance(v, (int, float))}
    self.names = [k for k in values if k not in self.constants]
    self.arrays = [jnp.reshape(values[k], (1,)) for k in self.names]

  def read(self, refs: list[Any]) -> dict[str, Any]:
    return dict(self.constants, **{k: plgpu.load(ref) for k, ref in zip(self.names, refs)})


def _output_like(x: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
  """An output of `shape` and `dtype` that varies over the manual mesh axes as `x` does (inside
  `shard_map`, where Pallas needs to be told; JAX's avals call it `mat`, the manual axis type)."""
  return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=getattr(jax.typeof(x), "mat", None))


def _call(kernel: Callable, out_shapes: list[jax.ShapeDtypeStruct], programs: int, interpret: bool,
          inputs: list[jax.Array], aliases: dict[int, int] | None = None) -> list[jax.Array]:
  """`kernel` on `programs` programs; `aliases`: input -> output written in its place (a donated input
  is then updated in place; XLA copies one that is not donated)."""
  return pl.pallas_call(
      kernel, out_shape=out_shapes, grid=(programs,), interpret=interpret, input_output_aliases=aliases or {},
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
  )(*inputs)


class _ChunkReducer:
  """A `SummedRate`'s reducer over one chunk (zeros outside the layer add nothing)."""

  def sum(self, x: jax.Array) -> jax.Array:
    return jnp.sum(x, dtype=jnp.promote_types(x.dtype, jnp.float32))

  def sum_of_squares(self, x: jax.Array) -> jax.Array:
    return self.sum(layerwise.squared_magnitude(x))


def chunk_sums(rate: layerwise.SummedRate, weight_decay: Any, ws: list[jax.Array | None],
               gs: list[jax.Array | None], places: list[LeafChunks | None], programs: int,
               interpret: bool) -> list[jax.Array]:
  """Kernel 1: each program's sums of `rate.sums` over its chunk, one float32 vector per sum (a
  program's entry at its id). `ws`, `gs`: the flattened leaves (None where `places` is)."""
  leaves = [i for i, place in enumerate(places) if place is not None]
  scalars = _Scalars(weight_decay=weight_decay)
  probe = jnp.zeros((CHUNK,), jnp.float32)
  count = len(jax.eval_shape(lambda: rate.sums(probe, probe, weight_decay, _ChunkReducer())))

  def kernel(*refs):
    w_refs, g_refs = refs[:len(leaves)], refs[len(leaves):2 * len(leaves)]
    scalar_refs, out_refs = refs[2 * len(leaves):-count], refs[-count:]
    values = scalars.read(list(scalar_refs))
    by_leaf = dict(zip(leaves, zip(w_refs, g_refs)))

    def body(program, leaf, layer, start, valid):
      del layer
      w_ref, g_ref = by_leaf[leaf]
      sums = rate.sums(_load(w_ref, start, valid), _load(g_ref, start, valid), values["weight_decay"],
                       _ChunkReducer())
      for ref, value in zip(out_refs, sums):
        plgpu.store(ref.at[pl.ds(program, 1)], jnp.reshape(value, (1,)).astype(jnp.float32))

    _for_my_chunk(places, body)

  shapes = [_output_like(gs[leaves[0]], (programs,), jnp.float32)] * count
  return _call(kernel, shapes, programs, interpret,
               [ws[i] for i in leaves] + [gs[i] for i in leaves] + scalars.arrays)


def momentum_step(ws, gs, vs, rates, slots, places, programs, hyper: dict[str, Any], skip_decay: bool,
                  nesterov: bool, out_dtypes: list[tuple[Any, Any]], interpret: bool) -> list[jax.Array]:
  """Kernel 2: each program's chunk of the update and the new momentum, as `layerwise.layerwise_sgd`
  computes them (module doc). `slots`: each leaf's first entry in `rates`, None if unselected;
  `hyper`: `weight_decay`, `momentum` and `step_<dtype>` (the learning-rate factor in each update dtype,
  `-gamma_t` rounded as optax rounds it); `out_dtypes`: each leaf's (update, momentum) dtypes. Returns
  the updates and momenta of the leaves in `places`, in order."""
  leaves = [i for i, place in enumerate(places) if place is not None]
  scalars = _Scalars(**hyper)
  n = len(leaves)

  def kernel(*refs):
    w_refs, g_refs, v_refs = refs[:n], refs[n:2 * n], refs[2 * n:3 * n]
    rates_ref, scalar_refs = refs[3 * n], refs[3 * n + 1:3 * n + 1 + len(scalars.arrays)]
    u_refs, new_v_refs = refs[-2 * n:-n], refs[-n:]
    values = scalars.read(list(scalar_refs))
    position = {leaf: j for j, leaf in enumerate(leaves)}

    def body(program, leaf, layer, start, valid):
      del program
      j = position[leaf]
      g = _load(g_refs[j], start, valid)
      update = g
      if slots[leaf] is not None:
        scale = plgpu.load(rates_ref.at[pl.ds(slots[leaf] + layer, 1)])
        update = scale * g
        if not skip_decay:
          update = update + (scale * values["weight_decay"]) * _load(w_refs[j], start, valid)
        update = update.astype(g.dtype)
      update = values[f"step_{jnp.dtype(g.dtype).name}"] * update
      v = _load(v_refs[j], start, valid)
      wide = jnp.result_type(update, v)
      stored = (update + values["momentum"] * v.astype(wide)).astype(v.dtype)
      new_v = stored.astype(wide)
      _store(u_refs[j], start, update + values["momentum"] * new_v if nesterov else new_v, valid)
      _store(new_v_refs[j], start, stored, valid)

    _for_my_chunk(places, body)

  shapes = ([_output_like(gs[i], gs[i].shape, out_dtypes[i][0]) for i in leaves]
            + [_output_like(gs[i], gs[i].shape, out_dtypes[i][1]) for i in leaves])
  # Each new momentum in its old one's place (same dtype: the momentum is stored as it was).
  return _call(kernel, shapes, programs, interpret,
               [ws[i] for i in leaves] + [gs[i] for i in leaves] + [vs[i] for i in leaves] + [rates]
               + scalars.arrays, {2 * n + j: n + j for j in range(n)})


def _check_dtypes(leaves: list[Any]) -> None:
  for x in leaves:
    if not isinstance(x, optax.MaskedNode) and jnp.dtype(x.dtype).name not in _KERNEL_DTYPES:
      raise ValueError(f"layout='fused' runs on leaves of {', '.join(_KERNEL_DTYPES)}, got a {x.dtype} leaf of "
                       f"shape {x.shape}: use layout='per_leaf' for this tree.")


def layerwise_sgd(
    rate: layerwise.SummedRate,
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any,
    nesterov: bool,
    accumulator_dtype: Any,
    weight_decay: Any,
    mask: layerwise.MaskOrFn,
    stacked: layerwise.StackedOrFn,
    axis_name: layerwise.AxisName,
    interpret: bool = False,
) -> optax.GradientTransformation:
  """`layerwise.layerwise_sgd(layerwise.scale_by_layerwise_rate(rate, ...), ...)` in the fused layout.

      u^l = rate^l * (g^l + beta * w^l),   v_{t+1} = m * v_t + gamma_t * u,   w_{t+1} = w_t - v_{t+1}

  (papers/000 Algorithm 1 with `rate = lars_rate`), each pass over all leaves one Pallas kernel on a
  CUDA GPU (module doc); the per-leaf layout's update on other platforms. Same state as the per-leaf
  layout.

  Args:
    rate: a `layerwise.SummedRate` (LARS, PercentDelta).
    learning_rate, momentum, nesterov, accumulator_dtype: as `layerwise.layerwise_sgd`.
    weight_decay, mask, stacked, axis_name: as `layerwise.scale_by_layerwise_rate`.
    interpret: run the kernels in Pallas's interpreter on any platform (tests, debugging).

  Returns:
    An `optax.GradientTransformation`.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000: eq. 4-6, Algorithm 1.)
    NVIDIA apex, `multi_tensor_apply` (csrc/multi_tensor_apply.cuh).
  """
  if not isinstance(rate, layerwise.SummedRate):
    raise ValueError(f"the fused layout needs a statistic made of per-layer sums (a layerwise.SummedRate), "
                     f"got {rate!r}: build it with layout='per_leaf'.")
  reference = layerwise.layerwise_sgd(
      layerwise.scale_by_layerwise_rate(rate, weight_decay=weight_decay, mask=mask, stacked=stacked,
                                        axis_name=axis_name),
      learning_rate, momentum, nesterov, accumulator_dtype)
  scale_by_learning_rate = optax.scale_by_learning_rate(learning_rate)
  skip_decay = isinstance(weight_decay, (int, float)) and weight_decay == 0

  def fused_update(updates, state, params):
    rate_state, learning_rate_state, trace_state = state
    treedef, selected, ks = layerwise.selection(params, mask, stacked)
    ws, gs = treedef.flatten_up_to(params), treedef.flatten_up_to(updates)
    vs = treedef.flatten_up_to(trace_state.trace)
    _check_dtypes(ws + gs)
    rates_layout = rate_state.rates.layout
    out_updates, out_state = jax.eval_shape(reference.update, updates, state, params)
    out_dtypes = list(zip([u.dtype for u in treedef.flatten_up_to(out_updates)],
                          [v.dtype for v in treedef.flatten_up_to(out_state[2].trace)]))
    kept = [not isinstance(g, optax.MaskedNode) and g.size > 0 for g in gs]  # what the kernels touch
    flat = [g.reshape(-1) if keep else None for g, keep in zip(gs, kept)]
    flat_w = [w.reshape(-1) if keep else None for w, keep in zip(ws, kept)]
    flat_v = [v.reshape(-1) if keep else None for v, keep in zip(vs, kept)]
    sizes = [(math.prod(g.shape[:k]), math.prod(g.shape[k:])) if keep else None for g, k, keep in zip(gs, ks, kept)]

    slots = [None if slot is None else slot[1] for slot in rates_layout.slots]
    if any(s is not None for s in slots):
      places, programs = chunks([size if slot is not None else None for size, slot in zip(sizes, slots)])
      chunk_vectors = chunk_sums(rate, weight_decay, flat_w, flat, places, programs, interpret)
      layer_ids = np.concatenate([np.repeat(np.arange(place.layers) + slot, place.per_layer)
                                  for place, slot in zip(places, slots) if place is not None])
      size = rates_layout.sizes()[0]
      layer_sums = jnp.stack([jax.ops.segment_sum(c, layer_ids, size) for c in chunk_vectors])
      rates = rate.global_rates(layer_sums.astype(rates_layout.dtypes[0]), weight_decay, axis_name)
      vectors = (rates.astype(rates_layout.dtypes[0]),)
    else:
      rates, vectors = jnp.zeros((1,), jnp.float32), ()

    steps = {}
    for dtype in {jnp.dtype(g.dtype).name for g, keep in zip(gs, kept) if keep}:
      steps[f"step_{dtype}"], new_learning_rate_state = scale_by_learning_rate.update(
          jnp.ones((), dtype), learning_rate_state)
    if not steps:
      new_learning_rate_state = scale_by_learning_rate.update(jnp.ones(()), learning_rate_state)[1]
    places, programs = chunks(sizes)
    results = momentum_step(flat_w, flat, flat_v, rates, slots, places, programs,
                            dict(steps, weight_decay=weight_decay, momentum=momentum), skip_decay, nesterov,
                            out_dtypes, interpret)
    new_u, new_v = iter(results[:len(results) // 2]), iter(results[len(results) // 2:])
    u_leaves = [next(new_u).reshape(g.shape) if keep else g.astype(dtypes[0]) if g.size == 0 else g
                for g, keep, dtypes in zip(gs, kept, out_dtypes)]
    v_leaves = [next(new_v).reshape(g.shape) if keep else v for g, v, keep in zip(gs, vs, kept)]
    new_state = (layerwise.LayerwiseRateState(rates=layerwise.LayerRates(vectors, rates_layout)),
                 new_learning_rate_state, optax.TraceState(trace=treedef.unflatten(v_leaves)))
    return treedef.unflatten(u_leaves), new_state

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("layer-wise rates need the parameters: call update(grads, state, params), "
                       "not update(grads, state).")
    if interpret:
      return fused_update(updates, state, params)
    return jax.lax.platform_dependent(updates, state, params, default=reference.update, cuda=fused_update)

  return optax.GradientTransformation(reference.init, update_fn)


def apply_updates(params: Any, updates: Any, *, interpret: bool = False) -> Any:
  """`optax.apply_updates(params, updates)`: `w + u` in each parameter's dtype, on a CUDA GPU as one
  Pallas kernel over every leaf (each new `w` written in its old one's place).

  An optax update ends with this addition, which XLA runs leaf by leaf when the updates come out of a
  kernel it cannot fuse into (161 kernels on the ResNet-50 tree after `layerwise_sgd`'s two); this
  launches one. On other platforms it is `optax.apply_updates`, whose addition XLA fuses into the
  update's own kernels.

  Args:
    params: the parameters (real floating point of at most 32 bits on the GPU path).
    updates: the updates, structured and shaped as `params`.
    interpret: run the kernel in Pallas's interpreter on any platform (tests, debugging).

  Returns:
    The updated parameters, structured, shaped and typed as `params`.

  References:
    optax.apply_updates, google-deepmind/optax, optax/_src/update.py.
    NVIDIA apex, `multi_tensor_axpby` (csrc/multi_tensor_axpby_kernel.cu).
  """

  def fused(params, updates):
    treedef = jax.tree.structure(params)
    ws, us = treedef.flatten_up_to(params), treedef.flatten_up_to(updates)
    _check_dtypes(ws)
    if not any(w.size for w in ws):
      return params
    places, programs = chunks([(1, w.size) if w.size else None for w in ws])
    leaves = [i for i, place in enumerate(places) if place is not None]
    position = {leaf: j for j, leaf in enumerate(leaves)}
    n = len(leaves)

    def kernel(*refs):
      w_refs, u_refs, out_refs = refs[:n], refs[n:2 * n], refs[2 * n:]

      def body(program, leaf, layer, start, valid):
        del program, layer
        j = position[leaf]
        w = _load(w_refs[j], start, valid)
        _store(out_refs[j], start, w + _load(u_refs[j], start, valid), valid)

      _for_my_chunk(places, body)

    shapes = [_output_like(ws[i], (ws[i].size,), ws[i].dtype) for i in leaves]
    new = iter(_call(kernel, shapes, programs, interpret,
                     [ws[i].reshape(-1) for i in leaves] + [us[i].reshape(-1) for i in leaves],
                     {j: j for j in range(n)}))
    return treedef.unflatten([next(new).reshape(w.shape) if w.size else w for w in ws])

  if interpret:
    return fused(params, updates)
  return jax.lax.platform_dependent(params, updates, default=optax.apply_updates, cuda=fused)
