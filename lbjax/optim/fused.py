"""The fused layout: a LARS-family (or momentum SGD) update over every leaf in a few Pallas kernels on NVIDIA GPUs.

On a GPU an optimizer update is launch-bound (`multi_tensor`). The flat layout brings LARS on the
ResNet-50 tree from 380 kernels to 32 (compiled for an H100), but no further within XLA: the flat
buffers are concatenations (4 kernels) and the leaves are written back by one kernel per group of
equally shaped leaves (22 on ResNet-50), since XLA:GPU fuses sibling loops only when their outputs have
the same shape (benchmarks/README.md, Findings 10). A kernel written for the job has no such limit: as in apex's
`multi_tensor_apply` (`lbjax.optim.multi_tensor_apply`), each program of a Pallas kernel takes one chunk of
4,096 values of one leaf, whichever leaf it is, so one launch covers up to 96 leaves (a pass over ResNet-50's
161 leaves is two launches):

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

LAMB (`lamb`) has the same two passes: its first updates Adam's moments, writes Adam's direction
`r` and sums the trust ratio's norms (`|w|^2`, `|r + beta w|^2`); its second writes the update. Momentum
SGD (`momentum_sgd`, the baseline LARS is compared with) is one pass.

The kernels run on CUDA only (`lax.platform_dependent`); on every other platform the same update runs
in the per-leaf layout, so an optimizer built with `layout="fused"` runs anywhere, differing only by the
order of summation of the norms. Like the flat layout, the kernels see whole arrays: with parameters
sharded under `jit` the partitioner would gather them; use it with replicated parameters or inside
`shard_map`/`pmap` with `axis_name`. The kernels take trees of float32, bfloat16 and float16 leaves
(Triton has no complex type); a tree with another dtype (complex, float64), or with `optax.MaskedNode`s
(inside `optax.masked`), gets the per-leaf update on every platform (`multi_tensor_apply.kernels_take`).
The kernels are written for Pallas's Triton backend, which JAX 0.10 to 0.12 compile for NVIDIA GPUs; JAX
0.12 deprecates it in favour of Mosaic GPU (Hopper and newer only) and warns when it compiles one. On a
JAX without it the layout is refused when built (use "flat"), and `apply_updates` is
`optax.apply_updates`.

Compiled for an H100 (deviceless, `python -m benchmarks.optimizer --kernels-for h100`), a ResNet-50 update
with its weight update (`apply_updates`) launches 9 kernels for LARS and PercentDelta, 12 for LAMB and 4
for momentum SGD (per leaf: 380, 279, 289 and 161; the flat layout 32, 33 and 34). In place: the momentum
(LAMB's moments) and, with `apply_updates`, the weights are written where the old ones were, so a jitted
step should donate them. Not for `lbjax-train`: its step keeps the previous state until it knows the
update is finite (`lbjax.train.step`), which the in-place kernels defeat (the trainer refuses the layout).

Compiling takes longer than per leaf (2-5 s on an H200): Triton's coalescing pass visits, for every load
and store, every op connected to it, which in a kernel with a branch per leaf is the whole kernel, so a
kernel's compile grows with the square of its leaves. Cut into kernels of up to 96 leaves
(`multi_tensor_apply.LEAVES_PER_KERNEL`: two per pass on ResNet-50), the updates compile deviceless for an
H100 on 2 Intel Xeon cores (2026-12-01) in 4.7 s (momentum SGD), 7.5 s (LARS) and 27 s (LAMB), against
7.9, 11 and 69 s as one kernel per pass, which took 17, 22 and 106 s on an H200 machine
(benchmarks/README.md, Findings 10).

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

from lbjax.optim import layerwise
from lbjax.optim import multi_tensor_apply as mta
from lbjax.optim import validation
from lbjax.optim.multi_tensor_apply import Chunk, LeafChunks, chunks, over_chunks

def _scaled(chunk: Chunk, g: jax.Array, slot: int | None, skip_decay: bool) -> jax.Array:
  """A chunk of `layerwise.scale_by_layerwise_rate`'s output, `rate * g + (rate * beta) * w` in `g`'s dtype
  for a selected leaf (its rates from `slot` in the shared rate vector, `w` per-leaf input 0), `g` for
  another."""
  if slot is None:
    return g
  scale = mta.plgpu.load(chunk.shared[0].at[mta.pl.ds(slot + chunk.layer, 1)])
  scaled = scale * g if skip_decay else scale * g + (scale * chunk.values["weight_decay"]) * chunk.load(0)
  return scaled.astype(g.dtype)


class ChunkReducer:
  """A `SummedRate`'s reducer over one chunk (zeros outside the layer add nothing)."""

  def sum(self, x: jax.Array) -> jax.Array:
    return jnp.sum(x, dtype=jnp.promote_types(x.dtype, jnp.float32))

  def sum_of_squares(self, x: jax.Array) -> jax.Array:
    return self.sum(layerwise.squared_magnitude(x))


