"""One layer-wise adaptive-rate transform with a pluggable statistic, shared masking and metrics.

LARS, its optax variant, LAMB's trust ratio, PercentDelta and the median-curvature LR (MCLR) all scale
each layer's update by a statistic of that layer's weights `w` and gradient `g` (papers/003, eq. 17-24).
`scale_by_layerwise_rate` is that transform. For a selected leaf

    u = rate(w, g, beta, layer) * (g + beta * w)

and for an unselected leaf `u = g` (no weight decay, no rate). The last step's rate of every selected
layer is kept in the state and read back, without recomputation, by `trust_ratios(opt_state)`.

Multi-tensor: LARS, LAMB and PercentDelta are `SummedRate`s, functions of a few per-layer sums
(`||w||^2`, `||g||^2`, ...). The transform takes those sums leaf by leaf (one reduction each, where the
leaf lies, so sharded leaves need no gather), stacks the sums of every layer of the tree into one array,
completes it across devices with one `psum` (under `shard_map`/`pmap`), computes every layer's rate as
one vector, and scales each leaf by its entry of that vector in one elementwise pass; the state keeps
the vector. Under `jax.jit` LARS (`SummedRate.leaf_local`) computes each leaf's rates from that leaf's
sums instead, the same numbers, so that XLA:CPU updates a leaf while it is in cache. A statistic that is
not a sum (MCLR's median) is a `LayerRate`, computed leaf by leaf with a `LayerReducer` that reduces
across devices itself; its rates join the same vector. This per-leaf layout is the default. The flat
layout (`lbjax.optim.multi_tensor`, `layout="flat"` of `lars`, `lamb` and `percent_delta`) runs the
whole optimizer on a few block-padded buffers, for GPUs, where an update is launch-bound; on XLA:CPU the
concatenation it needs costs more bytes and time than the per-leaf sums, and with parameters sharded
under `jit` the SPMD partitioner gathers every sharded leaf to concatenate it (`--collectives` of
`benchmarks/optimizer.py`: 112 all-gathers and 40 all-to-alls per ResNet-50 update over 8 devices for
the flat-buffer experiment, against one all-reduce for these stacked sums).

Zero norms: every statistic is a coefficient times a quotient `num / den` of layer statistics
(`||w|| / ||g||` and relatives). When `num` or `den` is zero or the quotient is not finite, the
quotient is taken as 1 (`safe_quotient`). For LARS this gives the local LR `eta` (never NaN and never a
raw step `lr * g`); for LAMB it gives the trust ratio 1 of optax and the LAMB paper.

Complex parameters: norms are `sqrt(sum_i |x_i|^2)` (a complex leaf is measured as a real vector of
twice its length) and the rates are real, so complex leaves work as in optax; the rates of every
leaf (and the state that keeps them) are float32, or float64 for float64/complex128 leaves.
"""

import dataclasses
import functools
import inspect
import math
import numbers
import re
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lbjax.optim import flax_state
from lbjax.optim import low_precision
from lbjax.optim import validation
from lbjax.optim.leaf_names import leaf_name

Params = Any
MaskOrFn = Any
StackedOrFn = Any
AxisName = str | tuple[str, ...] | None


def squared_magnitude(x: jax.Array) -> jax.Array:
  """`|x_i|^2` elementwise, real, in float32 or wider (a complex leaf is a real vector of twice its length)."""
  x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  if jnp.iscomplexobj(x):  # |x|^2 = re^2 + im^2: C^n measured as R^2n
    return jnp.real(x) * jnp.real(x) + jnp.imag(x) * jnp.imag(x)
  return x * x


