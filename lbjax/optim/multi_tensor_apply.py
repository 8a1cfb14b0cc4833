"""apex's `multi_tensor_apply` in Pallas: GPU kernels over chunks of any leaf of a tree, up to 96 leaves each.

XLA:GPU launches at least one kernel per group of equally shaped outputs, so an update of ResNet-50's 161
leaves (22 shapes) takes tens of kernels whatever its design (benchmarks/README.md, Findings 10). Here a
kernel's programs are cut from the whole tree instead: leaf `i` (of `layers` layers of `layer_size`
values) is covered by programs `first_i` to `first_i + count_i - 1`, each taking one chunk of `CHUNK`
values of one layer, and every program's body is a static chain of `pl.when` branches, one per leaf,
of which its id selects one. Triton compiles such a kernel in a time that grows with the square of its
leaves, so a pass over more than `LEAVES_PER_KERNEL` leaves is cut into kernels of consecutive leaves. A
kernel is a body run on a `Chunk` (its loads and stores are masked to the
layer), over per-leaf inputs and outputs, inputs every program reads whole (a rate vector), the
hyper-parameters, and per-program outputs (sums); outputs can be written in an input's place.
`lbjax.optim.fused` builds the optimizers' kernels this way.

Written for Pallas's Triton backend (JAX 0.10 to 0.12; deprecated in 0.12 for Mosaic GPU): a JAX without
it imports this module and `check_backend` refuses to build kernels.

References:
  NVIDIA apex, `multi_tensor_apply` (csrc/multi_tensor_apply.cuh): every tensor's chunks in one launch.
  JAX, Pallas (jax.experimental.pallas): `pallas_call`, its Triton backend and interpreter.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

try:  # Pallas's Triton backend: in JAX 0.10 to 0.12 (deprecated in 0.12 for Mosaic GPU)
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import triton as plgpu
except ImportError:  # a JAX without it: `check_backend` refuses to build kernels
  pl = plgpu = None

CHUNK = 4096  # values per program: ResNet-50's 25.6M parameters are 6,300 programs
KERNEL_DTYPES = ("float32", "bfloat16", "float16")
# The most leaves one kernel covers: Triton compiles a kernel in a time that grows with the square of its
# leaves (a branch per leaf, each load and store visiting the whole kernel), so ResNet-50's 161 leaves go in
# two kernels per pass, which compile 2.6x faster (LAMB) for one more launch each (benchmarks/README.md,
# Findings 10).
LEAVES_PER_KERNEL = 96


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


def chunks(sizes: list[tuple[int, int] | None]) -> list[LeafChunks | None]:
  """Each leaf's programs, numbered on from leaf to leaf, for leaves of `(layers, layer_size)` (None: not
  in the kernels)."""
  places, first = [], 0
  for size in sizes:
    if size is None:
      places.append(None)
      continue
    place = LeafChunks(first, *size)
    places.append(place)
    first += place.count
  return places


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
      # Integer arithmetic only where the leaf needs it (one chunk per layer, one layer): every op of a
      # branch is visited again for every load and store when Triton compiles the kernel. (The start stays
      # traced: Pallas refuses a static slice of CHUNK values from a shorter leaf.)
      local = program - place.first
      if place.per_layer == 1:
        layer, offset = local, 0
      elif place.layers == 1:
        layer, offset = 0, local * CHUNK
      else:
        layer, offset = local // place.per_layer, (local % place.per_layer) * CHUNK
      valid = offset + jnp.arange(CHUNK) < place.layer_size
      body(program, leaf, layer, layer * place.layer_size + offset, valid)


class Scalars:
  """Hyper-parameters a kernel reads: Python numbers stay constants of the kernel (weakly typed, as in
  the per-leaf code); arrays (`inject_hyperparams`, schedules) become inputs of shape (1,)."""

  def __init__(self, **values: Any):
    self.constants = {k: v for k, v in values.items() if isinstance(v, (int, float))}
    self.names = [k for k in values if k not in self.constants]
    self.arrays = [jnp.reshape(values[k], (1,)) for k in self.names]

  def read(self, refs: list[Any]) -> dict[str, Any]:
    return dict(self.constants, **{k: plgpu.load(ref) for k, ref in zip(self.names, refs)})


@dataclasses.dataclass(frozen=True)
class Chunk:
  """What a kernel's body sees of its program's chunk (`over_chunks`).

  Attributes:
    program: the program's id.
    leaf: the index of the chunk's leaf in the tree.
    layer: the chunk's layer within the leaf (its stacked axes, flattened).
    start: the chunk's first value in the flattened leaf.
    valid: which of its `CHUNK` values lie in the layer.
    inputs, outputs: the leaf's ref in each per-leaf input and output.
    shared: the refs of the inputs every program reads whole (the rate vector).
    sums: the refs of the per-program outputs (one float32 value per program each).
    values: the hyper-parameters (`Scalars`).
  """

  program: Any
  leaf: int
  layer: Any
  start: Any
  valid: Any
  inputs: tuple[Any, ...]
  outputs: tuple[Any, ...]
  shared: tuple[Any, ...]
  sums: tuple[Any, ...]
  values: dict[str, Any]

  def load(self, k: int) -> jax.Array:
    """The chunk of per-leaf input `k` (zeros outside the layer)."""
    return plgpu.load(self.inputs[k].at[pl.ds(self.start, CHUNK)], mask=self.valid, other=0)

  def store(self, k: int, value: jax.Array) -> None:
    """Writes the chunk of per-leaf output `k` (in its dtype)."""
    ref = self.outputs[k]
    plgpu.store(ref.at[pl.ds(self.start, CHUNK)], value.astype(ref.dtype), mask=self.valid)

  def store_sums(self, values: Any) -> None:
    """Writes the program's entry of each per-program output."""
    for ref, value in zip(self.sums, values):
      plgpu.store(ref.at[pl.ds(self.program, 1)], jnp.reshape(value, (1,)).astype(jnp.float32))