def _number_of_sums(rate: layerwise.SummedRate, weight_decay: Any) -> int:
  probe = jnp.zeros((mta.CHUNK,), jnp.float32)
  return len(jax.eval_shape(lambda: rate.sums(probe, probe, weight_decay, ChunkReducer())))


def chunk_sums(rate: layerwise.SummedRate, weight_decay: Any, ws: list[jax.Array | None],
               gs: list[jax.Array | None], places: list[LeafChunks | None],
               interpret: bool) -> list[jax.Array]:
  """Pass 1: each program's sums of `rate.sums` over its chunk, one float32 vector per sum (a
  program's entry at its id). `ws`, `gs`: the flattened leaves (None where `places` is)."""

  def body(chunk: Chunk) -> None:
    chunk.store_sums(rate.sums(chunk.load(0), chunk.load(1), chunk.values["weight_decay"], ChunkReducer()))

  _, sums = over_chunks(body, places, [ws, gs], [], hyper=dict(weight_decay=weight_decay),
                         sums=_number_of_sums(rate, weight_decay), interpret=interpret)
  return sums


def momentum_step(ws, gs, vs, rates, slots, places, hyper: dict[str, Any], skip_decay: bool,
                  nesterov: bool, out_dtypes: list[tuple[Any, Any]], interpret: bool
                  ) -> tuple[list[jax.Array], list[jax.Array]]:
  """Pass 2: each program's chunk of the update and the new momentum, as `layerwise.layerwise_sgd`
  computes them (module doc). `slots`: each leaf's first entry in `rates`, None if unselected;
  `hyper`: `weight_decay`, `momentum` and `step_<dtype>` (the learning-rate factor in each update dtype,
  `-gamma_t` rounded as optax rounds it); `out_dtypes`: each leaf's (update, momentum) dtypes. Returns
  the updates and the momenta (each new one in its old one's place) of the leaves in `places`."""

  def body(chunk: Chunk) -> None:
    g = chunk.load(1)
    update = chunk.values[f"step_{jnp.dtype(g.dtype).name}"] * _scaled(chunk, g, slots[chunk.leaf], skip_decay)
    v = chunk.load(2)
    wide = jnp.result_type(update, v)
    stored = (update + chunk.values["momentum"] * v.astype(wide)).astype(v.dtype)
    new_v = stored.astype(wide)
    chunk.store(0, update + chunk.values["momentum"] * new_v if nesterov else new_v)
    chunk.store(1, stored)

  outputs = [[None if g is None else (g.shape, dtypes[k]) for g, dtypes in zip(gs, out_dtypes)] for k in range(2)]
  (updates, momenta), _ = over_chunks(body, places, [ws, gs, vs], outputs, shared=(rates,), hyper=hyper,
                                       in_place=((2, 1),), interpret=interpret)
  return updates, momenta