@dataclasses.dataclass(frozen=True)
class LayerReducer:
  """Reductions over one layer of a leaf: all axes but the leading `stacked_axes` ones.

  With `axis_name` set (inside `shard_map`/`pmap`), each device holds a disjoint slice of every
  layer, and the reductions are completed across devices (`psum`, `pmin`).

  Attributes:
    stacked_axes: number of leading axes that enumerate separate layers (0: the leaf is one layer).
    ndim: number of dimensions of the leaf.
    local_size: number of elements of one layer held on this device.
    axis_name: named mapped axis the leaf is sharded over, or None.
  """

  stacked_axes: int
  ndim: int
  local_size: int
  axis_name: AxisName = None

  @property
  def layer_axes(self) -> tuple[int, ...]:
    """The axes that belong to one layer."""
    return tuple(range(self.stacked_axes, self.ndim))

  def sum(self, x: jax.Array) -> jax.Array:
    """Sum of `x` over each layer, shape `x.shape[:stacked_axes]`, in float32 or wider."""
    total = jnp.sum(x, axis=self.layer_axes, dtype=jnp.promote_types(x.dtype, jnp.float32))
    if self.axis_name is not None:
      total = jax.lax.psum(total, self.axis_name)
    return total

  def sum_of_squares(self, x: jax.Array) -> jax.Array:
    """Squared L2 norm `sum_i |x_i|^2` of each layer of `x` (real, also for complex `x`)."""
    return self.sum(squared_magnitude(x))

  def norm(self, x: jax.Array) -> jax.Array:
    """L2 norm of each layer of `x`."""
    return jnp.sqrt(self.sum_of_squares(x))

  def size(self) -> jax.Array | int:
    """Number of elements in one layer (over all devices)."""
    if self.axis_name is None:
      return self.local_size
    return jax.lax.psum(self.local_size, self.axis_name)

  def min(self, x: jax.Array) -> jax.Array:
    """Minimum of `x` (floating point) over each layer; inf for an empty layer."""
    smallest = jnp.min(x, axis=self.layer_axes, initial=jnp.inf)
    if self.axis_name is not None:
      smallest = jax.lax.pmin(smallest, self.axis_name)
    return smallest

  def count(self, condition: jax.Array) -> jax.Array:
    """Number of True entries of `condition` in each layer (int32)."""
    total = jnp.sum(condition, axis=self.layer_axes, dtype=jnp.int32)
    if self.axis_name is not None:
      total = jax.lax.psum(total, self.axis_name)
    return total

  def _per_layer(self, value: jax.Array) -> jax.Array:
    """Reshapes a per-layer value to broadcast against the leaf."""
    return value.reshape(value.shape + (1,) * (self.ndim - self.stacked_axes))

  def median_abs(self, x: jax.Array) -> jax.Array:
    """Exact median of `|x|` over each layer, by bisection instead of a sort.

    The IEEE-754 bit pattern of a non-negative float, read as an integer, is monotone in its value,
    so the k-th smallest `|x|` is the smallest integer `t` with `count(bits <= t) > k`: 31 (float32)
    or 63 (float64) counting passes, each a fused compare-and-sum that works on sharded layers like
    any sum (no gather), where XLA's CPU sort of a 2M-element layer takes seconds. An even layer
    size averages the two middle values, as `np.median` does; an empty layer's is 0 (a zero norm).
    """
    x = jnp.abs(x.astype(jnp.promote_types(x.dtype, jnp.float32)))
    int_dtype = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
    bits = jax.lax.bitcast_convert_type(x, int_dtype)
    n = self.size()
    k = (n - 1) // 2
    layer_shape = x.shape[: self.stacked_axes]

    def bisect(_, bounds):
      lo, hi = bounds
      mid = lo + (hi - lo) // 2
      enough = self.count(bits <= self._per_layer(mid)) > k
      return jnp.where(enough, lo, mid + 1), jnp.where(enough, mid, hi)

    lo = jnp.zeros(layer_shape, int_dtype)
    hi = jnp.full(layer_shape, jnp.iinfo(int_dtype).max, int_dtype)
    steps = jnp.iinfo(int_dtype).bits - 1
    lower_bits, _ = jax.lax.fori_loop(0, steps, bisect, (lo, hi))
    lower = jax.lax.bitcast_convert_type(lower_bits, x.dtype)
    at_most_lower = self.count(bits <= self._per_layer(lower_bits))
    above = self.min(jnp.where(bits > self._per_layer(lower_bits), x, jnp.inf))
    upper = jnp.where(at_most_lower > n // 2, lower, above)
    return jnp.where(n == 0, 0, jnp.where(n % 2 == 1, lower, (lower + upper) / 2))


class LayerRate(Protocol):
  """A layer statistic computed leaf by leaf: the local rate of one (possibly stacked) leaf.

  For statistics that are not sums (MCLR's median); the reducer it gets completes its reductions
  across devices itself. A statistic made of sums is better written as a `SummedRate`.
  """

  def __call__(
      self, w: jax.Array, g: jax.Array, weight_decay: Any, layer: LayerReducer
  ) -> jax.Array:
    """Returns the local rate, shape `w.shape[:layer.stacked_axes]`."""


@dataclasses.dataclass(frozen=True)
class SummedRate:
  """A layer statistic made of per-layer sums, computed for every layer of the tree at once.

  Attributes:
    sums: `sums(w, g, weight_decay, layer) -> tuple of arrays`, each of shape
      `w.shape[:layer.stacked_axes]`: one leaf's per-layer sums on this device (reduce with
      `layer.sum` or `layer.sum_of_squares`; the reducer it gets does not reduce across devices:
      the transform sums the stacked sums of all leaves in one `psum`).
    rate: `rate(sums, weight_decay) -> rates`: the local rate of every layer, elementwise in the
      global sums, each a vector over all selected layers of the tree.
    leaf_local: under `jax.jit` (no `axis_name`), take each leaf's rates from its own sums instead of
      one vector of every layer's rate, the same numbers: each leaf's update then waits only for its own
      reductions, and XLA:CPU can run it while the leaf is still in cache (LARS on the ResNet-50 tree:
      0.86x the time per update), where a GPU launches more kernels (LARS: 380 instead of 324 per ResNet-50
      update, compiled for an H100). Set by LARS. LAMB and PercentDelta keep the vector: leaf-local,
      their ResNet-50 updates were 4% and 7% faster on CPU and would launch 554 instead of 289 and 331
      instead of 279 kernels on an H100 (benchmarks/README.md, optimizer).
    zero_at_padding: whether the direction `sums` reads is zero where the gradient, the parameter and the
      optimizer's state are (the flat layout's padding), so the padding adds nothing to a sum. False: the
      flat layout leaves its padding out of the sums (one select in each block reduction); LAMB sets it when
      eps and eps_root may both be 0, where Adam's direction there is 0/0.
  """

  sums: Callable[[jax.Array, jax.Array, Any, LayerReducer], tuple[jax.Array, ...]]
  rate: Callable[[tuple[jax.Array, ...], Any], jax.Array]
  leaf_local: bool = False
  zero_at_padding: bool = True

  def global_rates(self, stacked_sums: jax.Array, weight_decay: Any, axis_name: str | None) -> jax.Array:
    """Every layer's rate from this device's `stacked_sums` (one row per sum, one column per layer),
    summed over the devices of `axis_name` first in one `psum`."""
    if axis_name is not None:
      stacked_sums = jax.lax.psum(stacked_sums, axis_name)
    return self.rate(tuple(stacked_sums), weight_decay)


def real_dtype(dtype: Any) -> jnp.dtype:
  """The dtype of a layer statistic of a leaf of `dtype`: real, float32 or wider.

  float32 for bfloat16, float16, float32 and complex64 leaves; float64 for float64 and complex128.
  """
  return jnp.finfo(jnp.promote_types(dtype, jnp.float32)).dtype


def safe_quotient(num: jax.Array, den: jax.Array) -> jax.Array:
  """`num / den`, or 1 where `num` or `den` is zero or not finite, or the quotient is not finite
  (zero-norm rule)."""
  ok = (num > 0) & (den > 0) & jnp.isfinite(num) & jnp.isfinite(den)
  quotient = num / jnp.where(ok, den, 1)
  return jnp.where(ok & jnp.isfinite(quotient), quotient, 1)


@dataclasses.dataclass(frozen=True)
class RatesLayout:
  """Where each leaf's rates lie in the vectors of a `LayerRates` (static: part of the treedef).

  Attributes:
    treedef: the structure of the parameters, `optax.MaskedNode`s counted as leaves.
    dtypes: the dtype of each vector (float32, float64: `real_dtype` of the leaves it serves).
    slots: per leaf, None if unselected, else `(vector index, start, layer shape)`: the leaf's rates
      are `vectors[index][start:start + prod(shape)]`, reshaped to `shape` (its stacked axes).
  """

  treedef: Any
  dtypes: tuple[str, ...]
  slots: tuple[tuple[int, int, tuple[int, ...]] | None, ...]

  @classmethod
  def of(cls, treedef: Any, leaves: list[Any], selected: list[bool], stacked: list[int]) -> "RatesLayout":
    """The layout for selected leaves of the given shapes and dtypes, grouped by `real_dtype`."""
    dtypes = sorted({real_dtype(w.dtype).name for w, is_selected in zip(leaves, selected) if is_selected})
    sizes = [0] * len(dtypes)
    slots = []
    for w, is_selected, k in zip(leaves, selected, stacked):
      if not is_selected:
        slots.append(None)
        continue
      index = dtypes.index(real_dtype(w.dtype).name)
      slots.append((index, sizes[index], tuple(w.shape[:k])))
      sizes[index] += math.prod(w.shape[:k])
    return cls(treedef, tuple(dtypes), tuple(slots))

  def sizes(self) -> list[int]:
    """The length of each vector."""
    sizes = [0] * len(self.dtypes)
    for slot in self.slots:
      if slot is not None:
        sizes[slot[0]] = slot[1] + math.prod(slot[2])
    return sizes


@functools.partial(jax.tree_util.register_dataclass, data_fields=["vectors"], meta_fields=["layout"])
@dataclasses.dataclass(frozen=True)
class LayerRates:
  """The local rates of every selected layer: one vector per dtype, with their static layout.

  Attributes:
    vectors: a tuple of 1-D arrays, one per dtype of `layout.dtypes`.
    layout: the `RatesLayout` that maps leaves to entries (pytree metadata, not leaves).
  """

  vectors: tuple[Any, ...]
  layout: RatesLayout

  @classmethod
  def zeros(cls, layout: RatesLayout) -> "LayerRates":
    """Every rate 0 (the state before the first update)."""
    flax_state.register_if_flax_is_loaded(cls, "vectors")
    return cls(tuple(jnp.zeros((n,), dtype) for n, dtype in zip(layout.sizes(), layout.dtypes)), layout)

  def leaves(self) -> list[jax.Array | None]:
    """Each leaf's rates (a scalar, or its stacked-layer shape), None for unselected leaves."""
    return [None if slot is None else
            jax.lax.slice_in_dim(self.vectors[slot[0]], slot[1], slot[1] + math.prod(slot[2])).reshape(slot[2])
            for slot in self.layout.slots]


class LayerwiseRateState(NamedTuple):
  """State of `scale_by_layerwise_rate`.

  Attributes:
    rates: a `LayerRates`: the local rate applied at the last update to every selected layer (0
      before the first update), all layers in one vector per dtype; `trust_ratios` gives them leaf
      by leaf.
  """

  rates: LayerRates


def default_mask(params: Params, stacked: Params) -> Params:
  """Selects leaves whose layers have 2 or more dimensions (kernels), excluding biases and scales."""
  return jax.tree.map(lambda p, k: p.ndim - k >= 2, params, stacked)


def _tree_like(name: str, value: Any, params: Params) -> Params:
  """Resolves a pytree-or-callable option against `params` and checks its structure."""
  tree = value(params) if callable(value) else value
  # Inside optax.masked / multi_transform, leaves of other groups are MaskedNodes: a full-size
  # option tree still matches there, and its entries for those leaves are dropped.
  params_leaves, params_def = jax.tree.flatten(params, is_leaf=_is_masked)
  try:
    leaves = params_def.flatten_up_to(tree)
  except (ValueError, TypeError) as error:
    raise ValueError(
        f"{name} must have the same tree structure as the parameters ({params_def}), or be a "
        f"callable returning one; got {jax.tree.structure(tree)}. ({error})"
    ) from error
  leaves = [p if _is_masked(p) else x for p, x in zip(params_leaves, leaves)]
  return jax.tree.unflatten(params_def, leaves)


def _resolve_stacked(stacked: StackedOrFn, params: Params) -> Params:
  """Number of leading stacked-layer axes of every leaf (a pytree of ints like `params`)."""
  if stacked is None:
    stacked = 0
  if isinstance(stacked, numbers.Integral) and not isinstance(stacked, bool):
    stacked = int(stacked)  # a NumPy integer too
  if isinstance(stacked, (int, jax.Array)) and np.ndim(stacked) == 0:
    # one count for every leaf; an array (optax.inject_hyperparams makes one) is refused below naming static_args
    stacked = jax.tree.map(lambda _: stacked, params)
  tree = _tree_like("stacked", stacked, params)
  for path, p, k in _zip_with_path(params, tree):
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= p.ndim:
      raise ValueError(
          f"stacked for leaf {path} (shape {p.shape}) must be a Python int in [0, {p.ndim}], got "
          f"{k!r}. (Under optax.inject_hyperparams, pass static_args=('stacked',).)"
      )
  return tree


def check_mask(mask: MaskOrFn) -> None:
  """Refuses, when the transformation is built, a string mask that is not a regular expression."""
  if isinstance(mask, str):
    try:
      re.compile(mask)
    except re.error as e:
      raise ValueError(f"mask {mask!r} is not a regular expression ({e}); a string mask selects the leaves whose "
                       "name it matches (re.search), e.g. 'kernel$' for 'blocks/0/conv1/kernel'.") from e


def regex_mask(pattern: str, params: Params) -> Params:
  """The leaves of `params` whose name (`leaf_names.leaf_name`, e.g. 'blocks/0/conv1/kernel') `pattern` matches
  (`re.search`), as a pytree of bools; a pattern that matches no parameter is refused (a typo would otherwise
  leave every leaf unselected)."""
  check_mask(pattern)
  named, treedef = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_masked)
  names = [None if _is_masked(leaf) else leaf_name(path) for path, leaf in named]
  selected = [name is not None and re.search(pattern, name) is not None for name in names]
  if not any(selected):
    listed = [name for name in names if name is not None]
    raise ValueError(f"mask {pattern!r} matches no parameter; their names: {', '.join(listed[:12])}"
                     f"{f', ... ({len(listed)} in all)' if len(listed) > 12 else ''}.")
  return jax.tree.unflatten(treedef, selected)


