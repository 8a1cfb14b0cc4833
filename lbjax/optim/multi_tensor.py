"""The multi-tensor layout: a layer-wise optimizer run on a few flat buffers instead of on every leaf.

On a GPU an optimizer update is launch-bound: momentum SGD over ResNet-50's 161 leaves launches 161
kernels, and a layer-wise rate adds a reduction and an update per leaf (`lars` 380 kernels, `optax.lars`
528, compiled for an H100; benchmarks/README.md, section `optimizer-gpu-kernels`). The fastest LARS and LAMB launch a
handful whatever the number of leaves (NVIDIA's MLPerf LARS, apex's `multi_tensor_apply`). This module
is that design within XLA:

- every leaf of a dtype goes into one buffer of shape `(blocks, BLOCK)`, each layer padded with zeros
  to whole blocks (a leaf with stacked layers: each layer to whole blocks);
- a layer's sums are one reduction over the blocks of the buffer and one `segment_sum` of the block
  sums by layer (`BlockReducer`), so every layer's statistic comes out of a few kernels;
- the rest of the optimizer (learning rate, momentum, Adam's moments) runs elementwise on the buffers,
  so its state lives in this layout, and each leaf's update is a slice of the result.

`flat_layout(inner, mask, stacked)` wraps a chain written for `FlatTree`s (`scale_by_summed_rate`
and any elementwise optax transform) into a transformation of ordinary pytrees. `lars`, `lamb` and
`percent_delta` take `layout="flat"` to be built this way. Same numbers as the per-leaf layout up to
the order of summation; the rates are the same vectors (`trust_ratios` reads them unchanged). The one
difference: updates come out in the parameters' dtype, the per-leaf layout's in the gradients' (bfloat16
parameters with float32 gradients: the flat layout's updates are rounded to bfloat16).

Costs: the update concatenates w and g into the layout (two full copies read and written: XLA cannot
alias a concatenation), so on XLA:CPU, which is not launch-bound, the per-leaf layout is faster
(benchmarks/README.md). With parameters sharded under `jit` (FSDP, tensor parallelism) the
concatenation gathers them: use the flat layout with replicated parameters (data parallelism) or
inside `shard_map`/`pmap` with `axis_name`, where each device lays out its own shards. On a GPU the
`segment_sum` is a scatter-add, whose order of addition may differ between runs (atomics) unless XLA is
asked for deterministic operations (`--xla_gpu_deterministic_ops`, the trainer's `config.deterministic`).
"""

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lbjax.optim import flax_state
from lbjax.optim import fused
from lbjax.optim import layerwise
from lbjax.optim import validation

BLOCK = 1024  # values per block: the padding of a layer is below one block (ResNet-50: 0.6% of its 25.6M)
LAYOUTS = ("per_leaf", "flat", "fused")