@dataclasses.dataclass(frozen=True)
class _Leaves:
  """A tree's leaves as the kernels see them: the non-empty ones flattened, the kernels' results put back.

  Attributes:
    treedef: the tree's structure (the parameters').
    shapes: each leaf's shape.
    kept: which leaves the kernels touch (the non-empty ones).
  """

  treedef: Any
  shapes: list[tuple[int, ...]]
  kept: list[bool]

  @classmethod
  def of(cls, params: Any) -> "_Leaves":
    leaves, treedef = jax.tree.flatten(params)
    return cls(treedef, [x.shape for x in leaves], [x.size > 0 for x in leaves])

  def flat(self, leaves: list[Any]) -> list[Any]:
    """The kept leaves of a tree like the parameters, flattened (None elsewhere)."""
    return [x.reshape(-1) if keep else None for x, keep in zip(leaves, self.kept)]

  def unflatten(self, results: Any, defaults: list[Any]) -> Any:
    """The tree whose kept leaves are the kernel's `results` (in order, reshaped), `defaults` elsewhere."""
    results = iter(results)
    return self.treedef.unflatten([next(results).reshape(shape) if keep else default
                                   for shape, keep, default in zip(self.shapes, self.kept, defaults)])

  def whole_leaf_chunks(self) -> list[LeafChunks | None]:
    """The programs over the kept leaves, each leaf one layer."""
    return chunks([(1, math.prod(shape)) if keep else None for shape, keep in zip(self.shapes, self.kept)])


@dataclasses.dataclass(frozen=True)
class _Tree(_Leaves):
  """One layer-wise update's leaves as the kernels see them, with the programs that cover them.

  Attributes:
    ws, gs: the parameters and the incoming updates, leaf by leaf.
    sizes: per kept leaf `(layers, layer_size)` (its stacked axes), None elsewhere.
    slots: per leaf its first entry in the rate vector, None if unselected.
    rates_layout: the `layerwise.RatesLayout` of the per-leaf state.
  """

  ws: list[Any]
  gs: list[Any]
  sizes: list[tuple[int, int] | None]
  slots: list[int | None]
  rates_layout: layerwise.RatesLayout

  @classmethod
  def of(cls, updates: Any, params: Any, mask: layerwise.MaskOrFn, stacked: layerwise.StackedOrFn,
         rates_layout: layerwise.RatesLayout) -> "_Tree":
    treedef, _, ks = layerwise.selection(params, mask, stacked)
    ws, gs = treedef.flatten_up_to(params), treedef.flatten_up_to(updates)
    kept = [g.size > 0 for g in gs]
    sizes = [(math.prod(g.shape[:k]), math.prod(g.shape[k:])) if keep else None for g, k, keep in zip(gs, ks, kept)]
    slots = [None if slot is None else slot[1] for slot in rates_layout.slots]
    return cls(treedef, [g.shape for g in gs], kept, ws, gs, sizes, slots, rates_layout)

  def selected_chunks(self) -> list[LeafChunks | None]:
    """The programs over the selected leaves (pass 1 of `layerwise_sgd`)."""
    return chunks([size if slot is not None else None for size, slot in zip(self.sizes, self.slots)])

  def rates(self, rate: layerwise.SummedRate, chunk_vectors: list[jax.Array], places: list[LeafChunks | None],
            weight_decay: Any, axis_name: layerwise.AxisName) -> jax.Array:
    """Every selected layer's rate from the sums of the programs `places` (a program of an unselected
    leaf is left out; no programs: every selected layer empty): a `segment_sum` by layer, one `psum` with
    `axis_name`, the rate's formula."""
    size, dtype = self.rates_layout.sizes()[0], self.rates_layout.dtypes[0]
    if chunk_vectors:
      # A program of an unselected leaf sums into entry `size`, which `segment_sum` drops.
      layer_ids = np.concatenate([np.repeat(np.arange(place.layers) + slot, place.per_layer) if slot is not None
                                  else np.full(place.count, size) for place, slot in zip(places, self.slots)
                                  if place is not None])
      layer_sums = jnp.stack([jax.ops.segment_sum(c, layer_ids, size) for c in chunk_vectors])
    else:  # every selected layer is empty: sums of nothing
      layer_sums = jnp.zeros((_number_of_sums(rate, weight_decay), size), dtype)
    return rate.global_rates(layer_sums.astype(dtype), weight_decay, axis_name).astype(dtype)