def over_chunks(body: Callable[[Chunk], None], places: list[LeafChunks | None],
                 leaf_inputs: list[list[Any]], leaf_outputs: list[list[Any]], *, shared: tuple[Any, ...] = (),
                 hyper: dict[str, Any] | None = None, sums: int = 0, in_place: tuple[tuple[int, int], ...] = (),
                 interpret: bool = False
                 ) -> tuple[list[list[jax.Array]], list[jax.Array]]:
  """Pallas kernels whose programs each run `body` on the chunk `places` gives it: as few kernels as
  cover the leaves with at most `LEAVES_PER_KERNEL` each, each kernel of consecutive leaves, as many
  as the first holds (ceil(leaves / kernels)) but the last.

  Args:
    body: reads and writes one chunk through its `Chunk`.
    places: each leaf's programs (`chunks`; None: the leaf is not in the kernels).
    leaf_inputs: per-leaf inputs, each a list over the tree's leaves of flattened arrays (None where
      `places` is).
    leaf_outputs: per-leaf outputs, each a list of `(shape, dtype)` (None where `places` is).
    shared: inputs every program reads whole.
    hyper: the hyper-parameters (`Scalars`).
    sums: how many per-program float32 outputs.
    in_place: `(input, output)` pairs of per-leaf groups whose output is written in the input's place (a
      donated input is updated in place; XLA copies one that is not donated).
    interpret: run in Pallas's interpreter.

  Returns:
    Each per-leaf output as a list over the leaves in `places` (in order), and the per-program outputs
    (programs in `places`' numbering).
  """
  if not (isinstance(LEAVES_PER_KERNEL, int) and LEAVES_PER_KERNEL >= 1):
    raise ValueError(f"multi_tensor_apply.LEAVES_PER_KERNEL must be a positive int, got {LEAVES_PER_KERNEL!r}.")
  leaves = [i for i, place in enumerate(places) if place is not None]
  kernels = -(-len(leaves) // LEAVES_PER_KERNEL)
  per_kernel = -(-len(leaves) // kernels)
  per_leaf, per_program = [[] for _ in leaf_outputs], [[] for _ in range(sums)]
  for k in range(0, len(leaves), per_kernel):
    group = set(leaves[k:k + per_kernel])
    offset = places[leaves[k]].first  # the kernel's program 0
    kernel_places = [dataclasses.replace(place, first=place.first - offset) if i in group else None
                     for i, place in enumerate(places)]
    outputs, program_sums = _one_kernel(body, kernel_places, leaf_inputs, leaf_outputs, shared, hyper, sums,
                                        in_place, interpret)
    for collected, new in zip(per_leaf + per_program, outputs + program_sums):
      collected.append(new)
  return ([sum(parts, []) for parts in per_leaf],
          [jnp.concatenate(parts) if len(parts) > 1 else parts[0] for parts in per_program])


def _one_kernel(body, places, leaf_inputs, leaf_outputs, shared, hyper, sums, in_place, interpret
                ) -> tuple[list[list[jax.Array]], list[jax.Array]]:
  """One Pallas kernel of `over_chunks` (the same arguments) over the leaves in `places`; its per-program
  outputs as one-element lists."""
  leaves = [i for i, place in enumerate(places) if place is not None]
  programs = sum(places[i].count for i in leaves)
  position = {leaf: j for j, leaf in enumerate(leaves)}
  scalars = Scalars(**(hyper or {}))
  n = len(leaves)

  def kernel(*refs):
    remaining = iter(refs)
    ins = [[next(remaining) for _ in leaves] for _ in leaf_inputs]
    shared_refs = tuple(next(remaining) for _ in shared)
    values = scalars.read([next(remaining) for _ in scalars.arrays])
    outs = [[next(remaining) for _ in leaves] for _ in leaf_outputs]
    sum_refs = tuple(remaining)

    def chunk(program, leaf, layer, start, valid):
      j = position[leaf]
      body(Chunk(program, leaf, layer, start, valid, tuple(group[j] for group in ins),
                  tuple(group[j] for group in outs), shared_refs, sum_refs, values))

    _for_my_chunk(places, chunk)

  # An output varies over the manual mesh axes (inside `shard_map`, where Pallas needs to be told) as
  # its leaf's first input does; JAX's avals call it `mat`, the manual axis type.
  like = lambda i: getattr(jax.typeof(leaf_inputs[0][i]), "mat", None)
  out_shapes = ([jax.ShapeDtypeStruct(*group[i], manual_axis_type=like(i)) for group in leaf_outputs for i in leaves]
                + [jax.ShapeDtypeStruct((programs,), jnp.float32, manual_axis_type=like(leaves[0]))] * sums)
  results = pl.pallas_call(
      kernel, out_shape=out_shapes, grid=(programs,), interpret=interpret,
      input_output_aliases={a * n + j: b * n + j for a, b in in_place for j in range(n)},
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
  )(*[group[i] for group in leaf_inputs for i in leaves], *shared, *scalars.arrays)
  return [list(results[k * n:(k + 1) * n]) for k in range(len(leaf_outputs))], list(results[len(leaf_outputs) * n:])


def kernels_take(*trees: Any) -> bool:
  """Whether the kernels run on these trees: every leaf an array of float32, bfloat16 or float16 (no
  `optax.MaskedNode`: inside `optax.masked` the per-leaf update runs), and some leaf not empty."""
  leaves = jax.tree.leaves(trees, is_leaf=lambda x: isinstance(x, optax.MaskedNode))
  return (all(not isinstance(x, optax.MaskedNode) and jnp.dtype(x.dtype).name in KERNEL_DTYPES for x in leaves)
          and any(x.size for x in leaves))


def check_backend() -> None:
  """Refuses to build kernels on a JAX without Pallas's Triton backend, saying what to use."""
  if plgpu is None:
    raise ValueError(f"layout='fused' needs Pallas's Triton backend (jax.experimental.pallas.triton), which JAX "
                     f"{jax.__version__} does not have: use layout='flat' (the multi-tensor layout within XLA) or "
                     "'per_leaf'.")