@dataclasses.dataclass(frozen=True)
class LeafPlace:
  """Where one leaf lies in its buffer.

  Attributes:
    buffer: index of the buffer (one per dtype).
    start: its first block in that buffer.
    layers: number of layers it holds (the product of its stacked axes; 1 if none).
    layer_size: values per layer.
    shape: the leaf's shape.
  """

  buffer: int
  start: int
  layers: int
  layer_size: int
  shape: tuple[int, ...]

  @property
  def layer_blocks(self) -> int:
    """Blocks per layer: `layer_size` padded to whole blocks."""
    return -(-self.layer_size // BLOCK)


@dataclasses.dataclass(frozen=True)
class FlatLayout:
  """The flat layout of a parameter tree (static: part of the treedef of a `FlatTree`).

  Attributes:
    treedef: the structure of the parameters, `optax.MaskedNode`s counted as leaves.
    places: per leaf, its `LeafPlace`, or None for a MaskedNode.
    dtypes: the dtype of each buffer.
    rates: the `layerwise.RatesLayout` of the tree (which leaves the mask selects, where their rates lie):
      the rate vectors are those of the per-leaf layout.
  """

  treedef: Any
  places: tuple[LeafPlace | None, ...]
  dtypes: tuple[str, ...]
  rates: layerwise.RatesLayout

  @classmethod
  def of(cls, params: Any, mask: layerwise.MaskOrFn = None, stacked: layerwise.StackedOrFn = None) -> "FlatLayout":
    """The layout of `params`; `mask` and `stacked` as for `layerwise.scale_by_layerwise_rate`."""
    treedef, selected, ks = layerwise.selection(params, mask, stacked)
    leaves = treedef.flatten_up_to(params)
    dtypes = sorted({jnp.dtype(w.dtype).name for w in leaves if not isinstance(w, optax.MaskedNode)})
    blocks = [0] * len(dtypes)
    places = []
    for w, k in zip(leaves, ks):
      if isinstance(w, optax.MaskedNode):
        places.append(None)
        continue
      buffer = dtypes.index(jnp.dtype(w.dtype).name)
      place = LeafPlace(buffer, blocks[buffer], math.prod(w.shape[:k]), math.prod(w.shape[k:]), tuple(w.shape))
      places.append(place)
      blocks[buffer] += place.layers * place.layer_blocks
    rates = layerwise.RatesLayout.of(treedef, leaves, selected, ks)
    return cls(treedef, tuple(places), tuple(dtypes), rates)

  def flatten(self, tree: Any) -> "FlatTree":
    """The leaves of `tree` (structured as the parameters) in this layout, padded with zeros."""
    parts = [[] for _ in self.dtypes]
    for x, place in zip(self.treedef.flatten_up_to(tree), self.places):
      if place is None:
        continue
      dtype = self.dtypes[place.buffer]
      x = jnp.asarray(x, dtype).reshape(place.layers, place.layer_size)
      padding = place.layer_blocks * BLOCK - place.layer_size
      if place.layers == 1:  # zeros inside the concatenation: no pad kernel per leaf
        parts[place.buffer] += [x.reshape(-1)] + ([jnp.zeros((padding,), dtype)] if padding else [])
      else:
        parts[place.buffer].append(jnp.pad(x, ((0, 0), (0, padding))).reshape(-1))
    buffers = tuple(jnp.concatenate(p).reshape(-1, BLOCK) if p else jnp.zeros((0, BLOCK), dtype)
                    for p, dtype in zip(parts, self.dtypes))
    flax_state.register_if_flax_is_loaded(FlatTree, "buffers")
    return FlatTree(buffers, self)

  def unflatten(self, flat: "FlatTree") -> Any:
    """The pytree whose leaves `flat` holds (MaskedNodes where the parameters have them)."""
    leaves = []
    for place in self.places:
      if place is None:
        leaves.append(optax.MaskedNode())
        continue
      values = flat.buffers[place.buffer].reshape(-1)
      start = place.start * BLOCK
      if place.layers == 1:
        leaf = jax.lax.slice_in_dim(values, start, start + place.layer_size)
      else:
        leaf = jax.lax.slice_in_dim(values, start, start + place.layers * place.layer_blocks * BLOCK)
        leaf = leaf.reshape(place.layers, place.layer_blocks * BLOCK)[:, :place.layer_size]
      leaves.append(leaf.reshape(place.shape))
    return self.treedef.unflatten(leaves)

  def vector_of(self, buffer: int) -> int | None:
    """The rate vector of a buffer's layers (by `layerwise.real_dtype`), or None if none is selected."""
    name = layerwise.real_dtype(self.dtypes[buffer]).name
    return self.rates.dtypes.index(name) if name in self.rates.dtypes else None

  @functools.cached_property
  def block_layers(self) -> tuple[np.ndarray, ...]:
    """Per buffer, the position of each block's layer in its rate vector; for a block of a leaf the
    mask leaves out, the vector's length (`segment_sum` drops it; `scale_by_summed_rate` reads the 1
    it appends to the vector there)."""
    sizes = self.rates.sizes()
    ids = [[] for _ in self.dtypes]
    for place, slot in zip(self.places, self.rates.slots):
      if place is None:
        continue
      vector = self.vector_of(place.buffer)
      if slot is not None:
        layer_ids = np.arange(place.layers) + slot[1]
      else:
        layer_ids = np.full(place.layers, 0 if vector is None else sizes[vector])
      ids[place.buffer].append(np.repeat(layer_ids, place.layer_blocks))
    return tuple(np.concatenate(i).astype(np.int32) if i else np.zeros((0,), np.int32) for i in ids)

  @functools.cached_property
  def block_values(self) -> tuple[np.ndarray | None, ...]:
    """Per buffer, how many of each block's `BLOCK` values belong to its layer (the rest is padding), or None
    for a buffer without padding."""
    counts = [[] for _ in self.dtypes]
    for place in self.places:
      if place is not None and place.layer_blocks:
        last = place.layer_size - (place.layer_blocks - 1) * BLOCK
        counts[place.buffer].append(np.tile([BLOCK] * (place.layer_blocks - 1) + [last], place.layers))
    return tuple(np.concatenate(c).astype(np.int32) if c and min(min(x) for x in c) < BLOCK else None
                 for c in counts)

  def selected_blocks(self, buffer: int) -> np.ndarray:
    """Whether each block of a buffer belongs to a selected layer."""
    vector = self.vector_of(buffer)
    if vector is None:
      return np.zeros(self.block_layers[buffer].shape, bool)
    return self.block_layers[buffer] < self.rates.sizes()[vector]


@functools.partial(jax.tree_util.register_dataclass, data_fields=["buffers"], meta_fields=["layout"])
@dataclasses.dataclass(frozen=True)
class FlatTree:
  """A pytree of a few `(blocks, BLOCK)` buffers standing for a parameter-shaped tree.

  Elementwise optax transforms (`scale_by_learning_rate`, `trace`, `scale_by_adam`) run on it as on
  any pytree; `scale_by_summed_rate` reads its layout.

  Attributes:
    buffers: one 2-D array per dtype of `layout.dtypes`.
    layout: the `FlatLayout` (pytree metadata, not leaves).
  """

  buffers: tuple[Any, ...]
  layout: FlatLayout


@dataclasses.dataclass(frozen=True)
class BlockReducer:
  """The per-layer sums of a buffer of a `FlatLayout`: block sums, then one `segment_sum` by layer.

  Gives a `layerwise.SummedRate`'s `sums` what a `layerwise.LayerReducer` gives it leaf by leaf (`sum`,
  `sum_of_squares`), for every layer of the buffer at once, as one vector over the rate vector's
  layers. Padding is zeros in w and g, which add nothing to a sum; given `block_values`, the padding is
  left out (a direction that is not zero there: LAMB's Adam direction with eps = eps_root = 0 is 0/0).

  Attributes:
    block_layers: the rate-vector position of each block (`FlatLayout.block_layers`).
    layers: the length of the rate vector (blocks at that position, unselected, are dropped).
    block_values: how many values of each block are its layer's, the rest padding (`FlatLayout.block_values`);
      None: sum the padding too (zeros), or a buffer without padding.
  """

  block_layers: np.ndarray
  layers: int
  block_values: np.ndarray | None = None

  def sum(self, x: jax.Array) -> jax.Array:
    """Sum of `x` (a buffer) over each layer, in float32 or wider."""
    if self.block_values is not None:  # one select, fused into the block reduction
      x = jnp.where(jnp.arange(BLOCK)[None, :] < self.block_values[:, None], x, 0)
    block_sums = jnp.sum(x, axis=1, dtype=jnp.promote_types(x.dtype, jnp.float32))
    return jax.ops.segment_sum(block_sums, self.block_layers, self.layers)

  def sum_of_squares(self, x: jax.Array) -> jax.Array:
    """Squared L2 norm `sum_i |x_i|^2` of each layer of `x` (real, also for complex `x`)."""
    return self.sum(layerwise.squared_magnitude(x))


def scale_by_summed_rate(
    rate: layerwise.SummedRate, weight_decay: Any = 0.0, axis_name: layerwise.AxisName = None
) -> optax.GradientTransformation:
  """`layerwise.scale_by_layerwise_rate` on `FlatTree`s: `u^l = rate^l * (g^l + beta * w^l)`.

  For a selected layer `l` (the layout's mask), with `beta = weight_decay`,

      u^l = rate(sums^l, beta) * (g^l + beta * w^l)   (papers/000 Algorithm 1; papers/003 eq. 21-24)

  and `u = g` elsewhere. The sums of every layer of a buffer come from one block reduction and one
  `segment_sum`, all sums of a rate vector are completed across devices in one `psum` (with
  `axis_name`), the rates are one vector, and the update is one elementwise pass per buffer. Use it
  inside `flat_layout`, which lays the parameters and gradients out as `FlatTree`s.

  Args:
    rate: the statistic, a `layerwise.SummedRate` (a `LayerRate` such as MCLR's median is not a sum).
    weight_decay: beta, >= 0, selected layers only.
    axis_name: inside `shard_map`/`pmap`, the mapped axis the parameters are sharded over.

  Returns:
    An `optax.GradientTransformation` of `FlatTree`s whose state is a `layerwise.LayerwiseRateState`.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000 is its ICLR 2018 submission, "Large Batch Training of
      Convolutional Networks with Layer-wise Adaptive Rate Scaling": eq. 4-6, Algorithm 1.)
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 17-24.)
    NVIDIA apex, `multi_tensor_apply` (csrc/multi_tensor_apply.cuh): every tensor's chunks in one launch.
  """
  if not isinstance(rate, layerwise.SummedRate):
    raise ValueError(f"the flat layout needs a statistic made of per-layer sums (a layerwise.SummedRate), "
                     f"got {rate!r}: build it with layout='per_leaf'.")
  validation.check_nonnegative("weight_decay", weight_decay)
  validation.check_axis_name(axis_name, "a layer-wise optimizer")
  skip_decay = validation.is_literal_zero(weight_decay)

  def init_fn(params):
    return layerwise.LayerwiseRateState(rates=layerwise.LayerRates.zeros(_layout_of(params).rates))

  def rate_vectors(updates, params, layout):
    sizes = layout.rates.sizes()
    sums = [None] * len(sizes)
    for buffer, (g, w) in enumerate(zip(updates.buffers, params.buffers)):
      vector = layout.vector_of(buffer)
      if vector is None:
        continue
      reducer = BlockReducer(layout.block_layers[buffer], sizes[vector],
                             None if rate.zero_at_padding else layout.block_values[buffer])
      buffer_sums = [s.astype(layout.rates.dtypes[vector]) for s in rate.sums(w, g, weight_decay, reducer)]
      sums[vector] = buffer_sums if sums[vector] is None else [a + b for a, b in zip(sums[vector], buffer_sums)]
    return [rate.global_rates(jnp.stack(group), weight_decay, axis_name).astype(dtype)
            for group, dtype in zip(sums, layout.rates.dtypes)]

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("layer-wise rates need the parameters: call update(grads, state, params), "
                       "not update(grads, state).")
    if axis_name is not None:
      layerwise.check_axis_bound(axis_name)
    layout = _layout_of(params)
    vectors = rate_vectors(updates, params, layout)
    new_buffers = []
    for buffer, (g, w) in enumerate(zip(updates.buffers, params.buffers)):
      vector = layout.vector_of(buffer)
      if vector is None:
        new_buffers.append(g)
        continue
      with_one = jnp.concatenate([vectors[vector], jnp.ones((1,), vectors[vector].dtype)])
      scale = with_one[layout.block_layers[buffer]][:, None]  # unselected blocks: rate 1
      update = scale * g if skip_decay else scale * g + (scale * weight_decay) * w
      selected = layout.selected_blocks(buffer)[:, None]
      new_buffers.append(jnp.where(selected, update, g).astype(g.dtype))
    return FlatTree(tuple(new_buffers), layout), layerwise.LayerwiseRateState(
        rates=layerwise.LayerRates(tuple(vectors), layout.rates))

  return optax.GradientTransformation(init_fn, update_fn)


def _layout_of(params: Any) -> FlatLayout:
  if not isinstance(params, FlatTree):
    raise TypeError(f"scale_by_summed_rate works on FlatTrees (inside multi_tensor.flat_layout), got "
                    f"{type(params).__name__}: use layerwise.scale_by_layerwise_rate on ordinary pytrees.")
  return params.layout


def flat_layout(
    inner: optax.GradientTransformation,
    mask: layerwise.MaskOrFn = None,
    stacked: layerwise.StackedOrFn = None,
) -> optax.GradientTransformation:
  """Runs `inner` on the flat layout of the parameters: gradients and parameters go in as `FlatTree`s,
  `inner` returns the step `s` the weights move against (`w <- w - s`, Algorithm 1's `v`), and the
  updates `-s` come out as the parameters' pytree.

  `inner`'s state is in the flat layout (a momentum is a few buffers, not one array per leaf); the
  layout is a function of the parameters' shapes and dtypes, `mask` and `stacked`, computed when
  traced. Updates are in the parameters' dtypes. Why `inner` returns the step rather than the update:
  each leaf's update is then `-slice(s)`, and XLA:GPU fuses the weight updates of equally shaped leaves
  into one kernel (22 on ResNet-50's 161 leaves); a bare `slice(s)` is a read of a disjoint part of
  `s`, which XLA does not fuse across leaves (90 kernels; benchmarks/README.md, Findings 10).

  Args:
    inner: a transformation of `FlatTree`s returning the step: `scale_by_summed_rate` chained with
      elementwise optax transforms and `optax.scale_by_learning_rate(..., flip_sign=False)`.
    mask: which leaves get the layer-wise rate (pytree of bools, callable or regular expression: as
      `layerwise.scale_by_layerwise_rate`); default `ndim >= 2`.
    stacked: leading axes that enumerate separate layers (see `layerwise.scale_by_layerwise_rate`).

  Returns:
    An `optax.GradientTransformation` of ordinary pytrees.

  References:
    NVIDIA apex, `multi_tensor_apply` (csrc/multi_tensor_apply.cuh); optax.flatten, which runs an
      inner transformation on one flat vector of all the parameters (no layers).
  """
  layerwise.check_mask(mask)

  def init_fn(params):
    return inner.init(FlatLayout.of(params, mask, stacked).flatten(params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("the flat layout needs the parameters: call update(grads, state, params), "
                       "not update(grads, state).")
    layout = FlatLayout.of(params, mask, stacked)
    # The buffers are made whole before anything reads them: otherwise XLA fuses parts of the
    # concatenation into later kernels, which then read donated parameters after their in-place update
    # and need copies of them (ResNet-50 LAMB on a GPU: 88 copy kernels, 143 kernels instead of 34).
    flat_updates, flat_params = jax.lax.optimization_barrier((layout.flatten(updates), layout.flatten(params)))
    steps, state = inner.update(flat_updates, state, flat_params)
    return layout.unflatten(jax.tree.map(jnp.negative, steps)), state

  return optax.GradientTransformation(init_fn, update_fn)


def in_layout(
    layout: str,
    build: Callable[[optax.GradientTransformation, bool], optax.GradientTransformation],
    rate: layerwise.SummedRate,
    weight_decay: Any,
    mask: layerwise.MaskOrFn,
    stacked: layerwise.StackedOrFn,
    axis_name: layerwise.AxisName,
    fused_kernels: Callable[[optax.GradientTransformation], optax.GradientTransformation],
) -> optax.GradientTransformation:
  """`build(scaling, flip_sign)` with the layer-wise scaling by `rate` in `layout`: "per_leaf" (one
  reduction and one update per leaf: `layerwise.scale_by_layerwise_rate`; `flip_sign` True: `build`
  returns the update), "flat" (`flat_layout` around `scale_by_summed_rate`; `flip_sign` False: `build`
  returns the step) or "fused" (`fused_kernels(per-leaf transformation)`: its update in the Pallas
  kernels of `lbjax.optim.fused` on GPUs). `lars`, `lamb` and `percent_delta` are built this way."""
  validation.check_choice("layout", layout, LAYOUTS)
  if layout == "flat":
    return flat_layout(build(scale_by_summed_rate(rate, weight_decay, axis_name), False), mask, stacked)
  per_leaf = build(layerwise.scale_by_layerwise_rate(
      rate, weight_decay=weight_decay, mask=mask, stacked=stacked, axis_name=axis_name), True)
  return fused_kernels(per_leaf) if layout == "fused" else per_leaf


def layerwise_sgd(
    layout: str,
    rate: layerwise.SummedRate,
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any,
    nesterov: bool,
    accumulator_dtype: Any,
    weight_decay: Any,
    mask: layerwise.MaskOrFn,
    stacked: layerwise.StackedOrFn,
    axis_name: layerwise.AxisName,
) -> optax.GradientTransformation:
  """`layerwise.layerwise_sgd` with the scaling by `rate` in `layout` (`in_layout`); `lars` and
  `percent_delta` are built this way."""
  return in_layout(
      layout,
      lambda scaling, flip_sign: layerwise.layerwise_sgd(scaling, learning_rate, momentum, nesterov,
                                                          accumulator_dtype, flip_sign),
      rate, weight_decay, mask, stacked, axis_name,
      lambda per_leaf: fused.layerwise_sgd(per_leaf, rate, learning_rate, momentum, nesterov, weight_decay, mask,
                                           stacked, axis_name),
  )