def resolve_mask(mask: MaskOrFn, params: Params, stacked: Params | None = None, *,
                 meaning: str = "True: layer-wise rate and weight decay; False: plain update") -> Params:
  """A pytree of Python bools like `params` saying which leaves `mask` selects.

  Args:
    mask: None (the `default_mask`), a regular expression selecting the leaves whose name it matches
      (`regex_mask`: 'kernel$', or '^(?!embed/)' for all but the embedding), a pytree of bools like `params`,
      or a callable returning one.
    params: the parameters (or any tree of arrays with their structure and shapes).
    stacked: each leaf's number of stacked-layer axes (a pytree of ints like `params`); None: 0.
    meaning: what True and False select, for the message.

  Raises:
    ValueError: if the tree has another structure than `params`, or a leaf that is not a bool; a string
      that is not a regular expression or matches no parameter.
  """
  if mask is None:
    return default_mask(params, jax.tree.map(lambda _: 0, params) if stacked is None else stacked)
  if isinstance(mask, str):
    return regex_mask(mask, params)
  tree = _tree_like("mask", mask, params)
  for path, _, selected in _zip_with_path(params, tree):
    if not isinstance(selected, (bool, np.bool_)):
      raise ValueError(
          f"mask for leaf {path} must be a Python bool ({meaning}), got {selected!r}. (Under "
          "optax.inject_hyperparams, pass a callable mask with static_args=('mask',).)"
      )
  return jax.tree.map(bool, tree)