def _learning_rate_steps(scale_by_learning_rate: optax.GradientTransformation, state: Any,
                         dtypes: set[str]) -> tuple[dict[str, jax.Array], Any]:
  """`step_<dtype>`: the factor optax's `scale_by_learning_rate` multiplies an update of that dtype by
  (`-gamma_t` rounded to it), and the new state."""
  steps, new_state = {}, scale_by_learning_rate.update(jnp.ones(()), state)[1]
  for dtype in dtypes:
    steps[f"step_{dtype}"] = scale_by_learning_rate.update(jnp.ones((), dtype), state)[0]
  return steps, new_state


def _on_cuda(reference: optax.GradientTransformation, fused_update: Callable, interpret: bool
             ) -> optax.GradientTransformation:
  """`reference` whose update is `fused_update` on CUDA (and everywhere with `interpret`), where the kernels
take the tree (`multi_tensor_apply.kernels_take`)."""

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("the fused layout needs the parameters: call update(grads, state, params), "
                       "not update(grads, state).")
    if not mta.kernels_take(updates, params):
      return reference.update(updates, state, params)
    if interpret:
      return fused_update(updates, state, params)
    return jax.lax.platform_dependent(updates, state, params, default=reference.update, cuda=fused_update)

  return optax.GradientTransformation(reference.init, update_fn)


def _check_rate(rate: Any) -> None:
  """Refuses what the kernels cannot build: a JAX without their backend, a rate that is not a sum."""
  mta.check_backend()
  if not isinstance(rate, layerwise.SummedRate):
    raise ValueError(f"the fused layout needs a statistic made of per-layer sums (a layerwise.SummedRate), "
                     f"got {rate!r}: build it with layout='per_leaf'.")


def layerwise_sgd(
    reference: optax.GradientTransformation,
    rate: layerwise.SummedRate,
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any,
    nesterov: bool,
    weight_decay: Any,
    mask: layerwise.MaskOrFn,
    stacked: layerwise.StackedOrFn,
    axis_name: layerwise.AxisName,
    interpret: bool = False,
) -> optax.GradientTransformation:
  """`reference`, `layerwise.layerwise_sgd(layerwise.scale_by_layerwise_rate(rate, ...), ...)` of these
  arguments, in the fused layout:

      u^l = rate^l * (g^l + beta * w^l),   v_{t+1} = m * v_t + gamma_t * u,   w_{t+1} = w_t - v_{t+1}

  (papers/000 Algorithm 1 with `rate = lars_rate`), each pass over all leaves one Pallas kernel on a
  CUDA GPU (module doc); `reference` itself on other platforms. Same state as `reference`.

  Args:
    reference: the per-leaf transformation (its state, dtypes and update off CUDA).
    rate: a `layerwise.SummedRate` (LARS, PercentDelta).
    learning_rate, momentum, nesterov: as `layerwise.layerwise_sgd`.
    weight_decay, mask, stacked, axis_name: as `layerwise.scale_by_layerwise_rate`.
    interpret: run the kernels in Pallas's interpreter on any platform (tests, debugging).

  Returns:
    An `optax.GradientTransformation`.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000: eq. 4-6, Algorithm 1.)
    NVIDIA apex, `multi_tensor_apply` (csrc/multi_tensor_apply.cuh).
  """
  _check_rate(rate)
  scale_by_learning_rate = optax.scale_by_learning_rate(learning_rate)
  skip_decay = validation.is_literal_zero(weight_decay)

  def fused_update(updates, state, params):
    rate_state, learning_rate_state, trace_state = state
    tree = _Tree.of(updates, params, mask, stacked, rate_state.rates.layout)
    vs = tree.treedef.flatten_up_to(trace_state.trace)
    out_updates, out_state = jax.eval_shape(reference.update, updates, state, params)
    out_dtypes = list(zip([u.dtype for u in tree.treedef.flatten_up_to(out_updates)],
                          [v.dtype for v in tree.treedef.flatten_up_to(out_state[2].trace)]))
    flat_w, flat_g = tree.flat(tree.ws), tree.flat(tree.gs)
    rates, vectors = jnp.zeros((1,), jnp.float32), ()
    if tree.rates_layout.dtypes:  # some leaf is selected
      places = tree.selected_chunks()
      sums = chunk_sums(rate, weight_decay, flat_w, flat_g, places, interpret) if any(places) else []
      rates = tree.rates(rate, sums, places, weight_decay, axis_name)
      vectors = (rates,)
    steps, new_learning_rate_state = _learning_rate_steps(
        scale_by_learning_rate, learning_rate_state,
        {jnp.dtype(g.dtype).name for g, keep in zip(tree.gs, tree.kept) if keep})
    places = chunks(tree.sizes)
    new_updates, new_momenta = momentum_step(
        flat_w, flat_g, tree.flat(vs), rates, tree.slots, places,
        dict(steps, weight_decay=weight_decay, momentum=momentum), skip_decay, nesterov, out_dtypes, interpret)
    new_state = (layerwise.LayerwiseRateState(rates=layerwise.LayerRates(vectors, tree.rates_layout)),
                 new_learning_rate_state, optax.TraceState(trace=tree.unflatten(new_momenta, vs)))
    return tree.unflatten(new_updates, [g.astype(dtypes[0]) for g, dtypes in zip(tree.gs, out_dtypes)]), new_state

  return _on_cuda(reference, fused_update, interpret)