def selection(params: Params, mask: MaskOrFn, stacked: StackedOrFn) -> tuple[Any, list[bool], list[int]]:
  """The structure of `params` (`optax.MaskedNode`s counted as leaves), whether `mask` selects each
  leaf (never a MaskedNode) and each leaf's number of stacked-layer axes."""
  treedef = jax.tree.structure(params, is_leaf=_is_masked)
  stacked_tree = _resolve_stacked(stacked, params)
  selected = [not _is_masked(x) and bool(x)
              for x in treedef.flatten_up_to(resolve_mask(mask, params, stacked_tree))]
  return treedef, selected, treedef.flatten_up_to(stacked_tree)


def _zip_with_path(params: Params, other: Params):
  """Yields `(path, param_leaf, other_leaf)` for every leaf of `params`."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(params)
  others = treedef.flatten_up_to(other)
  for (path, leaf), value in zip(with_path, others):
    yield jax.tree_util.keystr(path), leaf, value


def _check_rate(rate: Any) -> None:
  """Raises TypeError unless `rate` is a `SummedRate` or a function `(w, g, weight_decay, layer)`."""
  if isinstance(rate, SummedRate):
    return
  hint = ("a SummedRate such as lars_rate() or a LayerRate function (w, g, weight_decay, layer) -> rates, "
          "such as median_curvature_rate()")
  if not callable(rate) or isinstance(rate, optax.GradientTransformation):
    raise TypeError(f"rate must be {hint}; got {rate!r}.")
  try:
    inspect.signature(rate).bind(None, None, None, None)
  except TypeError as error:
    name = getattr(rate, "__name__", repr(rate))
    raise TypeError(
        f"rate must be {hint}; got {name}, which does not take (w, g, weight_decay, layer) ({error}). "
        f"If {name} builds the rate, call it: rate={name}(...)."
    ) from error
  except ValueError:  # no signature to inspect (a builtin): taken as it is
    pass


def scale_by_layerwise_rate(
    rate: "LayerRate | SummedRate",
    *,
    weight_decay: Any = 0.0,
    mask: MaskOrFn = None,
    stacked: StackedOrFn = None,
    axis_name: AxisName = None,
) -> optax.GradientTransformation:
  """Scales each selected layer's update `g + beta * w` by a layer statistic `rate`.

  For a selected leaf (layer `l`), with `beta = weight_decay`:

      u^l = rate(w^l, g^l, beta) * (g^l + beta * w^l)

  which is the local-LR step of papers/000 Algorithm 1 (with `rate = lars_rate`) and of papers/003
  eq. 21-24. Unselected leaves pass `u = g` through. Chain with `optax.scale_by_learning_rate` and
  `optax.trace` for the full optimizer, as `lars` does.

  Args:
    rate: the statistic: a `SummedRate` (all layers' sums at once: one psum, one rate vector) or a
      `LayerRate` (leaf by leaf).
    weight_decay: beta, added to selected leaves only; a float or an array (not a schedule).
    mask: which leaves get weight decay and the rate: a pytree of Python bools with the structure
      of the parameters, a callable `params -> such a pytree`, or a regular expression matched against
      each leaf's name ('blocks/0/conv1/kernel'; `regex_mask`). Default: leaves whose layers have
      `ndim >= 2` (kernels; biases and norm scales excluded).
    stacked: number of leading axes of a leaf that enumerate separate layers (one rate per slice),
      as an int for all leaves, a pytree of ints, or a callable `params -> pytree of ints`.
      Default 0 (every leaf is one layer).
    axis_name: inside `shard_map`/`pmap`, the mapped axis the parameters are sharded over; layer
      reductions are summed over it. Every leaf must then hold a disjoint slice of its layers on each
      device (a replicated leaf would be counted once per device). Leave None under `jax.jit`, where
      sharded norms are global already.

  Returns:
    An `optax.GradientTransformation` whose state is a `LayerwiseRateState`.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000 is its ICLR 2018 submission, "Large Batch Training of
      Convolutional Networks with Layer-wise Adaptive Rate Scaling": eq. 4-6, Algorithm 1.)
    Gao, F. and Zhong, H. Study on the Large Batch Size Training of Neural Networks Based on the
      Second Order Gradient. arXiv:2012.08795, 2020. (papers/003: eq. 17-24, the layer-wise rates as
      statistics of the curvature radius |w_i / g_i|.)
  """
  _check_rate(rate)
  check_mask(mask)
  validation.check_nonnegative("weight_decay", weight_decay)
  validation.check_axis_name(axis_name, "a layer-wise optimizer")
  skip_decay = validation.is_literal_zero(weight_decay)

  def leaves_and_layout(tree, params):
    """The leaves of `tree` and of `params` (MaskedNodes included), the stacked axes of each, and
    the rates layout."""
    treedef, selected, ks = selection(params, mask, stacked)
    weights = treedef.flatten_up_to(params)
    return treedef.flatten_up_to(tree), weights, ks, RatesLayout.of(treedef, weights, selected, ks)

  def init_fn(params):
    *_, rates_layout = leaves_and_layout(params, params)
    return LayerwiseRateState(rates=LayerRates.zeros(rates_layout))

  def layer_reducer(w, k, reduce_axis):
    return LayerReducer(stacked_axes=k, ndim=w.ndim, local_size=math.prod(w.shape[k:]), axis_name=reduce_axis)

  def summed_rates(flat_g, flat_w, ks, rates_layout):
    """Every layer's rate from `rate.sums` across the devices of `axis_name`: per group, the sums of all
    layers stacked into one array, one psum of it, one vectorised `rate.rate`."""
    sums = [[] for _ in rates_layout.dtypes]
    for g, w, slot, k in zip(flat_g, flat_w, rates_layout.slots, ks):
      if slot is not None:
        leaf_sums = rate.sums(w, g, weight_decay, layer_reducer(w, k, None))
        sums[slot[0]].append([x.astype(rates_layout.dtypes[slot[0]]).ravel() for x in leaf_sums])
    vectors = []
    for group in sums:
      # (number of sums, number of layers); each sum's vector first, so that XLA concatenates the
      # scalars of all leaves in one op instead of stacking every leaf's sums in a kernel of its own.
      stacked_sums = jnp.stack([jnp.concatenate(sum_of_each_leaf) for sum_of_each_leaf in zip(*group)])
      vectors.append(rate.global_rates(stacked_sums, weight_decay, axis_name))
    return vectors

  def leaf_rate(w, g, k, dtype):
    """One leaf's rates: a `LayerRate`'s, or a `SummedRate`'s from this leaf's own sums."""
    if not isinstance(rate, SummedRate):
      return rate(w, g, weight_decay, layer_reducer(w, k, axis_name))
    sums = rate.sums(w, g, weight_decay, layer_reducer(w, k, None))
    return rate.rate(tuple(x.astype(dtype) for x in sums), weight_decay)

  def leafwise_rates(flat_g, flat_w, ks, rates_layout):
    """Every layer's rate, leaf by leaf, concatenated per group."""
    rates = [[] for _ in rates_layout.dtypes]
    for g, w, slot, k in zip(flat_g, flat_w, rates_layout.slots, ks):
      if slot is not None:
        rates[slot[0]].append(leaf_rate(w, g, k, rates_layout.dtypes[slot[0]]).ravel())
    return [jnp.concatenate(group) for group in rates]

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError(
          "layer-wise rates need the parameters: call update(grads, state, params), "
          "not update(grads, state)."
      )
    if axis_name is not None:
      check_axis_bound(axis_name)
    flat_g, flat_w, ks, rates_layout = leaves_and_layout(updates, params)
    # A `SummedRate` across devices: one psum of all layers' sums; `leaf_local` under `jit`: leaf by leaf.
    stacked = isinstance(rate, SummedRate) and (axis_name is not None or not rate.leaf_local)
    rates_of = summed_rates if stacked else leafwise_rates
    vectors = [v.astype(dtype) for v, dtype in zip(
        rates_of(flat_g, flat_w, ks, rates_layout), rates_layout.dtypes)]
    rates = LayerRates(tuple(vectors), rates_layout)
    new_updates = []
    for g, w, local_rate, k in zip(flat_g, flat_w, rates.leaves(), ks):
      if local_rate is None:
        new_updates.append(g)
        continue
      scale = local_rate.reshape(local_rate.shape + (1,) * (w.ndim - k))
      # scale * g + (scale * beta) * w rather than scale * (g + beta * w): a statistic of
      # g + beta * w then reads g and w in its own reduction instead of sharing (and so
      # materialising) a full-size g + beta * w with this update.
      update = scale * g if skip_decay else scale * g + (scale * weight_decay) * w
      new_updates.append(update.astype(g.dtype))
    return rates_layout.treedef.unflatten(new_updates), LayerwiseRateState(rates=rates)

  return optax.GradientTransformation(init_fn, update_fn)


def check_axis_bound(axis_name: AxisName) -> None:
  """Raises ValueError unless the update of a layer-wise transform built with `axis_name` runs where
  that mapped axis is bound (`validation.check_axis_bound`)."""
  validation.check_axis_bound(
      axis_name, f"the update of a layer-wise optimizer built with axis_name={axis_name!r} (norms summed over it)",
      "under jax.jit (where the norms of sharded parameters are global already) or on one device, build "
      "it with axis_name=None")


def _is_state(x: Any) -> bool:
  return isinstance(x, LayerwiseRateState)


def _is_masked(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def trust_ratios(opt_state: Any) -> Params:
  """The per-layer rates of the last update, found anywhere inside an optax state.

  Looks through chains, `optax.inject_hyperparams`, `optax.MultiSteps`, `optax.masked` and
  `optax.multi_transform` states for `LayerwiseRateState`s (from `lars`, `lamb`, `percent_delta`,
  `mclr` or any `scale_by_layerwise_rate`). Several such states over the same parameters (e.g. in a
  `multi_transform`) are merged leaf by leaf.

  Args:
    opt_state: an optimizer state.

  Returns:
    A pytree with the structure of the parameters: for a selected leaf, the local rate it was
    scaled by at the last update (for `lars`, `eta * ||w|| / (||g|| + beta * ||w||)`; a scalar, or a
    vector with one value per stacked layer; 0 before the first update); NaN (a float32 scalar) for
    leaves no layer-wise transform selected.

  Raises:
    ValueError: if `opt_state` holds no `LayerwiseRateState`.
  """
  states = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_state) if _is_state(x)]
  if not states:
    raise ValueError(
        "trust_ratios found no LayerwiseRateState in the optimizer state: build the optimizer with "
        "lbjax.optim.lars/lamb/percent_delta/mclr or scale_by_layerwise_rate."
    )
  treedef = states[0].rates.layout.treedef
  flat = states[0].rates.leaves()
  for other in states[1:]:
    other_def = other.rates.layout.treedef
    if other_def.num_leaves != treedef.num_leaves:
      raise ValueError(
          "trust_ratios found layer-wise states over different parameter trees: "
          f"{treedef} and {other_def}."
      )
    flat = [b if a is None else a for a, b in zip(flat, other.rates.leaves())]
  nan = jnp.full((), jnp.nan, jnp.float32)
  return jax.tree.unflatten(treedef, [nan if r is None else r for r in flat])