def adam_moments(ws, gs, mus, nus, rate, slots, places, hyper: dict[str, Any],
                 out_dtypes: list[tuple[Any, Any, Any]], interpret: bool
                 ) -> tuple[list[jax.Array], list[jax.Array], list[jax.Array], list[jax.Array]]:
  """LAMB's pass 1: each program's chunk of Adam's moments and direction, and of the rate's sums.

      mu' = (1 - b1) g + b1 mu,   nu' = (1 - b2) g^2 + b2 nu,   r = (mu' / c1) / (sqrt(nu' / c2 + eps_root) + eps)

  with `c1 = 1 - b1^t`, `c2 = 1 - b2^t` (`hyper`, as optax's `scale_by_adam` and its bias correction
  compute them; the moments widened to the update's dtype, float32 at least, and rounded where stored,
  as `low_precision.stored_in`). Writes `r` and `mu'`, `nu'` in the old moments' place (in the
  `out_dtypes`: per leaf (direction, mu, nu)); for a selected leaf (`slots`) also `rate.sums(w, r)` of
  the chunk, at the program's entry of one float32 vector per sum (zeros for another). Returns the
  directions, the moments and the sums vectors."""
  count = _number_of_sums(rate, hyper["weight_decay"])

  def body(chunk: Chunk) -> None:
    g, mu, nu = chunk.load(1), chunk.load(2), chunk.load(3)
    b1, b2 = chunk.values["b1"], chunk.values["b2"]
    g = g.astype(jnp.promote_types(g.dtype, jnp.float32))
    mu = (1 - b1) * g + b1 * mu.astype(jnp.result_type(mu, g))
    nu = (1 - b2) * g ** 2 + b2 * nu.astype(jnp.result_type(nu, g))
    mu_hat, nu_hat = mu / chunk.values["c1"].astype(mu.dtype), nu / chunk.values["c2"].astype(nu.dtype)
    r = mu_hat / (jnp.sqrt(nu_hat + chunk.values["eps_root"]) + chunk.values["eps"])
    chunk.store(0, r)
    chunk.store(1, mu)
    chunk.store(2, nu)
    if slots[chunk.leaf] is None:
      chunk.store_sums([jnp.zeros((), jnp.float32)] * count)
    else:
      r = jnp.where(chunk.valid, r, 0).astype(out_dtypes[chunk.leaf][0])
      chunk.store_sums(rate.sums(chunk.load(0), r, chunk.values["weight_decay"], ChunkReducer()))

  outputs = [[None if g is None else (g.shape, dtypes[k]) for g, dtypes in zip(gs, out_dtypes)] for k in range(3)]
  (directions, new_mus, new_nus), sums = over_chunks(
      body, places, [ws, gs, mus, nus], outputs, hyper=hyper, sums=count, in_place=((2, 1), (3, 2)),
      interpret=interpret)
  return directions, new_mus, new_nus, sums


def scaled_direction(ws, rs, rates, slots, places, hyper: dict[str, Any], skip_decay: bool,
                     out_dtypes: list[Any], interpret: bool) -> list[jax.Array]:
  """LAMB's pass 2: each program's chunk of the update `-gamma_t * rate^l * (r + beta * w)` (selected
  leaves; `-gamma_t * r` elsewhere), as `layerwise.scale_by_layerwise_rate` and optax's
  `scale_by_learning_rate` compute it."""

  def body(chunk: Chunk) -> None:
    update = _scaled(chunk, chunk.load(1), slots[chunk.leaf], skip_decay)
    chunk.store(0, chunk.values[f"step_{jnp.dtype(update.dtype).name}"] * update)

  outputs = [[None if r is None else (r.shape, dtype) for r, dtype in zip(rs, out_dtypes)]]
  (updates,), _ = over_chunks(body, places, [ws, rs], outputs, shared=(rates,), hyper=hyper,
                               interpret=interpret)
  return updates


def lamb(
    reference: optax.GradientTransformation,
    rate: layerwise.SummedRate,
    learning_rate: optax.ScalarOrSchedule,
    b1: Any,
    b2: Any,
    eps: Any,
    eps_root: Any,
    weight_decay: Any,
    mask: layerwise.MaskOrFn,
    stacked: layerwise.StackedOrFn,
    axis_name: layerwise.AxisName,
    interpret: bool = False,
) -> optax.GradientTransformation:
  """`reference`, LAMB of these arguments in the per-leaf layout (`lbjax.optim.lamb`), in the fused layout:

      r = Adam's direction (bias-corrected moments),   u^l = -gamma_t * ||w^l|| / ||r^l + beta w^l|| * (r^l + beta w^l)

  (LAMB's Algorithm 2 with phi the identity): pass 1 (`adam_moments`) updates the moments, writes `r`
  and sums the trust ratio's norms; pass 2 (`scaled_direction`) writes the update. `reference` itself
  off CUDA; the same state.

  Args:
    reference: the per-leaf transformation (its state, dtypes and update off CUDA).
    rate: `lamb_rate()`, a `layerwise.SummedRate` of the direction.
    learning_rate, b1, b2, eps, eps_root: as `lbjax.optim.lamb`.
    weight_decay, mask, stacked, axis_name: as `layerwise.scale_by_layerwise_rate`.
    interpret: run the kernels in Pallas's interpreter on any platform (tests, debugging).

  Returns:
    An `optax.GradientTransformation`.

  References:
    You, Y., Li, J., Reddi, S., Hseu, J., Kumar, S., Bhojanapalli, S., Song, X., Demmel, J.,
      Keutzer, K., and Hsieh, C.-J. Large Batch Optimization for Deep Learning: Training BERT in 76
      minutes. ICLR 2020. arXiv:1904.00962. (Algorithm 2, LAMB.)
    NVIDIA apex, `multi_tensor_lamb.cu` (FusedLAMB: the moments and norms in one pass, the update in a second).
  """
  _check_rate(rate)
  scale_by_learning_rate = optax.scale_by_learning_rate(learning_rate)
  skip_decay = validation.is_literal_zero(weight_decay)

  def fused_update(updates, state, params):
    adam_state, rate_state, learning_rate_state = state
    tree = _Tree.of(updates, params, mask, stacked, rate_state.rates.layout)
    mus, nus = tree.treedef.flatten_up_to(adam_state.mu), tree.treedef.flatten_up_to(adam_state.nu)
    out_updates, _ = jax.eval_shape(reference.update, updates, state, params)
    direction_dtypes = [jnp.result_type(g, mu, nu) for g, mu, nu in zip(tree.gs, mus, nus)]
    out_dtypes = list(zip(direction_dtypes, [m.dtype for m in mus], [v.dtype for v in nus]))
    count = optax.safe_increment(adam_state.count)
    hyper = dict(b1=b1, b2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay,
                 c1=1 - b1 ** count, c2=1 - b2 ** count)
    places = chunks(tree.sizes)
    directions, new_mus, new_nus, sums = adam_moments(
        tree.flat(tree.ws), tree.flat(tree.gs), tree.flat(mus), tree.flat(nus), rate, tree.slots, places,
        hyper, out_dtypes, interpret)
    rates, vectors = jnp.zeros((1,), jnp.float32), ()
    if tree.rates_layout.dtypes:  # some leaf is selected
      rates = tree.rates(rate, sums, places, weight_decay, axis_name)
      vectors = (rates,)
    steps, new_learning_rate_state = _learning_rate_steps(
        scale_by_learning_rate, learning_rate_state, {jnp.dtype(d).name for d in direction_dtypes})
    remaining = iter(directions)
    flat_r = [next(remaining) if keep else None for keep in tree.kept]
    final_dtypes = [u.dtype for u in tree.treedef.flatten_up_to(out_updates)]
    new_updates = scaled_direction(tree.flat(tree.ws), flat_r, rates, tree.slots, places,
                                   dict(steps, weight_decay=weight_decay), skip_decay, final_dtypes, interpret)
    new_adam_state = adam_state._replace(count=count, mu=tree.unflatten(new_mus, mus),
                                         nu=tree.unflatten(new_nus, nus))
    new_state = (new_adam_state,
                 layerwise.LayerwiseRateState(rates=layerwise.LayerRates(vectors, tree.rates_layout)),
                 new_learning_rate_state)
    return tree.unflatten(new_updates, [g.astype(d) for g, d in zip(tree.gs, final_dtypes)]), new_state

  return _on_cuda(reference, fused_update, interpret)