def layerwise_sgd(
    scaling: optax.GradientTransformation,
    learning_rate: optax.ScalarOrSchedule,
    momentum: Any = 0.9,
    nesterov: bool = False,
    accumulator_dtype: Any = None,
    flip_sign: bool = True,
) -> optax.GradientTransformation:
  """Momentum SGD on top of a layer-wise scaling, with the learning rate inside the momentum.

      v_{t+1} = m * v_t + gamma_t * u_t,    w_{t+1} = w_t - v_{t+1}

  where `u_t` is the output of `scaling` (papers/000 Algorithm 1 puts `gamma_t` inside `v`, which
  matters when `gamma_t` changes: this is not `optax.sgd`, which scales after the momentum).

  Args:
    scaling: a layer-wise transform such as `scale_by_lars`.
    learning_rate: gamma, a float or an optax schedule of the update count.
    momentum: m, in [0, 1).
    nesterov: return `-(m * v_{t+1} + gamma_t * u_t)` instead (as `optax.trace`).
    accumulator_dtype: dtype of the momentum `v` (e.g. "bfloat16": 2 bytes per parameter instead
      of 4), or None for the parameters' dtype. `v` is updated in the wider of this dtype and the
      update's and rounded where stored; the weights move by the stored `v` (`low_precision.trace`).
    flip_sign: True: return the optax update `-v_{t+1}` and keep `-v` in the state; False: return and
      keep `v_{t+1}` itself, the step the weights move against (for `multi_tensor.flat_layout`).

  Returns:
    An `optax.GradientTransformation`.

  References:
    You, Y., Gitman, I., and Ginsburg, B. Large Batch Training of Convolutional Networks.
      arXiv:1708.03888, 2017. (papers/000 is its ICLR 2018 submission, "Large Batch Training of
      Convolutional Networks with Layer-wise Adaptive Rate Scaling": eq. 4-6, Algorithm 1.)
  """
  if not isinstance(scaling, optax.GradientTransformation):
    raise TypeError(
        "scaling must be an optax.GradientTransformation such as scale_by_lars(...) or "
        f"scale_by_layerwise_rate(rate, ...), got {scaling!r}"
        + (": a rate; wrap it as scale_by_layerwise_rate(rate)." if isinstance(scaling, SummedRate) else ".")
    )
  validation.check_nonnegative("learning_rate", learning_rate, schedule=True)
  validation.check_momentum("momentum", momentum)
  validation.check_bool("nesterov", nesterov)
  accumulator_dtype = validation.state_dtype("accumulator_dtype", accumulator_dtype)
  return optax.chain(
      scaling,
      optax.scale_by_learning_rate(learning_rate, flip_sign=flip_sign),
      low_precision.trace(momentum, nesterov, accumulator_dtype),
  )