def momentum_sgd(
    reference: optax.GradientTransformation,
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any,
    nesterov: bool,
    weight_decay: Any,
    mask: layerwise.MaskOrFn,
    interpret: bool = False,
) -> optax.GradientTransformation:
  """`reference`, `lbjax.optim.momentum` of these arguments (optax's `sgd` with weight decay on the
  selected leaves), in the fused layout: one pass of kernels over every leaf,

      d = g + beta * w   (selected leaves),   v' = m * v + d,   u = -gamma_t * v'   (Nesterov: -gamma_t (m v' + d))

  with the momentum written in place; `reference` itself off CUDA; the same state. The baseline LARS is
  compared with, in the same layout (161 kernels per ResNet-50 update per leaf).

  Args:
    reference: the per-leaf transformation (its state, dtypes and update off CUDA).
    learning_rate, momentum, nesterov, weight_decay: as `lbjax.optim.momentum`.
    mask: which leaves get weight decay (pytree of bools or callable on the parameters).
    interpret: run the kernel in Pallas's interpreter on any platform (tests, debugging).

  Returns:
    An `optax.GradientTransformation`.

  References:
    Polyak, B. T. Some methods of speeding up the convergence of iteration methods. USSR
      Computational Mathematics and Mathematical Physics 4(5), 1964.
    optax.sgd, google-deepmind/optax, optax/_src/alias.py.
  """
  mta.check_backend()
  scale_by_learning_rate = optax.scale_by_learning_rate(learning_rate)
  skip_decay = validation.is_literal_zero(weight_decay)
  has_momentum = not validation.is_literal_zero(momentum)

  def fused_update(updates, state, params):
    decay_state, (trace_state, learning_rate_state) = state
    leaves = _Leaves.of(params)
    treedef = leaves.treedef
    ws, gs = treedef.flatten_up_to(params), treedef.flatten_up_to(updates)
    decayed = treedef.flatten_up_to(mask(params) if callable(mask) else mask)
    vs = treedef.flatten_up_to(trace_state.trace) if has_momentum else gs
    out_updates, _ = jax.eval_shape(reference.update, updates, state, params)
    out_dtypes = [(u.dtype, v.dtype) for u, v in zip(treedef.flatten_up_to(out_updates), vs)]
    places = leaves.whole_leaf_chunks()
    flat = leaves.flat
    steps, new_learning_rate_state = _learning_rate_steps(
        scale_by_learning_rate, learning_rate_state, {jnp.dtype(u).name for u, _ in out_dtypes})

    # Inputs: the gradients, then the momenta (with momentum), then the weights (with weight decay).
    inputs = [flat(gs)] + ([flat(vs)] if has_momentum else []) + ([] if skip_decay else [flat(ws)])

    def body(chunk: Chunk) -> None:
      d = chunk.load(0)
      if decayed[chunk.leaf] and not skip_decay:
        d = d + chunk.values["weight_decay"] * chunk.load(len(inputs) - 1)
      if has_momentum:
        v = chunk.load(1)
        wide = jnp.result_type(d, v)
        stored = (d + chunk.values["momentum"] * v.astype(wide)).astype(v.dtype)
        new_v = stored.astype(wide)
        d = d + chunk.values["momentum"] * new_v if nesterov else new_v
        chunk.store(1, stored)
      chunk.store(0, chunk.values[f"step_{jnp.dtype(d.dtype).name}"] * d)

    outputs = [[None if g is None else (g.shape, dtypes[k]) for g, dtypes in zip(flat(gs), out_dtypes)]
               for k in range(2 if has_momentum else 1)]
    hyper = dict(steps, weight_decay=weight_decay, **(dict(momentum=momentum) if has_momentum else {}))
    results, _ = over_chunks(body, places, inputs, outputs, hyper=hyper,
                              in_place=((1, 1),) if has_momentum else (), interpret=interpret)
    new_updates = leaves.unflatten(results[0], [g.astype(dtypes[0]) for g, dtypes in zip(gs, out_dtypes)])
    if has_momentum:
      trace_state = trace_state._replace(trace=leaves.unflatten(results[1], vs))
    return new_updates, (decay_state, (trace_state, new_learning_rate_state))

  return _on_cuda(reference, fused_update, interpret)


def apply_updates(params: Any, updates: Any, *, interpret: bool = False) -> Any:
  """`optax.apply_updates(params, updates)`: `w + u` in each parameter's dtype, on a CUDA GPU as one
  Pallas kernel over every leaf (each new `w` written in its old one's place).

  An optax update ends with this addition, which XLA runs leaf by leaf when the updates come out of a
  kernel it cannot fuse into (161 kernels on the ResNet-50 tree after `layerwise_sgd`'s two); this
  launches one. On other platforms it is `optax.apply_updates`, whose addition XLA fuses into the
  update's own kernels.

  Args:
    params: the parameters (the kernel takes float32, bfloat16 and float16 leaves; any other tree, and any
      tree on a JAX without Pallas's Triton backend, is added by `optax.apply_updates`).
    updates: the updates, structured and shaped as `params`.
    interpret: run the kernel in Pallas's interpreter on any platform (tests, debugging).

  Returns:
    The updated parameters, structured, shaped and typed as `params`.

  References:
    optax.apply_updates, google-deepmind/optax, optax/_src/update.py.
    NVIDIA apex, `multi_tensor_axpby` (csrc/multi_tensor_axpby_kernel.cu).
  """

  def fused(params, updates):
    leaves = _Leaves.of(params)
    ws, us = leaves.treedef.flatten_up_to(params), leaves.treedef.flatten_up_to(updates)
    places = leaves.whole_leaf_chunks()
    flat = leaves.flat

    def body(chunk: Chunk) -> None:
      chunk.store(0, chunk.load(0) + chunk.load(1))

    outputs = [[None if w is None else (w.shape, w.dtype) for w in flat(ws)]]
    (new,), _ = over_chunks(body, places, [flat(ws), flat(us)], outputs, in_place=((0, 0),),
                             interpret=interpret)
    return leaves.unflatten(new, ws)

  if mta.plgpu is None or not mta.kernels_take(params, updates):
    return optax.apply_updates(params, updates)
  if interpret:
    return fused(params, updates)
  return jax.lax.platform_dependent(params, updates, default=optax.apply_updates, cuda=fused)
